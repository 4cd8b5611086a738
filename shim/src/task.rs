//! The containerd Task service: the ttrpc edge over [`Container`].
//!
//! Like containerd-shim-runc-v2's `task/service.go`, each RPC converts its request into the
//! shim's terms, finds the container, calls the operation on it, publishes the event and
//! converts the result back; errors become ttrpc statuses once, through `From<Error>`
//! (`errors.rs`). Exits of the container's processes arrive here from the reaper and are
//! reported in the order the container decides (`container/exit.rs`).

use std::{path::PathBuf, sync::Arc};

use async_trait::async_trait;
use containerd_shim::{
    api::{
        CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
        DeleteRequest, DeleteResponse, ExecProcessRequest, KillRequest, PauseRequest, PidsRequest,
        PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
        StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
        WaitRequest, WaitResponse,
    },
    asynchronous::ExitSignal,
    monitor::{monitor_subscribe, ExitEvent, Subject, Topic},
    protos::{
        api::{CheckpointTaskRequest, Empty},
        events::task::{
            TaskExecAdded, TaskExecStarted, TaskOOM, TaskPaused, TaskResumed, TaskStart,
        },
        protobuf::MessageField,
        topics::*,
    },
    TtrpcContext,
};
use tokio::sync::Mutex;

use crate::{
    checkpoint::{checkpoint_options, CHECKPOINT_OPTIONS},
    container::{Container, CreateSpec, Exit, ExitOutcome},
    containers::ShimState,
    errors::*,
    events::EventSender,
    options::RuntimeSettings,
};

mod convert;

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

    async fn container(&self, id: &str) -> Result<Arc<Container>> {
        self.state.lock().await.container(id)
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
        let state = self.state.lock().await;
        for c in state.containers.values() {
            match c.exited(pid, code).await {
                ExitOutcome::NotOurs => continue,
                ExitOutcome::Report(exits) => self.publish_exits(exits),
                ExitOutcome::KillAllFirst => {
                    let (svc, c) = (self.clone(), c.clone());
                    tokio::spawn(async move {
                        c.kill_all_after_exit().await;
                        let _lifecycle = svc.lifecycle.lock().await;
                        svc.publish_exits(c.init_exit(code).await);
                    });
                }
            }
            return;
        }
        tracing::trace!(
            pid,
            code,
            "exit of a process the shim does not track (runc or orphan)"
        );
    }

    fn publish_exits(&self, exits: Vec<Exit>) {
        for e in exits {
            self.events
                .send(TASK_EXIT_EVENT_TOPIC, convert::task_exit(e));
        }
    }

    fn publish_start(&self, container_id: &str, exec_id: &str, pid: u32) {
        if exec_id.is_empty() {
            let event = TaskStart {
                container_id: container_id.to_string(),
                pid,
                ..Default::default()
            };
            self.events.send(TASK_START_EVENT_TOPIC, event);
        } else {
            let event = TaskExecStarted {
                container_id: container_id.to_string(),
                exec_id: exec_id.to_string(),
                pid,
                ..Default::default()
            };
            self.events.send(TASK_EXEC_STARTED_EVENT_TOPIC, event);
        }
    }
}

