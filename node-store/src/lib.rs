//! The node's content-addressed blob store: every blob a pull brings onto the node, kept once,
//! so that the next pull of an image sharing blobs with one already here (another replica's
//! checkpoint, the same model an hour later) fetches only what is missing.
//!
//! **Layout.** One root directory, root-owned and mode 0700 (blobs hold process memory):
//!
//! ```text
//! <root>/blobs/<sha256 hex>   complete, verified blobs (mode 0400)
//! <root>/tmp/<hex>.<pid>.<n>  blobs being written; never visible under blobs/
//! <root>/locks/<hex>          one flock per blob being written
//! <root>/refs/<hex>.json      references: which image or checkpoint holds which blobs
//! <root>/gc.lock              shared by every pull ([`Lease`]), exclusive for collection
//! ```
//!
//! **Writes.** [`Store::begin`] takes the blob's own lock: a second writer of the same blob
//! waits, then finds it present (the blob is written once). The bytes go to a temporary file,
//! are counted and hashed as they are written, and only a blob of exactly the declared size and
//! digest is synced and renamed under `blobs/` ([`BlobWriter::commit`]); anything else (an
//! error, a crash, an interruption) leaves a temporary file that the next collection removes.
//! A caller that hashes the bytes itself as they pass (a pull's verifying reader) writes
//! through a [`PrehashedWriter`] instead, which commits with that caller's digest: one SHA-256
//! per byte, the same checks and the same crash safety.
//!
//! **Names.** A digest becomes a file name only after [`BlobId::parse`] accepted it
//! (`sha256:` and 64 lowercase hex digits, nothing else); every file is opened through the
//! store's directory descriptors beneath their directory, never by a path string.
//!
//! **References and collection.** A pull records a reference ([`RefRecord`]) naming the blobs of
//! what it pulled and the file or directory that holds the result; a reference whose holder is
//! gone (removed, or replaced by another inode) no longer counts. [`Store::gc`] removes
//! leftovers, stale references, and then unreferenced blobs, least recently used first, until
//! the store fits its cap. It takes `gc.lock` exclusively, so it never runs while a pull holds a
//! [`Lease`], and never removes a blob a running pull is reading, writing or about to reference.

mod error;
mod id;
mod lock;
mod refs;
mod store;

pub use error::StoreError;
pub use id::BlobId;
pub use refs::{Holder, RefRecord};
pub use store::{
    BlobInfo, BlobWriter, CopyOut, Dropped, GcReport, Health, Lease, PrehashedWriter, Slot, Store,
    Usage, VerifyReport,
};

/// Where the store lives unless the config says otherwise (`store.root`).
pub const DEFAULT_ROOT: &str = "/var/lib/gpusnap/store";
