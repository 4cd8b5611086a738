//! Finish: the sealed checkpoint recorded as this node's when it lies in the node's checkpoint
//! root; with `exit`, only now the container is killed (the sealed image is the container
//! now); a container its caller froze keeps its CUDA processes checkpointed for the caller's
//! resume ([`PendingCudaResume`]).
//!
//! Nothing is rolled back from here: the checkpoint is sealed and stays. A kill that fails is
//! logged and reported as `stopped: false`; device memory that cannot be brought back is a
//! failure whose outcome says the CUDA state is unknown.

use std::path::PathBuf;

use super::seal::Sealed;
use super::{CheckpointReport, Freezer};
use crate::error::{Error, Outcome};
use crate::gpu::{PendingCudaResume, ResumeError};
use crate::host::Runc;

/// Why a sealed checkpoint did not finish.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// The memory of the frozen container's CUDA processes (kept in the checkpoint's files)
    /// could not be brought back before handing the checkpoint over.
    #[error(
        "the checkpoint in {} is sealed, but the device memory of the frozen container's CUDA \
         processes could not be restored: {source}",
        dir.display()
    )]
    MemoryNotRestored {
        dir: PathBuf,
        #[source]
        source: ResumeError,
    },
}

impl From<FinishError> for Error {
    fn from(e: FinishError) -> Error {
        Error::failed(Outcome::CudaStateUnknown, e.to_string()).caused_by(e)
    }
}

pub(super) fn run(sealed: Sealed<'_>) -> Result<CheckpointReport, FinishError> {
    let Sealed {
        prepared,
        sealed: manifest,
        freezer,
        gpu,
    } = sealed;
    let req = prepared.req;
    let runc = &prepared.runc;
    let image_dir = &req.image_dir;
    // Sealed into the node's checkpoint root: restorable by pod annotation (`sealed_here.rs`).
    crate::sealed_here::record(
        &req.config,
        image_dir,
        &req.container_id,
        prepared.signer.as_ref(),
    );
    crate::failpoint::reached(crate::failpoint::AFTER_SEAL);
    let cuda_processes = gpu.as_ref().map_or(0, |(r, _)| r.processes.len());
    let mut pending_cuda = None;
    let mut stopped = false;
    if req.exit {
        // The kill goes to the frozen processes (runc freezes, signals, thaws), so they die
        // without running another instruction.
        match runc.kill_all() {
            Ok(()) => stopped = true,
            Err(e) => {
                tracing::warn!(id = %req.container_id, error = %e, "stopping the container after its checkpoint failed")
            }
        }
        if req.frozen || freezer == Freezer::FrozenForExit {
            let _ = runc.resume();
        }
    } else if let Some((report, orch)) = gpu {
        if !report.left_running {
            let keeps_files = orch.engine().keeps_memory_in_files();
            let pending = PendingCudaResume::new(orch, report.processes);
            pending_cuda = Some(if keeps_files {
                // The caller may move or delete the checkpoint directory as soon as this
                // returns (containerd packs it into its content store and removes it), and the
                // device memory lives in its extent files: bring it back now, leaving the
                // processes LOCKED and the container frozen; only the unlock waits for the
                // caller's resume.
                restore_memory_now(runc, pending).map_err(|source| {
                    FinishError::MemoryNotRestored {
                        dir: image_dir.clone(),
                        source,
                    }
                })?
            } else {
                pending
            });
        }
    }
    let elapsed = prepared.started.elapsed();
    prepared.timings.log(
        "checkpoint sealed",
        &req.container_id,
        image_dir,
        &manifest,
        cuda_processes,
        elapsed,
    );
    Ok(CheckpointReport {
        manifest,
        cuda_processes,
        stopped,
        pending_cuda,
        elapsed,
    })
}

/// Device memory back into the frozen container's CUDA processes, thawing it for the driver
/// and freezing it again.
fn restore_memory_now(
    runc: &Runc<'_>,
    pending: PendingCudaResume,
) -> Result<PendingCudaResume, ResumeError> {
    crate::pending_resume::thawed(runc, || pending.restore_memory_now())
}
