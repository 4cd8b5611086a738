//! Cooperative cancellation of long image operations (pull, extract) on SIGINT/SIGTERM.
//!
//! A front end that catches the signals (`gpusnap image pull` does) calls [`request`]; pulls
//! check between chunks and extraction between entries and chunks, and fail with
//! [`ImageError::Interrupted`]. They then unwind like any other failure: staging directories
//! and scratch files are removed by their guards, so an interrupted pull leaves nothing behind.

use std::sync::atomic::{AtomicBool, Ordering};

use super::error::ImageError;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks every running pull and extraction of this process to stop.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether [`request`] was called.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// `Err(Interrupted)` once a stop was requested.
pub(crate) fn check() -> Result<(), ImageError> {
    if requested() {
        Err(ImageError::Interrupted)
    } else {
        Ok(())
    }
}
