//! Storage engines: where a process's device memory goes during checkpoint.
//!
//! An engine performs exactly one transition per call: LOCKED → CHECKPOINTED
//! ([`StorageEngine::checkpoint`]) and CHECKPOINTED → LOCKED
//! ([`StorageEngine::restore`]). Locking, unlocking, ordering, watchdogs and
//! rollback belong to the orchestrator, so every engine gets them for free.
//!
//! - [`DriverManaged`]: the driver copies device memory into host memory inside
//!   the target, and CRIU dumps it with the target's other pages.
//! - [`crate::posix::Posix`] (CUDA 13.4 CustomStorage) calls
//!   [`Driver::checkpoint_process_with`] with `customStorageInfo_out`, copies
//!   the mapped regions to files under [`EngineOp::storage_dir`] while checking
//!   [`EngineOp::deadline`] in its copy loop (driver calls cannot be
//!   interrupted; copy loops can), then calls [`Driver::complete_operation`].
//!   What it needs at restore (extent sizes, digests) it returns as
//!   [`EngineOutput::details`]; the orchestrator stores that in the record and
//!   hands it back as [`EngineOp::saved`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::driver::{CallError, Capabilities, DeviceInfo, Driver, GpuRemap};
/// One engine call for one process.
#[derive(Debug, Clone)]
pub struct EngineOp {
    pub driver: Arc<Driver>,
    /// Host pid (the caller's pid namespace).
    pub pid: i32,
    /// GPUs the process uses (checkpoint) or was checkpointed on (restore);
    /// empty when unknown.
    pub gpus: Vec<DeviceInfo>,
    /// The watchdog's deadline for this call; a copy loop should stop and fail
    /// once it has passed.
    pub deadline: Instant,
    /// Per-checkpoint directory for engines that write files.
    pub storage_dir: Option<PathBuf>,
    /// Restore only: [`EngineOutput::details`] from the checkpoint.
    pub saved: Option<serde_json::Value>,
}

/// What an engine call produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineOutput {
    /// Device bytes the engine moved, when it knows (the driver-managed path
    /// does not).
    pub bytes_moved: Option<u64>,
    /// Engine-specific facts for the manifest.
    pub details: Option<serde_json::Value>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Driver(#[from] CallError),
    #[error("storage engine `{engine}` cannot run here: {reason}")]
    Unavailable {
        engine: &'static str,
        reason: String,
    },
    #[error("storage engine `{engine}` failed for pid {pid}: {reason}")]
    Transfer {
        engine: &'static str,
        pid: i32,
        reason: String,
    },
}

impl EngineError {
    /// The driver's `CUresult`, when the failure came from a driver call.
    pub fn cuda_code(&self) -> Option<u32> {
        match self {
            Self::Driver(e) => e.code(),
            _ => None,
        }
    }
}

/// Moves device memory out of and back into a CUDA process.
pub trait StorageEngine: Send + Sync + std::fmt::Debug {
    /// Recorded in the manifest; restore refuses a checkpoint taken by another engine.
    fn name(&self) -> &'static str;

    /// Checks that this engine can run with `caps`, before any process is touched.
    fn admit(&self, caps: &Capabilities) -> Result<(), EngineError>;

    /// Whether a checkpointed process's device memory lives in files this engine wrote (which
    /// the caller may move or delete once the checkpoint is handed over), rather than inside
    /// the process.
    fn keeps_memory_in_files(&self) -> bool {
        false
    }

    /// LOCKED → CHECKPOINTED. Runs on a watchdog thread.
    fn checkpoint(&self, op: &EngineOp) -> Result<EngineOutput, EngineError>;

    /// CHECKPOINTED → LOCKED, onto the GPUs in `remap` (empty: the same GPUs).
    /// Runs on a watchdog thread.
    fn restore(&self, op: &EngineOp, remap: &[GpuRemap]) -> Result<EngineOutput, EngineError>;
}

/// The driver-managed path: one driver call each way.
#[derive(Debug, Clone, Copy, Default)]
pub struct DriverManaged;

impl DriverManaged {
    pub const NAME: &'static str = "driver-managed";
}

impl StorageEngine for DriverManaged {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn admit(&self, caps: &Capabilities) -> Result<(), EngineError> {
        if caps.checkpoint_api {
            Ok(())
        } else {
            Err(EngineError::Unavailable {
                engine: Self::NAME,
                reason: format!(
                    "driver {} lacks the checkpoint API (missing: {}); it needs driver r570 \
                     (CUDA 12.8) or newer",
                    caps.driver_version,
                    caps.missing_symbols.join(", ")
                ),
            })
        }
    }

    fn checkpoint(&self, op: &EngineOp) -> Result<EngineOutput, EngineError> {
        op.driver.checkpoint_process(op.pid)?;
        // The driver does not report how much it copied; leave it unknown.
        Ok(EngineOutput::default())
    }

    fn restore(&self, op: &EngineOp, remap: &[GpuRemap]) -> Result<EngineOutput, EngineError> {
        op.driver.restore_process(op.pid, remap)?;
        Ok(EngineOutput::default())
    }
}
