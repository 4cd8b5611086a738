//! Task checkpoint (runc checkpoint → CRIU dump) and restore (Create with a checkpoint, then
//! Start runs runc restore), with the gpusnap manifest as the completeness marker.
//!
//! Checkpoint order: probe CRIU → clear the directory → dump with `--leave-running` →
//! seal (digest every image file, write the manifest last) → only then, if the caller asked
//! for `exit`, stop the container. A failure anywhere leaves the container as it was and
//! scrubs the directory so nothing in it looks like a complete checkpoint.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use containerd_shim::{
    api::StartResponse,
    protos::{
        api::{CheckpointTaskRequest, Empty},
        events::task::TaskStart,
        protobuf::{well_known_types::any::Any, Message},
        shim::oci::CheckpointOptions as CheckpointOptionsProto,
        topics::TASK_START_EVENT_TOPIC,
    },
};
use gpusnap_criu_bridge::{
    self as bridge, CgroupsMode, CheckpointOptions, Manifest, ProcessRecord, RestoreOptions,
    RuncGlobal,
};

use gpusnap_cuda::{
    container_gpu::{self, CheckpointGpu},
    discovery::CudaProcess,
    orchestrate::{CheckpointReport, GpuMap, RestoreTarget},
    Orchestrator, Outcome, PendingDriver,
};

use crate::{
    container::{self, PendingCudaResume, PendingRestore, StdioSetup},
    errors::*,
    options::RuntimeSettings,
    process::ProcessState,
    reaper::run_reaped,
    task::TaskService,
};

const CHECKPOINT_OPTIONS: &str = "containerd.runc.v1.CheckpointOptions";
/// Where runc restore's CRIU work files (restore.log) go: the bundle, so the checkpoint
/// directory is never written to by a restore and can be restored again.
const RESTORE_WORK_DIR: &str = "criu-restore";

/// Decodes containerd's checkpoint options. No options, or options of another type (CRI
/// sends none for runtimes not named runc.v2), mean "leave running, no extra permissions".
pub fn checkpoint_options(any: Option<&Any>) -> Result<CheckpointOptions, String> {
    let Some(any) = any.filter(|a| !a.type_url.is_empty()) else {
        return Ok(CheckpointOptions::default());
    };
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    if name != CHECKPOINT_OPTIONS {
        tracing::info!(type_url = %any.type_url, "checkpoint options of another type ignored; leaving the task running");
        return Ok(CheckpointOptions::default());
    }
    let o = CheckpointOptionsProto::parse_from_bytes(&any.value)
        .map_err(|e| format!("checkpoint options ({name}) could not be decoded: {e}"))?;
    let opts = CheckpointOptions {
        exit: o.exit,
        open_tcp: o.open_tcp,
        external_unix_sockets: o.external_unix_sockets,
        terminal: o.terminal,
        file_locks: o.file_locks,
        empty_namespaces: o.empty_namespaces,
        cgroups_mode: CgroupsMode::parse_optional(&o.cgroups_mode).map_err(|e| e.to_string())?,
        image_path: (!o.image_path.is_empty()).then(|| PathBuf::from(o.image_path)),
        work_path: (!o.work_path.is_empty()).then(|| PathBuf::from(o.work_path)),
    };
    opts.validate().map_err(|e| e.to_string())?;
    Ok(opts)
}

/// The oldest CRIU accepted for this container: the CPU floor, raised by `criu.min_version`
/// (as the gpusnap-runc wrapper's `criu_min` does).
fn criu_floor(config: &gpusnap_config::Config) -> bridge::CriuVersion {
    let floor = bridge::MIN_CRIU_CPU;
    match config.criu.min_version {
        Some(v) => floor.max(bridge::CriuVersion::new(v.major, v.minor, v.patch)),
        None => floor,
    }
}

fn runc_global(settings: &RuntimeSettings, bundle: &Path, criu_dir: Option<PathBuf>) -> RuncGlobal {
    RuncGlobal {
        binary: PathBuf::from(&settings.runc_binary),
        root: Some(settings.runc_root.clone()),
        log: Some(RuntimeSettings::runc_log(bundle)),
        systemd_cgroup: settings.systemd_cgroup,
        criu_dir,
    }
}

