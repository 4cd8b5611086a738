//! JSON Web Encryption (RFC 7516) of the private layer options, as ocicrypt's JWE key wrapper
//! reads and writes it.
//!
//! Writing: content encryption A256GCM; RSA recipients get `RSA-OAEP` (SHA-1 OAEP, what
//! ocicrypt picks for RSA keys), EC recipients `ECDH-ES+A256KW` with an ephemeral key on the
//! recipient's curve. One recipient gives the flattened JSON serialization with `alg` in the
//! protected header; several give the general serialization with `enc` protected and each
//! `alg` (and `epk`) in the recipient's unprotected header. Each recipient also carries `kid`,
//! the SHA-256 fingerprint of its public key, which ocicrypt ignores.
//!
//! Reading accepts both serializations with `RSA-OAEP`, `RSA-OAEP-256`, `ECDH-ES+A128KW` and
//! `ECDH-ES+A256KW`, and content encryption A128GCM, A192GCM or A256GCM.

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::agreement::{self, UnparsedPublicKey};
use aws_lc_rs::digest;
use aws_lc_rs::key_wrap::{AesKek, KeyWrap as _, AES_128, AES_256};
use aws_lc_rs::rsa::{OaepAlgorithm, OAEP_SHA1_MGF1SHA1, OAEP_SHA256_MGF1SHA256};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64U;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::keys::{PrivateKey, PrivateKind, PublicKind, Recipient, EC_CURVES};
use crate::CryptError;

const ENC_A256GCM: &str = "A256GCM";
/// Largest JWE accepted (the private options are ~200 bytes; many recipients still fit).
pub const MAX_JWE_BYTES: usize = 1 << 20;

#[derive(Serialize, Deserialize, Default)]
struct RawJwe {
    #[serde(skip_serializing_if = "Option::is_none")]
    protected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unprotected: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    encrypted_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    recipients: Option<Vec<RawRecipient>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aad: Option<String>,
    iv: String,
    ciphertext: String,
    tag: String,
}

#[derive(Serialize, Deserialize, Default, Clone)]
struct RawRecipient {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<Map<String, Value>>,
    #[serde(default)]
    encrypted_key: String,
}

/// Concat KDF (NIST SP 800-56A, RFC 7518 §4.6.2) with SHA-256.
fn concat_kdf(z: &[u8], alg: &str, apu: &[u8], apv: &[u8], key_len: usize) -> Vec<u8> {
    let mut other = Vec::new();
    for part in [alg.as_bytes(), apu, apv] {
        other.extend_from_slice(&(part.len() as u32).to_be_bytes());
        other.extend_from_slice(part);
    }
    other.extend_from_slice(&((key_len * 8) as u32).to_be_bytes());
    let mut out = Vec::new();
    let mut counter: u32 = 1;
    while out.len() < key_len {
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(&counter.to_be_bytes());
        ctx.update(z);
        ctx.update(&other);
        out.extend_from_slice(ctx.finish().as_ref());
        counter += 1;
    }
    out.truncate(key_len);
    out
}

fn aes_kw_wrap(kek: &[u8], cek: &[u8]) -> Result<Vec<u8>, CryptError> {
    let kek = match kek.len() {
        16 => AesKek::new(&AES_128, kek)?,
        32 => AesKek::new(&AES_256, kek)?,
        _ => return Err(CryptError::Crypto("unsupported AES key wrap size")),
    };
    let mut out = vec![0u8; cek.len() + 8];
    let n = kek.wrap(cek, &mut out)?.len();
    out.truncate(n);
    Ok(out)
}

fn aes_kw_unwrap(kek: &[u8], wrapped: &[u8]) -> Result<Vec<u8>, CryptError> {
    let kek = match kek.len() {
        16 => AesKek::new(&AES_128, kek)?,
        32 => AesKek::new(&AES_256, kek)?,
        _ => return Err(CryptError::Crypto("unsupported AES key wrap size")),
    };
    let mut out = vec![0u8; wrapped.len()];
    let n = kek.unwrap(wrapped, &mut out)?.len();
    out.truncate(n);
    Ok(out)
}

