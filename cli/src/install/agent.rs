//! `gpusnap agent`: what the installer DaemonSet's container runs (packaging/helm, the
//! installer image). One process, no shell: it copies the binaries and the Secrets' key files
//! onto the node, runs `gpusnap install`, restarts the runtime when its configuration changed,
//! asks the node whether gpusnap works there (`gpusnap doctor` run on the host, which talks to
//! containerd over its socket), and says so: a ready file for the pod's readiness probe and the
//! node label `gpusnap.io/ready=true` that the RuntimeClass schedules on. It repeats that every
//! `--recheck-seconds`.
//!
//! On SIGTERM it takes the label off and reverts the runtime registration (containerd's and
//! CRI-O's configuration back to the byte, the runtime restarted) and keeps what the next pod of
//! an upgrade installs again unchanged: the node's gpusnap config, its keys and the binaries.
//! When its DaemonSet is being deleted (the chart's pre-delete hook deletes it in the
//! foreground, `agent uninstall-release`), it removes those too.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Component, InstallOptions};
use crate::fsutil;
use crate::kube::{Kube, READY_LABEL};

/// The standard system path, for commands run on the host.
const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The binaries the agent puts on the node.
pub const BINARIES: [&str; 3] = ["gpusnap", crate::RUNC_WRAPPER_BINARY, crate::SHIM_BINARY];

/// A file the agent copies onto the node (a Secret's entry): `SRC:DEST:MODE[:DIRMODE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutFile {
    pub src: PathBuf,
    pub dest: PathBuf,
    pub mode: u32,
    /// Mode of the directory, when the agent creates it.
    pub dir_mode: u32,
}

/// Why a `--put` value is not a [`PutFile`].
#[derive(Debug, thiserror::Error)]
pub enum PutFileError {
    #[error("{mode:?} is not an octal mode in {spec:?}")]
    Mode { mode: String, spec: String },
    #[error("{0:?}: expected SRC:DEST:MODE[:DIRMODE]")]
    Shape(String),
    #[error("{0:?}: DEST must be absolute")]
    RelativeDest(String),
}

impl std::str::FromStr for PutFile {
    type Err = PutFileError;
    fn from_str(s: &str) -> Result<Self, PutFileError> {
        let parts: Vec<&str> = s.split(':').collect();
        let octal = |m: &str| {
            u32::from_str_radix(m, 8).map_err(|_| PutFileError::Mode {
                mode: m.to_owned(),
                spec: s.to_owned(),
            })
        };
        let (src, dest, mode, dir_mode) = match parts[..] {
            [src, dest, mode] => (src, dest, octal(mode)?, 0o755),
            [src, dest, mode, dir] => (src, dest, octal(mode)?, octal(dir)?),
            _ => return Err(PutFileError::Shape(s.to_owned())),
        };
        if !dest.starts_with('/') {
            return Err(PutFileError::RelativeDest(s.to_owned()));
        }
        Ok(PutFile {
            src: src.into(),
            dest: dest.into(),
            mode,
            dir_mode,
        })
    }
}

/// Everything a round needs.
pub struct Agent {
    pub install: InstallOptions,
    pub state_file: PathBuf,
    /// Commands that restart containerd and CRI-O on the host (argv, run without a shell).
    pub restart_containerd: Option<Vec<String>>,
    pub restart_crio: Option<Vec<String>>,
    /// Where the image keeps the binaries, copied to `bin_dir` on the node.
    pub source_dir: Option<PathBuf>,
    pub bin_dir: PathBuf,
    pub files: Vec<PutFile>,
    /// The host's mount namespace (`/proc/1/ns/mnt` with `hostPID`): doctor and the restart
    /// commands run there, on the node's own binaries and files.
    pub host_mount_ns: Option<PathBuf>,
    /// containerd's socket, given to doctor.
    pub containerd_socket: PathBuf,
    pub ready_file: PathBuf,
    pub recheck: Duration,
    /// This pod's node, for the label (`spec.nodeName` through the downward API).
    pub node_name: Option<String>,
    /// This pod's DaemonSet (namespace, name): deleted = uninstall, else upgrade or restart.
    pub daemonset: Option<(String, String)>,
    pub kube: Option<Kube>,
    /// Where to watch for the kubelet's checkpoint archives, and where to keep their status
    /// files: the pushes of `gpusnap.io/checkpoint-to` ([`crate::checkpoint_push`]); `None`:
    /// not watched.
    pub push: Option<PushWatch>,
}

