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

/// Whether the host mounts the unified hierarchy (cgroup v2) at the root.
fn unified() -> bool {
    Path::new(CGROUP_ROOT).join("cgroup.controllers").is_file()
}

/// The container's cgroup directory as its runtime spec names it (`linux.cgroupsPath`, the
/// systemd driver's `slice:prefix:name` form included; runc's defaults when it names none):
/// the unified directory on cgroup v2, the freezer controller's on v1. Known without any
/// process of the container (a restore whose CRIU failed before any was left to ask).
pub fn of_spec(bundle: &Path, id: &str, systemd: bool) -> Option<PathBuf> {
    let spec: serde_json::Value =
        serde_json::from_slice(&crate::bundle_spec::read_bytes(bundle).ok()?).ok()?;
    let given = spec
        .pointer("/linux/cgroupsPath")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let rel = if systemd {
        // runc's default for the systemd driver is `system.slice:runc:<id>`.
        let given = if given.is_empty() {
            format!("system.slice:runc:{id}")
        } else {
            given.to_owned()
        };
        let mut parts = given.splitn(3, ':');
        let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
        let unit = if name.ends_with(".slice") {
            name.to_owned()
        } else {
            format!("{prefix}-{name}.scope")
        };
        systemd_slice_path(if slice.is_empty() {
            "system.slice"
        } else {
            slice
        })?
        .join(unit)
    } else if given.is_empty() {
        PathBuf::from(id)
    } else {
        PathBuf::from(given.trim_start_matches('/'))
    };
    if rel.as_os_str().is_empty()
        || rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    Some(if unified() {
        Path::new(CGROUP_ROOT).join(rel)
    } else {
        Path::new(CGROUP_ROOT).join("freezer").join(rel)
    })
}

/// `a-b-c.slice` lives in `a.slice/a-b.slice/a-b-c.slice`, as systemd nests slices.
fn systemd_slice_path(slice: &str) -> Option<PathBuf> {
    let stem = slice.strip_suffix(".slice")?;
    if stem == "-" || stem.is_empty() {
        return Some(PathBuf::new());
    }
    let mut path = PathBuf::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    Some(path)
}

/// The cgroup directory (unified, else v1 freezer) a process is in.
pub fn dir_of(pid: u32) -> Option<PathBuf> {
    v2_dir(pid).or_else(|| v1_controller_dir(pid, "freezer"))
}

/// Whether the cgroup at `dir` is frozen: `cgroup.events`' `frozen 1` (v2) or `freezer.state`
/// other than `THAWED` (v1, `FREEZING` included). `None` when it cannot be read.
pub fn frozen_at(dir: &Path) -> Option<bool> {
    if let Ok(events) = std::fs::read_to_string(dir.join("cgroup.events")) {
        if let Some(v) = events.lines().find_map(|l| l.strip_prefix("frozen ")) {
            return Some(v.trim() == "1");
        }
    }
    if let Ok(freeze) = std::fs::read_to_string(dir.join("cgroup.freeze")) {
        return Some(freeze.trim() == "1");
    }
    let state = std::fs::read_to_string(dir.join("freezer.state")).ok()?;
    Some(state.trim() != "THAWED")
}

/// Whether the cgroup of `pid` is frozen; `None` when it cannot be read.
pub fn frozen(pid: u32) -> Option<bool> {
    frozen_at(&dir_of(pid)?)
}

/// Thaws the cgroup at `dir` (and so everything below it).
pub fn thaw_at(dir: &Path) -> std::io::Result<()> {
    if dir.join("cgroup.freeze").is_file() {
        std::fs::write(dir.join("cgroup.freeze"), "0")
    } else {
        std::fs::write(dir.join("freezer.state"), "THAWED")
    }
}

