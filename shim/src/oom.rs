//! OOM notification, as containerd-shim-runc-v2 gives it: every OOM kill in the container's
//! memory cgroup becomes one TaskOOM event, reported before the TaskExit of an init it killed.
//!
//! The watch is event-driven — an eventfd registered on `memory.oom_control` (cgroup v1) or an
//! inotify watch on `memory.events` (cgroup v2, which the kernel touches on every change) — and
//! counts `oom_kill` from the first moment the cgroup exists (container create), so a workload
//! killed right after start is not missed. [`OomWatch::final_check`] reads the counter once
//! more when the init exits, so a kill whose notification is still in flight is reported too.

use std::{
    fs::File,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

type Callback = Arc<dyn Fn() + Send + Sync>;

/// Watches one container's memory cgroup; stops when dropped.
pub struct OomWatch {
    shared: Arc<Shared>,
}

struct Shared {
    counter: PathBuf,
    /// `oom_kill` as last reported.
    last: Mutex<u64>,
    on_oom: Callback,
    stop: AtomicBool,
}

impl Shared {
    /// Reports every OOM kill since the last look; `false` once the cgroup is gone.
    fn report_new(&self) -> bool {
        let Some(now) = oom_kills(&self.counter) else {
            return false;
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        for _ in *last..now {
            (self.on_oom)();
        }
        *last = (*last).max(now);
        true
    }
}

impl OomWatch {
    /// Reports any OOM kill not reported yet; call when the init exits, before its TaskExit.
    pub fn final_check(&self) {
        self.shared.report_new();
    }
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// `oom_kill` from cgroup v2 `memory.events` or v1 `memory.oom_control`.
fn oom_kills(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// The notification source for a counter file.
enum Source {
    /// cgroup v1: an eventfd the kernel signals on OOM (and when the cgroup goes away).
    EventFd(OwnedFd),
    /// cgroup v2: inotify on `memory.events`.
    Inotify(nix::sys::inotify::Inotify),
}

impl Source {
    fn v1(dir: &Path) -> std::io::Result<Source> {
        let control = File::open(dir.join("memory.oom_control"))?;
        // SAFETY: eventfd(2) with valid flags; the result is checked before use.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `efd` is a fresh descriptor that nothing else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        std::fs::write(
            dir.join("cgroup.event_control"),
            format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()),
        )?;
        Ok(Source::EventFd(efd))
    }

    fn v2(events: &Path) -> std::io::Result<Source> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        ino.add_watch(events, AddWatchFlags::IN_MODIFY)?;
        Ok(Source::Inotify(ino))
    }

    /// Waits up to `timeout` for a notification; `true` when one came.
    fn wait(&self, timeout: Duration) -> bool {
        let ms = PollTimeout::try_from(timeout.as_millis().min(60_000) as i32)
            .unwrap_or(PollTimeout::MAX);
        let ready = match self {
            Source::EventFd(fd) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                poll(&mut fds, ms).unwrap_or(0) > 0
            }
            Source::Inotify(ino) => {
                let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
                poll(&mut fds, ms).unwrap_or(0) > 0
            }
        };
        if ready {
            match self {
                Source::EventFd(fd) => {
                    // An eventfd read is always 8 bytes: the number of notifications.
                    let mut buf = [0u8; 8];
                    let _ = nix::unistd::read(fd, &mut buf);
                }
                Source::Inotify(ino) => {
                    let _ = ino.read_events();
                }
            }
        }
        ready
    }
}

/// Starts watching the memory cgroup of `pid`; `on_oom` runs once per OOM kill from now on.
/// `None` when the memory cgroup cannot be found.
pub fn watch(pid: u32, on_oom: impl Fn() + Send + Sync + 'static) -> Option<OomWatch> {
    use gpusnap_transaction::cgroup;
    let (counter, source) = match cgroup::v1_controller_dir(pid, "memory") {
        Some(dir) => (dir.join("memory.oom_control"), Source::v1(&dir)),
        None => {
            let events = cgroup::v2_dir(pid)?.join("memory.events");
            (events.clone(), Source::v2(&events))
        }
    };
    let last = oom_kills(&counter)?;
    let shared = Arc::new(Shared {
        counter,
        last: Mutex::new(last),
        on_oom: Arc::new(on_oom),
        stop: AtomicBool::new(false),
    });
    let thread_shared = shared.clone();
    let source = match source {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::debug!(error = %e, "no OOM notification source; polling the counter");
            None
        }
    };
    std::thread::Builder::new()
        .name("oom-watch".into())
        .spawn(move || {
            // The timeout only bounds how long a stopped watch lingers (and is the fallback
            // when no notification source could be set up).
            let tick = Duration::from_millis(if source.is_some() { 1000 } else { 100 });
            while !thread_shared.stop.load(Ordering::Relaxed) {
                match &source {
                    Some(s) => {
                        s.wait(tick);
                    }
                    None => std::thread::sleep(tick),
                }
                if !thread_shared.report_new() {
                    break; // cgroup removed
                }
            }
        })
        .ok()?;
    Some(OomWatch { shared })
}