/// Runs a runc checkpoint/restore command under the shim's reaper and turns a failure into
/// an error carrying runc's and CRIU's own words.
async fn run_runc(
    cmd: tokio::process::Command,
    what: &str,
    bundle: &Path,
    criu_log: &Path,
) -> Result<(), String> {
    let (status, _pid, _out, stderr) = run_reaped(cmd)
        .await
        .map_err(|e| format!("{what}: cannot run runc: {e}"))?;
    if status.success() {
        return Ok(());
    }
    let runc_said =
        crate::task::runc_log_error(bundle).unwrap_or_else(|| stderr.trim().to_string());
    let criu_said = bridge::criu_log_tail(criu_log, bridge::runc_cmd::ERROR_LOG_LINES)
        .map(|t| format!("\n{t}"))
        .unwrap_or_default();
    Err(format!("{what} failed ({status}): {runc_said}{criu_said}"))
}

impl TaskService {
    pub async fn checkpoint_task(&self, req: CheckpointTaskRequest) -> TtrpcResult<Empty> {
        let started = Instant::now();
        let opts = checkpoint_options(req.options.as_ref()).map_err(invalid_argument)?;
        let (settings, bundle, config, was_paused, init_pid) = {
            let state = self.state.lock().await;
            let c = state.container(&req.id)?;
            if !c.init.is_alive() {
                return Err(failed_precondition(format!(
                    "container {} cannot be checkpointed: it is {:?}, and only a running or paused \
                     task can be; start it (or restore it) first",
                    req.id, c.init.state
                )));
            }
            (
                c.settings.clone(),
                c.bundle.clone(),
                c.config.clone(),
                c.init.state == ProcessState::Paused,
                c.init.pid as u32,
            )
        };
        let dir = opts
            .resolve_image_dir(Path::new(&req.path))
            .map_err(|e| invalid_argument(e.to_string()))?;
        let global = runc_global(&settings, &bundle, config.criu.binary_dir.clone());

        // Fail before touching anything when CRIU is missing or too old.
        let criu = crate::tools::probe_criu(&global.effective_search_path())
            .await
            .and_then(|info| info.require(criu_floor(&config)).map(|_| info))
            .map_err(|e| failed_precondition(e.to_string()))?;

        let runc = self.runc_of(&req.id).await?;
        // A previous checkpoint of this paused task left its CUDA processes checkpointed; bring
        // them back (they must run for that) before taking a new one.
        if self
            .state
            .lock()
            .await
            .container(&req.id)?
            .pending_cuda_resume
            .is_some()
        {
            runc.resume(&req.id)
                .await
                .map_err(|e| internal(format!("thaw {}: {}", req.id, runc_error_text(&e))))?;
            let finished = self.finish_pending_cuda_resume(&req.id).await;
            let _ = runc.pause(&req.id).await;
            finished?;
        }
        let pids = match crate::stats::cgroup_pids(init_pid) {
            Some(pids) => pids,
            None => runc
                .ps(&req.id)
                .await
                .map(|p| p.into_iter().map(|p| p as u32).collect())
                .unwrap_or_default(),
        };

        // Which of them use CUDA, and can the configured engine move their device memory?
        // Decided before anything is locked or written.
        let gpu = plan_gpu(&config, &pids, &dir).await.map_err(|e| {
            failed_precondition(format!(
                "checkpoint of {} refused before anything was touched: {e}",
                req.id
            ))
        })?;
        if gpu.is_some() {
            // GPU workloads need CRIU 4.1 (frozen-cgroup and restore-thread handling).
            criu.require(criu_floor(&config).max(bridge::MIN_CRIU_GPU))
                .map_err(|e| failed_precondition(e.to_string()))?;
        }

        bridge::begin_checkpoint(&dir)
            .map_err(|e| internal(format!("prepare {}: {e}", dir.display())))?;
        let mut manifest = Manifest::new(&req.id, &bundle, opts.clone());
        manifest.criu_version = Some(criu.version.to_string());
        manifest.runc_version = crate::tools::runc_version(&settings.runc_binary).await;
        manifest.processes = pids
            .iter()
            .map(|&pid| ProcessRecord {
                host_pid: pid,
                container_pid: container_pid(pid),
                command: None,
            })
            .collect();

        // Dump with --leave-running: the container is stopped only once the image is sealed.
        let dump_opts = CheckpointOptions {
            exit: false,
            ..opts.clone()
        };
        let cmd = bridge::checkpoint_command(&global, &req.id, &dir, &dump_opts)
            .map_err(|e| invalid_argument(e.to_string()))?;
        let criu_log = opts.criu_log_dir(&dir).join(bridge::DUMP_LOG);
        let dump = DumpJob {
            cmd,
            bundle: bundle.clone(),
            criu_log,
        };

        let (gpu_report, orchestrator) = match gpu {
            None => {
                let dump_started = Instant::now();
                if let Err(e) = dump.run().await {
                    self.abandon(&dir);
                    return Err(internal(format!(
                        "checkpoint of {} failed before it was complete; the container keeps running: {e}",
                        req.id
                    )));
                }
                manifest.record_phase("criu-dump", dump_started.elapsed());
                (None, None)
            }
            Some((orch, procs)) => {
                // The driver works inside the target processes: they must not be frozen while
                // it locks and checkpoints them. A task the caller paused is thawed for that,
                // frozen again before CRIU dumps it, and stays frozen with its CUDA state
                // checkpointed until the caller resumes it: the caller takes the rootfs diff
                // in between, which must match the images.
                if was_paused {
                    runc.resume(&req.id).await.map_err(|e| {
                        internal(format!(
                            "thaw {} for the CUDA checkpoint: {}",
                            req.id,
                            runc_error_text(&e)
                        ))
                    })?;
                }
                let refreeze = was_paused.then(|| (runc.clone(), req.id.clone()));
                let leave_running = !opts.exit && !was_paused;
                let result = gpu_checkpoint(orch, procs, leave_running, dump, refreeze).await;
                if was_paused && result.is_err() {
                    let _ = runc.pause(&req.id).await;
                }
                if let (Ok((report, orch, _)), true) = (&result, was_paused && !opts.exit) {
                    let mut state = self.state.lock().await;
                    if let Ok(c) = state.container_mut(&req.id) {
                        c.pending_cuda_resume = Some(PendingCudaResume {
                            orchestrator: orch.clone(),
                            records: report.processes.clone(),
                        });
                    }
                }
                match result {
                    Ok((report, orch, dump_elapsed)) => {
                        manifest.record_phase("cuda-lock", ms_duration(report.timings.lock_ms));
                        manifest.record_phase(
                            "cuda-checkpoint",
                            ms_duration(report.timings.checkpoint_ms),
                        );
                        manifest.record_phase("criu-dump", dump_elapsed);
                        if let Some(resume) = report.timings.resume_ms {
                            manifest.record_phase("cuda-resume", ms_duration(resume));
                        }
                        (Some(report), Some(orch))
                    }
                    Err(e) => {
                        self.abandon(&dir);
                        return Err(internal(format!("checkpoint of {} failed: {e}", req.id)));
                    }
                }
            }
        };
        if let Some(report) = &gpu_report {
            manifest.gpu = Some(container_gpu::section(report));
        }

        let sealed = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || bridge::seal_checkpoint(&dir, manifest)
        })
        .await
        .map_err(|e| internal(e.to_string()))?;
        let manifest = match sealed {
            Ok(m) => m,
            Err(e) => {
                self.abandon(&dir);
                // With exit, the CUDA processes were left checkpointed for the kill; bring
                // them back, since the container is not going away after all.
                let resumed = match (&gpu_report, orchestrator) {
                    (Some(report), Some(orch)) if !report.left_running => {
                        self.state
                            .lock()
                            .await
                            .container_mut(&req.id)?
                            .pending_cuda_resume = None;
                        // The driver needs the processes running to restore their memory.
                        if was_paused {
                            let _ = runc.resume(&req.id).await;
                        }
                        let r = resume_cuda(orch, report.processes.clone()).await;
                        if was_paused {
                            let _ = runc.pause(&req.id).await;
                        }
                        r
                    }
                    _ => Ok(()),
                };
                return Err(internal(format!(
                    "checkpoint of {} could not be sealed; the container keeps running{}: {e}",
                    req.id,
                    resumed
                        .err()
                        .map(|r| format!(" but its CUDA state could not be resumed ({r})"))
                        .unwrap_or_default()
                )));
            }
        };

        if opts.exit {
            self.stop_after_checkpoint(&req.id, &runc, was_paused).await;
        }
        tracing::info!(
            id = %req.id,
            dir = %dir.display(),
            cuda_processes = gpu_report.as_ref().map(|r| r.processes.len()).unwrap_or(0),
            timings = ?manifest.timings,
            bytes = manifest.images.total_bytes,
            total_ms = started.elapsed().as_millis() as u64,
            exit = opts.exit,
            "checkpoint complete"
        );
        Ok(Empty::new())
    }

    /// Restores and unlocks CUDA processes a checkpoint of the paused task left checkpointed;
    /// the task must be running (thawed) when this is called.
    pub async fn finish_pending_cuda_resume(&self, id: &str) -> TtrpcResult<()> {
        let pending = self
            .state
            .lock()
            .await
            .container_mut(id)?
            .pending_cuda_resume
            .take();
        let Some(pending) = pending else {
            return Ok(());
        };
        let started = Instant::now();
        resume_cuda(pending.orchestrator, pending.records)
            .await
            .map_err(|e| {
                internal(format!(
                    "{id} was resumed but its CUDA processes could not be: {e}"
                ))
            })?;
        tracing::info!(
            id,
            cuda_resume_ms = started.elapsed().as_millis() as u64,
            "CUDA processes resumed after checkpoint"
        );
        Ok(())
    }

    /// Removes what a failed checkpoint wrote, keeping CRIU's logs for diagnosis.
    fn abandon(&self, dir: &Path) {
        if let Err(e) = bridge::scrub_incomplete(dir) {
            tracing::error!(dir = %dir.display(), error = %e, "could not scrub an incomplete checkpoint");
        }
    }

    /// `exit` was requested: the sealed image is the container now, so stop the original.
    async fn stop_after_checkpoint(&self, id: &str, runc: &runc::Runc, was_paused: bool) {
        let opts = runc::options::KillOpts { all: true };
        if let Err(e) = runc.kill(id, libc::SIGKILL as u32, Some(&opts)).await {
            tracing::warn!(id, error = %e, "stopping the container after its checkpoint failed");
        }
        // Frozen processes only die once thawed.
        if was_paused {
            let _ = runc.resume(id).await;
            self.set_init_state(id, ProcessState::Paused, ProcessState::Running)
                .await;
        }
    }

    pub async fn start_restore(
        &self,
        id: &str,
        restore: PendingRestore,
    ) -> TtrpcResult<StartResponse> {
        let started = Instant::now();
        let (settings, bundle, config, stdio) = {
            let state = self.state.lock().await;
            let c = state.container(id)?;
            (
                c.settings.clone(),
                c.bundle.clone(),
                c.config.clone(),
                c.init.stdio.clone(),
            )
        };
        let refuse = |e: String| failed_precondition(format!("cannot restore {id}: {e}"));
        // A checkpoint with GPU state needs the driver: start loading it now so cuInit overlaps
        // the digest verification below.
        let gpu_section = bridge::read_manifest(&restore.image)
            .ok()
            .and_then(|m| m.gpu);
        let pending = match &gpu_section {
            Some(section) if !section.processes.is_empty() => Some((
                PendingDriver::spawn(container_gpu::driver_config(&config)),
                section.clone(),
            )),
            _ => None,
        };
        // Refuse an image we cannot restore before CRIU runs.
        let image = restore.image.clone();
        let manifest = tokio::task::spawn_blocking(move || bridge::validate_for_restore(&image))
            .await
            .map_err(|e| internal(e.to_string()))?
            .map_err(|e| refuse(e.to_string()))?;
        let validated_ms = started.elapsed().as_millis() as u64;
        // The compatibility gate: driver, GPU type and count, before any CRIU work.
        let gpu = match pending {
            None => None,
            Some((pending, section)) => {
                let records =
                    container_gpu::restore_records(&section).map_err(|e| refuse(e.to_string()))?;
                let budget = config.cuda.restore_budget();
                let (driver, _waited) = tokio::task::spawn_blocking(move || pending.join(budget))
                    .await
                    .map_err(|e| internal(e.to_string()))?
                    .map_err(|e| refuse(format!("the checkpoint holds GPU state but the CUDA driver is not usable here: {e}")))?;
                container_gpu::restore_engine(&config, driver.capabilities(), &section.engine)
                    .map_err(|e| refuse(e.to_string()))?;
                let map = container_gpu::gate(driver.capabilities(), &records)
                    .map_err(|e| refuse(e.to_string()))?;
                Some((driver, map, records, section.engine.clone()))
            }
        };
        let global = runc_global(&settings, &bundle, config.criu.binary_dir.clone());
        crate::tools::probe_criu(&global.effective_search_path())
            .await
            .and_then(|info| {
                let floor = criu_floor(&config);
                info.require(if gpu.is_some() {
                    floor.max(bridge::MIN_CRIU_GPU)
                } else {
                    floor
                })
            })
            .map_err(|e| failed_precondition(e.to_string()))?;

        if let Some(diff) = &restore.rootfs_diff {
            let (diff, rootfs) = (diff.clone(), bundle.join("rootfs"));
            let applied =
                tokio::task::spawn_blocking(move || crate::rootfs_diff::apply(&diff, &rootfs))
                    .await
                    .map_err(|e| internal(e.to_string()))?
                    .map_err(|e| internal(format!("cannot restore {id}: rootfs diff: {e}")))?;
            tracing::info!(id, entries = applied, "rootfs diff applied");
        }
        let work = bundle.join(RESTORE_WORK_DIR);
        std::fs::create_dir_all(&work)
            .map_err(|e| internal(format!("create {}: {e}", work.display())))?;
        let pid_file = bundle.join("init.pid");
        let setup = StdioSetup::new(&stdio).map_err(|e| internal(format!("set up stdio: {e}")))?;
        let mut ropts =
            RestoreOptions::new(&restore.image, &bundle).with_checkpoint_flags(&manifest.options);
        ropts.work_path = Some(work.clone());
        ropts.pid_file = Some(pid_file.clone());
        ropts.console_socket = setup.console_path();
        ropts.no_pivot = settings.no_pivot_root;
        if stdio.terminal {
            ropts.terminal = true;
        }
        let cmd = bridge::restore_command(&global, id, &ropts)
            .map_err(|e| invalid_argument(e.to_string()))?;

        let mut init = crate::process::Process::new("", stdio.clone());
        init.stdin = setup
            .pipes
            .start_copy(&stdio, &init.io)
            .map_err(|e| internal(format!("open stdio fifos: {e}")))?;
        let mut command = tokio::process::Command::from(cmd.to_command());
        setup
            .pipes
            .apply(&mut command)
            .map_err(|e| internal(format!("stdio for runc restore: {e}")))?;
        let criu_started = Instant::now();
        let result = run_runc(
            command,
            "runc restore",
            &bundle,
            &work.join(bridge::RESTORE_LOG),
        )
        .await;
        setup.pipes.close_child_ends();
        if let Err(e) = result {
            init.shutdown_io().await;
            return Err(internal(format!("restore of {id} failed: {e}")));
        }
        let criu_ms = criu_started.elapsed().as_millis() as u64;
        init.pid = container::read_pid(&pid_file).map_err(internal)?;
        setup.finish(&mut init).await.map_err(internal)?;

        let mut cuda_ms = 0;
        if let Some((driver, map, records, engine)) = gpu {
            let cuda_started = Instant::now();
            if let Err(e) = gpu_restore(
                driver,
                &config,
                &engine,
                &restore.image,
                map,
                records,
                init.pid as u32,
            )
            .await
            {
                // The restored processes cannot run without their device memory: stop them.
                let runc = self.runc_of(id).await?;
                let _ = runc
                    .kill(
                        id,
                        libc::SIGKILL as u32,
                        Some(&runc::options::KillOpts { all: true }),
                    )
                    .await;
                init.shutdown_io().await;
                return Err(internal(format!(
                    "restore of {id} failed restoring GPU state; the restored processes were stopped: {e}"
                )));
            }
            cuda_ms = cuda_started.elapsed().as_millis() as u64;
        }

        let mut state = self.state.lock().await;
        let c = state
            .containers
            .get_mut(id)
            .ok_or_else(|| not_found(format!("container {id} was deleted while restoring")))?;
        let pid = init.pid;
        c.init.pid = pid;
        c.init.io = init.io;
        c.init.pty = init.pty;
        c.init.stdin = init.stdin;
        c.init.state = ProcessState::Running;
        c.restore = None;
        self.watch_oom(c);
        self.events.send(
            TASK_START_EVENT_TOPIC,
            TaskStart {
                container_id: id.to_string(),
                pid: pid as u32,
                ..Default::default()
            },
        );
        tracing::info!(
            id,
            pid,
            image = %restore.image.display(),
            parent = ?restore.parent,
            validate_ms = validated_ms,
            criu_restore_ms = criu_ms,
            cuda_restore_ms = cuda_ms,
            total_ms = started.elapsed().as_millis() as u64,
            "restore complete"
        );
        Ok(StartResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }
}

