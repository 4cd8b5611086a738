//! The restore transaction.
//!
//! ```text
//! [chunked image: files assembled from their chunks, beneath the directory, locked exclusively]
//! directory locked (shared) → signature policy → [GPU state: start loading the driver]
//! manifest and every file verified → GPU gate (driver, engine, GPU types and count)
//! → CRIU found (version, plugins) → CRIU images bounded by the bundle's spec
//!                                                                     ← refusals end here
//! rootfs diff applied → the open files found in the rootfs as dumped  ← refused: nothing
//!                                                    runs, the diff stays in the container's rootfs
//! → runc restore (CRIU, within restore.deadline)                       ← failure or deadline:
//!                                     runc/CRIU killed, cgroup emptied, runc state removed
//! [GPU: find the CUDA processes by container pid → restore → unlock]  ← failure: killed
//! ```
//!
//! Nothing from the image decides how CRIU runs: its flags come from the request (the caller's
//! own `runc restore` arguments, or the task's terminal) and from the node's configuration
//! (`restore.criu_flags`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpusnap_checkpoint::{self as dir, Manifest};
use gpusnap_config::Config;
use gpusnap_criu_bridge::{CriuFlags, Restore, RuncCommand, RuncGlobal};
use gpusnap_cuda::PendingDriver;

