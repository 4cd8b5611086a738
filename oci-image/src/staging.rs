//! Staging directories of pulls, and their removal once the pull that made them is gone.
//!
//! A pull writes beside its destination, into `.NAME.KIND-PID-START[-SEQ]` (KIND `extract`,
//! `pull` or `scratch`; PID and START the pulling process's id and start time, in clock ticks
//! since boot), and renames it into place only once everything in it was verified. A pull
//! killed with SIGKILL cannot remove it, and an extracting pull's staging directory holds a
//! whole checkpoint (decrypted, for an encrypted image). So the pull holds an exclusive
//! `flock` on the directory for as long as it uses it, and [`sweep`] — run by every pull on its
//! destination's directory and by `gpusnap store gc` on `restore.checkpoint_root` — removes a
//! staging directory only when nobody holds its lock *and* its owner is not running: the
//! lock is free the moment its holder dies, whatever pid namespace it ran in; the pid and
//! start time cover the instant between `mkdir` and `flock` (a reused pid has another start
//! time). A live pull's staging directory is never touched.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gpusnap_checkpoint::beneath;
use rustix::fs::{flock, FlockOperation, Mode, OFlags};

use super::error::ImageError;

/// What a staging directory is for; its name says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `pull --extract` (and a local extraction): the checkpoint being unpacked.
    Extract,
    /// A layout being pulled.
    Pull,
    /// `gpusnap image pull`'s scratch space for a layout it does not keep.
    Scratch,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Extract, Kind::Pull, Kind::Scratch];

    fn word(self) -> &'static str {
        match self {
            Kind::Extract => "extract",
            Kind::Pull => "pull",
            Kind::Scratch => "scratch",
        }
    }
}

/// A staging directory this process made and holds locked; the lock goes with the value (or
/// with the process). A scratch directory ([`scratch`]) is removed with the value; the others
/// are renamed into place or removed by their users.
#[derive(Debug)]
pub struct Held {
    path: PathBuf,
    lock: Option<OwnedFd>,
    remove: bool,
}

impl Held {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.remove {
            // Beneath a descriptor of the directory: a symlink planted inside goes, never what
            // it points at. Removed while still locked.
            let emptied = self
                .lock
                .as_ref()
                .map_or(Ok(()), |fd| beneath::empty_dir(fd.as_fd(), &|_| false));
            let removed = emptied.and_then(|()| {
                let parent = self.path.parent().unwrap_or(Path::new("."));
                let name = self.path.file_name().unwrap_or_default();
                let dir = beneath::open_root(parent)?;
                rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::REMOVEDIR)
                    .map_err(io::Error::from)
            });
            if let Err(e) = removed {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove a scratch directory");
            }
        }
        drop(self.lock.take());
    }
}

/// A scratch directory in `parent` for `gpusnap image pull` (a layout it does not keep), with
/// the staging directories' name and lock, removed when the value is dropped.
pub fn scratch(parent: &Path) -> Result<Held, ImageError> {
    let mut held = create(&parent.join("gpusnap"), Kind::Scratch)?;
    held.remove = true;
    Ok(held)
}

/// This process's start time (clock ticks after boot), read once.
fn own_start() -> u64 {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *START.get_or_init(|| start_time(std::process::id()).unwrap_or(0))
}

/// Field 22 of `/proc/PID/stat` (after the command name, which may hold anything but ends at
/// the last `)`); `None` when the process does not exist.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.iter().rposition(|&b| b == b')')?;
    let fields = std::str::from_utf8(&stat[after + 1..]).ok()?;
    // After the name: state (field 3) ... starttime (field 22).
    fields.split_whitespace().nth(19)?.parse().ok()
}

