//! A checkpoint sealed into `restore.checkpoint_root` is recorded as this node's
//! (`gpusnap_checkpoint::node_origin`), so that `gpusnap.io/restore-from` restores it without
//! a registry round trip.
//!
//! The record is written after the seal (and the node's signature), before the checkpoint is
//! reported done. A record that cannot be written does not fail the checkpoint: the checkpoint
//! is complete and restorable by every other door; the warning says how to make it restorable
//! by annotation (`gpusnap checkpoint adopt`).

use std::os::fd::AsFd;
use std::path::Path;

use gpusnap_checkpoint::beneath;
use gpusnap_checkpoint::node_origin::{self, How, NodeRecord, RecordedSignature};
use gpusnap_checkpoint::signature::SigningKey;
use gpusnap_config::Config;

/// Records the checkpoint just sealed in `image_dir` when it lies directly under the node's
/// checkpoint root; does nothing elsewhere.
pub(crate) fn record(
    config: &Config,
    image_dir: &Path,
    container_id: &str,
    signer: Option<&SigningKey>,
) {
    let root = &config.restore.checkpoint_root;
    let name = match node_origin::name_in_root(root, image_dir) {
        Ok(Some(name)) => name,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(dir = %image_dir.display(), root = %root.display(), error = %e, "cannot tell whether the checkpoint lies under the checkpoint root; not recorded as this node's");
            return;
        }
    };
    let written = beneath::open_root(image_dir)
        .and_then(|fd| node_origin::manifest_sha256_at(fd.as_fd()))
        .map_err(|e| e.to_string())
        .and_then(|digest| {
            let record = NodeRecord::new(
                &name,
                digest,
                How::Sealed {
                    writer: writer(),
                    container_id: container_id.to_owned(),
                },
                match signer {
                    Some(key) => RecordedSignature::Signed {
                        key: key.path().display().to_string(),
                    },
                    None => RecordedSignature::NotChecked,
                },
            );
            node_origin::record(root, &record).map_err(|e| e.to_string())
        });
    match written {
        Ok(path) => {
            tracing::info!(dir = %image_dir.display(), name, record = %path.display(), "checkpoint recorded as sealed by this node")
        }
        Err(e) => {
            tracing::warn!(dir = %image_dir.display(), name, error = %e, "the checkpoint is sealed but could not be recorded as this node's; `gpusnap checkpoint adopt` it to restore it by pod annotation")
        }
    }
}

/// The program sealing the checkpoint: the shim or gpusnap-runc.
fn writer() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "gpusnap".into())
}