/// The agent's checkpoint-push half.
#[derive(Debug, Clone)]
pub struct PushWatch {
    pub checkpoint_dir: PathBuf,
    pub status_dir: PathBuf,
}

/// What the agent copied onto the node, so that an uninstall removes exactly that.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Placed {
    /// Path -> SHA-256 of what the agent wrote.
    files: BTreeMap<PathBuf, String>,
    /// Directories the agent created for them, outermost first.
    #[serde(default)]
    dirs: Vec<PathBuf>,
}

static TERMINATE: AtomicBool = AtomicBool::new(false);
/// Set after the first round (whatever came of it): it puts the Secrets' files on the node,
/// and the checkpoint pushes need the credentials and keys in place.
static FILES_PLACED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

fn log(msg: impl AsRef<str>) {
    println!("gpusnap agent: {}", msg.as_ref());
}

impl Agent {
    fn placed_file(&self) -> PathBuf {
        self.state_file.with_file_name("agent-files.json")
    }

    fn load_placed(&self) -> Placed {
        std::fs::read(self.placed_file())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn save_placed(&self, p: &Placed) -> io::Result<()> {
        let path = self.placed_file();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        fsutil::write_atomically(&path, &serde_json::to_vec_pretty(p)?, 0o600)
    }

    /// Runs rounds until SIGTERM or SIGINT, then takes the install back. Returns the exit code.
    /// With [`Agent::push`], the checkpoint pushes run beside the rounds, on a thread of their
    /// own, from the start (before the first round: archives wait for no install).
    pub fn run(&self) -> u8 {
        use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
        let action = SigAction::new(
            SigHandler::Handler(on_terminate),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        for sig in [Signal::SIGTERM, Signal::SIGINT] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            if let Err(e) = unsafe { sigaction(sig, &action) } {
                log(format!("cannot handle {sig}: {e}"));
            }
        }
        std::thread::scope(|scope| {
            let pushes = self.push.as_ref().map(|w| {
                let agent = crate::checkpoint_push::PushAgent {
                    dir: w.checkpoint_dir.clone(),
                    status_dir: w.status_dir.clone(),
                    // The config this agent installs, from its source: it is there before the
                    // first round has installed it.
                    config: self
                        .install
                        .config_from
                        .clone()
                        .unwrap_or_else(|| self.install.config_path.clone()),
                    node: self.node_name.clone().unwrap_or_else(|| {
                        // Only a fallback: the chart gives the node's name (downward API).
                        std::fs::read_to_string("/proc/sys/kernel/hostname")
                            .map(|h| h.trim().to_owned())
                            .unwrap_or_else(|_| "node".to_owned())
                    }),
                    kube: self.kube.as_ref(),
                    files_ready: &FILES_PLACED,
                };
                std::thread::Builder::new()
                    .name("checkpoint-push".into())
                    .spawn_scoped(scope, move || {
                        if let Err(e) = agent.run(&TERMINATE) {
                            log(format!("checkpoint pushes stopped: {e:#}"));
                        }
                    })
            });
            if let Some(Err(e)) = &pushes {
                log(format!("cannot start the checkpoint pushes: {e}"));
            }
            self.rounds();
            // A push in flight stops at once (its record says so; the next agent resumes it).
            gpusnap_oci_image::interrupt::request();
            if let Some(Ok(h)) = pushes {
                let _ = h.join();
            }
        });
        log("terminating: taking the install back");
        match self.terminate() {
            Ok(()) => 0,
            Err(e) => {
                log(format!("uninstall failed: {e:#}"));
                1
            }
        }
    }

    /// Install-and-check rounds until SIGTERM or SIGINT.
    fn rounds(&self) {
        while !TERMINATE.load(Ordering::SeqCst) {
            let started = Instant::now();
            let ready = match self.round() {
                Ok(r) => r,
                Err(e) => {
                    log(format!("round failed: {e:#}"));
                    false
                }
            };
            FILES_PLACED.store(true, Ordering::SeqCst);
            self.set_ready(ready);
            log(format!(
                "round done in {} ms: {}; next in {} s",
                started.elapsed().as_millis(),
                if ready { "ready" } else { "NOT ready" },
                self.recheck.as_secs()
            ));
            let until = Instant::now() + self.recheck;
            while !TERMINATE.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// One install-and-check round; whether the node is ready.
    fn round(&self) -> anyhow::Result<bool> {
        let mut placed = self.load_placed();
        if let Some(src) = &self.source_dir {
            for b in BINARIES {
                let from = src.join(b);
                let to = self.bin_dir.join(b);
                if put(&from, &to, 0o755, 0o755, &mut placed.dirs)? {
                    log(format!("installed {}", to.display()));
                }
                placed.files.insert(to.clone(), sha_of(&to)?);
            }
        }
        for f in &self.files {
            if put(&f.src, &f.dest, f.mode, f.dir_mode, &mut placed.dirs)? {
                log(format!(
                    "installed {} (mode {:o})",
                    f.dest.display(),
                    f.mode
                ));
            }
            placed.files.insert(f.dest.clone(), sha_of(&f.dest)?);
        }
        self.save_placed(&placed)?;

        let mut install = self.install.clone();
        if let Some(criu) = &mut install.criu {
            criu.facts = self.node_criu_facts();
        }
        // The node's containerd release decides drop-in or in-place; its binary is not in
        // this container, its socket is.
        if let Some(target) = install.containerd.as_mut().filter(|t| t.release.is_none()) {
            target.release = crate::cri::query(&self.containerd_socket, Duration::from_secs(5))
                .ok()
                .and_then(|f| crate::host::Release::parse(&f.runtime_version));
        }
        let plan = super::plan(&install)?;
        for n in &plan.notes {
            log(format!("note: {n}"));
        }
        for w in &plan.warnings {
            log(format!("warning: {w}"));
        }
        if !plan.is_empty() {
            let applied = super::apply(&plan, &self.state_file)?;
            for c in &plan.changes {
                log(format!("changed {}: {}", c.path.display(), c.summary));
            }
            self.restart(&applied.components)?;
        }
        self.doctor()
    }

    /// CRIU's network-lock facts of the node (this container has neither CRIU nor iptables):
    /// the node's `iptables-restore`, and whether the node's CRIU (the config's
    /// criu.binary_dir, else its PATH) has the nftables lock.
    fn node_criu_facts(&self) -> super::CriuFacts {
        let ok = |argv: &[&str]| {
            let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            self.host_command(&argv).is_ok_and(|o| o.status.success())
        };
        let criu = self
            .install
            .config_from
            .as_deref()
            .or(Some(self.install.config_path.as_path()))
            .and_then(|p| gpusnap_config::Config::load(p).ok())
            .and_then(|c| c.criu.binary_dir)
            .map(|d| d.join("criu").display().to_string())
            .unwrap_or_else(|| "criu".to_owned());
        super::CriuFacts {
            iptables_restore: ok(&[
                "sh",
                "-c",
                "command -v iptables-restore || test -x /usr/sbin/iptables-restore || test -x /sbin/iptables-restore",
            ]),
            criu_nftables: ok(&[&criu, "check", "--feature", "network_lock_nftables"]),
        }
    }

    fn restart(&self, components: &std::collections::BTreeSet<Component>) -> anyhow::Result<()> {
        for (component, cmd) in [
            (Component::Containerd, &self.restart_containerd),
            (Component::Crio, &self.restart_crio),
        ] {
            if !components.contains(&component) {
                continue;
            }
            let Some(argv) = cmd else {
                log(format!(
                    "{} configuration changed; no restart command given: restart it on the node",
                    component.as_str()
                ));
                continue;
            };
            log(format!(
                "restarting {}: {}",
                component.as_str(),
                argv.join(" ")
            ));
            let out = self.host_command(argv)?;
            if !out.status.success() {
                anyhow::bail!(
                    "`{}` failed ({}): {}",
                    argv.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(())
    }

    /// `gpusnap doctor` on the node (the copy in `bin_dir`, in the host's mount namespace):
    /// ready when nothing fails, containerd's loaded handler included.
    fn doctor(&self) -> anyhow::Result<bool> {
        let gpusnap = self.bin_dir.join("gpusnap");
        let argv: Vec<String> = vec![
            gpusnap.display().to_string(),
            "--config".into(),
            self.install.config_path.display().to_string(),
            "doctor".into(),
            "--json".into(),
            "--containerd-socket".into(),
            self.containerd_socket.display().to_string(),
        ];
        let out = self.host_command(&argv)?;
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            anyhow::anyhow!(
                "{} printed no report ({e}; {}): {}",
                argv.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
        let fails: Vec<String> = report["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == "fail")
            .map(|c| {
                format!(
                    "{}: {}{}",
                    c["name"].as_str().unwrap_or("?"),
                    c["summary"].as_str().unwrap_or(""),
                    c["action"]
                        .as_str()
                        .map(|a| format!(" → {a}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        for f in &fails {
            log(format!("doctor FAIL {f}"));
        }
        Ok(fails.is_empty())
    }

    fn set_ready(&self, ready: bool) {
        if ready {
            if let Some(dir) = self.ready_file.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(e) = std::fs::write(&self.ready_file, b"ready\n") {
                log(format!("writing {}: {e}", self.ready_file.display()));
            }
        } else {
            let _ = std::fs::remove_file(&self.ready_file);
        }
        self.label(ready.then_some("true"));
    }

    fn label(&self, value: Option<&str>) {
        let (Some(kube), Some(node)) = (&self.kube, &self.node_name) else {
            return;
        };
        match kube.label_node(node, READY_LABEL, value) {
            Ok(()) => log(format!(
                "node {node}: {}",
                match value {
                    Some(v) => format!("labelled {READY_LABEL}={v}"),
                    None => format!("label {READY_LABEL} removed"),
                }
            )),
            Err(e) => log(format!("node {node}: labelling failed: {e}")),
        }
    }

    /// SIGTERM: the label off, the runtime registration reverted; the whole install when the
    /// DaemonSet is being deleted.
    fn terminate(&self) -> anyhow::Result<()> {
        self.set_ready(false);
        let purge = match (&self.kube, &self.daemonset) {
            (Some(kube), Some((ns, name))) => match kube.daemonset_deleting(ns, name) {
                Ok(deleting) => deleting,
                Err(e) => {
                    log(format!(
                        "cannot tell an uninstall from an upgrade ({e}): keeping the node's \
                         gpusnap config, keys and binaries"
                    ));
                    false
                }
            },
            _ => false,
        };
        let mut plan = super::plan_uninstall(&self.state_file, false)?;
        if !purge {
            plan.keep_components(&[Component::Gpusnap]);
        }
        for (path, why) in &plan.kept {
            log(format!("kept {}: {why}", path.display()));
        }
        super::apply_uninstall(&plan, &self.state_file)?;
        for c in &plan.reverts {
            log(format!("{} {}", c.summary, c.path.display()));
        }
        self.restart(&plan.components())?;
        if purge {
            let placed = self.load_placed();
            for (path, sha) in &placed.files {
                // Only what the agent wrote: a file replaced since is someone else's.
                if sha_of(path).is_ok_and(|s| s == *sha) {
                    std::fs::remove_file(path)?;
                    log(format!("removed {}", path.display()));
                }
            }
            for dir in placed.dirs.iter().rev() {
                // Only when empty: anything else in it is not the agent's.
                if std::fs::remove_dir(dir).is_ok() {
                    log(format!("removed {}", dir.display()));
                }
            }
            let _ = std::fs::remove_file(self.placed_file());
            // The push status records are the agent's own (an upgrade keeps them, so that no
            // archive is pushed twice); the archives themselves are the kubelet's.
            if let Some(w) = &self.push {
                match std::fs::remove_dir_all(&w.status_dir) {
                    Ok(()) => log(format!("removed {}", w.status_dir.display())),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => log(format!("removing {}: {e}", w.status_dir.display())),
                }
            }
            log("uninstalled: the node is as before gpusnap was installed");
        } else {
            log("runtime registration reverted; the gpusnap config, keys and binaries stay for the next installer pod");
        }
        Ok(())
    }

    /// Runs `argv` (no shell) on the host: in its mount namespace when one is given, with the
    /// standard system PATH.
    fn host_command(&self, argv: &[String]) -> anyhow::Result<Output> {
        host_command(self.host_mount_ns.as_deref(), argv)
    }
}

/// Runs `argv` in the mount namespace `ns` (none: this one), with the standard system PATH,
/// stdin closed, and returns its output.
pub fn host_command(ns: Option<&Path>, argv: &[String]) -> anyhow::Result<Output> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("PATH", HOST_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let ns_file = match ns {
        Some(p) => {
            Some(File::open(p).map_err(|e| anyhow::anyhow!("opening {}: {e}", p.display()))?)
        }
        None => None,
    };
    if let Some(f) = &ns_file {
        let fd = f.as_raw_fd();
        // SAFETY: between fork and exec only async-signal-safe calls (setns, chdir) on a
        // descriptor the parent keeps open until the child has exec'd.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNS) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("running {}: {e}", argv.join(" ")))?;
    drop(ns_file);
    Ok(out)
}

/// A command line split as a shell would, without running one.
pub fn split_command(line: &str) -> Result<Vec<String>, String> {
    match shlex::split(line) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(format!(
            "{line:?}: not a command line (unbalanced quotes, or empty)"
        )),
    }
}

fn sha_of(path: &Path) -> io::Result<String> {
    Ok(fsutil::sha256_hex(&std::fs::read(path)?))
}

/// Copies `from` to `to` (root-owned, `mode`) unless it already has that content and mode;
/// creates missing directories with `dir_mode` and adds them to `made`. Whether it wrote.
fn put(
    from: &Path,
    to: &Path,
    mode: u32,
    dir_mode: u32,
    made: &mut Vec<PathBuf>,
) -> anyhow::Result<bool> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let bytes =
        std::fs::read(from).map_err(|e| anyhow::anyhow!("reading {}: {e}", from.display()))?;
    if let Some(dir) = to.parent() {
        for d in fsutil::create_dirs(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?
        {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(dir_mode))?;
            if !made.contains(&d) {
                made.push(d);
            }
        }
    }
    let same = std::fs::symlink_metadata(to).is_ok_and(|m| {
        m.file_type().is_file()
            && m.permissions().mode() & 0o7777 == mode
            && m.uid() == 0
            && m.gid() == 0
            && std::fs::read(to).is_ok_and(|b| b == bytes)
    });
    if same {
        return Ok(false);
    }
    // A new file, renamed over the old one: a running shim keeps its binary.
    fsutil::write_atomically(to, &bytes, mode)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", to.display()))?;
    Ok(true)
}

/// `gpusnap agent probe`: the pod is ready when the last round found the node ready and
/// containerd still answers with the handler. Exit 0 or 1, with one line.
pub fn probe(ready_file: &Path, containerd_socket: Option<&Path>) -> u8 {
    if !ready_file.exists() {
        println!("not ready: the installer has not found this node ready (see its log)");
        return 1;
    }
    if let Some(socket) = containerd_socket {
        match crate::cri::query(socket, Duration::from_secs(5)) {
            Ok(f) if f.handlers.iter().any(|h| h == crate::HANDLER) => {}
            Ok(f) => {
                println!(
                    "not ready: containerd on {} lacks the `{}` handler (has {})",
                    socket.display(),
                    crate::HANDLER,
                    f.handlers.join(", ")
                );
                return 1;
            }
            Err(e) => {
                println!("not ready: {e}");
                return 1;
            }
        }
    }
    println!("ready");
    0
}

/// The chart's pre-delete hook: deletes the installer DaemonSet in the foreground, so that
/// every installer pod, seeing it deleted, uninstalls gpusnap from its node while the
/// release's service account still works; then takes the label off the nodes whose pod did
/// not (it could not run there).
pub fn uninstall_release(kube: &Kube, ns: &str, daemonset: &str, timeout: Duration) -> u8 {
    let nodes: Vec<String> = match kube.daemonset_pod_nodes(ns, daemonset) {
        Ok(n) => n,
        Err(e) => {
            println!("listing the installer's pods: {e}");
            Vec::new()
        }
    };
    let mut code = 0;
    match kube.delete_daemonset_and_wait(ns, daemonset, timeout) {
        Ok(true) => println!("DaemonSet {ns}/{daemonset} and its pods are gone"),
        Ok(false) => {
            println!(
                "DaemonSet {ns}/{daemonset} still has pods after {} s: their nodes may keep \
                 gpusnap (run `gpusnap uninstall` there)",
                timeout.as_secs()
            );
            code = 1;
        }
        Err(e) => {
            println!("deleting DaemonSet {ns}/{daemonset}: {e}");
            code = 1;
        }
    }
    for node in nodes {
        match kube.label_node(&node, READY_LABEL, None) {
            Ok(()) => println!("node {node}: label {READY_LABEL} removed"),
            Err(e) => {
                println!("node {node}: removing {READY_LABEL}: {e}");
                code = 1;
            }
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_file_specs() {
        let p: PutFile = "/run/s/k:/etc/gpusnap/keys/k:644".parse().unwrap();
        assert_eq!((p.mode, p.dir_mode), (0o644, 0o755));
        let p: PutFile = "/a:/etc/gpusnap/registry/config.json:600:700"
            .parse()
            .unwrap();
        assert_eq!((p.mode, p.dir_mode), (0o600, 0o700));
        assert!("/a:rel:600".parse::<PutFile>().is_err());
        assert!("/a:/b:rw".parse::<PutFile>().is_err());
    }

    #[test]
    fn put_writes_only_changes() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::write(&src, b"k1").unwrap();
        let dest = d.path().join("keys/k");
        let mut made = Vec::new();
        assert!(put(&src, &dest, 0o600, 0o700, &mut made).unwrap());
        assert_eq!(made, [d.path().join("keys")]);
        assert!(!put(&src, &dest, 0o600, 0o700, &mut made).unwrap());
        std::fs::write(&src, b"k2").unwrap();
        assert!(put(&src, &dest, 0o600, 0o700, &mut made).unwrap());
        assert_eq!(std::fs::read(&dest).unwrap(), b"k2");
        assert_eq!(made.len(), 1);
    }

    #[test]
    fn command_lines_split_without_a_shell() {
        assert_eq!(
            split_command("systemctl try-restart 'k3s' k3s-agent").unwrap(),
            ["systemctl", "try-restart", "k3s", "k3s-agent"]
        );
        assert!(split_command("a 'b").is_err());
        assert!(split_command("  ").is_err());
    }
}
