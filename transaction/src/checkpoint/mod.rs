//! The checkpoint transaction, as five phases, each a function from the state the one before
//! it left to the next, with an error of its own and its own rollback:
//!
//! ```text
//! prepare      request checked → signing key → directory created and locked → pids → GPU plan
//!              → CRIU found (version, plugins) (engine admitted on this driver) → directory
//!              cleared → manifest begun                                 ← refusals end here
//! freeze/lock  CPU, exit: frozen for the dump; GPU, frozen by the caller: thawed for the
//!              driver                                                    ← thaw failed: unchanged
//! dump         [GPU: lock → checkpoint → (refreeze; with exit: freeze)] → runc checkpoint
//!              --leave-running (hashed as written) → [GPU, leave running: restore → unlock]
//!                                   ← failure: thawed or refrozen as the caller had it, the
//!                                     driver's own rollback, the directory scrubbed
//! seal         the container's spec grants and writable layer recorded, every file digested,
//!              the manifest written last, signed
//!                                   ← failure: scrubbed, thawed, CUDA resumed in place
//! finish       recorded as sealed here; exit: only now the container is killed; frozen by the
//!              caller: the CUDA processes left for the caller's resume
//! ```
//!
//! The dump always leaves the container running: with `exit`, the container is stopped only
//! once the image is sealed, so a failure anywhere leaves the workload running, unlocked and as
//! frozen as the caller left it, and nothing in the directory looks complete. With `exit` it is
//! frozen before the dump (CRIU leaves a frozen cgroup frozen), so nothing it does between the
//! dump and the kill can contradict the image. After any failure, [`checkpoint`] also puts the
//! cgroup back as the caller had it ([`Runc::settle_freezer`]), since a CRIU killed mid-dump may have
//! frozen or thawed it behind the transaction's back.
//!
//! The state that moves from phase to phase says what was done ([`Freezer`], the GPU report
//! and orchestrator), so a phase's rollback reads it instead of flags kept on the side.

mod dump;
mod finish;
mod freeze;
mod hashing;
mod prepare;
mod seal;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpusnap_checkpoint::{self as dir, Manifest};
use gpusnap_config::Config;
use gpusnap_criu_bridge::{runc_version_with, CriuFlags, RuncGlobal};

use crate::error::{Error, Outcome, Result};
use crate::gpu::{PendingCudaResume, ResumeError};
use crate::host::{Host, Runc};

pub use dump::DumpError;
pub use finish::FinishError;
pub use freeze::FreezeError;
pub use prepare::PrepareError;
pub use seal::SealError;

/// A checkpoint, as every front end asks for it.
#[derive(Debug, Clone)]
pub struct CheckpointRequest {
    pub container_id: String,
    /// The container's bundle (its runtime spec names runc's CRIU config file).
    pub bundle: PathBuf,
    /// The container's init, as the host sees it.
    pub init_pid: u32,
    /// Where the images go (created 0700 when missing).
    pub image_dir: PathBuf,
    /// CRIU's work directory (`dump.log`); default: the image directory.
    pub work_dir: Option<PathBuf>,
    /// The pre-dump this dump builds on (runc `--parent-path`).
    pub parent: Option<PathBuf>,
    /// runc `--auto-dedup`.
    pub auto_dedup: bool,
    /// CRIU's permissions for the dump, as the caller asked.
    pub criu: CriuFlags,
    /// Stop the container once the checkpoint is sealed.
    pub exit: bool,
    /// The caller froze the container before asking (containerd's client pauses the task
    /// around Checkpoint). It is left frozen; see [`CheckpointReport::pending_cuda`].
    pub frozen: bool,
    pub runc: RuncGlobal,
    pub config: Config,
    /// Where the transaction may put scratch files (CRIU's private plugin directory).
    pub scratch_dir: PathBuf,
    /// The door's own directory for the container (the shim's bundle, runc's state directory
    /// for gpusnap-runc), where the checkpoint keeps its in-flight record
    /// ([`crate::inflight::InFlight`]) while it runs: the door's repair reads it back after a
    /// runtime killed in the middle.
    pub record_dir: PathBuf,
}

/// A sealed checkpoint.
#[derive(Debug)]
pub struct CheckpointReport {
    pub manifest: Manifest,
    pub cuda_processes: usize,
    /// `exit` was asked for: the container was killed after the seal.
    pub stopped: bool,
    /// The container was frozen by the caller and has CUDA processes: they stay CHECKPOINTED
    /// until the caller thaws the container and then calls [`PendingCudaResume::resume`].
    pub pending_cuda: Option<PendingCudaResume>,
    pub elapsed: Duration,
}

/// Checkpoints the container into `req.image_dir`.
pub fn checkpoint(req: &CheckpointRequest, host: &dyn Host) -> Result<CheckpointReport> {
    checkpoint_resuming(req, host, None)
}