/// Encrypts `plaintext` (the private options JSON) for `recipients`; returns the JWE JSON.
pub fn wrap(plaintext: &[u8], recipients: &[Recipient]) -> Result<String, CryptError> {
    if recipients.is_empty() {
        return Err(CryptError::Crypto("no recipients"));
    }
    let mut cek = [0u8; 32];
    aws_lc_rs::rand::fill(&mut cek)?;
    let mut per_recipient = Vec::with_capacity(recipients.len());
    for r in recipients {
        let mut header = Map::new();
        let encrypted_key = match &r.kind {
            PublicKind::Rsa(key) => {
                header.insert("alg".into(), "RSA-OAEP".into());
                let mut out = vec![0u8; key.ciphertext_size()];
                let n = key
                    .encrypt(&OAEP_SHA1_MGF1SHA1, &cek, &mut out, None)?
                    .len();
                out.truncate(n);
                out
            }
            PublicKind::Ec {
                alg,
                crv,
                coord_len,
                spki,
            } => {
                let alg_name = "ECDH-ES+A256KW";
                header.insert("alg".into(), alg_name.into());
                let eph = agreement::PrivateKey::generate(alg)?;
                let eph_pub = eph.compute_public_key()?;
                let point = eph_pub.as_ref();
                // Uncompressed point: 0x04 || x || y.
                let (x, y) = point[1..].split_at(*coord_len);
                let mut epk = Map::new();
                epk.insert("kty".into(), "EC".into());
                epk.insert("crv".into(), (*crv).into());
                epk.insert("x".into(), B64U.encode(x).into());
                epk.insert("y".into(), B64U.encode(y).into());
                header.insert("epk".into(), Value::Object(epk));
                let kek = agreement::agree(
                    &eph,
                    UnparsedPublicKey::new(alg, spki.as_slice()),
                    aws_lc_rs::error::Unspecified,
                    |z| Ok(concat_kdf(z, alg_name, b"", b"", 32)),
                )?;
                aes_kw_wrap(&kek, &cek)?
            }
        };
        header.insert("kid".into(), r.fingerprint.clone().into());
        per_recipient.push(RawRecipient {
            header: Some(header),
            encrypted_key: B64U.encode(encrypted_key),
        });
    }
    let mut protected = Map::new();
    let single = per_recipient.len() == 1;
    if single {
        protected = per_recipient[0].header.take().unwrap_or_default();
    }
    protected.insert("enc".into(), ENC_A256GCM.into());
    let protected_b64 = B64U.encode(serde_json::to_vec(&Value::Object(protected)).expect("json"));
    let mut iv = [0u8; 12];
    aws_lc_rs::rand::fill(&mut iv)?;
    let key = LessSafeKey::new(UnboundKey::new(&aead::AES_256_GCM, &cek)?);
    cek.fill(0);
    let mut buf = plaintext.to_vec();
    let tag = key.seal_in_place_separate_tag(
        Nonce::assume_unique_for_key(iv),
        Aad::from(protected_b64.as_bytes()),
        &mut buf,
    )?;
    let mut raw = RawJwe {
        protected: Some(protected_b64),
        iv: B64U.encode(iv),
        ciphertext: B64U.encode(&buf),
        tag: B64U.encode(tag.as_ref()),
        ..RawJwe::default()
    };
    if single {
        raw.encrypted_key = Some(per_recipient.remove(0).encrypted_key);
    } else {
        raw.recipients = Some(per_recipient);
    }
    Ok(serde_json::to_string(&raw).expect("json"))
}

/// What a JWE says about one recipient, for refusals ("which key would open it").
#[derive(Debug, Clone)]
pub struct RecipientInfo {
    pub alg: String,
    pub kid: Option<String>,
}

impl std::fmt::Display for RecipientInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kid {
            Some(kid) => write!(f, "{} key {kid}", self.alg),
            None => write!(f, "{} key (unnamed)", self.alg),
        }
    }
}

struct Parsed {
    protected_b64: String,
    shared: Map<String, Value>,
    recipients: Vec<(Map<String, Value>, Vec<u8>)>,
    aad: Option<String>,
    iv: Vec<u8>,
    ciphertext: Vec<u8>,
    tag: Vec<u8>,
}

fn b64u(field: &str, s: &str) -> Result<Vec<u8>, CryptError> {
    B64U.decode(s.trim_end_matches('='))
        .map_err(|e| CryptError::Format(format!("JWE {field} is not base64url: {e}")))
}

fn parse(jwe: &[u8]) -> Result<Parsed, CryptError> {
    if jwe.len() > MAX_JWE_BYTES {
        return Err(CryptError::Format(format!(
            "JWE of {} bytes is larger than {MAX_JWE_BYTES}",
            jwe.len()
        )));
    }
    let raw: RawJwe = serde_json::from_slice(jwe)
        .map_err(|e| CryptError::Format(format!("JWE is not JSON serialization: {e}")))?;
    let protected_b64 = raw.protected.unwrap_or_default();
    let mut shared = Map::new();
    if !protected_b64.is_empty() {
        let p: Map<String, Value> = serde_json::from_slice(&b64u("protected", &protected_b64)?)
            .map_err(|e| CryptError::Format(format!("JWE protected header: {e}")))?;
        shared.extend(p);
    }
    if let Some(u) = raw.unprotected {
        for (k, v) in u {
            shared.entry(k).or_insert(v);
        }
    }
    let recipients = match raw.recipients {
        Some(list) => list
            .into_iter()
            .map(|r| {
                Ok((
                    r.header.unwrap_or_default(),
                    b64u("encrypted_key", &r.encrypted_key)?,
                ))
            })
            .collect::<Result<Vec<_>, CryptError>>()?,
        None => vec![(
            raw.header.unwrap_or_default(),
            b64u("encrypted_key", raw.encrypted_key.as_deref().unwrap_or(""))?,
        )],
    };
    Ok(Parsed {
        protected_b64,
        shared,
        recipients,
        aad: raw.aad,
        iv: b64u("iv", &raw.iv)?,
        ciphertext: b64u("ciphertext", &raw.ciphertext)?,
        tag: b64u("tag", &raw.tag)?,
    })
}

