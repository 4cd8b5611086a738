//! Dump: `runc checkpoint --leave-running` (CRIU), inside the CUDA orchestrator for a
//! container with CUDA processes. The images are digested while CRIU writes them.
//!
//! Rollback: a container frozen for `exit` is thawed, one its caller froze is frozen again,
//! the driver rolls its own steps back (the processes restored and unlocked, or the outcome
//! unknown), and the directory is scrubbed (CRIU's logs kept).

use std::time::{Duration, Instant};

use gpusnap_cuda::orchestrate::CheckpointReport as GpuReport;
use gpusnap_cuda::{OrchestrateError, Orchestrator, Outcome as CudaOutcome};

use super::freeze::{Held, Work};
use super::hashing::{self, Hashing};
use super::prepare::Prepared;
use super::Freezer;
use crate::error::{Error, Outcome};
use crate::host::RuncFailure;

/// Why the dump failed; everything it changed was rolled back as far as it could be.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// runc (CRIU) failed.
    #[error("{0}")]
    Runc(#[source] RuncFailure),
    /// The CUDA orchestrator failed (its error names the step and whether its rollback
    /// worked); `runc_exit` when it was the dump that failed.
    #[error("{source}")]
    Cuda {
        #[source]
        source: OrchestrateError,
        runc_exit: Option<i32>,
    },
}

impl From<DumpError> for Error {
    fn from(e: DumpError) -> Error {
        let (outcome, runc_exit) = match &e {
            DumpError::Runc(f) => (Outcome::ContainerUnchanged, f.exit),
            DumpError::Cuda { source, runc_exit } => (
                match source.outcome {
                    CudaOutcome::BeforeMutation | CudaOutcome::RolledBack => {
                        Outcome::ContainerUnchanged
                    }
                    CudaOutcome::OutcomeUnknown => Outcome::CudaStateUnknown,
                },
                *runc_exit,
            ),
        };
        Error::failed(outcome, e.to_string())
            .with_runc_exit(runc_exit)
            .caused_by(e)
    }
}

/// What failed inside the orchestrator's dump step (the driver rolls back after either).
#[derive(Debug, thiserror::Error)]
enum DumpStep {
    #[error("freeze for the dump: {0}")]
    Refreeze(#[source] RuncFailure),
    #[error("{0}")]
    Dump(#[source] RuncFailure),
}

/// A dumped checkpoint, not yet sealed.
pub(super) struct Dumped<'a> {
    pub prepared: Prepared<'a>,
    pub hashing: Option<Hashing>,
    pub freezer: Freezer,
    /// The CUDA side: the driver's report and the orchestrator (to resume the processes when
    /// the seal fails, or to leave them for the caller's resume).
    pub gpu: Option<(GpuReport, Orchestrator)>,
}

pub(super) fn run(held: Held<'_>) -> Result<Dumped<'_>, DumpError> {
    let Held {
        mut prepared,
        work,
        mut freezer,
        freeze_time,
    } = held;
    let mut hashing = None;
    let result = match work {
        Work::Cpu => criu_dump(&prepared, &mut hashing, &mut freezer)
            .map(|elapsed| {
                prepared.timings.add("criu-dump", elapsed + freeze_time);
                None
            })
            .map_err(DumpError::Runc),
        Work::Gpu {
            orchestrator,
            processes,
        } => gpu_dump(
            &prepared,
            &orchestrator,
            &processes,
            &mut hashing,
            &mut freezer,
        )
        .map(|(report, elapsed)| {
            let t = &mut prepared.timings;
            t.add("cuda-lock", super::ms(report.timings.lock_ms));
            t.add("cuda-checkpoint", super::ms(report.timings.checkpoint_ms));
            t.add("criu-dump", elapsed);
            if let Some(resume) = report.timings.resume_ms {
                t.add("cuda-resume", super::ms(resume));
            }
            prepared.manifest.gpu = Some(crate::gpu::section(&report));
            Some((report, orchestrator))
        }),
    };
    // runc has returned: CRIU's private plugin directory is no longer named by anything.
    let criu = prepared.criu.take();
    match result {
        Ok(gpu) => {
            drop(criu);
            Ok(Dumped {
                prepared,
                hashing,
                freezer,
                gpu,
            })
        }
        Err(e) => {
            hashing::stop(hashing);
            super::abandon(prepared.runc.host(), &prepared.req.image_dir);
            drop(criu);
            Err(e)
        }
    }
}

/// The CRIU dump itself, the images followed as they are written. A failed dump leaves the
/// container running: the driver's rollback needs it running, and so does the caller.
fn criu_dump(
    p: &Prepared<'_>,
    hashing: &mut Option<Hashing>,
    freezer: &mut Freezer,
) -> Result<Duration, RuncFailure> {
    let t = Instant::now();
    *hashing = Some(Hashing::follow(&p.req.image_dir));
    crate::failpoint::reached(crate::failpoint::BEFORE_DUMP);
    if let Err(f) = p.runc.run(&p.dump_cmd, Some(&p.criu_log)) {
        if *freezer == Freezer::FrozenForExit {
            let _ = p.runc.resume();
            *freezer = Freezer::AsCallerLeft;
        }
        return Err(f);
    }
    let elapsed = t.elapsed();
    if let Some(h) = hashing.as_mut() {
        h.dump_done();
    }
    Ok(elapsed)
}

/// Lock → checkpoint the CUDA processes → CRIU dump → (leave running: restore → unlock). A
/// container its caller froze (thawed for the driver by the freeze/lock phase) is frozen again
/// for the dump and, after a failure, left frozen as it was; one that is to stop is frozen
/// for the dump once the driver is done.
fn gpu_dump(
    p: &Prepared<'_>,
    orch: &Orchestrator,
    processes: &[gpusnap_cuda::discovery::CudaProcess],
    hashing: &mut Option<Hashing>,
    freezer: &mut Freezer,
) -> Result<(GpuReport, Duration), DumpError> {
    let req = p.req;
    let runc = &p.runc;
    let leave_running = !req.exit && !req.frozen;
    let mut dump_elapsed = Duration::ZERO;
    let mut runc_exit = None;
    let result = orch.checkpoint(processes, leave_running, || {
        if req.frozen {
            runc.pause().map_err(DumpStep::Refreeze)?;
            *freezer = Freezer::AsCallerLeft;
        }
        let t = Instant::now();
        if req.exit && !req.frozen {
            match runc.pause() {
                Ok(()) => *freezer = Freezer::FrozenForExit,
                Err(e) => tracing::warn!(
                    id = %req.container_id,
                    error = %e,
                    "cannot freeze the container for its dump before its stop"
                ),
            }
        }
        let freeze_time = t.elapsed();
        match criu_dump(p, hashing, freezer) {
            Ok(elapsed) => {
                dump_elapsed = elapsed + freeze_time;
                Ok(())
            }
            Err(f) => {
                runc_exit = f.exit;
                // The driver rolls a failed dump back, which needs the processes running.
                if req.frozen {
                    let _ = runc.resume();
                    *freezer = Freezer::ThawedForDriver;
                }
                Err(DumpStep::Dump(f))
            }
        }
    });
    match result {
        Ok(report) => Ok((report, dump_elapsed)),
        Err(source) => {
            if req.frozen {
                let _ = runc.pause();
                *freezer = Freezer::AsCallerLeft;
            }
            Err(DumpError::Cuda { source, runc_exit })
        }
    }
}
