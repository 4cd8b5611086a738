//! Where a node-local checkpoint came from: `gpusnap-origin.json`, written by
//! `gpusnap image pull --extract` (or `gpusnap image extract`) beside what it extracted, and
//! read by a restore by pod annotation (`gpusnap.io/restore-from`).
//!
//! It records what was verified when the checkpoint was put on the node — the image manifest
//! digest every blob was checked against, whether a signature was checked and by which key —
//! and the SHA-256 of the files outside the sealed gpusnap manifest's reach (the rootfs diff,
//! which the container runtime writes after gpusnap sealed the checkpoint). The restore checks
//! the rootfs diff against it before reading a byte of it, and the node's signature policy
//! against the recorded signature. The checkpoint root is root-only (0700), so the record is
//! as trusted as the node.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The record's file name, at the root of an extracted checkpoint.
pub const ORIGIN_FILE: &str = "gpusnap-origin.json";
/// The format this build writes and reads.
pub const ORIGIN_FORMAT: u32 = 1;
/// A record is a few hundred bytes; one larger than this is not a record.
const ORIGIN_MAX_BYTES: u64 = 64 << 10;

/// Size and SHA-256 (hex) of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub size: u64,
    pub sha256: String,
}

/// Whether an image's signature was checked when it was put on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum SignatureCheck {
    /// A cosign signature of the image manifest digest verified with this public key.
    Verified { key: String },
    /// The node's policy did not ask for one.
    NotChecked,
    /// The policy warned: no valid signature was found.
    Missing { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Origin {
    pub format: u32,
    /// The reference it was pulled by (`host/repo:tag` or `host/repo@sha256:...`), or the
    /// local OCI layout.
    pub source: String,
    /// The image manifest digest every blob and the gpusnap manifest were verified against.
    pub manifest_digest: String,
    /// The reference itself named that digest (a pull by digest).
    pub pinned: bool,
    pub signature: SignatureCheck,
    /// `rootfs-diff.tar`, when the checkpoint has one.
    pub rootfs_diff: Option<FileDigest>,
}

#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    #[error(
        "{} is missing: this checkpoint was not put on the node by `gpusnap image pull \
         --extract`, so what it holds was never verified — pull it with gpusnap"
    , .0.display())]
    Missing(PathBuf),
    #[error("{} is not a valid origin record ({reason}); pull the checkpoint again", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl Origin {
    /// Reads the record from the opened checkpoint directory `dir` (no symlink is followed).
    pub fn read_at(dir: std::os::fd::BorrowedFd<'_>, shown: &Path) -> Result<Origin, OriginError> {
        let path = shown.join(ORIGIN_FILE);
        let file = match crate::beneath::open_file(dir, Path::new(ORIGIN_FILE)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(OriginError::Missing(path))
            }
            Err(source) => return Err(OriginError::Io { path, source }),
        };
        let mut text = Vec::new();
        file.take(ORIGIN_MAX_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|source| OriginError::Io {
                path: path.clone(),
                source,
            })?;
        if text.len() as u64 > ORIGIN_MAX_BYTES {
            return Err(OriginError::Invalid {
                path,
                reason: format!("larger than {ORIGIN_MAX_BYTES} bytes"),
            });
        }
        let origin: Origin = serde_json::from_slice(&text).map_err(|e| OriginError::Invalid {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if origin.format != ORIGIN_FORMAT {
            return Err(OriginError::Invalid {
                path,
                reason: format!(
                    "format {} (this gpusnap reads {ORIGIN_FORMAT})",
                    origin.format
                ),
            });
        }
        Ok(origin)
    }

    /// Writes the record into `dir`, readable by root only.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(ORIGIN_FILE);
        let tmp = dir.join(format!(".{ORIGIN_FILE}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).map_err(io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn round_trip_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::beneath::open_root(dir.path()).unwrap();
        let err = Origin::read_at(root.as_fd(), dir.path()).unwrap_err();
        assert!(matches!(err, OriginError::Missing(_)), "{err}");
        let o = Origin {
            format: ORIGIN_FORMAT,
            source: "127.0.0.1:5000/ck@sha256:ab".into(),
            manifest_digest: "sha256:ab".into(),
            pinned: true,
            signature: SignatureCheck::Verified {
                key: "/etc/gpusnap/cosign.pub".into(),
            },
            rootfs_diff: Some(FileDigest {
                size: 3,
                sha256: "00".into(),
            }),
        };
        o.write(dir.path()).unwrap();
        assert_eq!(Origin::read_at(root.as_fd(), dir.path()).unwrap(), o);
        std::fs::write(dir.path().join(ORIGIN_FILE), vec![b' '; 70 << 10]).unwrap();
        assert!(Origin::read_at(root.as_fd(), dir.path()).is_err());
        std::fs::remove_file(dir.path().join(ORIGIN_FILE)).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join(ORIGIN_FILE)).unwrap();
        assert!(
            Origin::read_at(root.as_fd(), dir.path()).is_err(),
            "a symlinked record is not followed"
        );
    }
}