fn merged<'a>(
    shared: &'a Map<String, Value>,
    own: &'a Map<String, Value>,
    key: &str,
) -> Option<&'a Value> {
    own.get(key).or_else(|| shared.get(key))
}

/// The recipients a JWE names (algorithm and `kid` where present).
pub fn recipients(jwe: &[u8]) -> Result<Vec<RecipientInfo>, CryptError> {
    let p = parse(jwe)?;
    Ok(p.recipients
        .iter()
        .map(|(h, _)| RecipientInfo {
            alg: merged(&p.shared, h, "alg")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned(),
            kid: merged(&p.shared, h, "kid")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
        .collect())
}

/// Recovers the content-encryption key for one recipient with one private key.
fn unwrap_cek(
    key: &PrivateKey,
    header: &Map<String, Value>,
    shared: &Map<String, Value>,
    encrypted_key: &[u8],
) -> Option<Vec<u8>> {
    let alg = merged(shared, header, "alg")?.as_str()?;
    match (&key.kind, alg) {
        (PrivateKind::Rsa(k), "RSA-OAEP" | "RSA-OAEP-256") => {
            let oaep: &'static OaepAlgorithm = if alg == "RSA-OAEP" {
                &OAEP_SHA1_MGF1SHA1
            } else {
                &OAEP_SHA256_MGF1SHA256
            };
            let mut out = vec![0u8; k.min_output_size()];
            let n = k.decrypt(oaep, encrypted_key, &mut out, None).ok()?.len();
            out.truncate(n);
            Some(out)
        }
        (PrivateKind::Ec(k), "ECDH-ES+A128KW" | "ECDH-ES+A256KW") => {
            let kw_len = if alg.ends_with("A128KW") { 16 } else { 32 };
            let epk = merged(shared, header, "epk")?.as_object()?;
            let crv = epk.get("crv")?.as_str()?;
            let (curve, _, coord_len) = EC_CURVES.iter().find(|(_, c, _)| *c == crv)?;
            if *curve != k.algorithm() {
                return None;
            }
            let x = B64U.decode(epk.get("x")?.as_str()?).ok()?;
            let y = B64U.decode(epk.get("y")?.as_str()?).ok()?;
            if x.len() != *coord_len || y.len() != *coord_len {
                return None;
            }
            let mut point = vec![0x04];
            point.extend(x);
            point.extend(y);
            let party = |name: &str| -> Option<Vec<u8>> {
                match merged(shared, header, name) {
                    None => Some(Vec::new()),
                    Some(v) => B64U.decode(v.as_str()?).ok(),
                }
            };
            let (apu, apv) = (party("apu")?, party("apv")?);
            let kek = agreement::agree(
                k,
                UnparsedPublicKey::new(curve, point.as_slice()),
                (),
                |z| Ok(concat_kdf(z, alg, &apu, &apv, kw_len)),
            )
            .ok()?;
            aes_kw_unwrap(&kek, encrypted_key).ok()
        }
        _ => None,
    }
}

/// Decrypts a JWE with the first of `keys` that opens it; `None` when none does (wrong keys,
/// or a JWE that does not authenticate).
pub fn unwrap(jwe: &[u8], keys: &[PrivateKey]) -> Result<Option<Vec<u8>>, CryptError> {
    let p = parse(jwe)?;
    let enc = p.shared.get("enc").and_then(Value::as_str).unwrap_or("");
    let (alg, cek_len): (&'static aead::Algorithm, usize) = match enc {
        "A128GCM" => (&aead::AES_128_GCM, 16),
        "A192GCM" => (&aead::AES_192_GCM, 24),
        "A256GCM" => (&aead::AES_256_GCM, 32),
        other => {
            return Err(CryptError::Format(format!(
                "JWE content encryption {other:?} is not supported (A128GCM, A192GCM, A256GCM are)"
            )))
        }
    };
    if p.iv.len() != 12 || p.tag.len() != 16 {
        return Err(CryptError::Format(
            "JWE iv or tag has the wrong length".into(),
        ));
    }
    // AAD: ASCII(BASE64URL(protected)) [ '.' BASE64URL(aad) ].
    let mut aad = p.protected_b64.clone().into_bytes();
    if let Some(extra) = &p.aad {
        aad.push(b'.');
        aad.extend_from_slice(extra.as_bytes());
    }
    for key in keys {
        for (header, encrypted_key) in &p.recipients {
            let Some(cek) = unwrap_cek(key, header, &p.shared, encrypted_key) else {
                continue;
            };
            if cek.len() != cek_len {
                continue;
            }
            let Ok(unbound) = UnboundKey::new(alg, &cek) else {
                continue;
            };
            let sealed = LessSafeKey::new(unbound);
            let mut buf = p.ciphertext.clone();
            buf.extend_from_slice(&p.tag);
            let nonce = Nonce::try_assume_unique_for_key(&p.iv)?;
            if let Ok(plain) = sealed.open_in_place(nonce, Aad::from(aad.as_slice()), &mut buf) {
                return Ok(Some(plain.to_vec()));
            }
        }
    }
    Ok(None)
}
