//! Driving a rig's containerd through CRI, the way the kubelet does, plus a private OCI
//! registry on loopback.
//!
//! - [`CriClient`]: a blocking CRI (`runtime.v1`) client over containerd's unix socket
//!   (`k8s-cri` + tonic), one call at a time with a deadline.
//! - [`CriNode`]: a CRI-enabled [`Rig`] playing one Kubernetes node: its own gpusnap config file
//!   (handed to the shim as the `gpusnap` runtime's `options.ConfigPath`, or through
//!   `$GPUSNAP_CONFIG` in containerd's environment) with `restore.checkpoint_root` under the
//!   node's own directory, the pause image imported into CRI's `k8s.io` namespace, and helpers for
//!   pods with host networking (no CNI needed) and containers. Every pod it started is stopped
//!   and removed when it is dropped, before the rig itself is torn down.
//! - [`Registry`] (re-exported from [`crate::registry`]): a private OCI registry on loopback,
//!   and [`write_plain_http_hosts`], the `hosts.toml` tree that lets CRI pull from it over
//!   plain HTTP.
//!
//! Pods are put under the cgroup parent `/<rig namespace>/cri`, so that the rig's teardown
//! (which kills whatever lives in cgroups under `/<rig namespace>/`) also catches containers
//! that CRI could not remove.

use std::collections::HashMap;
use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
    CheckpointContainerRequest, ContainerConfig, ContainerMetadata, ContainerState,
    ContainerStatus, ContainerStatusRequest, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    ImageStatusRequest, KeyValue, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
    ListContainersRequest, NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
    PullImageRequest, RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::cmd::{run_with_timeout, OutputExt};
use crate::paths;
use crate::rig::{Rig, RigOptions, Runtime, PAUSE_IMAGE};
use crate::wait::wait_until;

// The registry used to live here; existing users import it from this module.
pub use crate::registry::{write_plain_http_hosts, Registry, REGISTRY_BIN};

/// containerd's CRI plugin keeps everything in this containerd namespace.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// Deadline of one CRI call (the kubelet's default runtime request timeout is 2 minutes).
pub const CRI_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Where the gpusnap shim keeps runc state for CRI containers.
pub const CRI_RUNC_ROOT: &str = "/run/containerd/runc/k8s.io";

/// A blocking CRI client.
pub struct CriClient {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

/// A CRI call that failed: the gRPC code and containerd's message.
#[derive(Debug, Clone)]
pub struct CriError {
    pub call: &'static str,
    pub code: tonic::Code,
    pub message: String,
}

impl std::fmt::Display for CriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CRI {} failed ({:?}): {}",
            self.call, self.code, self.message
        )
    }
}

impl std::error::Error for CriError {}

impl CriClient {
    /// Connects to containerd's gRPC socket (the CRI services are served there).
    pub fn connect(socket: &Path) -> Result<CriClient> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("tokio runtime for the CRI client")?;
        let path = socket.to_path_buf();
        let channel = rt
            .block_on(async move {
                Endpoint::try_from("http://[::]:0")?
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
            })
            .with_context(|| format!("connecting to CRI at {}", socket.display()))?;
        Ok(CriClient {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    fn block<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> std::result::Result<T, CriError> {
        self.rt.block_on(async {
            match tokio::time::timeout(CRI_CALL_TIMEOUT, fut).await {
                Ok(Ok(resp)) => Ok(resp.into_inner()),
                Ok(Err(status)) => Err(CriError {
                    call,
                    code: status.code(),
                    message: status.message().to_string(),
                }),
                Err(_) => Err(CriError {
                    call,
                    code: tonic::Code::DeadlineExceeded,
                    message: format!("no answer within {CRI_CALL_TIMEOUT:?}"),
                }),
            }
        })
    }

    pub fn run_pod_sandbox(
        &self,
        config: PodSandboxConfig,
        runtime_handler: &str,
    ) -> std::result::Result<String, CriError> {
        let mut c = self.runtime.clone();
        let req = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        self.block("RunPodSandbox", async move { c.run_pod_sandbox(req).await })
            .map(|r| r.pod_sandbox_id)
    }

    pub fn stop_pod_sandbox(&self, id: &str) -> std::result::Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.block(
            "StopPodSandbox",
            async move { c.stop_pod_sandbox(req).await },
        )
        .map(|_| ())
    }

    pub fn remove_pod_sandbox(&self, id: &str) -> std::result::Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.block("RemovePodSandbox", async move {
            c.remove_pod_sandbox(req).await
        })
        .map(|_| ())
    }

