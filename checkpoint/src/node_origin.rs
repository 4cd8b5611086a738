//! The node's own record of the checkpoints it sealed (the shim's or gpusnap-runc's checkpoint
//! into `restore.checkpoint_root`) or that root adopted (`gpusnap checkpoint adopt`), which
//! `gpusnap.io/restore-from` accepts as it accepts a verified pull (`origin.rs`).
//!
//! Where it lives: `<checkpoint_root>/.gpusnap-node/<sha256 of NAME>.json`, never inside the
//! checkpoint directory. A checkpoint directory's content may come from elsewhere (copied in,
//! unpacked from an archive, pulled), so a record inside it could travel with a hostile tree;
//! this directory is written only here, created 0700 by root, and a record is believed only
//! when that directory and the record file are owned by root and writable by nobody else. So
//! nobody without root can forge one, and no tree can bring one. A record names the checkpoint
//! (`NAME`, its directory under the root) and the SHA-256 of its sealed manifest: a checkpoint
//! changed after sealing (another manifest) no longer matches, and one with the same manifest
//! is verified against it, file by file, at every restore.
//!
//! Why not a MAC with a node key: a key is one more secret to provision and rotate, and a
//! record signed by it would still be a file in a tree others may write; the root-only
//! directory beside the checkpoints needs nothing but the checkpoint root's own ownership.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode};
use serde::{Deserialize, Serialize};

use crate::layout::{
    is_checkpoint_name, CappedReadError, MANIFEST_FILE, MANIFEST_MAX_BYTES, NODE_RECORDS_DIR,
    NODE_RECORD_MAX_BYTES,
};
use crate::origin::FileDigest;

/// The format this build writes and reads.
pub const RECORD_FORMAT: u32 = 1;

/// How the checkpoint came to be this node's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum How {
    /// Sealed by this node's gpusnap (the shim or gpusnap-runc) from a container it ran.
    Sealed {
        /// The program that sealed it (`containerd-shim-gpusnap-v2`, `gpusnap-runc`).
        writer: String,
        container_id: String,
    },
    /// Verified and recorded by root with `gpusnap checkpoint adopt`.
    Adopted {
        /// The user that adopted it (root).
        uid: u32,
    },
}

/// The checkpoint's signature when it was recorded; the restore applies the node's policy to
/// the directory signature again, whatever this says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum RecordedSignature {
    /// Sealed and signed at once with the node's `checkpoint.signing_key` (this private key).
    Signed { key: String },
    /// Adopted: the directory signature verified with this trusted public key.
    Verified { key: String },
    /// Not signed at seal (no `checkpoint.signing_key`), or adopted with the policy off.
    NotChecked,
    /// Adopted under `warn` without a verified signature.
    Missing { reason: String },
}

/// One checkpoint this node sealed or adopted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRecord {
    pub format: u32,
    /// The checkpoint's directory name under the checkpoint root.
    pub name: String,
    /// SHA-256 (hex) of `gpusnap-manifest.json` as sealed or adopted.
    pub manifest_sha256: String,
    /// When it was recorded (seconds since the epoch).
    pub recorded_at: u64,
    pub how: How,
    pub signature: RecordedSignature,
    /// `rootfs-diff.tar` of an adopted archive layout (`checkpoint/` + the diff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_diff: Option<FileDigest>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeRecordError {
    #[error(
        "{} is not this node's record: {why}; only root may write there (the records of \
         checkpoints this node sealed or adopted) — remove it and adopt the checkpoint again \
         (`gpusnap checkpoint adopt`)",
        path.display()
    )]
    NotRootOnly { path: PathBuf, why: String },
    #[error("{} is not a valid node record ({reason}); adopt the checkpoint again (`gpusnap checkpoint adopt`)", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl NodeRecord {
    /// A record of `name` with its manifest's digest, stamped now.
    pub fn new(
        name: &str,
        manifest_sha256: String,
        how: How,
        signature: RecordedSignature,
    ) -> Self {
        NodeRecord {
            format: RECORD_FORMAT,
            name: name.to_owned(),
            manifest_sha256,
            recorded_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            how,
            signature,
            rootfs_diff: None,
        }
    }
}

