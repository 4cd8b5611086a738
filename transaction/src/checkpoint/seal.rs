//! Seal: what else shapes a restore of this container recorded (its spec's grants, its
//! writable layer), every file digested, the manifest written last, and signed when the node
//! signs (`checkpoint.signing_key`): unsignable means not sealed.
//!
//! Rollback: the images are scrubbed (nothing looks complete), a container frozen for `exit`
//! is thawed, and CUDA processes the dump left checkpointed (for the kill, or for the caller's
//! thaw) are resumed in place, since the container is not going away after all.

use std::time::Instant;

use gpusnap_checkpoint::signature::SignatureError;
use gpusnap_checkpoint::{self as dir, Manifest, ManifestError};
use gpusnap_cuda::orchestrate::CheckpointReport as GpuReport;
use gpusnap_cuda::Orchestrator;

use super::dump::Dumped;
use super::prepare::Prepared;
use super::Freezer;
use crate::error::{Error, Outcome};
use crate::gpu::{PendingCudaResume, ResumeError};
use crate::host::Runc;

/// Why the images were not sealed.
#[derive(Debug, thiserror::Error)]
pub enum SealFailure {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Sign(#[from] SignatureError),
}

/// Why the checkpoint failed at its seal, and what its rollback left.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// Rolled back: the container runs as before.
    #[error("the checkpoint could not be sealed: {0}")]
    Unsealed(#[source] SealFailure),
    /// The CUDA processes left checkpointed could not be resumed.
    #[error(
        "the checkpoint could not be sealed ({seal}), and the CUDA processes could not be \
         resumed: {resume}"
    )]
    CudaNotResumed {
        seal: SealFailure,
        #[source]
        resume: Box<ResumeError>,
    },
}

impl From<SealError> for Error {
    fn from(e: SealError) -> Error {
        let outcome = match e {
            SealError::Unsealed(_) => Outcome::ContainerUnchanged,
            SealError::CudaNotResumed { .. } => Outcome::CudaStateUnknown,
        };
        Error::failed(outcome, e.to_string()).caused_by(e)
    }
}

/// A sealed checkpoint; the container is still as the dump left it.
pub(super) struct Sealed<'a> {
    pub prepared: Prepared<'a>,
    /// The manifest as sealed.
    pub sealed: Manifest,
    pub freezer: Freezer,
    pub gpu: Option<(GpuReport, Orchestrator)>,
}

pub(super) fn run(dumped: Dumped<'_>) -> Result<Sealed<'_>, SealError> {
    let Dumped {
        mut prepared,
        hashing,
        freezer,
        gpu,
    } = dumped;
    let req = prepared.req;
    let image_dir = &req.image_dir;
    // Recorded while the rest of the images is hashed, so the signature covers it too.
    let t = Instant::now();
    let mut manifest = std::mem::replace(
        &mut prepared.manifest,
        Manifest::new(&req.container_id, req.criu.clone()),
    );
    manifest.container = Some(crate::container_record::record(
        &req.bundle,
        req.init_pid,
        image_dir,
    ));
    prepared.timings.add("container-record", t.elapsed());
    prepared.timings.record_into(&mut manifest);
    crate::failpoint::reached(crate::failpoint::BEFORE_SEAL);

    let timings = &mut prepared.timings;
    let sealed = match hashing {
        Some(h) => h.finish().and_then(|(inventory, digest, early)| {
            timings.hashed_during_dump(early);
            dir::seal_checkpoint_with(image_dir, manifest, inventory, digest)
        }),
        None => dir::seal_checkpoint(image_dir, manifest),
    }
    .map_err(SealFailure::from)
    .and_then(|m| match &prepared.signer {
        Some(key) => key
            .sign_dir(image_dir)
            .map(|()| m)
            .map_err(SealFailure::from),
        None => Ok(m),
    });
    match sealed {
        Ok(sealed) => Ok(Sealed {
            prepared,
            sealed,
            freezer,
            gpu,
        }),
        Err(seal) => Err(roll_back(&prepared, freezer, gpu, seal)),
    }
}

fn roll_back(
    prepared: &Prepared<'_>,
    freezer: Freezer,
    gpu: Option<(GpuReport, Orchestrator)>,
    seal: SealFailure,
) -> SealError {
    let runc = &prepared.runc;
    super::abandon(runc.host(), &prepared.req.image_dir);
    if freezer == Freezer::FrozenForExit {
        let _ = runc.resume();
    }
    let resumed = match gpu {
        // The CUDA processes were left checkpointed (for the kill, or for the caller's thaw);
        // the container is not going away after all, so bring them back.
        Some((report, orch)) if !report.left_running => {
            resume_in_place(runc, prepared.req.frozen, orch, report.processes)
        }
        _ => Ok(()),
    };
    match resumed {
        Ok(()) => SealError::Unsealed(seal),
        Err(resume) => SealError::CudaNotResumed {
            seal,
            resume: Box::new(resume),
        },
    }
}

/// CUDA restore + unlock of processes left CHECKPOINTED, in place; the driver needs them
/// running, so a frozen container is thawed for it and frozen again.
fn resume_in_place(
    runc: &Runc<'_>,
    frozen: bool,
    orch: Orchestrator,
    records: Vec<gpusnap_cuda::orchestrate::ProcessRecord>,
) -> Result<(), ResumeError> {
    if frozen {
        runc.resume().map_err(ResumeError::Thaw)?;
    }
    let r = PendingCudaResume::new(orch, records).resume();
    if frozen {
        let _ = runc.pause();
    }
    r
}
