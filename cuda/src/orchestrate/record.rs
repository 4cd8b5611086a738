//! What the orchestrator reports; the shim stores these in the gpusnap manifest.

use serde::{Deserialize, Serialize};

use crate::discovery::RecordedPid;
use crate::driver::{DeviceInfo, DriverVersion, GpuRemap};

/// Per-process phase durations in milliseconds; absent when the phase did not run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlock_ms: Option<f64>,
}

/// One checkpointed CUDA process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// Host pid at checkpoint time.
    pub host_pid: i32,
    /// Pid inside the container; how restore finds the process again.
    pub container_pid: Option<i32>,
    pub restore_tid: Option<i32>,
    /// GPUs the process used (empty when not discoverable).
    pub gpus: Vec<DeviceInfo>,
    pub driver_version: DriverVersion,
    /// Storage engine name, e.g. `driver-managed`. Restore must use the same.
    pub engine: String,
    /// Device bytes moved. 0 means unknown: the driver-managed path does not
    /// report it, and gpusnap does not guess.
    pub bytes_moved: u64,
    pub timings: PhaseTimings,
    /// Engine-specific data needed at restore (extents, digests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_details: Option<serde_json::Value>,
}

impl ProcessRecord {
    /// The pids restore pairs this record by ([`crate::discovery::map_restored_pids`]).
    pub fn recorded_pid(&self) -> RecordedPid {
        RecordedPid {
            host_pid: self.host_pid,
            container_pid: self.container_pid,
        }
    }
}

/// Wall-clock durations of a whole checkpoint, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointTimings {
    pub lock_ms: f64,
    pub checkpoint_ms: f64,
    pub dump_ms: f64,
    /// Restore + unlock after the dump, with leave-running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_ms: Option<f64>,
    pub total_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointReport {
    pub engine: String,
    pub driver_version: DriverVersion,
    /// The processes were restored and unlocked after the dump.
    pub left_running: bool,
    pub processes: Vec<ProcessRecord>,
    pub timings: CheckpointTimings,
}

/// One restored CUDA process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoredProcess {
    /// Host pid after restore.
    pub host_pid: i32,
    pub container_pid: Option<i32>,
    /// Host pid when the checkpoint was taken.
    pub checkpoint_host_pid: i32,
    /// GPU pairs passed to the driver; empty means the same GPUs.
    pub gpu_remap: Vec<GpuRemap>,
    pub bytes_moved: u64,
    pub timings: PhaseTimings,
}

/// Wall-clock durations of a whole restore, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestoreTimings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criu_restore_ms: Option<f64>,
    /// How long restore blocked on driver initialisation after CRIU finished
    /// (0 when it fully overlapped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_init_wait_ms: Option<f64>,
    pub restore_ms: f64,
    pub unlock_ms: f64,
    pub total_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreReport {
    pub engine: String,
    pub driver_version: DriverVersion,
    pub processes: Vec<RestoredProcess>,
    pub timings: RestoreTimings,
}

/// Milliseconds, rounded to microseconds (enough for a manifest).
pub(crate) fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
