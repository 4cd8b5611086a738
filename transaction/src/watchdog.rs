//! The restore's watch over `runc restore`: it ends a CRIU that stalls past the restore's
//! deadline, and notices a CRIU that dies mid-restore the moment it dies.
//!
//! A CRIU that a forged image stalls mid-restore holds runc, its caller and the half-restored
//! tree (with CRIU's capabilities) for as long as nobody kills it. The watch learns runc's pid
//! from the front end's [`Host`](crate::Host), finds CRIU below it, notes the cgroup runc puts
//! CRIU in (the container's: what CRIU restored lives there even after it left CRIU's process
//! group), and at the deadline SIGKILLs the process tree.
//!
//! A CRIU that dies mid-restore (killed, or crashed) does not end runc: runc waits on CRIU's
//! socket, which the half-restored tasks, children of CRIU that runc (a subreaper) inherits,
//! still hold. So the watch holds a pidfd of CRIU and polls it with the deadline: when CRIU
//! dies by a signal, or exits and runc has not returned shortly after, runc and its tree are
//! killed at once, and the front end's wait returns. Killing the container's cgroup and
//! removing CRIU's yards are left to [`crate::leftovers`], which runs after every failed
//! restore.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the watch looks for CRIU below runc (and, for a foreground restore, at runc's
/// state file) until it has CRIU's pidfd.
const POLL: Duration = Duration::from_millis(50);

/// How long runc may take to return by itself after CRIU exited without a signal (runc reads
/// CRIU's last answer and cleans up; a CRIU that failed cleanly ends its own tree).
pub const CRIU_EXIT_GRACE: Duration = Duration::from_secs(2);

/// How a CRIU ended that the watch saw die before runc returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CriuEnd {
    /// Killed by this signal.
    Signal(i32),
    /// Exited with this status, and runc did not return within [`CRIU_EXIT_GRACE`].
    Exit(i32),
    /// Gone (already reaped: how is not known), and runc did not return within
    /// [`CRIU_EXIT_GRACE`].
    Gone,
}

impl std::fmt::Display for CriuEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CriuEnd::Signal(s) => write!(f, "was killed by signal {s}"),
            CriuEnd::Exit(c) => write!(f, "exited with status {c}"),
            CriuEnd::Gone => f.write_str("died"),
        }
    }
}

#[derive(Debug, Default)]
struct Watched {
    runc_pid: Option<u32>,
    done: bool,
    expired: bool,
    /// A foreground restore has finished restoring (runc wrote the container's state): the
    /// deadline no longer applies to the container's own run.
    restored: bool,
    cgroup: Option<PathBuf>,
    criu_pid: Option<u32>,
    /// How CRIU ended, as read the moment its pidfd said so (before runc reaps it).
    criu_ended: Option<(u32, CriuEnd)>,
    criu_died: Option<(u32, CriuEnd)>,
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
    /// CRIU (its pid, how it ended) died mid-restore: runc and its tree were killed.
    pub criu_died: Option<(u32, CriuEnd)>,
    /// CRIU ended before runc returned (its pid, how), whether or not runc then returned by
    /// itself: for the failure's message.
    pub criu_ended: Option<(u32, CriuEnd)>,
    /// Processes killed at the deadline or after CRIU died (runc, CRIU and below).
    pub killed: usize,
}

pub struct Watchdog {
    shared: Arc<Mutex<Watched>>,
    /// An eventfd that wakes the watch out of its poll (`started`, `finish`); without one the
    /// watch wakes every [`POLL`].
    wake: Option<Arc<OwnedFd>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching until `deadline`; `restored_when` is runc's state file of the container
    /// for a foreground restore (its appearance ends the deadline), `None` for `--detach`.
    pub fn start(deadline: Instant, restored_when: Option<PathBuf>) -> Watchdog {
        let shared = Arc::new(Mutex::new(Watched::default()));
        // SAFETY: eventfd(2) with valid flags; the result is checked before it is owned.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        // SAFETY: a fresh descriptor this process owns alone.
        let wake = (raw >= 0).then(|| Arc::new(unsafe { OwnedFd::from_raw_fd(raw) }));
        let (s, w) = (shared.clone(), wake.clone());
        let thread = std::thread::Builder::new()
            .name("restore-deadline".into())
            .spawn(move || watch(&s, w.as_deref(), deadline, restored_when))
            .ok();
        Watchdog {
            shared,
            wake,
            thread,
        }
    }

    /// runc was spawned as `pid`.
    pub fn started(&self, pid: u32) {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .runc_pid = Some(pid);
        self.poke();
    }

    /// runc has returned: stops the watch.
    pub fn finish(mut self) -> WatchReport {
        self.shared.lock().unwrap_or_else(|e| e.into_inner()).done = true;
        self.poke();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let w = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        WatchReport {
            expired: w.expired,
            restored: w.restored,
            cgroup: w.cgroup.clone(),
            criu_died: w.criu_died,
            criu_ended: w.criu_ended,
            killed: w.killed,
        }
    }

