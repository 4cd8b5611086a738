//! Streaming layer encryption and decryption: AES-256-CTR with HMAC-SHA256 over the
//! ciphertext, in constant memory (the caller's buffer, one 16-byte keystream block).

use std::collections::BTreeMap;
use std::io::Read;

use aws_lc_rs::cipher::{EncryptingKey, EncryptionContext, UnboundCipherKey, AES_256};
use aws_lc_rs::constant_time::verify_slices_are_equal;
use aws_lc_rs::digest;
use aws_lc_rs::hmac;
use aws_lc_rs::iv::FixedLength;

use crate::format::{
    PrivateOptions, PublicOptions, ANNOTATION_KEYS_JWE, ANNOTATION_PUBOPTS,
    CIPHER_AES_256_CTR_HMAC_SHA256,
};
use crate::keys::{PrivateKey, Recipient};
use crate::{jwe, CryptError};

const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 16;

/// AES-256-CTR keyed at an arbitrary stream offset: the counter block for byte `pos` is
/// `nonce + pos / 16` (128-bit big-endian, wrapping, as Go's `cipher.NewCTR` counts).
struct Ctr {
    key: EncryptingKey,
    nonce: u128,
    pos: u64,
}

impl Ctr {
    fn new(key: &[u8], nonce: &[u8]) -> Result<Ctr, CryptError> {
        let nonce: [u8; NONCE_LEN] = nonce
            .try_into()
            .map_err(|_| CryptError::Format(format!("nonce is {} bytes, not 16", nonce.len())))?;
        Ok(Ctr {
            key: EncryptingKey::ctr(UnboundCipherKey::new(&AES_256, key)?)?,
            nonce: u128::from_be_bytes(nonce),
            pos: 0,
        })
    }

    fn counter(&self, block: u64) -> EncryptionContext {
        let iv = self.nonce.wrapping_add(u128::from(block)).to_be_bytes();
        EncryptionContext::Iv128(FixedLength::from(iv))
    }

    fn apply(&mut self, mut buf: &mut [u8]) -> Result<(), CryptError> {
        let off = (self.pos % 16) as usize;
        if off != 0 && !buf.is_empty() {
            // Finish the partly used block with one keystream block.
            let mut ks = [0u8; 16];
            self.key
                .less_safe_encrypt(&mut ks, self.counter(self.pos / 16))?;
            let n = (16 - off).min(buf.len());
            buf[..n]
                .iter_mut()
                .zip(&ks[off..off + n])
                .for_each(|(b, k)| *b ^= k);
            self.pos += n as u64;
            buf = &mut buf[n..];
        }
        if !buf.is_empty() {
            self.key
                .less_safe_encrypt(buf, self.counter(self.pos / 16))?;
            self.pos += buf.len() as u64;
        }
        Ok(())
    }
}

fn sha256_digest(ctx: digest::Context) -> String {
    let hex: String = ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// The plain layer's digest: hashed on the way, or known already.
enum PlainDigest {
    Hashing(digest::Context),
    Known(String),
}

/// Reads a plain layer and yields its ciphertext; [`EncryptingReader::finish`] then gives the
/// descriptor annotations.
pub struct EncryptingReader<R> {
    inner: R,
    symkey: [u8; KEY_LEN],
    nonce: [u8; NONCE_LEN],
    ctr: Ctr,
    mac: hmac::Context,
    /// Hashes the plain stream, unless the caller already knows its digest.
    plain: PlainDigest,
    plain_len: u64,
    at_eof: bool,
}

impl<R> Drop for EncryptingReader<R> {
    fn drop(&mut self) {
        self.symkey.fill(0);
    }
}

impl<R: Read> EncryptingReader<R> {
    /// A fresh random key and nonce for this layer; the plain digest is computed on the way.
    pub fn new(inner: R) -> Result<EncryptingReader<R>, CryptError> {
        Self::make(
            inner,
            PlainDigest::Hashing(digest::Context::new(&digest::SHA256)),
        )
    }

    /// As [`EncryptingReader::new`], for a blob whose `sha256:…` digest is already known (a
    /// layer gpusnap just wrote): one hash pass less over gigabytes.
    pub fn with_plain_digest(inner: R, digest: &str) -> Result<EncryptingReader<R>, CryptError> {
        Self::make(inner, PlainDigest::Known(digest.to_owned()))
    }

    fn make(inner: R, plain: PlainDigest) -> Result<EncryptingReader<R>, CryptError> {
        let mut symkey = [0u8; KEY_LEN];
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut symkey)?;
        aws_lc_rs::rand::fill(&mut nonce)?;
        Ok(EncryptingReader {
            inner,
            ctr: Ctr::new(&symkey, &nonce)?,
            mac: hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, &symkey)),
            symkey,
            nonce,
            plain,
            plain_len: 0,
            at_eof: false,
        })
    }

    /// After the last byte was read: the descriptor's annotations (wrapped keys for
    /// `recipients`, public options), the plain digest and size.
    pub fn finish(self, recipients: &[Recipient]) -> Result<EncryptedLayer, CryptError> {
        if !self.at_eof {
            return Err(CryptError::Crypto("layer not read to its end"));
        }
        let plain_digest = match &self.plain {
            PlainDigest::Hashing(ctx) => sha256_digest(ctx.clone()),
            PlainDigest::Known(known) => known.clone(),
        };
        let private = PrivateOptions {
            symkey: self.symkey.to_vec(),
            digest: plain_digest.clone(),
            cipheroptions: [("nonce".to_string(), self.nonce.to_vec())].into(),
        };
        let mut opts_json = serde_json::to_vec(&private).expect("options serialize");
        let wrapped = jwe::wrap(&opts_json, recipients);
        opts_json.fill(0);
        let public = PublicOptions {
            cipher: CIPHER_AES_256_CTR_HMAC_SHA256.into(),
            hmac: self.mac.clone().sign().as_ref().to_vec(),
            cipheroptions: BTreeMap::new(),
        };
        use base64::Engine as _;
        let mut annotations = BTreeMap::new();
        annotations.insert(
            ANNOTATION_KEYS_JWE.to_string(),
            base64::engine::general_purpose::STANDARD.encode(wrapped?),
        );
        annotations.insert(ANNOTATION_PUBOPTS.to_string(), public.to_annotation());
        Ok(EncryptedLayer {
            annotations,
            plain_digest,
            plain_size: self.plain_len,
        })
    }
}

