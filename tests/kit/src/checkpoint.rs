//! Helpers for checkpoint/restore scenarios driven through `ctr`.
//!
//! # How ctr 2.1 checkpoints and restores (what the helpers build on)
//! - `ctr containers checkpoint --task [--rw] CTR REF` pauses the task, has the daemon call
//!   the shim's `Checkpoint` into a temporary directory (always with
//!   `containerd.runc.v1.CheckpointOptions`, `exit = false`, `file_locks = true`), tars that
//!   directory into the content store (`…criu.checkpoint.criu.tar`), adds the spec, the rw
//!   diff with `--rw`, and index annotations naming the image, runtime and snapshotter; then it
//!   resumes the task.
//! - `ctr containers restore [--rw] --live CTR REF` creates container `CTR` (any id, not
//!   necessarily the checkpointed one) from those annotations and puts the `criu.tar`
//!   descriptor into `CreateTaskRequest.checkpoint`; the daemon unpacks it into a fresh
//!   `ctrd-checkpoint*` directory under `$XDG_RUNTIME_DIR` (never removed by containerd) and
//!   hands that path to the shim's `Create`; restore then happens in `Start`.
//! - `ctr tasks checkpoint [--exit] [--image-path DIR] CTR` makes an image *without* those
//!   annotations, so `ctr containers restore` refuses it ("image name not found in index").
//!   ctr has no command that restores from a plain directory either (runc `Options.CriuImagePath`
//!   in the task options would, but ctr cannot set it). Tests that need to restore such an
//!   image graft its `criu.tar` onto a `ctr containers checkpoint` image of the same container
//!   ([`write_blob`]); tests that need a damaged image rewrite the `criu.tar` blob in the
//!   content store ([`rewrite_criu_tar`]). containerd does not re-verify blob digests when it
//!   reads a blob back (`ReaderAt`), so the damage reaches the shim exactly like a checkpoint
//!   corrupted at rest would.

use std::fs;
use std::ops::Deref;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};

use crate::cmd::OutputExt;
use crate::rig::{Rig, RigOptions, Runtime, TaskState};
use crate::wait::wait_some;

/// Media type of the CRIU image directory tar in a containerd checkpoint image.
pub const CRIU_TAR_MEDIA_TYPE: &str =
    "application/vnd.containerd.container.criu.checkpoint.criu.tar";

/// Serialises `XDG_RUNTIME_DIR` changes with the containerd start that reads them.
static RUNTIME_DIR_LOCK: Mutex<()> = Mutex::new(());

/// A [`Rig`] whose containerd unpacks checkpoint images (`ctrd-checkpoint*` directories,
/// which containerd never removes) into a private directory that is deleted with the rig,
/// instead of the shared /tmp.
pub struct CkRig {
    rig: Option<Rig>,
    runtime_dir: tempfile::TempDir,
}

impl CkRig {
    /// Like [`Rig::start_for`].
    pub fn start_for(rt: Runtime) -> Result<CkRig> {
        CkRig::start_with(RigOptions {
            require_gpusnap: rt == Runtime::Gpusnap,
            ..RigOptions::default()
        })
    }

    /// Like [`Rig::start_with`]; containerd gets `XDG_RUNTIME_DIR=<private dir>`.
    pub fn start_with(opts: RigOptions) -> Result<CkRig> {
        let runtime_dir = tempfile::Builder::new()
            .prefix("gpusnap-ckrt-")
            .tempdir_in("/tmp")
            .context("creating a runtime dir for containerd")?;
        // containerd inherits the test process's environment (the rig only overrides PATH);
        // set the variable just for the spawn of this rig's containerd.
        let _guard = RUNTIME_DIR_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::env::var_os("XDG_RUNTIME_DIR");
        std::env::set_var("XDG_RUNTIME_DIR", runtime_dir.path());
        let rig = Rig::start_with(opts);
        match old {
            Some(v) => std::env::set_var("XDG_RUNTIME_DIR", v),
            None => std::env::remove_var("XDG_RUNTIME_DIR"),
        }
        Ok(CkRig {
            rig: Some(rig?),
            runtime_dir,
        })
    }

    /// Where containerd unpacks checkpoint images for restores.
    pub fn runtime_dir(&self) -> &Path {
        self.runtime_dir.path()
    }
}

impl Deref for CkRig {
    type Target = Rig;
    fn deref(&self) -> &Rig {
        self.rig.as_ref().expect("rig present until drop")
    }
}

