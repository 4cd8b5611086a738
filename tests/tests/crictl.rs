//! Kubernetes-style flows through the real `crictl` (cri-tools v1.36) against containerd 2.1.9's
//! CRI, the way an operator or the kubelet's checkpoint API drives them: `crictl runp` /
//! `create` / `start` of a counter container under the `gpusnap` runtime handler,
//! `crictl checkpoint --export=ARCHIVE.tar`, and restores into NEW pods:
//!
//! - by the archive: `crictl create` with the archive's path as the container image
//!   (containerd's CRI restore);
//! - through a registry: `gpusnap image build` + `push`, then either `crictl pull` of the
//!   checkpoint image as the container image, or `gpusnap image pull --extract NAME` under the
//!   node's `restore.checkpoint_root` and a pod annotated `gpusnap.io/restore-from: NAME`;
//! - in pods that share one pid namespace (`shareProcessNamespace: true`, what critest's pods
//!   do), with the runc.v2 handler as the control;
//! - with the CUDA driver double as the container's driver: the driver calls at checkpoint and
//!   restore and the device memory after the restore.
//!
//! The archive gpusnap writes is compared with the one containerd-shim-runc-v2 writes for the
//! same workload on the same node, where CRI tooling reads it: `dump.log` and `stats-dump` at
//! the top (checkpointctl's statistics), `checkpoint/`, `config.dump`, `spec.dump`.
//!
//! A restored workload must be the checkpointed process: the counter keeps its random token and
//! counts on from at least the value read before the checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::busybox_registry::{publish_archive, registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::cmd::{check, gpusnap_ok};
use gpusnap_testkit::containerd::{default_path_env, Containerd, ContainerdSpec};
use gpusnap_testkit::cri::{gpusnap_handler, write_plain_http_hosts, CriNode, CriNodeOptions};
use gpusnap_testkit::crictl::{Crictl, CrictlPod, PidMode};
use gpusnap_testkit::gpu::{Cuda, CudaProcess, Engine, GpuDouble};
use gpusnap_testkit::paths::GPUSNAP_SHIM_NAME;
use gpusnap_testkit::rig::PAUSE_IMAGE;
use gpusnap_testkit::{gpusnap, paths, OutputExt, Registry, Runtime};

/// The workload: a random token kept in shell memory and a counter, written to /tmp/count ten
/// times a second. A restored process goes on with the same token from where it was; a fresh
/// start would draw a new token and start from 1. It also keeps /tmp/held open (not in append
/// mode) and grows it every round: CRIU refuses to restore an open file whose size differs
/// from the dump, so the restore also shows that the writable layer CRI diffed after the dump
/// is the one the process had at the dump (the container did not run in between, GPU
/// containers included).
const COUNTER: &str = "tok=$(cat /proc/sys/kernel/random/uuid); i=0; exec 3>/tmp/held; \
     while true; do i=$((i+1)); echo \"$tok $i\" > /tmp/count; echo $i >&3; sleep 0.1; done";
/// How far the counter gets before a checkpoint: a restart could not pass for a continuation.
const WARM: u64 = 10;

fn runc_handler() -> &'static str {
    Runtime::RuncV2.cri_handler()
}

// ----- the workload ------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct Count {
    token: String,
    n: u64,
}

/// The counter of the container whose init is host pid `pid`, read through its root (`None`
/// while absent or caught between truncate and write).
fn count_of(pid: u32) -> Option<Count> {
    let text = fs::read_to_string(format!("/proc/{pid}/root/tmp/count")).ok()?;
    let (token, n) = text.trim().split_once(' ')?;
    Some(Count {
        token: token.to_string(),
        n: n.parse().ok()?,
    })
}

/// Polls the counter of `pid` until it reads at least `min`.
fn wait_count(what: &str, pid: u32, min: u64) -> Result<Count> {
    let mut last = None;
    gpusnap_testkit::wait_some(Duration::from_secs(30), || {
        let c = count_of(pid);
        if c.is_some() {
            last.clone_from(&c);
        }
        c.filter(|c| c.n >= min)
    })
    .with_context(|| {
        format!("the counter of {what} (pid {pid}) did not reach {min}; last {last:?}")
    })
}

/// A counter container running in its pod.
struct Workload {
    pod: CrictlPod,
    id: String,
    pid: u32,
}