    pub fn create_container(
        &self,
        pod_id: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> std::result::Result<String, CriError> {
        let mut c = self.runtime.clone();
        let req = CreateContainerRequest {
            pod_sandbox_id: pod_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        self.block(
            "CreateContainer",
            async move { c.create_container(req).await },
        )
        .map(|r| r.container_id)
    }

    pub fn start_container(&self, id: &str) -> std::result::Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = StartContainerRequest {
            container_id: id.to_string(),
        };
        self.block(
            "StartContainer",
            async move { c.start_container(req).await },
        )
        .map(|_| ())
    }

    pub fn stop_container(&self, id: &str, timeout_s: i64) -> std::result::Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = StopContainerRequest {
            container_id: id.to_string(),
            timeout: timeout_s,
        };
        self.block("StopContainer", async move { c.stop_container(req).await })
            .map(|_| ())
    }

    pub fn remove_container(&self, id: &str) -> std::result::Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = RemoveContainerRequest {
            container_id: id.to_string(),
        };
        self.block(
            "RemoveContainer",
            async move { c.remove_container(req).await },
        )
        .map(|_| ())
    }

    /// `ContainerStatus` with `verbose` (the `info` map carries containerd's JSON, with the pid).
    pub fn container_status(
        &self,
        id: &str,
    ) -> std::result::Result<(ContainerStatus, HashMap<String, String>), CriError> {
        let mut c = self.runtime.clone();
        let req = ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: true,
        };
        let r = self.block(
            "ContainerStatus",
            async move { c.container_status(req).await },
        )?;
        let status = r.status.ok_or_else(|| CriError {
            call: "ContainerStatus",
            code: tonic::Code::Internal,
            message: "answer without a status".into(),
        })?;
        Ok((status, r.info))
    }

    /// Ids of the containers CRI lists (any state).
    pub fn list_containers(&self) -> std::result::Result<Vec<String>, CriError> {
        let mut c = self.runtime.clone();
        let req = ListContainersRequest { filter: None };
        self.block(
            "ListContainers",
            async move { c.list_containers(req).await },
        )
        .map(|r| r.containers.into_iter().map(|c| c.id).collect())
    }

    /// `ExecSync`: (exit code, stdout, stderr).
    pub fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout_s: i64,
    ) -> std::result::Result<(i32, Vec<u8>, Vec<u8>), CriError> {
        let mut c = self.runtime.clone();
        let req = ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: timeout_s,
        };
        self.block("ExecSync", async move { c.exec_sync(req).await })
            .map(|r| (r.exit_code, r.stdout, r.stderr))
    }

    /// `CheckpointContainer` (what the kubelet's checkpoint API calls): the archive goes to
    /// `location`; `timeout_s` 0 means CRI's default.
    pub fn checkpoint_container(
        &self,
        id: &str,
        location: &Path,
        timeout_s: i64,
    ) -> std::result::Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = CheckpointContainerRequest {
            container_id: id.to_string(),
            location: location.to_string_lossy().into_owned(),
            timeout: timeout_s,
        };
        self.block("CheckpointContainer", async move {
            c.checkpoint_container(req).await
        })
        .map(|_| ())
    }

    /// `PullImage`; returns the image ref containerd answers with (the image id).
    pub fn pull_image(&self, image: &str) -> std::result::Result<String, CriError> {
        let mut c = self.images.clone();
        let req = PullImageRequest {
            image: Some(ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        };
        self.block("PullImage", async move { c.pull_image(req).await })
            .map(|r| r.image_ref)
    }

    /// `ImageStatus`: the image's id and its repo tags and digests, `None` when CRI does not
    /// know it.
    pub fn image_status(
        &self,
        image: &str,
    ) -> std::result::Result<Option<k8s_cri::v1::Image>, CriError> {
        let mut c = self.images.clone();
        let req = ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            verbose: false,
        };
        self.block("ImageStatus", async move { c.image_status(req).await })
            .map(|r| r.image)
    }
}

/// How a [`CriNode`] hands its gpusnap config file to the shim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigVia {
    /// `[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap.options]
    /// ConfigPath = ...` (CRI sends it as `runtimeoptions.v1.Options`).
    RuntimeOptions,
    /// `GPUSNAP_CONFIG` in containerd's environment, inherited by the shim.
    Env,
}

