//! The restore transaction, as five phases, each a function from the state the one before it
//! left to the next, with an error of its own and its own rollback. The deadline's finer
//! phases ([`Phase`]: assemble, validate, gpu-gate, criu-prepare, privilege-check,
//! rootfs-diff, layer-check, open-files-check, criu-restore) are checked and timed within them as before.
//!
//! ```text
//! validate  record (in-flight: preparing) → one deadline starts, covering every phase below
//!           [chunked image: files assembled from their chunks, beneath the directory, locked
//!           exclusively] → directory locked (shared) → signature policy → [GPU state: start
//!           loading the driver] → manifest and every file verified → the rootfs diff's digest
//!           → GPU gate (driver, engine, GPU types and count)
//! bound     CRIU found (version, plugins, its config files) → runc's command → CRIU images
//!           bounded by the bundle's spec                             ← refusals end here
//! apply     rootfs diff applied → the writable layer checked → the open files found in the
//!           rootfs as dumped        ← failure: nothing runs; what of the diff was written stays
//!                                     in the container's rootfs, which goes with the container
//! restore   runc restore (CRIU; record: runc) ← failure, deadline or a dead CRIU: runc/CRIU
//!           killed, cgroup emptied, CRIU's yards removed, runc state removed
//!           → (record: restored) → the init's pid   ← unreadable: killed
//! unlock    [GPU: find the CUDA processes by container pid → restore → unlock]
//!                                                    ← failure: killed
//! ```
//!
//! Nothing from the image decides how CRIU runs: its flags come from the request (the caller's
//! own `runc restore` arguments, or the task's terminal) and from the node's configuration
//! (`restore.criu_flags`); CRIU's config files may set only what the model allows
//! (`gpusnap_criu_bridge::criu_config`).
//!
//! The in-flight record (`inflight.rs`) says at every moment what a killed front end leaves,
//! so that whoever comes next (the shim's `delete`, gpusnap-runc's guard or its next call)
//! repairs it; it moves with the state from phase to phase and is removed when the state is
//! dropped (after the restore succeeded, or after a failed one was cleared). The deadline
//! (`deadline.rs`) is checked as each of its phases ends and enforced by the watchdog while
//! runc runs.

mod apply;
mod bound;
pub mod fill;
mod run;
#[cfg(test)]
mod tests;
mod unlock;
mod validate;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpusnap_checkpoint::Manifest;
use gpusnap_config::Config;
use gpusnap_criu_bridge::RuncGlobal;
use gpusnap_cuda::PendingDriver;

use crate::deadline::{Changed, Deadline, Phase};
use crate::error::{Outcome, Result};
use crate::gpu;
use crate::host::{Host, Runc};
use crate::leftovers;
use crate::timings::Timings;

pub use apply::{ApplyError, OpenFilesError};
pub use bound::BoundError;
pub use run::RunError;
pub use unlock::UnlockError;
pub use validate::ValidateError;

/// A restore, as every front end asks for it.
#[derive(Debug, Clone)]
pub struct RestoreRequest {
    pub container_id: String,
    /// The bundle of the container being created from the checkpoint.
    pub bundle: PathBuf,
    /// The directory holding the CRIU images and the gpusnap manifest.
    pub checkpoint_dir: PathBuf,
    /// Writable-layer changes to apply to the container's root filesystem (the spec's
    /// `root.path`) before CRIU runs (restores from a CRI checkpoint archive by pod annotation;
    /// containerd applies it itself elsewhere).
    pub rootfs_diff: Option<RootfsDiff>,
    pub runc: RuncGlobal,
    pub config: Config,
    /// Where the transaction may put scratch files (CRIU's private plugin directory).
    pub scratch_dir: PathBuf,
    pub command: RestoreCommand,
    /// What the front door knows about the checkpoint's signature beyond its directory; the
    /// node's `restore.signature_policy` is decided on it here (`signature.rs`).
    pub signature_evidence: crate::SignatureEvidence,
    /// The mount the checkpoint itself reached the container through, exactly as the spec
    /// has it: the image volume [`crate::volume::restore`] restores from. The container that
    /// was checkpointed did not have it, so that one mount is left out when the spec is
    /// compared with the signed one; it was recognised as the runtime's read-only mount of the
    /// image the pod names (`restore_source::by_volume`), and grants nothing else.
    pub checkpoint_mount: Option<crate::bundle_spec::SpecMount>,
    /// When the restore began, when that was before the transaction: the copy of an image
    /// volume's checkpoint ([`crate::volume::restore`]). The one deadline counts from there.
    pub began: Option<Instant>,
    /// Page images that are not in `checkpoint_dir`: read where their chunks lie (an image
    /// volume's, [`crate::volume::restore`]), every piece checked against the verified
    /// manifest as it is read.
    pub in_place: Option<InPlacePages>,
}

/// CRIU page images a restore reads from the image's chunks instead of its checkpoint
/// directory (`restore.page_fill_min_bytes` with an image volume): no copy of them is made.
#[derive(Clone)]
pub struct InPlacePages {
    pub source: std::sync::Arc<gpusnap_checkpoint::chunks::DirSource>,
    /// Their entries in the image's chunk list (untrusted: bound to the verified manifest
    /// before anything reads them).
    pub files: Vec<gpusnap_checkpoint::chunks::ChunkedFile>,
}

