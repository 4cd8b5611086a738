//! The container's root filesystem: the mounts containerd hands over at Create.

use std::path::{Path, PathBuf};

use containerd_shim::protos::api::Mount;

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount {source_} ({kind}) on {}: {error}", target.display())]
    Mount {
        source_: String,
        kind: String,
        target: PathBuf,
        error: Box<containerd_shim::Error>,
    },
}

impl From<RootfsError> for crate::errors::Error {
    fn from(e: RootfsError) -> Self {
        crate::errors::internal(e.to_string())
    }
}

/// Mounts the rootfs containerd handed over (usually one overlay mount) at `<bundle>/rootfs`;
/// whether there was anything to mount.
pub fn mount_rootfs(bundle: &Path, mounts: &[Mount]) -> Result<bool, RootfsError> {
    if mounts.is_empty() {
        return Ok(false);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target).map_err(|source| RootfsError::Create {
        path: target.clone(),
        source,
    })?;
    for m in mounts {
        containerd_shim::mount::mount_rootfs(Some(&m.type_), Some(&m.source), &m.options, &target)
            .map_err(|error| RootfsError::Mount {
                source_: m.source.clone(),
                kind: m.type_.clone(),
                target: target.clone(),
                error: Box::new(error),
            })?;
    }
    Ok(true)
}

pub fn unmount_rootfs(bundle: &Path) {
    let target = bundle.join("rootfs");
    if let Err(e) = containerd_shim::mount::umount_recursive(target.to_str(), 0) {
        tracing::warn!(path = %target.display(), error = %e, "unmounting rootfs failed");
    }
}
