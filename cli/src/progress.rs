//! A progress line for pushes and pulls, redrawn on stderr while bytes move, only when stderr is
//! a terminal (scripts and logs get the summary alone).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpusnap_oci_image::{Progress, Transfer};

use crate::inspect::human_bytes;

/// `downloaded 612 MiB of 8.0 GiB (41 of 180 blobs; 139 already present)`.
pub fn transfer_line(verb: &str, t: &Transfer) -> String {
    let mut extra = format!("{} already present", t.present_blobs);
    if t.mounted_blobs > 0 {
        extra.push_str(&format!(
            ", {} mounted from another repository",
            t.mounted_blobs
        ));
    }
    format!(
        "{verb} {} of {} ({} of {} blobs; {extra})",
        human_bytes(t.moved_bytes),
        human_bytes(t.bytes),
        t.moved_blobs,
        t.blobs,
    )
}

/// Draws `progress` on stderr every 200 ms until dropped; does nothing unless stderr is a tty.
pub struct ProgressLine {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn stderr_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor number.
    unsafe { libc::isatty(libc::STDERR_FILENO) == 1 }
}

impl ProgressLine {
    /// The counters to hand to the registry options, and the line drawing them.
    pub fn start(verb: &'static str) -> (Option<Arc<Progress>>, ProgressLine) {
        let stop = Arc::new(AtomicBool::new(false));
        if !stderr_is_tty() {
            return (None, ProgressLine { stop, thread: None });
        }
        let progress = Arc::new(Progress::default());
        let (p, s) = (progress.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut drawn = false;
            while !s.load(Ordering::Relaxed) {
                std::thread::park_timeout(Duration::from_millis(200));
                let now = p.snapshot();
                if now.total_blobs == 0 {
                    continue;
                }
                let secs = started.elapsed().as_secs_f64().max(0.001);
                let line = format!(
                    "{verb} {} of {} ({}/{} blobs, {}/s)",
                    human_bytes(now.moved_bytes),
                    human_bytes(now.total_bytes),
                    now.done_blobs,
                    now.total_blobs,
                    human_bytes((now.moved_bytes as f64 / secs) as u64),
                );
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{line}");
                let _ = err.flush();
                drawn = true;
            }
            if drawn {
                let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
            }
        });
        (
            Some(progress),
            ProgressLine {
                stop,
                thread: Some(thread),
            },
        )
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_line_says_what_moved_beside_the_image_size() {
        let t = Transfer {
            blobs: 180,
            bytes: 8 << 30,
            moved_blobs: 41,
            moved_bytes: 612 << 20,
            present_blobs: 139,
            mounted_blobs: 0,
        };
        assert_eq!(
            transfer_line("uploaded", &t),
            "uploaded 612.0 MiB of 8.0 GiB (41 of 180 blobs; 139 already present)"
        );
    }
}
