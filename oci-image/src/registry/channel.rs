//! A blob streamed from the registry into a consumer on a blocking thread, while it downloads.
//!
//! The network side ([`Session::send_blob`]) runs on the registry runtime's one thread and
//! only moves chunks; the consumer (hashing, writing a file, unpacking a tar beneath the
//! extraction root) runs on a thread of its own, so several blobs download and are consumed at
//! once, and no byte is hashed on the thread that keeps every connection moving. The consumer
//! reads through a [`ChannelReader`], which fails (rather than ends) when the download stops
//! early: a truncated body can never look like a complete one.

use std::io::{self, Read};

use tokio::sync::mpsc;

use super::client::{Piece, Session};
use crate::digest::Digest;
use crate::error::ImageError;

/// Pieces (1 MiB each) buffered between a download and its consumer: enough to ride out a
/// slow write, and a bound on what one blob holds in memory.
const PIECES_IN_FLIGHT: usize = 8;

/// The consumer's end: a blocking [`Read`] over the pieces the download sends.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Piece>,
    current: bytes::Bytes,
    ended: bool,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if !self.current.is_empty() {
                let n = buf.len().min(self.current.len());
                buf[..n].copy_from_slice(&self.current.split_to(n));
                return Ok(n);
            }
            if self.ended || buf.is_empty() {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Piece::Data(b)) => self.current = b,
                Some(Piece::End) => self.ended = true,
                // The download failed or was stopped; its own error is what gets reported.
                None => {
                    return Err(io::Error::other(ImageError::Transport {
                        method: "GET",
                        url: String::new(),
                        reason: "the download stopped before the blob was complete".into(),
                    }))
                }
            }
        }
    }
}

/// Downloads blob `digest` and hands it, as it arrives, to `consume` on a blocking thread.
/// The download's error wins over the consumer's (which then only saw the stream stop); the
/// consumer is responsible for checking the digest (the size is checked on both sides).
pub(crate) async fn fetch_with<T, F>(
    session: &Session,
    digest: &Digest,
    size: u64,
    what: &str,
    consume: F,
) -> Result<T, ImageError>
where
    T: Send + 'static,
    F: FnOnce(ChannelReader) -> Result<T, ImageError> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(PIECES_IN_FLIGHT);
    let worker = tokio::task::spawn_blocking(move || {
        consume(ChannelReader {
            rx,
            current: bytes::Bytes::new(),
            ended: false,
        })
    });
    let sent = session.send_blob(digest, size, what, tx).await;
    let consumed = worker
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    sent?;
    consumed
}
