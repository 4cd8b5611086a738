//! `gpusnap-runc restore`: refuse an image gpusnap cannot vouch for before CRIU runs, then
//! hand the same arguments to runc.

use std::path::PathBuf;

use gpusnap_criu_bridge as bridge;

use super::args::RESTORE_VALUE_FLAGS;
use super::{exit_code, gpu, Context, EXIT_REFUSED};

pub fn run(ctx: &Context) -> i32 {
    let parsed = ctx.inv.command_parsed(RESTORE_VALUE_FLAGS);
    if ctx.inv.wants_help(&parsed) {
        return ctx.exec_runc();
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let image_dir = parsed
        .value(&["image-path"])
        .filter(|v| !v.is_empty())
        .map(|v| cwd.join(v))
        .unwrap_or_else(|| cwd.join("checkpoint"));
    let id = parsed.positionals.first().cloned().unwrap_or_default();
    let manifest = match bridge::validate_for_restore(&image_dir) {
        Ok(m) => m,
        Err(refusal) => {
            ctx.fail(&format!("refusing to restore {id}: {refusal}"));
            return EXIT_REFUSED;
        }
    };
    let Some(gpu) = &manifest.gpu else {
        // CPU-only: runc (and CRIU) do the whole restore; keep runc's stdio and exit code.
        return ctx.exec_runc();
    };
    let records = match gpu::restore_records(gpu) {
        Ok(r) => r,
        Err(e) => {
            ctx.fail(&format!("refusing to restore {id}: {e}"));
            return EXIT_REFUSED;
        }
    };
    if !parsed.is_set(&["detach", "d"]) {
        ctx.fail(&format!(
            "refusing to restore {id}: a GPU checkpoint is restored with --detach (runc must \
             return before gpusnap restores the CUDA processes)"
        ));
        return EXIT_REFUSED;
    }
    let mut runc_failed = None;
    let criu_restore = || -> Result<Vec<i32>, String> {
        let status = ctx
            .run_runc()
            .map_err(|e| format!("cannot run {}: {e}", ctx.runc.display()))?;
        if !status.success() {
            runc_failed = Some(exit_code(status));
            return Err(format!("runc restore failed ({status})"));
        }
        Ok(ctx.pids(&id))
    };
    match gpu::restore(&ctx.config, records, criu_restore) {
        Ok(()) => 0,
        Err(e) => {
            if runc_failed.is_none() {
                // The CPU side is back but its GPU state is not: a half-restored process
                // must not run on.
                let _ = ctx.runc_helper(&["kill", "--all", &id, "KILL"]);
            }
            ctx.fail(&format!("restore of {id} failed: {e}"));
            runc_failed.unwrap_or(EXIT_REFUSED)
        }
    }
}