/// The name a staging directory of `kind` for `dest_name` gets in this process.
fn name_for(dest_name: &OsStr, kind: Kind) -> OsString {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut name = OsString::from(".");
    name.push(dest_name);
    name.push(format!(
        ".{}-{}-{}-{}",
        kind.word(),
        std::process::id(),
        own_start(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    name
}

/// Creates a new staging directory of `kind` (mode 0700) for the destination `dest`, beside
/// it, and locks it. Stale staging directories there are removed first ([`sweep`]).
pub fn create(dest: &Path, kind: Kind) -> Result<Held, ImageError> {
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dest_name = dest.file_name().unwrap_or(OsStr::new("image"));
    sweep_quietly(&parent);
    let dir = beneath::open_root(&parent).map_err(ImageError::io("opening", &parent))?;
    let name = name_for(dest_name, kind);
    let path = parent.join(&name);
    rustix::fs::mkdirat(&dir, name.as_os_str(), Mode::from_raw_mode(0o700))
        .map_err(|e| ImageError::io("creating", &path)(e.into()))?;
    let lock = lock_dir(dir.as_fd(), &name).map_err(ImageError::io("locking", &path))?;
    Ok(Held {
        path,
        lock: Some(lock),
        remove: false,
    })
}

/// Opens the directory `name` in `dir` (never through a symlink) and locks it exclusively.
fn lock_dir(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let fd = beneath::openat2(
        dir,
        Path::new(name),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    flock(&fd, FlockOperation::NonBlockingLockExclusive)?;
    Ok(fd)
}

/// The owner a staging directory's name records: pid and, in names of this version, start
/// time; `None` when `name` is not a staging directory's.
fn owner_of(name: &[u8]) -> Option<(u32, Option<u64>)> {
    let name = std::str::from_utf8(name).ok()?;
    let rest = name.strip_prefix('.')?;
    let (_, tail) = rest.rsplit_once('.')?;
    let (kind, numbers) = tail.split_once('-')?;
    if !Kind::ALL.iter().any(|k| k.word() == kind) {
        return None;
    }
    let numbers: Vec<u64> = numbers
        .split('-')
        .map(|n| {
            (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .then(|| n.parse().ok())
                .flatten()
        })
        .collect::<Option<_>>()?;
    match (kind, numbers.as_slice()) {
        // Before start times were recorded: `.NAME.extract-PID`, `.NAME.pull-PID-SEQ`.
        ("extract", [pid]) | ("pull", [pid, _]) => Some((u32::try_from(*pid).ok()?, None)),
        (_, [pid, start, ..]) if numbers.len() <= 3 => {
            Some((u32::try_from(*pid).ok()?, Some(*start)))
        }
        _ => None,
    }
}

/// Whether the process `pid` that started at `start` (any start, when not recorded) runs.
fn running(pid: u32, start: Option<u64>) -> bool {
    match start_time(pid) {
        None => false,
        Some(now) => start.is_none_or(|s| s == now),
    }
}

/// Removes every staging directory in `dir` whose pull is gone (its lock free, its owner not
/// running), never following a symlink. Returns what it removed.
pub fn sweep(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let fd = match beneath::open_root(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    for name in beneath::names(fd.as_fd())? {
        let Some((pid, start)) = owner_of(name.as_bytes()) else {
            continue;
        };
        // A symlink or a file under such a name is not a staging directory, and a locked one is
        // in use: left alone.
        let Ok(lock) = lock_dir(fd.as_fd(), &name) else {
            continue;
        };
        // Only this user's own (a pull run by another user made it, and removes it).
        let me = rustix::process::geteuid().as_raw();
        let mine = rustix::fs::fstat(&lock).is_ok_and(|st| st.st_uid == me);
        if !mine || running(pid, start) {
            continue;
        }
        let path = dir.join(&name);
        if let Err(e) = beneath::remove_all_at(fd.as_fd(), &name) {
            tracing::warn!(staging = %path.display(), error = %e, "could not remove the staging directory of a pull that is gone");
            continue;
        }
        drop(lock);
        tracing::info!(
            staging = %path.display(),
            pid,
            "removed the staging directory of a pull that is gone"
        );
        removed.push(path);
    }
    Ok(removed)
}

/// [`sweep`] where a failure only costs a leftover (logged).
pub(crate) fn sweep_quietly(dir: &Path) {
    if let Err(e) = sweep(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not look for stale staging directories");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_staging_directories() {
        assert_eq!(owner_of(b".ck.extract-12-345-0"), Some((12, Some(345))));
        assert_eq!(owner_of(b".a.b.pull-12-345-7"), Some((12, Some(345))));
        assert_eq!(owner_of(b".x.scratch-9-1-2"), Some((9, Some(1))));
        // Names of earlier versions.
        assert_eq!(owner_of(b".ck.extract-12"), Some((12, None)));
        assert_eq!(owner_of(b".ck.pull-12-3"), Some((12, None)));
        for other in [
            &b"ck"[..],
            b".ck",
            b".ck.extract-",
            b".ck.extract-x",
            b".ck.extract--1",
            b".ck.unpack-1-2-3",
            b".ck.extract-1-2-3-4",
            b"ck.extract-1-2-3",
        ] {
            assert_eq!(owner_of(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn only_a_dead_owners_unlocked_directory_is_swept() {
        let top = tempfile::tempdir().unwrap();
        let dest = top.path().join("ck");
        // Live: this process holds it.
        let live = create(&dest, Kind::Extract).unwrap();
        std::fs::write(live.path().join("f"), b"x").unwrap();
        // Dead: a pid that cannot exist, unlocked.
        let dead = top.path().join(".ck.extract-4194305-1-0");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("secret"), b"x").unwrap();
        // This process's pid, another start time: a reused pid.
        let reused = top
            .path()
            .join(format!(".ck.pull-{}-1-0", std::process::id()));
        std::fs::create_dir(&reused).unwrap();
        // This process, unlocked (the instant between mkdir and flock): left alone.
        let starting = top.path().join(format!(
            ".ck.scratch-{}-{}-9",
            std::process::id(),
            own_start()
        ));
        std::fs::create_dir(&starting).unwrap();
        // Not a directory, and not a staging name.
        let outside = top.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, top.path().join(".x.extract-4194305-1-0")).unwrap();
        std::fs::create_dir(top.path().join("keep.extract-4194305-1-0")).unwrap();

        let mut removed = sweep(top.path()).unwrap();
        removed.sort();
        let mut want = vec![dead.clone(), reused.clone()];
        want.sort();
        assert_eq!(removed, want);
        assert!(live.path().join("f").exists());
        assert!(starting.exists());
        assert!(outside.exists());
        assert!(top.path().join(".x.extract-4194305-1-0").exists());
        assert!(top.path().join("keep.extract-4194305-1-0").exists());
        // Once the live one is let go (its process "gone" is simulated by the lock alone not
        // being enough: this process still runs, so it stays).
        let path = live.path().to_path_buf();
        drop(live);
        assert!(sweep(top.path()).unwrap().is_empty());
        assert!(path.exists());
    }
}
