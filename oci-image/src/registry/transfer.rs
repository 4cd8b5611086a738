//! What a push or pull moved, the node store's part in it, and progress a terminal can show.
//!
//! With a [`NodeStore`], a pull asks the store for each blob before it opens a download: a blob
//! the node already holds (from any earlier pull) is read from the store, one it lacks is
//! downloaded into the store while it is written or unpacked (verified there,
//! [`gpusnap_node_store::BlobWriter`]; or, when it is unpacked as it downloads, by the
//! verifying reader that tees it into the store, whose digest the store then takes:
//! [`gpusnap_node_store::PrehashedWriter`]). The pull holds a [`gpusnap_node_store::Lease`] throughout, records a
//! reference naming its result as the blobs' holder, and then collects the store down to its
//! cap (skipped while another pull runs; that pull collects when it ends).

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpusnap_node_store::{BlobId, BlobWriter, Holder, Lease, RefRecord, Store, StoreError};
use serde::Serialize;

use crate::digest::Digest;
use crate::error::ImageError;
use crate::interrupt;

/// The node's blob store and the size collection brings it down to after each pull.
#[derive(Debug, Clone)]
pub struct NodeStore {
    pub store: Arc<Store>,
    /// `store.max_bytes`.
    pub max_bytes: u64,
}

/// Live counters of a push or pull, for a progress line; updated as bytes move.
#[derive(Debug, Default)]
pub struct Progress {
    total_bytes: AtomicU64,
    moved_bytes: AtomicU64,
    total_blobs: AtomicU64,
    done_blobs: AtomicU64,
}

/// One reading of [`Progress`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// Bytes of the blobs that have to move (those the other side lacks).
    pub total_bytes: u64,
    pub moved_bytes: u64,
    pub total_blobs: u64,
    pub done_blobs: u64,
}

impl Progress {
    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            total_bytes: self.total_bytes.load(Ordering::Relaxed),
            moved_bytes: self.moved_bytes.load(Ordering::Relaxed),
            total_blobs: self.total_blobs.load(Ordering::Relaxed),
            done_blobs: self.done_blobs.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn expect(&self, blobs: u64, bytes: u64) {
        self.total_blobs.fetch_add(blobs, Ordering::Relaxed);
        self.total_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn moved(&self, bytes: u64) {
        self.moved_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A pull that starts again counts from nothing.
    pub(crate) fn restart(&self) {
        for c in [
            &self.total_bytes,
            &self.moved_bytes,
            &self.total_blobs,
            &self.done_blobs,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn blob_done(&self) {
        self.done_blobs.fetch_add(1, Ordering::Relaxed);
    }
}

/// What moved: every blob of the image, and of them those that went over the network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Transfer {
    /// Blobs (configs and layers) of the image, and their size.
    pub blobs: usize,
    pub bytes: u64,
    /// Blobs downloaded or uploaded, and their size.
    pub moved_blobs: usize,
    pub moved_bytes: u64,
    /// Blobs the other side already had (the node store on a pull, the registry on a push).
    pub present_blobs: usize,
    /// Push: blobs the registry mounted from another repository instead of an upload.
    pub mounted_blobs: usize,
}

impl Transfer {
    pub(crate) fn count(&mut self, size: u64, moved: bool) {
        self.blobs += 1;
        self.bytes += size;
        if moved {
            self.moved_blobs += 1;
            self.moved_bytes += size;
        } else {
            self.present_blobs += 1;
        }
    }
}

/// A store error on a blob that came from `location`: integrity failures keep their
/// [`ImageError`] kinds (and name the blob's source), the rest stay store errors.
pub(crate) fn store_error(e: StoreError, what: &str, location: &str) -> ImageError {
    match e {
        StoreError::SizeMismatch {
            digest,
            expected,
            actual,
        } => match Digest::parse(&digest) {
            Ok(digest) => ImageError::SizeMismatch {
                what: what.to_owned(),
                digest,
                expected,
                actual,
                location: location.to_owned(),
            },
            Err(e) => e,
        },
        StoreError::DigestMismatch { expected, actual } => {
            match (Digest::parse(&expected), Digest::parse(&actual)) {
                (Ok(expected), Ok(actual)) => ImageError::DigestMismatch {
                    what: what.to_owned(),
                    expected,
                    actual,
                    location: location.to_owned(),
                },
                (Err(e), _) | (_, Err(e)) => e,
            }
        }
        other => ImageError::Store(other),
    }
}

pub(crate) fn blob_id(d: &Digest) -> Result<BlobId, ImageError> {
    Ok(BlobId::parse(d.as_str())?)
}

/// Copies `reader` into the store writer, 1 MiB at a time, stopping on an interruption.
pub(crate) fn fill(
    mut reader: impl Read,
    writer: &mut BlobWriter,
    location: &str,
) -> Result<(), ImageError> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        interrupt::check()?;
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(crate::digest::io_to_image(e, location)),
        };
        writer
            .write_all(&buf[..n])
            .map_err(|e| ImageError::Store(writer.write_error(e)))?;
    }
}

/// A reader that also writes everything it reads into a store writer (when there is one), so a
/// layer unpacked while it downloads lands in the store in the same pass.
pub(crate) struct Tee<R, W> {
    pub inner: R,
    pub writer: Arc<Mutex<Option<W>>>,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = w.as_mut() {
                w.write_all(&buf[..n])?;
            }
        }
        Ok(n)
    }
}

/// After a pull: the reference (what holds the blobs, and where they came from), then
/// collection down to the cap unless another pull is running.
pub(crate) fn record_and_collect(
    ns: &NodeStore,
    lease: Arc<Lease>,
    name: String,
    source: String,
    holder: &std::path::Path,
    blobs: Vec<BlobId>,
) -> Result<(), ImageError> {
    let holder = Holder::of(holder).map_err(ImageError::io("stat", holder))?;
    ns.store.record(
        &lease,
        &RefRecord {
            name,
            source: Some(source),
            holder: Some(holder),
            blobs,
        },
    )?;
    drop(lease);
    match ns.store.gc(ns.max_bytes, false) {
        Ok(_) | Err(StoreError::Busy { .. }) => Ok(()),
        Err(e) => {
            // The pull itself succeeded; an operator runs `gpusnap store gc` to see why.
            tracing::warn!(store = %ns.store.root().display(), error = %e, "store: collection after pull failed");
            Ok(())
        }
    }
}

/// Before the first blob of a pull: the blobs the store lacks fit in it (`missing` bytes).
pub(crate) fn check_store_space(
    ns: &NodeStore,
    blobs: usize,
    missing: u64,
) -> Result<(), ImageError> {
    let free = ns.store.available_bytes()?;
    if missing > free {
        return Err(ImageError::NoSpace {
            what: format!("{blobs} blobs for the node store"),
            needed: missing,
            free,
            dest: ns.store.root().to_path_buf(),
        });
    }
    Ok(())
}

/// The blobs of `wanted` (digest, size) the store lacks: how many, and their size.
pub(crate) fn missing<'a>(
    ns: Option<&NodeStore>,
    wanted: impl Iterator<Item = (&'a Digest, u64)>,
) -> (usize, u64) {
    wanted
        .filter(|(d, _)| match ns {
            Some(ns) => blob_id(d).map_or(true, |id| !ns.store.has(&id).unwrap_or(false)),
            None => true,
        })
        .fold((0, 0), |(n, b), (_, size)| (n + 1, b + size))
}