/// The name `dir` has under `root` when it is a directory directly in it (compared by device
/// and inode, so another spelling of the same path, a bind mount or a symlinked root agree);
/// `None` when it lies elsewhere. Both paths are the node's own (its configuration, the
/// runtime's checkpoint path, root's command line).
pub fn name_in_root(root: &Path, dir: &Path) -> io::Result<Option<String>> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Ok(None);
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let same = |a: &rfs::Stat, b: &rfs::Stat| a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    let root_st = match rfs::stat(root) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let parent_st = match rfs::stat(parent) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !same(&parent_st, &root_st) {
        return Ok(None);
    }
    Ok(name
        .to_str()
        .filter(|n| is_checkpoint_name(n))
        .map(str::to_owned))
}

/// SHA-256 (hex) of the manifest in the opened checkpoint directory `dir` (no symlink
/// followed, read capped as every manifest read is).
pub fn manifest_sha256_at(dir: BorrowedFd<'_>) -> io::Result<String> {
    let bytes = crate::beneath::read_capped(dir, Path::new(MANIFEST_FILE), MANIFEST_MAX_BYTES)?;
    Ok(sha256_hex(&bytes))
}

/// SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn record_file(name: &str) -> String {
    format!("{}.json", sha256_hex(name.as_bytes()))
}

/// Refuses an entry that someone other than root (this process's user) owns or may write.
fn root_only(st: &rfs::Stat, path: &Path) -> Result<(), NodeRecordError> {
    let me = rustix::process::geteuid().as_raw();
    let why = if st.st_uid != me {
        format!("owned by uid {}, not {me}", st.st_uid)
    } else if st.st_mode & 0o022 != 0 {
        format!("mode {:o} lets others write it", st.st_mode & 0o7777)
    } else {
        return Ok(());
    };
    Err(NodeRecordError::NotRootOnly {
        path: path.to_path_buf(),
        why,
    })
}

/// Writes `record` into the records' directory of the checkpoint root `root` (created 0700),
/// replacing an earlier record of the same name: a new file created `O_EXCL | O_NOFOLLOW`,
/// renamed over the old one inside the directory's descriptor.
pub fn record(root: &Path, record: &NodeRecord) -> Result<PathBuf, NodeRecordError> {
    let dir_path = root.join(NODE_RECORDS_DIR);
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| NodeRecordError::Io { path, source }
    };
    let root_fd = crate::beneath::open_root(root).map_err(io_err(root))?;
    match rfs::mkdirat(&root_fd, NODE_RECORDS_DIR, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(io_err(&dir_path)(e.into())),
    }
    let dir = crate::beneath::open_dir(root_fd.as_fd(), Path::new(NODE_RECORDS_DIR))
        .map_err(io_err(&dir_path))?;
    root_only(
        &rfs::fstat(&dir).map_err(|e| io_err(&dir_path)(e.into()))?,
        &dir_path,
    )?;
    let name = record_file(&record.name);
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| io_err(&dir_path)(e.into()))?;
    crate::beneath::write_atomically(dir.as_fd(), OsStr::new(&name), &bytes, 0o600)
        .map_err(io_err(&dir_path.join(&name)))?;
    Ok(dir_path.join(name))
}

