//! cosign-compatible signatures of checkpoint images, key-based and offline (no Fulcio, no
//! Rekor), through the `sigstore` crate.
//!
//! The wire format is cosign's "simple signing": the signature of the image whose manifest (or
//! index) digest is `sha256:<hex>` lives in the same repository under the tag
//! `sha256-<hex>.sig`, an OCI image manifest with one layer per signature. Each layer's blob is
//! the signed payload,
//! `{"critical":{"identity":{"docker-reference":"<registry>/<repo>"},"image":{"docker-manifest-digest":"sha256:<hex>"},"type":"cosign container image signature"},"optional":null}`,
//! and its `dev.cosignproject.cosign/signature` annotation the base64 ECDSA-P256/SHA-256
//! signature (ASN.1 DER) over exactly those bytes. `cosign verify --key k.pub
//! --insecure-ignore-tlog=true` accepts what [`sign`] pushes, and gpusnap accepts what
//! `cosign sign --key k --tlog-upload=false` pushes.
//!
//! Verification order at pull: the image's top manifest digest is known and checked first;
//! then the `.sig` manifest is fetched (capped), each signature layer's blob is fetched capped
//! at [`MAX_PAYLOAD_BYTES`] and checked against its descriptor digest, the signature is checked
//! with each trusted key, and only then is the payload's `docker-manifest-digest` compared with
//! the image digest (and its `type` with cosign's). `docker-reference` is not compared: a
//! checkpoint image may be pulled through another name than the one it was signed under.

use std::path::{Path, PathBuf};

use gpusnap_checkpoint::origin::SignatureCheck;
use gpusnap_config::SignaturePolicy;
use oci_client::RegistryOperation;
use oci_spec::image::{DescriptorBuilder, ImageManifest, ImageManifestBuilder, MediaType};
use sigstore::cosign::constraint::PrivateKeySigner;
use sigstore::cosign::payload::simple_signing::{
    Critical, Identity, Image, SimpleSigning, CRITICAL_TYPE_NAME,
};
use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraint};
use sigstore::cosign::{Constraint, SignatureLayer};
use sigstore::crypto::signing_key::SigStoreKeyPair;
use sigstore::crypto::SigningScheme;

use super::super::digest::{Digest, VerifyingReader};
use super::super::error::ImageError;
use super::client::{chain, Session};
use super::reference::Reference;
use super::{block_on, RegistryOptions};

pub const SIMPLESIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// A simple-signing payload is a few hundred bytes; optional annotations make it larger.
pub const MAX_PAYLOAD_BYTES: u64 = 64 << 10;
/// Environment variable with the password of an encrypted (cosign.key) private key; cosign's.
pub const PASSWORD_ENV: &str = gpusnap_checkpoint::signature::PASSWORD_ENV;

/// What the node wants checked on pull.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignatureOptions {
    pub policy: SignaturePolicy,
    /// Trusted public keys (PEM: cosign.pub, or any PKIX ECDSA P-256/P-384, Ed25519 or RSA key).
    pub keys: Vec<PathBuf>,
    /// The pull extracts the checkpoint: under `require`, an image without a valid registry
    /// signature is still fetched, and the extracted checkpoint directory's own signature must
    /// then verify ([`verify_directory`]) before the checkpoint is put in place.
    pub directory_may_vouch: bool,
}

/// A pull under `require` of an image the registry has no valid signature for, which the
/// checkpoint directory's own signature may vouch for instead ([`verify_directory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectorySignatureRequired {
    /// Trusted public keys (`restore.signature_keys`).
    pub keys: Vec<PathBuf>,
    /// Why the registry signature did not verify.
    pub registry: String,
}

impl SignatureOptions {
    /// What an extraction must check of the checkpoint directory, given what the registry
    /// signature check found.
    pub fn directory_requirement(
        &self,
        found: &SignatureCheck,
    ) -> Option<DirectorySignatureRequired> {
        match found {
            SignatureCheck::Missing { reason }
                if self.policy == SignaturePolicy::Require && self.directory_may_vouch =>
            {
                Some(DirectorySignatureRequired {
                    keys: self.keys.clone(),
                    registry: reason.clone(),
                })
            }
            _ => None,
        }
    }
}

