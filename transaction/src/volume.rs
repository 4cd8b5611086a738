//! Restores from a checkpoint image mounted read-only into the pod (a Kubernetes image
//! volume), with nothing done on the node beforehand.
//!
//! The volume holds the image's layers unpacked: the CRI archive layout (`checkpoint/`,
//! `rootfs-diff.tar`, the `.dump` files) or a bare checkpoint directory, and in a chunked image
//! `checkpoint/.gpusnap-chunks/` plus the chunk list instead of the page images. Everything in
//! it is hostile. It cannot be restored in place (CRIU needs the page images whole, and the
//! volume is read-only), so the checkpoint is first *materialized* into a root-only directory
//! of the node:
//!
//! ```text
//! <cache>/<image digest>/checkpoint/     the flat checkpoint: manifest, signature, listing and
//!                                        every file the manifest lists (chunked ones assembled)
//!                       /rootfs-diff.tar the writable layer, copied
//!                       /gpusnap-volume.json  what the copy was made from (root-only record)
//! <cache>/<image digest>.lock            one flock per image: builds, holders and removal
//! <cache>/<image digest>.holders.json    the image volumes (one per pod) that use the copy
//! <cache>/.build-<image digest>.<pid>    a copy being made; renamed into place when complete
//! ```
//!
//! - **Copied beneath the volume, capped.** Only what a restore reads is copied: the manifest
//!   (read capped), its signature, the writable layer's listing, the chunk list and each file
//!   the manifest lists, each opened beneath the volume's checkpoint directory (no symlink
//!   followed, a regular file with one link) and copied up to the size the manifest gives it,
//!   no further; what else the volume holds is never read. Chunked files are assembled from
//!   the volume's chunk directory (`chunks::assemble_at`: every chunk SHA-256-checked, every
//!   file BLAKE3-checked against the manifest before it is renamed into place).
//! - **Then the one restore transaction**, which verifies the copy as every door's
//!   checkpoint: the signature policy on its directory signature, every file against the
//!   manifest, the rootfs diff against the digest taken of the copy, the GPU gate, the
//!   privilege bound, the writable layer under `require`.
//! - **One copy per image per node.** The copy is keyed by the image's digest, which
//!   containerd names the volume's mount directory by after it verified the image it pulled.
//!   Pods that mount the same image share the copy (the second waits on the image's lock while
//!   the first makes it, then restores from it); a pod whose container is started again (the
//!   kubelet's retry after a failed start) finds it made. Keyed by the image rather than by
//!   the checkpoint's manifest, a pod only ever gets a copy of an image containerd mounted for
//!   it: knowing another image's manifest gives nothing.
//! - **Held by the pods' volumes.** Each pod whose container restores from the copy records
//!   its volume's mount directory as a holder. containerd removes that directory when the pod
//!   stops, and [`sweep`] (run before every volume restore, and by the shim when a pod's
//!   sandbox goes) removes every copy whose holders are all gone.
//! - **Nothing left after a refusal.** A refused restore (the signature, the contents, the
//!   GPU, the privilege bound) drops its pod's hold, and the copy goes with the last hold; a
//!   copy that could not be made leaves nothing. A restore that *failed* (CRIU, the deadline
//!   after the rootfs diff was applied) keeps the hold, so the retry does not copy again.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpusnap_checkpoint::chunks::{self, DirSource, CHUNK_LIST_FILE, MAX_CHUNK_LIST_BYTES};
use gpusnap_checkpoint::signature::{SIGNATURE_FILE, SIGNATURE_MAX_BYTES};
use gpusnap_checkpoint::writable_layer::{LISTING_FILE, LISTING_MAX_BYTES};
use gpusnap_checkpoint::{beneath, layout::MANIFEST_FILE, validate};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Refusal, Result};
use crate::host::Host;
use crate::restore::{RestoreReport, RestoreRequest, RootfsDiff};

