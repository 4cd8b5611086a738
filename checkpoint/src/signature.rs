//! The checkpoint directory's own signature: `gpusnap-manifest.json.sig`, beside the manifest.
//!
//! Some restore doors see nothing but a directory (containerd unpacks `ctr containers
//! checkpoint`'s content into one; CRI and Podman unpack an archive's `checkpoint/`), so the
//! signature every door can check is one that travels inside that directory. It signs the
//! manifest, which records the size and BLAKE3 digests of every CRIU image and GPU state file,
//! so it covers everything the manifest covers.
//!
//! The format is what `cosign sign-blob --key KEY gpusnap-manifest.json` prints: the base64 of
//! an ASN.1 DER ECDSA-P256/SHA-256 signature over the manifest's bytes, so
//! `cosign verify-blob --key pub.pem --signature gpusnap-manifest.json.sig
//! gpusnap-manifest.json` verifies what gpusnap writes, and gpusnap verifies what cosign wrote.
//!
//! Everything here reads the directory as untrusted: the signature and the manifest are opened
//! beneath it without following a symlink, and read up to a cap.

use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sigstore::crypto::signing_key::SigStoreKeyPair;
use sigstore::crypto::{CosignVerificationKey, SigStoreSigner, Signature, SigningScheme};

use crate::layout::{CappedReadError, MANIFEST_FILE, MANIFEST_MAX_BYTES, MANIFEST_TMP_PREFIX};
// Re-exported where they used to be defined, for callers not yet moved to `layout`
// (transaction/src/volume.rs); new code imports them from `layout`.
use crate::layout::{SIGNATURE_FILE, SIGNATURE_MAX_BYTES};

