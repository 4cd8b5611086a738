//! `gpusnap-runc resume`: runc's resume, then the CUDA processes a checkpoint of the frozen
//! container left checkpointed are restored and unlocked (the driver needs them running).

use gpusnap_transaction::lock::DirLock;
use gpusnap_transaction::PendingCudaResume;

use crate::{exit_code, Context, EXIT_NO_RUNC, EXIT_REFUSED};

pub fn run(ctx: &Context) -> i32 {
    let parsed = ctx.inv.command_parsed(&[]);
    let [id] = parsed.positionals.as_slice() else {
        return ctx.exec_runc();
    };
    // The record the checkpoint left in runc's state directory.
    let state_dir = ctx.state_dir(id);
    if !PendingCudaResume::saved_in(&state_dir) {
        return ctx.exec_runc();
    }
    // The lock gpusnap-runc's checkpoint holds on the same directory: a checkpoint of the
    // still-frozen container brings these processes back first, so the resume waits for it
    // and then finds no record, instead of restoring and unlocking them a second time.
    let _one_at_a_time = match DirLock::exclusive_waiting(&state_dir) {
        Ok(lock) => lock,
        Err(e) => {
            ctx.fail(&format!("cannot resume {id}: {e}"));
            return EXIT_REFUSED;
        }
    };
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
    let resumed = match PendingCudaResume::load(&ctx.config, &state_dir) {
        Ok(Some(pending)) => pending.resume().map_err(|e| e.to_string()),
        // Resumed by a checkpoint that ran in between (it brings them back first).
        Ok(None) => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    // Kept when the resume failed: the processes it names are still to be brought back.
    if resumed.is_ok() {
        PendingCudaResume::clear(&state_dir);
    }
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
