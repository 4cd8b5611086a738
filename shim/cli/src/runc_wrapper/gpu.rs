//! The GPU hook of the runc wrapper: CUDA lock → checkpoint around runc's dump, and CUDA
//! restore → unlock after runc's restore, through the cuda crate's orchestrator.
//!
//! This is the one place the wrapper touches the GPU. The manifest's `gpu` section has the
//! same shape the containerd shim writes (`shim/src/gpu.rs`), so either can restore what the
//! other checkpointed and `gpusnap inspect` reads both:
//!
//! - `engine`, `processes[].host_pid`, `processes[].devices` (GPU UUIDs);
//! - `processes[].cuda`: the orchestrator's full record (container pid, restore thread, driver
//!   version, engine details), which restore needs to find each process again;
//! - `driver_version`, `timings`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpusnap_config::{Config, StorageEngine};
use gpusnap_criu_bridge::{GpuProcessRecord, GpuSection};
use gpusnap_cuda::discovery::{self, CudaProcess, DiscoveryOptions};
use gpusnap_cuda::engine::DriverManaged;
use gpusnap_cuda::orchestrate::{CheckpointReport, ProcessRecord, RestorePlan};
use gpusnap_cuda::{Driver, DriverConfig, Orchestrator, OrchestratorOptions, PendingDriver};

/// Key under which each GPU process record carries the cuda crate's full record (as the shim).
pub const CUDA_RECORD: &str = "cuda";
/// Character-device major of `/dev/nvidia*`.
const NVIDIA_MAJOR: u32 = 195;

/// What a checkpoint must do about GPUs.
#[derive(Debug)]
pub enum CheckpointGpu {
    CpuOnly,
    Cuda(CudaCheckpoint),
}

#[derive(Debug)]
pub struct CudaCheckpoint {
    orchestrator: Orchestrator,
    processes: Vec<CudaProcess>,
}

fn orchestrator_options(config: &Config) -> OrchestratorOptions {
    OrchestratorOptions {
        // Zero asks the driver to wait forever; the watchdog (max_operation) still applies.
        lock_timeout: config.cuda.lock_timeout().unwrap_or(Duration::ZERO),
        max_operation: config.cuda.max_operation(),
        restore_budget: config.cuda.restore_budget(),
        ..Default::default()
    }
}

fn driver_config(config: &Config) -> DriverConfig {
    DriverConfig::with_library(&config.cuda.library)
}

/// Whether any of `pids` has an NVIDIA device node open.
pub fn uses_nvidia_devices(proc_root: &Path, pids: &[i32]) -> bool {
    pids.iter().any(|pid| {
        std::fs::read_dir(proc_root.join(pid.to_string()).join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .any(|m| m.file_type().is_char_device() && libc::major(m.rdev()) == NVIDIA_MAJOR)
    })
}

/// Decides, before anything is touched, whether the container has CUDA processes.
///
/// No loadable driver means no process can be using CUDA, unless one holds an NVIDIA device
/// open (a driver installed where gpusnap does not look): that is refused, since CRIU cannot
/// dump GPU state and the restore would be silently broken.
pub fn prepare_checkpoint(config: &Config, pids: &[i32]) -> Result<CheckpointGpu, String> {
    let driver = match Driver::load(&driver_config(config)) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            if uses_nvidia_devices(Path::new("/proc"), pids) {
                return Err(format!(
                    "the container has NVIDIA devices open, but the CUDA driver cannot be loaded \
                     ({e}); refusing to checkpoint it without its GPU state"
                ));
            }
            tracing::debug!(error = %e, "no CUDA driver; CPU-only checkpoint");
            return Ok(CheckpointGpu::CpuOnly);
        }
    };
    let mut processes = discovery::find_cuda_processes(&driver, pids, &DiscoveryOptions::default())
        .map_err(|e| e.to_string())?;
    // As the shim does: GPUs not found among the open /dev/nvidia* files are recorded as every
    // GPU the driver lists, so a restore is never placed on a node too small for the process.
    for p in processes.iter_mut().filter(|p| p.gpus.is_empty()) {
        p.gpus = driver.capabilities().devices.clone();
    }
    if processes.is_empty() {
        return Ok(CheckpointGpu::CpuOnly);
    }
    if config.storage.engine != StorageEngine::DriverManaged {
        return Err(format!(
            "storage.engine = \"{}\" is not available in this gpusnap build; use \
             \"driver-managed\"",
            config.storage.engine
        ));
    }
    tracing::info!(
        pids = ?processes.iter().map(|p| p.host_pid).collect::<Vec<_>>(),
        "CUDA processes found"
    );
    Ok(CheckpointGpu::Cuda(CudaCheckpoint {
        orchestrator: Orchestrator::driver_managed(driver, orchestrator_options(config)),
        processes,
    }))
}

