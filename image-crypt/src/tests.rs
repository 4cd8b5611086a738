use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// Generates a key pair with the openssl CLI (the form operators will use); returns
/// (private path, public path).
fn keypair(dir: &Path, name: &str, genargs: &[&str]) -> (PathBuf, PathBuf) {
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub.pem"));
    let ok = Command::new("openssl")
        .args(genargs)
        .arg("-out")
        .arg(&private)
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl {genargs:?}");
    let ok = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&private)
        .arg("-out")
        .arg(&public)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    (private, public)
}

fn rsa(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    keypair(
        dir,
        name,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ],
    )
}

fn ec(dir: &Path, name: &str, curve: &str) -> (PathBuf, PathBuf) {
    keypair(dir, name, &["ecparam", "-genkey", "-noout", "-name", curve])
}

/// Reads in small, odd-sized pieces, as a network stream might deliver.
struct Dribble<R>(R, usize);
impl<R: Read> Read for Dribble<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.1 = self.1 % 7 + 1;
        let n = self.1.min(buf.len());
        self.0.read(&mut buf[..n])
    }
}

fn encrypt(plain: &[u8], recipients: &[Recipient], dribble: bool) -> (Vec<u8>, EncryptedLayer) {
    let mut out = Vec::new();
    let mut r = EncryptingReader::new(plain).unwrap();
    if dribble {
        Dribble(&mut r, 0).read_to_end(&mut out).unwrap();
    } else {
        r.read_to_end(&mut out).unwrap();
    }
    (out, r.finish(recipients).unwrap())
}

fn decrypt(
    cipher: &[u8],
    ann: &BTreeMap<String, String>,
    keys: &[PrivateKey],
) -> Result<Vec<u8>, CryptError> {
    let key = LayerKey::unwrap(ann, keys)?;
    let mut r = key.reader(Dribble(cipher, 3))?;
    let mut out = Vec::new();
    r.read_to_end(&mut out)?;
    let digest = r.finish()?;
    assert_eq!(digest, key.plain_digest());
    Ok(out)
}

fn plain_data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn ctr_matches_sp800_38a() {
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    let key = hex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
    let iv = hex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
    let mut data = hex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51");
    let want = hex("601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5");
    // Whole, and in pieces that straddle the block boundary: same keystream.
    let mut whole = data.clone();
    stream::tests_support::apply(&key, &iv, &mut [&mut whole[..]]);
    assert_eq!(whole, want);
    let (a, rest) = data.split_at_mut(5);
    let (b, c) = rest.split_at_mut(13);
    stream::tests_support::apply(&key, &iv, &mut [a, b, c]);
    assert_eq!(data, want);
    // The counter wraps at 2^128 as Go's CTR does: block 1 of nonce ff..ff is block 0 of 00..00.
    let mut w1 = [0u8; 32];
    stream::tests_support::apply(&key, &[0xff; 16], &mut [&mut w1[..]]);
    let mut w0 = [0u8; 16];
    stream::tests_support::apply(&key, &[0; 16], &mut [&mut w0[..]]);
    assert_eq!(w1[16..], w0);
}

#[test]
fn round_trip_for_rsa_and_ec_recipients() {
    let dir = tempfile::tempdir().unwrap();
    let (rsa_priv, rsa_pub) = rsa(dir.path(), "rsa");
    let (p256_priv, p256_pub) = ec(dir.path(), "p256", "prime256v1");
    let (p384_priv, p384_pub) = ec(dir.path(), "p384", "secp384r1");
    let recipients = recipients_from_specs(&[
        format!("jwe:{}", rsa_pub.display()),
        format!("jwe:{}", p256_pub.display()),
        p384_pub.display().to_string(),
    ])
    .unwrap();
    let plain = plain_data(100_003);
    let (cipher, layer) = encrypt(&plain, &recipients, true);
    assert_ne!(cipher[..64], plain[..64]);
    assert_eq!(cipher.len(), plain.len());
    assert_eq!(layer.plain_size, plain.len() as u64);
    for key in [&rsa_priv, &p256_priv, &p384_priv] {
        let keys = load_private_keys(std::slice::from_ref(key)).unwrap();
        assert_eq!(
            decrypt(&cipher, &layer.annotations, &keys).unwrap(),
            plain,
            "{key:?}"
        );
    }
    // The fingerprint a private key reports is the kid its public key was sent under.
    let keys = load_private_keys(std::slice::from_ref(&p256_priv)).unwrap();
    assert_eq!(keys[0].fingerprint, recipients[1].fingerprint);
}

#[test]
fn single_recipient_uses_flattened_serialization() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = ec(dir.path(), "k", "prime256v1");
    let recipients = recipients_from_specs(&[format!("jwe:{}", public.display())]).unwrap();
    let (cipher, layer) = encrypt(b"", &recipients, false);
    assert!(cipher.is_empty());
    use base64::Engine as _;
    let jwe_json = base64::engine::general_purpose::STANDARD
        .decode(&layer.annotations[format::ANNOTATION_KEYS_JWE])
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&jwe_json).unwrap();
    assert!(v.get("recipients").is_none() && v.get("encrypted_key").is_some());
    let keys = load_private_keys(&[private]).unwrap();
    assert_eq!(decrypt(&cipher, &layer.annotations, &keys).unwrap(), b"");
}

