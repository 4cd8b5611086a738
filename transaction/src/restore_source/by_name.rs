//! Restore requested by name, for clusters whose runtime cannot restore through CRI
//! (containerd 2.2/2.3 disable it by default, 2.4 removed it; CRI-O's needs a checkpoint
//! archive as the container's image).
//!
//! The pod carries `gpusnap.io/restore-from: NAME` (or `gpusnap.io/restore-from.CONTAINER:
//! NAME` when the pod has several containers). NAME is a checkpoint made available on the
//! node under `restore.checkpoint_root` (`gpusnap image pull REF --extract <root>/NAME` puts
//! it there, digests verified; or this node sealed or adopted it). A name, not a path: a pod
//! must not be able to point gpusnap, which runs as root, at arbitrary host files.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::node_origin::NodeRecordError;
use gpusnap_checkpoint::origin::{FileDigest, Origin, OriginError};
use gpusnap_checkpoint::{beneath, layout, node_origin};
use gpusnap_config::{Config, RESTORE_FROM_ANNOTATION};

use super::RestoreSource;
use crate::restore::RootfsDiff;
use crate::signature::SignatureEvidence;

const CHECKPOINT_SUBDIR: &str = "checkpoint";
const ROOTFS_DIFF: &str = "rootfs-diff.tar";

/// Why the checkpoint an annotation names cannot be restored. `key` is the annotation.
#[derive(Debug, thiserror::Error)]
pub enum ByNameError {
    #[error(
        "annotation {key}: {name:?} is not a checkpoint name (letters, digits, '.', '_', '-', \
         not .gpusnap-*); it names a directory under {}",
        root.display()
    )]
    NotAName {
        key: String,
        name: String,
        root: PathBuf,
    },
    #[error(
        "annotation {key} asks to restore checkpoint {name:?}, but {} does not exist on this \
         node; pull it first (`gpusnap image pull <image> --extract {name}`), or checkpoint \
         into it on this node",
        dir.display()
    )]
    Missing {
        key: String,
        name: String,
        dir: PathBuf,
    },
    #[error(
        "annotation {key}: {} cannot be used as a checkpoint ({source}); a checkpoint under {} \
         must be a plain directory, not a symlink",
        dir.display(),
        root.display()
    )]
    NotAPlainDirectory {
        key: String,
        dir: PathBuf,
        root: PathBuf,
        source: io::Error,
    },
    #[error(
        "annotation {key}: {} has {ROOTFS_DIFF}, but its {what} does not list it: it was added \
         afterwards; {again}",
        dir.display()
    )]
    DiffNotListed {
        key: String,
        dir: PathBuf,
        what: &'static str,
        again: &'static str,
    },
    #[error("annotation {key}: {} cannot be used ({source})", path.display())]
    DiffUnusable {
        key: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("annotation {key}: {source}")]
    NodeRecord {
        key: String,
        source: NodeRecordError,
    },
    #[error(
        "annotation {key}: the manifest of {} cannot be read ({source}); it is not a complete \
         gpusnap checkpoint",
        dir.display()
    )]
    ManifestUnreadable {
        key: String,
        dir: PathBuf,
        source: io::Error,
    },
    #[error(
        "annotation {key}: {} was modified after this node sealed or adopted it: its manifest \
         has SHA-256 {now}, {} records {recorded}; take the checkpoint again, or verify and \
         adopt it as it is now (`gpusnap checkpoint adopt {}`)",
        dir.display(),
        record.display(),
        dir.display()
    )]
    Modified {
        key: String,
        dir: PathBuf,
        record: PathBuf,
        recorded: String,
        now: String,
    },
    #[error(
        "annotation {key}: {} was neither sealed by this node's gpusnap nor put here by \
         `gpusnap image pull --extract` ({} is missing, and {} holds no record of it), so what \
         it holds was never verified — pull it with gpusnap, or verify and adopt it as root \
         (`gpusnap checkpoint adopt {}`)",
        dir.display(),
        dir.join(layout::ORIGIN_FILE).display(),
        records.display(),
        dir.display()
    )]
    Unverified {
        key: String,
        dir: PathBuf,
        records: PathBuf,
    },
    #[error("annotation {key}: {source}")]
    Origin { key: String, source: OriginError },
}