impl Drop for CkRig {
    fn drop(&mut self) {
        // Tear the rig down first; the runtime dir (a field) is removed afterwards.
        drop(self.rig.take());
    }
}

// ----- ctr checkpoint / restore ----------------------------------------------------------

/// `ctr containers checkpoint --task [--rw] <id> <image_ref>`, raw output.
pub fn container_checkpoint(rig: &Rig, id: &str, image_ref: &str, rw: bool) -> Result<Output> {
    let mut a = vec!["containers", "checkpoint", "--task"];
    if rw {
        a.push("--rw");
    }
    a.extend([id, image_ref]);
    rig.ctr(&a)
}

/// [`container_checkpoint`] that must succeed.
pub fn container_checkpoint_ok(rig: &Rig, id: &str, image_ref: &str, rw: bool) -> Result<()> {
    let out = container_checkpoint(rig, id, image_ref, rw)?;
    ensure!(
        out.status.success(),
        "`ctr containers checkpoint --task{} {id} {image_ref}` failed: {}",
        if rw { " --rw" } else { "" },
        out.describe()
    );
    Ok(())
}

/// `ctr containers restore [--rw] [--live] <id> <image_ref>` (non-tty containers: returns once
/// the task started), raw output.
pub fn container_restore(
    rig: &Rig,
    id: &str,
    image_ref: &str,
    rw: bool,
    live: bool,
) -> Result<Output> {
    let mut a = vec!["containers", "restore"];
    if rw {
        a.push("--rw");
    }
    if live {
        a.push("--live");
    }
    a.extend([id, image_ref]);
    rig.ctr(&a)
}

/// [`container_restore`] with `--live` that must succeed; waits until the task is RUNNING.
pub fn container_restore_live_ok(rig: &Rig, id: &str, image_ref: &str, rw: bool) -> Result<()> {
    let out = container_restore(rig, id, image_ref, rw, true)?;
    ensure!(
        out.status.success(),
        "`ctr containers restore{} --live {id} {image_ref}` failed: {}",
        if rw { " --rw" } else { "" },
        out.describe()
    );
    rig.wait_task_state(id, TaskState::Running, Duration::from_secs(30))?;
    Ok(())
}

/// `ctr tasks checkpoint <extra...> <id>`, raw output.
pub fn task_checkpoint(rig: &Rig, id: &str, extra: &[&str]) -> Result<Output> {
    let mut a = vec!["tasks", "checkpoint"];
    a.extend(extra);
    a.push(id);
    rig.ctr(&a)
}

/// SIGKILL every process of `id`, wait until STOPPED, delete the task and the container.
pub fn kill_and_remove(rig: &Rig, id: &str) -> Result<()> {
    rig.kill_all(id, "SIGKILL")?;
    rig.wait_task_state(id, TaskState::Stopped, Duration::from_secs(30))?;
    rig.delete_task(id)?;
    let out = rig.delete_container(id)?;
    ensure!(
        out.status.success(),
        "`ctr containers delete {id}` failed: {}",
        out.describe()
    );
    Ok(())
}

// ----- reading container state ------------------------------------------------------------

/// Contents of `path` inside container `id`'s root, read through /proc/<init pid>/root.
pub fn read_in_task(rig: &Rig, id: &str, path: &str) -> Option<String> {
    let pid = rig.task_pid(id).ok()?;
    if pid == 0 {
        return None;
    }
    fs::read_to_string(format!("/proc/{pid}/root{path}")).ok()
}

/// The number in `path` inside container `id` (`None` while absent or mid-write).
pub fn counter(rig: &Rig, id: &str, path: &str) -> Option<u64> {
    read_in_task(rig, id, path)?.trim().parse().ok()
}

/// Polls `f` until it yields a value and returns that value. Unlike [`crate::wait_for`] it
/// does not poll again to hand the value out, so it suits conditions that flicker (a file
/// that a workload truncates and rewrites many times a second).
pub fn poll<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> Result<T> {
    wait_some(timeout, f).ok_or_else(|| anyhow!("timed out after {timeout:?} waiting for {what}"))
}

/// Polls [`counter`] until it is at least `min`; returns the value seen.
pub fn wait_counter(rig: &Rig, id: &str, path: &str, min: u64, timeout: Duration) -> Result<u64> {
    let mut last = None;
    poll(timeout, &format!("{path} in {id} to reach {min}"), || {
        let v = counter(rig, id, path);
        if v.is_some() {
            last = v;
        }
        v.filter(|v| *v >= min)
    })
    .with_context(|| format!("last value read: {last:?}"))
}