/// The directory under `restore.checkpoint_root` that holds the copies.
pub const CACHE_DIR: &str = ".gpusnap-volumes";
/// The checkpoint directory inside a copy (and inside a volume of the archive layout).
const CHECKPOINT_SUBDIR: &str = "checkpoint";
const ROOTFS_DIFF: &str = "rootfs-diff.tar";
/// The record of what a copy was made from.
const RECORD_FILE: &str = "gpusnap-volume.json";
const BUILD_PREFIX: &str = ".build-";
/// Largest holders file read back (one line per pod on the node using the image).
const HOLDERS_MAX_BYTES: u64 = 1 << 20;
/// Largest record read back.
const RECORD_MAX_BYTES: u64 = 64 << 10;

/// An image volume to restore from, as the front end found it in the container's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSource {
    /// The volume's mount directory on the host (containerd's, from the spec's bind mount).
    pub mount: PathBuf,
    /// The image's digest (64 lowercase hex digits), the last component of `mount`.
    pub image_digest: String,
    /// Where the container sees it: the mount's destination in the spec.
    pub destination: PathBuf,
    /// How the pod named it, for messages (the annotation's value).
    pub shown: String,
    /// Where copies are made: `<restore.checkpoint_root>/.gpusnap-volumes`.
    pub cache: PathBuf,
}

impl VolumeSource {
    /// `mount` as containerd names an image volume's directory:
    /// `…/image-volumes/<sandbox id>/<image digest hex>`. `None` when it is not one.
    pub fn digest_of_mount(mount: &Path, sandbox_id: &str) -> Option<String> {
        let digest = mount.file_name()?.to_str()?;
        let sandbox = mount.parent()?;
        let base = sandbox.parent()?;
        let is_hex64 =
            |s: &str| s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        (is_hex64(digest)
            && sandbox.file_name()? == OsStr::new(sandbox_id)
            && base.file_name()? == OsStr::new("image-volumes"))
        .then(|| digest.to_owned())
    }

    fn entry(&self) -> PathBuf {
        self.cache.join(&self.image_digest)
    }
}

/// The record written into a copy when it is complete (root-only, never from the volume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    image_digest: String,
    /// SHA-256 (hex) and size of the copied `rootfs-diff.tar`, when the volume had one.
    rootfs_diff: Option<(String, u64)>,
    /// The checkpoint's files assembled from chunks (0: none).
    assembled_files: usize,
}

/// What [`restore`] did besides the transaction, for the front end's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Materialized {
    /// The copy restored from.
    pub checkpoint_dir: PathBuf,
    /// Made by this restore (false: another pod's restore or an earlier attempt made it).
    pub made: bool,
    pub elapsed_ms: u64,
}

/// Restores `req` (whose `checkpoint_dir` and `rootfs_diff` are filled in here) from the image
/// volume `source`: the copy is found or made, then the one restore transaction runs on it.
/// A refusal drops this volume's hold on the copy (and the copy with the last hold).
pub fn restore(
    source: &VolumeSource,
    mut req: RestoreRequest,
    host: &dyn Host,
) -> Result<(RestoreReport, Materialized)> {
    let id = req.container_id.clone();
    let made = materialize(source, req.config.restore.max_rootfs_diff_bytes)
        .map_err(|e| e.of("restore", &id))?;
    req.checkpoint_dir = made.0.checkpoint_dir.clone();
    req.rootfs_diff = made.1;
    // What vouches for the copy is its own directory signature, as at the CRI door: the
    // volume brings no registry signature the runtime could check.
    req.signature_evidence = crate::SignatureEvidence::DirectoryOnly;
    req.checkpoint_mount = Some((source.destination.clone(), source.mount.clone()));
    match crate::restore::restore(&req, host) {
        Ok(report) => Ok((report, made.0)),
        Err(e) => {
            if matches!(
                e,
                Error::Refused {
                    reason: Refusal::Precondition | Refusal::InvalidRequest,
                    ..
                }
            ) {
                release(source);
            }
            Err(e)
        }
    }
}

