//! After a gpusnap-runc killed mid-checkpoint or mid-restore: the next gpusnap-runc call that
//! names the container (`state`, `delete`, `pause`, another `checkpoint`, ...) puts it back
//! first, so CRI-O and Podman see the container as it really is.
//!
//! gpusnap-runc keeps a checkpoint's record in runc's state directory of the container and a
//! restore's in its scratch directory; the repair is the transaction's one rule for every door
//! ([`gpusnap_transaction::repair`]): unsealed images removed, the cgroup frozen or thawed as
//! the caller had it (through cgroupfs when runc no longer leads to it), an orphaned
//! `runc restore` and its CRIU killed, CRIU's yards and runc's state of the id removed. A
//! restore's guard (`guard.rs`) repairs the moment its gpusnap-runc dies; this is for when the
//! guard is gone too.

use std::path::Path;

use gpusnap_transaction::repair::{self, Records};
use gpusnap_transaction::{host::Runc, Direct};

use crate::{Context, SCRATCH_DIR};

/// Repairs every container the command line names (any argument that could be a container id:
/// a stat of each record, nothing more for the others).
pub fn interrupted_operations(ctx: &Context) {
    for arg in ctx.inv.command_args() {
        let Some(id) = arg.to_str() else { continue };
        // A flag, or a path (a bundle, a log): no container id.
        if id.starts_with('-') || !gpusnap_criu_bridge::is_plain_id(id) {
            continue;
        }
        let state_dir = ctx.state_dir(id);
        let records = Records {
            checkpoint_dir: &state_dir,
            scratch_dir: Path::new(SCRATCH_DIR),
            // runc's state (beside the record) names the container's cgroup.
            bundle: None,
        };
        repair::container(&records, &Runc::new(ctx.global(), id, &Direct));
    }
}