    fn poke(&self) {
        let Some(wake) = &self.wake else { return };
        let one: u64 = 1;
        // SAFETY: write(2) of 8 bytes from a live u64 to the eventfd.
        unsafe {
            libc::write(
                wake.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

fn watch(
    shared: &Mutex<Watched>,
    wake: Option<&OwnedFd>,
    deadline: Instant,
    restored_when: Option<PathBuf>,
) {
    let mut criu_fd: Option<OwnedFd> = None;
    let mut criu_exited_at: Option<Instant> = None;
    loop {
        {
            let mut w = shared.lock().unwrap_or_else(|e| e.into_inner());
            if w.done || w.expired || w.restored || w.criu_died.is_some() {
                return;
            }
            if let Some(runc) = w.runc_pid {
                if w.criu_pid.is_none() {
                    // runc moves CRIU into the container's cgroup before the restore starts.
                    if let Some(criu) = criu_below(runc) {
                        w.criu_pid = Some(criu);
                        w.cgroup = crate::cgroup::dir_of(criu);
                        criu_fd = pidfd_open(criu);
                        if criu_fd.is_none() {
                            // Already gone: its end is read below like any other.
                            criu_exited_at = Some(Instant::now());
                        }
                    }
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
                if let (Some(criu), Some(exited)) = (w.criu_pid, criu_exited_at) {
                    // runc runs CRIU more than once: `criu swrk` answers its version query,
                    // then another `criu swrk` restores. The CRIU that ended may have been the
                    // first: when another runs below runc now, that one is watched instead.
                    if let Some(next) = criu_below(runc).filter(|&p| p != criu) {
                        tracing::debug!(
                            ended = criu,
                            watched = next,
                            "a CRIU below runc ended and another runs: watching that one"
                        );
                        w.criu_pid = Some(next);
                        w.criu_ended = None;
                        if let Some(cgroup) = crate::cgroup::dir_of(next) {
                            w.cgroup = Some(cgroup);
                        }
                        criu_fd = pidfd_open(next);
                        criu_exited_at = criu_fd.is_none().then(Instant::now);
                        continue;
                    }
                    // A signal ends the restore at once. A CRIU that exited 0 finished its
                    // work: runc returns, or runs another CRIU (the deadline still holds). Any
                    // other exit gets runc a moment to return by itself.
                    let end = zombie_end(criu).or(w.criu_ended.map(|(_, e)| e));
                    if w.criu_ended.is_none() {
                        w.criu_ended = Some((criu, end.unwrap_or(CriuEnd::Gone)));
                    }
                    let end = match end {
                        Some(CriuEnd::Signal(_)) => end,
                        Some(CriuEnd::Exit(0)) => None,
                        _ if exited.elapsed() >= CRIU_EXIT_GRACE => {
                            Some(end.unwrap_or(CriuEnd::Gone))
                        }
                        _ => None,
                    };
                    if let Some(end) = end {
                        w.criu_died = Some((criu, end));
                        w.killed = kill_tree(runc);
                        tracing::warn!(
                            runc_pid = runc,
                            criu_pid = criu,
                            criu = %end,
                            killed = w.killed,
                            "CRIU died mid-restore: runc and what is below it killed"
                        );
                        return;
                    }
                }
            }
        }
        // Wait for the deadline, a poke, CRIU's death, or the next look for CRIU.
        let mut wait = deadline.saturating_duration_since(Instant::now());
        if criu_fd.is_none() || criu_exited_at.is_some() || wake.is_none() {
            wait = wait.min(POLL);
        }
        // A negative descriptor is skipped by poll(2).
        let mut fds = vec![libc::pollfd {
            fd: wake.map_or(-1, |w| w.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        }];
        if let (Some(fd), None) = (&criu_fd, criu_exited_at) {
            fds.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: poll(2) on a live array of pollfds of the given length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if let (Some(wake), true) = (wake, fds[0].revents != 0) {
            let mut sink = 0u64;
            // SAFETY: read(2) of 8 bytes into a live u64 (draining the eventfd).
            unsafe {
                libc::read(
                    wake.as_raw_fd(),
                    (&mut sink as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
        if fds.get(1).is_some_and(|p| p.revents != 0) {
            criu_exited_at = Some(Instant::now());
            // Read how it ended now, before runc reaps it.
            let mut w = shared.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(criu) = w.criu_pid {
                w.criu_ended = Some((criu, zombie_end(criu).unwrap_or(CriuEnd::Gone)));
            }
        }
    }
}

/// The CRIU runc started: the earliest-started `criu` among runc's children (the restored
/// root task is runc's child too, through CLONE_PARENT, and also named `criu` until it runs),
/// else the shallowest below them (a wrapper in between).
fn criu_below(runc: u32) -> Option<u32> {
    let mut level = children(runc);
    for _ in 0..4 {
        let earliest = level
            .iter()
            .copied()
            .filter(|&p| comm(p).as_deref() == Some("criu"))
            .min_by_key(|&p| (start_time(p).unwrap_or(u64::MAX), p));
        if earliest.is_some() {
            return earliest;
        }
        level = level.into_iter().flat_map(children).collect();
        if level.is_empty() {
            return None;
        }
    }
    None
}

/// A pidfd of `pid` (Linux 5.3), polled readable when the process exits.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) with a pid and no flags; the result is checked before it is owned.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a fresh descriptor this process owns alone.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// How a process that exited but was not yet reaped ended (`/proc/<pid>/stat` field 52, the
/// wait status): its parent (runc) is blocked on CRIU's socket and has not collected it.
pub fn zombie_end(pid: u32) -> Option<CriuEnd> {
    let f = stat_fields(pid)?;
    if f.first().map(String::as_str) != Some("Z") {
        return None;
    }
    let status: i32 = f.get(49)?.parse().ok()?;
    let signal = status & 0x7f;
    Some(if signal != 0 && signal != 0x7f {
        CriuEnd::Signal(signal)
    } else {
        CriuEnd::Exit((status >> 8) & 0xff)
    })
}

/// The live children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
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
        let w = Watchdog::start(Instant::now() + Duration::from_millis(300), None);
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
        let w = Watchdog::start(Instant::now() + Duration::from_secs(30), None);
        w.started(child.id());
        assert!(child.wait().unwrap().success());
        let report = w.finish();
        assert!(!report.expired && report.killed == 0);
    }

    #[test]
    fn a_killed_criu_is_noticed_when_it_dies() {
        // "runc" (sh) waits on a child that never ends, as runc waits on CRIU's socket while
        // the half-restored tasks hold it; "criu" is a process of that name below it.
        let dir = tempfile::tempdir().unwrap();
        let criu = dir.path().join("criu");
        std::fs::copy("/bin/sleep", &criu).unwrap();
        let mut runc = std::process::Command::new("sh")
            .arg("-c")
            // exec: the "runc" never reaps its CRIU, as runc blocked on CRIU's socket does not.
            .arg(format!("{} 600 & exec sleep 600", criu.display()))
            .spawn()
            .unwrap();
        let w = Watchdog::start(Instant::now() + Duration::from_secs(600), None);
        w.started(runc.id());
        let found = loop {
            if let Some(p) = criu_below(runc.id()) {
                break p;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The watch looks for CRIU every POLL; let it find this one alive.
        std::thread::sleep(POLL * 4);
        // SAFETY: kill(2) of the child's child.
        unsafe { libc::kill(found as libc::pid_t, libc::SIGKILL) };
        assert!(!runc.wait().unwrap().success());
        let report = w.finish();
        assert!(!report.expired, "{report:?}");
        assert_eq!(
            report.criu_died.map(|(_, e)| e),
            Some(CriuEnd::Signal(9)),
            "{report:?}"
        );
    }

    #[test]
    fn a_criu_that_answered_runcs_version_query_is_not_a_dead_restore() {
        // runc's first CRIU answers its version query and exits 0, as it does before every
        // restore; the second is the restore's, and is killed later. The first is not a CRIU
        // that died mid-restore: the second is, when it is killed.
        let dir = tempfile::tempdir().unwrap();
        let criu = dir.path().join("criu");
        std::fs::copy("/bin/sleep", &criu).unwrap();
        let c = criu.display();
        let mut runc = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{c} 0.3; {c} 600 & exec sleep 600"))
            .spawn()
            .unwrap();
        let w = Watchdog::start(Instant::now() + Duration::from_secs(600), None);
        w.started(runc.id());
        // Past the first CRIU's end and the grace a CRIU that exits gets.
        std::thread::sleep(Duration::from_millis(300) + CRIU_EXIT_GRACE + POLL * 4);
        let second = criu_below(runc.id()).expect("the second CRIU runs");
        assert!(
            still_runs(&mut runc),
            "the watch ended the restore when the version query's CRIU exited"
        );
        // SAFETY: kill(2) of the child's child.
        unsafe { libc::kill(second as libc::pid_t, libc::SIGKILL) };
        assert!(!runc.wait().unwrap().success());
        let report = w.finish();
        assert_eq!(
            report.criu_died,
            Some((second, CriuEnd::Signal(9))),
            "{report:?}"
        );
    }

    /// Whether `runc` still runs (the watch has not killed it).
    fn still_runs(runc: &mut std::process::Child) -> bool {
        runc.try_wait().unwrap().is_none()
    }

    #[test]
    fn own_start_time_is_stable() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert_eq!(start_time(me), start_time(me));
    }
}