/// Finds or makes the copy of `source`, holding it for `source`'s pod.
fn materialize(source: &VolumeSource, max_diff: u64) -> Result<(Materialized, Option<RootfsDiff>)> {
    let started = Instant::now();
    beneath::create_private_dir(&source.cache).map_err(|e| {
        Error::precondition(format!(
            "cannot create {} for the checkpoint of the image volume at {}: {e}",
            source.cache.display(),
            source.shown
        ))
    })?;
    // Copies whose pods are gone go first, so that the node holds only what runs.
    sweep(&source.cache);
    let cache = beneath::open_root(&source.cache).map_err(|e| io_refusal(&source.cache, e))?;
    let _lock = ImageLock::take(cache.as_fd(), &source.cache, &source.image_digest)?;
    let entry = source.entry();
    let mut holders = Holders::read(cache.as_fd(), &source.image_digest);
    holders.add(&source.mount);
    holders
        .write(cache.as_fd(), &source.image_digest)
        .map_err(|e| io_refusal(&source.cache, e))?;
    let existing = match read_record(cache.as_fd(), &source.image_digest) {
        Some(r) if r.image_digest == source.image_digest => Some(r),
        _ => None,
    };
    let (record, made) = match existing {
        Some(r) => (r, false),
        None => match build(cache.as_fd(), source, max_diff) {
            Ok(r) => (r, true),
            Err(e) => {
                // Nothing of a copy that could not be made stays, nor this pod's hold.
                drop_hold_locked(cache.as_fd(), source);
                return Err(e);
            }
        },
    };
    let rootfs_diff = record.rootfs_diff.map(|(sha256, _)| RootfsDiff {
        path: entry.join(ROOTFS_DIFF),
        sha256,
        content_bytes: None,
    });
    let m = Materialized {
        checkpoint_dir: entry.join(CHECKPOINT_SUBDIR),
        made,
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    tracing::info!(
        volume = %source.shown,
        image_digest = %source.image_digest,
        dir = %m.checkpoint_dir.display(),
        made = m.made,
        assembled_files = record.assembled_files,
        elapsed_ms = m.elapsed_ms,
        "checkpoint of the image volume ready"
    );
    Ok((m, rootfs_diff))
}

/// Drops `source`'s pod's hold on its copy, and the copy when no other pod holds it and no
/// restore reads it.
pub fn release(source: &VolumeSource) {
    let Ok(cache) = beneath::open_root(&source.cache) else {
        return;
    };
    match ImageLock::take(cache.as_fd(), &source.cache, &source.image_digest) {
        Ok(_lock) => drop_hold_locked(cache.as_fd(), source),
        Err(e) => tracing::warn!(error = %e, "cannot drop the hold on the volume's checkpoint"),
    }
}

/// [`release`] under the image's lock.
fn drop_hold_locked(cache: BorrowedFd<'_>, source: &VolumeSource) {
    let mut holders = Holders::read(cache, &source.image_digest);
    holders.remove(&source.mount);
    holders.prune();
    if let Err(e) = holders.write(cache, &source.image_digest) {
        tracing::warn!(error = %e, "cannot record the volume checkpoint's holders");
    }
    if holders.mounts.is_empty() {
        // A copy a restore still reads stays; the next sweep removes it.
        remove_copy(cache, &source.cache, &source.image_digest);
    }
}

/// Removes every copy in `cache` whose holders' volumes are all gone, and builds whose
/// process died. Copies in use (their lock held, a restore reading them) are left for later.
pub fn sweep(cache_path: &Path) {
    let Ok(cache) = beneath::open_root(cache_path) else {
        return;
    };
    let Ok(names) = beneath::names(cache.as_fd()) else {
        return;
    };
    for name in names {
        let Some(name) = name.to_str() else { continue };
        let digest = match name.strip_prefix(BUILD_PREFIX) {
            Some(rest) => rest.split('.').next().unwrap_or_default(),
            None => name
                .strip_suffix(".lock")
                .or_else(|| name.strip_suffix(".holders.json"))
                .unwrap_or(name),
        };
        if !is_digest(digest) {
            continue;
        }
        let Ok(_lock) = ImageLock::try_take(cache.as_fd(), cache_path, digest) else {
            continue;
        };
        // Under the lock no build runs: a build directory is a dead build's.
        if name.starts_with(BUILD_PREFIX) {
            let _ = beneath::remove_all_at(cache.as_fd(), OsStr::new(name));
            continue;
        }
        let mut holders = Holders::read(cache.as_fd(), digest);
        holders.prune();
        let _ = holders.write(cache.as_fd(), digest);
        if holders.mounts.is_empty() {
            remove_copy(cache.as_fd(), cache_path, digest);
        }
    }
}

/// Removes the copy `digest` and its holders (under its lock), unless a restore reads it.
fn remove_copy(cache: BorrowedFd<'_>, cache_path: &Path, digest: &str) {
    let entry = cache_path.join(digest);
    let checkpoint = entry.join(CHECKPOINT_SUBDIR);
    // A restore holds the checkpoint directory's lock shared from before it reads it.
    let in_use = checkpoint.is_dir() && crate::lock::DirLock::exclusive(&checkpoint).is_err();
    if in_use {
        return;
    }
    if let Err(e) = beneath::remove_all_at(cache, OsStr::new(digest)) {
        tracing::warn!(dir = %entry.display(), error = %e, "cannot remove the volume's checkpoint copy");
        return;
    }
    let _ = beneath::remove_all_at(cache, OsStr::new(&format!("{digest}.holders.json")));
    // The lock file goes last; a waiter on it finds it unlinked and takes the new one.
    let _ = beneath::remove_all_at(cache, OsStr::new(&format!("{digest}.lock")));
    tracing::info!(dir = %entry.display(), "volume checkpoint copy removed");
}

fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn io_refusal(path: &Path, e: io::Error) -> Error {
    Error::precondition(format!("{}: {e}", path.display()))
}

/// The flock of one image's copy: `<cache>/<digest>.lock`, taken on a file that is still the
/// one at that name (a remover unlinks it last, after which a waiter takes it again).
struct ImageLock {
    _lock: Flock<File>,
}

impl ImageLock {
    /// Waits for the lock (another pod may be making the copy).
    fn take(cache: BorrowedFd<'_>, shown: &Path, digest: &str) -> Result<ImageLock> {
        Self::lock(cache, shown, digest, FlockArg::LockExclusive)
    }

    fn try_take(cache: BorrowedFd<'_>, shown: &Path, digest: &str) -> Result<ImageLock> {
        Self::lock(cache, shown, digest, FlockArg::LockExclusiveNonblock)
    }

    fn lock(cache: BorrowedFd<'_>, shown: &Path, digest: &str, arg: FlockArg) -> Result<Self> {
        let name = format!("{digest}.lock");
        let path = shown.join(&name);
        for _ in 0..16 {
            let file = open_lock_file(cache, &name).map_err(|e| io_refusal(&path, e))?;
            let lock = Flock::lock(file, arg)
                .map_err(|(_, e)| Error::busy(format!("{}: {e}", path.display())))?;
            let held = lock.metadata().map_err(|e| io_refusal(&path, e))?;
            match beneath::stat_at(cache, OsStr::new(&name)) {
                Ok(Some(st)) if st.st_ino == held.ino() && st.st_dev == held.dev() => {
                    return Ok(ImageLock { _lock: lock })
                }
                // Removed (or replaced) while this waited: take the one there now.
                Ok(_) => continue,
                Err(e) => return Err(io_refusal(&path, e)),
            }
        }
        Err(Error::busy(format!(
            "{} keeps being replaced; try again",
            path.display()
        )))
    }
}

fn open_lock_file(cache: BorrowedFd<'_>, name: &str) -> io::Result<File> {
    // O_CREAT without O_EXCL, never through a symlink: the cache is root-only, 0700.
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    opts.open(beneath::proc_path(cache, OsStr::new(name)))
}

/// The volumes (one per pod) that hold a copy: `<digest>.holders.json`, one mount directory
/// per line.
struct Holders {
    mounts: Vec<PathBuf>,
}

impl Holders {
    fn read(cache: BorrowedFd<'_>, digest: &str) -> Holders {
        let name = format!("{digest}.holders.json");
        let mounts = beneath::read_capped(cache, Path::new(&name), HOLDERS_MAX_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice::<Vec<PathBuf>>(&b).ok())
            .unwrap_or_default();
        Holders { mounts }
    }

    fn add(&mut self, mount: &Path) {
        if !self.mounts.iter().any(|m| m == mount) {
            self.mounts.push(mount.to_path_buf());
        }
    }

    fn remove(&mut self, mount: &Path) {
        self.mounts.retain(|m| m != mount);
    }

    /// Drops the holders whose volume directory is gone (containerd removes it when the pod
    /// stops).
    fn prune(&mut self) {
        self.mounts
            .retain(|m| std::fs::symlink_metadata(m).is_ok_and(|md| md.is_dir()));
    }

    fn write(&self, cache: BorrowedFd<'_>, digest: &str) -> io::Result<()> {
        let bytes = serde_json::to_vec(&self.mounts).map_err(io::Error::other)?;
        beneath::write_atomically(
            cache,
            OsStr::new(&format!("{digest}.holders.json")),
            &bytes,
            0o600,
        )
    }
}

/// The record of the complete copy `digest`, if there is one.
fn read_record(cache: BorrowedFd<'_>, digest: &str) -> Option<Record> {
    let rel = Path::new(digest).join(RECORD_FILE);
    let bytes = beneath::read_capped(cache, &rel, RECORD_MAX_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Makes the copy of `source` in a build directory and renames it into place; a failure
/// removes the build directory.
fn build(cache: BorrowedFd<'_>, source: &VolumeSource, max_diff: u64) -> Result<Record> {
    let build_name = format!(
        "{BUILD_PREFIX}{}.{}",
        source.image_digest,
        std::process::id()
    );
    let build_path = source.cache.join(&build_name);
    // A copy left half-made by a killed build of this image (or an older, unrecorded copy).
    let _ = beneath::remove_all_at(cache, OsStr::new(&build_name));
    let _ = beneath::remove_all_at(cache, OsStr::new(&source.image_digest));
    let made = (|| {
        mkdir_at(cache, &build_name).map_err(|e| io_refusal(&build_path, e))?;
        let dir = beneath::open_dir(cache, Path::new(&build_name))
            .map_err(|e| io_refusal(&build_path, e))?;
        let record = copy_volume(source, dir.as_fd(), &build_path, max_diff)?;
        let bytes = serde_json::to_vec(&record).map_err(|e| Error::precondition(e.to_string()))?;
        beneath::write_atomically(dir.as_fd(), OsStr::new(RECORD_FILE), &bytes, 0o600)
            .map_err(|e| io_refusal(&build_path, e))?;
        beneath::rename_at(
            cache,
            OsStr::new(&build_name),
            OsStr::new(&source.image_digest),
        )
        .map_err(|e| io_refusal(&build_path, e))?;
        Ok(record)
    })();
    if made.is_err() {
        let _ = beneath::remove_all_at(cache, OsStr::new(&build_name));
    }
    made
}

fn mkdir_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    nix::sys::stat::Mode::from_bits(0o700)
        .ok_or_else(|| io::Error::other("mode"))
        .and_then(|mode| {
            nix::sys::stat::mkdirat(dir, OsStr::new(name), mode).map_err(io::Error::from)
        })
}

/// Copies what a restore reads of the volume into the build directory `out` (shown as
/// `out_path`).
fn copy_volume(
    source: &VolumeSource,
    out: BorrowedFd<'_>,
    out_path: &Path,
    max_diff: u64,
) -> Result<Record> {
    let shown = |rel: &str| format!("{}/{rel}", source.shown.trim_end_matches('/'));
    let refuse = |what: String| {
        Error::precondition(format!(
            "the image volume at {} does not hold a restorable gpusnap checkpoint: {what}; \
             mount an image built by `gpusnap image build` or pushed by the gpusnap node agent",
            source.shown
        ))
    };
    let root = beneath::open_root(&source.mount).map_err(|e| io_refusal(&source.mount, e))?;
    // The archive layout (`checkpoint/` + `rootfs-diff.tar`), or a bare checkpoint directory.
    let (vol_ckpt, ckpt_rel): (Option<OwnedFd>, &str) =
        match beneath::open_dir(root.as_fd(), Path::new(CHECKPOINT_SUBDIR)) {
            Ok(fd) => (Some(fd), "checkpoint/"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (None, ""),
            Err(e) => return Err(refuse(format!("{}: {e}", shown(CHECKPOINT_SUBDIR)))),
        };
    let vol = vol_ckpt.as_ref().map_or(root.as_fd(), |fd| fd.as_fd());
    let manifest_bytes =
        match beneath::read_capped(vol, Path::new(MANIFEST_FILE), validate::MANIFEST_MAX_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(refuse(format!(
                    "{} is missing",
                    shown(&format!("{ckpt_rel}{MANIFEST_FILE}"))
                )))
            }
            Err(e) => {
                return Err(refuse(format!(
                    "{}: {e}",
                    shown(&format!("{ckpt_rel}{MANIFEST_FILE}"))
                )))
            }
        };
    let manifest_shown = PathBuf::from(shown(&format!("{ckpt_rel}{MANIFEST_FILE}")));
    let manifest = validate::parse_manifest(&manifest_bytes, &manifest_shown)
        .map_err(|e| refuse(e.to_string()))?;

    mkdir_at(out, CHECKPOINT_SUBDIR).map_err(|e| io_refusal(out_path, e))?;
    let out_ckpt = beneath::open_dir(out, Path::new(CHECKPOINT_SUBDIR))
        .map_err(|e| io_refusal(out_path, e))?;
    let out_ckpt_path = out_path.join(CHECKPOINT_SUBDIR);

    // Room for the checkpoint and the rootfs diff, said before anything is written.
    let diff_size = match beneath::stat_at(root.as_fd(), OsStr::new(ROOTFS_DIFF)) {
        Ok(Some(st)) if vol_ckpt.is_some() => Some(st.st_size as u64),
        _ => None,
    };
    // A diff past the setting is refused before anything is copied.
    if let Some(size) = diff_size.filter(|&size| size > max_diff) {
        return Err(refuse(format!(
            "{} is {size} bytes, more than restore.max_rootfs_diff_bytes ({max_diff})",
            shown(ROOTFS_DIFF)
        )));
    }
    // What the copy writes: every listed file at its listed size (what a copy or an assembly
    // may write of it), not the manifest's own total, which nothing has checked yet.
    let listed = manifest
        .images
        .files
        .iter()
        .fold(0u64, |sum, f| sum.saturating_add(f.size));
    let needed = listed
        .max(manifest.images.total_bytes)
        .saturating_add(diff_size.unwrap_or(0));
    let free = beneath::available_bytes(out).map_err(|e| io_refusal(out_path, e))?;
    if needed > free {
        return Err(Error::precondition(format!(
            "the checkpoint of the image volume at {} needs {needed} bytes in {}, which has \
             {free} free; free space there (restore.checkpoint_root)",
            source.shown,
            source.cache.display()
        )));
    }

    write_new(out_ckpt.as_fd(), MANIFEST_FILE, &manifest_bytes)
        .map_err(|e| io_refusal(&out_ckpt_path, e))?;
    for (name, cap) in [
        (SIGNATURE_FILE, SIGNATURE_MAX_BYTES),
        (LISTING_FILE, LISTING_MAX_BYTES),
        (CHUNK_LIST_FILE, MAX_CHUNK_LIST_BYTES),
    ] {
        copy_optional(vol, name, cap, out_ckpt.as_fd())
            .map_err(|e| refuse(format!("{}: {e}", shown(&format!("{ckpt_rel}{name}")))))?;
    }
    // The files assembled from chunks are not in the volume as themselves.
    let chunked: Vec<String> = match beneath::read_capped(
        out_ckpt.as_fd(),
        Path::new(CHUNK_LIST_FILE),
        MAX_CHUNK_LIST_BYTES,
    ) {
        Ok(bytes) => chunks::ChunkList::parse(&bytes)
            .map_err(|e| {
                refuse(format!(
                    "{}: {e}",
                    shown(&format!("{ckpt_rel}{CHUNK_LIST_FILE}"))
                ))
            })?
            .files
            .into_iter()
            .map(|f| f.path)
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_refusal(&out_ckpt_path, e)),
    };
    for f in &manifest.images.files {
        if chunked.iter().any(|c| c == &f.path) {
            continue;
        }
        copy_listed(vol, &f.path, f.size, out_ckpt.as_fd())
            .map_err(|e| refuse(format!("{}: {e}", shown(&format!("{ckpt_rel}{}", f.path)))))?;
    }
    let assembled_files = if chunked.is_empty() {
        0
    } else {
        let chunk_source = DirSource::open_in(vol, Path::new(&shown(ckpt_rel)))
            .map_err(|e| {
                refuse(format!(
                    "{}: {e}",
                    shown(&format!("{ckpt_rel}.gpusnap-chunks"))
                ))
            })?
            .ok_or_else(|| {
                refuse(format!(
                    "{} lists chunked files, but {} is missing",
                    shown(&format!("{ckpt_rel}{CHUNK_LIST_FILE}")),
                    shown(&format!("{ckpt_rel}.gpusnap-chunks"))
                ))
            })?;
        chunks::assemble_at(out_ckpt.as_fd(), &out_ckpt_path, &chunk_source)
            .map_err(|e| refuse(e.to_string()))?
            .files
    };

    let rootfs_diff = match diff_size {
        None => None,
        Some(size) if size > max_diff => {
            return Err(refuse(format!(
                "{} is {size} bytes, more than restore.max_rootfs_diff_bytes ({max_diff})",
                shown(ROOTFS_DIFF)
            )))
        }
        Some(size) => {
            copy_listed(root.as_fd(), ROOTFS_DIFF, size, out)
                .map_err(|e| refuse(format!("{}: {e}", shown(ROOTFS_DIFF))))?;
            let sha256 = gpusnap_checkpoint::rootfs_diff::sha256_file(&out_path.join(ROOTFS_DIFF))
                .map_err(|e| io_refusal(&out_path.join(ROOTFS_DIFF), e))?;
            Some((sha256, size))
        }
    };
    Ok(Record {
        image_digest: source.image_digest.clone(),
        rootfs_diff,
        assembled_files,
    })
}

/// Opens `name` in the volume directory `vol`: beneath it, no symlink, a regular file with one
/// link (another name could be a file outside the image).
fn open_plain(vol: BorrowedFd<'_>, name: &str) -> io::Result<File> {
    let file = beneath::open_file(vol, Path::new(name))?;
    let links = file.metadata()?.nlink();
    if links > 1 {
        return Err(io::Error::other(validate::hard_linked(links)));
    }
    Ok(file)
}

/// Copies the listed file `name` of `size` bytes: refused when it is missing, or holds another
/// number of bytes (read no further than one byte past `size`).
fn copy_listed(vol: BorrowedFd<'_>, name: &str, size: u64, out: BorrowedFd<'_>) -> io::Result<()> {
    let file = match open_plain(vol, name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(io::Error::other(
                "missing (the checkpoint's manifest lists it)",
            ))
        }
        other => other?,
    };
    let found = file.metadata()?.len();
    if found != size {
        return Err(io::Error::other(format!(
            "{found} bytes, where {size} are expected"
        )));
    }
    let mut dst = beneath::create_new(out, OsStr::new(name), 0o600)?;
    let copied = io::copy(&mut file.take(size.saturating_add(1)), &mut dst)?;
    if copied != size {
        return Err(io::Error::other(format!(
            "{copied} bytes read, where {size} are expected"
        )));
    }
    dst.flush()
}

