//! Recipient public keys (`jwe:PATH`) and the node's private keys, from PEM files.
//!
//! The key types are those ocicrypt's JWE key wrapper accepts: RSA (wrapped with RSA-OAEP)
//! and EC on P-256, P-384 or P-521 (ECDH-ES+A256KW). Private keys are PKCS#8 (`PRIVATE KEY`),
//! PKCS#1 (`RSA PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`), unencrypted; a private key file must
//! be a regular file owned by root and not readable by group or others, since whoever reads it
//! reads every checkpoint encrypted to it.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use aws_lc_rs::agreement::{self, ParsedPublicKey, UnparsedPublicKey};
use aws_lc_rs::digest;
use aws_lc_rs::rsa::{
    OaepPrivateDecryptingKey, OaepPublicEncryptingKey, PrivateDecryptingKey, PublicEncryptingKey,
};

use crate::CryptError;

/// Largest key file read (a PEM key is a few KiB).
const MAX_KEY_FILE: u64 = 64 << 10;

pub(crate) const EC_CURVES: [(&agreement::Algorithm, &str, usize); 3] = [
    (&agreement::ECDH_P256, "P-256", 32),
    (&agreement::ECDH_P384, "P-384", 48),
    (&agreement::ECDH_P521, "P-521", 66),
];

/// A public key layers are encrypted to.
pub struct Recipient {
    pub(crate) kind: PublicKind,
    /// `sha256:<hex>` of the SubjectPublicKeyInfo DER, sent as the JWE `kid` so a refusal can
    /// say which key would open a layer.
    pub fingerprint: String,
    /// Where it came from, for messages.
    pub source: String,
}

pub(crate) enum PublicKind {
    Rsa(OaepPublicEncryptingKey),
    Ec {
        alg: &'static agreement::Algorithm,
        crv: &'static str,
        coord_len: usize,
        spki: Vec<u8>,
    },
}

impl std::fmt::Debug for Recipient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recipient")
            .field("source", &self.source)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// Why PEM bytes are not a key gpusnap wraps or unwraps layer keys with.
#[derive(Debug, thiserror::Error)]
pub enum PemKeyError {
    #[error("not a PEM file: {0}")]
    NotPem(#[source] pem::PemError),
    #[error("PEM block is {0:?}, expected \"PUBLIC KEY\" (openssl pkey -pubout)")]
    NotPublicKey(String),
    #[error("unusable RSA key")]
    UnusableRsa,
    #[error("neither an RSA (2048-8192 bit) nor an EC P-256/P-384/P-521 public key")]
    UnknownPublicKey,
    #[error(
        "password-protected keys are not supported; store the key unencrypted, root-owned 0600"
    )]
    Encrypted,
    #[error("PEM block is {0:?}, not a private key")]
    NotPrivateKey(String),
    #[error("neither an RSA (2048-8192 bit) nor an EC P-256/P-384/P-521 private key")]
    UnknownPrivateKey,
}

