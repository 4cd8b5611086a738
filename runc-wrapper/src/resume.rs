//! `gpusnap-runc resume`: runc's resume, then the CUDA processes a checkpoint of the frozen
//! container left checkpointed are restored and unlocked (the driver needs them running).

use gpusnap_transaction::PendingCudaResume;

use crate::checkpoint::PENDING_CUDA_FILE;
use crate::{exit_code, Context, EXIT_NO_RUNC, EXIT_REFUSED};

pub fn run(ctx: &Context) -> i32 {
    let parsed = ctx.inv.command_parsed(&[]);
    let [id] = parsed.positionals.as_slice() else {
        return ctx.exec_runc();
    };
    let pending = ctx.state_dir(id).join(PENDING_CUDA_FILE);
    if !pending.exists() {
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
    let resumed = std::fs::read(&pending)
        .map_err(|e| e.to_string())
        .and_then(|json| serde_json::from_slice::<Pending>(&json).map_err(|e| e.to_string()))
        .and_then(|p| {
            PendingCudaResume::from_records(&ctx.config, p.records, p.memory_restored)
                .map_err(|e| e.to_string())
        })
        .and_then(PendingCudaResume::resume);
    let _ = std::fs::remove_file(&pending);
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
