//! The GPU hook of the runc wrapper: CUDA lock → checkpoint around runc's dump, and the
//! compatibility gate → runc's restore → CUDA restore → unlock, through the same
//! `gpusnap_transaction::gpu` code the containerd shim uses, so either front-end restores
//! what the other checkpointed and `gpusnap inspect` reads both.

use std::path::Path;

use gpusnap_config::Config;
use gpusnap_checkpoint::GpuSection;
use gpusnap_transaction::gpu;
use gpusnap_cuda::discovery::{self, CudaProcess};
use gpusnap_cuda::orchestrate::{ProcessRecord, RestoreTarget};
use gpusnap_cuda::{Orchestrator, PendingDriver};

pub use gpusnap_transaction::gpu::{prepare_checkpoint, restore_records, CheckpointGpu};

/// Lock and checkpoint the CUDA processes, run `dump` (runc checkpoint), then with
/// `leave_running` restore and unlock them. Any failure before the dump completed rolls the
/// processes back to running.
pub fn checkpoint<F>(
    orchestrator: Orchestrator,
    processes: &[CudaProcess],
    leave_running: bool,
    dump: F,
) -> Result<GpuSection, String>
where
    F: FnOnce() -> Result<(), String>,
{
    let report = orchestrator
        .checkpoint(processes, leave_running, dump)
        .map_err(|e| e.to_string())?;
    Ok(container_gpu::section(&report))
}

/// Loads the driver and runs the compatibility gate, then `criu_restore` (runc restore;
/// returns the restored pids), then restores and unlocks every CUDA process. A gate refusal
/// comes before runc runs.
pub fn restore<F>(
    config: &Config,
    records: Vec<ProcessRecord>,
    criu_restore: F,
) -> Result<(), String>
where
    F: FnOnce() -> Result<Vec<i32>, String>,
{
    let (driver, _waited) = PendingDriver::spawn(container_gpu::driver_config(config))
        .join(config.cuda.restore_budget())
        .map_err(|e| {
            format!("the checkpoint holds GPU state but the CUDA driver is not usable here: {e}")
        })?;
    let map = container_gpu::gate(driver.capabilities(), &records).map_err(|e| e.to_string())?;
    // gpusnap-runc restores driver-managed GPU state only (posix extents need the checkpoint
    // directory wired through the wrapper); refuse before runc runs.
    if let Some(r) = records.iter().find(|r| r.engine != "driver-managed") {
        return Err(format!(
            "pid {} was checkpointed with storage engine `{}`, which gpusnap-runc cannot restore \
             yet; restore it through the containerd shim",
            r.host_pid, r.engine
        ));
    }
    let restored = criu_restore()?;
    let host_pids = discovery::map_restored_pids(&records, &restored, Path::new("/proc"))
        .map_err(|e| e.to_string())?;
    let targets: Vec<RestoreTarget> = records
        .into_iter()
        .zip(host_pids)
        .map(|(record, host_pid)| RestoreTarget { record, host_pid })
        .collect();
    let report = Orchestrator::driver_managed(driver, container_gpu::orchestrator_options(config))
        .restore(&targets, &map)
        .map_err(|e| e.to_string())?;
    tracing::info!(
        processes = report.processes.len(),
        total_ms = report.timings.total_ms,
        "CUDA restore finished"
    );
    Ok(())
}