impl std::fmt::Debug for InPlacePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use gpusnap_checkpoint::chunks::ChunkSource;
        f.debug_struct("InPlacePages")
            .field("source", &self.source.name())
            .field(
                "files",
                &self
                    .files
                    .iter()
                    .map(|f| f.path.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A rootfs diff and the digest it must have: verified before it is read for anything else.
#[derive(Debug, Clone)]
pub struct RootfsDiff {
    pub path: PathBuf,
    /// SHA-256, hex, as recorded when the checkpoint was put on this node.
    pub sha256: String,
    /// Bytes of file content it holds once decompressed, as recorded then: the most it may
    /// write (with `restore.max_rootfs_diff_bytes`, whichever is smaller).
    pub content_bytes: Option<u64>,
}

/// How `runc restore` is called.
#[derive(Debug, Clone)]
pub enum RestoreCommand {
    /// The transaction builds it (the shim): these settings plus the CRIU flags the node's
    /// configuration grants.
    Build {
        /// CRIU's work directory (`restore.log`), outside the checkpoint so that it can be
        /// restored again.
        work_dir: PathBuf,
        pid_file: PathBuf,
        console_socket: Option<PathBuf>,
        no_pivot: bool,
        /// The task has a terminal (`--shell-job`).
        terminal: bool,
    },
    /// The caller's own `runc restore` arguments, run as given (gpusnap-runc).
    Given {
        args: Vec<OsString>,
        /// Where that CRIU writes `restore.log`.
        criu_log: PathBuf,
        /// `--detach`: runc returns once the container runs. Without it runc stays in the
        /// foreground until the container exits (CPU-only checkpoints only).
        detach: bool,
    },
}

/// A restored container.
#[derive(Debug)]
pub struct RestoreReport {
    /// The restored init's host pid (0 after a foreground restore: it has exited).
    pub init_pid: u32,
    /// A foreground restore's exit status: runc's, which is the container's once it ran.
    pub foreground_exit: Option<std::process::ExitStatus>,
    pub manifest: Manifest,
    pub cuda_processes: usize,
    pub elapsed: Duration,
}

/// Starts loading the CUDA driver (once per process) on its own thread.
fn start_driver(req: &RestoreRequest) -> PendingDriver {
    let library = req.config.cuda.library.clone();
    PendingDriver::spawn_with(move || gpu::cached_driver(&library))
}

/// Restores the checkpoint in `req.checkpoint_dir` as container `req.container_id`.
pub fn restore(req: &RestoreRequest, host: &dyn Host) -> Result<RestoreReport> {
    let id = &req.container_id;
    phases(req, host).map_err(|e| e.of("restore", id))
}

/// The phases, in order; each one's error says (by its conversion) whether anything was
/// changed and what its rollback left.
fn phases(req: &RestoreRequest, host: &dyn Host) -> Result<RestoreReport> {
    let validated = validate::run(req)?;
    let bounded = bound::run(validated, host)?;
    let applied = apply::run(bounded)?;
    match run::run(applied)? {
        run::Ran::Foreground(report) => Ok(*report),
        run::Ran::Detached(restored) => Ok(unlock::run(*restored)?),
    }
}

/// Ends a phase: its time recorded, the test build's failpoint of its end (which may hold the
/// restore there), then the deadline checked.
fn end_phase(
    deadline: &Deadline,
    phase: Phase,
    changed: Changed,
    timings: &mut Timings,
    t: Instant,
) -> Result<()> {
    timings.add(phase.name(), t.elapsed());
    crate::failpoint::reached(&crate::failpoint::after_phase(phase));
    deadline.check(phase, changed)
}

/// Where CRIU writes `restore.log` (its work directory also holds CRIU's cgroup yard).
fn criu_log_of(req: &RestoreRequest) -> PathBuf {
    match &req.command {
        RestoreCommand::Build { work_dir, .. } => work_dir.join(gpusnap_criu_bridge::RESTORE_LOG),
        RestoreCommand::Given { criu_log, .. } => criu_log.clone(),
    }
}

/// What a failed restore left, as the outcome its error carries.
fn outcome_of(cleared: &leftovers::Cleared) -> Outcome {
    if cleared.nothing_left() {
        Outcome::NothingRunning
    } else {
        Outcome::RestoredProcessesLeft
    }
}

/// runc's state file of the container: runc writes it once CRIU has restored the processes.
fn runc_state_file(runc: &Runc<'_>) -> PathBuf {
    runc.global
        .root
        .clone()
        .unwrap_or_else(|| PathBuf::from(leftovers::DEFAULT_RUNC_ROOT))
        .join(&runc.id)
        .join("state.json")
}

/// Whether CRIU's restore log says the restore finished (runc runs CRIU at log level 4).
fn criu_finished(criu_log: &Path) -> bool {
    gpusnap_criu_bridge::criu_log_tail(criu_log, 20).is_ok_and(|t| t.says_restore_finished())
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
