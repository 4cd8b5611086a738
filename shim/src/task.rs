//! The containerd Task service over runc.
//!
//! Each RPC is a thin edge: it calls one method of [`TaskService`] that works with the shim's
//! own types and [`Error`], and converts the result once. Checkpoint and restore live in
//! `checkpoint.rs`, on top of the `gpusnap-transaction` crate.

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use async_trait::async_trait;
use containerd_shim::{
    api::{
        CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
        DeleteRequest, DeleteResponse, ExecProcessRequest, KillRequest, PauseRequest, PidsRequest,
        PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
        StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
        WaitRequest, WaitResponse,
    },
    asynchronous::{io::Stdio, ExitSignal},
    monitor::{monitor_subscribe, ExitEvent, Subject, Topic},
    protos::{
        api::{CheckpointTaskRequest, Empty},
        events::task::{
            TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM,
            TaskPaused, TaskResumed, TaskStart,
        },
        protobuf::{well_known_types::any::Any, MessageField},
        shim::oci::ProcessDetails,
        topics::*,
        types::task::ProcessInfo,
    },
    util::convert_to_timestamp,
    TtrpcContext,
};
use gpusnap_criu_bridge::{classify_runc_error, RuncErrorKind};
use tokio::sync::Mutex;

use crate::{
    container::{self, Container, StdioSetup},
    errors::*,
    events::EventSender,
    options::RuntimeSettings,
    process::{ExitInfo, Process, ProcessState},
    state::{InitState, PendingRestore, StartKind},
};

#[derive(Default)]
pub struct ShimState {
    pub containers: HashMap<String, Container>,
    /// Where the node's copies of image-volume checkpoints are (each container's
    /// `<restore.checkpoint_root>/.gpusnap-volumes` that exists): swept of copies no pod holds
    /// when a container is deleted and when the shim shuts down — after containerd removed the
    /// pod's image volumes (`gpusnap_transaction::volume`).
    pub volume_caches: std::collections::BTreeSet<PathBuf>,
    /// The image volumes this shim's containers restored from (their mount directories).
    pub volume_mounts: std::collections::BTreeSet<PathBuf>,
}

impl ShimState {
    pub fn container(&self, id: &str) -> Result<&Container> {
        self.containers
            .get(id)
            .ok_or_else(|| not_found(format!("container {id} not found")))
    }

    pub fn container_mut(&mut self, id: &str) -> Result<&mut Container> {
        self.containers
            .get_mut(id)
            .ok_or_else(|| not_found(format!("container {id} not found")))
    }
}

#[derive(Clone)]
pub struct TaskService {
    pub state: Arc<Mutex<ShimState>>,
    /// Held by every path that starts a process, by kill and by exit handling, so that an
    /// exit is only processed once the pid it belongs to is known and its start event has
    /// been sent, and never while a kill is being answered.
    pub lifecycle: Arc<Mutex<()>>,
    pub events: EventSender,
    pub namespace: String,
    pub exit: Arc<ExitSignal>,
}

fn stdio_of(terminal: bool, stdin: &str, stdout: &str, stderr: &str) -> Stdio {
    Stdio::new(stdin, stdout, stderr, terminal)
}

fn exit_event(container_id: &str, p: &Process, info: ExitInfo) -> TaskExit {
    TaskExit {
        container_id: container_id.to_string(),
        id: if p.exec_id.is_empty() {
            container_id.to_string()
        } else {
            p.exec_id.clone()
        },
        pid: p.pid as u32,
        exit_status: info.status,
        exited_at: MessageField::some(convert_to_timestamp(Some(info.at))),
        ..Default::default()
    }
}

impl TaskService {
    pub fn new(events: EventSender, namespace: String, exit: Arc<ExitSignal>) -> Self {
        let svc = Self {
            state: Arc::default(),
            lifecycle: Arc::default(),
            events,
            namespace,
            exit,
        };
        svc.spawn_exit_loop();
        svc
    }