impl<R: Read> Read for EncryptingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 {
            if !buf.is_empty() {
                self.at_eof = true;
            }
            return Ok(0);
        }
        if let PlainDigest::Hashing(ctx) = &mut self.plain {
            ctx.update(&buf[..n]);
        }
        self.plain_len += n as u64;
        self.ctr
            .apply(&mut buf[..n])
            .map_err(std::io::Error::other)?;
        self.mac.update(&buf[..n]);
        Ok(n)
    }
}

/// What encryption adds to a layer's descriptor.
#[derive(Debug, Clone)]
pub struct EncryptedLayer {
    /// `org.opencontainers.image.enc.keys.jwe` and `org.opencontainers.image.enc.pubopts`.
    pub annotations: BTreeMap<String, String>,
    /// `sha256:…` of the plain blob.
    pub plain_digest: String,
    pub plain_size: u64,
}

/// The keys of one encrypted layer, unwrapped: make a [`DecryptingReader`] from it.
pub struct LayerKey {
    private: PrivateOptions,
    hmac: Vec<u8>,
}

impl std::fmt::Debug for LayerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerKey")
            .field("plain_digest", &self.private.digest)
            .finish_non_exhaustive()
    }
}

impl LayerKey {
    /// Unwraps a layer's key from its descriptor annotations with the first of `keys` that
    /// opens it. The refusal names the recipients the layer was encrypted for.
    pub fn unwrap(
        annotations: &BTreeMap<String, String>,
        keys: &[PrivateKey],
    ) -> Result<LayerKey, CryptError> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let public = match annotations.get(ANNOTATION_PUBOPTS) {
            Some(v) => PublicOptions::from_annotation(v)?,
            None => {
                return Err(CryptError::Format(format!(
                    "no {ANNOTATION_PUBOPTS} annotation"
                )))
            }
        };
        if public.cipher != CIPHER_AES_256_CTR_HMAC_SHA256 {
            return Err(CryptError::Format(format!(
                "cipher {:?} is not supported ({CIPHER_AES_256_CTR_HMAC_SHA256} is)",
                public.cipher
            )));
        }
        if public.hmac.len() != 32 {
            return Err(CryptError::Format(
                "public options carry no HMAC-SHA256".into(),
            ));
        }
        let Some(wrapped) = annotations.get(ANNOTATION_KEYS_JWE) else {
            let others = crate::format::other_schemes(annotations.keys());
            return Err(CryptError::NoKey(if others.is_empty() {
                format!("no {ANNOTATION_KEYS_JWE} annotation: no wrapped key to open")
            } else {
                format!(
                    "keys are wrapped only for {} which gpusnap does not support; re-encrypt with jwe: recipients",
                    others.join(", ")
                )
            }));
        };
        let mut named = Vec::new();
        for part in wrapped.split(',') {
            let jwe_json = b64.decode(part.trim()).map_err(|e| {
                CryptError::Format(format!("{ANNOTATION_KEYS_JWE} entry is not base64: {e}"))
            })?;
            named.extend(jwe::recipients(&jwe_json)?);
            if let Some(opts) = jwe::unwrap(&jwe_json, keys)? {
                let private: PrivateOptions = serde_json::from_slice(&opts)
                    .map_err(|e| CryptError::Format(format!("private options: {e}")))?;
                if private.symkey.len() != KEY_LEN {
                    return Err(CryptError::Format("layer key is not 32 bytes".into()));
                }
                if !private.cipheroptions.contains_key("nonce") {
                    return Err(CryptError::Format("private options carry no nonce".into()));
                }
                return Ok(LayerKey {
                    private,
                    hmac: public.hmac,
                });
            }
        }
        let have: Vec<String> = keys
            .iter()
            .map(|k| format!("{} ({})", k.path.display(), k.fingerprint))
            .collect();
        let want: Vec<String> = named.iter().map(ToString::to_string).collect();
        Err(CryptError::NoKey(format!(
            "encrypted for {} recipient(s): {}; {}",
            want.len(),
            want.join(", "),
            if have.is_empty() {
                "no decryption key is configured (restore.decryption_keys or --decryption-key)"
                    .to_string()
            } else {
                format!("none of the configured keys opens it: {}", have.join(", "))
            }
        )))
    }

    /// `sha256:…` of the plain blob, as the encrypter recorded it.
    pub fn plain_digest(&self) -> &str {
        &self.private.digest
    }

    /// A reader of the plain layer over the ciphertext `inner`.
    pub fn reader<R: Read>(&self, inner: R) -> Result<DecryptingReader<R>, CryptError> {
        let nonce = &self.private.cipheroptions["nonce"];
        Ok(DecryptingReader {
            inner,
            ctr: Ctr::new(&self.private.symkey, nonce)?,
            mac: hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, &self.private.symkey)),
            expected_hmac: self.hmac.clone(),
            plain: digest::Context::new(&digest::SHA256),
            state: DecryptState::Reading,
        })
    }
}

