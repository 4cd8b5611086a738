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

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layout::{CappedReadError, ORIGIN_FILE, ORIGIN_MAX_BYTES};

/// The format this build writes and reads.
pub const ORIGIN_FORMAT: u32 = 1;

/// Size and SHA-256 (hex) of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub size: u64,
    pub sha256: String,
    /// For a rootfs diff: the bytes of file content it holds once decompressed, counted when
    /// it was put on the node (and held to what the image declared). A restore writes no
    /// more than this. Absent in records written before it was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_bytes: Option<u64>,
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
    /// The node requires signatures and the registry had no valid one for the image (`registry`
    /// says why), but the extracted checkpoint directory's own signature
    /// (`gpusnap-manifest.json.sig`) verified with this key, over a manifest that records
    /// everything that shapes the restored container, before the checkpoint was put in place.
    /// A restore checks that signature again.
    DirectoryVerified { key: String, registry: String },
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
        let origin: Origin =
            match crate::layout::read_json_capped(dir, ORIGIN_FILE, ORIGIN_MAX_BYTES) {
                Ok(o) => o,
                Err(CappedReadError::Missing) => return Err(OriginError::Missing(path)),
                Err(CappedReadError::Io(source)) => return Err(OriginError::Io { path, source }),
                Err(e) => {
                    return Err(OriginError::Invalid {
                        path,
                        reason: e.to_string(),
                    })
                }
            };
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

    /// Writes the record into the opened directory `dir`, readable by root only: a new
    /// temporary file (`O_CREAT | O_EXCL | O_NOFOLLOW`) renamed over the record inside `dir`
    /// ([`crate::beneath::write_atomically`]), so nothing planted there is written through.
    pub fn write_at(&self, dir: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        crate::beneath::write_atomically(dir, std::ffi::OsStr::new(ORIGIN_FILE), &bytes, 0o600)
    }

    /// [`Origin::write_at`] into the directory `dir`, a path the caller trusts.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        let fd = crate::beneath::open_root(dir)?;
        self.write_at(std::os::fd::AsFd::as_fd(&fd))
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
                content_bytes: Some(0),
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

    #[test]
    fn writing_never_follows_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let sentinel = host.path().join("sentinel");
        std::fs::write(&sentinel, b"host file").unwrap();
        for planted in [ORIGIN_FILE, ".gpusnap-origin.json.tmp"] {
            std::os::unix::fs::symlink(&sentinel, dir.path().join(planted)).unwrap();
        }
        let root = crate::beneath::open_root(dir.path()).unwrap();
        let o = Origin {
            format: ORIGIN_FORMAT,
            source: "s".into(),
            manifest_digest: "sha256:00".into(),
            pinned: false,
            signature: SignatureCheck::NotChecked,
            rootfs_diff: None,
        };
        o.write_at(root.as_fd()).unwrap();
        assert_eq!(std::fs::read(&sentinel).unwrap(), b"host file");
        let meta = std::fs::symlink_metadata(dir.path().join(ORIGIN_FILE)).unwrap();
        assert!(meta.is_file(), "the record replaced the link itself");
        assert_eq!(Origin::read_at(root.as_fd(), dir.path()).unwrap(), o);
    }
}
