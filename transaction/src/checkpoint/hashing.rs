//! Digesting the images while CRIU writes them: page images as they grow, the rest on a thread
//! of its own once CRIU has returned, so that the seal waits only for the tail.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpusnap_checkpoint as dir;

/// The digest of a dumped checkpoint: the inventory, how long hashing took once the dump had
/// ended (the part that can hold up the seal), and how many bytes were hashed during the dump.
type Hashed = std::result::Result<(dir::ImageInventory, Duration, u64), dir::InventoryError>;

/// Hashing a checkpoint: page images while CRIU writes them ([`dir::ImageFollower`]), the rest
/// on a thread of its own once CRIU has returned.
pub(super) struct Hashing {
    follower: Option<dir::ImageFollower>,
    tail: Option<std::thread::JoinHandle<Hashed>>,
}

impl Hashing {
    pub(super) fn follow(dir: &Path) -> Hashing {
        Hashing {
            follower: Some(dir::ImageFollower::start(dir)),
            tail: None,
        }
    }

    /// CRIU has returned: hash what the follower has not.
    pub(super) fn dump_done(&mut self) {
        let Some(follower) = self.follower.take() else {
            return;
        };
        self.tail = Some(std::thread::spawn(move || {
            let t = Instant::now();
            let done = follower.finish()?;
            let tail = t.elapsed();
            tracing::debug!(
                hashed_while_written = done.hashed_while_written,
                total_bytes = done.inventory.total_bytes,
                tail_ms = tail.as_millis() as u64,
                "checkpoint digest"
            );
            Ok((done.inventory, tail, done.hashed_while_written))
        }));
    }

    /// See [`Hashed`].
    pub(super) fn finish(
        mut self,
    ) -> std::result::Result<(dir::ImageInventory, Duration, u64), dir::ManifestError> {
        self.dump_done();
        let panicked = || {
            Err(dir::InventoryError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other("the hashing thread panicked"),
            })
        };
        let hashed = match self.tail.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| panicked()),
            None => panicked(),
        }?;
        Ok(hashed)
    }
}

/// Stops a hashing that was started (dropping the follower stops it).
pub(super) fn stop(hashing: Option<Hashing>) {
    if let Some(mut h) = hashing {
        drop(h.follower.take());
        if let Some(thread) = h.tail.take() {
            let _ = thread.join();
        }
    }
}
