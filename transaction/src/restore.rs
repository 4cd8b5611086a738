//! The restore transaction.
//!
//! ```text
//! record (in-flight: preparing) → one deadline starts, covering every phase below
//! [chunked image: files assembled from their chunks, beneath the directory, locked exclusively]
//! directory locked (shared) → signature policy → [GPU state: start loading the driver]
//! manifest and every file verified → GPU gate (driver, engine, GPU types and count)
//! → CRIU found (version, plugins, its config files) → CRIU images bounded by the bundle's spec
//!                                                                     ← refusals end here
//! rootfs diff applied → the open files found in the rootfs as dumped  ← refused: nothing
//!                                                    runs, the diff stays in the container's rootfs
//! → runc restore (CRIU; record: runc)                                 ← failure, deadline or a
//!                dead CRIU: runc/CRIU killed, cgroup emptied, CRIU's yards removed, runc state removed
//! (record: restored) [GPU: find the CUDA processes by container pid → restore → unlock]
//!                                                                     ← failure: killed
//! ```
//!
//! Nothing from the image decides how CRIU runs: its flags come from the request (the caller's
//! own `runc restore` arguments, or the task's terminal) and from the node's configuration
//! (`restore.criu_flags`); CRIU's config files may set only what the model allows
//! (`gpusnap_criu_bridge::criu_config`).
//!
//! The in-flight record (`inflight.rs`) says at every moment what a killed front end leaves,
//! so that whoever comes next (the shim's `delete`, gpusnap-runc's guard or its next call)
//! repairs it; the deadline (`deadline.rs`) is checked as each phase ends and enforced by the
//! watchdog while runc runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpusnap_checkpoint::{self as dir, Manifest};
use gpusnap_config::Config;
use gpusnap_criu_bridge::{CriuFlags, Restore, RuncCommand, RuncGlobal};
use gpusnap_cuda::PendingDriver;

use crate::deadline::{Changed, Deadline, Phase};
use crate::error::{Error, Outcome, Result};
use crate::gpu::{self, GpuRestore};
use crate::host::Host;
use crate::inflight::{RestorePhase, RestoreRecord};
use crate::leftovers;
use crate::lock::DirLock;
use crate::runc::Runc;
use crate::timings::Timings;
use crate::watchdog::{CriuEnd, Watchdog};

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
    /// The mount the checkpoint itself reached the container through (destination, source):
    /// the image volume [`crate::volume::restore`] restores from. The container that was
    /// checkpointed did not have it, so it is left out when the spec is compared with the
    /// signed one; it is a read-only bind of the image the pod names, and grants nothing else.
    pub checkpoint_mount: Option<(PathBuf, PathBuf)>,
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
    restore_inner(req, host).map_err(|e| e.of("restore", id))
}

