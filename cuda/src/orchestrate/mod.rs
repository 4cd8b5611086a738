//! The CUDA side of a checkpoint or restore transaction.
//!
//! Checkpoint: lock every CUDA process (in order, with a lock timeout) →
//! checkpoint all (concurrently by default) → the caller's CRIU dump → with
//! leave-running, restore all and unlock all.
//!
//! Restore (after the caller's CRIU restore, with the restored processes found
//! by container pid): restore each process, onto the same or remapped GPUs →
//! unlock all.
//!
//! Every driver operation runs under a watchdog (`max_operation`). On any
//! checkpoint-side failure the workload is rolled back to running and
//! unlocked where possible, and the error says which [`Outcome`] applies.

mod checkpoint;
mod error;
mod gpu_map;
mod record;
mod restore;
mod tracker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::driver::Driver;
use crate::engine::{DriverManaged, StorageEngine};

pub use error::{
    BoxError, Cause, FailedStep, Operation, OrchestrateError, Outcome, Phase, ProcessOutcome,
};
pub use gpu_map::{GpuMap, ParseGpuMapError};
pub use record::{
    CheckpointReport, CheckpointTimings, PhaseTimings, ProcessRecord, RestoreReport,
    RestoreTimings, RestoredProcess,
};
pub use restore::RestoreTarget;

/// How the checkpoint and restore transitions of several processes run.
/// Locks and unlocks are always sequential, in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    /// One thread per process (default).
    #[default]
    Parallel,
    /// One process after another, in order (CUDA job members want this).
    Sequential,
}

impl Concurrency {
    fn is_parallel(self) -> bool {
        self == Self::Parallel
    }
}

#[derive(Debug, Clone)]
pub struct OrchestratorOptions {
    /// Passed to `cuCheckpointProcessLock` as `timeoutMs`; zero waits forever
    /// (the watchdog still applies). The driver then gives up and leaves the
    /// process running.
    pub lock_timeout: Duration,
    /// Watchdog for each driver operation (ai-dynamo's `maxOperationSeconds`).
    pub max_operation: Duration,
    /// Overall budget of a restore, from its start to the last unlock.
    pub restore_budget: Duration,
    pub concurrency: Concurrency,
    /// Per-checkpoint directory for storage engines that write files.
    pub storage_dir: Option<PathBuf>,
}

impl Default for OrchestratorOptions {
    fn default() -> Self {
        Self {
            lock_timeout: Duration::from_secs(30),
            max_operation: Duration::from_secs(3600),
            restore_budget: Duration::from_secs(7200),
            concurrency: Concurrency::Parallel,
            storage_dir: None,
        }
    }
}

/// Runs checkpoint and restore sequences with one driver and one storage engine.
#[derive(Debug, Clone)]
pub struct Orchestrator {
    driver: Arc<Driver>,
    engine: Arc<dyn StorageEngine>,
    options: OrchestratorOptions,
}

impl Orchestrator {
    pub fn new(
        driver: Arc<Driver>,
        engine: Arc<dyn StorageEngine>,
        options: OrchestratorOptions,
    ) -> Self {
        Self {
            driver,
            engine,
            options,
        }
    }

    /// With the [`DriverManaged`] engine.
    pub fn driver_managed(driver: Arc<Driver>, options: OrchestratorOptions) -> Self {
        Self::new(driver, Arc::new(DriverManaged), options)
    }

    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    pub fn engine(&self) -> &Arc<dyn StorageEngine> {
        &self.engine
    }

    pub fn options(&self) -> &OrchestratorOptions {
        &self.options
    }
}