impl CudaCheckpoint {
    /// Lock and checkpoint the CUDA processes, run `dump` (runc checkpoint), then with
    /// `leave_running` restore and unlock them. Any failure before the dump completed rolls
    /// the processes back to running.
    pub fn checkpoint<F>(self, leave_running: bool, dump: F) -> Result<GpuSection, String>
    where
        F: FnOnce() -> Result<(), String>,
    {
        let report = self
            .orchestrator
            .checkpoint(&self.processes, leave_running, dump)
            .map_err(|e| e.to_string())?;
        Ok(section(&report))
    }
}

/// The manifest's `gpu` section for a finished checkpoint.
pub fn section(report: &CheckpointReport) -> GpuSection {
    let mut extra = serde_json::Map::new();
    extra.insert("driver_version".into(), report.driver_version.0.into());
    extra.insert(
        "timings".into(),
        serde_json::to_value(&report.timings).unwrap_or_default(),
    );
    GpuSection {
        engine: report.engine.clone(),
        processes: report
            .processes
            .iter()
            .map(|p| {
                let mut e = serde_json::Map::new();
                e.insert(
                    CUDA_RECORD.into(),
                    serde_json::to_value(p).unwrap_or_default(),
                );
                GpuProcessRecord {
                    host_pid: p.host_pid as u32,
                    devices: p.gpus.iter().map(|d| d.uuid.to_string()).collect(),
                    extra: e,
                }
            })
            .collect(),
        extra,
    }
}

/// The orchestrator records of a checkpoint, checked before any restore work.
pub fn restore_records(gpu: &GpuSection) -> Result<Vec<ProcessRecord>, String> {
    if gpu.engine != DriverManaged::NAME {
        return Err(format!(
            "the checkpoint's GPU state was taken with storage engine `{}`, which this gpusnap \
             build cannot restore",
            gpu.engine
        ));
    }
    gpu.processes
        .iter()
        .map(|p| {
            let raw = p.extra.get(CUDA_RECORD).ok_or_else(|| {
                format!(
                    "GPU record of pid {} has no `{CUDA_RECORD}` entry: the manifest is damaged",
                    p.host_pid
                )
            })?;
            serde_json::from_value(raw.clone())
                .map_err(|e| format!("GPU record of pid {}: {e}", p.host_pid))
        })
        .collect()
}

/// Starts the driver loading, runs `criu_restore` (runc restore; returns the restored pids),
/// then restores and unlocks every CUDA process, within `cuda.restore_budget_seconds`.
pub fn restore<F>(
    config: &Config,
    records: Vec<ProcessRecord>,
    criu_restore: F,
) -> Result<(), String>
where
    F: FnOnce() -> Result<Vec<i32>, String>,
{
    // The driver loads while CRIU restores: they do not depend on each other.
    let pending = PendingDriver::spawn(driver_config(config));
    let report = gpusnap_cuda::orchestrate::restore_with_criu(
        pending,
        Arc::new(DriverManaged),
        orchestrator_options(config),
        &RestorePlan::new(records),
        criu_restore,
    )
    .map_err(|e| e.to_string())?;
    tracing::info!(
        processes = report.processes.len(),
        total_ms = report.timings.total_ms,
        "CUDA restore finished"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_no_nvidia_devices() {
        let me = std::process::id() as i32;
        assert!(!uses_nvidia_devices(Path::new("/proc"), &[me]));
        assert!(!uses_nvidia_devices(Path::new("/proc"), &[]));
    }

    #[test]
    fn foreign_engines_and_records_are_refused() {
        let mut gpu = GpuSection {
            engine: "posix".into(),
            processes: vec![],
            extra: serde_json::Map::new(),
        };
        assert!(restore_records(&gpu).unwrap_err().contains("posix"));
        gpu.engine = DriverManaged::NAME.into();
        assert_eq!(restore_records(&gpu).unwrap(), vec![]);
        gpu.processes.push(GpuProcessRecord {
            host_pid: 7,
            devices: vec![],
            extra: serde_json::Map::new(),
        });
        let err = restore_records(&gpu).unwrap_err();
        assert!(err.contains("pid 7") && err.contains("`cuda`"), "{err}");
    }
}