fn fingerprint(spki_der: &[u8]) -> String {
    let d = digest::digest(&digest::SHA256, spki_der);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Recipient {
    /// Parses `jwe:PATH` (the form skopeo and ctr-enc take; a bare path is accepted too).
    pub fn from_spec(spec: &str) -> Result<Recipient, CryptError> {
        let err = |reason: String| CryptError::Recipient {
            spec: spec.to_owned(),
            reason,
        };
        let path = match spec.split_once(':') {
            Some(("jwe", path)) => path,
            Some((scheme @ ("pgp" | "pkcs7" | "pkcs11" | "provider"), _)) => {
                return Err(err(format!(
                    "the {scheme} scheme is not supported; gpusnap wraps keys with JWE only"
                )))
            }
            _ => spec,
        };
        let pem = read_bounded(Path::new(path)).map_err(|e| err(e.to_string()))?;
        Recipient::from_pem(&pem, spec).map_err(|e| err(e.to_string()))
    }

    /// Parses a PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
    pub fn from_pem(pem_bytes: &[u8], source: &str) -> Result<Recipient, PemKeyError> {
        let block = pem::parse(pem_bytes).map_err(PemKeyError::NotPem)?;
        if block.tag() != "PUBLIC KEY" {
            return Err(PemKeyError::NotPublicKey(block.tag().to_owned()));
        }
        let der = block.contents();
        let kind = if let Ok(rsa) = PublicEncryptingKey::from_der(der) {
            PublicKind::Rsa(
                OaepPublicEncryptingKey::new(rsa).map_err(|_| PemKeyError::UnusableRsa)?,
            )
        } else {
            let found = EC_CURVES.iter().find(|(alg, _, _)| {
                ParsedPublicKey::try_from(&UnparsedPublicKey::new(alg, der)).is_ok()
            });
            match found {
                Some((alg, crv, coord_len)) => PublicKind::Ec {
                    alg,
                    crv,
                    coord_len: *coord_len,
                    spki: der.to_vec(),
                },
                None => return Err(PemKeyError::UnknownPublicKey),
            }
        };
        Ok(Recipient {
            kind,
            fingerprint: fingerprint(der),
            source: source.to_owned(),
        })
    }
}

/// One of the node's private keys.
pub struct PrivateKey {
    pub(crate) kind: PrivateKind,
    /// Fingerprint of the matching public key (see [`Recipient::fingerprint`]).
    pub fingerprint: String,
    pub path: PathBuf,
}

pub(crate) enum PrivateKind {
    Rsa(OaepPrivateDecryptingKey),
    Ec(agreement::PrivateKey),
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateKey")
            .field("path", &self.path)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// Wraps a PKCS#1 RSAPrivateKey in a PKCS#8 PrivateKeyInfo (aws-lc parses only the latter).
fn pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    fn der_len(n: usize) -> Vec<u8> {
        if n < 0x80 {
            vec![n as u8]
        } else {
            let bytes: Vec<u8> = n
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            let mut v = vec![0x80 | bytes.len() as u8];
            v.extend(bytes);
            v
        }
    }
    // version 0, AlgorithmIdentifier { rsaEncryption, NULL }
    let mut body = vec![
        0x02, 0x01, 0x00, 0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01,
        0x01, 0x05, 0x00, 0x04,
    ];
    body.extend(der_len(pkcs1.len()));
    body.extend_from_slice(pkcs1);
    let mut out = vec![0x30];
    out.extend(der_len(body.len()));
    out.extend(body);
    out
}

impl PrivateKey {
    /// Loads a private key file, refusing one that others could read or replace. The checks
    /// are made on the opened file (a Kubernetes Secret volume reaches it through symlinks).
    pub fn load(path: &Path) -> Result<PrivateKey, CryptError> {
        use std::io::Read as _;
        let err = |reason: String| CryptError::Key {
            path: path.to_owned(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        let meta = file.metadata().map_err(|e| err(e.to_string()))?;
        if !meta.file_type().is_file() {
            return Err(err("not a regular file".into()));
        }
        if meta.uid() != 0 {
            return Err(err(format!(
                "owned by uid {}, must be owned by root (chown root:root)",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(err(format!(
                "mode {:04o} lets group or others read it; chmod 0600",
                meta.mode() & 0o7777
            )));
        }
        let mut pem = Vec::new();
        file.take(MAX_KEY_FILE + 1)
            .read_to_end(&mut pem)
            .map_err(|e| err(e.to_string()))?;
        if pem.len() as u64 > MAX_KEY_FILE {
            return Err(err(format!("larger than {MAX_KEY_FILE} bytes; not a key")));
        }
        let key = PrivateKey::from_pem(&pem, path).map_err(|e| err(e.to_string()));
        pem.fill(0);
        key
    }

    /// Parses a PEM private key (no permission checks: for keys not read from a file).
    pub fn from_pem(pem_bytes: &[u8], path: &Path) -> Result<PrivateKey, PemKeyError> {
        let block = pem::parse(pem_bytes).map_err(PemKeyError::NotPem)?;
        let der = block.contents();
        let rsa = |pkcs8: &[u8]| -> Option<(PrivateKind, Vec<u8>)> {
            let key = PrivateDecryptingKey::from_pkcs8(pkcs8).ok()?;
            let spki = public_spki_rsa(&key)?;
            Some((
                PrivateKind::Rsa(OaepPrivateDecryptingKey::new(key).ok()?),
                spki,
            ))
        };
        let ec = |der: &[u8]| -> Option<(PrivateKind, Vec<u8>)> {
            EC_CURVES.iter().find_map(|(alg, _, _)| {
                let key = agreement::PrivateKey::from_private_key_der(alg, der).ok()?;
                let spki = public_spki_ec(&key)?;
                Some((PrivateKind::Ec(key), spki))
            })
        };
        let parsed = match block.tag() {
            "RSA PRIVATE KEY" => rsa(&pkcs1_to_pkcs8(der)),
            "EC PRIVATE KEY" => ec(der),
            "PRIVATE KEY" => rsa(der).or_else(|| ec(der)),
            "ENCRYPTED PRIVATE KEY" => return Err(PemKeyError::Encrypted),
            other => return Err(PemKeyError::NotPrivateKey(other.to_owned())),
        };
        let (kind, spki) = parsed.ok_or(PemKeyError::UnknownPrivateKey)?;
        Ok(PrivateKey {
            kind,
            fingerprint: fingerprint(&spki),
            path: path.to_owned(),
        })
    }
}

fn public_spki_rsa(key: &PrivateDecryptingKey) -> Option<Vec<u8>> {
    use aws_lc_rs::encoding::{AsDer, PublicKeyX509Der};
    let public = key.public_key();
    let der: PublicKeyX509Der<'static> = public.as_der().ok()?;
    Some(der.as_ref().to_vec())
}

fn public_spki_ec(key: &agreement::PrivateKey) -> Option<Vec<u8>> {
    use aws_lc_rs::encoding::{AsDer, PublicKeyX509Der};
    let public = key.compute_public_key().ok()?;
    let der: PublicKeyX509Der<'static> = public.as_der().ok()?;
    Some(der.as_ref().to_vec())
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_KEY_FILE + 1)
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_KEY_FILE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_KEY_FILE} bytes; not a key"),
        ));
    }
    Ok(buf)
}
