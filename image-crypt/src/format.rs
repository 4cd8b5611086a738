//! ocicrypt's on-registry format: media types, annotations and the two option documents.
//!
//! An encrypted layer is the plain layer blob run through AES-256-CTR (a fresh random 32-byte
//! key and 16-byte initial counter block per layer), MACed with HMAC-SHA256 under the same key
//! over the *ciphertext* (encrypt-then-MAC). Its descriptor gets `+encrypted` appended to the
//! media type and two annotations:
//!
//! - `org.opencontainers.image.enc.pubopts`: base64 of the public options JSON
//!   `{"cipher":"AES_256_CTR_HMAC_SHA256","hmac":<b64>,"cipheroptions":{}}` — the HMAC is
//!   public; it is useless without the symmetric key.
//! - `org.opencontainers.image.enc.keys.jwe`: comma-joined base64 of JWE JSON serializations,
//!   each encrypting the private options JSON
//!   `{"symkey":<b64>,"digest":"sha256:…","cipheroptions":{"nonce":<b64>}}` (the digest is the
//!   *plain* blob's) for one or more recipients.
//!
//! Byte strings inside both JSON documents are standard base64 with padding (how Go encodes
//! `[]byte`).

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::CryptError;

/// Suffix ocicrypt appends to a layer media type.
pub const ENCRYPTED_SUFFIX: &str = "+encrypted";
/// Annotation carrying the JWE-wrapped private options.
pub const ANNOTATION_KEYS_JWE: &str = "org.opencontainers.image.enc.keys.jwe";
/// Annotation carrying the public options (cipher, HMAC).
pub const ANNOTATION_PUBOPTS: &str = "org.opencontainers.image.enc.pubopts";
/// Prefix shared by every ocicrypt annotation (other key wrappers: pgp, pkcs7, provider.*).
pub const ANNOTATION_PREFIX: &str = "org.opencontainers.image.enc.";
/// The only layer cipher ocicrypt defines.
pub const CIPHER_AES_256_CTR_HMAC_SHA256: &str = "AES_256_CTR_HMAC_SHA256";

/// `media_type` with `+encrypted` appended.
pub fn encrypted_media_type(media_type: &str) -> String {
    format!("{media_type}{ENCRYPTED_SUFFIX}")
}

/// The plain media type of an encrypted layer, or `None` when `media_type` is not encrypted.
pub fn plain_media_type(media_type: &str) -> Option<&str> {
    media_type.strip_suffix(ENCRYPTED_SUFFIX)
}

/// Whether a descriptor with these annotations has wrapped keys in a scheme other than JWE
/// (PGP, PKCS#7, a key provider), for a refusal that says so.
pub fn other_schemes<'a>(annotations: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    annotations
        .into_iter()
        .filter_map(|k| k.strip_prefix(ANNOTATION_PREFIX))
        .filter_map(|k| k.strip_prefix("keys."))
        .filter(|scheme| *scheme != "jwe")
        .map(str::to_owned)
        .collect()
}

mod b64 {
    use super::*;
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        // Go encodes a nil []byte as null.
        let s: Option<String> = Option::deserialize(d)?;
        match s {
            None => Ok(Vec::new()),
            Some(s) => STANDARD.decode(s).map_err(serde::de::Error::custom),
        }
    }
}

mod b64_map {
    use super::*;
    pub fn serialize<S: serde::Serializer>(
        v: &BTreeMap<String, Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let m: BTreeMap<&String, String> = v.iter().map(|(k, v)| (k, STANDARD.encode(v))).collect();
        m.serialize(s)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Vec<u8>>, D::Error> {
        let m: Option<BTreeMap<String, String>> = Option::deserialize(d)?;
        m.unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                STANDARD
                    .decode(v)
                    .map(|v| (k, v))
                    .map_err(serde::de::Error::custom)
            })
            .collect()
    }
}

/// The options every puller can read: cipher and HMAC.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublicOptions {
    pub cipher: String,
    #[serde(with = "b64", default)]
    pub hmac: Vec<u8>,
    #[serde(with = "b64_map", default)]
    pub cipheroptions: BTreeMap<String, Vec<u8>>,
}

/// The options only a recipient can read: the layer key, the nonce and the plain digest.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PrivateOptions {
    #[serde(with = "b64")]
    pub symkey: Vec<u8>,
    pub digest: String,
    #[serde(with = "b64_map", default)]
    pub cipheroptions: BTreeMap<String, Vec<u8>>,
}

impl std::fmt::Debug for PrivateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateOptions")
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

impl Drop for PrivateOptions {
    fn drop(&mut self) {
        self.symkey.iter_mut().for_each(|b| *b = 0);
    }
}

impl PublicOptions {
    pub fn to_annotation(&self) -> String {
        STANDARD.encode(serde_json::to_vec(self).expect("options serialize"))
    }

    pub fn from_annotation(value: &str) -> Result<PublicOptions, CryptError> {
        let raw = STANDARD
            .decode(value.trim())
            .map_err(|e| CryptError::Format(format!("{ANNOTATION_PUBOPTS} is not base64: {e}")))?;
        serde_json::from_slice(&raw)
            .map_err(|e| CryptError::Format(format!("{ANNOTATION_PUBOPTS} is not valid: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_json_shape() {
        let p = PrivateOptions {
            symkey: vec![1; 32],
            digest: "sha256:00".into(),
            cipheroptions: [("nonce".to_string(), vec![2; 16])].into(),
        };
        let v: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert_eq!(v["symkey"], STANDARD.encode([1u8; 32]));
        assert_eq!(v["cipheroptions"]["nonce"], STANDARD.encode([2u8; 16]));
        let back: PrivateOptions = serde_json::from_value(v).unwrap();
        assert!(back == p);
        // Go writes nil maps and slices as null.
        let pubo: PublicOptions = serde_json::from_str(
            r#"{"cipher":"AES_256_CTR_HMAC_SHA256","hmac":"AAE=","cipheroptions":null}"#,
        )
        .unwrap();
        assert_eq!(pubo.hmac, vec![0, 1]);
        assert!(pubo.cipheroptions.is_empty());
    }

    #[test]
    fn media_types() {
        let enc = encrypted_media_type("application/vnd.oci.image.layer.v1.tar");
        assert_eq!(enc, "application/vnd.oci.image.layer.v1.tar+encrypted");
        assert_eq!(
            plain_media_type(&enc),
            Some("application/vnd.oci.image.layer.v1.tar")
        );
        assert_eq!(
            plain_media_type("application/vnd.oci.image.layer.v1.tar"),
            None
        );
    }
}
