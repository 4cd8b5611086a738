//! Proofs for tests that must be able to fail (issue 20, "Tests that can fail"): positive
//! evidence instead of sleeps, and host state a hostile input could reach, checked for real.
//!
//! - [`frozen`]: whether the kernel's freezer holds a process's cgroup frozen (cgroup v1
//!   `freezer.state`, v2 `cgroup.events`) — proof that nothing in it runs, without waiting;
//! - [`exclusive_flock_on`], [`wait_for_exclusive_flock`]: whether a checkpoint holds its
//!   directory (gpusnap's `flock`, read from `/proc/locks`) — the point where a concurrent
//!   request must be refused;
//! - [`Sentinel`]: a host tree outside every destination, snapshotted by content, mode, owner,
//!   size, inode, mtime and ctime, with the paths escape attempts aim at;
//! - [`CriuConfigFile`]: CRIU's own default config file, changed for one test and restored on
//!   drop (also when the test panics).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The cgroup (v1 freezer hierarchy, or v2) of `pid` and whether the kernel reports it frozen:
/// `Some(true)` only when every task in it is frozen (v1 `freezer.state` = `FROZEN`, v2
/// `cgroup.events` has `frozen 1`), `None` when the process or its cgroup is gone.
pub fn frozen(pid: u32) -> Option<bool> {
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    // v1: "N:freezer:/path"; v2: "0::/path" (only used when there is no v1 freezer).
    let v1 = cgroups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        ctrl.split(',')
            .any(|c| c == "freezer")
            .then(|| path.to_string())
    });
    if let Some(path) = v1 {
        let state = fs::read_to_string(format!(
            "/sys/fs/cgroup/freezer{}/freezer.state",
            path.trim_end_matches('/')
        ))
        .ok()?;
        return Some(state.trim() == "FROZEN");
    }
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let events = fs::read_to_string(format!(
        "/sys/fs/cgroup{}/cgroup.events",
        path.trim_end_matches('/')
    ))
    .ok()?;
    Some(events.lines().any(|l| l.trim() == "frozen 1"))
}

/// Proof that the workload of init `pid` cannot run: the kernel reports its cgroup frozen.
pub fn ensure_frozen(pid: u32, what: &str) -> Result<()> {
    match frozen(pid) {
        Some(true) => Ok(()),
        Some(false) => bail!("{what}: the cgroup of pid {pid} is not frozen"),
        None => bail!("{what}: pid {pid} or its cgroup is gone"),
    }
}

/// Proof that the workload of init `pid` is not held by the freezer.
pub fn ensure_thawed(pid: u32, what: &str) -> Result<()> {
    match frozen(pid) {
        Some(false) => Ok(()),
        Some(true) => bail!("{what}: the cgroup of pid {pid} is still frozen"),
        None => bail!("{what}: pid {pid} or its cgroup is gone"),
    }
}

/// One `flock` of `/proc/locks`: (holder pid, device major, minor, inode, exclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlockEntry {
    pub pid: u32,
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
    pub exclusive: bool,
}