#[async_trait]
impl containerd_shim::Task for TaskService {
    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        let c = self.container(&req.id).await?;
        let p = c.process_state(&req.exec_id).await?;
        Ok(convert::state_response(&c.bundle, p))
    }

    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        let _lifecycle = self.lifecycle.lock().await;
        if self.state.lock().await.containers.contains_key(&req.id) {
            let msg = format!("container {} already exists in this shim", req.id);
            return Err(already_exists(msg).into());
        }
        if req.id.is_empty() || req.bundle.is_empty() {
            return Err(invalid_argument("create needs a container id and a bundle path").into());
        }
        let path = |p: &str| (!p.is_empty()).then(|| PathBuf::from(p));
        let (events, cid) = (self.events.clone(), req.id.clone());
        let c = Container::create(CreateSpec {
            id: req.id.clone(),
            bundle: PathBuf::from(&req.bundle),
            rootfs: &req.rootfs,
            stdio: convert::stdio(req.terminal, &req.stdin, &req.stdout, &req.stderr),
            settings: RuntimeSettings::from_any(&self.namespace, req.options.as_ref())
                .map_err(Error::from)?,
            checkpoint: path(&req.checkpoint),
            parent_checkpoint: path(&req.parent_checkpoint),
            on_oom: Arc::new(move || {
                let event = TaskOOM {
                    container_id: cid.clone(),
                    ..Default::default()
                };
                events.send(TASK_OOM_EVENT_TOPIC, event)
            }),
        })
        .await?;
        let pid = c.init_pid().await;
        self.state.lock().await.insert(c);
        self.events
            .send(TASK_CREATE_EVENT_TOPIC, convert::task_create(req, pid));
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        let _lifecycle = self.lifecycle.lock().await;
        let c = self.container(&req.id).await?;
        let pid = if req.exec_id.is_empty() {
            let pid = c.start().await?;
            // Created is not alive, so a Delete may run while runc starts it: the task is then
            // gone, and no TaskStart may follow its TaskDelete.
            if !self.state.lock().await.containers.contains_key(&req.id) {
                return Err(
                    not_found(format!("container {} was deleted while starting", req.id)).into(),
                );
            }
            pid
        } else {
            c.start_exec(&req.exec_id).await?
        };
        self.publish_start(&req.id, &req.exec_id, pid);
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        if !req.exec_id.is_empty() {
            let c = self.container(&req.id).await?;
            let p = c.delete_exec(&req.exec_id).await?;
            return Ok(convert::delete_response(p.pid, p.exit));
        }
        let removed = Container::remove(&mut self.state.lock().await.containers, &req.id).await?;
        let d = removed.delete().await;
        if let Some(cache) = d.volume_cache {
            self.state.lock().await.volume_caches.insert(cache);
        }
        let event = convert::task_delete(&req.id, d.pid, d.exit);
        self.events.send(TASK_DELETE_EVENT_TOPIC, event);
        Ok(convert::delete_response(d.pid, d.exit))
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        let pids = self.container(&req.id).await?.pids().await?;
        Ok(convert::pids_response(pids)?)
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> TtrpcResult<Empty> {
        self.container(&req.id).await?.pause().await?;
        let event = TaskPaused {
            container_id: req.id,
            ..Default::default()
        };
        self.events.send(TASK_PAUSED_EVENT_TOPIC, event);
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> TtrpcResult<Empty> {
        self.container(&req.id).await?.resume().await?;
        let event = TaskResumed {
            container_id: req.id,
            ..Default::default()
        };
        self.events.send(TASK_RESUMED_EVENT_TOPIC, event);
        Ok(Empty::new())
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        let options = req.options.as_ref();
        let given = options.is_some_and(|a| a.type_url.ends_with(CHECKPOINT_OPTIONS));
        let opts = checkpoint_options(options).map_err(Error::from)?;
        let image_dir = if req.path.is_empty() {
            opts.image_path.clone()
        } else {
            Some(PathBuf::from(&req.path))
        }
        .ok_or_else(|| invalid_argument("checkpoint needs a path (request path or image_path)"))?;
        let c = self.container(&req.id).await?;
        c.checkpoint(image_dir, opts, given).await?;
        Ok(Empty::new())
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        // Exits wait until the kill has been answered, as in containerd-shim-runc-v2 (whose
        // Kill holds the process lock that exit handling needs). Otherwise a process that
        // exits on its own while `runc kill` runs is reported first; containerd then deletes
        // the task and closes its connection, and the Kill in flight fails with "ttrpc:
        // closed" instead of "not found", failing the pod's StopPodSandbox (critest's
        // HostNetwork tests, under load).
        let _lifecycle = self.lifecycle.lock().await;
        let c = self.container(&req.id).await?;
        c.kill(&req.exec_id, req.signal, req.all).await?;
        Ok(Empty::new())
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        let spec: oci_spec::runtime::Process =
            convert::decode_json("exec process spec", &req.spec)?;
        let stdio = convert::stdio(req.terminal, &req.stdin, &req.stdout, &req.stderr);
        let c = self.container(&req.id).await?;
        c.add_exec(&req.exec_id, stdio, spec).await?;
        let event = TaskExecAdded {
            container_id: req.id,
            exec_id: req.exec_id,
            ..Default::default()
        };
        self.events.send(TASK_EXEC_ADDED_EVENT_TOPIC, event);
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        let c = self.container(&req.id).await?;
        c.resize_pty(&req.exec_id, req.width, req.height).await?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        let c = self.container(&req.id).await?;
        c.close_io(&req.exec_id, req.stdin).await?;
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        let resources: oci_spec::runtime::LinuxResources =
            convert::decode_json("resources", &req.resources)?;
        self.container(&req.id).await?.update(&resources).await?;
        Ok(Empty::new())
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        // The wait holds only the process's exit watch, not the container: a deleted process
        // ends it.
        let watch = self
            .container(&req.id)
            .await?
            .exit_watch(&req.exec_id)
            .await?;
        let info = watch.exited().await?;
        Ok(WaitResponse {
            exit_status: info.status,
            exited_at: convert::timestamp(Some(info)),
            ..Default::default()
        })
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        let stats = self.container(&req.id).await?.stats().await?;
        Ok(StatsResponse {
            stats: MessageField::some(stats),
            ..Default::default()
        })
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: ConnectRequest,
    ) -> TtrpcResult<ConnectResponse> {
        let task_pid = match self.container(&req.id).await {
            Ok(c) => c.init_pid().await,
            Err(_) => 0,
        };
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        let Some(sweep) = self.state.lock().await.final_sweep() else {
            return Ok(Empty::new());
        };
        match sweep {
            None => self.exit.signal(),
            Some(sweep) => {
                let exit = self.exit.clone();
                tokio::spawn(async move {
                    sweep.run().await;
                    exit.signal();
                });
            }
        }
        Ok(Empty::new())
    }
}