/// Options for [`CriNode::start`].
#[derive(Clone, Debug)]
pub struct CriNodeOptions {
    /// Appended to the node's gpusnap config file (which already sets
    /// `[restore] checkpoint_root`), e.g. a `[cuda]` table.
    pub gpusnap_config: String,
    pub config_via: ConfigVia,
    /// A registry CRI may pull from over plain HTTP.
    pub registry_host: Option<String>,
    /// Further rig options (`cri`, `require_gpusnap`, the gpusnap runtime options, the registry
    /// config path and containerd's environment are set by the node).
    pub rig: RigOptions,
}

impl Default for CriNodeOptions {
    fn default() -> Self {
        CriNodeOptions {
            gpusnap_config: String::new(),
            config_via: ConfigVia::RuntimeOptions,
            registry_host: None,
            rig: RigOptions::default(),
        }
    }
}

/// A pod started with [`CriNode::run_pod`].
#[derive(Clone, Debug)]
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
}

/// What to run in a pod (the fields of a Kubernetes container spec the tests need).
#[derive(Clone, Debug, Default)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The busybox counter ([`crate::counter::counter_command`]) as CRI container `counter`.
pub fn counter_container(run: &str) -> ContainerSpec {
    ContainerSpec {
        name: "counter".into(),
        image: crate::rig::BUSYBOX_IMAGE.into(),
        command: crate::counter::counter_command(run),
        env: vec![],
    }
}

/// A container's user, as a pod's `securityContext` gives it (`runAsUser`, `runAsGroup`,
/// `allowPrivilegeEscalation: false`, which the kubelet sends as `no_new_privs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: i64,
    pub gid: i64,
    pub no_new_privs: bool,
}

/// A CRI-enabled rig playing one Kubernetes node.
pub struct CriNode {
    pub cri: CriClient,
    pub rig: Rig,
    dir: tempfile::TempDir,
    config_path: PathBuf,
    pods: Mutex<Vec<String>>,
    containers: Mutex<Vec<String>>,
}

impl CriNode {
    pub fn start(opts: CriNodeOptions) -> Result<CriNode> {
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-node-")
            .tempdir()
            .context("node directory")?;
        let checkpoint_root = dir.path().join("checkpoints");
        fs::create_dir_all(&checkpoint_root)?;
        let config_path = dir.path().join("gpusnap.toml");
        fs::write(
            &config_path,
            // The node's own blob store, removed with it (not the machine's).
            format!(
                "[restore]\ncheckpoint_root = \"{}\"\n\n{}\n\n[store]\nroot = \"{}\"\n",
                checkpoint_root.display(),
                opts.gpusnap_config,
                dir.path().join("store").display()
            ),
        )?;
        let mut rig_opts = RigOptions {
            cri: true,
            require_gpusnap: true,
            import_images: false,
            ..opts.rig
        };
        match opts.config_via {
            ConfigVia::RuntimeOptions => rig_opts
                .gpusnap_runtime_options
                .push(("ConfigPath".into(), config_path.display().to_string())),
            ConfigVia::Env => rig_opts
                .containerd_env
                .push(("GPUSNAP_CONFIG".into(), config_path.display().to_string())),
        }
        if let Some(host) = &opts.registry_host {
            let hosts = dir.path().join("certs.d");
            write_plain_http_hosts(&hosts, host)?;
            rig_opts.cri_registry_config_path = Some(hosts);
        }
        let rig = Rig::start_with(rig_opts)?;
        let cri = CriClient::connect(&rig.address())?;
        let node = CriNode {
            cri,
            rig,
            dir,
            config_path,
            pods: Mutex::new(Vec::new()),
            containers: Mutex::new(Vec::new()),
        };
        node.import_image(&paths::pause_archive(), PAUSE_IMAGE)?;
        Ok(node)
    }

    /// The node's gpusnap config file.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// `restore.checkpoint_root` of this node's shim.
    pub fn checkpoint_root(&self) -> PathBuf {
        self.dir.path().join("checkpoints")
    }

    /// A scratch directory of this node (removed with it).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// `ctr` against this node's containerd in CRI's namespace.
    pub fn ctr_k8s<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String> {
        let mut cmd = Command::new(paths::rig_bin_dir().join("ctr"));
        cmd.arg("--address")
            .arg(self.rig.address())
            .args(["--namespace", CRI_NAMESPACE])
            .args(args)
            .env("PATH", self.rig.path_env());
        let shown: Vec<String> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        let out = run_with_timeout(cmd, None, Duration::from_secs(120))?;
        ensure!(
            out.status.success(),
            "`ctr -n {CRI_NAMESPACE} {}` failed: {}",
            shown.join(" "),
            out.describe()
        );
        Ok(out.stdout_str())
    }

