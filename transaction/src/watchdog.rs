//! The restore's deadline: a thread that watches `runc restore` and, when CRIU has not finished
//! in time, kills runc, CRIU and every process below them.
//!
//! A CRIU that a forged image stalls mid-restore holds runc, its caller and the half-restored
//! tree (with CRIU's capabilities) for as long as nobody kills it. The watch learns runc's pid
//! from the front end's [`Host`](crate::Host), notes the cgroup runc puts CRIU in (the
//! container's: what CRIU restored lives there even after it left CRIU's process group), and at
//! the deadline SIGKILLs the process tree. Killing the container's cgroup is left to
//! [`crate::leftovers`], which runs after every failed restore.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the watch looks at runc's children (for CRIU's cgroup) and, for a foreground
/// restore, at runc's state file.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Default)]
struct Watched {
    runc_pid: Option<u32>,
    done: bool,
    expired: bool,
    /// A foreground restore has finished restoring (runc wrote the container's state): the
    /// deadline no longer applies to the container's own run.
    restored: bool,
    cgroup: Option<PathBuf>,
    killed: usize,
}

/// What the watch saw, once `runc restore` has returned.
#[derive(Debug, Default)]
pub struct WatchReport {
    /// The deadline passed before CRIU finished: runc and its tree were killed.
    pub expired: bool,
    /// A foreground restore got as far as a running container.
    pub restored: bool,
    /// The cgroup runc put CRIU in (the container's), when seen.
    pub cgroup: Option<PathBuf>,
    /// Processes killed at the deadline (runc, CRIU and below).
    pub killed: usize,
}

pub struct Watchdog {
    shared: Arc<(Mutex<Watched>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching; `restored_when` is runc's state file of the container for a
    /// foreground restore (its appearance ends the deadline), `None` for `--detach`.
    pub fn start(limit: Duration, restored_when: Option<PathBuf>) -> Watchdog {
        let shared = Arc::new((Mutex::new(Watched::default()), Condvar::new()));
        let s = shared.clone();
        let deadline = Instant::now() + limit;
        let thread = std::thread::Builder::new()
            .name("restore-deadline".into())
            .spawn(move || watch(&s, deadline, restored_when))
            .ok();
        Watchdog { shared, thread }
    }

    /// runc was spawned as `pid`.
    pub fn started(&self, pid: u32) {
        let (m, cv) = &*self.shared;
        m.lock().unwrap_or_else(|e| e.into_inner()).runc_pid = Some(pid);
        cv.notify_all();
    }

    /// runc has returned: stops the watch.
    pub fn finish(mut self) -> WatchReport {
        let (m, cv) = &*self.shared;
        m.lock().unwrap_or_else(|e| e.into_inner()).done = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let w = m.lock().unwrap_or_else(|e| e.into_inner());
        WatchReport {
            expired: w.expired,
            restored: w.restored,
            cgroup: w.cgroup.clone(),
            killed: w.killed,
        }
    }
}

fn watch(shared: &(Mutex<Watched>, Condvar), deadline: Instant, restored_when: Option<PathBuf>) {
    let (m, cv) = shared;
    let mut w = m.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if w.done || w.expired || w.restored {
            return;
        }
        if let Some(runc) = w.runc_pid {
            if w.cgroup.is_none() {
                // runc moves CRIU into the container's cgroup before the restore starts.
                w.cgroup = descendants(runc)
                    .into_iter()
                    .find(|&p| comm(p).as_deref() == Some("criu"))
                    .and_then(crate::cgroup::dir_of);
            }
            if restored_when.as_ref().is_some_and(|f| f.is_file()) {
                w.restored = true;
                return;
            }
            if Instant::now() >= deadline {
                w.expired = true;
                w.killed = kill_tree(runc);
                tracing::warn!(
                    runc_pid = runc,
                    killed = w.killed,
                    "restore deadline passed: runc and CRIU killed"
                );
                return;
            }
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(POLL)
            .max(Duration::from_millis(1));
        w = cv
            .wait_timeout(w, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// SIGKILLs `root` and every process below it, children first found by a full `/proc` scan
/// (a process CRIU forked may have been re-parented within the tree). Returns how many.
pub fn kill_tree(root: u32) -> usize {
    // Stopped first, so that runc neither reacts to its children's deaths nor exits before it
    // is killed itself.
    // SAFETY: kill(2) on a pid; no memory is involved.
    unsafe { libc::kill(root as libc::pid_t, libc::SIGSTOP) };
    let mut killed = 0;
    // Until nothing new appears: CRIU may fork while the signals go out.
    for _ in 0..5 {
        let tree = descendants(root);
        let fresh: Vec<u32> = tree.into_iter().collect();
        if fresh.is_empty() {
            break;
        }
        for pid in &fresh {
            // SAFETY: kill(2) on a pid read from /proc; no memory is involved.
            if unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    if unsafe { libc::kill(root as libc::pid_t, libc::SIGKILL) } == 0 {
        killed += 1;
    }
    killed
}

/// Every live process below `root`, from the parent links in `/proc/<pid>/stat`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = ppid(pid) {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(child, parent) in &parent_of {
            if parent == p && !out.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything; fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn ppid(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22): with the
/// pid, it names one process across pid reuse.
pub fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether `pid` has exited and waits to be reaped (a killed runtime whose parent has not
/// collected it yet is dead all the same).
pub fn is_zombie(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "Z"))
}

fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_tree_is_killed_at_the_deadline() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 600 & sleep 600; wait"])
            .spawn()
            .unwrap();
        let w = Watchdog::start(Duration::from_millis(300), None);
        w.started(child.id());
        let t = Instant::now();
        let status = child.wait().unwrap();
        let report = w.finish();
        assert!(report.expired);
        assert!(report.killed >= 2, "{report:?}");
        assert!(!status.success());
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_prompt_run_is_left_alone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let w = Watchdog::start(Duration::from_secs(30), None);
        w.started(child.id());
        assert!(child.wait().unwrap().success());
        let report = w.finish();
        assert!(!report.expired && report.killed == 0);
    }

    #[test]
    fn own_start_time_is_stable() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert_eq!(start_time(me), start_time(me));
    }
}
