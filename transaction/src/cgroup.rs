//! The container's cgroup, read from cgroupfs: its pids and whether it is frozen.
//!
//! Reading cgroupfs is cheaper than `runc ps` on the checkpoint's critical path, and works the
//! same for both front ends.

use std::path::{Path, PathBuf};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The directory of `controller` (cgroup v1) for `pid`, e.g. `/sys/fs/cgroup/memory/<path>`.
pub fn v1_controller_dir(pid: u32, controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == controller) {
            let path = path.trim_start_matches('/');
            for mount in [controller, controllers] {
                let dir = Path::new(CGROUP_ROOT).join(mount).join(path);
                if dir.is_dir() {
                    return Some(dir);
                }
            }
        }
    }
    None
}

/// The unified (cgroup v2) directory of `pid`, when the host mounts one.
pub fn v2_dir(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new(CGROUP_ROOT).join(path.trim_start_matches('/'));
    dir.join("cgroup.procs").is_file().then_some(dir)
}

/// Every pid in the cgroup of `init_pid` and its sub-cgroups, sorted; `None` when the cgroup
/// cannot be read (then ask runc).
pub fn pids(init_pid: u32) -> Option<Vec<u32>> {
    let dir = v1_controller_dir(init_pid, "pids")
        .or_else(|| v1_controller_dir(init_pid, "freezer"))
        .or_else(|| v2_dir(init_pid))?;
    let mut pids = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        let text = std::fs::read_to_string(d.join("cgroup.procs")).ok()?;
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    pids.sort_unstable();
    Some(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cgroup_lists_this_process() {
        let me = std::process::id();
        if let Some(pids) = pids(me) {
            assert!(pids.contains(&me), "{pids:?}");
        }
        assert_eq!(pids(u32::MAX), None);
    }
}
