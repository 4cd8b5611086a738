//! The restore guard: a second gpusnap-runc process that outlives a killed `gpusnap-runc
//! restore` and undoes what it left, at once.
//!
//! CRI-O, Podman and containerd-shim-runc-v2 call gpusnap-runc again for a container only when
//! they delete it. A gpusnap-runc killed mid-restore (its caller then says the container
//! failed) would otherwise leave, until that delete, an orphaned runc and CRIU (a stalled one
//! bounded by no deadline, its watch having died with gpusnap-runc), CRIU's yards mounted in the
//! host, or a restored workload running in a container its caller reports as failed.
//!
//! So `restore` (and a `create` that restores, `create.rs`) starts the guard first: the same
//! binary and arguments after [`GUARD_ARG`], in a process group of its own, with no stdio of
//! the caller's, holding only the read end of a pipe whose write end gpusnap-runc keeps (close-on-exec, so
//! neither runc nor CRIU nor the container inherit it). The pipe reaches end-of-file when
//! gpusnap-runc exits, however it exits. The guard then reads the restore's in-flight record:
//! a record whose writer is dead means the restore was interrupted, and the guard repairs from
//! it ([`RestoreInFlight::repair`]: runc and CRIU killed, the cgroup emptied, CRIU's yards
//! removed, runc's state removed). A restore that ended removed its record, and the guard
//! just exits.

use std::io::{PipeWriter, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use gpusnap_transaction::inflight::RestoreInFlight;
use gpusnap_transaction::{host::Runc, Direct};

use crate::Context;

/// The first argument of a guard (before the restore's own arguments): no runc flag looks
/// like it, so no caller passes it by accident.
pub const GUARD_ARG: &str = "--gpusnap-restore-guard";

/// How long the guard waits, after its pipe reached its end, for the restore's writer to be
/// seen dead.
const WRITER_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The running guard, from gpusnap-runc's side: dropping it (or exiting) lets the guard look.
pub struct Guard {
    _write_end: PipeWriter,
}

/// Starts the guard of this process's restore. A guard that cannot be started is logged: the
/// restore goes on (the next gpusnap-runc call naming the container still repairs).
pub fn start(ctx: &Context) -> Option<Guard> {
    // Both ends close-on-exec: the guard gets the read end as its stdin, and nothing else
    // this process starts (runc, CRIU, the container) holds the write end.
    let (read_end, write_end) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the restore guard");
            return None;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the restore guard");
            return None;
        }
    };
    let mut cmd = Command::new(exe);
    cmd.arg(GUARD_ARG)
        .args(&ctx.inv.args)
        .env("PATH", &ctx.path_env)
        .stdin(Stdio::from(read_end))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Out of the caller's process group: a signal to the group is not the guard's.
        .process_group(0);
    match cmd.spawn() {
        Ok(_child) => Some(Guard {
            _write_end: write_end,
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the restore guard");
            None
        }
    }
}

/// Removes [`GUARD_ARG`] from the front of `args`; whether it was there.
pub fn take_guard_arg(args: &mut Vec<std::ffi::OsString>) -> bool {
    if args.first().is_some_and(|a| a == GUARD_ARG) {
        args.remove(0);
        true
    } else {
        false
    }
}

/// The guard's life: waits for its parent to exit, then repairs the container its restore
/// named from the restore record in the scratch directory, when that record's writer died.
/// Returns the exit code (nobody reads it).
pub fn run(ctx: &Context) -> i32 {
    // A `restore`, or a `create` that restores (`create.rs`).
    let flags = if ctx.inv.command() == Some(std::ffi::OsStr::new("create")) {
        crate::args::CREATE_VALUE_FLAGS
    } else {
        crate::args::RESTORE_VALUE_FLAGS
    };
    let parsed = ctx.inv.command_parsed(flags);
    let [id] = parsed.positionals.as_slice() else {
        return 1;
    };
    let scratch = Path::new(crate::SCRATCH_DIR);
    let parent = std::os::unix::process::parent_id();
    tracing::debug!(id, parent, "restore guard watching");

    // End-of-file (or an error) once the parent is gone: nothing is ever written.
    let mut sink = [0u8; 1];
    while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
    // Only the record of the restore this guard was started for.
    let Some(record) = RestoreInFlight::read(scratch, id).filter(|r| r.writer_pid == parent) else {
        tracing::debug!(id, "restore guard: the restore ended");
        return 0;
    };
    // A dying process closes its descriptors before it turns into a zombie: the pipe can
    // reach its end a moment before the parent stops looking alive.
    let gone_by = std::time::Instant::now() + WRITER_EXIT_WAIT;
    while record.writer_alive() && std::time::Instant::now() < gone_by {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    if record.writer_alive() {
        // Another restore of the id, by a live gpusnap-runc: not ours to touch.
        tracing::debug!(
            id,
            writer = record.writer_pid,
            "restore guard: the restore's writer lives"
        );
        return 0;
    }
    tracing::warn!(id, phase = ?record.phase, "gpusnap-runc died mid-restore: repairing");
    record.repair(scratch, &Runc::new(ctx.global(), id, &Direct));
    0
}
