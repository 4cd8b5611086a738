//! Validate: the checkpoint is what it claims and may be restored here. The in-flight record
//! and the deadline start first; a chunked image is assembled; the directory is locked
//! (shared) and held to the node's signature policy; the manifest and every file are verified,
//! and the rootfs diff's digest; the GPU gate (the driver, loaded while the digests are
//! verified) accepts the checkpoint's CUDA processes.
//!
//! Every error here is a refusal: nothing was changed. Rollback is the state's drop: the
//! record is removed and the lock released.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use gpusnap_checkpoint::chunks::{ChunkError, InPlaceFile};
use gpusnap_checkpoint::{self as dir, Manifest, RestoreRefusal};

use super::{criu_log_of, end_phase, start_driver, RestoreRequest};
use crate::deadline::{Changed, Deadline, Phase};
use crate::error::Error;
use crate::gpu::GpuRestore;
use crate::inflight::RestoreRecord;
use crate::lock::DirLock;
use crate::signature::Admission;
use crate::timings::Timings;

/// Why a checkpoint was refused before anything was changed.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// A chunked image's files could not be assembled from their chunks.
    #[error("{0}")]
    Assemble(#[source] ChunkError),
    /// The manifest, or a file it lists, is not as it says.
    #[error("{0}")]
    Manifest(#[source] RestoreRefusal),
    #[error("cannot read {}: {source}", path.display())]
    DiffUnreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} has SHA-256 {found}, but the checkpoint was put on this node with {expected}: it \
         was changed since — pull the checkpoint again",
        path.display()
    )]
    DiffChanged {
        path: PathBuf,
        found: String,
        expected: String,
    },
    /// A check that classifies its own refusal: the directory's lock (busy), the signature
    /// policy, the GPU gate, the deadline.
    #[error(transparent)]
    Check(#[from] Error),
}

impl From<ValidateError> for Error {
    fn from(e: ValidateError) -> Error {
        match e {
            ValidateError::Check(e) => e,
            e => Error::precondition(e.to_string()).caused_by(e),
        }
    }
}

/// A checkpoint verified for this restore.
pub(super) struct Validated<'a> {
    pub req: &'a RestoreRequest,
    pub started: Instant,
    pub timings: Timings,
    pub record: RestoreRecord,
    pub deadline: Deadline,
    /// Held (shared) until the restore returns.
    pub lock: DirLock,
    pub admitted: Admission,
    pub manifest: Manifest,
    /// `None`: no GPU state.
    pub gpu: Option<GpuRestore>,
    /// Where CRIU writes `restore.log`; its directory also holds CRIU's cgroup yard.
    pub criu_log: PathBuf,
    pub criu_work_dir: PathBuf,
    /// The page images read from the image's chunks (`RestoreRequest::in_place`).
    pub in_place: Vec<Arc<InPlaceFile>>,
}

pub(super) fn run(req: &RestoreRequest) -> Result<Validated<'_>, ValidateError> {
    let started = Instant::now();
    let mut timings = Timings::default();
    let ckpt = &req.checkpoint_dir;
    let criu_log = criu_log_of(req);
    let criu_work_dir = criu_log
        .parent()
        .unwrap_or(std::path::Path::new("/"))
        .to_path_buf();
    // Before anything else: a front end killed from here on leaves a record of what to undo.
    let record = RestoreRecord::begin(
        &req.scratch_dir,
        &req.container_id,
        &req.bundle,
        &criu_work_dir,
    );
    // What the checkpoint claims (unverified) only starts the deadline, and starts the driver.
    let claimed = dir::read_manifest(ckpt).ok();
    let diff_bytes = req
        .rootfs_diff
        .as_ref()
        .and_then(|d| d.content_bytes)
        .unwrap_or(0);
    let mut deadline = Deadline::start_at(
        req.began.unwrap_or(started),
        &req.config.restore,
        claimed
            .as_ref()
            .map_or(0, |m| m.images.total_bytes)
            .saturating_add(diff_bytes),
    );
    // A chunked image as a runtime copied it (containerd's or CRI-O's restore from image,
    // Podman's import): its files are assembled in place and checked against the manifest,
    // under the exclusive lock so that no other restore reads them half-written.
    if dir::chunks::is_chunked(ckpt).unwrap_or(false) {
        let t = Instant::now();
        let _assembling = DirLock::exclusive(ckpt)?;
        dir::chunks::assemble(ckpt).map_err(ValidateError::Assemble)?;
        end_phase(
            &deadline,
            Phase::Assemble,
            Changed::Nothing,
            &mut timings,
            t,
        )?;
    }
    let t = Instant::now();
    let lock = DirLock::shared(ckpt)?;
    let admitted = crate::signature::admit(&req.config, ckpt, &req.signature_evidence)?;

    // A checkpoint with GPU state needs the driver: start loading it now so cuInit overlaps the
    // digest verification below.
    let pending = claimed
        .and_then(|m| m.gpu)
        .filter(|g| !g.processes.is_empty())
        .map(|_| start_driver(req));

    let manifest = match &req.in_place {
        None => dir::validate_for_restore(ckpt),
        Some(p) => {
            let names: Vec<String> = p.files.iter().map(|f| f.path.clone()).collect();
            dir::validate_for_restore_in_place(ckpt, &names)
        }
    }
    .map_err(ValidateError::Manifest)?;
    admitted.bind(&manifest)?;
    // The page images read where their chunks lie, bound to the manifest just verified: from
    // here on every byte of them is checked against it as it is read.
    let in_place = match &req.in_place {
        None => Vec::new(),
        Some(p) => p
            .files
            .iter()
            .map(|f| dir::chunks::InPlaceFile::new(p.source.clone(), f, &manifest).map(Arc::new))
            .collect::<Result<_, _>>()
            .map_err(ValidateError::Assemble)?,
    };

    if let Some(diff) = &req.rootfs_diff {
        let found = dir::rootfs_diff::sha256_file(&diff.path).map_err(|source| {
            ValidateError::DiffUnreadable {
                path: diff.path.clone(),
                source,
            }
        })?;
        if found != diff.sha256 {
            return Err(ValidateError::DiffChanged {
                path: diff.path.clone(),
                found,
                expected: diff.sha256.clone(),
            });
        }
    }
    deadline.settle(
        &req.config.restore,
        manifest.images.total_bytes.saturating_add(diff_bytes),
    );
    end_phase(
        &deadline,
        Phase::Validate,
        Changed::Nothing,
        &mut timings,
        t,
    )?;

    // Whether GPU state is restored follows the validated manifest only: the early read above
    // is a hint for starting the driver, and a checkpoint whose validated manifest lists CUDA
    // processes must never reach CRIU without its GPU gate and restore.
    let t = Instant::now();
    let gpu = match &manifest.gpu {
        Some(section) if !section.processes.is_empty() => {
            let pending = pending.unwrap_or_else(|| start_driver(req));
            Some(GpuRestore::prepare(pending, &req.config, section, ckpt)?)
        }
        _ => None,
    };
    end_phase(&deadline, Phase::GpuGate, Changed::Nothing, &mut timings, t)?;

    Ok(Validated {
        req,
        started,
        timings,
        record,
        deadline,
        lock,
        admitted,
        manifest,
        gpu,
        criu_log,
        criu_work_dir,
        in_place,
    })
}
