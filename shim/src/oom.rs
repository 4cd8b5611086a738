//! OOM notification: watches the container's memory cgroup (v2 `memory.events`, v1
//! `memory.oom_control`) and reports each
//! increase of `oom_kill`, which is what containerd's TaskOOM event means.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

/// Stops the watcher when dropped.
pub struct OomWatch {
    stop: Arc<AtomicBool>,
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `oom_kill` counter from cgroup v2 `memory.events` or v1 `memory.oom_control`.
fn oom_kills(path: &PathBuf) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// Starts watching the cgroup of `pid`; `on_oom` runs once per new OOM kill. Returns `None`
/// when the memory cgroup cannot be found.
pub fn watch(pid: u32, on_oom: impl Fn() + Send + 'static) -> Option<OomWatch> {
    let events = match crate::stats::v1_controller_dir(pid, "memory") {
        Some(dir) => dir.join("memory.oom_control"),
        None => containerd_shim::cgroup::get_cgroups_v2_path_by_pid(pid)
            .ok()?
            .join("memory.events"),
    };
    let mut last = oom_kills(&events)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    std::thread::Builder::new()
        .name("oom-watch".into())
        .spawn(move || {
            // cgroupfs files support inotify only for some kernels' notifications; a short
            // poll of one small file is cheap and works everywhere.
            while !stop2.load(Ordering::Relaxed) {
                match oom_kills(&events) {
                    Some(n) if n > last => {
                        for _ in last..n {
                            on_oom();
                        }
                        last = n;
                    }
                    Some(_) => {}
                    None => break, // cgroup removed
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .ok()?;
    Some(OomWatch { stop })
}
