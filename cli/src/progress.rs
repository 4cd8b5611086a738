//! A progress bar for pushes and pulls, drawn on stderr while bytes move, only when stderr is a
//! terminal (scripts and logs get the summary alone).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

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

/// A progress bar (indicatif) on stderr, fed from the registry's counters every 100 ms until
/// dropped; nothing is drawn, and no counters are handed out, unless stderr is a terminal.
/// The counters count bytes where they cross the connection (a push: when the connection takes
/// them; a pull: as they arrive), so the bar is full only when the data has gone.
pub struct ProgressLine {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// `uploaded [=====>    ] 612.00 MiB/8.00 GiB (41/180 blobs, 55.20 MiB/s)`.
const TEMPLATE: &str = "{prefix} [{bar:30}] {bytes}/{total_bytes} ({msg}, {bytes_per_sec})";

impl ProgressLine {
    /// The counters to hand to the registry options, and the bar drawing them.
    pub fn start(verb: &'static str) -> (Option<Arc<Progress>>, ProgressLine) {
        Self::start_on(verb, ProgressDrawTarget::stderr())
    }

    fn start_on(
        verb: &'static str,
        target: ProgressDrawTarget,
    ) -> (Option<Arc<Progress>>, ProgressLine) {
        let stop = Arc::new(AtomicBool::new(false));
        if target.is_hidden() {
            return (None, ProgressLine { stop, thread: None });
        }
        let progress = Arc::new(Progress::default());
        let (p, s) = (progress.clone(), stop.clone());
        let bar = ProgressBar::with_draw_target(None, target)
            .with_prefix(verb)
            .with_message("0/0 blobs")
            .with_style(
                ProgressStyle::with_template(TEMPLATE)
                    .expect("the template is valid")
                    .progress_chars("=> "),
            );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::park_timeout(Duration::from_millis(100));
                let now = p.snapshot();
                if now.total_blobs == 0 {
                    continue;
                }
                bar.set_length(now.total_bytes);
                bar.set_position(now.moved_bytes);
                bar.set_message(format!("{}/{} blobs", now.done_blobs, now.total_blobs));
            }
            // The summary the command prints replaces the bar.
            bar.finish_and_clear();
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

/// Bytes this process has written through write(2) and kin so far (`wchar` of
/// /proc/self/io): what a build writes into its layout and archive, counted by the kernel.
fn written_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A build's progress on stderr: the bytes written so far (the kernel's count for this
/// process, so compression and chunk dedup show as they are) and the rate; it stays on screen
/// when the build ends. Nothing off a terminal.
pub struct BuildProgress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BuildProgress {
    pub fn start() -> BuildProgress {
        Self::start_on(ProgressDrawTarget::stderr())
    }

    fn start_on(target: ProgressDrawTarget) -> BuildProgress {
        let stop = Arc::new(AtomicBool::new(false));
        let base = written_bytes();
        let (Some(base), false) = (base, target.is_hidden()) else {
            return BuildProgress { stop, thread: None };
        };
        let bar = ProgressBar::with_draw_target(None, target)
            .with_prefix("building")
            .with_style(
                ProgressStyle::with_template(
                    "{prefix} {spinner} {bytes} written ({bytes_per_sec}, {elapsed})",
                )
                .expect("the template is valid"),
            );
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let update = || {
                if let Some(now) = written_bytes() {
                    bar.set_position(now.saturating_sub(base));
                }
            };
            while !s.load(Ordering::Relaxed) {
                update();
                bar.tick();
                std::thread::park_timeout(Duration::from_millis(100));
            }
            update();
            bar.set_prefix("built");
            bar.finish();
        });
        BuildProgress {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for BuildProgress {
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
    fn the_kernel_counts_what_this_process_writes() {
        let before = written_bytes().unwrap();
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), vec![7u8; 1 << 20]).unwrap();
        assert!(written_bytes().unwrap() - before >= 1 << 20);
        assert!(BuildProgress::start_on(ProgressDrawTarget::hidden())
            .thread
            .is_none());
    }

    #[test]
    fn nothing_is_counted_or_drawn_off_a_terminal() {
        let (counters, line) = ProgressLine::start_on("uploaded", ProgressDrawTarget::hidden());
        assert!(counters.is_none());
        assert!(line.thread.is_none());
    }

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