fn restore_inner(req: &RestoreRequest, host: &dyn Host) -> Result<RestoreReport> {
    let started = Instant::now();
    let mut timings = Timings::default();
    let ckpt = &req.checkpoint_dir;
    let criu_log = criu_log_of(req);
    let criu_work_dir = criu_log.parent().unwrap_or(Path::new("/")).to_path_buf();
    // Before anything else: a front end killed from here on leaves a record of what to undo.
    let record = std::cell::RefCell::new(RestoreRecord::begin(
        &req.scratch_dir,
        &req.container_id,
        &req.bundle,
        &criu_work_dir,
    ));
    // What the checkpoint claims (unverified) only starts the deadline, and starts the driver.
    let claimed = dir::read_manifest(ckpt).ok();
    let diff_bytes = req
        .rootfs_diff
        .as_ref()
        .and_then(|d| d.content_bytes)
        .unwrap_or(0);
    let mut deadline = Deadline::start(
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
        dir::chunks::assemble(ckpt).map_err(|e| Error::precondition(e.to_string()))?;
        end_phase(
            &deadline,
            Phase::Assemble,
            Changed::Nothing,
            &mut timings,
            t,
        )?;
    }
    let t = Instant::now();
    let _lock = DirLock::shared(ckpt)?;
    let admitted = crate::signature::admit(&req.config, ckpt, &req.signature_evidence)?;

    // A checkpoint with GPU state needs the driver: start loading it now so cuInit overlaps the
    // digest verification below.
    let pending = claimed
        .and_then(|m| m.gpu)
        .filter(|g| !g.processes.is_empty())
        .map(|_| start_driver(req));

    let manifest =
        dir::validate_for_restore(ckpt).map_err(|e| Error::precondition(e.to_string()))?;
    admitted.bind(&manifest)?;

    if let Some(diff) = &req.rootfs_diff {
        let found = dir::rootfs_diff::sha256_file(&diff.path).map_err(|e| {
            Error::precondition(format!("cannot read {}: {e}", diff.path.display()))
        })?;
        if found != diff.sha256 {
            return Err(Error::precondition(format!(
                "{} has SHA-256 {found}, but the checkpoint was put on this node with {}: it was \
                 changed since — pull the checkpoint again",
                diff.path.display(),
                diff.sha256
            )));
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

    let t = Instant::now();
    let mut global = req.runc.clone();
    let _criu = crate::criu::prepare(
        &mut global,
        &req.config,
        gpu.is_some(),
        &req.bundle,
        &req.scratch_dir,
        host,
    )?;
    let granted = granted_flags(&req.config)?;
    let (cmd, pid_file) = restore_command(req, &global, &granted, &manifest)?;
    let foreground = matches!(req.command, RestoreCommand::Given { detach: false, .. });
    if foreground && gpu.is_some() {
        return Err(Error::invalid(
            "a checkpoint with GPU state is restored with --detach: runc must return before \
             gpusnap restores the CUDA processes",
        ));
    }
    end_phase(
        &deadline,
        Phase::CriuPrepare,
        Changed::Nothing,
        &mut timings,
        t,
    )?;

    // Last of the refusals: what the CRIU images give the restored processes, bounded by
    // the spec of the container being created (`privilege.rs`).
    let t = Instant::now();
    let spec = crate::privilege::read_spec(&req.bundle)?;
    admitted.check_spec(&req.bundle, req.checkpoint_mount.as_ref())?;
    crate::privilege::check(&spec, ckpt)?;
    end_phase(
        &deadline,
        Phase::PrivilegeCheck,
        Changed::Nothing,
        &mut timings,
        t,
    )?;

    let rootfs = crate::open_files::rootfs_of(&req.bundle, &spec);
    let changed = if req.rootfs_diff.is_some() {
        Changed::RootfsDiff
    } else {
        Changed::Nothing
    };
    if let Some(diff) = &req.rootfs_diff {
        let t = Instant::now();
        // The walk and the writes stop when the restore's deadline passes, so a diff built to
        // be slow cannot hold the restore past it.
        let applied = dir::rootfs_diff::apply(
            &diff.path,
            &rootfs,
            dir::rootfs_diff::Limits {
                max_bytes: diff
                    .content_bytes
                    .map_or(req.config.restore.max_rootfs_diff_bytes, |recorded| {
                        recorded.min(req.config.restore.max_rootfs_diff_bytes)
                    }),
                // The decompressed stream, headers and padding included: a small gzip file
                // that inflates past the setting is refused as it is read.
                max_inflated_bytes: req.config.restore.max_rootfs_diff_bytes,
                deadline: Some(deadline.at()),
                ..Default::default()
            },
        )
        .map_err(|e| {
            let changed = if e.nothing_applied() {
                Changed::Nothing
            } else {
                Changed::RootfsDiff
            };
            if let dir::rootfs_diff::DiffError::Deadline { .. } = e {
                // The same words as every other phase's deadline, saying what was written.
                if let Err(ran_out) = deadline.check(Phase::RootfsDiff, changed) {
                    return ran_out;
                }
            }
            if changed == Changed::Nothing {
                // Refused whole before anything was written.
                Error::precondition(format!("rootfs diff: {e}"))
            } else {
                Error::failed(Outcome::NothingRunning, format!("rootfs diff: {e}"))
            }
        })?;
        tracing::debug!(
            entries = applied.entries,
            bytes = applied.bytes,
            privileges_dropped = applied.privileges_dropped,
            "rootfs diff applied"
        );
        end_phase(
            &deadline,
            Phase::RootfsDiff,
            Changed::RootfsDiff,
            &mut timings,
            t,
        )?;
    }

    // The writable layer as the runtime or the diff left it, compared with the signed one.
    let t = Instant::now();
    admitted.check_layer(&rootfs, req.rootfs_diff.as_ref().map(|d| d.path.as_path()))?;
    timings.add("layer-check", t.elapsed());

    // After the diff, which may bring them: CRIU reopens every open file by its path and
    // fails mid-restore on one the rootfs lacks (`open_files.rs`).
    let t = Instant::now();
    crate::open_files::check(&rootfs, ckpt)?;
    end_phase(&deadline, Phase::OpenFilesCheck, changed, &mut timings, t)?;

    let runc = Runc::new(global, &req.container_id, host);
    // A runc state of this id whose init is dead (a restore or runtime killed before it could
    // clean up) would fail this restore with "container exists".
    crate::leftovers::clear_dead_runc_state(&runc);
    crate::failpoint::reached(crate::failpoint::BEFORE_RESTORE);
    let t = Instant::now();
    let watch = Watchdog::start(deadline.at(), foreground.then(|| runc_state_file(&runc)));
    // Durable while runc restores: if this runtime is killed, whoever comes next kills the
    // orphaned runc and CRIU (`inflight.rs`).
    let status = host.run_restore(cmd.to_command(), &|pid| {
        watch.started(pid);
        record.borrow_mut().runc_started(pid);
    });
    let watched = watch.finish();
    let status = status.map_err(|e| {
        Error::failed(
            Outcome::NothingRunning,
            format!("cannot run {}: {e}", cmd.program.display()),
        )
    })?;
    let clear =
        |observed| leftovers::clear_failed_restore(&runc, &req.bundle, observed, &criu_work_dir);
    if watched.expired {
        let cleared = clear(watched.cgroup);
        return Err(Error::Failed {
            outcome: outcome_of(&cleared),
            message: format!(
                "{}; CRIU was still restoring: runc, CRIU and {} process(es) below them were \
                 killed; {cleared}",
                deadline.ran_out(Phase::CriuRestore),
                watched.killed.saturating_sub(1)
            ),
            runc_exit: status.code(),
        });
    }
    if let Some((criu_pid, end)) = watched.criu_died {
        let cleared = clear(watched.cgroup);
        let log = gpusnap_criu_bridge::criu_log_tail(&criu_log, 5)
            .ok()
            .filter(|t| !t.is_empty())
            .map(|t| format!("\n{t}"))
            .unwrap_or_default();
        return Err(Error::Failed {
            outcome: outcome_of(&cleared),
            message: format!(
                "CRIU (pid {criu_pid}) {end} mid-restore, {:.1}s into the restore: runc and {} \
                 process(es) below it were killed; {cleared}{log}",
                deadline.elapsed().as_secs_f64(),
                watched.killed.saturating_sub(1)
            ),
            runc_exit: status.code(),
        });
    }
    // A foreground runc returns when the container ends; its status is a failed restore's only
    // while CRIU had not finished.
    let restore_failed =
        !status.success() && !(foreground && (watched.restored || criu_finished(&criu_log)));
    if restore_failed {
        let f = runc.failure("restore", status, b"", Some(&criu_log));
        let cleared = clear(watched.cgroup);
        // runc notices a dead CRIU by itself when nothing else holds CRIU's socket.
        let criu = watched
            .criu_ended
            .filter(|(_, end)| matches!(end, CriuEnd::Signal(_)))
            .map(|(pid, end)| format!("CRIU (pid {pid}) {end} mid-restore; "))
            .unwrap_or_default();
        return Err(Error::Failed {
            outcome: outcome_of(&cleared),
            message: format!("{criu}{}\n{cleared}", f.message),
            runc_exit: f.exit,
        });
    }
    if foreground {
        // runc ran the container to its end; its status is the container's.
        return Ok(RestoreReport {
            init_pid: 0,
            foreground_exit: Some(status),
            manifest,
            cuda_processes: 0,
            elapsed: started.elapsed(),
        });
    }
    timings.add(Phase::CriuRestore.name(), t.elapsed());
    // The container runs; until this transaction returns, its caller does not know.
    record.borrow_mut().phase(RestorePhase::Restored);
    crate::failpoint::reached(crate::failpoint::AFTER_CRIU);
    let init_pid = match &pid_file {
        Some(p) => read_pid(p),
        None => runc.state().map(|(pid, _)| pid),
    }
    .ok_or_else(|| {
        let _ = runc.kill_all();
        Error::failed(
            Outcome::RestoredProcessesKilled,
            "runc restored the container but its init pid could not be read",
        )
    })?;

    let cuda_processes = gpu.as_ref().map_or(0, GpuRestore::processes);
    if let Some(gpu) = gpu {
        let t = Instant::now();
        let restored = runc.pids(init_pid);
        if let Err(e) = gpu.run(&restored) {
            let _ = runc.kill_all();
            return Err(Error::failed(
                Outcome::RestoredProcessesKilled,
                format!("restoring GPU state failed: {e}"),
            ));
        }
        timings.add("cuda-restore", t.elapsed());
    }
    let elapsed = started.elapsed();
    tracing::info!(
        id = %req.container_id,
        pid = init_pid,
        dir = %ckpt.display(),
        cuda_processes,
        assemble_ms = timings.ms("assemble"),
        validate_ms = timings.ms("validate"),
        privilege_check_ms = timings.ms("privilege-check"),
        gpu_gate_ms = timings.ms("gpu-gate"),
        criu_prepare_ms = timings.ms("criu-prepare"),
        rootfs_diff_ms = timings.ms("rootfs-diff"),
        layer_check_ms = timings.ms("layer-check"),
        open_files_check_ms = timings.ms("open-files-check"),
        criu_restore_ms = timings.ms("criu-restore"),
        cuda_restore_ms = timings.ms("cuda-restore"),
        deadline_s = deadline.limit().as_secs(),
        total_ms = elapsed.as_millis() as u64,
        "restore complete"
    );
    Ok(RestoreReport {
        init_pid,
        foreground_exit: None,
        manifest,
        cuda_processes,
        elapsed,
    })
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

/// The CRIU permissions this node grants restores (`restore.criu_flags`).
fn granted_flags(config: &Config) -> Result<CriuFlags> {
    CriuFlags::from_switch_names(&config.restore.criu_flags).map_err(|e| {
        Error::invalid(format!(
            "restore.criu_flags in the gpusnap configuration: {e}"
        ))
    })
}

/// The `runc restore` command and the pid file (when built here).
fn restore_command(
    req: &RestoreRequest,
    global: &RuncGlobal,
    granted: &CriuFlags,
    manifest: &Manifest,
) -> Result<(RuncCommand, Option<PathBuf>)> {
    match &req.command {
        RestoreCommand::Build {
            work_dir,
            pid_file,
            console_socket,
            no_pivot,
            terminal,
        } => {
            let missing = manifest.criu.not_granted_by(granted);
            if !missing.is_empty() {
                // CRIU refuses such images itself; say what the operator can do about it.
                tracing::warn!(
                    flags = %missing.join(","),
                    "the checkpoint was dumped with CRIU flags this node does not grant restores \
                     (restore.criu_flags); CRIU may refuse it"
                );
            }
            std::fs::create_dir_all(work_dir).map_err(|e| {
                Error::precondition(format!("cannot create {}: {e}", work_dir.display()))
            })?;
            let mut flags = granted.clone();
            flags.shell_job |= *terminal;
            let r = Restore {
                work_dir: Some(work_dir.clone()),
                pid_file: Some(pid_file.clone()),
                console_socket: console_socket.clone(),
                no_pivot: *no_pivot,
                flags,
                ..Restore::new(&req.checkpoint_dir, &req.bundle)
            };
            let cmd = global
                .restore(&req.container_id, &r)
                .map_err(|e| Error::invalid(e.to_string()))?;
            Ok((cmd, Some(pid_file.clone())))
        }
        RestoreCommand::Given { args, .. } => {
            let mut cmd = global.helper(&[]);
            cmd.args = args.clone();
            Ok((cmd, None))
        }
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
    gpusnap_criu_bridge::criu_log_tail(criu_log, 20).is_ok_and(|t| {
        t.last_lines
            .iter()
            .any(|l| l.contains("Restore finished successfully"))
    })
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
