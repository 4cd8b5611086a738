//! The checkpoint transaction.
//!
//! ```text
//! request checked → directory locked → pids → GPU plan → CRIU found (version, plugins)
//!   (engine admitted on this driver)                                  ← refusals end here
//! directory cleared
//! [frozen by the caller, GPU: thaw for the driver]
//! [GPU: lock → checkpoint]  → (refreeze; with exit: freeze) → runc checkpoint --leave-running
//!   → [GPU, leave running: restore → unlock]                           ← any failure rolls back
//! seal: record the container's spec grants and writable layer, digest every file, write the
//!   manifest last, sign it                                            ← failure: scrub, resume CUDA
//! exit requested: only now kill the container
//! ```
//!
//! The dump always leaves the container running: with `exit`, the container is stopped only
//! once the image is sealed, so a failure anywhere leaves the workload running, unlocked and as
//! frozen as the caller left it, and nothing in the directory looks complete. With `exit` it is
//! frozen before the dump (CRIU leaves a frozen cgroup frozen), so nothing it does between the
//! dump and the kill can contradict the image.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpusnap_checkpoint::{self as dir, Manifest, ProcessRecord};
use gpusnap_config::Config;
use gpusnap_criu_bridge::{runc_version_with, CriuFlags, Dump, RuncGlobal};
use gpusnap_cuda::orchestrate::CheckpointReport as GpuReport;
use gpusnap_cuda::Outcome as CudaOutcome;

use crate::error::{Error, Outcome, Result};
use crate::gpu::{self, GpuCheckpoint, PendingCudaResume};
use crate::host::Host;
use crate::lock::DirLock;
use crate::runc::{Runc, RuncFailure};
use crate::timings::Timings;

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
    let id = &req.container_id;
    checkpoint_inner(req, host).map_err(|e| {
        if e.outcome().is_some() {
            settle_freezer(
                &Runc::new(req.runc.clone(), id, host),
                req.init_pid,
                req.frozen,
            );
        }
        e.of("checkpoint", id)
    })
}

/// After a failed checkpoint, the cgroup is put back as frozen or thawed as the caller had it:
/// a CRIU killed mid-dump may leave the cgroup it froze frozen, or thaw one the caller froze.
pub fn settle_freezer(runc: &Runc<'_>, init_pid: u32, frozen: bool) {
    let Some(now) = crate::cgroup::frozen(init_pid) else {
        return;
    };
    if now == frozen {
        return;
    }
    let result = if frozen { runc.pause() } else { runc.resume() };
    if let Err(e) = result {
        // runc may not know the container as paused (its state is its own); the cgroup is
        // what runs or not.
        let thawed = !frozen
            && crate::cgroup::dir_of(init_pid).is_some_and(|d| crate::cgroup::thaw_at(&d).is_ok());
        if !thawed {
            tracing::error!(id = %runc.id, frozen, error = %e, "cannot put the container's cgroup back as the caller had it");
            return;
        }
    }
    tracing::warn!(id = %runc.id, frozen, "the container's cgroup was put back as the caller had it after the failed checkpoint");
}

