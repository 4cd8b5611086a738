//! A private CRI-O 1.36 (`/opt/gpusnap-rig/bin/crio`, from the shared tools' build) with
//! gpusnap-runc as the runtime handler `gpusnap`, configured by the drop-in `gpusnap install
//! --crio-dropin-dir` writes, driven with crictl.
//!
//! Everything lives under one temporary directory: storage, state, the API socket, CNI
//! config, the handler's runc root; NRI is off (its socket is global). The recipe is the one
//! in the shared tools' README (`../shared/tools/cri-o/README.md`): cgroupfs, no infra
//! container, and pods and containers with their own PID namespace (`CONTAINER`) and the
//! node's network, so no process needs CAP_SYS_RESOURCE for `oom_score_adj`.
//!
//! A missing crio, pinns or crictl fails the test with what to run (scripts/setup-env.sh
//! installs them); nothing is skipped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use crate::cmd::{describe, run_with_timeout, trimmed_stdout_ok, Spawned};
use crate::paths::{self, busybox_archive, pause_archive, rig_bin_dir};
use crate::podman::{parse_count, processes_with, Count, COUNTER};
use crate::rig::Rig;

/// The handler `gpusnap install` registers.
pub const HANDLER: &str = "gpusnap";
/// The rig's busybox and pause images, as CRI-O's storage holds them.
pub const BUSYBOX_IMAGE: &str = "docker.io/gpusnap/busybox:test";
pub const PAUSE_IMAGE: &str = "docker.io/gpusnap/pause:test";
/// CRI `NamespaceMode`: the container's own PID namespace; the node's network.
const NS_CONTAINER: u32 = 1;
const NS_NODE: u32 = 2;
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `<rig>/bin/NAME`, or a failure saying to run setup-env.
fn rig_tool(name: &str) -> Result<PathBuf> {
    let p = rig_bin_dir().join(name);
    ensure!(
        paths::is_executable(&p),
        "{} not found: run scripts/setup-env.sh (it installs CRI-O 1.36.3, pinns and crictl \
         from ../shared/tools)",
        p.display()
    );
    Ok(p)
}

/// A running CRI-O of its own.
pub struct Crio {
    dir: tempfile::TempDir,
    crio: Option<Spawned>,
    crictl: PathBuf,
    /// The gpusnap config gpusnap-runc reads (`GPUSNAP_CONFIG` in the handler's monitor_env).
    pub gpusnap_config: PathBuf,
    /// The drop-in `gpusnap install` wrote.
    pub dropin: PathBuf,
    /// runc's state root for the handler's containers.
    pub runtime_root: PathBuf,
    seq: std::sync::atomic::AtomicUsize,
}