/// [`checkpoint`] of a container its caller froze, whose CUDA processes an earlier checkpoint
/// left checkpointed: `pending` (kept by the door), else the record saved in `req.record_dir`
/// ([`PendingCudaResume::save`]). Once the in-flight record is written, they are brought back
/// first ([`PendingCudaResume::resume_frozen`]), so that a door killed meanwhile is repaired
/// from the record like any checkpoint; a saved record is removed only once they were.
pub fn checkpoint_resuming(
    req: &CheckpointRequest,
    host: &dyn Host,
    pending: Option<PendingCudaResume>,
) -> Result<CheckpointReport> {
    let id = &req.container_id;
    // Durable until the checkpoint has ended either way (the guard removes it): whoever comes
    // after a runtime killed in between repairs from it.
    let _inflight = crate::inflight::InFlight::new(id, &req.image_dir, req.frozen, req.init_pid)
        .write(&req.record_dir)
        .map_err(|e| {
            Error::precondition(format!(
                "cannot record the checkpoint in {}: {e}; nothing was done",
                req.record_dir.display()
            ))
            .of("checkpoint", id)
        })?;
    resume_pending(req, host, pending).map_err(|e| {
        Runc::new(req.runc.clone(), id, host).settle_freezer(req.init_pid, req.frozen);
        e.of("checkpoint", id)
    })?;
    phases(req, host).map_err(|e| {
        if e.outcome().is_some() {
            Runc::new(req.runc.clone(), id, host).settle_freezer(req.init_pid, req.frozen);
        }
        e.of("checkpoint", id)
    })
}

/// The CUDA processes an earlier checkpoint of the still-frozen container left checkpointed,
/// brought back before this one locks them (the driver cannot lock a checkpointed process).
fn resume_pending(
    req: &CheckpointRequest,
    host: &dyn Host,
    pending: Option<PendingCudaResume>,
) -> Result<()> {
    if !req.frozen {
        return Ok(());
    }
    let (pending, saved) = match pending {
        Some(p) => (p, false),
        None => match PendingCudaResume::load(&req.config, &req.record_dir) {
            Ok(Some(p)) => (p, true),
            Ok(None) => return Ok(()),
            Err(e) => {
                return Err(Error::precondition(format!(
                    "{e}; nothing was checkpointed (resume the container, or delete it, first)"
                )))
            }
        },
    };
    let runc = Runc::new(req.runc.clone(), &req.container_id, host);
    pending.resume_frozen(&runc).map_err(|e| match e {
        // Resumed, but left running: the caller's freeze is put back (`Runc::settle_freezer`).
        ResumeError::Refreeze(f) => Error::failed(
            Outcome::ContainerUnchanged,
            format!(
                "the CUDA processes an earlier checkpoint left checkpointed were resumed, but \
                 the container could not be frozen again before this checkpoint: {f}; nothing \
                 was checkpointed"
            ),
        ),
        e => Error::failed(
            Outcome::CudaStateUnknown,
            format!(
                "the container is frozen with CUDA processes an earlier checkpoint left \
                 checkpointed, and bringing them back before this checkpoint failed: {e}; \
                 nothing was checkpointed"
            ),
        ),
    })?;
    if saved {
        PendingCudaResume::clear(&req.record_dir);
    }
    Ok(())
}

/// The phases, in order; each one's error says (by its conversion) whether anything was
/// changed and what its rollback left.
fn phases(req: &CheckpointRequest, host: &dyn Host) -> Result<CheckpointReport> {
    let prepared = prepare::run(req, host)?;
    let held = freeze::run(prepared)?;
    let dumped = dump::run(held)?;
    let sealed = seal::run(dumped)?;
    Ok(finish::run(sealed)?)
}

/// How the container's cgroup stands between the phases, against how the caller left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freezer {
    /// As the caller left it (running, or frozen by the caller).
    AsCallerLeft,
    /// The caller froze it, and it was thawed for the CUDA driver, which works inside the
    /// processes; the dump freezes it again.
    ThawedForDriver,
    /// Frozen by this checkpoint for its `exit`, so that nothing runs between the dump and the
    /// kill (a file written then would no longer match the image: "File … has bad size");
    /// thawed again when the checkpoint does not end in the kill.
    FrozenForExit,
}

/// Removes what a failed checkpoint wrote, keeping CRIU's logs for diagnosis; a CRIU still
/// writing into it (its runc was killed) is stopped first.
fn abandon(host: &dyn Host, dir: &Path) {
    host.kill_criu_writing(dir);
    if let Err(e) = dir::scrub_incomplete(dir) {
        tracing::error!(dir = %dir.display(), error = %e, "could not scrub an incomplete checkpoint");
    }
}

fn ms(ms: f64) -> Duration {
    Duration::from_secs_f64(ms.max(0.0) / 1e3)
}

/// `runc --version`, asked once per process and binary.
fn runc_version_cached(global: &RuncGlobal, host: &dyn Host) -> Option<String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&global.binary)
    {
        return Some(v.clone());
    }
    let v = runc_version_with(&global.binary, host).ok()?.version;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(global.binary.clone(), v.clone());
    Some(v)
}
