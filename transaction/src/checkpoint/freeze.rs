//! Freeze/lock: the workload held still for its dump. A CPU-only container that is to stop
//! after its checkpoint (`exit`) is frozen now; for CUDA processes the lock (and the driver's
//! checkpoint, which must run inside live processes) is taken by the orchestrator as the dump
//! phase starts, so a container its caller froze is thawed for the driver here, and the `exit`
//! freeze waits until the driver is done.

use gpusnap_cuda::discovery::CudaProcess;
use gpusnap_cuda::Orchestrator;

use super::prepare::Prepared;
use super::Freezer;
use crate::error::{Error, Outcome};
use crate::gpu::GpuCheckpoint;
use crate::host::RuncFailure;

/// Why the workload could not be held for its dump.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    /// The caller froze the container, and it cannot be thawed for the CUDA driver.
    #[error("cannot thaw the container for the CUDA checkpoint: {0}")]
    ThawForDriver(#[source] RuncFailure),
}

impl From<FreezeError> for Error {
    fn from(e: FreezeError) -> Error {
        // Nothing was locked yet; `checkpoint` settles the cgroup as the caller had it.
        Error::failed(Outcome::ContainerUnchanged, e.to_string()).caused_by(e)
    }
}

/// What the dump runs.
pub(super) enum Work {
    /// CRIU alone.
    Cpu,
    /// The orchestrator around CRIU: lock → CUDA checkpoint → dump → (leave running: CUDA
    /// restore → unlock), rolled back by the driver when the dump fails.
    Gpu {
        orchestrator: Orchestrator,
        processes: Vec<CudaProcess>,
    },
}

/// A workload held for its dump.
pub(super) struct Held<'a> {
    pub prepared: Prepared<'a>,
    pub work: Work,
    pub freezer: Freezer,
    /// How long the `exit` freeze took: counted in the dump's time, as it always was.
    pub freeze_time: std::time::Duration,
}

pub(super) fn run(mut prepared: Prepared<'_>) -> Result<Held<'_>, FreezeError> {
    let req = prepared.req;
    let runc = &prepared.runc;
    let t = std::time::Instant::now();
    let (work, freezer) = match prepared.plan.take() {
        None => {
            let mut freezer = Freezer::AsCallerLeft;
            // CRIU leaves a cgroup it found frozen frozen, so nothing runs between the dump and
            // the kill. A container that cannot be frozen is still dumped (and killed after).
            if req.exit && !req.frozen {
                match runc.pause() {
                    Ok(()) => freezer = Freezer::FrozenForExit,
                    Err(e) => tracing::warn!(
                        id = %req.container_id,
                        error = %e,
                        "cannot freeze the container for its dump before its stop"
                    ),
                }
            }
            (Work::Cpu, freezer)
        }
        Some(GpuCheckpoint {
            orchestrator,
            processes,
        }) => {
            let freezer = if req.frozen {
                runc.resume().map_err(FreezeError::ThawForDriver)?;
                Freezer::ThawedForDriver
            } else {
                Freezer::AsCallerLeft
            };
            (
                Work::Gpu {
                    orchestrator,
                    processes,
                },
                freezer,
            )
        }
    };
    let freeze_time = match freezer {
        Freezer::FrozenForExit => t.elapsed(),
        _ => std::time::Duration::ZERO,
    };
    Ok(Held {
        prepared,
        work,
        freezer,
        freeze_time,
    })
}
