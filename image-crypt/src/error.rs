//! What can go wrong encrypting or decrypting a layer.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    #[error("key {path}: {reason}")]
    Key { path: PathBuf, reason: String },

    #[error("encryption recipient {spec:?}: {reason} (expected jwe:PATH to a PEM public key, RSA or EC P-256/P-384/P-521)")]
    Recipient { spec: String, reason: String },

    #[error("layer is not in ocicrypt's format: {0}")]
    Format(String),

    /// No configured private key unwraps the layer's key.
    #[error("{0}")]
    NoKey(String),

    /// The ciphertext, its HMAC or the decrypted digest do not agree: tampered or damaged.
    #[error("encrypted layer refused: {0}")]
    Integrity(String),

    #[error("cryptographic operation failed: {0}")]
    Crypto(&'static str),

    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<aws_lc_rs::error::Unspecified> for CryptError {
    fn from(_: aws_lc_rs::error::Unspecified) -> Self {
        CryptError::Crypto("aws-lc reported an error")
    }
}
