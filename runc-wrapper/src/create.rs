//! `gpusnap-runc create` of a container whose spec asks to start from a checkpoint: the pod
//! annotations `gpusnap.io/restore-from[.CONTAINER]: NAME` (a checkpoint under
//! `restore.checkpoint_root`) or `gpusnap.io/restore-from-volume[.CONTAINER]: MOUNT_PATH` (a
//! checkpoint image the container mounts as an image volume), which CRI-O copies from the
//! pod into the container's spec. What they name is resolved by the transaction
//! (`gpusnap_transaction::restore_source`), as for the containerd shim; every other `create`
//! goes to runc unchanged.
//!
//! conmon runs `create --bundle B --pid-file P [--console-socket S] ID` and waits on the pid
//! it reads from P as the init's subreaper, so the restore happens here, not at `start`: the
//! restore transaction runs `runc restore --detach` with the same pid file, console socket and
//! stdio (the restored init becomes conmon's child when runc exits), and the restored container
//! is then frozen and held until `start` (`held.rs`). A refusal or a failed restore leaves
//! nothing running and fails the `create` with the reason, which CRI-O reports as the
//! container's creation error.

use std::path::PathBuf;

use gpusnap_transaction::bundle_spec::{self, SpecAtCreate};
use gpusnap_transaction::restore_source::{self, SpecMount};
use gpusnap_transaction::{Direct, Error, RestoreCommand, RestoreRequest};

use crate::args::CREATE_VALUE_FLAGS;
use crate::{held, Context, SCRATCH_DIR};

pub fn run(ctx: &Context) -> i32 {
    let parsed = ctx.inv.command_parsed(CREATE_VALUE_FLAGS);
    if ctx.inv.wants_help(&parsed) {
        return ctx.exec_runc();
    }
    let [id] = parsed.positionals.as_slice() else {
        return ctx.exec_runc();
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let path = |names: &[&str]| {
        parsed
            .value(names)
            .filter(|v| !v.is_empty())
            .map(|v| cwd.join(v))
    };
    let bundle = path(&["bundle", "b"]).unwrap_or_else(|| cwd.clone());
    // The spec, read once and capped; one runc cannot read is runc's to report. A spec the
    // types refuse still shows its annotations, so that a restore it asks for is refused by
    // name below instead of the container starting fresh.
    let SpecAtCreate { typed, annotations } = SpecAtCreate::read(&bundle);
    if !restore_source::requested(&annotations) {
        return ctx.exec_runc();
    }
    let refuse = |e: &dyn std::fmt::Display| {
        ctx.fail_with(&Error::precondition(format!(
            "cannot create {id} from a checkpoint: {e}; nothing was restored"
        )))
    };
    let config = match ctx.config_for(&bundle) {
        Ok(c) => c,
        Err(e) => return refuse(&e),
    };
    // What a restore cannot honour is refused rather than dropped: runc restore takes no
    // descriptors to pass on, no pidfd socket and no keyring choice.
    let preserved = parsed
        .value(&["preserve-fds"])
        .is_some_and(|n| n.trim() != "0" && !n.is_empty());
    for (unsupported, given) in [
        ("--preserve-fds", preserved),
        ("--pidfd-socket", parsed.value(&["pidfd-socket"]).is_some()),
        ("--no-new-keyring", parsed.is_set(&["no-new-keyring"])),
    ] {
        if given {
            return refuse(&format_args!(
                "{unsupported} cannot be honoured by a restore; create the container without it"
            ));
        }
    }
    let Some(spec) = typed else {
        return refuse(&format_args!(
            "{} is not an OCI runtime spec gpusnap can read (its log says why)",
            bundle_spec::path(&bundle).display()
        ));
    };
    let source = match restore_source::resolve(&annotations, &SpecMount::of(&spec), &config) {
        Ok(Some(s)) => s,
        // The pod's sandbox container: started fresh.
        Ok(None) => return ctx.exec_runc(),
        Err(e) => return refuse(&e),
    };
    let scratch = PathBuf::from(SCRATCH_DIR);
    let Some(work_dir) = held::work_dir(id) else {
        return refuse(&format_args!("{id:?} is not a plain container id"));
    };
    let terminal = spec.terminal();
    let request = RestoreRequest {
        container_id: id.clone(),
        bundle,
        checkpoint_dir: source.image.clone(),
        rootfs_diff: source.rootfs_diff.clone(),
        signature_evidence: source.signature_evidence.clone(),
        checkpoint_mount: None,
        began: None,
        in_place: None,
        runc: ctx.global(),
        config,
        scratch_dir: scratch,
        command: RestoreCommand::Build {
            pid_file: path(&["pid-file"]).unwrap_or_else(|| work_dir.join("init.pid")),
            work_dir,
            console_socket: path(&["console-socket"]),
            no_pivot: parsed.is_set(&["no-pivot"]),
            terminal,
        },
    };
    tracing::info!(id, checkpoint = %source.image.display(), volume = source.volume.is_some(), "create restores from a checkpoint");
    let _guard = crate::guard::start(ctx);
    let restored = restore_source::restore(source.volume.as_deref(), request, &Direct);
    let report = match restored {
        Ok(r) => r,
        Err(e) => return ctx.fail_with(&e),
    };
    hold(ctx, id, report.init_pid)
}

/// Freezes the restored container and marks it held until `start`; one that cannot be held
/// is killed and removed, so that nothing runs that the caller was told failed.
fn hold(ctx: &Context, id: &str, init_pid: u32) -> i32 {
    let state_dir = ctx.state_dir(id);
    let frozen = held::mark(&state_dir)
        .map_err(|e| format!("cannot mark it held in {}: {e}", state_dir.display()))
        .and_then(|()| {
            let out = ctx
                .runc_command(ctx.inv.global_args())
                .args(["pause", id])
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", ctx.runc.display()))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "runc pause failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        });
    match frozen {
        Ok(()) => {
            tracing::info!(id, init_pid, "restored container held frozen until start");
            0
        }
        Err(why) => {
            let runc = |args: &[&str]| {
                ctx.runc_command(ctx.inv.global_args())
                    .args(args)
                    .stdin(std::process::Stdio::null())
                    .output()
            };
            let _ = runc(&["kill", "--all", id, "KILL"]);
            // What the caller is told is what runc did: a delete that failed leaves the
            // restored workload running under the caller's monitor.
            let left = match runc(&["delete", "--force", id]) {
                Ok(out) if out.status.success() => "it was killed and removed".to_owned(),
                Ok(out) => format!(
                    "it may still run: runc delete --force failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => format!("it may still run: cannot run runc delete --force: {e}"),
            };
            ctx.fail(&format!(
                "cannot create {id} from a checkpoint: it was restored (init pid {init_pid}) but \
                 could not be held until start ({why}); {left}"
            ));
            crate::EXIT_REFUSED
        }
    }
}