/// The HMAC over a layer's ciphertext is not the one its public options record.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "HMAC over the ciphertext does not match its public options: the layer was tampered with, \
     or its key belongs to another layer"
)]
struct HmacMismatch;

#[derive(Debug, Clone, PartialEq, Eq)]
enum DecryptState {
    Reading,
    /// The HMAC matched; the plain stream's `sha256:…`.
    Verified(String),
    Refused(String),
}

/// Yields the plain layer. It never reports end of stream until the HMAC over the whole
/// ciphertext matched: a reader that stops early (a tar reader at its end-of-archive blocks)
/// must call [`DecryptingReader::finish`], and everything it consumed is untrusted until that
/// returns `Ok`.
///
/// The digest in the private options is *not* enforced here: skopeo records the source
/// blob's digest even when it compressed the layer before encrypting it, so it may describe
/// another representation of the content. The caller checks the plain stream (its digest
/// from `finish`, or the decompressed stream) against the image config's diff_id instead.
pub struct DecryptingReader<R> {
    inner: R,
    ctr: Ctr,
    mac: hmac::Context,
    expected_hmac: Vec<u8>,
    plain: digest::Context,
    state: DecryptState,
}

impl<R: Read> DecryptingReader<R> {
    fn verify(&mut self) -> Result<String, HmacMismatch> {
        let mac = self.mac.clone().sign();
        if verify_slices_are_equal(mac.as_ref(), &self.expected_hmac).is_err() {
            return Err(HmacMismatch);
        }
        Ok(sha256_digest(self.plain.clone()))
    }

    /// Reads the rest of the ciphertext and checks it; `Ok` means every byte this reader gave
    /// out is authentic. Returns the plain stream's `sha256:…`.
    pub fn finish(&mut self) -> Result<String, CryptError> {
        let mut scratch = [0u8; 16 << 10];
        loop {
            match self.read(&mut scratch) {
                Ok(0) => {
                    return match &self.state {
                        DecryptState::Verified(d) => Ok(d.clone()),
                        _ => Err(CryptError::Crypto("stream ended unverified")),
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(match &self.state {
                        DecryptState::Refused(why) => CryptError::Integrity(why.clone()),
                        _ => CryptError::Io(e),
                    })
                }
            }
        }
    }
}

impl<R: Read> Read for DecryptingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &self.state {
            DecryptState::Verified(_) => return Ok(0),
            DecryptState::Refused(why) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    why.clone(),
                ))
            }
            DecryptState::Reading => {}
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        if n == 0 {
            return match self.verify() {
                Ok(digest) => {
                    self.state = DecryptState::Verified(digest);
                    Ok(0)
                }
                Err(why) => {
                    self.state = DecryptState::Refused(why.to_string());
                    Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why))
                }
            };
        }
        self.mac.update(&buf[..n]);
        self.ctr
            .apply(&mut buf[..n])
            .map_err(std::io::Error::other)?;
        self.plain.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    /// Applies the keystream to consecutive pieces of one stream.
    pub(crate) fn apply(key: &[u8], nonce: &[u8], pieces: &mut [&mut [u8]]) {
        let mut ctr = super::Ctr::new(key, nonce).unwrap();
        for p in pieces.iter_mut() {
            ctr.apply(p).unwrap();
        }
    }
}
