//! Errors of the checkpoint-image module.
//!
//! Every variant names the file, blob or URL involved and, where there is one, what the operator
//! can do about it: these messages reach `gpusnap image ...` users unchanged.

use std::io;
use std::path::{Path, PathBuf};

use super::digest::Digest;

/// Why building, inspecting, extracting, pushing or pulling a checkpoint image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is neither a CRI checkpoint archive (tar with checkpoint/, spec.dump, ...) nor a \
         checkpoint directory with gpusnap-manifest.json",
        path.display()
    )]
    UnknownSource { path: PathBuf },
    #[error(
        "{} is not an OCI image layout (no oci-layout file) nor an oci-archive tar",
        path.display()
    )]
    NotAnImage { path: PathBuf },
    #[error(
        "{} holds no gpusnap manifest (checkpoint/gpusnap-manifest.json): the checkpoint was not \
         made by gpusnap or is incomplete; take a new checkpoint with gpusnap",
        source_path.display()
    )]
    ManifestMissing { source_path: PathBuf },
    #[error("gpusnap manifest in {}: {reason}", source_path.display())]
    ManifestInvalid {
        source_path: PathBuf,
        reason: String,
    },
    #[error(
        "checkpoint file {file} does not match the sealed gpusnap manifest ({reason}): the \
         checkpoint was damaged or altered after it was taken; do not publish it"
    )]
    CheckpointMismatch { file: String, reason: String },
    #[error("entry {entry:?} in {}: {reason}", source_path.display())]
    UnsupportedEntry {
        source_path: PathBuf,
        entry: String,
        reason: String,
    },
    #[error("no output requested: set BuildOptions::layout_dir and/or BuildOptions::archive_path")]
    NoOutput,
    #[error("{} already exists and is not an empty directory; choose a new path", path.display())]
    DestinationExists { path: PathBuf },
    #[error("{what} {value:?} is invalid: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: String,
    },
    #[error("unsupported digest {value:?}: only sha256 digests are supported")]
    UnsupportedDigest { value: String },
    #[error(
        "{what} {expected} is corrupt: its content hashes to {actual} ({location}); the copy was \
         damaged or tampered with — fetch it again from a trusted source"
    )]
    DigestMismatch {
        what: String,
        expected: Digest,
        actual: Digest,
        location: String,
    },
    #[error(
        "{what} {digest} is {actual} bytes but its descriptor says {expected} ({location}); the \
         copy is truncated or was tampered with"
    )]
    SizeMismatch {
        what: String,
        digest: Digest,
        expected: u64,
        actual: u64,
        location: String,
    },
    #[error(
        "{what} needs {needed} bytes, but the file system of {} has {free} bytes free; refused, \
         and everything written was removed — free space there or choose another destination",
        dest.display()
    )]
    NoSpace {
        what: String,
        needed: u64,
        free: u64,
        dest: PathBuf,
    },
    #[error("blob {digest} referenced by the image is missing from {location}")]
    BlobMissing { digest: Digest, location: String },
    /// A chunked image's files could not be assembled (the message says why and what to do).
    #[error(transparent)]
    Chunks(#[from] gpusnap_checkpoint::chunks::ChunkError),
    #[error("malformed {what} in {location}: {reason}")]
    Malformed {
        what: &'static str,
        location: String,
        reason: String,
    },
    #[error("unsupported media type {media_type:?} for {what} in {location}")]
    UnsupportedMediaType {
        what: &'static str,
        media_type: String,
        location: String,
    },
    #[error("{location} holds {count} images ({names}); name the one to use")]
    AmbiguousImage {
        location: String,
        count: usize,
        names: String,
    },
    #[error("{location} has no image named {name:?} (it has: {names})")]
    ImageNotFound {
        location: String,
        name: String,
        names: String,
    },
    #[error(
        "{method} {url} returned HTTP {status}{}{}",
        code.as_ref().map(|c| format!(" {c}")).unwrap_or_default(),
        if message.is_empty() { String::new() } else { format!(": {message}") }
    )]
    Registry {
        method: &'static str,
        url: String,
        status: u16,
        code: Option<String>,
        message: String,
    },
    #[error("{method} {url} needs credentials the registry accepts (HTTP 401): {hint}")]
    AuthRequired {
        method: &'static str,
        url: String,
        /// Where credentials were looked for, and what was found.
        hint: String,
    },
    #[error("authenticating to {registry} failed: {reason} (credentials: {hint})")]
    AuthFailed {
        registry: String,
        reason: String,
        hint: String,
    },
    #[error(
        "{what} {name} is {size} bytes, over the limit of {limit} bytes ({location}); refused{}",
        if setting.is_empty() { String::new() } else { format!(" — raise {setting} if it is genuine") }
    )]
    TooLarge {
        what: String,
        name: String,
        size: u64,
        limit: u64,
        location: String,
        /// The option that sets the limit, when there is one.
        setting: &'static str,
    },
    #[error(
        "{reference} ({digest}): no valid signature by a trusted key ({reason}); refused by \
         restore.signature_policy = require, nothing was written"
    )]
    SignatureRequired {
        reference: String,
        digest: Digest,
        reason: String,
    },
    #[error("key {}: {reason}", path.display())]
    Key { path: PathBuf, reason: String },
    #[error("signing {reference}: {reason}")]
    Signing { reference: String, reason: String },
    #[error("interrupted (signal); everything written so far was removed")]
    Interrupted,
    #[error("{method} {url}: {reason}")]
    Transport {
        method: &'static str,
        url: String,
        reason: String,
    },
    /// The node's blob store (`store.root`).
    #[error("node store: {0}")]
    Store(#[from] gpusnap_node_store::StoreError),
}

impl ImageError {
    pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
        let path = path.to_path_buf();
        move |source| ImageError::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn invalid(
        what: &'static str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ImageError::Invalid {
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn malformed(
        what: &'static str,
        location: impl Into<String>,
        reason: impl std::fmt::Display,
    ) -> Self {
        ImageError::Malformed {
            what,
            location: location.into(),
            reason: reason.to_string(),
        }
    }

    /// True for the integrity failures (digest or size) a tampered or damaged copy produces.
    pub fn is_integrity_failure(&self) -> bool {
        matches!(
            self,
            ImageError::DigestMismatch { .. } | ImageError::SizeMismatch { .. }
        )
    }
}