use crate::error::{Error, Outcome, Result};
use crate::gpu::{self, GpuRestore};
use crate::host::Host;
use crate::leftovers;
use crate::lock::DirLock;
use crate::runc::Runc;
use crate::timings::Timings;
use crate::watchdog::Watchdog;

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
    // A chunked image as a runtime copied it (containerd's or CRI-O's restore from image,
    // Podman's import): its files are assembled in place and checked against the manifest,
    // under the exclusive lock so that no other restore reads them half-written.
    if dir::chunks::is_chunked(ckpt).unwrap_or(false) {
        let t = Instant::now();
        let _assembling = DirLock::exclusive(ckpt)?;
        dir::chunks::assemble(ckpt).map_err(|e| Error::precondition(e.to_string()))?;
        timings.add("assemble", t.elapsed());
    }
    let _lock = DirLock::shared(ckpt)?;
    let admitted = crate::signature::admit(&req.config, ckpt, &req.signature_evidence)?;

    // A checkpoint with GPU state needs the driver: start loading it now so cuInit overlaps the
    // digest verification below.
    let pending = dir::read_manifest(ckpt)
        .ok()
        .and_then(|m| m.gpu)
        .filter(|g| !g.processes.is_empty())
        .map(|_| start_driver(req));

    let t = Instant::now();
    let manifest =
        dir::validate_for_restore(ckpt).map_err(|e| Error::precondition(e.to_string()))?;
    admitted.bind(&manifest)?;
    timings.add("validate", t.elapsed());

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
    timings.add("gpu-gate", t.elapsed());

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
    let (cmd, criu_log, pid_file) = restore_command(req, &global, &granted, &manifest)?;
    let foreground = matches!(req.command, RestoreCommand::Given { detach: false, .. });
    if foreground && gpu.is_some() {
        return Err(Error::invalid(
            "a checkpoint with GPU state is restored with --detach: runc must return before \
             gpusnap restores the CUDA processes",
        ));
    }

    // Last of the refusals: what the CRIU images give the restored processes, bounded by
    // the spec of the container being created (`privilege.rs`).
    let t = Instant::now();
    let spec = crate::privilege::read_spec(&req.bundle)?;
    admitted.check_spec(&req.bundle)?;
    crate::privilege::check(&spec, ckpt)?;
    timings.add("privilege-check", t.elapsed());

    let rootfs = crate::open_files::rootfs_of(&req.bundle, &spec);
    if let Some(diff) = &req.rootfs_diff {
        let t = Instant::now();
        let applied = dir::rootfs_diff::apply(
            &diff.path,
            &rootfs,
            dir::rootfs_diff::Limits {
                max_bytes: diff
                    .content_bytes
                    .map_or(req.config.restore.max_rootfs_diff_bytes, |recorded| {
                        recorded.min(req.config.restore.max_rootfs_diff_bytes)
                    }),
                ..Default::default()
            },
        )
        .map_err(|e| match e {
            // Refused whole before anything was written.
            dir::rootfs_diff::DiffError::Refused { .. }
            | dir::rootfs_diff::DiffError::TooLarge { .. }
            | dir::rootfs_diff::DiffError::Unreadable { .. } => {
                Error::precondition(format!("rootfs diff: {e}"))
            }
            dir::rootfs_diff::DiffError::Apply { .. } => {
                Error::failed(Outcome::NothingRunning, format!("rootfs diff: {e}"))
            }
        })?;
        timings.add("rootfs-diff", t.elapsed());
        tracing::debug!(
            entries = applied.entries,
            bytes = applied.bytes,
            privileges_dropped = applied.privileges_dropped,
            "rootfs diff applied"
        );
    }

    // The writable layer as the runtime or the diff left it, compared with the signed one.
    let t = Instant::now();
    admitted.check_layer(&rootfs, req.rootfs_diff.as_ref().map(|d| d.path.as_path()))?;
    timings.add("layer-check", t.elapsed());

    // After the diff, which may bring them: CRIU reopens every open file by its path and
    // fails mid-restore on one the rootfs lacks (`open_files.rs`).
    let t = Instant::now();
    crate::open_files::check(&rootfs, ckpt)?;
    timings.add("open-files-check", t.elapsed());

    let runc = Runc::new(global, &req.container_id, host);
    // A runc state of this id whose init is dead (a restore or runtime killed before it could
    // clean up) would fail this restore with "container exists".
    crate::leftovers::clear_dead_runc_state(&runc);
    crate::failpoint::reached(crate::failpoint::BEFORE_RESTORE);
    let t = Instant::now();
    let limit = req.config.restore.deadline(manifest.images.total_bytes);
    let watch = Watchdog::start(limit, foreground.then(|| runc_state_file(&runc)));
    // Durable while runc restores: if this runtime is killed, whoever comes next (the shim's
    // `delete`, the next gpusnap-runc call) kills the orphaned runc and CRIU (`inflight.rs`).
    let record = std::cell::RefCell::new(None);
    let status = host.run_restore(cmd.to_command(), &|pid| {
        watch.started(pid);
        let written = crate::inflight::RestoreInFlight::new(&req.container_id, &req.bundle, pid)
            .write(&req.scratch_dir);
        match written {
            Ok(guard) => *record.borrow_mut() = Some(guard),
            Err(e) => tracing::warn!(dir = %req.scratch_dir.display(), error = %e, "cannot record the restore in progress"),
        }
    });
    let watched = watch.finish();
    let status = status.map_err(|e| {
        Error::failed(
            Outcome::NothingRunning,
            format!("cannot run {}: {e}", cmd.program.display()),
        )
    })?;
    if watched.expired {
        let cleared = leftovers::clear_failed_restore(&runc, &req.bundle, watched.cgroup);
        return Err(Error::Failed {
            outcome: outcome_of(&cleared),
            message: format!(
                "CRIU did not finish within {}s (restore.deadline_seconds; 0 derives it from the \
                 image size): runc, CRIU and {} process(es) below them were killed; {cleared}",
                limit.as_secs(),
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
        let cleared = leftovers::clear_failed_restore(&runc, &req.bundle, watched.cgroup);
        return Err(Error::Failed {
            outcome: outcome_of(&cleared),
            message: format!("{}\n{cleared}", f.message),
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
    timings.add("criu-restore", t.elapsed());
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
        validate_ms = timings.ms("validate"),
        privilege_check_ms = timings.ms("privilege-check"),
        gpu_gate_ms = timings.ms("gpu-gate"),
        rootfs_diff_ms = timings.ms("rootfs-diff"),
        layer_check_ms = timings.ms("layer-check"),
        open_files_check_ms = timings.ms("open-files-check"),
        criu_restore_ms = timings.ms("criu-restore"),
        cuda_restore_ms = timings.ms("cuda-restore"),
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

/// The CRIU permissions this node grants restores (`restore.criu_flags`).
fn granted_flags(config: &Config) -> Result<CriuFlags> {
    CriuFlags::from_switch_names(&config.restore.criu_flags).map_err(|e| {
        Error::invalid(format!(
            "restore.criu_flags in the gpusnap configuration: {e}"
        ))
    })
}

/// The `runc restore` command, where CRIU writes its log, and the pid file (when built here).
fn restore_command(
    req: &RestoreRequest,
    global: &RuncGlobal,
    granted: &CriuFlags,
    manifest: &Manifest,
) -> Result<(RuncCommand, PathBuf, Option<PathBuf>)> {
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
            Ok((cmd, r.criu_log(), Some(pid_file.clone())))
        }
        RestoreCommand::Given { args, criu_log, .. } => {
            let mut cmd = global.helper(&[]);
            cmd.args = args.clone();
            Ok((cmd, criu_log.clone(), None))
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