    fn spawn_exit_loop(&self) {
        let svc = self.clone();
        tokio::spawn(async move {
            let mut sub = match monitor_subscribe(Topic::All).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot subscribe to process exits");
                    return;
                }
            };
            while let Some(ExitEvent { subject, exit_code }) = sub.rx.recv().await {
                if let Subject::Pid(pid) = subject {
                    svc.handle_exit(pid, exit_code).await;
                }
            }
        });
    }

    async fn handle_exit(&self, pid: i32, code: i32) {
        let _lifecycle = self.lifecycle.lock().await;
        let mut state = self.state.lock().await;
        for c in state.containers.values_mut() {
            if c.init.pid == pid && c.state.is_alive() {
                if c.kill_all_on_exit {
                    // The container has no PID namespace of its own (shared with the pod, the
                    // host, or another container), so its other processes outlive the init and
                    // would keep its stdio open. Like containerd-shim-runc-v2: kill them all,
                    // then report the exit.
                    c.kill_all_on_exit = false;
                    let (svc, id, runc) = (self.clone(), c.id.clone(), c.runc.clone());
                    tokio::spawn(async move {
                        let opts = runc::options::KillOpts { all: true };
                        if let Err(e) = runc.kill(&id, libc::SIGKILL as u32, Some(&opts)).await {
                            tracing::debug!(id, error = %runc_error_text(&e), "kill --all after the init exited");
                        }
                        let _lifecycle = svc.lifecycle.lock().await;
                        if let Some(c) = svc.state.lock().await.containers.get_mut(&id) {
                            svc.init_exited(c, code);
                        }
                    });
                    return;
                }
                self.init_exited(c, code);
                return;
            }
            if let Some(e) = c.execs.values_mut().find(|p| p.pid == pid && p.is_alive()) {
                let info = e.set_exited(code);
                self.events
                    .send(TASK_EXIT_EVENT_TOPIC, exit_event(&c.id, e, info));
                if c.running_execs() == 0 {
                    if let Some(code) = c.deferred_init_exit.take() {
                        self.report_init_exit(c, code);
                    }
                }
                return;
            }
        }
        tracing::trace!(
            pid,
            code,
            "exit of a process the shim does not track (runc or orphan)"
        );
    }

    /// The init exited: report it once every exec has (execs die with the init in its pid
    /// namespace; they are killed here in case the namespace is shared).
    fn init_exited(&self, c: &mut Container, code: i32) {
        if !c.state.is_alive() {
            return;
        }
        if c.running_execs() > 0 {
            c.deferred_init_exit = Some(code);
            for e in c.execs.values().filter(|p| p.is_alive()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(e.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return;
        }
        self.report_init_exit(c, code);
    }

    fn report_init_exit(&self, c: &mut Container, code: i32) {
        // An OOM kill can be what ended the init: report it before the exit, as containerd
        // expects (it marks the container OOMKilled only when TaskOOM came first).
        if let Some(oom) = c.oom.take() {
            oom.final_check();
        }
        c.state.exited();
        let info = c.init.set_exited(code);
        self.events
            .send(TASK_EXIT_EVENT_TOPIC, exit_event(&c.id, &c.init, info));
    }

    pub async fn runc_of(&self, id: &str) -> Result<Arc<runc::Runc>> {
        Ok(self.state.lock().await.container(id)?.runc.clone())
    }

    async fn bundle_of(&self, id: &str) -> Result<PathBuf> {
        Ok(self.state.lock().await.container(id)?.bundle.clone())
    }
}

/// The last error runc wrote to its JSON log, which says what went wrong far better than
/// its exit status.
pub fn runc_log_error(bundle: &std::path::Path) -> Option<String> {
    gpusnap_criu_bridge::runc_log_error(&RuntimeSettings::runc_log(bundle))
}

fn runc_failure(action: &str, err: &runc::error::Error, bundle: &std::path::Path) -> Error {
    let detail = runc_log_error(bundle).unwrap_or_else(|| runc_error_text(err));
    let msg = format!("{action}: {detail}");
    if classify_runc_error(&detail).is_not_found() {
        not_found(msg)
    } else {
        internal(msg)
    }
}

/// The container's runtime spec (`<bundle>/config.json`), when readable: read as the
/// transaction reads it (capped, `bundle_spec`).
fn read_spec(bundle: &std::path::Path) -> Option<serde_json::Value> {
    gpusnap_transaction::bundle_spec::read_bytes(bundle)
        .ok()
        .and_then(|d| serde_json::from_slice(&d).ok())
}

/// The OCI spec's annotations (CRI puts the pod's `pod_annotations` there).
fn spec_annotations(spec: Option<&serde_json::Value>) -> HashMap<String, String> {
    spec.and_then(|s| s.get("annotations").cloned())
        .and_then(|a| serde_json::from_value(a).ok())
        .unwrap_or_default()
}

/// Whether the container's processes can outlive its init: true unless the spec gives it a
/// PID namespace of its own (a `pid` namespace entry without a path), as
/// containerd-shim-runc-v2 decides (`ShouldKillAllOnExit`).
fn shares_pid_namespace(spec: Option<&serde_json::Value>) -> bool {
    let Some(namespaces) = spec
        .and_then(|s| s.pointer("/linux/namespaces"))
        .and_then(|n| n.as_array())
    else {
        return true;
    };
    !namespaces.iter().any(|ns| {
        ns.get("type").and_then(|t| t.as_str()) == Some("pid")
            && ns
                .get("path")
                .and_then(|p| p.as_str())
                .is_none_or(str::is_empty)
    })
}

/// Whether the spec gives the container NVIDIA devices (`/dev/nvidia*`).
fn has_nvidia_devices(spec: Option<&serde_json::Value>) -> bool {
    spec.and_then(|s| s.pointer("/linux/devices"))
        .and_then(|d| d.as_array())
        .is_some_and(|devices| {
            devices.iter().any(|d| {
                d.get("path")
                    .and_then(|p| p.as_str())
                    .is_some_and(|p| p.starts_with("/dev/nvidia"))
            })
        })
}

/// gpusnap's configuration for this container: the file (CRI's ConfigPath, else
/// `$GPUSNAP_CONFIG`, else the default path), overlaid by the container's `gpusnap.io/`
/// annotations. Invalid settings fail Create with the message naming the setting.
fn load_config(
    settings: &RuntimeSettings,
    annotations: &HashMap<String, String>,
) -> Result<gpusnap_config::Config> {
    let path = settings
        .config_path
        .clone()
        .or_else(|| std::env::var_os("GPUSNAP_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(gpusnap_config::DEFAULT_CONFIG_PATH));
    gpusnap_transaction::container_config::for_container(&path, annotations)
        .map_err(|e| invalid_argument(e.to_string()))
}

/// The restore a container's annotations ask for: a node-local checkpoint by name, or a
/// checkpoint image mounted as an image volume; both at once is refused.
fn pod_restore(
    spec: Option<&serde_json::Value>,
    annotations: &HashMap<String, String>,
    config: &gpusnap_config::Config,
) -> std::result::Result<Option<PendingRestore>, String> {
    let by_name = crate::restore_from::pending_restore(annotations, config)?;
    let by_volume = crate::restore_volume::pending_restore(spec, annotations, config)?;
    match (by_name, by_volume) {
        (Some(_), Some(_)) => Err(format!(
            "the container is annotated both {} and {}: restore from one checkpoint, the \
             node-local one by name or the image volume",
            gpusnap_config::RESTORE_FROM_ANNOTATION,
            gpusnap_config::RESTORE_FROM_VOLUME_ANNOTATION
        )),
        (named, volume) => Ok(named.or(volume)),
    }
}

fn decode_json<T: serde::de::DeserializeOwned>(what: &str, any: &MessageField<Any>) -> Result<T> {
    let any = any
        .as_ref()
        .ok_or_else(|| invalid_argument(format!("{what} is missing")))?;
    serde_json::from_slice(&any.value).map_err(|e| {
        invalid_argument(format!(
            "{what} ({}) is not valid runtime-spec JSON: {e}",
            any.type_url
        ))
    })
}

impl TaskService {
    async fn create_init(
        &self,
        id: &str,
        bundle: &std::path::Path,
        runc: &runc::Runc,
        settings: &RuntimeSettings,
        init: &mut Process,
    ) -> Result<()> {
        let setup =
            StdioSetup::new(&init.stdio).map_err(|e| internal(format!("set up stdio: {e}")))?;
        init.stdin = setup
            .pipes
            .start_copy(&init.stdio, &init.io)
            .map_err(|e| internal(format!("open stdio fifos: {e}")))?;
        let pid_file = bundle.join("init.pid");
        let opts = runc::options::CreateOpts {
            io: Some(setup.pipes.clone()),
            pid_file: Some(pid_file.clone()),
            console_socket: setup.console_path(),
            no_pivot: settings.no_pivot_root,
            no_new_keyring: settings.no_new_keyring,
            ..Default::default()
        };
        let started = std::time::Instant::now();
        if let Err(e) = runc.create(id, bundle, Some(&opts)).await {
            setup.abandon(init).await;
            return Err(runc_failure("runc create", &e, bundle));
        }
        init.pid = container::read_pid(&pid_file).map_err(internal)?;
        setup.finish(init).await.map_err(internal)?;
        tracing::info!(
            id,
            pid = init.pid,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "container created"
        );
        Ok(())
    }

    async fn create_task(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse> {
        let _lifecycle = self.lifecycle.lock().await;
        if self.state.lock().await.containers.contains_key(&req.id) {
            return Err(already_exists(format!(
                "container {} already exists in this shim",
                req.id
            )));
        }
        if req.id.is_empty() || req.bundle.is_empty() {
            return Err(invalid_argument(
                "create needs a container id and a bundle path",
            ));
        }
        let bundle = PathBuf::from(&req.bundle);
        let settings = RuntimeSettings::from_any(&self.namespace, req.options.as_ref())
            .map_err(invalid_argument)?;
        settings.save(&bundle).map_err(|e| {
            internal(format!(
                "write runtime settings into bundle {}: {e}",
                bundle.display()
            ))
        })?;
        let runc = Arc::new(settings.runc(&bundle).map_err(|e| {
            failed_precondition(format!(
                "runc binary {:?} is not usable ({e}); install runc or set BinaryName in the runtime options",
                settings.runc_binary
            ))
        })?);
        let spec = read_spec(&bundle);
        let annotations = spec_annotations(spec.as_ref());
        let config = load_config(&settings, &annotations)?;
        if has_nvidia_devices(spec.as_ref()) {
            gpusnap_transaction::gpu::prewarm_driver(&config.cuda.library);
        }
        let mounted = container::mount_rootfs(&bundle, &req.rootfs).map_err(internal)?;
        let unmount = || {
            if mounted {
                container::unmount_rootfs(&bundle);
            }
        };
        let stdio = stdio_of(req.terminal, &req.stdin, &req.stdout, &req.stderr);
        let mut init = Process::new("", stdio);
        let restore = if req.checkpoint.is_empty() {
            // A pod can ask to start from a node-local checkpoint (restore_from.rs) or from a
            // checkpoint image it mounts as an image volume (restore_volume.rs).
            pod_restore(spec.as_ref(), &annotations, &config).map_err(|e| {
                unmount();
                invalid_argument(e)
            })?
        } else {
            Some(PendingRestore {
                image: PathBuf::from(&req.checkpoint),
                parent: (!req.parent_checkpoint.is_empty())
                    .then(|| PathBuf::from(&req.parent_checkpoint)),
                rootfs_diff: None,
                // containerd passes only the directory (`ctr`, CRI): its own signature decides.
                signature_evidence: Default::default(),
                volume: None,
            })
        };
        if let Some(v) = restore.as_ref().and_then(|r| r.volume.as_ref()) {
            let mut state = self.state.lock().await;
            state.volume_caches.insert(v.cache.clone());
            state.volume_mounts.insert(v.mount.clone());
        }
        let state = match restore {
            Some(r) => InitState::CreatedFromCheckpoint(r),
            None => {
                if let Err(e) = self
                    .create_init(&req.id, &bundle, &runc, &settings, &mut init)
                    .await
                {
                    unmount();
                    return Err(e);
                }
                InitState::Created
            }
        };
        let pid = init.pid as u32;
        let mut c = Container {
            id: req.id.clone(),
            bundle: bundle.clone(),
            settings,
            config,
            runc,
            state,
            init,
            execs: HashMap::new(),
            rootfs_mounted: mounted,
            deferred_init_exit: None,
            oom: None,
            kill_all_on_exit: shares_pid_namespace(spec.as_ref()),
        };
        if matches!(c.state, InitState::Created) {
            // The cgroup exists from `runc create`: count OOM kills from now, so a workload
            // killed right after start is reported too.
            self.watch_oom(&mut c);
        }
        self.state.lock().await.containers.insert(req.id.clone(), c);
        self.events.send(
            TASK_CREATE_EVENT_TOPIC,
            TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                    ..Default::default()
                }),
                checkpoint: req.checkpoint.clone(),
                pid,
                ..Default::default()
            },
        );
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start_init(&self, id: &str) -> Result<StartResponse> {
        let (runc, bundle, kind) = {
            let mut state = self.state.lock().await;
            let c = state.container_mut(id)?;
            let kind = c.state.start(id)?;
            (c.runc.clone(), c.bundle.clone(), kind)
        };
        if let StartKind::Restore(restore) = kind {
            return self.start_restore(id, restore).await;
        }
        runc.start(id)
            .await
            .map_err(|e| runc_failure("runc start", &e, &bundle))?;
        let mut state = self.state.lock().await;
        let c = state
            .containers
            .get_mut(id)
            .ok_or_else(|| not_found(format!("container {id} was deleted while starting")))?;
        c.state.started();
        let pid = c.init.pid;
        self.events.send(
            TASK_START_EVENT_TOPIC,
            TaskStart {
                container_id: id.to_string(),
                pid: pid as u32,
                ..Default::default()
            },
        );
        Ok(StartResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    pub fn watch_oom(&self, c: &mut Container) {
        let events = self.events.clone();
        let cid = c.id.clone();
        c.oom = crate::oom::watch(c.init.pid as u32, move || {
            events.send(
                TASK_OOM_EVENT_TOPIC,
                TaskOOM {
                    container_id: cid.clone(),
                    ..Default::default()
                },
            )
        });
    }

    async fn start_exec(&self, id: &str, exec_id: &str) -> Result<StartResponse> {
        let (runc, bundle, spec, stdio) = {
            let state = self.state.lock().await;
            let c = state.container(id)?;
            if !c.state.is_alive() {
                return Err(failed_precondition(format!(
                    "container {id} is not running"
                )));
            }
            let p = c
                .execs
                .get(exec_id)
                .ok_or_else(|| not_found(format!("exec {exec_id} not found in container {id}")))?;
            if p.state != ProcessState::Created {
                return Err(failed_precondition(format!(
                    "exec {exec_id} was already started"
                )));
            }
            let spec = p
                .spec
                .clone()
                .ok_or_else(|| internal(format!("exec {exec_id} has no process spec")))?;
            (c.runc.clone(), c.bundle.clone(), spec, p.stdio.clone())
        };
        let mut proc_io = Process::new(exec_id, stdio.clone());
        let setup = StdioSetup::new(&stdio).map_err(|e| internal(format!("set up stdio: {e}")))?;
        proc_io.stdin = setup
            .pipes
            .start_copy(&stdio, &proc_io.io)
            .map_err(|e| internal(format!("open stdio fifos: {e}")))?;
        let pid_file = bundle.join(format!("exec-{exec_id}.pid"));
        let opts = runc::options::ExecOpts {
            io: Some(setup.pipes.clone()),
            pid_file: Some(pid_file.clone()),
            console_socket: setup.console_path(),
            detach: true,
        };
        if let Err(e) = runc.exec(id, &spec, Some(&opts)).await {
            setup.abandon(&proc_io).await;
            return Err(runc_failure(&format!("runc exec {exec_id}"), &e, &bundle));
        }
        let pid = container::read_pid(&pid_file).map_err(internal)?;
        let _ = std::fs::remove_file(&pid_file);
        proc_io.pid = pid;
        setup.finish(&mut proc_io).await.map_err(internal)?;
        let mut state = self.state.lock().await;
        let c = state.containers.get_mut(id).ok_or_else(|| {
            not_found(format!("container {id} was deleted while starting an exec"))
        })?;
        let p = c
            .execs
            .get_mut(exec_id)
            .ok_or_else(|| not_found(format!("exec {exec_id} was deleted while starting")))?;
        p.pid = pid;
        p.io = proc_io.io;
        p.pty = proc_io.pty;
        p.stdin = proc_io.stdin;
        p.state = ProcessState::Running;
        self.events.send(
            TASK_EXEC_STARTED_EVENT_TOPIC,
            TaskExecStarted {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                pid: pid as u32,
                ..Default::default()
            },
        );
        Ok(StartResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    async fn task_state(&self, req: StateRequest) -> Result<StateResponse> {
        let state = self.state.lock().await;
        let c = state.container(&req.id)?;
        let p = c.process(&req.exec_id).ok_or_else(|| {
            not_found(format!(
                "exec {} not found in container {}",
                req.exec_id, req.id
            ))
        })?;
        let mut resp = StateResponse {
            id: if p.exec_id.is_empty() {
                c.id.clone()
            } else {
                p.exec_id.clone()
            },
            bundle: c.bundle.to_string_lossy().into_owned(),
            pid: p.pid as u32,
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exec_id: p.exec_id.clone(),
            ..Default::default()
        };
        resp.status = if req.exec_id.is_empty() {
            c.state.status()
        } else {
            p.status()
        }
        .into();
        if let Some(exit) = p.exit {
            resp.exit_status = exit.status;
            resp.exited_at = MessageField::some(convert_to_timestamp(Some(exit.at)));
        }
        Ok(resp)
    }

    async fn delete_exec(&self, id: &str, exec_id: &str) -> Result<DeleteResponse> {
        let p = {
            let mut state = self.state.lock().await;
            let c = state.container_mut(id)?;
            match c.execs.get(exec_id) {
                None => {
                    return Err(not_found(format!(
                        "exec {exec_id} not found in container {id}"
                    )))
                }
                Some(p) if p.is_alive() => {
                    return Err(failed_precondition(format!(
                        "exec {exec_id} is still running; kill it before deleting it"
                    )))
                }
                Some(_) => c.execs.remove(exec_id).expect("checked above"),
            }
        };
        p.shutdown_io().await;
        let exit = p.exit;
        Ok(DeleteResponse {
            pid: p.pid as u32,
            exit_status: exit.map(|e| e.status).unwrap_or_default(),
            exited_at: MessageField::some(convert_to_timestamp(exit.map(|e| e.at))),
            ..Default::default()
        })
    }

    async fn delete_task(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        if !req.exec_id.is_empty() {
            return self.delete_exec(&req.id, &req.exec_id).await;
        }
        let c = {
            let mut state = self.state.lock().await;
            let c = state.container(&req.id)?;
            if c.state.is_alive() || matches!(c.state, InitState::Restoring) {
                return Err(failed_precondition(format!(
                    "container {} is still running; kill it before deleting it",
                    req.id
                )));
            }
            state.containers.remove(&req.id).expect("checked above")
        };
        if c.state.has_runc_container() {
            let opts = runc::options::DeleteOpts { force: true };
            if let Err(e) = c.runc.delete(&c.id, Some(&opts)).await {
                let text = runc_log_error(&c.bundle).unwrap_or_else(|| runc_error_text(&e));
                if classify_runc_error(&text) != RuncErrorKind::ContainerMissing {
                    tracing::warn!(id = %c.id, error = %text, "runc delete failed");
                }
            }
        }
        c.init.shutdown_io().await;
        for e in c.execs.values() {
            e.shutdown_io().await;
        }
        if c.rootfs_mounted {
            container::unmount_rootfs(&c.bundle);
        }
        // containerd removes a pod's image volumes when the pod stops: the node's copies of
        // volume checkpoints that no pod holds any more go (gpusnap_transaction::volume).
        let cache = c
            .config
            .restore
            .checkpoint_root
            .join(gpusnap_transaction::volume::CACHE_DIR);
        if cache.is_dir() {
            self.state.lock().await.volume_caches.insert(cache.clone());
            let _ = tokio::task::spawn_blocking(move || gpusnap_transaction::volume::sweep(&cache))
                .await;
        }
        let exit = c.init.exit;
        let exited_at = MessageField::some(convert_to_timestamp(exit.map(|e| e.at)));
        let exit_status = exit.map(|e| e.status).unwrap_or_default();
        self.events.send(
            TASK_DELETE_EVENT_TOPIC,
            TaskDelete {
                container_id: c.id.clone(),
                pid: c.init.pid as u32,
                exit_status,
                exited_at: exited_at.clone(),
                id: c.id.clone(),
                ..Default::default()
            },
        );
        Ok(DeleteResponse {
            pid: c.init.pid as u32,
            exit_status,
            exited_at,
            ..Default::default()
        })
    }

    async fn pids_of(&self, req: PidsRequest) -> Result<PidsResponse> {
        let (runc, bundle, execs) = {
            let state = self.state.lock().await;
            let c = state.container(&req.id)?;
            let execs: HashMap<i32, String> = c
                .execs
                .values()
                .map(|p| (p.pid, p.exec_id.clone()))
                .collect();
            (c.runc.clone(), c.bundle.clone(), execs)
        };
        let pids = runc
            .ps(&req.id)
            .await
            .map_err(|e| runc_failure("runc ps", &e, &bundle))?;
        let mut processes = Vec::with_capacity(pids.len());
        for pid in pids {
            let mut info = ProcessInfo {
                pid: pid as u32,
                ..Default::default()
            };
            if let Some(exec_id) = execs.get(&(pid as i32)) {
                let details = ProcessDetails {
                    exec_id: exec_id.clone(),
                    ..Default::default()
                };
                let any = containerd_shim::util::convert_to_any(Box::new(details))
                    .map_err(|e| internal(format!("encode process details: {e}")))?;
                info.info = MessageField::some(any);
            }
            processes.push(info);
        }
        Ok(PidsResponse {
            processes,
            ..Default::default()
        })
    }

    async fn pause_task(&self, id: &str) -> Result<()> {
        let (runc, bundle) = {
            let mut state = self.state.lock().await;
            let c = state.container_mut(id)?;
            if let Some(frozen) = gpusnap_transaction::cgroup::frozen(c.init.pid as u32) {
                c.state.reconcile(frozen);
            }
            // Claims the transition first, so a checkpoint cannot start in between.
            c.state.pause(id)?;
            (c.runc.clone(), c.bundle.clone())
        };
        if let Err(e) = runc.pause(id).await {
            if let Ok(c) = self.state.lock().await.container_mut(id) {
                c.state.resumed();
            }
            return Err(runc_failure("runc pause", &e, &bundle));
        }
        self.events.send(
            TASK_PAUSED_EVENT_TOPIC,
            TaskPaused {
                container_id: id.to_string(),
                ..Default::default()
            },
        );
        Ok(())
    }

    async fn resume_task(&self, id: &str) -> Result<()> {
        let (runc, bundle) = {
            let mut state = self.state.lock().await;
            let c = state.container_mut(id)?;
            if let Some(frozen) = gpusnap_transaction::cgroup::frozen(c.init.pid as u32) {
                c.state.reconcile(frozen);
            }
            c.state.check_resume(id)?;
            (c.runc.clone(), c.bundle.clone())
        };
        runc.resume(id)
            .await
            .map_err(|e| runc_failure("runc resume", &e, &bundle))?;
        let pending = self.state.lock().await.container_mut(id)?.state.resumed();
        if let Some(pending) = pending {
            crate::checkpoint::resume_cuda(id, pending).await?;
        }
        self.events.send(
            TASK_RESUMED_EVENT_TOPIC,
            TaskResumed {
                container_id: id.to_string(),
                ..Default::default()
            },
        );
        Ok(())
    }

    async fn kill_task(&self, req: KillRequest) -> Result<()> {
        // Exits wait until the kill has been answered, as in containerd-shim-runc-v2 (whose
        // Kill holds the process lock that exit handling needs). Otherwise a process that
        // exits on its own while `runc kill` runs is reported first; containerd then deletes
        // the task and closes its connection, and the Kill in flight fails with "ttrpc:
        // closed" instead of "not found", failing the pod's StopPodSandbox (critest's
        // HostNetwork tests, under load).
        let _lifecycle = self.lifecycle.lock().await;
        let (runc, bundle, target) = {
            let state = self.state.lock().await;
            let c = state.container(&req.id)?;
            let p = c.process(&req.exec_id).ok_or_else(|| {
                not_found(format!(
                    "exec {} not found in container {}",
                    req.exec_id, req.id
                ))
            })?;
            let stopped = if req.exec_id.is_empty() {
                matches!(c.state, InitState::Stopped)
            } else {
                p.state == ProcessState::Stopped
            };
            if stopped {
                return Err(not_found(format!("process {} already finished", p.pid)));
            }
            if !c.state.has_runc_container() {
                return Err(failed_precondition(format!(
                    "container {} is waiting to be restored; start or delete it",
                    req.id
                )));
            }
            let target = (!req.exec_id.is_empty()).then_some(p.pid);
            (c.runc.clone(), c.bundle.clone(), target)
        };
        match target {
            Some(pid) => {
                let sig = nix::sys::signal::Signal::try_from(req.signal as i32).map_err(|_| {
                    invalid_argument(format!("{} is not a valid signal", req.signal))
                })?;
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).map_err(|e| {
                    if e == nix::errno::Errno::ESRCH {
                        not_found(format!("process {pid} already finished"))
                    } else {
                        internal(format!("signal {sig} to exec pid {pid}: {e}"))
                    }
                })?;
            }
            None => {
                let opts = runc::options::KillOpts { all: req.all };
                if let Err(e) = runc.kill(&req.id, req.signal, Some(&opts)).await {
                    let text = runc_log_error(&bundle).unwrap_or_else(|| runc_error_text(&e));
                    if kill_found_it_finished(&text) {
                        return Err(not_found(format!("process already finished: {text}")));
                    }
                    return Err(internal(format!("runc kill: {text}")));
                }
            }
        }
        Ok(())
    }

    async fn add_exec(&self, req: ExecProcessRequest) -> Result<()> {
        let spec: oci_spec::runtime::Process = decode_json("exec process spec", &req.spec)?;
        let mut state = self.state.lock().await;
        let c = state.container_mut(&req.id)?;
        if !c.state.is_alive() {
            return Err(failed_precondition(format!(
                "container {} is not running",
                req.id
            )));
        }
        if req.exec_id.is_empty() {
            return Err(invalid_argument("exec needs an exec id"));
        }
        if c.execs.contains_key(&req.exec_id) {
            return Err(already_exists(format!(
                "exec {} already exists in container {}",
                req.exec_id, req.id
            )));
        }
        let mut p = Process::new(
            &req.exec_id,
            stdio_of(req.terminal, &req.stdin, &req.stdout, &req.stderr),
        );
        p.spec = Some(spec);
        c.execs.insert(req.exec_id.clone(), p);
        self.events.send(
            TASK_EXEC_ADDED_EVENT_TOPIC,
            TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            },
        );
        Ok(())
    }

    async fn resize(&self, req: ResizePtyRequest) -> Result<()> {
        let state = self.state.lock().await;
        let c = state.container(&req.id)?;
        let p = c
            .process(&req.exec_id)
            .ok_or_else(|| not_found(format!("exec {} not found", req.exec_id)))?;
        let pty = p
            .pty
            .as_ref()
            .ok_or_else(|| failed_precondition("the process has no terminal to resize"))?;
        crate::console::resize(pty, req.width, req.height)
            .map_err(|e| internal(format!("resize terminal: {e}")))
    }

    async fn close_stdin(&self, req: CloseIORequest) -> Result<()> {
        let state = self.state.lock().await;
        let c = state.container(&req.id)?;
        let p = c
            .process(&req.exec_id)
            .ok_or_else(|| not_found(format!("exec {} not found", req.exec_id)))?;
        if req.stdin {
            if let Some(stdin) = &p.stdin {
                stdin.close();
            }
        }
        Ok(())
    }

    async fn update_task(&self, req: UpdateTaskRequest) -> Result<()> {
        let resources: oci_spec::runtime::LinuxResources =
            decode_json("resources", &req.resources)?;
        let runc = self.runc_of(&req.id).await?;
        let bundle = self.bundle_of(&req.id).await?;
        runc.update(&req.id, &resources)
            .await
            .map_err(|e| runc_failure("runc update", &e, &bundle))
    }

    async fn wait_task(&self, req: WaitRequest) -> Result<WaitResponse> {
        let mut rx = {
            let state = self.state.lock().await;
            let c = state.container(&req.id)?;
            c.process(&req.exec_id)
                .ok_or_else(|| not_found(format!("exec {} not found", req.exec_id)))?
                .wait_handle()
        };
        let info = loop {
            if let Some(info) = *rx.borrow_and_update() {
                break info;
            }
            if rx.changed().await.is_err() {
                return Err(not_found(format!(
                    "process of {} was deleted before it exited",
                    req.id
                )));
            }
        };
        Ok(WaitResponse {
            exit_status: info.status,
            exited_at: MessageField::some(convert_to_timestamp(Some(info.at))),
            ..Default::default()
        })
    }

    async fn task_stats(&self, req: StatsRequest) -> Result<StatsResponse> {
        let pid = {
            let state = self.state.lock().await;
            let c = state.container(&req.id)?;
            if !c.state.is_alive() {
                return Err(failed_precondition(format!(
                    "container {} is not running",
                    req.id
                )));
            }
            c.init.pid as u32
        };
        let any = tokio::task::spawn_blocking(move || crate::stats::collect(pid))
            .await
            .map_err(|e| internal(e.to_string()))?
            .map_err(internal)?;
        Ok(StatsResponse {
            stats: MessageField::some(any),
            ..Default::default()
        })
    }
}

#[async_trait]
impl containerd_shim::Task for TaskService {
    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        Ok(self.task_state(req).await?)
    }

    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        Ok(self.create_task(req).await?)
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        let _lifecycle = self.lifecycle.lock().await;
        Ok(if req.exec_id.is_empty() {
            self.start_init(&req.id).await?
        } else {
            self.start_exec(&req.id, &req.exec_id).await?
        })
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        Ok(self.delete_task(req).await?)
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        Ok(self.pids_of(req).await?)
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> TtrpcResult<Empty> {
        self.pause_task(&req.id).await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> TtrpcResult<Empty> {
        self.resume_task(&req.id).await?;
        Ok(Empty::new())
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        self.checkpoint_task(req).await?;
        Ok(Empty::new())
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        self.kill_task(req).await?;
        Ok(Empty::new())
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        self.add_exec(req).await?;
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        self.resize(req).await?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        self.close_stdin(req).await?;
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        self.update_task(req).await?;
        Ok(Empty::new())
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        Ok(self.wait_task(req).await?)
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        Ok(self.task_stats(req).await?)
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: ConnectRequest,
    ) -> TtrpcResult<ConnectResponse> {
        let state = self.state.lock().await;
        let task_pid = state
            .containers
            .get(&req.id)
            .map(|c| c.init.pid as u32)
            .unwrap_or_default();
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        // One shim can serve a whole pod: it only goes away with its last container.
        let (caches, mounts) = {
            let state = self.state.lock().await;
            if !state.containers.is_empty() {
                return Ok(Empty::new());
            }
            (state.volume_caches.clone(), state.volume_mounts.clone())
        };
        if caches.is_empty() {
            self.exit.signal();
            return Ok(Empty::new());
        }
        // The pod is gone. containerd removes its image volumes right after it stopped the
        // sandbox, which is what shuts this shim down: wait (briefly) for them to go, then
        // remove the copies only they held.
        let exit = self.exit.clone();
        tokio::spawn(async move {
            let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while mounts.iter().any(|m| m.exists()) && std::time::Instant::now() < give_up {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            let _ = tokio::task::spawn_blocking(move || {
                caches
                    .iter()
                    .for_each(|c| drop(gpusnap_transaction::volume::sweep(c)))
            })
            .await;
            exit.signal();
        });
        Ok(Empty::new())
    }
}

/// Whether `runc kill` failed because the container had already finished, which containerd
/// expects as NotFound (its StopContainer then goes on), as containerd-shim-runc-v2 maps it:
/// - "container not running", "no such process": runc saw it stopped;
/// - "os: process already finished": the init exited between runc's state check and its signal
///   (seen in critest's attach test, whose container exits as it is stopped);
/// - "does not exist": runc's state is already gone;
/// - runc 1.1's `kill --all` freezes the cgroup first, which fails with "invalid state
///   transition from stopped to paused" when the container stopped during the call.
fn kill_found_it_finished(runc_error: &str) -> bool {
    let text = runc_error.to_lowercase();
    [
        "not running",
        "no such process",
        "process already finished",
        "does not exist",
        "transition from stopped",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_of_a_finished_container_is_not_found() {
        for finished in [
            "container not running",
            "unable to signal init: os: process already finished",
            "No such process",
            "container \"x\" does not exist",
            "invalid state transition from stopped to paused",
        ] {
            assert!(kill_found_it_finished(finished), "{finished}");
        }
        assert!(!kill_found_it_finished("permission denied"));
    }

    #[test]
    fn kill_all_on_exit_unless_the_container_has_its_own_pid_namespace() {
        let own =
            serde_json::json!({"linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}});
        assert!(!shares_pid_namespace(Some(&own)));
        let joined = serde_json::json!({"linux": {"namespaces": [{"type": "pid", "path": "/proc/1/ns/pid"}]}});
        assert!(shares_pid_namespace(Some(&joined)));
        let host = serde_json::json!({"linux": {"namespaces": [{"type": "mount"}]}});
        assert!(shares_pid_namespace(Some(&host)));
        assert!(shares_pid_namespace(None));
    }
}
