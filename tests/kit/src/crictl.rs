//! The real `crictl` (cri-tools, installed by `scripts/setup-env.sh` into the rig's bin dir)
//! against a [`CriNode`]'s containerd: pods and containers from the JSON config files crictl
//! reads, `crictl checkpoint --export`, `crictl inspect`, and clean-up of what it started.
//!
//! [`Crictl`] runs `crictl --config <its own file>`, whose runtime and image endpoints are the
//! node's socket, so no `/etc/crictl.yaml` is read. Pods it starts are stopped and removed when
//! it is dropped (drop it before the node).

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};

use crate::cmd::{run_with_timeout, OutputExt};
use crate::cri::CriNode;
use crate::paths;

/// Deadline of one crictl command (a GPU checkpoint through CRI can take a while on a loaded
/// 2-core machine).
pub const CRICTL_TIMEOUT: Duration = Duration::from_secs(180);

/// `<rig bin>/crictl`.
pub fn crictl_bin() -> PathBuf {
    paths::rig_bin_dir().join("crictl")
}

/// How a pod's containers see processes: `shareProcessNamespace: false` (the kubelet's
/// default: each container its own pid namespace) or `true` (one pid namespace per pod, with
/// the pause process as its init; what critest's pods use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PidMode {
    Container,
    Pod,
}

impl PidMode {
    /// CRI's `NamespaceMode`: POD = 0, CONTAINER = 1.
    fn cri(self) -> u32 {
        match self {
            PidMode::Pod => 0,
            PidMode::Container => 1,
        }
    }
}

/// A pod `crictl runp` started, with the config file it was started from (`crictl create`
/// needs it again).
#[derive(Clone, Debug)]
pub struct CrictlPod {
    pub id: String,
    pub name: String,
    pub config: PathBuf,
    pub log_dir: PathBuf,
    pub pid_mode: PidMode,
}

/// `crictl` bound to one node.
pub struct Crictl {
    config: PathBuf,
    dir: PathBuf,
    cgroup_parent: String,
    pods: Mutex<Vec<String>>,
}

impl Crictl {
    /// crictl for `node`: a config file in the node's scratch directory; pods under the cgroup
    /// parent the rig's teardown sweeps.
    pub fn for_node(node: &CriNode) -> Result<Crictl> {
        Crictl::at(
            &node.rig.address(),
            &node.scratch().join("crictl"),
            &format!("/{}/cri", node.rig.namespace()),
        )
    }

    /// crictl for the CRI socket `socket` (any containerd), with its config, pod configs and
    /// pod logs under `dir`, and pods under `cgroup_parent`.
    pub fn at(socket: &Path, dir: &Path, cgroup_parent: &str) -> Result<Crictl> {
        let bin = crictl_bin();
        ensure!(
            paths::is_executable(&bin),
            "{} missing: run scripts/setup-env.sh (cri-tools from ../shared/tools/cri-tools)",
            bin.display()
        );
        let dir = dir.to_path_buf();
        fs::create_dir_all(&dir)?;
        let sock = format!("unix://{}", socket.display());
        let config = dir.join("crictl.yaml");
        fs::write(
            &config,
            format!(
                "runtime-endpoint: {sock}\nimage-endpoint: {sock}\ntimeout: 120\n\
                 pull-image-on-create: false\n"
            ),
        )?;
        Ok(Crictl {
            config,
            dir,
            cgroup_parent: cgroup_parent.to_string(),
            pods: Mutex::new(Vec::new()),
        })
    }

