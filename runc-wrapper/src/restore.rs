//! `gpusnap-runc restore`: runc's command line → the restore transaction, which verifies the
//! image and gates its GPU state before running the caller's own `runc restore`. A guard
//! process (`guard.rs`) watches over it, so that a gpusnap-runc killed mid-restore leaves
//! nothing behind.

use std::path::PathBuf;

use gpusnap_criu_bridge::CgroupsMode;
use gpusnap_transaction::{Direct, Error, RestoreCommand, RestoreRequest};

use crate::args::RESTORE_VALUE_FLAGS;
use crate::{exit_code, Context, SCRATCH_DIR};

pub fn run(ctx: &Context) -> i32 {
    let parsed = ctx.inv.command_parsed(RESTORE_VALUE_FLAGS);
    if ctx.inv.wants_help(&parsed) {
        return ctx.exec_runc();
    }
    let [id] = parsed.positionals.as_slice() else {
        // runc prints the usage error in its own words.
        return ctx.exec_runc();
    };
    // CRI-O and Podman pass their own flags; a cgroup mode other than soft would let CRIU put
    // the restored tasks where cgroup.img says, outside what gpusnap's bound of it covers.
    if let Some(mode) = parsed.value(&["manage-cgroups-mode"]) {
        if mode.parse::<CgroupsMode>() != Ok(CgroupsMode::Soft) {
            return ctx.fail_with(&Error::precondition(format!(
                "cannot restore {id}: --manage-cgroups-mode {mode}: gpusnap restores only with \
                 CRIU's soft cgroup mode, which keeps the restored tasks under the container's \
                 own cgroups (gpusnap bounds cgroup.img for it); drop the flag or pass soft"
            )));
        }
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let path = |names: &[&str]| {
        parsed
            .value(names)
            .filter(|v| !v.is_empty())
            .map(|v| cwd.join(v))
    };
    let image_dir = path(&["image-path"]).unwrap_or_else(|| cwd.join("checkpoint"));
    let criu_log = path(&["work-path"])
        .unwrap_or_else(|| image_dir.clone())
        .join(gpusnap_criu_bridge::RESTORE_LOG);
    let bundle = path(&["bundle", "b"]).unwrap_or_else(|| cwd.clone());
    let config = match ctx.config_for(&bundle) {
        Ok(c) => c,
        Err(e) => {
            return ctx.fail_with(&Error::precondition(format!(
                "cannot restore {id}: {e}; nothing was restored"
            )))
        }
    };
    let request = RestoreRequest {
        container_id: id.clone(),
        bundle,
        checkpoint_dir: image_dir,
        rootfs_diff: None,
        // CRI-O and Podman pass only the directory: its own signature decides.
        signature_evidence: Default::default(),
        checkpoint_mount: None,
        began: None,
        in_place: None,
        runc: ctx.global(),
        config,
        scratch_dir: PathBuf::from(SCRATCH_DIR),
        command: RestoreCommand::Given {
            args: ctx.inv.args.clone(),
            criu_log,
            detach: parsed.is_set(&["detach", "d"]),
        },
    };
    let _guard = crate::guard::start(ctx);
    match gpusnap_transaction::restore(&request, &Direct) {
        Ok(report) => report.foreground_exit.map(exit_code).unwrap_or(0),
        Err(e) => ctx.fail_with(&e),
    }
}