    /// `ctr images import` into CRI's namespace, then waits until CRI's image store has it.
    pub fn import_image(&self, archive: &Path, name: &str) -> Result<()> {
        self.ctr_k8s(&[
            std::ffi::OsStr::new("images"),
            "import".as_ref(),
            archive.as_os_str(),
        ])
        .with_context(|| format!("importing {}", archive.display()))?;
        ensure!(
            wait_until(Duration::from_secs(20), || {
                matches!(self.cri.image_status(name), Ok(Some(_)))
            }),
            "CRI does not see image {name} after importing {}",
            archive.display()
        );
        Ok(())
    }

    /// A pod with host networking (no CNI), its own pid namespace per container, and
    /// `annotations`, run with `runtime_handler`.
    pub fn run_pod(
        &self,
        name: &str,
        annotations: &[(&str, &str)],
        runtime_handler: &str,
    ) -> Result<Pod> {
        let uid = format!("uid-{name}-{}", std::process::id());
        let log_dir = self.dir.path().join("pods").join(&uid);
        fs::create_dir_all(&log_dir)?;
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.to_string(),
                uid,
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: log_dir.display().to_string(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            labels: [("app".to_string(), name.to_string())].into(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/{}/cri", self.rig.namespace()),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = self
            .cri
            .run_pod_sandbox(config.clone(), runtime_handler)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("pod {name}"))?;
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.clone());
        Ok(Pod { id, config })
    }

    /// `CreateContainer` in `pod`; the error is the CRI error, for tests that expect one.
    pub fn create_container(
        &self,
        pod: &Pod,
        spec: &ContainerSpec,
    ) -> std::result::Result<String, CriError> {
        self.create_container_as(pod, spec, None)
    }

