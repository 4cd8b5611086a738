//! After a gpusnap-runc killed mid-checkpoint: the next gpusnap-runc call that names the
//! container (`state`, `delete`, `pause`, another `checkpoint`, ...) puts it back first.
//!
//! The checkpoint leaves a record in runc's state directory of the container while it runs
//! ([`InFlight`]); a record whose writer is dead means the checkpoint was interrupted: its
//! unsealed images are removed and the cgroup is frozen or thawed as the caller had it, so
//! CRI-O and Podman see the container as it really is.
//!
//! A gpusnap-runc killed mid-restore leaves a record in its scratch directory. Its guard
//! (`guard.rs`) repairs from it the moment it dies; should the guard be gone too, the next call
//! does: the orphaned `runc restore`, its CRIU and what they restored are killed, CRIU's yards
//! are removed and runc's state of the id is removed (the caller was never told the restore
//! worked), as after any failed restore.

use std::ffi::OsStr;
use std::os::fd::AsFd;

use gpusnap_checkpoint::beneath;
use gpusnap_transaction::inflight::{
    restore_record_name, InFlight, RestoreInFlight, INFLIGHT_FILE,
};
use gpusnap_transaction::{runc::Runc, Direct};

use crate::{Context, SCRATCH_DIR};

/// Repairs every container the command line names (any argument that is the id of a container
/// with a record: a stat each, nothing more for the others).
pub fn interrupted_checkpoints(ctx: &Context) {
    for arg in ctx.inv.command_args() {
        let Some(id) = arg.to_str() else { continue };
        if id.is_empty() || id.starts_with('-') || id.contains('/') || id.starts_with('.') {
            continue;
        }
        let scratch = std::path::Path::new(SCRATCH_DIR);
        // gpusnap-runc's own scratch directory; looked at through its descriptor, never followed.
        let has_restore_record = beneath::open_root(scratch).is_ok_and(|fd| {
            matches!(
                beneath::stat_at(fd.as_fd(), OsStr::new(&restore_record_name(id))),
                Ok(Some(_))
            )
        });
        if has_restore_record {
            if let Some(record) = RestoreInFlight::read(scratch, id) {
                if !record.writer_alive() {
                    record.repair(scratch, &Runc::new(ctx.global(), id, &Direct));
                }
            }
        }
        let dir = ctx.state_dir(id);
        // Looked at and removed through a descriptor of the state directory, never followed.
        let Ok(fd) = beneath::open_root(&dir) else {
            continue;
        };
        let record_name = OsStr::new(INFLIGHT_FILE);
        if !matches!(beneath::stat_at(fd.as_fd(), record_name), Ok(Some(_))) {
            continue;
        }
        let Some(record) = InFlight::read(&dir) else {
            let _ = beneath::unlink_at(fd.as_fd(), record_name);
            continue;
        };
        if record.writer_alive() || record.container_id != id {
            continue;
        }
        let runc = Runc::new(ctx.global(), id, &Direct);
        let alive = runc
            .state()
            .is_some_and(|(pid, status)| pid == record.init_pid && status != "stopped");
        record.repair(&dir, alive.then_some(&runc));
    }
}
