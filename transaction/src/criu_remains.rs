//! What a killed CRIU leaves on the host, and its removal: its yards (a CRIU killed mid-restore
//! cannot undo what it set up in the host's mount namespace: see [`crate::leftovers`]), the
//! `criu-root` bind mount runc makes for a restore, and a CRIU still writing images after its
//! runc or runtime was killed. The real implementations of the [`crate::host::Host`] operations
//! of the same names; nothing here runs runc.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpusnap_checkpoint::beneath;
use gpusnap_criu_bridge::criu_log::{self, TMP_YARDS, WORK_DIR_YARDS};

/// Detaches and removes CRIU's yards of the restore whose work directory is `work_dir`: those
/// in the work directory by CRIU's names ([`WORK_DIR_YARDS`]), and those in `/tmp` its
/// `restore.log` names ([`criu_log::tmp_yards_named`]). Returns what was removed and what
/// could not be.
pub fn clear_criu_yards(work_dir: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
    let mut removed = Vec::new();
    let mut left = Vec::new();
    let tmp_names = criu_log::tmp_yards_named(&work_dir.join(gpusnap_criu_bridge::RESTORE_LOG));
    for (dir, names, prefixes) in [
        (work_dir, None, &WORK_DIR_YARDS[..]),
        (Path::new("/tmp"), Some(tmp_names), &TMP_YARDS[..]),
    ] {
        let Ok(fd) = beneath::open_root(dir) else {
            continue;
        };
        let names: Vec<String> = match names {
            Some(named) => named,
            None => beneath::names(fd.as_fd())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|n| n.into_string().ok())
                .collect(),
        };
        for name in names.iter().filter(|n| criu_log::is_yard_name(n, prefixes)) {
            match remove_yard(fd.as_fd(), OsStr::new(name)) {
                Ok(true) => removed.push(dir.join(name)),
                Ok(false) => {}
                Err(e) => left.push((dir.join(name), e.to_string())),
            }
        }
    }
    if !removed.is_empty() || !left.is_empty() {
        tracing::info!(work_dir = %work_dir.display(), removed = ?removed, left = ?left, "CRIU's yards cleared");
    }
    (removed, left)
}

/// Detaches every mount on the directory `name` in `parent` (CRIU's yard: a tmpfs, its
/// cgroup mounts go with it) and removes the then empty directory. `Ok(false)`: no such
/// directory. Never follows a symlink; refuses anything but a root-owned directory.
fn remove_yard(parent: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> std::io::Result<bool> {
    let Some(st) = beneath::stat_at(parent, name)? else {
        return Ok(false);
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_uid != 0 {
        return Err(std::io::Error::other(
            "not a directory of root's: left alone",
        ));
    }
    let path = beneath::proc_path(parent, name);
    // Stacked mounts come off one at a time; EINVAL says none is left.
    for _ in 0..16 {
        match nix::mount::umount2(
            &path,
            nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
        ) {
            Ok(()) => continue,
            Err(nix::errno::Errno::EINVAL) => break,
            Err(e) => return Err(e.into()),
        }
    }
    nix::unistd::unlinkat(parent, name, nix::unistd::UnlinkatFlags::RemoveDir)?;
    Ok(true)
}

/// Detaches the `criu-root` bind mount runc makes in its directory of a container it restores.
pub fn detach_criu_root(dir: &Path) {
    let criu_root = dir.join("criu-root");
    if let Ok(c) = std::ffi::CString::new(criu_root.as_os_str().as_encoded_bytes()) {
        // SAFETY: umount2(2) with a NUL-terminated path; EINVAL (not a mount) is fine.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// SIGKILLs every CRIU that holds `image_dir` open (runc hands CRIU the directory as a
/// descriptor) and waits up to a few seconds for them to go: a CRIU whose runc or runtime was
/// killed goes on writing images, which would land after the failed checkpoint's scrub.
/// Returns how many were killed.
pub fn kill_criu_writing(image_dir: &Path) -> usize {
    let Ok(target) = std::fs::canonicalize(image_dir) else {
        return 0;
    };
    let writers: Vec<(u32, Option<u64>)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "criu")
        })
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == target))
        })
        .map(|pid| (pid, crate::watchdog::start_time(pid)))
        .collect();
    for (pid, _) in &writers {
        // SAFETY: kill(2) on a pid read from /proc; no memory is involved.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    let gone = |&(pid, start): &(u32, Option<u64>)| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
            || crate::watchdog::start_time(pid) != start
    };
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while !writers.iter().all(gone) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !writers.is_empty() {
        tracing::warn!(dir = %image_dir.display(), killed = writers.len(), "CRIU still writing a failed checkpoint was killed");
    }
    writers.len()
}