    /// [`CriNode::create_container`] with the container's user set as the kubelet sets it.
    pub fn create_container_as(
        &self,
        pod: &Pod,
        spec: &ContainerSpec,
        run_as: Option<RunAs>,
    ) -> std::result::Result<String, CriError> {
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: spec.name.clone(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: spec.image.clone(),
                user_specified_image: spec.image.clone(),
                ..Default::default()
            }),
            command: spec.command.clone(),
            envs: spec
                .env
                .iter()
                .map(|(k, v)| KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            log_path: format!("{}.log", spec.name),
            labels: [(
                "io.kubernetes.container.name".to_string(),
                spec.name.clone(),
            )]
            .into(),
            linux: Some(k8s_cri::v1::LinuxContainerConfig {
                security_context: Some(k8s_cri::v1::LinuxContainerSecurityContext {
                    namespace_options: Some(namespaces()),
                    run_as_user: run_as.map(|r| k8s_cri::v1::Int64Value { value: r.uid }),
                    run_as_group: run_as.map(|r| k8s_cri::v1::Int64Value { value: r.gid }),
                    no_new_privs: run_as.is_some_and(|r| r.no_new_privs),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = self
            .cri
            .create_container(&pod.id, config, pod.config.clone())?;
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.clone());
        Ok(id)
    }

    /// Create + start, failing with context.
    pub fn run_container(&self, pod: &Pod, spec: &ContainerSpec) -> Result<String> {
        let id = self
            .create_container(pod, spec)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("creating container {}", spec.name))?;
        self.cri
            .start_container(&id)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("starting container {}", spec.name))?;
        Ok(id)
    }

    /// The container's CRI state.
    pub fn state(&self, id: &str) -> Result<ContainerState> {
        let (status, _) = self.cri.container_status(id)?;
        Ok(ContainerState::try_from(status.state).unwrap_or(ContainerState::ContainerUnknown))
    }

    /// Host pid of the container's init process (from the verbose status), 0 if none.
    pub fn pid(&self, id: &str) -> Result<u32> {
        let (_, info) = self.cri.container_status(id)?;
        let text = info
            .get("info")
            .with_context(|| format!("verbose status of {id} has no info"))?;
        let v: serde_json::Value = serde_json::from_str(text)?;
        Ok(v["pid"].as_u64().unwrap_or(0) as u32)
    }

    /// `ExecSync` of `cmd` in `id`, retried for up to 20 s until it exits 0 (on a loaded
    /// 2-core machine an exec can fail to start in time); its stdout.
    pub fn exec_ok(&self, id: &str, cmd: &[&str]) -> Result<String> {
        let mut last = String::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            match self.cri.exec_sync(id, cmd, 10) {
                Ok((0, out, _)) => return Ok(String::from_utf8_lossy(&out).into_owned()),
                Ok((code, out, err)) => {
                    last = format!(
                        "exit {code}, stdout {:?}, stderr {:?}",
                        String::from_utf8_lossy(&out),
                        String::from_utf8_lossy(&err)
                    )
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("exec {cmd:?} in {id} did not succeed within 20s: {last}")
    }

    /// Stops and removes pod `id` (and its containers).
    pub fn remove_pod(&self, id: &str) -> Result<()> {
        self.cri.stop_pod_sandbox(id)?;
        self.cri.remove_pod_sandbox(id)?;
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| p != id);
        Ok(())
    }

    /// Checkpoints the running counter `id` (init `pid`, run token `run`) into `dir` with `ctr
    /// tasks checkpoint --image-path`, paused where it holds no file open (a restore on another
    /// pod gets the image's rootfs afresh), then lets it go on: the count it reached after.
    pub fn checkpoint_counter_to(
        &self,
        id: &str,
        pid: u32,
        run: &str,
        dir: &Path,
    ) -> Result<crate::counter::Count> {
        use crate::counter::{count_of, pause_holding_no, wait_count, COUNT_FILE};
        pause_holding_no(
            COUNT_FILE,
            &|| self.ctr_k8s(&["tasks", "pause", id]).map(drop),
            &|| self.ctr_k8s(&["tasks", "resume", id]).map(drop),
            &|| Ok((pid, self.cgroup_procs(id))),
        )?;
        let path = dir.to_str().context("checkpoint dir is not UTF-8")?;
        self.ctr_k8s(&["tasks", "checkpoint", "--image-path", path, id])?;
        self.ctr_k8s(&["tasks", "resume", id])?;
        wait_count(run, "the counter", 0, || count_of(pid))
    }

    /// Processes in the cgroup CRI gave container `id` (any hierarchy): none means nothing of
    /// it runs.
    pub fn cgroup_procs(&self, id: &str) -> Vec<u32> {
        let suffix = format!("/{}/cri/{id}", self.rig.namespace());
        let mut pids = Vec::new();
        let Ok(rd) = fs::read_dir("/proc") else {
            return pids;
        };
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if cg.lines().any(|l| l.ends_with(&suffix)) {
                pids.push(pid);
            }
        }
        pids
    }

    /// runc's view of container `id` in the CRI runc root, if it knows it.
    pub fn runc_state(&self, id: &str) -> Option<String> {
        let mut cmd = Command::new("runc");
        cmd.args(["--root", CRI_RUNC_ROOT, "state", id])
            .env("PATH", self.rig.path_env());
        let out = run_with_timeout(cmd, None, Duration::from_secs(20)).ok()?;
        out.status.success().then(|| out.stdout_str())
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        let pods: Vec<String> = self
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for p in &pods {
            let _ = self.cri.stop_pod_sandbox(p);
            let _ = self.cri.remove_pod_sandbox(p);
        }
        // runc state of our containers that CRI could not delete (the rig only cleans its own
        // namespace's runc root).
        let ids: Vec<String> = self
            .containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for id in ids.iter().chain(pods.iter()) {
            if Path::new(CRI_RUNC_ROOT).join(id).exists() {
                let mut cmd = Command::new("runc");
                cmd.args(["--root", CRI_RUNC_ROOT, "delete", "--force", id])
                    .env("PATH", self.rig.path_env());
                let _ = run_with_timeout(cmd, None, Duration::from_secs(10));
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "---- node {} (config {}) ----\n{}",
                self.dir.path().display(),
                self.config_path.display(),
                fs::read_to_string(&self.config_path).unwrap_or_default()
            );
        }
    }
}

/// Host network (no CNI), a pid namespace per container, the pod's IPC namespace: what the
/// kubelet asks for a `hostNetwork: true` pod.
fn namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// Waits until container `id` is in CRI state `want`.
pub fn wait_for_state(
    node: &CriNode,
    id: &str,
    want: ContainerState,
    timeout: Duration,
) -> Result<()> {
    let mut last = ContainerState::ContainerUnknown;
    let ok = wait_until(timeout, || {
        last = node.state(id).unwrap_or(ContainerState::ContainerUnknown);
        last == want
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!(
            "container {id} is {last:?}, not {want:?}, after {timeout:?}"
        ))
    }
}

/// The shim's runtime handler name in CRI.
pub fn gpusnap_handler() -> &'static str {
    Runtime::Gpusnap.cri_handler()
}