/// Checks the signature of the checkpoint directory `dir` (staged, not yet in place) for a pull
/// under `require` whose image had no valid registry signature: it must verify with a trusted
/// key, over a manifest that records everything that shapes the restored container (the
/// container's spec and writable layer), and that manifest must be `manifest`, the one the
/// extraction checked against the image. Returns what the origin record says of it; `Err`
/// refuses the pull (the caller removes the staging directory, so nothing unverified is left
/// in the checkpoint root).
pub fn verify_directory(
    dir: &Path,
    manifest: &gpusnap_checkpoint::Manifest,
    req: &DirectorySignatureRequired,
    reference: &str,
    digest: &Digest,
) -> Result<SignatureCheck, ImageError> {
    use gpusnap_checkpoint::signature::{check_dir, DirSignature, TrustedKey};
    let refuse = |why: String| ImageError::SignatureRequired {
        reference: reference.to_owned(),
        digest: digest.clone(),
        reason: format!(
            "{}; and the checkpoint directory's own signature cannot stand in for it: {why}",
            req.registry
        ),
    };
    let keys = req
        .keys
        .iter()
        .map(|k| TrustedKey::load(k))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| key_error(Path::new(""), e.to_string()))?;
    if keys.is_empty() {
        return Err(refuse(
            "no trusted keys are configured (restore.signature_keys)".into(),
        ));
    }
    let checked = check_dir(dir, &keys).map_err(|e| refuse(e.to_string()))?;
    let key = match checked.signature {
        DirSignature::Verified { key } => key,
        DirSignature::Missing => {
            return Err(refuse(format!(
                "it has no {}",
                gpusnap_checkpoint::layout::SIGNATURE_FILE
            )))
        }
        DirSignature::Invalid { reason } => return Err(refuse(reason)),
    };
    let signed: gpusnap_checkpoint::Manifest = serde_json::from_slice(&checked.manifest)
        .map_err(|e| refuse(format!("its signed manifest cannot be read ({e})")))?;
    if &signed != manifest {
        return Err(refuse(
            "the manifest it signs is not the one checked against the image".into(),
        ));
    }
    signed
        .covered_container()
        .map_err(|e| refuse(e.to_string()))?;
    tracing::info!(reference, key = %key.display(), "no registry signature; the checkpoint directory's signature verified");
    Ok(SignatureCheck::DirectoryVerified {
        key: key.display().to_string(),
        registry: req.registry.clone(),
    })
}

/// The tag cosign stores the signatures of `digest` under: `sha256-<hex>.sig`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// What [`sign`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SignReport {
    pub reference: String,
    /// The digest that was signed (what the reference pointed at when it was signed).
    pub digest: Digest,
    /// Whether the reference itself named that digest; otherwise the tag was resolved now.
    pub pinned: bool,
    /// `<registry>/<repo>:sha256-<hex>.sig`.
    pub signature_reference: String,
    pub key: PathBuf,
    /// Signatures in the signature manifest now (earlier ones are kept).
    pub signatures: usize,
}