/// Copies `name` when the volume has it, refusing it past `cap` bytes.
fn copy_optional(vol: BorrowedFd<'_>, name: &str, cap: u64, out: BorrowedFd<'_>) -> io::Result<()> {
    let file = match open_plain(vol, name) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    if size > cap {
        return Err(io::Error::other(format!(
            "{size} bytes, more than the {cap} bytes such a file may have"
        )));
    }
    copy_listed(vol, name, size, out)
}

fn write_new(dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> io::Result<()> {
    let mut f = beneath::create_new(dir, OsStr::new(name), 0o600)?;
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_containerds_image_volume_directories_name_a_digest() {
        let d = "a".repeat(64);
        let ok = PathBuf::from(format!(
            "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/sb1/{d}"
        ));
        assert_eq!(VolumeSource::digest_of_mount(&ok, "sb1"), Some(d.clone()));
        for (path, sandbox) in [
            (ok.clone(), "sb2"),
            (PathBuf::from(format!("/var/lib/x/sb1/{d}")), "sb1"),
            (PathBuf::from("/run/x/image-volumes/sb1/ABC"), "sb1"),
            (
                PathBuf::from(format!("/run/x/image-volumes/sb1/{}", "A".repeat(64))),
                "sb1",
            ),
            (PathBuf::from(format!("/image-volumes/sb1/{d}/..")), "sb1"),
        ] {
            assert_eq!(
                VolumeSource::digest_of_mount(&path, sandbox),
                None,
                "{}",
                path.display()
            );
        }
    }
}