/// The node, its registry (holding busybox) and crictl. Dropped in this order: crictl removes
/// its pods while the node's containerd still runs.
struct Node {
    crictl: Crictl,
    node: Option<CriNode>,
    /// Held for its lifetime: its containerd serves `crictl`.
    _plain: Option<PlainNode>,
    reg: Registry,
}

impl Node {
    /// A kit CRI node (the shim linked into containerd's `PATH`) whose gpusnap config has
    /// `gpusnap_config` appended.
    fn start(gpusnap_config: String) -> Result<Node> {
        let reg = registry_with_busybox()?;
        let node = CriNode::start(CriNodeOptions {
            gpusnap_config,
            registry_host: Some(reg.host()),
            ..Default::default()
        })?;
        let crictl = Crictl::for_node(&node)?;
        Node::ready(crictl, Some(node), None, reg)
    }

    /// A containerd configured the way docs/kubernetes.md says, with the shim only at the
    /// `gpusnap` runtime's `runtime_path`: not on containerd's `PATH`.
    fn start_with_runtime_path() -> Result<Node> {
        let reg = registry_with_busybox()?;
        let plain = PlainNode::start(&reg)?;
        let crictl = Crictl::at(
            plain.containerd.address(),
            &plain.dir.path().join("crictl"),
            &plain.cgroup_parent,
        )?;
        // CRI's image store sees the imported pause image a moment later.
        ensure!(
            gpusnap_testkit::wait_until(Duration::from_secs(20), || {
                crictl
                    .run(&["inspecti", PAUSE_IMAGE])
                    .is_ok_and(|o| o.status.success())
            }),
            "CRI does not list {PAUSE_IMAGE} after the import"
        );
        Node::ready(crictl, None, Some(plain), reg)
    }

    fn ready(
        crictl: Crictl,
        node: Option<CriNode>,
        plain: Option<PlainNode>,
        reg: Registry,
    ) -> Result<Node> {
        // The base image comes from the registry (containerd's CRI restore pulls it by digest).
        crictl.ok(&["pull", &reg.image(BUSYBOX_REPO)])?;
        Ok(Node {
            crictl,
            node,
            _plain: plain,
            reg,
        })
    }

    fn cri_node(&self) -> Result<&CriNode> {
        self.node.as_ref().context("not a kit CRI node")
    }

    fn busybox(&self) -> String {
        self.reg.image(BUSYBOX_REPO)
    }

    /// A new pod (`handler`, `pid_mode`, `annotations`) with a container `counter` from
    /// `image` (for a restore: the archive path or checkpoint image, or busybox with a
    /// restore-from annotation), started; waits until it runs and its counter is readable.
    fn run(
        &self,
        pod_name: &str,
        handler: &str,
        pid_mode: PidMode,
        annotations: &[(&str, &str)],
        image: &str,
        env: &[(&str, &str)],
    ) -> Result<Workload> {
        let pod = self
            .crictl
            .run_pod(pod_name, handler, pid_mode, annotations)?;
        let id = self
            .crictl
            .create(&pod, "counter", image, &["sh", "-c", COUNTER], env)?;
        self.crictl.start(&id)?;
        let mut state = String::new();
        ensure!(
            gpusnap_testkit::wait_until(Duration::from_secs(30), || {
                state = self.crictl.state(&id).unwrap_or_default();
                state == "CONTAINER_RUNNING"
            }),
            "container {id} in {pod_name} is {state}, not running"
        );
        let pid = self.crictl.pid(&id)?;
        ensure!(pid != 0, "crictl inspect shows no pid for {id}");
        wait_count(pod_name, pid, 0)?;
        Ok(Workload { pod, id, pid })
    }

    /// A fresh counter in a new pod, counted past [`WARM`].
    fn run_counter(
        &self,
        pod_name: &str,
        handler: &str,
        pid_mode: PidMode,
        env: &[(&str, &str)],
    ) -> Result<Workload> {
        let w = self.run(pod_name, handler, pid_mode, &[], &self.busybox(), env)?;
        let c = wait_count(pod_name, w.pid, WARM)?;
        ensure!(c.n < 1000, "a fresh counter reads {c:?}");
        Ok(w)
    }

