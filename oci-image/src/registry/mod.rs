//! Pushing checkpoint images to, pulling them from, and signing them in an OCI distribution
//! registry.
//!
//! The protocol is `oci-client`'s (`client.rs` says what is added on top). HTTPS by default,
//! with the system roots plus any CA files given ([`RegistryOptions::ca_files`], PEM bundles
//! split into certificates); plain HTTP only when asked for (`http://` in the reference or
//! [`RegistryOptions::plain_http`]), meant for a loopback or node-local registry. Credentials
//! come from a docker `config.json` ([`Credentials`]); Basic and Bearer-token registries both
//! work.
//!
//! - [`push()`] and [`push_checkpoint`] (`push.rs`): an image or a checkpoint to the registry.
//! - [`pull()`] (`pull.rs`): an image into a new OCI layout, every document and blob checked.
//! - [`cosign`]: signing an image and checking its signatures.
//!
//! Pulling and extracting in one pass is [`crate::pull_extract()`], in a module above this one
//! and [`crate::extract`]: it uses both, and neither uses it.
//!
//! **The node store.** With [`RegistryOptions::store`], a pull takes every config and layer the
//! node already holds from the store and downloads only the others, into the store (see
//! `transfer.rs`); [`PullReport::transfer`] and [`PushReport::transfer`] say what moved.
//!
//! **In parallel.** Up to [`RegistryOptions::parallel_blobs`] blobs move at once. The network
//! side of all of them runs on one thread; each blob's bytes are read or consumed (hashed,
//! written, unpacked) on a blocking thread of its own (`channel.rs`), so hashing never holds
//! up the connections and several layers are written at once.

mod auth;
pub(crate) mod channel;
pub(crate) mod client;
pub mod cosign;
mod pull;
mod push;
pub mod reference;
pub(crate) mod transfer;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::ImageError;
use super::interrupt;
pub use auth::{default_docker_config, Credentials};
pub use cosign::{sign, SignReport, SignatureOptions};
pub(crate) use pull::{check_cap, fetch_documents};
pub use pull::{pull, PullReport};
pub use push::{push, push_checkpoint, PushReport};
pub use reference::Reference;
pub use transfer::{NodeStore, Progress, ProgressSnapshot, Transfer};

/// Fewest blobs moved at once by default: enough to keep a loopback or LAN link and a local
/// disk busy while one blob's consumer waits on the other, few enough not to thrash one disk.
pub const DEFAULT_PARALLEL_BLOBS: usize = 4;

/// Default number of blobs moved at once on this machine: one per two cores, from
/// [`DEFAULT_PARALLEL_BLOBS`] up to 8. Each moving blob is hashed (and for an encrypted layer
/// decrypted and authenticated, three passes over its bytes) on a thread of its own, so a
/// many-core node keeps its link busy while it checks what arrives.
pub fn default_parallel_blobs() -> usize {
    std::thread::available_parallelism()
        .map_or(DEFAULT_PARALLEL_BLOBS, |n| n.get() / 2)
        .clamp(DEFAULT_PARALLEL_BLOBS, 8)
}
/// Default cap on a manifest, index, image config or signature manifest read from a registry.
pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Default cap on one blob: none of its own. A checkpoint of a node with 8 GPUs of 141 GB
/// carries 8 extents of about 141 GB and CRIU pages of host memory that can pass 1 TiB, so any
/// fixed number is either too small for such a node or no bound at all. What bounds a pull is
/// the destination: the blobs' declared sizes must fit in its free space before the first one
/// is fetched, and every byte written (a gzip layer's inflation included) is charged against
/// that free space. `--max-blob-bytes` sets a fixed cap in addition.
pub const DEFAULT_MAX_BLOB_BYTES: u64 = u64::MAX;

/// How to talk to the registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Use plain HTTP for references without a scheme.
    pub plain_http: bool,
    /// Which image of a multi-image layout to push (its `ref.name` / `io.containerd.image.name`).
    pub image_name: Option<String>,
    /// Idle timeout for each socket read.
    pub io_timeout: Duration,
    /// PEM files (bundles allowed) of CAs trusted in addition to the system roots.
    pub ca_files: Vec<PathBuf>,
    pub credentials: Credentials,
    /// Cap on every manifest, index and image config read.
    pub max_manifest_bytes: u64,
    /// Cap on every blob, whatever its descriptor says.
    pub max_blob_bytes: u64,
    /// Signature policy and trusted keys for [`pull`].
    pub signatures: SignatureOptions,
    /// [`push`]: sign the pushed image with this private key ([`cosign::sign`]).
    pub sign_key: Option<PathBuf>,
    /// Blobs uploaded or downloaded (and consumed: hashed, written, unpacked) at once.
    pub parallel_blobs: usize,
    /// The node's blob store: a pull takes the blobs it holds from it and keeps the ones it
    /// fetches in it; a push learns from it where a blob can be mounted from (`transfer.rs`).
    pub store: Option<NodeStore>,
    /// Counters updated as bytes move, for a progress line.
    pub progress: Option<std::sync::Arc<Progress>>,
    /// [`crate::pull_extract()`]: keys for encrypted layers.
    pub decryption: crate::crypt::Decryption,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            plain_http: false,
            image_name: None,
            io_timeout: Duration::from_secs(120),
            ca_files: Vec::new(),
            credentials: Credentials::Auto,
            max_manifest_bytes: DEFAULT_MAX_MANIFEST_BYTES,
            max_blob_bytes: DEFAULT_MAX_BLOB_BYTES,
            signatures: SignatureOptions::default(),
            sign_key: None,
            parallel_blobs: default_parallel_blobs(),
            store: None,
            progress: None,
            decryption: Default::default(),
        }
    }
}

/// Runs `f` to completion on a private current-thread runtime (the registry code is async,
/// `oci-client`; the callers are not). An interruption ([`crate::interrupt::request`]) drops
/// `f` within a tenth of a second even while it waits on the network, and returns
/// [`ImageError::Interrupted`]; the caller's guards then remove what was written.
pub(crate) fn block_on<T>(f: impl Future<Output = Result<T, ImageError>>) -> Result<T, ImageError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(ImageError::invalid(
            "caller",
            "async context",
            "registry operations block; call them from a blocking thread (spawn_blocking)",
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ImageError::io(
            "starting",
            Path::new("the registry client runtime"),
        ))?;
    rt.block_on(async {
        let watch = async {
            while !interrupt::requested() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            r = f => r,
            () = watch => Err(ImageError::Interrupted),
        }
    })
}

/// `f` on a blocking thread (store locks, file reads), its panic passed on.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Refuses a destination that exists and is not an empty directory.
pub(crate) fn check_destination(dest: &Path) -> Result<(), ImageError> {
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io("reading", dest)(e)),
        Ok(m) if m.is_dir() => {
            let mut entries = std::fs::read_dir(dest).map_err(ImageError::io("reading", dest))?;
            if entries.next().is_some() {
                Err(ImageError::DestinationExists {
                    path: dest.to_path_buf(),
                })
            } else {
                Ok(())
            }
        }
        Ok(_) => Err(ImageError::DestinationExists {
            path: dest.to_path_buf(),
        }),
    }
}
