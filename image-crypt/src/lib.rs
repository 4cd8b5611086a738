//! Encrypted image layers in the format of containers/ocicrypt (what skopeo, buildah, Podman
//! and containerd's imgcrypt read and write), with JWE key wrapping.
//!
//! - [`EncryptingReader`]: plain layer in, ciphertext out, one fresh key per layer;
//!   [`EncryptingReader::finish`] wraps that key for every [`Recipient`] and returns the
//!   descriptor annotations.
//! - [`LayerKey::unwrap`]: opens a layer's wrapped key with the node's [`PrivateKey`]s;
//!   [`LayerKey::reader`] gives a [`DecryptingReader`] over the ciphertext, which verifies the
//!   HMAC and the plain digest before it reports end of stream.
//!
//! The format itself is described in [`format`]. Memory use is constant: the caller's read
//! buffer and a few hashing contexts, whatever the layer's size.

mod error;
pub mod format;
pub mod jwe;
mod keys;
mod stream;

pub use error::CryptError;
pub use format::{encrypted_media_type, plain_media_type};
pub use keys::{PemKeyError, PrivateKey, Recipient};
pub use stream::{DecryptingReader, EncryptedLayer, EncryptingReader, LayerKey};

use std::path::PathBuf;

/// Parses `--encrypt-recipient` values.
pub fn recipients_from_specs<S: AsRef<str>>(specs: &[S]) -> Result<Vec<Recipient>, CryptError> {
    specs
        .iter()
        .map(|s| Recipient::from_spec(s.as_ref()))
        .collect()
}

/// Loads the node's decryption keys (each file root-owned, not group/other accessible).
pub fn load_private_keys(paths: &[PathBuf]) -> Result<Vec<PrivateKey>, CryptError> {
    paths.iter().map(|p| PrivateKey::load(p)).collect()
}

/// The recipients a layer's wrapped keys name (algorithm and `kid` where the encrypter
/// recorded one), read without any private key: what `gpusnap inspect` shows of an encrypted
/// layer, and what a refusal names.
pub fn layer_recipients(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<jwe::RecipientInfo>, CryptError> {
    use base64::Engine as _;
    let Some(wrapped) = annotations.get(format::ANNOTATION_KEYS_JWE) else {
        return Ok(Vec::new());
    };
    let mut named = Vec::new();
    for part in wrapped.split(',') {
        let jwe_json = base64::engine::general_purpose::STANDARD
            .decode(part.trim())
            .map_err(|e| {
                CryptError::Format(format!(
                    "{} entry is not base64: {e}",
                    format::ANNOTATION_KEYS_JWE
                ))
            })?;
        named.extend(jwe::recipients(&jwe_json)?);
    }
    Ok(named)
}

#[cfg(test)]
mod tests;