fn key_error(path: &Path, reason: impl Into<String>) -> ImageError {
    ImageError::Key {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads a private key: PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`, e.g. from `openssl
/// genpkey`), or cosign's encrypted `cosign.key` with the password in `$COSIGN_PASSWORD`; the
/// same reader as checkpoint signatures (`gpusnap_checkpoint::signature`).
pub fn load_private_key(path: &Path) -> Result<SigStoreKeyPair, ImageError> {
    use gpusnap_checkpoint::signature::{load_key_pair, KeyAccess, SignatureError};
    load_key_pair(path, KeyAccess::Any).map_err(|e| match e {
        SignatureError::Key { reason, .. } => key_error(path, reason),
        other => key_error(path, other.to_string()),
    })
}

fn load_verifier(path: &Path) -> Result<PublicKeyVerifier, ImageError> {
    let pem = std::fs::read(path).map_err(ImageError::io("reading", path))?;
    PublicKeyVerifier::try_from(&pem).map_err(|e| {
        key_error(
            path,
            format!("not a PEM public key cosign could use ({})", chain(&e)),
        )
    })
}

/// The signature manifest of `digest` in the session's repository; `None` when there is none.
async fn signature_manifest(
    session: &Session,
    digest: &Digest,
) -> Result<Option<ImageManifest>, ImageError> {
    let tag = signature_tag(digest);
    match session.get_manifest(&tag, session.max_manifest_bytes).await {
        Ok(m) => {
            let manifest = ImageManifest::from_reader(&m.bytes[..])
                .map_err(|e| ImageError::malformed("signature manifest", &m.url, e))?;
            Ok(Some(manifest))
        }
        Err(ImageError::Registry { status: 404, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Checks the signature of the image `digest` according to `opts`.
///
/// `Err` only for what no policy excuses: an unreadable key file (the node's configuration is
/// broken), an interruption, or — under `require` — the refusal itself, unless the pull
/// extracts a checkpoint whose own signature may vouch for it
/// ([`SignatureOptions::directory_may_vouch`]): then the missing registry signature is
/// reported, and the extraction checks the directory ([`verify_directory`]).
pub(crate) async fn check(
    session: &Session,
    reference: &Reference,
    digest: &Digest,
    opts: &SignatureOptions,
) -> Result<SignatureCheck, ImageError> {
    if opts.policy == SignaturePolicy::Off {
        return Ok(SignatureCheck::NotChecked);
    }
    let verifiers: Vec<(PathBuf, PublicKeyVerifier)> = opts
        .keys
        .iter()
        .map(|p| load_verifier(p).map(|v| (p.clone(), v)))
        .collect::<Result<_, _>>()?;
    let outcome = if verifiers.is_empty() {
        Err(NoValidSignature::NoKeys)
    } else {
        find_valid(session, digest, &verifiers).await
    };
    match outcome.map_err(|e| e.to_string()) {
        Ok(key) => {
            tracing::info!(reference = %reference, digest = %digest, key = %key.display(), "signature verified");
            Ok(SignatureCheck::Verified {
                key: key.display().to_string(),
            })
        }
        Err(reason) => match opts.policy {
            SignaturePolicy::Require if opts.directory_may_vouch => {
                tracing::info!(reference = %reference, digest = %digest, reason, "no valid registry signature; the extracted checkpoint directory's signature must verify");
                Ok(SignatureCheck::Missing { reason })
            }
            SignaturePolicy::Require => Err(ImageError::SignatureRequired {
                reference: reference.to_string(),
                digest: digest.clone(),
                reason,
            }),
            _ => {
                tracing::warn!(reference = %reference, digest = %digest, reason, "no valid signature (restore.signature_policy = warn)");
                Ok(SignatureCheck::Missing { reason })
            }
        },
    }
}

/// Why no trusted key vouches for a digest (the reason a warning or a refusal names).
#[derive(Debug, thiserror::Error)]
enum NoValidSignature {
    #[error("no trusted keys are configured (restore.signature_keys)")]
    NoKeys,
    #[error("no signature: the registry has no {tag} tag")]
    NoTag { tag: String },
    #[error("interrupted")]
    Interrupted,
    #[error("reading {tag}: {source}")]
    Read {
        tag: String,
        #[source]
        source: ImageError,
    },
    /// What each signature layer found wrong, in order.
    #[error("{}", .0.join("; "))]
    Rejected(Vec<String>),
}

/// The first trusted key with a valid signature of `digest`, or why there is none.
async fn find_valid(
    session: &Session,
    digest: &Digest,
    verifiers: &[(PathBuf, PublicKeyVerifier)],
) -> Result<PathBuf, NoValidSignature> {
    let tag = signature_tag(digest);
    let manifest = match signature_manifest(session, digest).await {
        Ok(Some(m)) => m,
        Ok(None) => return Err(NoValidSignature::NoTag { tag }),
        Err(ImageError::Interrupted) => return Err(NoValidSignature::Interrupted),
        Err(source) => return Err(NoValidSignature::Read { tag, source }),
    };
    let mut reasons = Vec::new();
    let mut candidates = 0;
    for (i, layer) in manifest.layers().iter().enumerate() {
        if layer.media_type().to_string() != SIMPLESIGNING_MEDIA_TYPE {
            continue;
        }
        let Some(sig) = layer
            .annotations()
            .as_ref()
            .and_then(|a| a.get(SIGNATURE_ANNOTATION))
        else {
            reasons.push(format!("layer {i} has no signature annotation"));
            continue;
        };
        candidates += 1;
        let layer_digest = match Digest::parse(layer.digest().as_ref()) {
            Ok(d) => d,
            Err(e) => {
                reasons.push(format!("layer {i}: {e}"));
                continue;
            }
        };
        let payload = match session
            .fetch_small_blob(
                &layer_digest,
                layer.size(),
                MAX_PAYLOAD_BYTES,
                "signature payload",
            )
            .await
        {
            Ok(p) => p,
            Err(e) => {
                reasons.push(format!("layer {i}: {e}"));
                continue;
            }
        };
        let simple_signing: SimpleSigning = match serde_json::from_slice(&payload) {
            Ok(s) => s,
            Err(e) => {
                reasons.push(format!(
                    "layer {i}: payload is not simple signing JSON ({e})"
                ));
                continue;
            }
        };
        let sl = SignatureLayer {
            simple_signing,
            oci_digest: layer_digest.to_string(),
            certificate_signature: None,
            bundle: None,
            signature: Some(sig.clone()),
            raw_data: payload,
        };
        for (path, v) in verifiers {
            match v.verify(&sl) {
                Ok(true) => {}
                _ => continue,
            }
            // The signature is good; now what it says.
            let critical = &sl.simple_signing.critical;
            if critical.type_name != CRITICAL_TYPE_NAME {
                reasons.push(format!(
                    "layer {i}: signed by {} but of type {:?}",
                    path.display(),
                    critical.type_name
                ));
            } else if !sl.simple_signing.satisfies_manifest_digest(digest.as_str()) {
                reasons.push(format!(
                    "layer {i}: signed by {} for {}, not {digest}",
                    path.display(),
                    critical.image.docker_manifest_digest
                ));
            } else {
                return Ok(path.clone());
            }
        }
    }
    if candidates > 0 && reasons.is_empty() {
        let keys: Vec<String> = verifiers
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        reasons.push(format!(
            "{candidates} signature(s) in {tag}, none by a trusted key ({})",
            keys.join(", ")
        ));
    } else if candidates == 0 && reasons.is_empty() {
        reasons.push(format!("{tag} holds no cosign signature layer"));
    }
    Err(NoValidSignature::Rejected(reasons))
}

/// Signs the image `reference` points at with the private key `key` and pushes the signature
/// the way cosign does (adding to the signatures already there).
pub fn sign(reference: &str, key: &Path, opts: &RegistryOptions) -> Result<SignReport, ImageError> {
    let r = Reference::parse(reference, opts.plain_http)?;
    let keypair = load_private_key(key)?;
    block_on(async {
        let mut session = Session::new(&r, opts)?;
        session.authenticate(RegistryOperation::Push).await?;
        let fetched = session
            .get_manifest(&r.manifest_ref(), session.max_manifest_bytes)
            .await?;
        if let Some(want) = &r.digest {
            if *want != fetched.digest {
                return Err(ImageError::DigestMismatch {
                    what: "manifest".into(),
                    expected: want.clone(),
                    actual: fetched.digest,
                    location: fetched.url,
                });
            }
        }
        sign_digest(&session, &r, &fetched.digest, &keypair, key).await
    })
}

/// Signs `digest` (already verified to be in the repository) in an authenticated session.
pub(crate) async fn sign_digest(
    session: &Session,
    r: &Reference,
    digest: &Digest,
    keypair: &SigStoreKeyPair,
    key: &Path,
) -> Result<SignReport, ImageError> {
    let signing_error = |reason: String| ImageError::Signing {
        reference: r.to_string(),
        reason,
    };
    let signer = keypair
        .to_sigstore_signer(&SigningScheme::ECDSA_P256_SHA256_ASN1)
        .map_err(|e| key_error(key, format!("cosign keys are ECDSA P-256 ({})", chain(&e))))?;
    let oci_ref: sigstore::registry::OciReference = format!("{}/{}", r.registry, r.repository)
        .parse()
        .map_err(|e| signing_error(format!("reference: {e}")))?;
    let mut layer = SignatureLayer::new_unsigned(&oci_ref, digest.as_str())
        .map_err(|e| signing_error(chain(&e)))?;
    // cosign names the repository without a tag; the digest is what binds.
    layer.simple_signing = SimpleSigning {
        critical: Critical {
            identity: Identity {
                docker_reference: format!("{}/{}", r.registry, r.repository),
            },
            image: Image {
                docker_manifest_digest: digest.to_string(),
            },
            type_name: CRITICAL_TYPE_NAME.to_owned(),
        },
        optional: None,
    };
    PrivateKeySigner::new_with_signer(signer)
        .add_constraint(&mut layer)
        .map_err(|e| signing_error(chain(&e)))?;
    let payload = layer.raw_data.clone();
    let signature = layer
        .signature
        .clone()
        .ok_or_else(|| signing_error("no signature produced".into()))?;
    let payload_digest = Digest::of(&payload);

    // Keep the signatures already there (other keys, earlier signings).
    let existing = signature_manifest(session, digest).await?;
    let mut layers = Vec::new();
    if let Some(m) = &existing {
        for l in m.layers() {
            layers.push(l.clone());
        }
    }
    let mut annotations = std::collections::HashMap::new();
    annotations.insert(SIGNATURE_ANNOTATION.to_owned(), signature);
    let desc = DescriptorBuilder::default()
        .media_type(MediaType::Other(SIMPLESIGNING_MEDIA_TYPE.into()))
        .size(payload.len() as u64)
        .digest(oci_digest(&payload_digest)?)
        .annotations(annotations)
        .build()
        .map_err(|e| signing_error(e.to_string()))?;
    layers.push(desc);

    let config = b"{}".to_vec();
    let config_digest = Digest::of(&config);
    for (d, bytes) in [(&payload_digest, payload), (&config_digest, config)] {
        if !session.blob_exists(d).await? {
            let size = bytes.len() as u64;
            let body: Box<dyn std::io::Read + Send> = Box::new(std::io::Cursor::new(bytes));
            session
                .upload_blob(
                    d,
                    size,
                    VerifyingReader::new(body, d, size, "signature blob", "memory"),
                    None,
                )
                .await?;
        }
    }
    let config_desc = DescriptorBuilder::default()
        .media_type(MediaType::ImageConfig)
        .size(2u64)
        .digest(oci_digest(&config_digest)?)
        .build()
        .map_err(|e| signing_error(e.to_string()))?;
    let count = layers.len();
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_desc)
        .layers(layers)
        .build()
        .map_err(|e| signing_error(e.to_string()))?;
    let bytes = serde_json::to_vec(&manifest).map_err(|e| signing_error(e.to_string()))?;
    let tag = signature_tag(digest);
    session
        .put_manifest(&tag, "application/vnd.oci.image.manifest.v1+json", &bytes)
        .await?;
    tracing::info!(reference = %r, digest = %digest, tag, key = %key.display(), signatures = count, "image signed");
    Ok(SignReport {
        reference: r.to_string(),
        digest: digest.clone(),
        pinned: r.digest.is_some(),
        signature_reference: format!("{}/{}:{tag}", r.registry, r.repository),
        key: key.to_path_buf(),
        signatures: count,
    })
}

fn oci_digest(d: &Digest) -> Result<oci_spec::image::Digest, ImageError> {
    d.as_str()
        .parse()
        .map_err(|e| ImageError::invalid("digest", d.as_str(), format!("{e}")))
}