/// Environment variable with the password of an encrypted `cosign.key`; cosign's.
pub const PASSWORD_ENV: &str = "COSIGN_PASSWORD";
/// A PEM key is a few hundred bytes.
const KEY_MAX_BYTES: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("key {}: {reason}", path.display())]
    Key { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Unusable { path: PathBuf, reason: String },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SignatureError + 'a {
    move |source| SignatureError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn key_err(path: &Path, reason: impl Into<String>) -> SignatureError {
    SignatureError::Key {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Every cause of a sigstore error, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn read_capped(file: std::fs::File, cap: u64, path: &Path) -> Result<Vec<u8>, SignatureError> {
    // fstat of the descriptor opened beneath the directory, not a path lookup.
    let st = rustix::fs::fstat(&file).map_err(|e| io_err("reading", path)(e.into()))?;
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    crate::layout::read_capped_from(file, &path.to_string_lossy(), size, cap).map_err(|e| match e {
        CappedReadError::Io(e) => io_err("reading", path)(e),
        e => SignatureError::Unusable {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    })
}

/// Who may read a key file: anyone, or only its owner (the node's signing key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAccess {
    /// The operator's own key, given on a command line.
    Any,
    /// The node's key: a regular file (no symlink), owned by the user this runs as, mode 0600
    /// or stricter, since whoever reads it can sign checkpoints every node trusts.
    OwnerOnly,
}

/// A private key that signs checkpoint manifests.
pub struct SigningKey {
    path: PathBuf,
    signer: SigStoreSigner,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Reads a private key (see [`load_key_pair`]). Cosign keys are ECDSA P-256; so are these
    /// signatures.
    pub fn load(path: &Path, access: KeyAccess) -> Result<SigningKey, SignatureError> {
        let signer = load_key_pair(path, access)?
            .to_sigstore_signer(&SigningScheme::ECDSA_P256_SHA256_ASN1)
            .map_err(|e| key_err(path, format!("cosign keys are ECDSA P-256 ({})", chain(&e))))?;
        Ok(SigningKey {
            path: path.to_path_buf(),
            signer,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The base64 signature of `message`, as `cosign sign-blob` prints it.
    pub fn sign(&self, message: &[u8]) -> Result<String, SignatureError> {
        use base64::Engine as _;
        let der = self
            .signer
            .sign(message)
            .map_err(|e| key_err(&self.path, format!("signing failed ({})", chain(&e))))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(der))
    }

    /// Signs the manifest of the checkpoint directory `dir` and writes the signature beside
    /// it (temporary file, fsync, rename, directory fsync), readable by root only. The manifest
    /// is read beneath `dir`, never through a symlink, capped at [`MANIFEST_MAX_BYTES`].
    pub fn sign_dir(&self, dir: &Path) -> Result<(), SignatureError> {
        let root = crate::beneath::open_root(dir).map_err(io_err("opening", dir))?;
        let manifest = read_manifest_bytes(root.as_fd(), dir)?;
        let signature = self.sign(&manifest)?;
        write_signature(root.as_fd(), dir, signature.as_bytes())?;
        tracing::info!(dir = %dir.display(), key = %self.path.display(), "checkpoint manifest signed");
        Ok(())
    }
}

/// Reads a private key: PKCS#8 PEM (`openssl genpkey -algorithm EC -pkeyopt
/// ec_paramgen_curve:P-256`), or cosign's encrypted `cosign.key` with its password in
/// `$COSIGN_PASSWORD`. Never through a final symlink, at most 64 KiB. Checkpoint and image
/// signatures (`gpusnap image sign`) read keys through this one function.
pub fn load_key_pair(path: &Path, access: KeyAccess) -> Result<SigStoreKeyPair, SignatureError> {
    use std::os::unix::fs::MetadataExt;
    let file = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map(std::fs::File::from)
    .map_err(|e| key_err(path, format!("cannot open it ({})", io::Error::from(e))))?;
    let meta = file.metadata().map_err(io_err("reading", path))?;
    if !meta.is_file() {
        return Err(key_err(path, "not a regular file"));
    }
    if access == KeyAccess::OwnerOnly {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(key_err(
                path,
                format!(
                    "owned by uid {} with mode {:04o}: a signing key must be owned by uid {me} \
                     and readable by it alone (chown {me} and chmod 600 it)",
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            ));
        }
    }
    let pem = read_capped(file, KEY_MAX_BYTES, path)?;
    let text = String::from_utf8_lossy(&pem);
    if text.contains("ENCRYPTED") {
        let password = std::env::var(PASSWORD_ENV).map_err(|_| {
            key_err(
                path,
                format!("the key is encrypted: set {PASSWORD_ENV} to its password"),
            )
        })?;
        SigStoreKeyPair::from_encrypted_pem(&pem, password.as_bytes())
            .map_err(|e| key_err(path, format!("cannot decrypt it ({})", chain(&e))))
    } else if text.contains("BEGIN EC PRIVATE KEY") {
        Err(key_err(
            path,
            "a SEC1 EC key: convert it to PKCS#8 first (openssl pkcs8 -topk8 -nocrypt)",
        ))
    } else {
        SigStoreKeyPair::from_pem(&pem).map_err(|e| {
            key_err(
                path,
                format!("not a PKCS#8 PEM private key ({})", chain(&e)),
            )
        })
    }
}

/// A public key trusted for checkpoint signatures (`restore.signature_keys`).
pub struct TrustedKey {
    path: PathBuf,
    key: CosignVerificationKey,
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TrustedKey {
    /// Reads a PEM public key (cosign.pub, or any PKIX ECDSA, Ed25519 or RSA key).
    pub fn load(path: &Path) -> Result<TrustedKey, SignatureError> {
        let file = std::fs::File::open(path)
            .map_err(|e| key_err(path, format!("cannot open it ({e})")))?;
        let pem = read_capped(file, KEY_MAX_BYTES, path)?;
        let key = CosignVerificationKey::try_from_pem(&pem).map_err(|e| {
            key_err(
                path,
                format!("not a PEM public key cosign could use ({})", chain(&e)),
            )
        })?;
        Ok(TrustedKey {
            path: path.to_path_buf(),
            key,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `signature` (base64, surrounding whitespace allowed) is this key's over `message`.
    pub fn verifies(&self, signature: &[u8], message: &[u8]) -> bool {
        let trimmed = signature.trim_ascii();
        self.key
            .verify_signature(Signature::Base64Encoded(trimmed), message)
            .is_ok()
    }
}

/// What a checkpoint directory's signature says, checked against trusted keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirSignature {
    /// The signature verifies with this trusted key.
    Verified { key: PathBuf },
    /// There is no `gpusnap-manifest.json.sig`.
    Missing,
    /// There is one, but no trusted key verifies it, or it cannot be used (why).
    Invalid { reason: String },
}

/// The manifest's bytes as read for the signature check, and what the signature said. The
/// caller binds the two: the manifest it then validates the checkpoint against must be the one
/// these bytes hold.
#[derive(Debug)]
pub struct CheckedManifest {
    pub manifest: Vec<u8>,
    pub signature: DirSignature,
}

/// Checks the signature of the checkpoint directory `dir` with `keys`.
///
/// `Err` only when the manifest itself cannot be read (the restore refuses that anyway);
/// everything about the signature file is an answer.
pub fn check_dir(dir: &Path, keys: &[TrustedKey]) -> Result<CheckedManifest, SignatureError> {
    let root = crate::beneath::open_root(dir).map_err(io_err("opening", dir))?;
    check_dir_at(root.as_fd(), dir, keys)
}

/// [`check_dir`] on the directory open as `root` (shown as `dir` in messages): for a directory
/// reached beneath another (an image volume's `checkpoint/`), which must not be looked up by
/// its path again.
pub fn check_dir_at(
    root: BorrowedFd<'_>,
    dir: &Path,
    keys: &[TrustedKey],
) -> Result<CheckedManifest, SignatureError> {
    let manifest = read_manifest_bytes(root, dir)?;
    let sig_path = dir.join(SIGNATURE_FILE);
    let signature = match crate::beneath::open_file(root, Path::new(SIGNATURE_FILE)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => DirSignature::Missing,
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            DirSignature::Invalid {
                reason: format!("{} is a symlink", sig_path.display()),
            }
        }
        Err(e) => DirSignature::Invalid {
            reason: format!("cannot open {}: {e}", sig_path.display()),
        },
        Ok(file) => match read_capped(file, SIGNATURE_MAX_BYTES, &sig_path) {
            Err(e) => DirSignature::Invalid {
                reason: e.to_string(),
            },
            Ok(sig) => match keys.iter().find(|k| k.verifies(&sig, &manifest)) {
                Some(k) => DirSignature::Verified {
                    key: k.path.clone(),
                },
                None => DirSignature::Invalid {
                    reason: format!(
                        "{} is not a signature of this manifest by any trusted key: the manifest \
                         was changed after it was signed, or another key signed it",
                        sig_path.display()
                    ),
                },
            },
        },
    };
    Ok(CheckedManifest {
        manifest,
        signature,
    })
}

/// The manifest's bytes, opened beneath `root` (no symlink), at most [`MANIFEST_MAX_BYTES`].
pub fn read_manifest_bytes(root: BorrowedFd<'_>, dir: &Path) -> Result<Vec<u8>, SignatureError> {
    let path = dir.join(MANIFEST_FILE);
    let file = crate::beneath::open_file(root, Path::new(MANIFEST_FILE)).map_err(|e| {
        SignatureError::Unusable {
            path: path.clone(),
            reason: if e.kind() == io::ErrorKind::NotFound {
                "missing: not a complete gpusnap checkpoint".into()
            } else {
                format!("cannot be read without following a symlink ({e})")
            },
        }
    })?;
    read_capped(file, MANIFEST_MAX_BYTES, &path)
}

/// Writes `signature` as the signature file in the opened directory `root`, atomically.
fn write_signature(
    root: BorrowedFd<'_>,
    dir: &Path,
    signature: &[u8],
) -> Result<(), SignatureError> {
    // Under the manifest's temporary prefix, so a scrub after an interruption removes it.
    let tmp_name = format!("{MANIFEST_TMP_PREFIX}.sig.{}", std::process::id());
    let tmp = dir.join(&tmp_name);
    let _ = rustix::fs::unlinkat(root, tmp_name.as_str(), rustix::fs::AtFlags::empty());
    let fd = rustix::fs::openat(
        root,
        tmp_name.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io_err("creating", &tmp)(e.into()))?;
    let result = (|| {
        let mut f = std::fs::File::from(fd);
        f.write_all(signature).map_err(io_err("writing", &tmp))?;
        f.sync_all().map_err(io_err("syncing", &tmp))?;
        drop(f);
        rustix::fs::renameat(root, tmp_name.as_str(), root, SIGNATURE_FILE)
            .map_err(|e| io_err("renaming into place", &dir.join(SIGNATURE_FILE))(e.into()))?;
        rustix::fs::fsync(root).map_err(|e| io_err("syncing directory", dir)(e.into()))
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(root, tmp_name.as_str(), rustix::fs::AtFlags::empty());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh P-256 key pair written as PEM files: (dir, private key, public key).
    fn keypair() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let pair = SigningScheme::ECDSA_P256_SHA256_ASN1
            .create_signer()
            .unwrap()
            .to_sigstore_keypair()
            .unwrap();
        let (private, public) = (d.path().join("k.key"), d.path().join("k.pub"));
        std::fs::write(&private, pair.private_key_to_pem().unwrap().as_bytes()).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&public, pair.public_key_to_pem().unwrap()).unwrap();
        (d, private, public)
    }

    fn checkpoint_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join(MANIFEST_FILE),
            b"{\"kind\":\"gpusnap-checkpoint\"}\n",
        )
        .unwrap();
        d
    }

    #[test]
    fn signs_and_verifies_and_refuses_changes_and_other_keys() {
        let (_k, private, public) = keypair();
        let (_o, _, other_public) = keypair();
        let key = SigningKey::load(&private, KeyAccess::OwnerOnly).unwrap();
        let trusted = [TrustedKey::load(&public).unwrap()];
        let other = [TrustedKey::load(&other_public).unwrap()];
        let dir = checkpoint_dir();
        assert_eq!(
            check_dir(dir.path(), &trusted).unwrap().signature,
            DirSignature::Missing
        );
        key.sign_dir(dir.path()).unwrap();
        let sig = std::fs::read(dir.path().join(SIGNATURE_FILE)).unwrap();
        let meta = std::fs::metadata(dir.path().join(SIGNATURE_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(!sig.ends_with(b"\n"), "cosign's format: bare base64");
        let checked = check_dir(dir.path(), &trusted).unwrap();
        assert_eq!(
            checked.signature,
            DirSignature::Verified {
                key: public.clone()
            }
        );
        assert_eq!(
            checked.manifest,
            std::fs::read(dir.path().join(MANIFEST_FILE)).unwrap()
        );
        assert!(matches!(
            check_dir(dir.path(), &other).unwrap().signature,
            DirSignature::Invalid { .. }
        ));
        // A trailing newline (an editor, `echo`) is still the same signature.
        let mut nl = sig.clone();
        nl.push(b'\n');
        std::fs::write(dir.path().join(SIGNATURE_FILE), &nl).unwrap();
        assert!(matches!(
            check_dir(dir.path(), &trusted).unwrap().signature,
            DirSignature::Verified { .. }
        ));
        // One byte of the manifest changed: the old signature no longer verifies.
        std::fs::write(
            dir.path().join(MANIFEST_FILE),
            b"{\"kind\":\"gpusnap-checkpoinT\"}\n",
        )
        .unwrap();
        let DirSignature::Invalid { reason } = check_dir(dir.path(), &trusted).unwrap().signature
        else {
            panic!("a changed manifest verified")
        };
        assert!(
            reason.contains("not a signature of this manifest"),
            "{reason}"
        );
    }

    #[test]
    fn hostile_signature_files_are_answers_not_trust() {
        let (_k, _, public) = keypair();
        let trusted = [TrustedKey::load(&public).unwrap()];
        let dir = checkpoint_dir();
        let elsewhere = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(SIGNATURE_FILE)).unwrap();
        let DirSignature::Invalid { reason } = check_dir(dir.path(), &trusted).unwrap().signature
        else {
            panic!("a symlinked signature was read")
        };
        assert!(reason.contains("symlink"), "{reason}");
        std::fs::remove_file(dir.path().join(SIGNATURE_FILE)).unwrap();
        std::fs::write(dir.path().join(SIGNATURE_FILE), vec![b'A'; 8192]).unwrap();
        let DirSignature::Invalid { reason } = check_dir(dir.path(), &trusted).unwrap().signature
        else {
            panic!("an oversized signature was read")
        };
        assert!(reason.contains("larger than"), "{reason}");
        std::fs::write(dir.path().join(SIGNATURE_FILE), b"not base64 at all!").unwrap();
        assert!(matches!(
            check_dir(dir.path(), &trusted).unwrap().signature,
            DirSignature::Invalid { .. }
        ));
    }

    #[test]
    fn the_node_key_must_be_private() {
        let (_k, private, _) = keypair();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = SigningKey::load(&private, KeyAccess::OwnerOnly).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        SigningKey::load(&private, KeyAccess::Any).unwrap();
        let link = private.with_extension("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        assert!(
            SigningKey::load(&link, KeyAccess::Any).is_err(),
            "no symlink"
        );
    }
}