fn checkpoint_inner(req: &CheckpointRequest, host: &dyn Host) -> Result<CheckpointReport> {
    let started = Instant::now();
    let mut timings = Timings::default();
    let image_dir = &req.image_dir;
    let mut global = req.runc.clone();
    let dump = Dump {
        image_dir: image_dir.clone(),
        work_dir: req.work_dir.clone(),
        parent: req.parent.clone(),
        auto_dedup: req.auto_dedup,
        leave_running: true,
        flags: req.criu.clone(),
    };
    // Everything that can be checked without touching anything.
    global
        .checkpoint(&req.container_id, &dump)
        .map_err(|e| Error::invalid(e.to_string()))?;
    if req.init_pid == 0 {
        return Err(Error::precondition(
            "the container has no running init; only a running or paused container can be \
             checkpointed",
        ));
    }

    let signer = crate::signature::node_signer(&req.config)?;
    create_private_dir(image_dir)?;
    let _lock = DirLock::exclusive(image_dir)?;
    let runc = Runc::new(global.clone(), &req.container_id, host);
    let pids = runc.pids(req.init_pid);
    let plan = gpu::plan_checkpoint(&req.config, &pids, image_dir)
        .map_err(|e| e.context("refused before anything was touched"))?;
    let criu = crate::criu::prepare(
        &mut global,
        &req.config,
        plan.is_some(),
        &req.bundle,
        &req.scratch_dir,
        host,
    )?;
    let runc = Runc::new(global.clone(), &req.container_id, host);
    let dump_cmd = global
        .checkpoint(&req.container_id, &dump)
        .map_err(|e| Error::invalid(e.to_string()))?;

    dir::begin_checkpoint(image_dir)
        .map_err(|e| Error::precondition(format!("cannot prepare {}: {e}", image_dir.display())))?;
    let mut manifest = Manifest::new(&req.container_id, req.criu.clone());
    manifest.criu_version = Some(criu.info.version.to_string());
    manifest.runc_version = runc_version_cached(&global, host);
    manifest.processes = pids
        .iter()
        .map(|&pid| ProcessRecord {
            container_pid: container_pid(pid),
            command: command_line(pid),
        })
        .collect();

    let criu_log = dump.criu_log();
    // CRIU's page images are hashed while CRIU writes them; what is left once it returns (the
    // last piece of each, the small images) is hashed on every core while the CUDA processes
    // are restored and unlocked (leave running), instead of after.
    let hashing: std::cell::RefCell<Option<Hashing>> = std::cell::RefCell::new(None);
    // With `exit`, the container is frozen before the dump, as a caller-frozen one is: CRIU
    // leaves a cgroup it found frozen frozen, so nothing runs between the dump and the kill
    // (a file written then would no longer match the image: "File … has bad size").
    let frozen_for_exit = std::cell::Cell::new(false);
    let run_dump = || -> std::result::Result<Duration, RuncFailure> {
        let t = Instant::now();
        if req.exit && !req.frozen {
            match runc.pause() {
                Ok(()) => frozen_for_exit.set(true),
                Err(e) => tracing::warn!(
                    id = %req.container_id,
                    error = %e,
                    "cannot freeze the container for its dump before its stop"
                ),
            }
        }
        *hashing.borrow_mut() = Some(Hashing::follow(image_dir));
        crate::failpoint::reached(crate::failpoint::BEFORE_DUMP);
        if let Err(f) = runc.run(&dump_cmd, Some(&criu_log)) {
            // The container goes on running (and the driver's rollback needs it running).
            if frozen_for_exit.replace(false) {
                let _ = runc.resume();
            }
            return Err(f);
        }
        let elapsed = t.elapsed();
        if let Some(h) = hashing.borrow_mut().as_mut() {
            h.dump_done();
        }
        Ok(elapsed)
    };

    let mut gpu_report: Option<GpuReport> = None;
    let mut orchestrator = None;
    match plan {
        None => {
            let elapsed = run_dump().map_err(|f| {
                abandon_after(image_dir, hashing.take());
                Error::Failed {
                    outcome: Outcome::ContainerUnchanged,
                    message: f.message,
                    runc_exit: f.exit,
                }
            })?;
            timings.add("criu-dump", elapsed);
        }
        Some(GpuCheckpoint {
            orchestrator: orch,
            processes,
        }) => {
            let (report, dump_elapsed) = gpu_checkpoint(&orch, &processes, req, &runc, run_dump)
                .inspect_err(|_| {
                    abandon_after(image_dir, hashing.take());
                })?;
            timings.add("cuda-lock", ms(report.timings.lock_ms));
            timings.add("cuda-checkpoint", ms(report.timings.checkpoint_ms));
            timings.add("criu-dump", dump_elapsed);
            if let Some(resume) = report.timings.resume_ms {
                timings.add("cuda-resume", ms(resume));
            }
            manifest.gpu = Some(gpu::section(&report));
            gpu_report = Some(report);
            orchestrator = Some(orch);
        }
    }
    drop(criu);
    // What else shapes a restore of this container (its spec's grants, its writable layer),
    // recorded while the rest of the images is hashed, so the signature covers it too.
    let t = Instant::now();
    manifest.container = Some(crate::container_record::record(
        &req.bundle,
        req.init_pid,
        image_dir,
    ));
    timings.add("container-record", t.elapsed());
    timings.record_into(&mut manifest);
    crate::failpoint::reached(crate::failpoint::BEFORE_SEAL);

    let sealed = match hashing.take() {
        Some(h) => h.finish().and_then(|(inventory, digest, early)| {
            timings.hashed_during_dump(early);
            dir::seal_checkpoint_with(image_dir, manifest, inventory, digest)
        }),
        None => dir::seal_checkpoint(image_dir, manifest),
    };
    // Signed before it is reported done (checkpoint.signing_key); unsignable means not sealed.
    let sealed = sealed
        .map_err(|e| e.to_string())
        .and_then(|m| match &signer {
            Some(key) => key
                .sign_dir(image_dir)
                .map(|()| m)
                .map_err(|e| e.to_string()),
            None => Ok(m),
        });
    let manifest = match sealed {
        Ok(m) => m,
        Err(e) => {
            abandon(image_dir);
            if frozen_for_exit.get() {
                let _ = runc.resume();
            }
            let resumed = match (&gpu_report, orchestrator) {
                // The CUDA processes were left checkpointed (for the kill, or for the caller's
                // thaw); the container is not going away after all, so bring them back.
                (Some(report), Some(orch)) if !report.left_running => {
                    resume_in_place(&runc, req.frozen, orch, report.processes.clone())
                }
                _ => Ok(()),
            };
            return Err(match resumed {
                Ok(()) => Error::failed(
                    Outcome::ContainerUnchanged,
                    format!("the checkpoint could not be sealed: {e}"),
                ),
                Err(r) => Error::failed(
                    Outcome::CudaStateUnknown,
                    format!(
                        "the checkpoint could not be sealed ({e}), and the CUDA processes could \
                         not be resumed: {r}"
                    ),
                ),
            });
        }
    };

    // Sealed into the node's checkpoint root: restorable by pod annotation (`sealed_here.rs`).
    crate::sealed_here::record(&req.config, image_dir, &req.container_id, signer.as_ref());
    crate::failpoint::reached(crate::failpoint::AFTER_SEAL);
    let cuda_processes = gpu_report.as_ref().map_or(0, |r| r.processes.len());
    let mut pending_cuda = None;
    let mut stopped = false;
    if req.exit {
        // The sealed image is the container now. The kill goes to the frozen processes (runc
        // freezes, signals, thaws), so they die without running another instruction.
        match runc.kill_all() {
            Ok(()) => stopped = true,
            Err(e) => {
                tracing::warn!(id = %req.container_id, error = %e, "stopping the container after its checkpoint failed")
            }
        }
        if req.frozen || frozen_for_exit.get() {
            let _ = runc.resume();
        }
    } else if let (Some(report), Some(orch)) = (&gpu_report, orchestrator) {
        if !report.left_running {
            let keeps_files = orch.engine().keeps_memory_in_files();
            let pending = PendingCudaResume::new(orch, report.processes.clone());
            pending_cuda = Some(if keeps_files {
                // The caller may move or delete the checkpoint directory as soon as this
                // returns (containerd packs it into its content store and removes it), and the
                // device memory lives in its extent files: bring it back now, leaving the
                // processes LOCKED and the container frozen; only the unlock waits for the
                // caller's resume.
                restore_memory_now(&runc, pending).map_err(|e| {
                    Error::failed(
                        Outcome::CudaStateUnknown,
                        format!(
                            "the checkpoint in {} is sealed, but the device memory of the frozen \
                             container's CUDA processes could not be restored: {e}",
                            image_dir.display()
                        ),
                    )
                })?
            } else {
                pending
            });
        }
    }
    let elapsed = started.elapsed();
    timings.log(
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

/// Lock → checkpoint the CUDA processes → CRIU dump → (leave running: restore → unlock). A
/// container its caller froze is thawed for the driver (which works inside the processes),
/// frozen again for the dump and, after a failure, left frozen as it was.
fn gpu_checkpoint(
    orch: &gpusnap_cuda::Orchestrator,
    processes: &[gpusnap_cuda::discovery::CudaProcess],
    req: &CheckpointRequest,
    runc: &Runc<'_>,
    run_dump: impl FnOnce() -> std::result::Result<Duration, RuncFailure>,
) -> Result<(GpuReport, Duration)> {
    if req.frozen {
        runc.resume().map_err(|e| {
            Error::failed(
                Outcome::ContainerUnchanged,
                format!("cannot thaw the container for the CUDA checkpoint: {e}"),
            )
        })?;
    }
    let leave_running = !req.exit && !req.frozen;
    let mut dump_elapsed = Duration::ZERO;
    let mut runc_exit = None;
    let result = orch.checkpoint(processes, leave_running, || {
        if req.frozen {
            runc.pause()
                .map_err(|e| format!("freeze for the dump: {e}"))?;
        }
        match run_dump() {
            Ok(elapsed) => {
                dump_elapsed = elapsed;
                Ok(())
            }
            Err(f) => {
                runc_exit = f.exit;
                // The driver rolls a failed dump back, which needs the processes running.
                if req.frozen {
                    let _ = runc.resume();
                }
                Err(f.message)
            }
        }
    });
    match result {
        Ok(report) => Ok((report, dump_elapsed)),
        Err(e) => {
            if req.frozen {
                let _ = runc.pause();
            }
            let outcome = match e.outcome {
                CudaOutcome::BeforeMutation | CudaOutcome::RolledBack => {
                    Outcome::ContainerUnchanged
                }
                CudaOutcome::OutcomeUnknown => Outcome::CudaStateUnknown,
            };
            Err(Error::Failed {
                outcome,
                message: e.to_string(),
                runc_exit,
            })
        }
    }
}

/// Device memory back into the frozen container's CUDA processes, thawing it for the driver
/// and freezing it again.
fn restore_memory_now(
    runc: &Runc<'_>,
    pending: PendingCudaResume,
) -> std::result::Result<PendingCudaResume, String> {
    runc.resume().map_err(|e| e.to_string())?;
    let restored = pending.restore_memory_now();
    let refrozen = runc.pause().map_err(|e| e.to_string());
    let pending = restored?;
    refrozen?;
    Ok(pending)
}

/// CUDA restore + unlock of processes left CHECKPOINTED, in place; the driver needs them
/// running, so a frozen container is thawed for it and frozen again.
fn resume_in_place(
    runc: &Runc<'_>,
    frozen: bool,
    orch: gpusnap_cuda::Orchestrator,
    records: Vec<gpusnap_cuda::orchestrate::ProcessRecord>,
) -> std::result::Result<(), String> {
    if frozen {
        runc.resume().map_err(|e| e.to_string())?;
    }
    let r = PendingCudaResume::new(orch, records).resume();
    if frozen {
        let _ = runc.pause();
    }
    r
}

/// The digest of a dumped checkpoint: the inventory, how long hashing took once the dump had
/// ended (the part that can hold up the seal), and how many bytes were hashed during the dump.
type Hashed = std::result::Result<(dir::ImageInventory, Duration, u64), dir::InventoryError>;

/// Hashing a checkpoint: page images while CRIU writes them ([`dir::ImageFollower`]), the rest
/// on a thread of its own once CRIU has returned.
struct Hashing {
    follower: Option<dir::ImageFollower>,
    tail: Option<std::thread::JoinHandle<Hashed>>,
}

impl Hashing {
    fn follow(dir: &Path) -> Hashing {
        Hashing {
            follower: Some(dir::ImageFollower::start(dir)),
            tail: None,
        }
    }

    /// CRIU has returned: hash what the follower has not.
    fn dump_done(&mut self) {
        let Some(follower) = self.follower.take() else {
            return;
        };
        self.tail = Some(std::thread::spawn(move || {
            let t = Instant::now();
            let done = follower.finish()?;
            let tail = t.elapsed();
            tracing::debug!(
                hashed_while_written = done.hashed_while_written,
                total_bytes = done.inventory.total_bytes,
                tail_ms = tail.as_millis() as u64,
                "checkpoint digest"
            );
            Ok((done.inventory, tail, done.hashed_while_written))
        }));
    }

    /// See [`Hashed`].
    fn finish(
        mut self,
    ) -> std::result::Result<(dir::ImageInventory, Duration, u64), dir::ManifestError> {
        self.dump_done();
        let panicked = || {
            Err(dir::InventoryError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other("the hashing thread panicked"),
            })
        };
        let hashed = match self.tail.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| panicked()),
            None => panicked(),
        }?;
        Ok(hashed)
    }
}

/// Stops a hashing that was started (dropping the follower stops it), then scrubs.
fn abandon_after(dir: &Path, hashing: Option<Hashing>) {
    if let Some(mut h) = hashing {
        drop(h.follower.take());
        if let Some(thread) = h.tail.take() {
            let _ = thread.join();
        }
    }
    abandon(dir);
}

/// Removes what a failed checkpoint wrote, keeping CRIU's logs for diagnosis; a CRIU still
/// writing into it (its runc was killed) is stopped first.
fn abandon(dir: &Path) {
    crate::leftovers::kill_criu_writing(dir);
    if let Err(e) = dir::scrub_incomplete(dir) {
        tracing::error!(dir = %dir.display(), error = %e, "could not scrub an incomplete checkpoint");
    }
}

/// Creates the checkpoint directory (and missing parents), or makes an existing one, readable
/// by root only: it will hold process memory.
fn create_private_dir(dir: &Path) -> Result<()> {
    dir::beneath::create_private_dir(dir)
        .map_err(|e| Error::precondition(format!("cannot use {}: {e}", dir.display())))
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

/// A process's argv, when readable.
fn command_line(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// The pid inside the container's pid namespace (last NSpid field), when readable.
fn container_pid(host_pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}