    /// `crictl --config <file> args...` (not started).
    pub fn command<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(crictl_bin());
        cmd.arg("--config").arg(&self.config).args(args);
        cmd
    }

    /// Runs crictl; any exit status is returned.
    pub fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<Output> {
        run_with_timeout(self.command(args), None, CRICTL_TIMEOUT)
    }

    /// Runs crictl, failing with its output unless it exits 0; its stdout, trimmed.
    pub fn ok<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<String> {
        let out = self.run(args)?;
        let shown: Vec<String> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        ensure!(
            out.status.success(),
            "`crictl {}` failed: {}",
            shown.join(" "),
            out.describe()
        );
        Ok(out.stdout_str().trim().to_string())
    }

    /// Writes `value` as a JSON file named `name` in crictl's directory.
    fn write_json(&self, name: &str, value: &Value) -> Result<PathBuf> {
        let path = self.dir.join(name);
        fs::write(&path, serde_json::to_vec_pretty(value)?)?;
        Ok(path)
    }

    /// `crictl runp --runtime <handler> pod.json`: a pod with host networking (no CNI), the
    /// given pid mode and annotations.
    pub fn run_pod(
        &self,
        name: &str,
        handler: &str,
        pid_mode: PidMode,
        annotations: &[(&str, &str)],
    ) -> Result<CrictlPod> {
        let log_dir = self.dir.join("logs").join(name);
        fs::create_dir_all(&log_dir)?;
        let ann: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let config = self.write_json(
            &format!("pod-{name}.json"),
            &json!({
                "metadata": {
                    "name": name,
                    "namespace": "default",
                    "uid": format!("uid-{name}-{}", std::process::id()),
                    "attempt": 0
                },
                "log_directory": log_dir,
                "annotations": ann,
                "labels": {"app": name},
                "linux": {
                    "cgroup_parent": self.cgroup_parent,
                    "security_context": {
                        "namespace_options": {"network": 2, "pid": pid_mode.cri(), "ipc": 0}
                    }
                }
            }),
        )?;
        let id = self.ok(&[
            OsStr::new("runp"),
            "--runtime".as_ref(),
            handler.as_ref(),
            config.as_os_str(),
        ])?;
        ensure!(!id.is_empty(), "crictl runp printed no pod id");
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.clone());
        Ok(CrictlPod {
            id,
            name: name.to_string(),
            config,
            log_dir,
            pid_mode,
        })
    }

    /// `crictl create --no-pull POD container.json pod.json` of a container `name` running
    /// `command` from `image` (an image reference, or a checkpoint archive's path), with `env`;
    /// its id.
    pub fn create(
        &self,
        pod: &CrictlPod,
        name: &str,
        image: &str,
        command: &[&str],
        env: &[(&str, &str)],
    ) -> Result<String> {
        self.create_full(pod, name, image, command, env, &[], 0, &json!({}))
    }

    /// [`Crictl::create`] with CRI `mounts` — an image volume as the kubelet passes one is
    /// `{"container_path": PATH, "image": {"image": REF}, "readonly": true}` — and the
    /// container's `attempt` (the kubelet's count of its restarts: a container created again
    /// after a failed start has the next one).
    #[allow(clippy::too_many_arguments)]
    pub fn create_with_mounts(
        &self,
        pod: &CrictlPod,
        name: &str,
        image: &str,
        command: &[&str],
        env: &[(&str, &str)],
        mounts: &[Value],
        attempt: u32,
    ) -> Result<String> {
        self.create_full(pod, name, image, command, env, mounts, attempt, &json!({}))
    }

    /// `crictl create` with every choice the wrappers above make.
    #[allow(clippy::too_many_arguments)]
    pub fn create_full(
        &self,
        pod: &CrictlPod,
        name: &str,
        image: &str,
        command: &[&str],
        env: &[(&str, &str)],
        mounts: &[Value],
        attempt: u32,
        security: &Value,
    ) -> Result<String> {
        let mut security_context =
            json!({"namespace_options": {"network": 2, "pid": pod.pid_mode.cri(), "ipc": 0}});
        if let (Some(into), Some(from)) = (security_context.as_object_mut(), security.as_object()) {
            into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let envs: Vec<Value> = env
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        let config = self.write_json(
            &format!("ctr-{}-{name}-{attempt}.json", pod.name),
            &json!({
                "metadata": {"name": name, "attempt": attempt},
                "image": {"image": image},
                "command": command,
                "envs": envs,
                "mounts": mounts,
                "log_path": format!("{name}.log"),
                "labels": {"io.kubernetes.container.name": name},
                "linux": {"security_context": security_context}
            }),
        )?;
        self.ok(&[
            OsStr::new("create"),
            "--no-pull".as_ref(),
            pod.id.as_ref(),
            config.as_os_str(),
            pod.config.as_os_str(),
        ])
    }

    /// `crictl start ID`.
    pub fn start(&self, id: &str) -> Result<()> {
        self.ok(&["start", id]).map(|_| ())
    }

    /// `crictl checkpoint --export=ARCHIVE ID`.
    pub fn checkpoint_export(&self, id: &str, archive: &Path) -> Result<()> {
        let export = format!("--export={}", archive.display());
        self.ok(&["checkpoint", export.as_str(), id]).map(|_| ())
    }

    /// `crictl inspect ID` as JSON (`status`, `info`).
    pub fn inspect(&self, id: &str) -> Result<Value> {
        let text = self.ok(&["inspect", "-o", "json", id])?;
        serde_json::from_str(&text).with_context(|| format!("crictl inspect {id}: {text}"))
    }

    /// The container's CRI state as crictl shows it (`CONTAINER_RUNNING`, ...).
    pub fn state(&self, id: &str) -> Result<String> {
        Ok(self.inspect(id)?["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Host pid of the container's init (`info.pid` of `crictl inspect`), 0 if none.
    pub fn pid(&self, id: &str) -> Result<u32> {
        Ok(self.inspect(id)?["info"]["pid"].as_u64().unwrap_or(0) as u32)
    }

    /// `crictl exec ID cmd...`: its stdout.
    pub fn exec(&self, id: &str, cmd: &[&str]) -> Result<String> {
        let mut args = vec!["exec", id];
        args.extend_from_slice(cmd);
        self.ok(&args)
    }

    /// `crictl stopp` + `crictl rmp` of `pod`.
    pub fn remove_pod(&self, pod: &CrictlPod) -> Result<()> {
        self.ok(&["stopp", pod.id.as_str()])?;
        self.ok(&["rmp", pod.id.as_str()])?;
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| *p != pod.id);
        Ok(())
    }
}

impl Drop for Crictl {
    fn drop(&mut self) {
        let pods: Vec<String> = self
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for p in pods {
            let _ = self.run(&["stopp", p.as_str()]);
            let _ = self.run(&["rmp", "-f", p.as_str()]);
        }
    }
}