    /// A counter in a new pod sharing one pid namespace whose pids are used up to past 100
    /// first, by a container that runs 100 short processes and exits.
    ///
    /// Why: CRIU restores every process under its checkpointed pid. In a fresh pod the first
    /// pids of the namespace are taken by the pod's own processes while the restore runs (seen
    /// with runc.v2 and gpusnap alike: `criu failed: type NOTIFY errno 17`, EEXIST, about one
    /// restore in five when the counter's shell was pid 7 in its pod), so a checkpointed
    /// process can only come back where its pid is free.
    fn run_counter_high_pids(&self, pod_name: &str, handler: &str) -> Result<Workload> {
        let pod = self.crictl.run_pod(pod_name, handler, PidMode::Pod, &[])?;
        let burn = self.crictl.create(
            &pod,
            "burn",
            &self.busybox(),
            &["sh", "-c", "seq 100 | xargs -n1 /bin/true"],
            &[],
        )?;
        self.crictl.start(&burn)?;
        let mut state = String::new();
        ensure!(
            gpusnap_testkit::wait_until(Duration::from_secs(60), || {
                state = self.crictl.state(&burn).unwrap_or_default();
                state == "CONTAINER_EXITED"
            }),
            "the pid-burning container of {pod_name} is {state}"
        );
        let id = self.crictl.create(
            &pod,
            "counter",
            &self.busybox(),
            &["sh", "-c", COUNTER],
            &[],
        )?;
        self.crictl.start(&id)?;
        let pid = gpusnap_testkit::wait_some(Duration::from_secs(30), || {
            self.crictl.pid(&id).ok().filter(|p| *p != 0)
        })
        .context("no pid for the counter")?;
        let ns_pid = fs::read_to_string(format!("/proc/{pid}/status"))?
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last()?.parse::<u32>().ok())
            .context("NSpid of the counter")?;
        ensure!(ns_pid > 100, "the counter is pid {ns_pid} in its pod");
        wait_count(pod_name, pid, WARM)?;
        Ok(Workload { pod, id, pid })
    }

    /// `crictl checkpoint --export` of `w` into `<dir>/<name>.tar`; the container keeps
    /// running, the same process; returns the archive and the count read before the checkpoint.
    fn checkpoint(&self, w: &Workload, dir: &Path, name: &str) -> Result<(PathBuf, Count)> {
        let before = wait_count(&w.pod.name, w.pid, 0)?;
        let archive = dir.join(format!("{name}.tar"));
        self.crictl
            .checkpoint_export(&w.id, &archive)
            .with_context(|| format!("checkpoint of {}", w.pod.name))?;
        ensure!(archive.is_file(), "no archive at {}", archive.display());
        let state = self.crictl.state(&w.id)?;
        ensure!(
            state == "CONTAINER_RUNNING" && self.crictl.pid(&w.id)? == w.pid,
            "after the checkpoint {} is {state} (pid {}, was {})",
            w.pod.name,
            self.crictl.pid(&w.id)?,
            w.pid
        );
        let after = wait_count(&w.pod.name, w.pid, before.n + 3)?;
        ensure!(
            after.token == before.token,
            "the checkpoint restarted {}",
            w.pod.name
        );
        Ok((archive, before))
    }

    /// `w` is a restore of the checkpointed workload: CRI marks it restored (`restored`
    /// annotation) when `cri_restore`, it runs a new process with the checkpoint's token, from
    /// at least the checkpointed value, and keeps counting.
    fn check_restored(
        &self,
        w: &Workload,
        checkpointed: &Count,
        old_pid: u32,
        cri_restore: bool,
    ) -> Result<()> {
        let status = &self.crictl.inspect(&w.id)?["status"];
        if cri_restore {
            ensure!(
                status["annotations"]["restored"] == "true",
                "CRI did not take its restore path for {}: annotations {}",
                w.pod.name,
                status["annotations"]
            );
            ensure!(
                status["image"]["image"] == self.busybox().as_str(),
                "a CRI-restored container shows its base image: {}",
                status["image"]
            );
        }
        ensure!(
            w.pid != old_pid,
            "restored under the checkpointed pid {old_pid}"
        );
        let now = wait_count(&w.pod.name, w.pid, 0)?;
        ensure!(
            now.token == checkpointed.token,
            "{} runs a new process (token {}, checkpointed {})",
            w.pod.name,
            now.token,
            checkpointed.token
        );
        ensure!(
            now.n >= checkpointed.n,
            "{} counts from {}, below the checkpointed {}",
            w.pod.name,
            now.n,
            checkpointed.n
        );
        let later = wait_count(&w.pod.name, w.pid, now.n + 3)?;
        ensure!(later.token == now.token, "{} restarted", w.pod.name);
        Ok(())
    }

    /// `gpusnap image build ARCHIVE -t REF -o OCI` and `gpusnap image push OCI URL`; the
    /// reference CRI pulls.
    fn publish(&self, archive: &Path, repo_tag: &str, work: &Path) -> Result<String> {
        publish_archive(&self.reg, archive, repo_tag, work)
    }
}

