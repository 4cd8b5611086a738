//! A container `create` restored from a checkpoint (`create.rs`), held frozen until `start`.
//!
//! CRI-O and Podman run the runtime's `create` under conmon, which reads the init's pid from
//! the pid file and is its subreaper; CRI-O then checks with `state` that the container is
//! `created` before it calls `start`. A restore has to happen at `create` (at `start` the
//! restored init would not be the pid conmon waits for), so the restored container is frozen
//! there and marked as held: while the mark exists, `state` shows runc's `paused` as
//! `created`, `start` thaws it, and `kill` and `delete` kill it (it never started) and thaw
//! it so that it goes. The mark lives in runc's state directory of the container, so it goes with
//! runc's state (`delete`).

use std::path::{Path, PathBuf};

use crate::{exit_code, Context, EXIT_NO_RUNC, SCRATCH_DIR};

/// The mark's file in runc's state directory of the container.
const MARK: &str = "gpusnap-held-restore";

/// The mark of a held container.
pub fn mark_path(state_dir: &Path) -> PathBuf {
    state_dir.join(MARK)
}

/// Whether the container of `state_dir` is held.
pub fn is_held(state_dir: &Path) -> bool {
    mark_path(state_dir).is_file()
}

/// Marks the container of `state_dir` held.
pub fn mark(state_dir: &Path) -> std::io::Result<()> {
    std::fs::write(mark_path(state_dir), b"")
}

fn unmark(state_dir: &Path) {
    if let Err(e) = std::fs::remove_file(mark_path(state_dir)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(error = %e, path = %mark_path(state_dir).display(), "cannot remove the held-restore mark");
        }
    }
}

/// The container a `state`, `start`, `kill` or `delete` names, when it is held.
fn held_id(ctx: &Context) -> Option<String> {
    let parsed = ctx.inv.command_parsed(&[]);
    let id = parsed.positionals.first()?;
    // runc's own id rule first: an id runc refuses names no state directory of it.
    gpusnap_criu_bridge::validate_container_id(id).ok()?;
    is_held(&ctx.state_dir(id)).then(|| id.clone())
}

/// Runs the real runc with `args` (the caller's global flags in front), stdio inherited.
fn runc_status(ctx: &Context, args: &[&str]) -> Result<std::process::ExitStatus, i32> {
    ctx.runc_command(ctx.inv.global_args())
        .args(args)
        .status()
        .map_err(|e| {
            ctx.fail(&format!("cannot run {}: {e}", ctx.runc.display()));
            EXIT_NO_RUNC
        })
}

/// `state ID`: runc's state, `paused` shown as `created` while the container is held.
pub fn state(ctx: &Context) -> i32 {
    let Some(id) = held_id(ctx) else {
        return ctx.exec_runc();
    };
    let out = match ctx
        .runc_command(&ctx.inv.args)
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            ctx.fail(&format!("cannot run {}: {e}", ctx.runc.display()));
            return EXIT_NO_RUNC;
        }
    };
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(&out.stderr);
    let shown = match serde_json::from_slice::<serde_json::Value>(&out.stdout) {
        Ok(mut v) if out.status.success() && v["status"] == "paused" => {
            v["status"] = "created".into();
            tracing::debug!(id, "held restored container shown as created");
            let mut shown = serde_json::to_vec_pretty(&v).unwrap_or_else(|_| out.stdout.clone());
            shown.push(b'\n');
            shown
        }
        _ => out.stdout.clone(),
    };
    let _ = std::io::stdout().write_all(&shown);
    exit_code(out.status)
}

/// `start ID`: a held container is thawed (`runc resume`); it already runs its restored
/// processes, so runc's own `start` has nothing to do.
pub fn start(ctx: &Context) -> i32 {
    let Some(id) = held_id(ctx) else {
        return ctx.exec_runc();
    };
    match runc_status(ctx, &["resume", &id]) {
        Ok(s) if s.success() => {
            unmark(&ctx.state_dir(&id));
            tracing::info!(id, "held restored container started (thawed)");
            0
        }
        Ok(s) => {
            ctx.fail(&format!(
                "cannot start {id}: its restored processes could not be thawed (runc resume \
                 exited {})",
                exit_code(s)
            ));
            exit_code(s)
        }
        Err(code) => code,
    }
}

/// `kill [--all] ID [SIGNAL]` of a held container kills it (every process, SIGKILL) and
/// thaws it so that it goes: its processes have not started as far as the caller knows, as a
/// created container's `runc init` dies of the signal before the container's process runs. A
/// frozen task would never handle another signal, and a thawed one would run un-started
/// until the caller's stop timeout. Signal 0 only asks whether it exists: it stays held.
pub fn kill(ctx: &Context) -> i32 {
    let Some(id) = held_id(ctx) else {
        return ctx.exec_runc();
    };
    let signal = ctx.inv.command_parsed(&[]).positionals.get(1).cloned();
    if signal.as_deref() == Some("0") {
        return ctx.exec_runc();
    }
    tracing::info!(
        id,
        signal = signal.as_deref().unwrap_or("SIGTERM"),
        "held restored container killed before its start"
    );
    match runc_status(ctx, &["kill", "--all", &id, "KILL"]) {
        Ok(s) => {
            if s.success() {
                release(ctx, &id);
            }
            exit_code(s)
        }
        Err(code) => code,
    }
}

/// `delete [--force] ID`: a held container is killed and thawed first (its processes exist,
/// unlike a created container's), then runc deletes it as asked.
pub fn delete(ctx: &Context) -> i32 {
    forget_work_dir(ctx);
    let Some(id) = held_id(ctx) else {
        return ctx.exec_runc();
    };
    let _ = runc_status(ctx, &["kill", "--all", &id, "KILL"]);
    release(ctx, &id);
    ctx.exec_runc()
}

/// Where the restores of `create` keep CRIU's work directory (`restore.log`), by container.
const WORK_DIR: &str = "create-restore";

/// The work directory of the restore at `create` of container `id`.
pub fn work_dir(id: &str) -> Option<PathBuf> {
    // runc's own id rule: any other id would not name a directory of ours (runc refuses it).
    gpusnap_criu_bridge::validate_container_id(id)
        .ok()
        .map(|()| PathBuf::from(SCRATCH_DIR).join(WORK_DIR).join(id))
}

/// Removes the work directory of the restore at `create` of container `id`, if any.
fn remove_work_dir(id: &str) {
    if let Some(dir) = work_dir(id) {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(error = %e, dir = %dir.display(), "cannot remove the restore's work directory");
            }
        }
    }
}

/// `delete ID` of any container: the work directory a restore at `create` left is removed
/// (CRIU's `restore.log`, kept until then for whoever looks into a restore).
pub fn forget_work_dir(ctx: &Context) {
    if let Some(id) = ctx.inv.command_parsed(&[]).positionals.first() {
        remove_work_dir(id);
    }
}

/// Thaws a held container and removes its mark.
fn release(ctx: &Context, id: &str) {
    match runc_status(ctx, &["resume", id]) {
        Ok(s) if s.success() => {}
        _ => tracing::warn!(id, "cannot thaw the held restored container"),
    }
    unmark(&ctx.state_dir(id));
}