#[test]
fn pkcs1_rsa_private_key_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = keypair(dir.path(), "legacy", &["genrsa", "-traditional"]);
    assert!(std::fs::read_to_string(&private)
        .unwrap()
        .contains("RSA PRIVATE KEY"));
    let recipients = recipients_from_specs(&[format!("jwe:{}", public.display())]).unwrap();
    let (cipher, layer) = encrypt(b"hello", &recipients, false);
    let keys = load_private_keys(&[private]).unwrap();
    assert_eq!(
        decrypt(&cipher, &layer.annotations, &keys).unwrap(),
        b"hello"
    );
}

#[test]
fn wrong_or_missing_key_is_refused_naming_the_recipients() {
    let dir = tempfile::tempdir().unwrap();
    let (_, public) = rsa(dir.path(), "right");
    let (wrong, _) = ec(dir.path(), "wrong", "prime256v1");
    let recipients = recipients_from_specs(&[format!("jwe:{}", public.display())]).unwrap();
    let (cipher, layer) = encrypt(b"secret", &recipients, false);
    let keys = load_private_keys(std::slice::from_ref(&wrong)).unwrap();
    let err = decrypt(&cipher, &layer.annotations, &keys)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&recipients[0].fingerprint), "{err}");
    assert!(err.contains("RSA-OAEP"), "{err}");
    assert!(err.contains(&wrong.display().to_string()), "{err}");
    let err = decrypt(&cipher, &layer.annotations, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no decryption key is configured"), "{err}");
}

#[test]
fn tampered_ciphertext_and_swapped_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = ec(dir.path(), "k", "secp384r1");
    let recipients = recipients_from_specs(&[format!("jwe:{}", public.display())]).unwrap();
    let keys = load_private_keys(&[private]).unwrap();
    let plain = plain_data(40_000);
    let (cipher, layer) = encrypt(&plain, &recipients, false);

    let mut tampered = cipher.clone();
    tampered[20_000] ^= 1;
    let err = decrypt(&tampered, &layer.annotations, &keys).unwrap_err();
    assert!(
        matches!(err, CryptError::Integrity(_) | CryptError::Io(_)),
        "{err}"
    );
    assert!(err.to_string().contains("HMAC"), "{err}");

    let mut truncated = cipher.clone();
    truncated.truncate(39_999);
    assert!(decrypt(&truncated, &layer.annotations, &keys).is_err());

    // Another layer's wrapped key (same recipient) on this layer's ciphertext and pubopts.
    let (_, other) = encrypt(&plain_data(10), &recipients, false);
    let mut swapped = layer.annotations.clone();
    swapped.insert(
        format::ANNOTATION_KEYS_JWE.into(),
        other.annotations[format::ANNOTATION_KEYS_JWE].clone(),
    );
    let err = decrypt(&cipher, &swapped, &keys).unwrap_err();
    assert!(err.to_string().contains("HMAC"), "{err}");

    // A reader that stops early (as a tar reader does) learns nothing until finish().
    let key = LayerKey::unwrap(&layer.annotations, &keys).unwrap();
    let mut r = key.reader(&tampered[..]).unwrap();
    let mut head = [0u8; 100];
    r.read_exact(&mut head).unwrap();
    assert!(matches!(r.finish(), Err(CryptError::Integrity(_))));
}

#[test]
fn private_key_files_must_be_root_0600() {
    let dir = tempfile::tempdir().unwrap();
    let (private, _) = ec(dir.path(), "k", "prime256v1");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = load_private_keys(std::slice::from_ref(&private))
        .unwrap_err()
        .to_string();
    assert!(err.contains("chmod 0600"), "{err}");
    // Through a symlink (as a Kubernetes Secret volume presents it), the target is checked.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    assert!(load_private_keys(std::slice::from_ref(&link)).is_err());
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o400)).unwrap();
    load_private_keys(&[link]).unwrap();
    assert!(load_private_keys(&[dir.path().to_path_buf()]).is_err());
}

#[test]
fn unsupported_recipient_schemes_are_named() {
    let err = Recipient::from_spec("pgp:someone@example.com")
        .unwrap_err()
        .to_string();
    assert!(err.contains("pgp scheme is not supported"), "{err}");
}

#[test]
fn a_known_plain_digest_is_recorded_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = ec(dir.path(), "k", "prime256v1");
    let recipients = recipients_from_specs(&[format!("jwe:{}", public.display())]).unwrap();
    let plain = plain_data(5000);
    let (_, computed) = encrypt(&plain, &recipients, false);
    let mut r = EncryptingReader::with_plain_digest(&plain[..], &computed.plain_digest).unwrap();
    let mut cipher = Vec::new();
    r.read_to_end(&mut cipher).unwrap();
    let layer = r.finish(&recipients).unwrap();
    assert_eq!(layer.plain_digest, computed.plain_digest);
    let keys = load_private_keys(&[private]).unwrap();
    assert_eq!(decrypt(&cipher, &layer.annotations, &keys).unwrap(), plain);
}