/// A private containerd with CRI, started from a config of this test's own: runtime handlers
/// `runc` and `gpusnap`, the latter with `runtime_path` = the shim under test and the shim on
/// no directory of containerd's `PATH`.
struct PlainNode {
    containerd: Containerd,
    cgroup_parent: String,
    dir: tempfile::TempDir,
}

impl PlainNode {
    fn start(reg: &Registry) -> Result<PlainNode> {
        let shim = paths::locate_gpusnap_shim()?;
        let path_env = default_path_env();
        let on_path: Vec<PathBuf> = std::env::split_paths(&path_env)
            .map(|d| d.join(GPUSNAP_SHIM_NAME))
            .filter(|p| p.exists())
            .collect();
        ensure!(
            on_path.is_empty(),
            "the shim is on containerd's PATH ({on_path:?}): this test needs it only at runtime_path"
        );
        // Short: the socket path must fit in sun_path.
        let dir = tempfile::Builder::new()
            .prefix("gsnp-crictl-")
            .tempdir_in("/tmp")?;
        let d = dir.path();
        let q = |p: &Path| format!("{:?}", p.display().to_string());
        write_plain_http_hosts(&d.join("certs.d"), &reg.host())?;
        fs::create_dir_all(d.join("checkpoints"))?;
        fs::write(
            d.join("gpusnap.toml"),
            format!(
                "[restore]\ncheckpoint_root = {}\n",
                q(&d.join("checkpoints"))
            ),
        )?;
        let config = format!(
            r#"version = 3
root = {root}
state = {state}

[grpc]
  address = {sock}

[ttrpc]
  address = {ttrpc}

[plugins.'io.containerd.internal.v1.opt']
  path = {opt}

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap]
  runtime_type = "io.containerd.gpusnap.v2"
  runtime_path = {shim}
  pod_annotations = ["gpusnap.io/*"]

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap.options]
  ConfigPath = {gpusnap_config}

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [{cni_bin}]
  conf_dir = {cni_conf}

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = {hosts}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  socket_path = {nri}
  plugin_path = {nri_plugins}
  plugin_config_path = {nri_conf}
"#,
            root = q(&d.join("root")),
            state = q(&d.join("state")),
            sock = q(&d.join("c.sock")),
            ttrpc = q(&d.join("c.sock.ttrpc")),
            opt = q(&d.join("opt")),
            shim = q(&shim),
            gpusnap_config = q(&d.join("gpusnap.toml")),
            cni_bin = q(&d.join("cni/bin")),
            cni_conf = q(&d.join("cni/net.d")),
            hosts = q(&d.join("certs.d")),
            nri = q(&d.join("nri.sock")),
            nri_plugins = q(&d.join("nri/plugins")),
            nri_conf = q(&d.join("nri/conf.d")),
        );
        fs::write(d.join("config.toml"), config)?;
        let containerd = Containerd::start(ContainerdSpec {
            config: d.join("config.toml"),
            address: d.join("c.sock"),
            log: d.join("containerd.log"),
            path_env,
            env: Vec::new(),
        })?;
        let out = gpusnap_testkit::cmd::run_with_timeout(
            containerd.ctr_command(
                Some("k8s.io"),
                &[
                    OsStr::new("images"),
                    "import".as_ref(),
                    paths::pause_archive().as_os_str(),
                ],
            ),
            None,
            Duration::from_secs(60),
        )?;
        ensure!(
            out.status.success(),
            "importing the pause image: {}",
            out.describe()
        );
        Ok(PlainNode {
            containerd,
            cgroup_parent: format!("/gsnp-crictl-{}/cri", std::process::id()),
            dir,
        })
    }
}

impl Drop for PlainNode {
    fn drop(&mut self) {
        // The pods are gone (crictl dropped first); their cgroup parent is left empty in every
        // hierarchy.
        let top = self
            .cgroup_parent
            .trim_end_matches("/cri")
            .trim_start_matches('/');
        for h in fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            for d in [h.path().join(top).join("cri"), h.path().join(top)] {
                let _ = fs::remove_dir(d);
            }
        }
        if std::thread::panicking() {
            eprintln!("---- containerd log ----\n{}", self.containerd.log_tail(40));
        }
    }
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

