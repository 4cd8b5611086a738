//! References: what holds which blobs, so collection knows what it may remove.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::id::BlobId;

/// Largest reference file read back: a chunked 1 TiB checkpoint of 1 MiB chunks is about a
/// million digests, 72 MiB of JSON; anything past this is not one the store wrote.
pub(crate) const MAX_REF_BYTES: u64 = 256 << 20;

/// One reference: the blobs of an image or checkpoint on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefRecord {
    /// What it is, e.g. `registry.example/ckpt/model@sha256:…` (one record per name).
    pub name: String,
    /// The registry and repository the blobs came from or went to (`host[:port]/repo`), so a
    /// later push to another repository of the same registry can mount them instead of
    /// uploading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The file or directory holding what was pulled; once it is gone (or replaced), the
    /// reference no longer keeps its blobs. None: kept until removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    pub blobs: Vec<BlobId>,
}

/// A file or directory, by path and identity (device, inode and, where the file system records
/// it, birth time: inode numbers are reused), so a new one created under the same path does not
/// keep an old reference alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub birth_ns: Option<u128>,
}

fn birth_ns(path: &Path) -> Option<u128> {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    let st = statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BTIME).ok()?;
    if st.stx_mask & StatxFlags::BTIME.bits() == 0 {
        return None;
    }
    let t = st.stx_btime;
    Some(u128::try_from(t.tv_sec).ok()? * 1_000_000_000 + u128::from(t.tv_nsec))
}

impl Holder {
    /// The holder `path` as it is now (not following a final symlink).
    pub fn of(path: &Path) -> std::io::Result<Holder> {
        let m = std::fs::symlink_metadata(path)?;
        Ok(Holder {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
            birth_ns: birth_ns(path),
        })
    }

    /// Whether the same file or directory is still at its path.
    pub fn alive(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .map(|m| m.dev() == self.dev && m.ino() == self.ino)
            .unwrap_or(false)
            && (self.birth_ns.is_none() || birth_ns(&self.path) == self.birth_ns)
    }
}

impl RefRecord {
    pub fn live(&self) -> bool {
        self.holder.as_ref().is_none_or(Holder::alive)
    }

    /// The record's file name under `refs/`: the hash of its name, so any name is safe.
    pub(crate) fn file_name(name: &str) -> String {
        let h = Sha256::digest(name.as_bytes());
        let mut s: String = h.iter().map(|b| format!("{b:02x}")).collect();
        s.push_str(".json");
        s
    }
}
