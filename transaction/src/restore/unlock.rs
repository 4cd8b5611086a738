//! Unlock: first the pages gpusnap writes itself into the tasks CRIU left stopped
//! (`fill.rs`), then every task continued; then the GPU state of a restored container. Each
//! checkpointed CUDA process is found
//! among the restored ones by its container pid, its device memory restored onto the gated
//! GPUs, and it is unlocked; then the restore is reported, with its phase timings.
//!
//! Rollback: processes that cannot run without their memory or their GPU state are killed.

use std::time::Instant;

use super::run::Restored;
use super::RestoreReport;
use crate::error::{Error, Outcome};
use crate::gpu::{GpuRestore, GpuRestoreError};

/// Why the restored processes' GPU state could not be restored; they were killed.
#[derive(Debug, thiserror::Error)]
pub enum UnlockError {
    #[error(
        "writing the restored processes' memory failed: {0} (restore.page_fill_min_bytes = 0 \
         in the node's gpusnap config leaves every page to CRIU)"
    )]
    Fill(#[source] super::fill::FillError),
    #[error("restoring GPU state failed: {0}")]
    Gpu(#[source] GpuRestoreError),
}

impl From<UnlockError> for Error {
    fn from(e: UnlockError) -> Error {
        Error::failed(Outcome::RestoredProcessesKilled, e.to_string()).caused_by(e)
    }
}

pub(super) fn run(restored: Restored<'_>) -> Result<RestoreReport, UnlockError> {
    let Restored {
        req,
        started,
        mut timings,
        record,
        deadline,
        lock,
        manifest,
        gpu,
        runc,
        init_pid,
        criu,
        fill,
    } = restored;
    // The container's processes, listed once for the page fill and the GPU state.
    let restored = (fill.is_some() || gpu.is_some()).then(|| runc.pids(init_pid));
    let restored = restored.as_deref().unwrap_or_default();
    let (mut filled_bytes, mut fill_zero_bytes) = (0, 0);
    if let Some(fill) = fill {
        let t = Instant::now();
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        match fill.finish(restored, init_pid, threads) {
            Ok(f) => (filled_bytes, fill_zero_bytes) = (f.bytes, f.skipped_zero_bytes),
            Err(e) => {
                let _ = runc.kill_all();
                return Err(UnlockError::Fill(e));
            }
        }
        timings.add("page-fill", t.elapsed());
    }
    let cuda_processes = gpu.as_ref().map_or(0, GpuRestore::processes);
    if let Some(gpu) = gpu {
        let t = Instant::now();
        if let Err(e) = gpu.run(restored) {
            let _ = runc.kill_all();
            return Err(UnlockError::Gpu(e));
        }
        timings.add("cuda-restore", t.elapsed());
    }
    let elapsed = started.elapsed();
    tracing::info!(
        id = %req.container_id,
        pid = init_pid,
        dir = %req.checkpoint_dir.display(),
        cuda_processes,
        assemble_ms = timings.ms("assemble"),
        validate_ms = timings.ms("validate"),
        privilege_check_ms = timings.ms("privilege-check"),
        gpu_gate_ms = timings.ms("gpu-gate"),
        criu_prepare_ms = timings.ms("criu-prepare"),
        rootfs_diff_ms = timings.ms("rootfs-diff"),
        layer_check_ms = timings.ms("layer-check"),
        open_files_check_ms = timings.ms("open-files-check"),
        criu_restore_ms = timings.ms("criu-restore"),
        page_fill_ms = timings.ms("page-fill"),
        page_fill_bytes = filled_bytes,
        page_fill_zero_bytes = fill_zero_bytes,
        cuda_restore_ms = timings.ms("cuda-restore"),
        deadline_s = deadline.limit().as_secs(),
        total_ms = elapsed.as_millis() as u64,
        "restore complete"
    );
    // Held to here, as they always were: the record (removed now), the directory's lock and
    // CRIU's plugin directory.
    drop((record, lock, criu));
    Ok(RestoreReport {
        init_pid,
        foreground_exit: None,
        manifest,
        cuda_processes,
        elapsed,
    })
}