/// The current value of [`counter`], retried while the file is being rewritten.
pub fn read_counter(rig: &Rig, id: &str, path: &str) -> Result<u64> {
    poll(
        Duration::from_secs(5),
        &format!("a readable {path} in {id}"),
        || counter(rig, id, path),
    )
}

/// The last NSpid (pid inside the innermost pid namespace) of a host pid.
pub fn ns_pid(host_pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// argv of a host pid joined with spaces (empty when gone).
pub fn cmdline(host_pid: u32) -> String {
    fs::read(format!("/proc/{host_pid}/cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// State letter from /proc/<pid>/status (`None`: gone).
pub fn proc_state(host_pid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|v| v.trim().chars().next())
}

pub use crate::registry::free_tcp_port;

// ----- images in the content store --------------------------------------------------------

/// Image refs (`ctr images ls -q`).
pub fn image_refs(rig: &Rig) -> Result<Vec<String>> {
    Ok(rig
        .ctr_ok(&["images", "ls", "-q"])?
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Path of a blob in the rig's content store.
pub fn blob_path(rig: &Rig, digest: &str) -> Result<PathBuf> {
    let (algo, hex) = digest
        .split_once(':')
        .ok_or_else(|| anyhow!("bad digest {digest:?}"))?;
    Ok(rig
        .root_dir()
        .join("io.containerd.content.v1.content/blobs")
        .join(algo)
        .join(hex))
}

/// Target digest of image `image_ref` (from `ctr images ls`).
pub fn image_digest(rig: &Rig, image_ref: &str) -> Result<String> {
    let out = rig.ctr_ok(&["images", "ls"])?;
    out.lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&image_ref))
        .and_then(|f| f.get(2).map(|d| d.to_string()))
        .ok_or_else(|| anyhow!("image {image_ref} not listed by `ctr images ls`: {out}"))
}

/// Labels column of image `image_ref` (from `ctr images ls`), e.g. `containerd.io/checkpoint=true`.
pub fn image_labels(rig: &Rig, image_ref: &str) -> Result<String> {
    let out = rig.ctr_ok(&["images", "ls"])?;
    out.lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&image_ref))
        .map(|f| f.last().copied().unwrap_or_default().to_string())
        .ok_or_else(|| anyhow!("image {image_ref} not listed by `ctr images ls`: {out}"))
}

/// The OCI index of a checkpoint image, parsed.
pub fn image_index(rig: &Rig, image_ref: &str) -> Result<serde_json::Value> {
    let p = blob_path(rig, &image_digest(rig, image_ref)?)?;
    let bytes = fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing index {}", p.display()))
}

/// Content-store path of the `criu.tar` blob of checkpoint image `image_ref`.
pub fn criu_tar_blob(rig: &Rig, image_ref: &str) -> Result<PathBuf> {
    let index = image_index(rig, image_ref)?;
    let digest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mediaType"] == CRIU_TAR_MEDIA_TYPE)
        .and_then(|m| m["digest"].as_str())
        .ok_or_else(|| {
            anyhow!("checkpoint image {image_ref} has no {CRIU_TAR_MEDIA_TYPE}: {index}")
        })?
        .to_string();
    blob_path(rig, &digest)
}

/// Overwrites a (read-only) content-store blob in place.
pub fn write_blob(path: &Path, bytes: &[u8]) -> Result<()> {
    let mode = fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .permissions()
        .mode();
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7777))?;
    Ok(())
}

/// Parses the `criu.tar` blob at `blob`, lets `edit` change its entries, and writes the result
/// back in place. Returns the original bytes (to put back with [`write_blob`]).
pub fn rewrite_criu_tar(
    blob: &Path,
    edit: impl FnOnce(&mut Vec<TarEntry>) -> Result<()>,
) -> Result<Vec<u8>> {
    let original = fs::read(blob).with_context(|| format!("reading {}", blob.display()))?;
    let mut entries = parse_tar(&original)?;
    edit(&mut entries)?;
    write_blob(blob, &build_tar(&entries))?;
    Ok(original)
}

// ----- a minimal ustar reader/writer (the daemon writes plain ustar) -------------------------

/// One tar member: its 512-byte header and its data.
#[derive(Clone, Debug)]
pub struct TarEntry {
    pub header: [u8; 512],
    pub data: Vec<u8>,
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl TarEntry {
    /// Member name (ustar prefix + name).
    pub fn name(&self) -> String {
        let name = cstr(&self.header[..100]);
        let prefix = if &self.header[257..262] == b"ustar" {
            cstr(&self.header[345..500])
        } else {
            String::new()
        };
        if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        }
    }

