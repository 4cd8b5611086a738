//! The node's signature policy (`restore.signature_policy`), decided here once for every front
//! door, and the node's signing of the checkpoints it takes (`checkpoint.signing_key`).
//!
//! A door only says what it knows ([`SignatureEvidence`]): the pod-annotation door knows what
//! `gpusnap image pull --extract` recorded about the image's registry signature; `ctr`, CRI and
//! gpusnap-runc see only the directory. Every door's directory may carry its own signature
//! (`gpusnap-manifest.json.sig`, see [`gpusnap_checkpoint::signature`]).
//!
//! | policy | the directory signature or the door's evidence verifies | neither does |
//! |---|---|---|
//! | `off` | restored, nothing is read | restored |
//! | `warn` | restored | logged, restored |
//! | `require` | restored | refused before anything runs |
//!
//! A directory signature covers the manifest, and the manifest records what else shapes the
//! restored container: the privilege-relevant fields of the dumped container's spec and its
//! writable layer (`container_record.rs`). When the directory signature is what admitted the
//! checkpoint, the restore compares both with the container being created ([`Admission::
//! check_spec`], before anything runs; [`Admission::check_layer`], after the runtime or gpusnap
//! applied the layer and before CRIU runs): under `require` a difference refuses, naming the
//! part; under `warn` it is logged. Under `require` a signed manifest without that record
//! (sealed by an older gpusnap), or with a part that could not be recorded, is refused with why.
//! A registry signature verified at pull covers the whole image instead (the rootfs diff's
//! digest in the origin record is checked before it is applied, and that door's spec is the
//! pod's).

use std::path::{Path, PathBuf};

use gpusnap_checkpoint::origin::SignatureCheck;
use gpusnap_checkpoint::signature::{
    self as dirsig, DirSignature, KeyAccess, SigningKey, TrustedKey,
};
use gpusnap_checkpoint::{ContainerRecord, Manifest};
use gpusnap_config::{Config, SignaturePolicy};

use crate::deadline::{Changed, Deadline, Phase};
use crate::error::{Error, Result};

/// What the front door knows about a checkpoint's signature, besides its directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SignatureEvidence {
    /// Nothing beyond the directory (`ctr`, CRI, gpusnap-runc).
    #[default]
    DirectoryOnly,
    /// The origin record of `gpusnap image pull --extract` (`gpusnap-origin.json`, in the
    /// root-only checkpoint root): what the pull found of the image's cosign signature.
    Pulled {
        /// The reference it was pulled by.
        source: String,
        check: SignatureCheck,
    },
    /// This node's own record (`gpusnap_checkpoint::node_origin`, root-only): the checkpoint
    /// was sealed here or adopted by root. The policy is decided on the directory signature,
    /// as for `ctr`; the manifest restored must be the one recorded (its SHA-256).
    NodeRecord {
        /// The record, for messages.
        record: PathBuf,
        manifest_sha256: String,
    },
}

/// How a restore got past the policy; [`Admission::bind`] ties a verified directory signature
/// to the manifest the restore then validates.
#[derive(Debug)]
pub(crate) struct Admission {
    /// The manifest bytes a directory signature verified; `None` when nothing was verified
    /// over the directory itself (policy off, a registry signature, or warn).
    signed_manifest: Option<Vec<u8>>,
    /// The manifest bytes whose digest the node's record holds (a node-local checkpoint).
    recorded_manifest: Option<Vec<u8>>,
    dir: PathBuf,
    /// The container record the verified directory signature covers, compared with the
    /// container being restored; `enforce`: a difference refuses (`require`) or is logged
    /// (`warn`).
    covered: Option<(ContainerRecord, bool)>,
}

impl Admission {
    /// An admission under policy `off` for `dir` (the phases' unit tests, which build a
    /// restore's state without its validate phase).
    #[cfg(test)]
    pub(crate) fn unsigned(dir: &Path) -> Admission {
        Admission {
            signed_manifest: None,
            recorded_manifest: None,
            dir: dir.to_path_buf(),
            covered: None,
        }
    }