// ----- the archive -------------------------------------------------------------------------

/// Every entry of a checkpoint archive: path (no trailing `/`) → (is a directory, size).
fn archive_entries(archive: &Path) -> Result<BTreeMap<String, (bool, u64)>> {
    let mut entries = BTreeMap::new();
    let file = fs::File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
    let mut a = tar::Archive::new(file);
    for e in a.entries()? {
        let e = e?;
        let path = e
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        if path.is_empty() {
            continue;
        }
        let dir = e.header().entry_type() == tar::EntryType::Directory;
        entries.insert(path, (dir, e.header().size()?));
    }
    Ok(entries)
}

/// The JSON file `name` at the top of `archive`.
fn archive_json(archive: &Path, name: &str) -> Result<serde_json::Value> {
    let file = fs::File::open(archive)?;
    let mut a = tar::Archive::new(file);
    for e in a.entries()? {
        let mut e = e?;
        if e.path()?.to_string_lossy().trim_start_matches("./") == name {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text)?;
            return serde_json::from_str(&text)
                .with_context(|| format!("{name} in {}", archive.display()));
        }
    }
    anyhow::bail!("{name} missing from {}", archive.display())
}

/// A CRIU image name with its numbers (pids, ids) replaced by `N`: `core-7.img` → `core-N.img`.
fn shape(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('N') {
                out.push('N');
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// gpusnap's archive is laid out like runc.v2's where CRI tooling reads it: the same top-level
/// entries (`dump.log` and `stats-dump` among them, non-empty), `checkpoint/` a directory
/// holding every kind of CRIU image runc.v2's holds, `config.dump` and `spec.dump` with the same
/// fields (the runtime named in `config.dump` being each one's own).
fn check_layout_like_runc(gpusnap: &Path, runc: &Path) -> Result<()> {
    let g = archive_entries(gpusnap)?;
    let r = archive_entries(runc)?;
    let top = |m: &BTreeMap<String, (bool, u64)>| -> BTreeSet<String> {
        m.keys().filter(|k| !k.contains('/')).cloned().collect()
    };
    for (who, m) in [("runc.v2", &r), ("gpusnap", &g)] {
        for name in [
            "dump.log",
            "stats-dump",
            "config.dump",
            "spec.dump",
            "status.dump",
            "rootfs-diff.tar",
        ] {
            let entry = m.get(name);
            ensure!(
                entry.is_some_and(|(dir, size)| !dir && *size > 0),
                "{who}'s archive has no (non-empty) {name} at the top: {:?}",
                top(m)
            );
        }
        ensure!(
            m.get("checkpoint").is_some_and(|(dir, _)| *dir),
            "{who}'s archive has no checkpoint/ directory"
        );
    }
    ensure!(
        top(&g) == top(&r),
        "top-level entries differ: gpusnap {:?}, runc.v2 {:?}",
        top(&g),
        top(&r)
    );
    let inner = |m: &BTreeMap<String, (bool, u64)>| -> BTreeSet<String> {
        m.keys()
            .filter_map(|k| k.strip_prefix("checkpoint/"))
            .map(shape)
            .collect()
    };
    let (gi, ri) = (inner(&g), inner(&r));
    let missing: Vec<&String> = ri.difference(&gi).collect();
    ensure!(
        missing.is_empty(),
        "checkpoint/ of gpusnap's archive lacks what runc.v2's holds: {missing:?} (gpusnap {gi:?})"
    );
    for name in ["dump.log", "stats-dump"] {
        ensure!(
            gi.contains(name) == ri.contains(name),
            "checkpoint/{name}: in gpusnap's {}, in runc.v2's {}",
            gi.contains(name),
            ri.contains(name)
        );
    }
    let (gc, rc) = (
        archive_json(gpusnap, "config.dump")?,
        archive_json(runc, "config.dump")?,
    );
    ensure!(
        keys(&gc) == keys(&rc),
        "config.dump fields differ: {gc} / {rc}"
    );
    ensure!(gc["runtime"] == "io.containerd.gpusnap.v2", "{gc}");
    ensure!(rc["runtime"] == "io.containerd.runc.v2", "{rc}");
    ensure!(gc["rootfsImageRef"] == rc["rootfsImageRef"], "{gc} / {rc}");
    let (gs, rs) = (
        archive_json(gpusnap, "spec.dump")?,
        archive_json(runc, "spec.dump")?,
    );
    ensure!(keys(&gs) == keys(&rs), "spec.dump fields differ");
    ensure!(
        gs["process"]["args"] == rs["process"]["args"],
        "spec.dump process args differ"
    );
    Ok(())
}

// ----- the tests ---------------------------------------------------------------------------

/// Counter under gpusnap and under runc.v2 on one node, both checkpointed with
/// `crictl checkpoint --export`; the archives compared; gpusnap's workload moves to a new pod by
/// `crictl create` with the archive as its image, and runc.v2's archive restores under the
/// gpusnap handler as well.
#[test]
fn crictl_export_restores_from_the_archive_and_matches_runc_v2_layout() {
    check(|| {
        let n = Node::start(String::new())?;
        let work = tempfile::tempdir()?;
        let g = n.run_counter("exp-gpusnap", gpusnap_handler(), PidMode::Container, &[])?;
        let r = n.run_counter("exp-runc", runc_handler(), PidMode::Container, &[])?;
        let (g_archive, g_count) = n.checkpoint(&g, work.path(), "gpusnap")?;
        let (r_archive, _) = n.checkpoint(&r, work.path(), "runc")?;
        check_layout_like_runc(&g_archive, &r_archive)?;

        // The workload moves: its pod goes away, a new pod restores the archive.
        n.crictl.remove_pod(&g.pod)?;
        let restored = n.run(
            "exp-restored",
            gpusnap_handler(),
            PidMode::Container,
            &[],
            path_str(&g_archive)?,
            &[],
        )?;
        n.check_restored(&restored, &g_count, g.pid, true)?;
        Ok(())
    })
}

/// The archive becomes an image (`gpusnap image build`, `push` to the registry); a new pod
/// restores it (a) with the checkpoint image as its container image (`crictl pull`, then
/// containerd's CRI restore) and (b) from `gpusnap image pull --extract NAME` and the
/// `gpusnap.io/restore-from: NAME` annotation, with busybox as its image.
#[test]
fn crictl_export_restores_through_the_registry_by_image_and_by_restore_from() {
    check(|| {
        let n = Node::start(String::new())?;
        let work = tempfile::tempdir()?;
        let w = n.run_counter("reg-a", gpusnap_handler(), PidMode::Container, &[])?;
        let (archive, count) = n.checkpoint(&w, work.path(), "reg")?;
        n.crictl.remove_pod(&w.pod)?;
        let reference = n.publish(&archive, "gpusnap/ck-counter:crictl", work.path())?;

        // (a) the checkpoint image, pulled by CRI, as the container image.
        n.crictl.ok(&["pull", &reference])?;
        let by_image = n.run(
            "reg-image",
            gpusnap_handler(),
            PidMode::Container,
            &[],
            &reference,
            &[],
        )?;
        n.check_restored(&by_image, &count, w.pid, true)?;

        // (b) extracted under the node's checkpoint_root, named by the pod annotation.
        let name = "ck-crictl";
        gpusnap_ok(&[
            "--config",
            path_str(n.cri_node()?.config_path())?,
            "image",
            "pull",
            &n.reg.url("gpusnap/ck-counter:crictl"),
            "--extract",
            name,
        ])?;
        let root = n.cri_node()?.checkpoint_root();
        ensure!(
            root.join(name).join("checkpoint").is_dir(),
            "gpusnap image pull --extract put nothing under {}",
            root.display()
        );
        let by_name = n.run(
            "reg-annotated",
            gpusnap_handler(),
            PidMode::Container,
            &[("gpusnap.io/restore-from", name)],
            &n.busybox(),
            &[],
        )?;
        n.check_restored(&by_name, &count, w.pid, false)?;
        Ok(())
    })
}

/// Pods sharing one pid namespace (`shareProcessNamespace: true`): the container's init is
/// not pid 1 of its namespace (pause is). Checkpoint with crictl and restore into a new such pod
/// from the archive, under gpusnap and, as the control, under runc.v2.
#[test]
fn crictl_checkpoint_and_restore_in_pods_sharing_a_pid_namespace() {
    check(|| {
        let n = Node::start(String::new())?;
        let work = tempfile::tempdir()?;
        for handler in [runc_handler(), gpusnap_handler()] {
            let w = n.run_counter_high_pids(&format!("shared-{handler}"), handler)?;
            let (archive, count) = n
                .checkpoint(&w, work.path(), &format!("shared-{handler}"))
                .with_context(|| format!("handler {handler}"))?;
            n.crictl.remove_pod(&w.pod)?;
            let restored = n
                .run(
                    &format!("shared-{handler}-restored"),
                    handler,
                    PidMode::Pod,
                    &[],
                    path_str(&archive)?,
                    &[],
                )
                .with_context(|| format!("restore under {handler}"))?;
            n.check_restored(&restored, &count, w.pid, true)
                .with_context(|| format!("handler {handler}"))?;
        }
        Ok(())
    })
}

/// A "CUDA" counter (the driver double loaded through the shim's `[cuda] library`): crictl
/// checkpoint locks, checkpoints, restores and unlocks it with its device memory intact and the
/// archive carries the manifest's GPU section; after the workload's pod is gone and the double
/// forgot the process as CRIU would, a new pod restored from the archive gets a CUDA restore and
/// unlock of its new pid and exactly the device bytes it had.
#[test]
fn crictl_gpu_container_restores_from_the_archive_with_its_device_memory() {
    check(|| {
        let gpu = GpuDouble::new(Engine::DriverManaged, Cuda::V13_4)?;
        let n = Node::start(gpu.config())?;
        let (cuda, bytes): (CudaProcess, Vec<u8>) = gpu.cuda_process("crictl")?;
        let (k, v) = cuda.env_pair();
        let env = [(k, v)];
        let w = n.run_counter("gpu-a", gpusnap_handler(), PidMode::Container, &env)?;
        let (archive, count) = n.checkpoint(&w, gpu.scratch(), "gpu")?;
        gpu.check_checkpoint_calls(&cuda, w.pid, true)?;
        gpu.check_device_memory(&cuda, &bytes, "after the checkpoint")?;
        let unpacked = gpu.scratch().join("archive");
        let dir = gpusnap_testkit::gpu::unpack_cri_archive(&archive, &unpacked)?;
        gpusnap_testkit::gpu::check_gpu_checkpoint(
            &dir,
            Engine::DriverManaged,
            Cuda::V13_4,
            w.pid,
            &bytes,
        )?;

        n.crictl.remove_pod(&w.pod)?;
        gpu.emulate_criu_restore(&cuda)?;
        let restored = n.run(
            "gpu-b",
            gpusnap_handler(),
            PidMode::Container,
            &[],
            path_str(&archive)?,
            &env,
        )?;
        gpu.check_restored(&cuda, restored.pid, &bytes)?;
        n.check_restored(&restored, &count, w.pid, true)?;
        Ok(())
    })
}

/// The shim only at the `gpusnap` runtime's `runtime_path` (as `gpusnap install` configures it),
/// not on containerd's `PATH`: pod, checkpoint and containerd's CRI restore from the archive
/// all work on containerd 2.1.9.
#[test]
fn crictl_checkpoint_and_archive_restore_with_the_shim_only_at_runtime_path() {
    check(|| {
        let n = Node::start_with_runtime_path()?;
        let work = tempfile::tempdir()?;
        let w = n.run_counter("rtpath-a", gpusnap_handler(), PidMode::Container, &[])?;
        let (archive, count) = n.checkpoint(&w, work.path(), "rtpath")?;
        ensure!(
            archive_entries(&archive)?.contains_key("checkpoint/gpusnap-manifest.json"),
            "the archive was not written by the gpusnap shim"
        );
        n.crictl.remove_pod(&w.pod)?;
        let restored = n.run(
            "rtpath-b",
            gpusnap_handler(),
            PidMode::Container,
            &[],
            path_str(&archive)?,
            &[],
        )?;
        n.check_restored(&restored, &count, w.pid, true)?;
        Ok(())
    })
}

/// An encrypted checkpoint image (`gpusnap image build --encrypt-recipient`, every layer in
/// ocicrypt's format) pushed to the registry restores through `gpusnap image pull --extract
/// NAME`, which decrypts with the node's `restore.decryption_keys`, and the
/// `gpusnap.io/restore-from: NAME` annotation; the workload continues. Before that, the
/// refusals (the node configured with the wrong key, with none; the ciphertext tampered with, a
/// wrapped key swapped, as the registry could serve them) each name the image, leave nothing,
/// and a pod annotated with the name is refused with nothing running.
#[test]
fn crictl_restores_an_encrypted_image_by_restore_from() {
    use gpusnap_testkit::crypt_doors::{key_fingerprint, NothingLeft, Refusal};
    use gpusnap_testkit::ocicrypt::{key_pair, recipient, KeyKind};
    check(|| {
        let keys = tempfile::tempdir()?;
        let (key, public) = key_pair(keys.path(), "node", KeyKind::EcP256)?;
        let n = Node::start(format!("decryption_keys = [{:?}]\n", path_str(&key)?))?;
        let work = tempfile::tempdir()?;
        let w = n.run_counter("enc-a", gpusnap_handler(), PidMode::Container, &[])?;
        let (archive, count) = n.checkpoint(&w, work.path(), "enc")?;
        n.crictl.remove_pod(&w.pod)?;
        let layout = work.path().join("enc-layout");
        gpusnap_ok(&[
            "image",
            "build",
            path_str(&archive)?,
            "--layout",
            path_str(&layout)?,
            "--encrypt-recipient",
            &recipient(&public),
        ])?;
        let url = n.reg.url("gpusnap/ck-enc:crictl");
        gpusnap_ok(&["image", "push", path_str(&layout)?, &url])?;
        let name = "ck-enc";

        let node_config = n.cri_node()?.config_path().to_owned();
        let keys_line = format!("decryption_keys = [{:?}]", path_str(&key)?);
        let (other, _) = key_pair(keys.path(), "other", KeyKind::EcP256)?;
        let kid = key_fingerprint(&public)?;
        let root = n.cri_node()?.checkpoint_root();
        let store = n.cri_node()?.scratch().join("store");
        for refusal in Refusal::ALL {
            let (image, config) = match refusal {
                Refusal::WrongKey | Refusal::MissingKey => {
                    let keys = match refusal {
                        Refusal::WrongKey => format!("decryption_keys = [{:?}]", path_str(&other)?),
                        _ => "decryption_keys = []".to_owned(),
                    };
                    let config = work.path().join(format!("{}.toml", refusal.name()));
                    fs::write(
                        &config,
                        fs::read_to_string(&node_config)?.replace(&keys_line, &keys),
                    )?;
                    (url.clone(), config)
                }
                _ => {
                    let altered = work.path().join(refusal.name());
                    gpusnap_testkit::cmd::run(
                        "cp",
                        ["-a", path_str(&layout)?, path_str(&altered)?],
                    );
                    refusal.alter(&altered)?;
                    let image = n.reg.url(&format!("gpusnap/ck-enc:{}", refusal.name()));
                    gpusnap_ok(&["image", "push", path_str(&altered)?, &image])?;
                    (image, node_config.clone())
                }
            };
            let nothing = NothingLeft::before(&root, &store)?;
            let out = gpusnap([
                "--config",
                path_str(&config)?,
                "image",
                "pull",
                &image,
                "--extract",
                name,
            ]);
            ensure!(
                !out.status.success(),
                "{refusal:?}: the pull succeeded: {}",
                out.describe()
            );
            refusal.check_message(&String::from_utf8_lossy(&out.stderr), "ck-enc", &kid)?;
            nothing.check(&format!("{refusal:?}"), &root.join(name))?;
        }
        // The name the refused pulls would have made: a pod annotated with it runs nothing.
        let pod = n.crictl.run_pod(
            "enc-refused",
            gpusnap_handler(),
            PidMode::Container,
            &[("gpusnap.io/restore-from", name)],
        )?;
        let refused = n
            .crictl
            .create(&pod, "counter", &n.busybox(), &["sh", "-c", COUNTER], &[])
            .and_then(|id| n.crictl.start(&id).map(|()| id));
        ensure!(refused.is_err(), "restore-from {name} started: {refused:?}");
        n.crictl.remove_pod(&pod)?;
        gpusnap_ok(&[
            "--config",
            path_str(n.cri_node()?.config_path())?,
            "image",
            "pull",
            &url,
            "--extract",
            name,
        ])?;
        let restored = n.run(
            "enc-restored",
            gpusnap_handler(),
            PidMode::Container,
            &[("gpusnap.io/restore-from", name)],
            &n.busybox(),
            &[],
        )?;
        n.check_restored(&restored, &count, w.pid, false)?;
        Ok(())
    })
}
