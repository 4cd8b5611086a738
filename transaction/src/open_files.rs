//! The files the checkpoint's processes hold open, checked against the root filesystem they
//! are restored onto, before CRIU runs (the rules are in `gpusnap_criu_images::open_files`).
//!
//! Without this, a checkpoint taken without the container's writable layer (`ctr containers
//! checkpoint` without `--rw`, a node-local `ctr tasks checkpoint`) of a process holding a file
//! of that layer open fails inside CRIU, which runc reports as "criu failed: type NOTIFY errno
//! 0". Whether it fails depends on where the process was when it was frozen, so the refusal
//! names the files and what carries them.

use std::path::{Path, PathBuf};

use gpusnap_criu_images::{open_files_in_rootfs, ImageError, Limits};
use oci_spec::runtime::Spec;

/// Files named in a refusal; the rest are counted.
const SHOWN: usize = 5;

/// Why the checkpoint's processes cannot be restored onto this root filesystem. Either way
/// CRIU has not run ("nothing was restored"); whether anything else was changed is for the
/// restore to say (a rootfs diff applied before the check stays).
#[derive(Debug, thiserror::Error)]
pub enum OpenFilesError {
    #[error(
        "the checkpoint's open files cannot be compared with the container's root \
         filesystem: {0}; nothing was restored"
    )]
    Unreadable(#[source] ImageError),
    #[error(
        "the checkpoint's processes hold files open that the container's root filesystem ({}) \
         does not have as they were at the checkpoint: {}. CRIU reopens every open file by its \
         path and cannot restore them; nothing was restored. The checkpoint left the \
         container's writable layer out, or this is not the root filesystem it ran on: take it \
         with the layer (ctr: `ctr containers checkpoint --task --rw`, then `ctr containers \
         restore --rw`; Kubernetes: a CRI checkpoint, whose archive carries it; Podman: an \
         export without --ignore-rootfs), or restore it onto the root filesystem it ran on",
        rootfs.display(),
        named.join("; ")
    )]
    Unmatched {
        rootfs: PathBuf,
        /// The first few files, then how many more.
        named: Vec<String>,
    },
}

/// Refuses a checkpoint whose processes hold files open that `rootfs`, the root filesystem of
/// the container being restored, lacks or has with another type, size or
/// setuid/setgid/sticky bit.
pub fn check(rootfs: &Path, checkpoint_dir: &Path) -> Result<(), OpenFilesError> {
    let started = std::time::Instant::now();
    let found = open_files_in_rootfs(checkpoint_dir, rootfs, Limits::default())
        .map_err(OpenFilesError::Unreadable)?;
    tracing::debug!(
        root_mount = found.root_mount,
        regular_files = found.regular_files,
        compared = found.compared,
        uncompared = found.uncompared,
        unmatched = found.unmatched.len(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "open files compared with the root filesystem"
    );
    if found.unmatched.is_empty() {
        return Ok(());
    }
    let mut named: Vec<String> = found
        .unmatched
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect();
    if found.unmatched.len() > SHOWN {
        named.push(format!("and {} more", found.unmatched.len() - SHOWN));
    }
    Err(OpenFilesError::Unmatched {
        rootfs: rootfs.to_path_buf(),
        named,
    })
}

/// The container's root filesystem: the spec's `root.path`, relative to the bundle unless
/// absolute (containerd writes `rootfs`, CRI-O and Podman an absolute path).
pub(crate) fn rootfs_of(bundle: &Path, spec: &Spec) -> PathBuf {
    let path = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .unwrap_or_else(|| PathBuf::from("rootfs"));
    bundle.join(path)
}
