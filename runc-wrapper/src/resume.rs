//! `gpusnap-runc resume`: runc's resume, then the CUDA processes a checkpoint of the frozen
//! container left checkpointed are restored and unlocked (the driver needs them running).

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::Path;

use gpusnap_checkpoint::beneath;
use gpusnap_transaction::PendingCudaResume;

use crate::checkpoint::PENDING_CUDA_FILE;
use crate::{exit_code, Context, EXIT_NO_RUNC, EXIT_REFUSED};

/// A pending record lists a few CUDA processes: kilobytes.
const PENDING_MAX_BYTES: u64 = 16 << 20;

pub fn run(ctx: &Context) -> i32 {
    let parsed = ctx.inv.command_parsed(&[]);
    let [id] = parsed.positionals.as_slice() else {
        return ctx.exec_runc();
    };
    // The record the checkpoint left in runc's state directory, looked at beneath it.
    let Ok(state_dir) = beneath::open_root(&ctx.state_dir(id)) else {
        return ctx.exec_runc();
    };
    let pending = OsStr::new(PENDING_CUDA_FILE);
    if !matches!(beneath::stat_at(state_dir.as_fd(), pending), Ok(Some(_))) {
        return ctx.exec_runc();
    }
    let status = match ctx.runc_command(&ctx.inv.args).status() {
        Ok(s) => s,
        Err(e) => {
            ctx.fail(&format!("cannot run {}: {e}", ctx.runc.display()));
            return EXIT_NO_RUNC;
        }
    };
    if !status.success() {
        return exit_code(status);
    }
    #[derive(serde::Deserialize)]
    struct Pending {
        memory_restored: bool,
        records: Vec<gpusnap_cuda::orchestrate::ProcessRecord>,
    }
    let resumed = beneath::read_capped(state_dir.as_fd(), Path::new(pending), PENDING_MAX_BYTES)
        .map_err(|e| e.to_string())
        .and_then(|json| serde_json::from_slice::<Pending>(&json).map_err(|e| e.to_string()))
        .and_then(|p| {
            PendingCudaResume::from_records(&ctx.config, p.records, p.memory_restored)
                .map_err(|e| e.to_string())
        })
        .and_then(|p| p.resume().map_err(|e| e.to_string()));
    let _ = beneath::unlink_at(state_dir.as_fd(), pending);
    match resumed {
        Ok(()) => 0,
        Err(e) => {
            ctx.fail(&format!(
                "{id} was resumed but its CUDA processes could not be: {e}"
            ));
            EXIT_REFUSED
        }
    }
}