    /// The validated manifest must be the one the signature verified: otherwise the directory
    /// changed between the two reads, and what is restored is not what was signed.
    pub(crate) fn bind(&self, validated: &Manifest) -> Result<()> {
        for (bytes, what) in [
            (&self.signed_manifest, "its signature verified"),
            (&self.recorded_manifest, "this node recorded"),
        ] {
            let Some(bytes) = bytes else {
                continue;
            };
            match serde_json::from_slice::<Manifest>(bytes) {
                Ok(expected) if &expected == validated => {}
                _ => {
                    return Err(Error::precondition(format!(
                        "{} changed while it was being verified: the manifest validated is not \
                         the one {what}; copy the checkpoint again from its source",
                        self.dir.display()
                    )))
                }
            }
        }
        Ok(())
    }

    /// The spec of the container being created (`<bundle>/config.json`) grants nothing beyond
    /// the signed record's.
    /// `checkpoint_mount`: the mount (destination, source) the checkpoint came through, left
    /// out of the comparison ([`crate::RestoreRequest::checkpoint_mount`]).
    pub(crate) fn check_spec(
        &self,
        bundle: &Path,
        checkpoint_mount: Option<&crate::bundle_spec::SpecMount>,
    ) -> Result<()> {
        let Some((record, enforce)) = &self.covered else {
            return Ok(());
        };
        self.verdict(
            *enforce,
            "spec",
            crate::container_record::check_spec(record, bundle, checkpoint_mount),
        )
    }

    /// The writable layer of the container being restored (the overlay at `rootfs`, after the
    /// runtime or gpusnap applied the checkpoint's layer) is the signed one. `applied_here`:
    /// the rootfs diff gpusnap applied, if it did. The walk of the layer stops at the
    /// restore's `deadline`, which then ends the restore as it ends every phase (`changed`:
    /// what the restore has changed so far).
    pub(crate) fn check_layer(
        &self,
        rootfs: &Path,
        applied_here: Option<&Path>,
        deadline: &Deadline,
        changed: Changed,
    ) -> Result<()> {
        let Some((record, enforce)) = &self.covered else {
            return Ok(());
        };
        let part = crate::container_record::layer_part(&self.dir, applied_here);
        let found =
            crate::container_record::check_layer(record, &self.dir, rootfs, &part, deadline.at());
        // A walk the deadline stopped found no difference: under `warn` it must not pass for
        // one (logged, and the restore going on), under `require` not be refused as one.
        deadline.check(Phase::LayerCheck, changed)?;
        self.verdict(*enforce, "writable layer", found)
    }

    fn verdict(
        &self,
        enforce: bool,
        part: &str,
        found: std::result::Result<(), crate::container_record::RecordError>,
    ) -> Result<()> {
        let Err(why) = found else {
            return Ok(());
        };
        if !enforce {
            tracing::warn!(dir = %self.dir.display(), part, why = %why, "restoring a container that differs from its signed checkpoint (restore.signature_policy = warn)");
            return Ok(());
        }
        Err(Error::precondition(format!(
            "{why}. The checkpoint in {} is signed, and this node requires what it restores to \
             be what was signed (restore.signature_policy = require): the {part} was changed \
             after the checkpoint was signed, or the container is not specified like the one \
             checkpointed; restore the checkpoint as it was taken",
            self.dir.display()
        ))
        .caused_by(why))
    }
}

