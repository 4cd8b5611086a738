//! Restore requested by the pod's annotations, for clusters whose containerd cannot restore
//! through CRI (2.2/2.3 disable it by default, 2.4 removed it): `gpusnap.io/restore-from
//! [.CONTAINER]: NAME`, a checkpoint under `restore.checkpoint_root`, or
//! `gpusnap.io/restore-from-volume[.CONTAINER]: MOUNT_PATH`, a checkpoint image the pod
//! mounts as an image volume. The shim then restores that checkpoint in Start instead of
//! starting the container fresh.
//!
//! Which checkpoint the annotations name, and refusing every other, is the transaction's
//! (`gpusnap_transaction::restore_source`), shared with gpusnap-runc; this converts its answer
//! into the shim's pending restore.

use std::collections::HashMap;

use gpusnap_config::Config;
use gpusnap_transaction::bundle_spec::BundleSpec;
use gpusnap_transaction::restore_source::{self, RestoreSource, RestoreSourceError, SpecMount};

use crate::state::PendingRestore;

/// The restore a container's annotations ask for, if any, checked against its spec's mounts
/// (a spec the types refuse has none: an image volume is then not found, and refused).
pub fn pending_restore(
    spec: Option<&BundleSpec>,
    annotations: &HashMap<String, String>,
    config: &Config,
) -> Result<Option<PendingRestore>, RestoreSourceError> {
    let mounts = spec.map(SpecMount::of).unwrap_or_default();
    restore_source::resolve(annotations, &mounts, config).map(|r| r.map(pending))
}

/// The shim's pending restore of a resolved source (no parent: a pod names one checkpoint).
fn pending(source: RestoreSource) -> PendingRestore {
    PendingRestore {
        image: source.image,
        parent: None,
        rootfs_diff: source.rootfs_diff,
        signature_evidence: source.signature_evidence,
        volume: source.volume,
    }
}