/// A CRIU dump as the GPU orchestrator's callback runs it.
struct DumpJob {
    cmd: bridge::RuncCommand,
    bundle: PathBuf,
    criu_log: PathBuf,
}

impl DumpJob {
    async fn run(&self) -> Result<(), String> {
        let mut command = tokio::process::Command::from(self.cmd.to_command());
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        run_runc(command, "runc checkpoint", &self.bundle, &self.criu_log).await
    }
}

type GpuPlan = Option<(Orchestrator, Vec<CudaProcess>)>;

/// The container's CUDA processes and the orchestrator for the configured engine; `None` when
/// no process uses CUDA (or no driver is installed and no NVIDIA device is open).
async fn plan_gpu(
    config: &gpusnap_config::Config,
    pids: &[u32],
    checkpoint_dir: &Path,
) -> Result<GpuPlan, String> {
    let config = config.clone();
    // Engines that write files (posix) put their extents next to CRIU's images.
    let storage_dir = checkpoint_dir.to_path_buf();
    let pids: Vec<i32> = pids.iter().map(|&p| p as i32).collect();
    tokio::task::spawn_blocking(move || {
        match container_gpu::prepare_checkpoint_to(&config, &pids, Some(storage_dir)) {
            Ok(CheckpointGpu::CpuOnly) => Ok(None),
            Ok(CheckpointGpu::Cuda {
                orchestrator,
                processes,
            }) => Ok(Some((orchestrator, processes))),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Lock → checkpoint the CUDA processes → CRIU dump → (leave running: restore → unlock), on a
/// blocking thread: the driver calls block, and the dump is awaited from inside the callback.
async fn gpu_checkpoint(
    orch: Orchestrator,
    procs: Vec<CudaProcess>,
    leave_running: bool,
    dump: DumpJob,
    refreeze: Option<(std::sync::Arc<runc::Runc>, String)>,
) -> Result<(CheckpointReport, Orchestrator, std::time::Duration), String> {
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut dump_elapsed = std::time::Duration::ZERO;
        let report = orch
            .checkpoint(&procs, leave_running, || {
                let t = Instant::now();
                let r = handle.block_on(async {
                    if let Some((runc, id)) = &refreeze {
                        runc.pause(id).await.map_err(|e| {
                            format!("freeze {id} for the dump: {}", runc_error_text(&e))
                        })?;
                    }
                    let r = dump.run().await;
                    // A failed dump is rolled back by the driver, which needs the processes
                    // running.
                    if let (Err(_), Some((runc, id))) = (&r, &refreeze) {
                        let _ = runc.resume(id).await;
                    }
                    r
                });
                dump_elapsed = t.elapsed();
                r
            })
            .map_err(|e| match e.outcome {
                Outcome::BeforeMutation | Outcome::RolledBack => {
                    format!("{e}; the container keeps running")
                }
                Outcome::OutcomeUnknown => format!(
                    "{e}; the state of the container's CUDA processes is unknown: check them \
                     (or restart the container) before checkpointing again"
                ),
            })?;
        Ok((report, orch, dump_elapsed))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// CUDA restore + unlock of processes a checkpoint left CHECKPOINTED, in place (same pids).
async fn resume_cuda(
    orch: Orchestrator,
    records: Vec<gpusnap_cuda::orchestrate::ProcessRecord>,
) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        let targets: Vec<RestoreTarget> = records
            .into_iter()
            .map(|record| RestoreTarget {
                host_pid: record.host_pid,
                record,
            })
            .collect();
        orch.restore(&targets, &GpuMap::new())
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// After CRIU restored the tree: find each checkpointed CUDA process by its container pid,
/// restore its device memory (onto the gated GPUs) and unlock it.
async fn gpu_restore(
    driver: std::sync::Arc<gpusnap_cuda::Driver>,
    config: &gpusnap_config::Config,
    engine: &str,
    checkpoint_dir: &Path,
    map: GpuMap,
    records: Vec<gpusnap_cuda::orchestrate::ProcessRecord>,
    init_pid: u32,
) -> Result<gpusnap_cuda::orchestrate::RestoreReport, String> {
    let orchestrator = container_gpu::restore_orchestrator(
        driver,
        config,
        engine,
        Some(checkpoint_dir.to_path_buf()),
    )
    .map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || {
        let restored: Vec<i32> = crate::stats::cgroup_pids(init_pid)
            .unwrap_or_else(|| vec![init_pid])
            .into_iter()
            .map(|p| p as i32)
            .collect();
        let host_pids =
            gpusnap_cuda::discovery::map_restored_pids(&records, &restored, Path::new("/proc"))
                .map_err(|e| e.to_string())?;
        let targets: Vec<RestoreTarget> = records
            .into_iter()
            .zip(host_pids)
            .map(|(record, host_pid)| RestoreTarget { record, host_pid })
            .collect();
        orchestrator
            .restore(&targets, &map)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

fn ms_duration(ms: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(ms.max(0.0) / 1e3)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        a
    }

    #[test]
    fn absent_or_foreign_options_leave_the_task_running() {
        assert_eq!(
            checkpoint_options(None).unwrap(),
            CheckpointOptions::default()
        );
        let foreign = any("example.Other", vec![1, 2, 3]);
        assert!(!checkpoint_options(Some(&foreign)).unwrap().exit);
    }

    #[test]
    fn runc_checkpoint_options_are_decoded() {
        let mut o = CheckpointOptionsProto::new();
        o.exit = true;
        o.open_tcp = true;
        o.file_locks = true;
        o.cgroups_mode = "soft".into();
        o.work_path = "/tmp/work".into();
        let a = any(
            "containerd.runc.v1.CheckpointOptions",
            o.write_to_bytes().unwrap(),
        );
        let opts = checkpoint_options(Some(&a)).unwrap();
        assert!(opts.exit && opts.open_tcp && opts.file_locks);
        assert_eq!(opts.cgroups_mode, Some(CgroupsMode::Soft));
        assert_eq!(opts.work_path, Some(PathBuf::from("/tmp/work")));
    }

    #[test]
    fn bad_cgroups_mode_is_refused_with_its_name() {
        let mut o = CheckpointOptionsProto::new();
        o.cgroups_mode = "sideways".into();
        let a = any(
            "containerd.runc.v1.CheckpointOptions",
            o.write_to_bytes().unwrap(),
        );
        let err = checkpoint_options(Some(&a)).unwrap_err();
        assert!(err.contains("sideways"), "{err}");
    }
}