/// The granted (not waiting) `flock`s of the machine.
pub fn flocks() -> Vec<FlockEntry> {
    let text = fs::read_to_string("/proc/locks").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            // "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"; waiters have "->" after the
            // index and are left out.
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(1) != Some(&"FLOCK") {
                return None;
            }
            let mut dev = f.get(5)?.split(':');
            Some(FlockEntry {
                exclusive: *f.get(3)? == "WRITE",
                pid: f.get(4)?.parse().ok()?,
                major: u32::from_str_radix(dev.next()?, 16).ok()?,
                minor: u32::from_str_radix(dev.next()?, 16).ok()?,
                inode: dev.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// Whether some process holds an exclusive `flock` on `path` (a checkpoint writing into it).
pub fn exclusive_flock_on(path: &Path) -> bool {
    let Ok(m) = fs::metadata(path) else {
        return false;
    };
    let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
    flocks()
        .iter()
        .any(|l| l.exclusive && l.inode == m.ino() && l.major == major && l.minor == minor)
}

/// Waits (at most `timeout`) until a checkpoint holds `path` exclusively.
pub fn wait_for_exclusive_flock(path: &Path, timeout: Duration) -> Result<()> {
    if crate::wait_until(timeout, || exclusive_flock_on(path)) {
        Ok(())
    } else {
        bail!(
            "no process took an exclusive lock on {} within {timeout:?}",
            path.display()
        )
    }
}

/// Whether process `pid` holds an exclusive `flock` on anything (the shim during a
/// checkpoint whose directory the test does not know, e.g. `ctr containers checkpoint`'s).
pub fn holds_exclusive_flock(pid: u32) -> bool {
    flocks().iter().any(|l| l.exclusive && l.pid == pid)
}

/// The parent of `pid` (the shim, for a container init it started).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A host tree outside every container, checkpoint and destination, which hostile inputs aim
/// at. [`Sentinel::snapshot`] records every entry's type, mode, owner, size, inode, mtime,
/// ctime and content (or link target), so a write, a replacement, a chmod, a new entry or a
/// removal anywhere in it shows.
pub struct Sentinel {
    dir: tempfile::TempDir,
}

/// The files every sentinel holds (relative path, content).
pub const SENTINEL_FILES: [(&str, &[u8]); 4] = [
    ("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"),
    ("etc/shadow", b"root:*:19000:0:99999:7:::\n"),
    ("etc/conf.d/keep", b"keep me"),
    ("secret", b"host secret"),
];

impl Sentinel {
    pub fn new() -> Result<Sentinel> {
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-sentinel-")
            .tempdir_in("/tmp")
            .context("sentinel directory")?;
        for (rel, content) in SENTINEL_FILES {
            let p = dir.path().join(rel);
            fs::create_dir_all(p.parent().unwrap())?;
            fs::write(&p, content)?;
        }
        fs::create_dir(dir.path().join("tmp"))?;
        Ok(Sentinel { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `rel` inside the sentinel, as an absolute path.
    pub fn target(&self, rel: &str) -> PathBuf {
        self.path().join(rel)
    }

    /// `rel` inside the sentinel as a relative path that climbs to `/` first: it reaches the
    /// sentinel from any directory at most 32 levels deep, so a hostile name built with it
    /// aims at the sentinel wherever the destination lies.
    pub fn climb_to(&self, rel: &str) -> String {
        format!(
            "{}{}",
            "../".repeat(32),
            self.target(rel)
                .display()
                .to_string()
                .trim_start_matches('/')
        )
    }

    /// Every entry of the tree, by path: type, mode, owner, size, inode, mtime and ctime (ns)
    /// and the content's SHA-256 (files) or target (symlinks).
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            let m = fs::symlink_metadata(&d).unwrap();
            out.insert(d.display().to_string(), describe_meta(&m, "dir".into()));
            for e in fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let m = fs::symlink_metadata(&p).unwrap();
                if m.is_dir() {
                    stack.push(p);
                    continue;
                }
                let content = if m.is_file() {
                    crate::fixtures::sha256_file(&p)
                } else if m.file_type().is_symlink() {
                    format!("-> {}", fs::read_link(&p).unwrap().display())
                } else {
                    "special".into()
                };
                out.insert(p.display().to_string(), describe_meta(&m, content));
            }
        }
        out
    }

    /// What changed between two snapshots, one line per path (empty: nothing).
    pub fn diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> String {
        let mut lines = Vec::new();
        for (p, b) in before {
            match after.get(p) {
                None => lines.push(format!("removed {p}")),
                Some(a) if a != b => lines.push(format!("changed {p}: {b} -> {a}")),
                _ => {}
            }
        }
        for p in after.keys().filter(|p| !before.contains_key(*p)) {
            lines.push(format!("created {p}"));
        }
        lines.join("\n")
    }
}

fn describe_meta(m: &fs::Metadata, content: String) -> String {
    format!(
        "mode {:o} uid {} gid {} size {} ino {} mtime {}.{:09} ctime {}.{:09} {content}",
        m.mode(),
        m.uid(),
        m.gid(),
        if m.is_dir() { 0 } else { m.len() },
        m.ino(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// CRIU's own default configuration file, which every CRIU run reads first.
pub const CRIU_DEFAULT_CONF: &str = "/etc/criu/default.conf";

/// A host-wide CRIU config file (e.g. [`CRIU_DEFAULT_CONF`]) replaced for one test; dropping
/// it (also while unwinding from a panic) puts back exactly what was there: the old content
/// and mode, or no file (and no `/etc/criu`) when there was none. One at a time per process:
/// the guard holds a lock, so tests of one binary that change it do not interleave.
pub struct CriuConfigFile {
    path: PathBuf,
    old: Option<(Vec<u8>, u32)>,
    created_dir: Option<PathBuf>,
    _serial: MutexGuard<'static, ()>,
}

impl CriuConfigFile {
    pub fn replace(path: &Path, content: &str) -> Result<CriuConfigFile> {
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let old = match fs::read(path) {
            Ok(bytes) => Some((bytes, fs::metadata(path)?.mode() & 0o7777)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let parent = path.parent().context("config file without a directory")?;
        let created_dir = (!parent.exists()).then(|| parent.to_path_buf());
        let guard = CriuConfigFile {
            path: path.to_path_buf(),
            old,
            created_dir,
            _serial: serial,
        };
        fs::create_dir_all(parent)?;
        fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
        Ok(guard)
    }
}

impl Drop for CriuConfigFile {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        match &self.old {
            Some((bytes, mode)) => {
                let _ = fs::write(&self.path, bytes);
                let _ = fs::set_permissions(&self.path, fs::Permissions::from_mode(*mode));
            }
            None => {
                let _ = fs::remove_file(&self.path);
            }
        }
        if let Some(dir) = &self.created_dir {
            let _ = fs::remove_dir(dir);
        }
    }
}