impl Crio {
    /// Installs the handler (with `config_from` as the gpusnap config when given), puts the
    /// busybox and pause images into CRI-O's storage and starts CRI-O.
    pub fn start(config_from: Option<&Path>) -> Result<Crio> {
        let crio = rig_tool("crio")?;
        let pinns = rig_tool("pinns")?;
        let crictl = rig_tool("crictl")?;
        for (tool, pkg) in [("conmon", "conmon"), ("skopeo", "skopeo"), ("runc", "runc")] {
            ensure!(
                std::env::split_paths(SYSTEM_PATH).any(|d| paths::is_executable(&d.join(tool))),
                "{tool} not found: run scripts/setup-env.sh (needs {pkg})"
            );
        }
        // Short: the socket path must fit in sun_path.
        let dir = tempfile::Builder::new()
            .prefix("gco-")
            .tempdir_in("/tmp")
            .context("CRI-O scratch directory")?;
        let d = dir.path().to_path_buf();
        let p = |rel: &str| d.join(rel).display().to_string();
        for sub in ["etc/crio.conf.d", "cni", "ns", "pod-logs"] {
            fs::create_dir_all(d.join(sub))?;
        }
        fs::write(
            d.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                p("storage"),
                p("storage-run")
            ),
        )?;
        fs::write(
            d.join("registries.conf"),
            "unqualified-search-registries = [\"docker.io\"]\nshort-name-mode = \"permissive\"\n",
        )?;
        fs::write(
            d.join("cni/10-loopback.conflist"),
            "{\"cniVersion\":\"1.0.0\",\"name\":\"gpusnap-lo\",\"plugins\":[{\"type\":\"loopback\"}]}\n",
        )?;
        fs::write(
            d.join("etc/crio.conf"),
            format!(
                "# The test's CRI-O; `gpusnap install` adds the gpusnap handler in crio.conf.d.\n\
                 [crio]\n\
                 root = \"{storage}\"\n\
                 runroot = \"{storage_run}\"\n\
                 storage_driver = \"overlay\"\n\
                 log_dir = \"{logs}\"\n\
                 version_file = \"{d}/version\"\n\
                 version_file_persist = \"{d}/version-persist\"\n\
                 clean_shutdown_file = \"{d}/clean.shutdown\"\n\
                 [crio.api]\n\
                 listen = \"{d}/crio.sock\"\n\
                 stream_address = \"127.0.0.1\"\n\
                 stream_port = \"0\"\n\
                 [crio.runtime]\n\
                 default_runtime = \"runc\"\n\
                 # No systemd as pid 1.\n\
                 cgroup_manager = \"cgroupfs\"\n\
                 conmon_cgroup = \"pod\"\n\
                 drop_infra_ctr = true\n\
                 pinns_path = \"{pinns}\"\n\
                 namespaces_dir = \"{d}/ns\"\n\
                 container_exits_dir = \"{d}/exits\"\n\
                 container_attach_socket_dir = \"{d}/attach\"\n\
                 [crio.runtime.runtimes.runc]\n\
                 runtime_path = \"/usr/sbin/runc\"\n\
                 runtime_type = \"oci\"\n\
                 runtime_root = \"{d}/runc\"\n\
                 [crio.image]\n\
                 pause_image = \"{PAUSE_IMAGE}\"\n\
                 # The rig's pause image has no /pause: its entrypoint runs.\n\
                 pause_command = \"\"\n\
                 # CRI-O creates these directories; keep them out of /etc/crio.\n\
                 namespaced_auth_dir = \"{d}/auth\"\n\
                 signature_policy_dir = \"{d}/policies\"\n\
                 [crio.network]\n\
                 network_dir = \"{d}/cni\"\n\
                 plugin_dirs = [\"/usr/lib/cni\"]\n\
                 [crio.metrics]\n\
                 enable_metrics = false\n\
                 [crio.nri]\n\
                 # NRI's socket is global; other CRI-Os may run on this machine.\n\
                 enable_nri = false\n",
                storage = p("storage"),
                storage_run = p("storage-run"),
                logs = p("pod-logs"),
                d = d.display(),
                pinns = pinns.display(),
            ),
        )?;
        fs::write(
            d.join("crictl.yaml"),
            format!(
                "runtime-endpoint: unix://{sock}\nimage-endpoint: unix://{sock}\ntimeout: 60\n",
                sock = p("crio.sock")
            ),
        )?;
        let gpusnap_config = d.join("gpusnap.toml");
        let dropin_dir = d.join("etc/crio.conf.d");
        let runtime_root = d.join("gpusnap-runc");
        let mut args: Vec<String> = vec![
            "--config".into(),
            gpusnap_config.display().to_string(),
            "install".into(),
            "--crio-dropin-dir".into(),
            dropin_dir.display().to_string(),
            "--crio-runtime-root".into(),
            runtime_root.display().to_string(),
            "--runc-wrapper-path".into(),
            paths::binary("gpusnap-runc").display().to_string(),
            "--skip-containerd".into(),
            "--skip-podman".into(),
            "--criu-config".into(),
            p("criu-runc.conf"),
            "--criu-network-lock".into(),
            "skip".into(),
            "--state-file".into(),
            p("install-state.json"),
        ];
        if let Some(src) = config_from {
            args.extend(["--config-from".into(), src.display().to_string()]);
        }
        let out = crate::cmd::gpusnap(&args);
        ensure!(
            out.status.success(),
            "gpusnap {}: {}",
            args.join(" "),
            describe(&out)
        );
        let dropin = dropin_dir.join("90-gpusnap.conf");
        ensure!(
            dropin.is_file(),
            "gpusnap install wrote no {}: {}",
            dropin.display(),
            describe(&out)
        );
        for (archive, name) in [
            (busybox_archive(), BUSYBOX_IMAGE),
            (pause_archive(), PAUSE_IMAGE),
        ] {
            load_oci_archive(&d, &archive, name)?;
        }
        let mut cmd = Command::new(&crio);
        cmd.arg("--config")
            .arg(d.join("etc/crio.conf"))
            .arg("--config-dir")
            .arg(&dropin_dir)
            .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", d.join("registries.conf"))
            .env("PATH", SYSTEM_PATH);
        let spawned = Spawned::spawn(cmd, None).context("starting crio")?;
        let mut c = Crio {
            dir,
            crio: Some(spawned),
            crictl,
            gpusnap_config,
            dropin,
            runtime_root,
            seq: std::sync::atomic::AtomicUsize::new(0),
        };
        let up = crate::wait::wait_until(Duration::from_secs(60), || {
            c.socket().exists() && c.crictl(&["version"]).is_ok_and(|o| o.status.success())
        });
        if !up {
            let log = c.log();
            bail!("CRI-O did not come up on {}:\n{log}", c.socket().display());
        }
        if let Some(s) = c.crio.as_mut() {
            if let Ok(Some(status)) = s.try_status() {
                bail!("crio exited ({status}):\n{}", c.log());
            }
        }
        Ok(c)
    }

    /// Puts an oci-archive into CRI-O's image storage under `name` (skopeo; CRI-O sees it
    /// through the storage's own locking while it runs).
    pub fn load_image(&self, archive: &Path, name: &str) -> Result<()> {
        load_oci_archive(self.dir.path(), archive, name)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("crio.sock")
    }

    /// CRI-O's output so far.
    pub fn log(&self) -> String {
        self.crio
            .as_ref()
            .map(|s| String::from_utf8_lossy(&s.stderr_so_far()).into_owned())
            .unwrap_or_default()
    }

    /// `crictl` against this CRI-O (2 minutes at most).
    pub fn crictl<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<Output> {
        let endpoint = format!("unix://{}", self.socket().display());
        let mut cmd = Command::new(&self.crictl);
        cmd.args([
            "--runtime-endpoint",
            &endpoint,
            "--image-endpoint",
            &endpoint,
        ])
        .arg("--config")
        .arg(self.dir.path().join("crictl.yaml"))
        .args(args)
        .stdin(Stdio::null());
        run_with_timeout(cmd, None, Duration::from_secs(120))
    }

    /// `crictl ARGS`, stdout trimmed, or an error with both streams.
    pub fn ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String> {
        trimmed_stdout_ok("crictl", args, &self.crictl(args)?)
    }

    fn write_json(&self, stem: &str, v: &serde_json::Value) -> Result<PathBuf> {
        let n = self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = self.dir.path().join(format!("{stem}-{n}.json"));
        fs::write(&path, serde_json::to_vec_pretty(v)?)?;
        Ok(path)
    }

    fn pod_config(&self, name: &str) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid"), "attempt": 0},
            "log_directory": self.dir.path().join("pod-logs").join(name),
            "linux": {"security_context": {"namespace_options": {"network": NS_NODE, "pid": NS_CONTAINER}}},
        })
    }

    /// `crictl runp --runtime gpusnap` of a pod named `name`; returns (pod id, pod config path).
    pub fn run_pod(&self, name: &str) -> Result<(String, PathBuf)> {
        self.run_pod_annotated(name, &[])
    }

    /// [`Crio::run_pod`] of a pod with `annotations` (CRI-O copies a pod's annotations into
    /// its containers' specs).
    pub fn run_pod_annotated(
        &self,
        name: &str,
        annotations: &[(&str, &str)],
    ) -> Result<(String, PathBuf)> {
        let mut pod = self.pod_config(name);
        pod["annotations"] = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect::<serde_json::Map<_, _>>()
            .into();
        let cfg = self.write_json("pod", &pod)?;
        let id = self.ok(&[
            "runp".as_ref(),
            "--runtime".as_ref(),
            HANDLER.as_ref(),
            cfg.as_os_str(),
        ])?;
        Ok((id, cfg))
    }

    /// A container config: `image` (an image name, or a checkpoint archive to restore),
    /// with the counter as its command when `command` (with `marker` as the shell's `$0`)
    /// and `env` as `KEY=VALUE` pairs.
    pub fn container_config(
        &self,
        name: &str,
        image: &str,
        command: Option<&str>,
        env: &[(&str, &str)],
    ) -> serde_json::Value {
        let mut c = serde_json::json!({
            "metadata": {"name": name},
            "image": {"image": image},
            "log_path": format!("{name}.log"),
            "envs": env.iter().map(|(k, v)| serde_json::json!({"key": k, "value": v})).collect::<Vec<_>>(),
            // With the node's network CRI-O bind-mounts the node's /etc/hosts; a restore
            // must be given the same mounts the checkpointed container had.
            "mounts": [{"container_path": "/etc/hosts", "host_path": "/etc/hosts", "readonly": true}],
            "linux": {"security_context": {"namespace_options": {"network": NS_NODE, "pid": NS_CONTAINER}}},
        });
        if let Some(marker) = command {
            c["command"] = serde_json::json!(["sh", "-c", COUNTER, marker]);
        }
        c
    }

    /// `crictl create POD CTR POD` (the output, for callers checking refusals).
    pub fn create(&self, pod: &str, pod_config: &Path, ctr: &serde_json::Value) -> Result<Output> {
        let cfg = self.write_json("ctr", ctr)?;
        let args: [&std::ffi::OsStr; 4] = [
            "create".as_ref(),
            pod.as_ref(),
            cfg.as_os_str(),
            pod_config.as_os_str(),
        ];
        self.crictl(&args)
    }

    /// Creates and starts a container; returns its id.
    pub fn create_and_start(
        &self,
        pod: &str,
        pod_config: &Path,
        ctr: &serde_json::Value,
    ) -> Result<String> {
        let out = self.create(pod, pod_config, ctr)?;
        ensure!(out.status.success(), "crictl create: {}", describe(&out));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        self.ok(&["start", &id])?;
        Ok(id)
    }

    /// The counter of container `id`, read with `crictl exec` (`None` while absent).
    pub fn count(&self, id: &str) -> Option<Count> {
        let out = self.crictl(&["exec", id, "cat", "/tmp/count"]).ok()?;
        if !out.status.success() {
            return None;
        }
        parse_count(&String::from_utf8_lossy(&out.stdout))
    }

    /// The host pid of container `id`'s init (`crictl inspect`).
    pub fn pid(&self, id: &str) -> Result<u32> {
        let v: serde_json::Value = serde_json::from_str(&self.ok(&["inspect", id])?)?;
        v["info"]["pid"]
            .as_u64()
            .map(|p| p as u32)
            .with_context(|| format!("crictl inspect {id} gives no info.pid"))
    }

    /// Stops every container at once (`crictl stop -t 0`: the counter's shell ignores
    /// SIGTERM, and CRI-O would wait a minute before SIGKILL), then removes every pod.
    pub fn remove_all_pods(&self) -> Result<()> {
        for id in self.ok(&["ps", "-a", "-q"])?.lines() {
            self.ok(&["stop", "-t", "0", id])?;
        }
        self.ok(&["rmp", "-a", "-f"])?;
        Ok(())
    }

    /// `crictl inspect`'s state of container `id` (`CONTAINER_RUNNING`, ...).
    pub fn state(&self, id: &str) -> Result<String> {
        let v: serde_json::Value = serde_json::from_str(&self.ok(&["inspect", id])?)?;
        Ok(v["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }
}

impl Drop for Crio {
    fn drop(&mut self) {
        // CRI-O's own removal while it runs; then whatever it left: runc state, conmon,
        // mounts. The directory goes with the TempDir.
        let _ = self.remove_all_pods();
        if let Some(s) = self.crio.take() {
            s.signal(libc::SIGTERM);
            let _ = s.wait_timeout(Duration::from_secs(20));
        }
        let root = self.runtime_root.clone();
        if let Ok(list) = crate::podman::runc_list(&root) {
            for (id, _) in list {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force", &id])
                    .env("PATH", SYSTEM_PATH)
                    .stdin(Stdio::null())
                    .output();
            }
        }
        let dir = self.dir.path().display().to_string();
        for (pid, line) in processes_with(&dir) {
            if line.contains("conmon") {
                // SAFETY: kill(2) of a conmon started for this CRI-O (its paths name our dir).
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
        Rig::unmount_all_under(self.dir.path());
    }
}

/// `skopeo copy oci-archive:ARCHIVE containers-storage:[CRI-O's store]NAME` for the CRI-O
/// scratch directory `d`.
fn load_oci_archive(d: &Path, archive: &Path, name: &str) -> Result<()> {
    let p = |rel: &str| d.join(rel).display().to_string();
    let store = format!(
        "containers-storage:[overlay@{}+{}]",
        p("storage"),
        p("storage-run")
    );
    let mut cmd = Command::new("skopeo");
    cmd.args([
        "--registries-conf",
        &p("registries.conf"),
        "copy",
        "--quiet",
    ])
    .arg(format!("oci-archive:{}", archive.display()))
    .arg(format!("{store}{name}"))
    .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
    .env("PATH", SYSTEM_PATH);
    let out = run_with_timeout(cmd, None, Duration::from_secs(120))?;
    ensure!(
        out.status.success(),
        "skopeo copy {}: {}",
        archive.display(),
        describe(&out)
    );
    Ok(())
}
