//! Restore from a checkpoint image the pod mounts as an image volume (Kubernetes
//! `volumes[].image`, KEP-4639), `gpusnap.io/restore-from-volume[.CONTAINER]: MOUNT_PATH`.
//!
//! Finding containerd's image-volume mount in the spec, and refusing any other, is the
//! transaction's (`gpusnap_transaction::restore_source::by_volume`), shared with
//! gpusnap-runc; the copy into the node's cache at Start is `gpusnap_transaction::volume`.
//! This converts the answer into the shim's pending restore.

use std::collections::HashMap;

use gpusnap_config::Config;
use gpusnap_transaction::restore_source::{by_volume, SpecMount};

use crate::state::PendingRestore;

/// The annotation (key, value) asking this container to restore from a volume, if any: the
/// container's own wins over the pod's.
pub fn requested(annotations: &HashMap<String, String>) -> Option<(String, &str)> {
    by_volume::requested(annotations)
}

/// The restore a container's annotations ask for from an image volume, if any, checked
/// against the container's spec (its mounts) at Create.
pub fn pending_restore(
    spec: Option<&serde_json::Value>,
    annotations: &HashMap<String, String>,
    config: &Config,
) -> Result<Option<PendingRestore>, String> {
    if requested(annotations).is_none() {
        return Ok(None);
    }
    by_volume::resolve(annotations, &SpecMount::list(spec), config)
        .map(|r| r.map(crate::restore_from::pending))
        .map_err(|e| e.to_string())
}
