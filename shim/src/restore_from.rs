//! Restore requested by a pod annotation, `gpusnap.io/restore-from[.CONTAINER]: NAME`, for
//! clusters whose containerd cannot restore through CRI (2.2/2.3 disable it by default, 2.4
//! removed it). The shim then restores that checkpoint in Start instead of starting the
//! container fresh.
//!
//! The resolution (a name beneath `restore.checkpoint_root`, what vouches for it, its rootfs
//! diff) is the transaction's, shared with gpusnap-runc
//! (`gpusnap_transaction::restore_source::by_name`); this converts its answer into the
//! shim's pending restore.

use std::collections::HashMap;

use gpusnap_config::Config;
use gpusnap_transaction::restore_source::{by_name, RestoreSource};

use crate::state::PendingRestore;

/// The restore a container's annotations ask for, if any.
pub fn pending_restore(
    annotations: &HashMap<String, String>,
    config: &Config,
) -> Result<Option<PendingRestore>, String> {
    by_name::resolve(annotations, config)
        .map(|r| r.map(pending))
        .map_err(|e| e.to_string())
}

/// The shim's pending restore of a resolved source (no parent: a pod names one checkpoint).
pub fn pending(source: RestoreSource) -> PendingRestore {
    PendingRestore {
        image: source.image,
        parent: None,
        rootfs_diff: source.rootfs_diff,
        signature_evidence: source.signature_evidence,
        volume: source.volume,
    }
}