/// Every pid in the cgroup at `dir` and below it; empty when it does not exist.
pub fn pids_at(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Kills every process in the cgroup at `dir` and below, thawing it first (a frozen task on
/// cgroup v1 dies only once thawed), and waits up to `wait` for it to empty. Returns how many
/// processes it found and the pids still there at the end.
pub fn kill_all_at(dir: &Path, wait: std::time::Duration) -> (usize, Vec<u32>) {
    if !is_container_cgroup(dir) {
        tracing::error!(cgroup = %dir.display(), "refusing to kill a cgroup that holds this process or the whole host");
        return (0, Vec::new());
    }
    let found = pids_at(dir);
    if found.is_empty() {
        return (0, found);
    }
    let _ = thaw_at(dir);
    let until = std::time::Instant::now() + wait;
    loop {
        // cgroup.kill (Linux 5.14) also reaches processes forked while the signals go out.
        if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
            for pid in pids_at(dir) {
                // SAFETY: kill(2) with a pid read from the cgroup; no memory is involved.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let left = pids_at(dir);
        if left.is_empty() || std::time::Instant::now() >= until {
            return (found.len(), left);
        }
    }
}

/// Whether `dir` can be a container's cgroup: below a hierarchy's root (never the root itself)
/// and neither this process's cgroup nor one above it (a CRIU runc failed to move would
/// otherwise name the runtime's own).
pub fn is_container_cgroup(dir: &Path) -> bool {
    let root = Path::new(CGROUP_ROOT);
    let Ok(rel) = dir.strip_prefix(root) else {
        return false;
    };
    let depth = rel.components().count();
    let v1_mount = !unified() && depth >= 1;
    if depth == 0 || (v1_mount && depth < 2) {
        return false;
    }
    let me = std::process::id();
    let own = [v2_dir(me), v1_controller_dir(me, "freezer")];
    !own.iter().flatten().any(|o| o.starts_with(dir))
}

/// Removes the cgroup at `dir` and its empty sub-cgroups, deepest first, and on cgroup v1 the
/// same cgroup under every other controller; what cannot be removed (still populated, already
/// gone) is left.
pub fn remove_at(dir: &Path) {
    if !is_container_cgroup(dir) {
        return;
    }
    remove_one(dir);
    let Ok(rel) = dir.strip_prefix(Path::new(CGROUP_ROOT).join("freezer")) else {
        return;
    };
    if rel.as_os_str().is_empty() {
        return;
    }
    for controller in std::fs::read_dir(CGROUP_ROOT)
        .into_iter()
        .flatten()
        .flatten()
    {
        let d = controller.path().join(rel);
        if d != dir && d.is_dir() {
            remove_one(&d);
        }
    }
}

fn remove_one(dir: &Path) {
    let mut all = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(entries) = std::fs::read_dir(&all[i]) {
            all.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        i += 1;
    }
    for d in all.iter().rev() {
        let _ = std::fs::remove_dir(d);
    }
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

    #[test]
    fn systemd_slices_nest() {
        assert_eq!(
            systemd_slice_path("a-b-c.slice").unwrap(),
            Path::new("a.slice/a-b.slice/a-b-c.slice")
        );
        assert_eq!(
            systemd_slice_path("system.slice").unwrap(),
            Path::new("system.slice")
        );
        assert_eq!(systemd_slice_path("-.slice").unwrap(), Path::new(""));
        assert_eq!(systemd_slice_path("nope"), None);
    }

    #[test]
    fn spec_cgroup_paths_stay_under_the_root() {
        let b = tempfile::tempdir().unwrap();
        let spec = |p: &str| {
            std::fs::write(
                b.path().join("config.json"),
                serde_json::json!({"linux": {"cgroupsPath": p}}).to_string(),
            )
            .unwrap()
        };
        let base = if unified() {
            PathBuf::from(CGROUP_ROOT)
        } else {
            Path::new(CGROUP_ROOT).join("freezer")
        };
        spec("/default/c1");
        assert_eq!(
            of_spec(b.path(), "c1", false),
            Some(base.join("default/c1"))
        );
        spec("kubepods-pod1.slice:cri-containerd:c1");
        assert_eq!(
            of_spec(b.path(), "c1", true),
            Some(base.join("kubepods.slice/kubepods-pod1.slice/cri-containerd-c1.scope"))
        );
        spec("/a/../../etc");
        assert_eq!(of_spec(b.path(), "c1", false), None);
        spec("");
        assert_eq!(of_spec(b.path(), "c1", false), Some(base.join("c1")));
    }
}