/// Why the manifest a directory signature verified yields no usable container record.
#[derive(Debug, thiserror::Error)]
enum Uncovered {
    #[error("its manifest cannot be read ({0})")]
    Unreadable(#[source] serde_json::Error),
    #[error(transparent)]
    NotCovered(#[from] gpusnap_checkpoint::manifest::NotCovered),
}

/// The container record in the manifest bytes a directory signature verified, if usable, or
/// why not.
fn covered_record(manifest: &[u8]) -> std::result::Result<ContainerRecord, Uncovered> {
    let m: Manifest = serde_json::from_slice(manifest).map_err(Uncovered::Unreadable)?;
    Ok(m.covered_container()?.clone())
}

/// The node's policy on the checkpoint in `dir`, before anything of it is read for a restore.
pub(crate) fn admit(
    config: &Config,
    dir: &Path,
    evidence: &SignatureEvidence,
) -> Result<Admission> {
    let recorded = recorded_manifest(dir, evidence)?;
    decide(config, dir, evidence, recorded, |keys| {
        dirsig::check_dir(dir, keys)
    })
}

/// The node's policy on the checkpoint directory open as `root` (shown as `dir`), which no
/// node record vouches for: an image volume's checkpoint, before anything of it is copied
/// (`volume.rs`). The transaction decides again on the copy ([`admit`]), and binds what it
/// restores to the manifest its signature verified.
pub(crate) fn admit_at(
    config: &Config,
    root: std::os::fd::BorrowedFd<'_>,
    dir: &Path,
) -> Result<Admission> {
    decide(
        config,
        dir,
        &SignatureEvidence::DirectoryOnly,
        None,
        |keys| dirsig::check_dir_at(root, dir, keys),
    )
}

/// The policy decided on what `check` finds of the directory signature and on `evidence`.
fn decide(
    config: &Config,
    dir: &Path,
    evidence: &SignatureEvidence,
    recorded_manifest: Option<Vec<u8>>,
    check: impl FnOnce(
        &[TrustedKey],
    ) -> std::result::Result<dirsig::CheckedManifest, dirsig::SignatureError>,
) -> Result<Admission> {
    let policy = config.restore.signature_policy;
    let mut admission = Admission {
        signed_manifest: None,
        recorded_manifest,
        dir: dir.to_path_buf(),
        covered: None,
    };
    if policy == SignaturePolicy::Off {
        return Ok(admission);
    }
    let keys = trusted_keys(config)?;
    let checked = check(&keys).map_err(|e| {
        Error::precondition(format!("the checkpoint's signature cannot be checked: {e}"))
    })?;
    if let DirSignature::Verified { key } = &checked.signature {
        tracing::info!(dir = %dir.display(), key = %key.display(), "checkpoint signature verified");
        match covered_record(&checked.manifest) {
            Ok(record) => admission.covered = Some((record, policy == SignaturePolicy::Require)),
            Err(why) if policy == SignaturePolicy::Require => {
                return Err(Error::precondition(format!(
                    "the checkpoint in {} is signed by {}, but the signature does not cover \
                     everything that shapes the restored container, and this node requires \
                     it to (restore.signature_policy = require): {why}",
                    dir.display(),
                    key.display()
                )))
            }
            Err(why) => {
                tracing::warn!(dir = %dir.display(), why = %why, "the checkpoint's signature covers only its CRIU images (restore.signature_policy = warn)")
            }
        }
        admission.signed_manifest = Some(checked.manifest);
        return Ok(admission);
    }
    if let SignatureEvidence::Pulled {
        source,
        check: SignatureCheck::Verified { key },
    } = evidence
    {
        tracing::info!(dir = %dir.display(), source, key, "restoring a checkpoint whose image signature was verified at pull");
        return Ok(admission);
    }
    let why = why_unsigned(dir, &checked.signature, evidence);
    let tried = keys
        .iter()
        .map(|k| k.path().display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if policy == SignaturePolicy::Warn {
        tracing::warn!(dir = %dir.display(), why, keys = tried, "restoring a checkpoint without a verified signature (restore.signature_policy = warn)");
        return Ok(admission);
    }
    Err(Error::precondition(format!(
        "the checkpoint in {} has no signature this node trusts, and this node requires one \
         (restore.signature_policy = require): {why}; keys tried: {tried}. Sign it with one of \
         those keys' private keys (`gpusnap checkpoint sign {} --key KEY`), set \
         checkpoint.signing_key on the node that takes the checkpoints, or pull a signed image \
         (`gpusnap image pull REF --extract`)",
        dir.display(),
        dir.display()
    )))
}

/// For a node-local checkpoint, the manifest bytes now in `dir`, refused unless their
/// SHA-256 is the one the node recorded when it sealed or adopted the checkpoint.
fn recorded_manifest(dir: &Path, evidence: &SignatureEvidence) -> Result<Option<Vec<u8>>> {
    let SignatureEvidence::NodeRecord {
        record,
        manifest_sha256,
    } = evidence
    else {
        return Ok(None);
    };
    let bytes = gpusnap_checkpoint::beneath::open_root(dir)
        .map_err(|e| e.to_string())
        .and_then(|fd| {
            dirsig::read_manifest_bytes(std::os::fd::AsFd::as_fd(&fd), dir)
                .map_err(|e| e.to_string())
        })
        .map_err(|e| Error::precondition(format!("the checkpoint cannot be read: {e}")))?;
    let found = gpusnap_checkpoint::node_origin::sha256_hex(&bytes);
    if &found != manifest_sha256 {
        return Err(Error::precondition(format!(
            "{} was modified after this node sealed or adopted it: its manifest has SHA-256 \
             {found}, {} records {manifest_sha256}; take the checkpoint again, or verify and \
             adopt it as it is now (`gpusnap checkpoint adopt`)",
            dir.display(),
            record.display()
        )));
    }
    Ok(Some(bytes))
}

fn why_unsigned(dir: &Path, dir_sig: &DirSignature, evidence: &SignatureEvidence) -> String {
    let own = match dir_sig {
        DirSignature::Missing => format!(
            "{} is missing (the checkpoint was not signed)",
            dir.join(gpusnap_checkpoint::layout::SIGNATURE_FILE)
                .display()
        ),
        DirSignature::Invalid { reason } => reason.clone(),
        DirSignature::Verified { .. } => unreachable!("a verified signature is admitted"),
    };
    match evidence {
        SignatureEvidence::DirectoryOnly | SignatureEvidence::NodeRecord { .. } => own,
        SignatureEvidence::Pulled { source, check } => {
            let pulled = match check {
                SignatureCheck::Missing { reason } => reason.clone(),
                SignatureCheck::NotChecked => {
                    "not checked (the pulling node's policy was off)".to_owned()
                }
                SignatureCheck::Verified { .. } => unreachable!("a verified pull is admitted"),
                SignatureCheck::DirectoryVerified { key, registry } => format!(
                    "its directory signature verified with {key} at pull, and no longer does \
                     ({registry})"
                ),
            };
            format!("{own}; its image {source} was pulled without a verified signature: {pulled}")
        }
    }
}

fn trusted_keys(config: &Config) -> Result<Vec<TrustedKey>> {
    let keys: Vec<TrustedKey> = config
        .restore
        .signature_keys
        .iter()
        .map(|p| TrustedKey::load(p))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| {
            Error::invalid(format!(
                "restore.signature_keys in the gpusnap configuration: {e}"
            ))
        })?;
    if keys.is_empty() {
        return Err(Error::invalid(format!(
            "restore.signature_policy = {} needs trusted keys: set restore.signature_keys in the \
             gpusnap configuration",
            config.restore.signature_policy
        )));
    }
    Ok(keys)
}

/// The node's signing key (`checkpoint.signing_key`), loaded before a checkpoint touches
/// anything, so that a missing or world-readable key refuses the checkpoint instead of leaving
/// an unsigned one.
pub(crate) fn node_signer(config: &Config) -> Result<Option<SigningKey>> {
    let Some(path) = &config.checkpoint.signing_key else {
        return Ok(None);
    };
    SigningKey::load(path, KeyAccess::OwnerOnly)
        .map(Some)
        .map_err(|e| {
            Error::precondition(format!(
                "checkpoint.signing_key in the gpusnap configuration: {e}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;

    use gpusnap_checkpoint::layout::SIGNATURE_FILE;
    use gpusnap_criu_bridge::CriuFlags;

    /// An ECDSA P-256 key pair made with openssl, as an operator would: (private, public).
    fn keypair(d: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (private, public) = (d.join(format!("{name}.key")), d.join(format!("{name}.pub")));
        let run = |args: &[&str]| {
            let out = Command::new("openssl").args(args).output().unwrap();
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        let (k, p) = (private.to_str().unwrap(), public.to_str().unwrap());
        run(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            k,
        ]);
        run(&["pkey", "-in", k, "-pubout", "-out", p]);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        (private, public)
    }

    /// A sealed checkpoint whose manifest records its container, as this gpusnap's seal does.
    fn sealed(root: &Path) -> (PathBuf, Manifest) {
        sealed_with(root, Some(record()))
    }

    fn record() -> ContainerRecord {
        use gpusnap_checkpoint::writable_layer::{record_of, WritableLayerRecord};
        let listing = Vec::new();
        let layer = record_of(&[], &listing);
        assert!(matches!(layer, WritableLayerRecord::Overlay { .. }));
        ContainerRecord {
            format: gpusnap_checkpoint::CONTAINER_RECORD_FORMAT,
            spec: gpusnap_checkpoint::SpecRecord::Recorded {
                grants: Default::default(),
            },
            writable_layer: layer,
        }
    }

    fn sealed_with(root: &Path, container: Option<ContainerRecord>) -> (PathBuf, Manifest) {
        let dir = root.join("ck");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("pages-1.img"), b"pages").unwrap();
        let mut m = Manifest::new("c1", CriuFlags::default());
        m.container = container;
        let m = gpusnap_checkpoint::seal_checkpoint(&dir, m).unwrap();
        (dir, m)
    }

    fn config(policy: SignaturePolicy, keys: &[&Path]) -> Config {
        let mut c = Config::default();
        c.restore.signature_policy = policy;
        c.restore.signature_keys = keys.iter().map(|k| k.to_path_buf()).collect();
        c
    }

    fn refusal(r: Result<Admission>) -> String {
        match r {
            Err(e @ Error::Refused { .. }) => e.to_string(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn require_refuses_unsigned_and_untrusted_and_admits_signed() {
        let t = tempfile::tempdir().unwrap();
        let (private, public) = keypair(t.path(), "a");
        let (other_private, _) = keypair(t.path(), "b");
        let (dir, manifest) = sealed(t.path());
        let require = config(SignaturePolicy::Require, &[&public]);
        let none = SignatureEvidence::DirectoryOnly;

        let msg = refusal(admit(&require, &dir, &none));
        for part in [
            dir.to_str().unwrap(),
            "gpusnap-manifest.json.sig is missing",
            public.to_str().unwrap(),
            "gpusnap checkpoint sign",
            "checkpoint.signing_key",
            "gpusnap image pull",
        ] {
            assert!(msg.contains(part), "{part:?} not in: {msg}");
        }

        SigningKey::load(&other_private, KeyAccess::Any)
            .unwrap()
            .sign_dir(&dir)
            .unwrap();
        let msg = refusal(admit(&require, &dir, &none));
        assert!(
            msg.contains("not a signature of this manifest by any trusted key"),
            "{msg}"
        );

        SigningKey::load(&private, KeyAccess::Any)
            .unwrap()
            .sign_dir(&dir)
            .unwrap();
        let admitted = admit(&require, &dir, &none).unwrap();
        admitted.bind(&manifest).unwrap();
        // A different manifest than the one the signature verified is not restored.
        let mut other = manifest.clone();
        other.container_id = "c2".into();
        let msg = admitted.bind(&other).unwrap_err().to_string();
        assert!(msg.contains("changed while it was being verified"), "{msg}");

        // Re-sealed (tampered) after signing: the old signature no longer verifies.
        let resealed =
            gpusnap_checkpoint::seal_checkpoint(&dir, Manifest::new("evil", CriuFlags::default()));
        resealed.unwrap();
        assert!(dir.join(SIGNATURE_FILE).exists());
        let msg = refusal(admit(&require, &dir, &none));
        assert!(msg.contains("not a signature of this manifest"), "{msg}");
    }

    /// A signature over a manifest that records only the CRIU images (an older gpusnap's
    /// seal), or that could not record a part, does not admit under require, naming why; warn
    /// admits it.
    #[test]
    fn require_refuses_a_signature_that_covers_only_the_criu_images() {
        use gpusnap_checkpoint::writable_layer::WritableLayerRecord;
        let t = tempfile::tempdir().unwrap();
        let (private, public) = keypair(t.path(), "a");
        let key = SigningKey::load(&private, KeyAccess::Any).unwrap();
        let require = config(SignaturePolicy::Require, &[&public]);
        let none = SignatureEvidence::DirectoryOnly;
        for (name, container, why) in [
            ("old", None, "sealed by a gpusnap before they were recorded"),
            (
                "no-layer",
                Some(ContainerRecord {
                    writable_layer: WritableLayerRecord::Unavailable {
                        reason: "a ext4 mount, not an overlay".into(),
                    },
                    ..record()
                }),
                "writable layer was not recorded at the checkpoint (a ext4 mount",
            ),
            (
                "newer",
                Some(ContainerRecord {
                    format: 99,
                    ..record()
                }),
                "made by a newer gpusnap",
            ),
        ] {
            let root = t.path().join(name);
            std::fs::create_dir(&root).unwrap();
            let (dir, _) = sealed_with(&root, container);
            key.sign_dir(&dir).unwrap();
            let msg = refusal(admit(&require, &dir, &none));
            for part in [
                why,
                "does not cover everything",
                "signature_policy = require",
            ] {
                assert!(msg.contains(part), "{part:?} not in: {msg}");
            }
            let warned = admit(&config(SignaturePolicy::Warn, &[&public]), &dir, &none).unwrap();
            assert!(warned.covered.is_none());
        }
        std::fs::create_dir(t.path().join("new")).unwrap();
        let (dir, _) = sealed(&t.path().join("new"));
        key.sign_dir(&dir).unwrap();
        let admitted = admit(&require, &dir, &none).unwrap();
        assert!(matches!(admitted.covered, Some((_, true))));
    }

    #[test]
    fn evidence_from_a_verified_pull_admits_and_warn_and_off_proceed() {
        let t = tempfile::tempdir().unwrap();
        let (_, public) = keypair(t.path(), "a");
        let (dir, _) = sealed(t.path());
        let require = config(SignaturePolicy::Require, &[&public]);
        let pulled = |check| SignatureEvidence::Pulled {
            source: "registry.example/ck:1".into(),
            check,
        };
        admit(
            &require,
            &dir,
            &pulled(SignatureCheck::Verified {
                key: public.display().to_string(),
            }),
        )
        .unwrap();
        let msg = refusal(admit(&require, &dir, &pulled(SignatureCheck::NotChecked)));
        assert!(
            msg.contains("registry.example/ck:1 was pulled without a verified signature"),
            "{msg}"
        );
        admit(
            &config(SignaturePolicy::Warn, &[&public]),
            &dir,
            &SignatureEvidence::DirectoryOnly,
        )
        .unwrap();
        // Off reads nothing: not even a broken key list stops it.
        admit(
            &config(SignaturePolicy::Off, &[Path::new("/nonexistent.pub")]),
            &dir,
            &SignatureEvidence::DirectoryOnly,
        )
        .unwrap();
        let msg = admit(
            &config(SignaturePolicy::Warn, &[Path::new("/nonexistent.pub")]),
            &dir,
            &SignatureEvidence::DirectoryOnly,
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("restore.signature_keys") && msg.contains("/nonexistent.pub"),
            "{msg}"
        );
    }

    #[test]
    fn a_node_record_binds_the_manifest_under_every_policy() {
        let t = tempfile::tempdir().unwrap();
        let (dir, manifest) = sealed(t.path());
        let bytes = std::fs::read(dir.join(gpusnap_checkpoint::layout::MANIFEST_FILE)).unwrap();
        let record = |digest: String| SignatureEvidence::NodeRecord {
            record: t.path().join("record.json"),
            manifest_sha256: digest,
        };
        let off = config(SignaturePolicy::Off, &[]);
        let admitted = admit(
            &off,
            &dir,
            &record(gpusnap_checkpoint::node_origin::sha256_hex(&bytes)),
        )
        .unwrap();
        admitted.bind(&manifest).unwrap();
        let mut other = manifest.clone();
        other.container_id = "c2".into();
        let msg = admitted.bind(&other).unwrap_err().to_string();
        assert!(msg.contains("not the one this node recorded"), "{msg}");
        let msg = refusal(admit(&off, &dir, &record("00".repeat(32))));
        assert!(
            msg.contains("modified after this node sealed or adopted it")
                && msg.contains("record.json"),
            "{msg}"
        );
    }

    #[test]
    fn the_node_signer_refuses_a_key_others_can_read() {
        let t = tempfile::tempdir().unwrap();
        let (private, _) = keypair(t.path(), "node");
        let mut c = Config::default();
        assert!(node_signer(&c).unwrap().is_none());
        c.checkpoint.signing_key = Some(private.clone());
        assert!(node_signer(&c).unwrap().is_some());
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o640)).unwrap();
        let msg = node_signer(&c).unwrap_err().to_string();
        assert!(
            msg.contains("checkpoint.signing_key") && msg.contains("chmod 600"),
            "{msg}"
        );
    }
}