    /// Type flag ('0' regular file, '5' directory, 'x' pax header, ...).
    pub fn kind(&self) -> u8 {
        self.header[156]
    }

    /// Replaces the data, fixing the size field and the header checksum.
    pub fn set_data(&mut self, data: Vec<u8>) {
        let size = format!("{:011o}\0", data.len());
        self.header[124..136].copy_from_slice(size.as_bytes());
        self.data = data;
        self.fix_checksum();
    }

    fn fix_checksum(&mut self) {
        self.header[148..156].copy_from_slice(b"        ");
        let sum: u32 = self.header.iter().map(|b| u32::from(*b)).sum();
        let field = format!("{sum:06o}\0 ");
        self.header[148..156].copy_from_slice(field.as_bytes());
    }
}

fn parse_octal(field: &[u8]) -> Result<u64> {
    ensure!(
        field.first().is_none_or(|b| b & 0x80 == 0),
        "base-256 tar size fields are not supported"
    );
    let s = cstr(field);
    let s = s.trim_matches(|c: char| c == ' ' || c == '\0');
    if s.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(s, 8).with_context(|| format!("bad octal tar field {s:?}"))
}

/// Splits an uncompressed tar into members (pax/GNU extension headers are refused: editing a
/// member after one could contradict it).
pub fn parse_tar(bytes: &[u8]) -> Result<Vec<TarEntry>> {
    let mut v = Vec::new();
    let mut off = 0usize;
    while off + 512 <= bytes.len() {
        let h = &bytes[off..off + 512];
        if h.iter().all(|b| *b == 0) {
            return Ok(v);
        }
        let mut header = [0u8; 512];
        header.copy_from_slice(h);
        let size = parse_octal(&header[124..136])? as usize;
        let e = TarEntry {
            header,
            data: Vec::new(),
        };
        ensure!(
            !matches!(e.kind(), b'x' | b'g' | b'L' | b'K'),
            "tar member {:?} uses extension headers ({}); not supported here",
            e.name(),
            e.kind() as char
        );
        let start = off + 512;
        ensure!(
            start + size <= bytes.len(),
            "tar member {:?} runs past the end",
            e.name()
        );
        v.push(TarEntry {
            data: bytes[start..start + size].to_vec(),
            ..e
        });
        off = start + size.div_ceil(512) * 512;
    }
    bail!("tar has no end-of-archive marker")
}

/// Serialises members back into a tar (with the two-block end marker).
pub fn build_tar(entries: &[TarEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        out.extend_from_slice(&e.header);
        out.extend_from_slice(&e.data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// The data of member `name` in the tar `bytes`.
pub fn tar_member(bytes: &[u8], name: &str) -> Result<Option<Vec<u8>>> {
    Ok(parse_tar(bytes)?
        .into_iter()
        .find(|e| e.name() == name)
        .map(|e| e.data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, data: &[u8]) -> TarEntry {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[156] = b'0';
        h[257..265].copy_from_slice(b"ustar\x0000");
        let mut e = TarEntry {
            header: h,
            data: Vec::new(),
        };
        e.set_data(data.to_vec());
        e
    }

    #[test]
    fn tar_round_trip_and_edit() {
        let t = build_tar(&[entry("a.img", b"hello"), entry("b/c.json", &[7u8; 600])]);
        assert_eq!(t.len() % 512, 0);
        let mut es = parse_tar(&t).unwrap();
        assert_eq!(es.len(), 2);
        assert_eq!(es[0].name(), "a.img");
        assert_eq!(es[1].data, vec![7u8; 600]);
        es[1].set_data(vec![1, 2, 3]);
        let t2 = build_tar(&es);
        assert_eq!(tar_member(&t2, "b/c.json").unwrap().unwrap(), vec![1, 2, 3]);
        assert_eq!(tar_member(&t2, "a.img").unwrap().unwrap(), b"hello");
        assert!(tar_member(&t2, "nope").unwrap().is_none());
        // The checksum we write is what GNU tar computes (unsigned sum, spaces in the field).
        let h = &parse_tar(&t2).unwrap()[1].header;
        let stored = parse_octal(&h[148..156]).unwrap();
        let mut copy = *h;
        copy[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, copy.iter().map(|b| u64::from(*b)).sum::<u64>());
    }
}
