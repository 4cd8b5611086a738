use std::io;
use std::path::PathBuf;

/// What went wrong in the store; each names the blob or file and, where there is one, what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{digest:?} is not a blob digest the store accepts: {reason}")]
    InvalidDigest {
        digest: String,
        reason: &'static str,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "blob {digest}: {actual} bytes written, its descriptor says {expected}; nothing was kept"
    )]
    SizeMismatch {
        digest: String,
        expected: u64,
        actual: u64,
    },
    #[error("blob {expected}: the bytes written hash to {actual}; nothing was kept")]
    DigestMismatch { expected: String, actual: String },
    #[error(
        "store {path} is not private to this user: {reason}; make it a directory owned by root \
         with mode 0700, or set store.root to one that is"
    )]
    NotPrivate { path: PathBuf, reason: String },
    #[error("reference {name}: {reason}")]
    BadRef { name: String, reason: String },
    #[error(
        "store {path} is in use by {what}; garbage collection waits for it (try again when the \
         pulls have finished)"
    )]
    Busy { path: PathBuf, what: &'static str },
}

impl StoreError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| StoreError::Io { op, path, source }
    }
}