/// The record of checkpoint `name` in the opened checkpoint root `root` (shown as `shown`):
/// `None` when this node never sealed or adopted a checkpoint of that name. The records'
/// directory and the record must be root's and writable by root only.
pub fn lookup(
    root: BorrowedFd<'_>,
    shown: &Path,
    name: &str,
) -> Result<Option<(NodeRecord, PathBuf)>, NodeRecordError> {
    let dir_path = shown.join(NODE_RECORDS_DIR);
    let dir = match crate::beneath::open_dir(root, Path::new(NODE_RECORDS_DIR)) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(NodeRecordError::Io {
                path: dir_path,
                source,
            })
        }
    };
    let st = rfs::fstat(&dir).map_err(|e| NodeRecordError::Io {
        path: dir_path.clone(),
        source: e.into(),
    })?;
    root_only(&st, &dir_path)?;
    let file_name = record_file(name);
    let path = dir_path.join(&file_name);
    let io_err = |source: io::Error| NodeRecordError::Io {
        path: path.clone(),
        source,
    };
    match rfs::statat(&dir, file_name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io_err(e.into())),
        Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile => {
            return Err(NodeRecordError::NotRootOnly {
                path: path.clone(),
                why: "not a regular file".into(),
            })
        }
        Ok(_) => {}
    }
    let file = crate::beneath::open_file(dir.as_fd(), Path::new(&file_name)).map_err(io_err)?;
    let st = rfs::fstat(&file).map_err(|e| io_err(e.into()))?;
    root_only(&st, &path)?;
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    let invalid = |reason: String| NodeRecordError::Invalid {
        path: path.clone(),
        reason,
    };
    let record: NodeRecord =
        crate::layout::read_json_capped_from(file, &file_name, size, NODE_RECORD_MAX_BYTES)
            .map_err(|e| match e {
                CappedReadError::Io(e) => io_err(e),
                e => invalid(e.to_string()),
            })?;
    if record.format != RECORD_FORMAT {
        return Err(invalid(format!(
            "format {} (this gpusnap reads {RECORD_FORMAT})",
            record.format
        )));
    }
    if record.name != name {
        return Err(invalid(format!(
            "it records {:?}, not {name:?}",
            record.name
        )));
    }
    Ok(Some((record, path)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn sealed(name: &str) -> NodeRecord {
        NodeRecord::new(
            name,
            "ab".repeat(32),
            How::Sealed {
                writer: "gpusnap-runc".into(),
                container_id: "c1".into(),
            },
            RecordedSignature::NotChecked,
        )
    }

    #[test]
    fn records_round_trip_outside_the_checkpoint_and_only_by_name() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("ck")).unwrap();
        let r = sealed("ck");
        let path = record(root.path(), &r).unwrap();
        assert!(path.starts_with(root.path().join(NODE_RECORDS_DIR)));
        let meta = std::fs::metadata(root.path().join(NODE_RECORDS_DIR)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        let fd = crate::beneath::open_root(root.path()).unwrap();
        let (found, _) = lookup(fd.as_fd(), root.path(), "ck").unwrap().unwrap();
        assert_eq!(found, r);
        assert!(lookup(fd.as_fd(), root.path(), "other").unwrap().is_none());
        // A record filed under another name's key is refused, not believed.
        std::fs::copy(
            &path,
            root.path().join(NODE_RECORDS_DIR).join(record_file("x")),
        )
        .unwrap();
        let err = lookup(fd.as_fd(), root.path(), "x").unwrap_err();
        assert!(err.to_string().contains("not \"x\""), "{err}");
    }

    #[test]
    fn records_others_could_write_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let path = record(root.path(), &sealed("ck")).unwrap();
        let fd = crate::beneath::open_root(root.path()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = lookup(fd.as_fd(), root.path(), "ck").unwrap_err();
        assert!(matches!(err, NodeRecordError::NotRootOnly { .. }), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let dir = root.path().join(NODE_RECORDS_DIR);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = lookup(fd.as_fd(), root.path(), "ck").unwrap_err();
        assert!(err.to_string().contains("lets others write"), "{err}");
        // A symlinked records directory is not followed.
        std::fs::remove_dir_all(&dir).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &dir).unwrap();
        assert!(lookup(fd.as_fd(), root.path(), "ck").is_err());
        assert!(record(root.path(), &sealed("ck")).is_err());
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    #[test]
    fn only_direct_children_of_the_root_have_a_name() {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        std::fs::create_dir_all(root.join("ck/sub")).unwrap();
        std::os::unix::fs::symlink(&root, top.path().join("alias")).unwrap();
        assert_eq!(
            name_in_root(&root, &root.join("ck")).unwrap().as_deref(),
            Some("ck")
        );
        assert_eq!(
            name_in_root(&root, &top.path().join("alias/ck"))
                .unwrap()
                .as_deref(),
            Some("ck"),
            "the same directory by another path"
        );
        assert!(name_in_root(&root, &root.join("ck/sub")).unwrap().is_none());
        assert!(name_in_root(&root, &top.path().join("ck"))
            .unwrap()
            .is_none());
        assert!(name_in_root(&root, &root.join(NODE_RECORDS_DIR))
            .unwrap()
            .is_none());
        assert!(name_in_root(&top.path().join("absent"), &root.join("ck"))
            .unwrap()
            .is_none());
    }
}