/// The checkpoint a container's `gpusnap.io/restore-from` annotation names, if any.
pub fn resolve(
    annotations: &HashMap<String, String>,
    config: &Config,
) -> Result<Option<RestoreSource>, ByNameError> {
    let Some((key, name)) = super::annotation(annotations, RESTORE_FROM_ANNOTATION) else {
        return Ok(None);
    };
    let root = &config.restore.checkpoint_root;
    if !layout::is_checkpoint_name(name) {
        return Err(ByNameError::NotAName {
            key,
            name: name.to_owned(),
            root: root.clone(),
        });
    }
    let dir = root.join(name);
    let missing = |key: String| ByNameError::Missing {
        key,
        name: name.to_owned(),
        dir: dir.clone(),
    };
    // Beneath the checkpoint root, through no symlink: a name can never reach host files.
    let root_fd = match beneath::open_root(root) {
        Ok(fd) => fd,
        Err(_) => return Err(missing(key)),
    };
    let dir_fd = match beneath::open_dir(root_fd.as_fd(), Path::new(name)) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing(key)),
        Err(source) => {
            return Err(ByNameError::NotAPlainDirectory {
                key,
                dir: dir.clone(),
                root: root.clone(),
                source,
            })
        }
    };
    // A CRI checkpoint archive's layout (`checkpoint/` + `rootfs-diff.tar`), or a plain
    // checkpoint directory.
    let images = beneath::open_dir(dir_fd.as_fd(), Path::new(CHECKPOINT_SUBDIR)).ok();
    let image = match images {
        Some(_) => dir.join(CHECKPOINT_SUBDIR),
        None => dir.clone(),
    };
    let image_fd = images.as_ref().map_or(dir_fd.as_fd(), |fd| fd.as_fd());
    let vouched = vouch(&key, name, root_fd.as_fd(), &dir, dir_fd.as_fd(), image_fd)?;

    let rootfs_diff = match beneath::open_file(dir_fd.as_fd(), Path::new(ROOTFS_DIFF)) {
        Ok(_) if image == dir => None,
        Ok(_) => {
            let Some(recorded) = vouched.rootfs_diff.as_ref() else {
                return Err(ByNameError::DiffNotListed {
                    key,
                    dir,
                    what: vouched.what,
                    again: vouched.again,
                });
            };
            Some(RootfsDiff {
                path: dir.join(ROOTFS_DIFF),
                sha256: recorded.sha256.clone(),
                content_bytes: recorded.content_bytes,
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(ByNameError::DiffUnusable {
                key,
                path: dir.join(ROOTFS_DIFF),
                source,
            })
        }
    };
    Ok(Some(RestoreSource {
        image,
        rootfs_diff,
        signature_evidence: vouched.evidence,
        volume: None,
    }))
}

/// What vouches for a checkpoint under the root, and what it says.
struct Vouched {
    evidence: SignatureEvidence,
    rootfs_diff: Option<FileDigest>,
    /// The record's kind, for messages.
    what: &'static str,
    /// What to do when the checkpoint does not match it.
    again: &'static str,
}

/// The record that makes checkpoint `name` restorable: this node's own (sealed here or
/// adopted by root) when it matches the manifest now in the checkpoint, else the origin record
/// of `gpusnap image pull --extract`. A node record that no longer matches (the checkpoint
/// was modified after sealing) refuses the restore when no pull vouches for the directory.
fn vouch(
    key: &str,
    name: &str,
    root: BorrowedFd<'_>,
    dir: &Path,
    dir_fd: BorrowedFd<'_>,
    image_fd: BorrowedFd<'_>,
) -> Result<Vouched, ByNameError> {
    let root_shown = dir.parent().unwrap_or(dir);
    let node =
        node_origin::lookup(root, root_shown, name).map_err(|source| ByNameError::NodeRecord {
            key: key.to_owned(),
            source,
        })?;
    let stale = match node {
        Some((record, path)) => {
            let now = node_origin::manifest_sha256_at(image_fd).map_err(|source| {
                ByNameError::ManifestUnreadable {
                    key: key.to_owned(),
                    dir: dir.to_path_buf(),
                    source,
                }
            })?;
            if now == record.manifest_sha256 {
                return Ok(Vouched {
                    evidence: SignatureEvidence::NodeRecord {
                        record: path,
                        manifest_sha256: record.manifest_sha256,
                    },
                    rootfs_diff: record.rootfs_diff,
                    what: "node record",
                    again: "adopt it again (`gpusnap checkpoint adopt`)",
                });
            }
            Some((path, record.manifest_sha256, now))
        }
        None => None,
    };
    match Origin::read_at(dir_fd, dir) {
        Ok(origin) => Ok(Vouched {
            // What the pull found of the image's signature; the restore transaction decides
            // the node's signature policy on it and on the checkpoint's own signature, as for
            // every other door.
            evidence: SignatureEvidence::Pulled {
                source: origin.source.clone(),
                check: origin.signature.clone(),
            },
            rootfs_diff: origin.rootfs_diff,
            what: "origin record",
            again: "pull it again",
        }),
        Err(OriginError::Missing(_)) => Err(match stale {
            Some((record, recorded, now)) => ByNameError::Modified {
                key: key.to_owned(),
                dir: dir.to_path_buf(),
                record,
                recorded,
                now,
            },
            None => ByNameError::Unverified {
                key: key.to_owned(),
                dir: dir.to_path_buf(),
                records: root_shown.join(layout::NODE_RECORDS_DIR),
            },
        }),
        Err(source) => Err(ByNameError::Origin {
            key: key.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore_source::{
        CONTAINERD_NAME as CONTAINER_NAME, CONTAINERD_TYPE as CONTAINER_TYPE,
    };
    use gpusnap_checkpoint::origin::{SignatureCheck, ORIGIN_FORMAT};

    /// The resolution, its refusal as the message a front end shows.
    fn pending_restore(
        annotations: &HashMap<String, String>,
        config: &Config,
    ) -> Result<Option<RestoreSource>, String> {
        resolve(annotations, config).map_err(|e| e.to_string())
    }

    fn config(root: &Path) -> Config {
        let mut c = Config::default();
        c.restore.checkpoint_root = root.to_path_buf();
        c
    }

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn origin(dir: &Path, diff: Option<&[u8]>, signature: SignatureCheck) {
        std::fs::create_dir_all(dir).unwrap();
        let rootfs_diff = diff.map(|d| {
            std::fs::write(dir.join(ROOTFS_DIFF), d).unwrap();
            FileDigest {
                size: d.len() as u64,
                sha256: gpusnap_checkpoint::rootfs_diff::sha256_file(&dir.join(ROOTFS_DIFF))
                    .unwrap(),
                content_bytes: None,
            }
        });
        Origin {
            format: ORIGIN_FORMAT,
            source: "test".into(),
            manifest_digest: "sha256:00".into(),
            pinned: true,
            signature,
            rootfs_diff,
        }
        .write(dir)
        .unwrap();
    }

    #[test]
    fn no_annotation_means_a_fresh_start() {
        let root = tempfile::tempdir().unwrap();
        assert!(pending_restore(&ann(&[]), &config(root.path()))
            .unwrap()
            .is_none());
    }

    #[test]
    fn archive_layout_and_per_container_names() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("ck1/checkpoint")).unwrap();
        origin(
            &root.path().join("ck1"),
            Some(b"diff"),
            SignatureCheck::NotChecked,
        );
        origin(&root.path().join("plain"), None, SignatureCheck::NotChecked);
        let c = config(root.path());
        let r = pending_restore(
            &ann(&[
                ("gpusnap.io/restore-from", "plain"),
                ("gpusnap.io/restore-from.app", "ck1"),
                (CONTAINER_NAME, "app"),
            ]),
            &c,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            r.image,
            root.path().join("ck1/checkpoint"),
            "per-container name wins"
        );
        let diff = r.rootfs_diff.unwrap();
        assert_eq!(diff.path, root.path().join("ck1/rootfs-diff.tar"));
        assert_eq!(diff.sha256.len(), 64, "the digest recorded at pull");
        let r = pending_restore(
            &ann(&[
                ("gpusnap.io/restore-from", "plain"),
                (CONTAINER_NAME, "web"),
            ]),
            &c,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.image, root.path().join("plain"));
        assert!(r.rootfs_diff.is_none());
        let sandbox = ann(&[
            ("gpusnap.io/restore-from", "plain"),
            (CONTAINER_TYPE, "sandbox"),
        ]);
        assert!(
            pending_restore(&sandbox, &c).unwrap().is_none(),
            "the pause container starts fresh"
        );
    }

    #[test]
    fn paths_symlinks_unverified_and_missing_checkpoints_are_refused_clearly() {
        let root = tempfile::tempdir().unwrap();
        let c = config(root.path());
        for bad in ["../etc", "/etc/passwd", "a/b", "", ".."] {
            let err = pending_restore(&ann(&[("gpusnap.io/restore-from", bad)]), &c).unwrap_err();
            assert!(err.contains("is not a checkpoint name"), "{bad}: {err}");
        }
        let err = pending_restore(&ann(&[("gpusnap.io/restore-from", "absent")]), &c).unwrap_err();
        assert!(
            err.contains("does not exist on this node") && err.contains("gpusnap image pull"),
            "{err}"
        );
        // A name that is a symlink inside the checkpoint root is not followed.
        let host = tempfile::tempdir().unwrap();
        origin(host.path(), None, SignatureCheck::NotChecked);
        std::os::unix::fs::symlink(host.path(), root.path().join("link")).unwrap();
        let err = pending_restore(&ann(&[("gpusnap.io/restore-from", "link")]), &c).unwrap_err();
        assert!(err.contains("not a symlink"), "{err}");
        // Not put there by gpusnap image pull: never verified.
        std::fs::create_dir_all(root.path().join("handmade/checkpoint")).unwrap();
        let err =
            pending_restore(&ann(&[("gpusnap.io/restore-from", "handmade")]), &c).unwrap_err();
        assert!(err.contains("gpusnap-origin.json is missing"), "{err}");
        // A rootfs diff the record does not list.
        origin(&root.path().join("added"), None, SignatureCheck::NotChecked);
        std::fs::create_dir_all(root.path().join("added/checkpoint")).unwrap();
        std::fs::write(root.path().join("added/rootfs-diff.tar"), b"x").unwrap();
        let err = pending_restore(&ann(&[("gpusnap.io/restore-from", "added")]), &c).unwrap_err();
        assert!(err.contains("does not list it"), "{err}");
    }

    /// A checkpoint directory with a manifest (its bytes are all the door reads of it).
    fn sealed_here(root: &Path, name: &str, manifest: &[u8]) -> std::path::PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("gpusnap-manifest.json"), manifest).unwrap();
        let record = node_origin::NodeRecord::new(
            name,
            node_origin::sha256_hex(manifest),
            node_origin::How::Sealed {
                writer: "test".into(),
                container_id: "c".into(),
            },
            node_origin::RecordedSignature::NotChecked,
        );
        node_origin::record(root, &record).unwrap()
    }

    #[test]
    fn the_nodes_own_checkpoints_are_vouched_for_by_its_record_until_modified() {
        let root = tempfile::tempdir().unwrap();
        let c = config(root.path());
        let record = sealed_here(root.path(), "mine", b"{\"kind\":1}");
        let r = pending_restore(&ann(&[("gpusnap.io/restore-from", "mine")]), &c)
            .unwrap()
            .unwrap();
        assert_eq!(r.image, root.path().join("mine"));
        assert_eq!(
            r.signature_evidence,
            SignatureEvidence::NodeRecord {
                record,
                manifest_sha256: node_origin::sha256_hex(b"{\"kind\":1}"),
            }
        );
        // Modified after sealing: another manifest.
        std::fs::write(root.path().join("mine/gpusnap-manifest.json"), b"{}").unwrap();
        let err = pending_restore(&ann(&[("gpusnap.io/restore-from", "mine")]), &c).unwrap_err();
        assert!(
            err.contains("modified after this node sealed or adopted it")
                && err.contains("gpusnap checkpoint adopt"),
            "{err}"
        );
        // The records' directory is not a checkpoint.
        let err =
            pending_restore(&ann(&[("gpusnap.io/restore-from", ".gpusnap-node")]), &c).unwrap_err();
        assert!(err.contains("is not a checkpoint name"), "{err}");
        // A record planted inside a checkpoint directory is nobody's record.
        std::fs::create_dir_all(root.path().join("planted/.gpusnap-node")).unwrap();
        std::fs::write(root.path().join("planted/gpusnap-manifest.json"), b"{}").unwrap();
        let err = pending_restore(&ann(&[("gpusnap.io/restore-from", "planted")]), &c).unwrap_err();
        assert!(err.contains("neither sealed by this node"), "{err}");
    }

    #[test]
    fn the_pulls_signature_check_goes_to_the_transaction() {
        // The policy is the restore transaction's (transaction/src/signature.rs); this door
        // only passes on what the pull recorded, whatever the policy.
        let root = tempfile::tempdir().unwrap();
        let verified = SignatureCheck::Verified {
            key: "/etc/gpusnap/cosign.pub".into(),
        };
        origin(&root.path().join("signed"), None, verified.clone());
        origin(
            &root.path().join("unsigned"),
            None,
            SignatureCheck::NotChecked,
        );
        let mut c = config(root.path());
        c.restore.signature_policy = gpusnap_config::SignaturePolicy::Require;
        let evidence = |name| {
            pending_restore(&ann(&[("gpusnap.io/restore-from", name)]), &c)
                .unwrap()
                .unwrap()
                .signature_evidence
        };
        assert_eq!(
            evidence("signed"),
            SignatureEvidence::Pulled {
                source: "test".into(),
                check: verified
            }
        );
        assert_eq!(
            evidence("unsigned"),
            SignatureEvidence::Pulled {
                source: "test".into(),
                check: SignatureCheck::NotChecked
            }
        );
    }
}
