//! [`Rig`]: a private, real containerd for one test.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, ensure, Context, Result};

use crate::cmd::{is_root, run_with_timeout, OutputExt, Spawned};
use crate::containerd::{Containerd, ContainerdSpec};
use crate::paths::{self, GPUSNAP_SHIM_NAME};
use crate::pty::{run_in_pty, PtyOutput};
use crate::wait::{wait_for, wait_until};

/// Image ref of the busybox test image (from `busybox.oci.tar`).
pub const BUSYBOX_IMAGE: &str = "docker.io/gpusnap/busybox:test";
/// Image ref of the pause-like image (from `pause.oci.tar`): sleeps forever, exits 0 on SIGTERM.
pub const PAUSE_IMAGE: &str = "docker.io/gpusnap/pause:test";
/// Default deadline for one `ctr` invocation.
pub const CTR_TIMEOUT: Duration = Duration::from_secs(60);

static RIG_SEQ: AtomicUsize = AtomicUsize::new(0);

/// The shim a scenario runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// containerd's own `containerd-shim-runc-v2` (the reference behaviour).
    RuncV2,
    /// Our `containerd-shim-gpusnap-v2`.
    Gpusnap,
}

impl Runtime {
    pub const ALL: [Runtime; 2] = [Runtime::RuncV2, Runtime::Gpusnap];

    /// Runtime type as passed to `ctr run --runtime` / used in `runtime_type`.
    pub fn runtime_type(self) -> &'static str {
        match self {
            Runtime::RuncV2 => "io.containerd.runc.v2",
            Runtime::Gpusnap => "io.containerd.gpusnap.v2",
        }
    }

    /// Binary containerd resolves the runtime type to (looked up on its PATH).
    pub fn shim_binary_name(self) -> &'static str {
        match self {
            Runtime::RuncV2 => "containerd-shim-runc-v2",
            Runtime::Gpusnap => GPUSNAP_SHIM_NAME,
        }
    }

    /// Runtime handler name registered for CRI
    /// (`[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.<name>]`).
    pub fn cri_handler(self) -> &'static str {
        match self {
            Runtime::RuncV2 => "runc",
            Runtime::Gpusnap => "gpusnap",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.runtime_type())
    }
}

/// Options for [`Rig::start_with`].
#[derive(Clone, Debug)]
pub struct RigOptions {
    /// Enable the CRI plugins (`io.containerd.grpc.v1.cri`, `io.containerd.cri.v1.*`) and
    /// NRI. Off by default: the CRI plugin is disabled via `disabled_plugins`.
    pub cri: bool,
    /// Import the busybox image (and, with `cri`, the pause image) after start. Default true.
    pub import_images: bool,
    /// Fail `start` if the gpusnap shim binary cannot be found. Default false (only
    /// runs that use [`Runtime::Gpusnap`] fail then).
    pub require_gpusnap: bool,
    /// containerd's log level (`$GPUSNAP_RIG_LOG_LEVEL`, default "info").
    pub log_level: String,
    /// Whether `criu` is on containerd's PATH (default true). With false the rig links
    /// containerd, ctr and containerd-shim-runc-v2 into `<rig>/bin` and leaves out of PATH
    /// both the rig prefix's bin dir and every system PATH entry holding a `criu`, so that
    /// neither shim (nor the runc they run) can find CRIU.
    pub criu_on_path: bool,
    /// Extra environment for containerd, inherited by the shims it starts (e.g.
    /// `GPUSNAP_CONFIG`).
    pub containerd_env: Vec<(String, String)>,
    /// String entries of the CRI `gpusnap` runtime's `options` table (e.g. `ConfigPath`), which
    /// CRI sends to the shim as `runtimeoptions.v1.Options`.
    pub gpusnap_runtime_options: Vec<(String, String)>,
    /// `pod_annotations` of the CRI `gpusnap` runtime (default `["gpusnap.io/*"]`, as
    /// `gpusnap install` configures it).
    pub gpusnap_pod_annotations: Vec<String>,
    /// CRI registry `config_path` (a `hosts.toml` tree), e.g. for a plain-HTTP local registry.
    pub cri_registry_config_path: Option<PathBuf>,
    /// `enable_experimental_restore_via_create` in the CRI runtime plugin (containerd 2.2.7+
    /// and 2.3.x only; 2.1 restores through CreateContainer unconditionally). `None`: not set.
    pub cri_restore_via_create: Option<bool>,
}

impl Default for RigOptions {
    fn default() -> Self {
        RigOptions {
            cri: false,
            import_images: true,
            require_gpusnap: false,
            log_level: std::env::var("GPUSNAP_RIG_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            criu_on_path: true,
            containerd_env: Vec::new(),
            gpusnap_runtime_options: Vec::new(),
            gpusnap_pod_annotations: vec!["gpusnap.io/*".into()],
            cri_registry_config_path: None,
            cri_restore_via_create: None,
        }
    }
}

/// Task status as `ctr tasks ls` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskState {
    Created,
    Running,
    Stopped,
    Paused,
    Pausing,
    Unknown(String),
}

impl TaskState {
    fn parse(s: &str) -> TaskState {
        match s {
            "CREATED" => TaskState::Created,
            "RUNNING" => TaskState::Running,
            "STOPPED" => TaskState::Stopped,
            "PAUSED" => TaskState::Paused,
            "PAUSING" => TaskState::Pausing,
            other => TaskState::Unknown(other.to_string()),
        }
    }
}

/// One row of `ctr tasks ls`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    pub id: String,
    pub pid: u32,
    pub state: TaskState,
}

/// Options for [`Rig::run_with`] (`ctr run --rm`).
#[derive(Clone, Debug)]
pub struct RunOpts {
    /// Bytes fed to the container's stdin (then closed); `None`: stdin is /dev/null.
    pub stdin: Option<Vec<u8>>,
    /// `--env` values (`K=V`).
    pub env: Vec<String>,
    /// Extra `ctr run` flags, inserted before the image name.
    pub extra_args: Vec<String>,
    /// Image; default [`BUSYBOX_IMAGE`].
    pub image: String,
    /// Deadline for the whole `ctr run`.
    pub timeout: Duration,
}

impl Default for RunOpts {
    fn default() -> Self {
        RunOpts {
            stdin: None,
            env: Vec::new(),
            extra_args: Vec::new(),
            image: BUSYBOX_IMAGE.to_string(),
            timeout: CTR_TIMEOUT,
        }
    }
}

/// Options for [`Rig::exec_with`] (`ctr tasks exec`).
#[derive(Clone, Debug)]
pub struct ExecOpts {
    pub stdin: Option<Vec<u8>>,
    /// `--detach`: return once the process started.
    pub detach: bool,
    pub timeout: Duration,
}

impl Default for ExecOpts {
    fn default() -> Self {
        ExecOpts {
            stdin: None,
            detach: false,
            timeout: CTR_TIMEOUT,
        }
    }
}

/// What is needed to run ctr against a rig, cloneable into helper threads.
#[derive(Clone)]
struct CtrBase {
    address: PathBuf,
    ns: String,
    path_env: OsString,
}

impl CtrBase {
    fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(paths::rig_bin_dir().join("ctr"));
        cmd.arg("--address")
            .arg(&self.address)
            .arg("--namespace")
            .arg(&self.ns);
        cmd.args(args).env("PATH", &self.path_env);
        cmd
    }

    fn tasks(&self) -> Result<Vec<TaskInfo>> {
        let out = run_with_timeout(self.command(&["tasks", "ls"]), None, CTR_TIMEOUT)?;
        ensure!(
            out.status.success(),
            "`ctr tasks ls` failed: {}",
            out.describe()
        );
        let mut v = Vec::new();
        for line in out.stdout_str().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 3 {
                continue;
            }
            v.push(TaskInfo {
                id: f[0].to_string(),
                pid: f[1]
                    .parse()
                    .with_context(|| format!("bad pid in `ctr tasks ls` line {line:?}"))?,
                state: TaskState::parse(f[2]),
            });
        }
        Ok(v)
    }

    fn ps(&self, id: &str) -> Result<Vec<u32>> {
        let out = run_with_timeout(self.command(&["tasks", "ps", id]), None, CTR_TIMEOUT)?;
        ensure!(
            out.status.success(),
            "`ctr tasks ps {id}` failed: {}",
            out.describe()
        );
        out.stdout_str()
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .map(|p| {
                p.parse::<u32>()
                    .with_context(|| format!("bad pid {p:?} in `ctr tasks ps`"))
            })
            .collect()
    }
}

/// A private containerd plus helpers to drive it through `ctr`.
pub struct Rig {
    dir: PathBuf,
    ns: String,
    opts: RigOptions,
    containerd: Option<Containerd>,
    path_env: OsString,
    gpusnap_shim: std::result::Result<PathBuf, String>,
}

fn toml_str(p: &Path) -> String {
    let s = p.to_string_lossy();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

impl Rig {
    /// Start a rig with default options (no CRI, busybox imported).
    pub fn start() -> Result<Rig> {
        Rig::start_with(RigOptions::default())
    }

    /// Start a rig for scenarios against `rt`: fails at once, with a clear message, when
    /// `rt`'s shim binary is not available.
    pub fn start_for(rt: Runtime) -> Result<Rig> {
        let opts = RigOptions {
            require_gpusnap: rt == Runtime::Gpusnap,
            ..RigOptions::default()
        };
        Rig::start_with(opts)
    }

    /// Start a rig.
    pub fn start_with(opts: RigOptions) -> Result<Rig> {
        ensure!(
            is_root(),
            "the gpusnap test rig needs root (containerd, runc, mounts, cgroups)"
        );
        let bin = paths::rig_bin_dir();
        for b in ["containerd", "ctr", "containerd-shim-runc-v2", "criu"] {
            ensure!(
                paths::is_executable(&bin.join(b)),
                "{} missing: run scripts/setup-env.sh first",
                bin.join(b).display()
            );
        }
        ensure!(
            paths::busybox_archive().is_file(),
            "{} missing: run scripts/setup-env.sh",
            paths::busybox_archive().display()
        );

        let gpusnap_shim = paths::locate_gpusnap_shim().map_err(|e| format!("{e:#}"));
        if opts.require_gpusnap {
            if let Err(e) = &gpusnap_shim {
                bail!("{e}");
            }
        }

        let seq = RIG_SEQ.fetch_add(1, Ordering::SeqCst);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let ns = format!("gst-{}-{}-{:04x}", std::process::id(), seq, nanos & 0xffff);
        // Short paths: the containerd socket path must fit in sun_path (108 bytes).
        let base = std::env::var_os("GPUSNAP_RIG_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let base = if base.as_os_str().len() > 60 {
            PathBuf::from("/tmp")
        } else {
            base
        };
        let dir = tempfile::Builder::new()
            .prefix(&format!("gpusnap-rig-{seq}-"))
            .tempdir_in(&base)
            .with_context(|| format!("creating rig dir under {}", base.display()))?
            .keep();
        for d in [
            "bin",
            "root",
            "state",
            "fifo",
            "cni/net.d",
            "cni/bin",
            "opt",
            "tmp",
        ] {
            fs::create_dir_all(dir.join(d))?;
        }
        if let Ok(shim) = &gpusnap_shim {
            std::os::unix::fs::symlink(shim, dir.join("bin").join(GPUSNAP_SHIM_NAME))
                .context("linking the gpusnap shim into the rig's bin dir")?;
        }
        let system_path = crate::containerd::system_path();
        let mut path_env = OsString::from(dir.join("bin"));
        path_env.push(":");
        if opts.criu_on_path {
            path_env.push(&bin);
            path_env.push(":");
            path_env.push(system_path);
        } else {
            for b in ["containerd", "ctr", "containerd-shim-runc-v2"] {
                std::os::unix::fs::symlink(bin.join(b), dir.join("bin").join(b))
                    .with_context(|| format!("linking {b} into the rig's bin dir"))?;
            }
            let kept: Vec<PathBuf> = std::env::split_paths(&system_path)
                .filter(|p| *p != bin && !paths::is_executable(&p.join("criu")))
                .collect();
            path_env.push(std::env::join_paths(kept).context("joining PATH without criu")?);
        }

        let mut rig = Rig {
            dir,
            ns,
            opts,
            containerd: None,
            path_env,
            gpusnap_shim,
        };
        fs::write(rig.config_path(), rig.containerd_config())?;
        // From here on Drop cleans up whatever happens.
        rig.start_containerd()?;
        if rig.opts.import_images {
            rig.import_image(&paths::busybox_archive(), BUSYBOX_IMAGE)?;
            if rig.opts.cri {
                rig.import_image(&paths::pause_archive(), PAUSE_IMAGE)?;
            }
        }
        Ok(rig)
    }

    // ----- paths & identity -------------------------------------------------------

    /// The rig's private directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// containerd namespace used by every `ctr` call of this rig (unique per rig).
    pub fn namespace(&self) -> &str {
        &self.ns
    }
    /// containerd's gRPC socket.
    pub fn address(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    pub fn root_dir(&self) -> PathBuf {
        self.dir.join("root")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    /// containerd's stdout/stderr.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    /// Bundle directory the shim of container `id` works in.
    pub fn bundle_dir(&self, id: &str) -> PathBuf {
        self.state_dir()
            .join("io.containerd.runtime.v2.task")
            .join(&self.ns)
            .join(id)
    }
    /// runc's state root as used by containerd-shim-runc-v2 for this rig's namespace.
    pub fn runc_root(&self) -> PathBuf {
        PathBuf::from("/run/containerd/runc").join(&self.ns)
    }
    /// PATH given to containerd (and inherited by shims, runc and CRIU).
    pub fn path_env(&self) -> &OsString {
        &self.path_env
    }
    /// Path of the gpusnap shim this rig uses, or why there is none.
    pub fn gpusnap_shim(&self) -> Result<&Path> {
        self.gpusnap_shim.as_deref().map_err(|e| anyhow!("{e}"))
    }
    /// PID of the running containerd.
    pub fn containerd_pid(&self) -> Option<u32> {
        self.containerd.as_ref().and_then(Containerd::pid)
    }

    /// Fail with a clear message when `rt`'s shim is not available to this rig.
    pub fn check_runtime(&self, rt: Runtime) -> Result<()> {
        match rt {
            Runtime::RuncV2 => Ok(()),
            Runtime::Gpusnap => self.gpusnap_shim().map(|_| ()),
        }
    }

    /// The containerd config (version 3) this rig runs with.
    pub fn containerd_config(&self) -> String {
        let d = &self.dir;
        let mut c = String::new();
        c.push_str("# generated by gpusnap-tests (tests/src/rig.rs)\nversion = 3\n");
        c.push_str(&format!(
            "root = {}\nstate = {}\n",
            toml_str(&d.join("root")),
            toml_str(&d.join("state"))
        ));
        if !self.opts.cri {
            c.push_str(
                "disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.images\", \
                 \"io.containerd.cri.v1.runtime\", \"io.containerd.nri.v1.nri\"]\n",
            );
        }
        c.push_str(&format!(
            "\n[grpc]\n  address = {}\n\n[ttrpc]\n  address = {}\n\n[debug]\n  level = \"{}\"\n",
            toml_str(&self.address()),
            toml_str(&d.join("containerd.sock.ttrpc")),
            self.opts.log_level
        ));
        c.push_str(&format!(
            "\n[plugins.'io.containerd.internal.v1.opt']\n  path = {}\n",
            toml_str(&d.join("opt"))
        ));
        // CRI gives pause containers oom_score_adj -998; lowering it needs CAP_SYS_RESOURCE,
        // which a test sandbox may lack: clamp to containerd's own value instead.
        c.push_str("\n[plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = true\n");
        if let Some(on) = self.opts.cri_restore_via_create {
            c.push_str(&format!(
                "  enable_experimental_restore_via_create = {on}\n"
            ));
        }
        // Runtimes for CRI. (Non-CRI clients such as `ctr run --runtime <type>` need no
        // registration: containerd maps the type to containerd-shim-<name>-<version> on PATH.)
        c.push_str("\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = \"runc\"\n");
        for rt in Runtime::ALL {
            c.push_str(&format!(
                "\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{}]\n  runtime_type = \"{}\"\n",
                rt.cri_handler(),
                rt.runtime_type()
            ));
            if rt == Runtime::Gpusnap {
                let globs: Vec<String> = self
                    .opts
                    .gpusnap_pod_annotations
                    .iter()
                    .map(|g| toml_str(Path::new(g)))
                    .collect();
                c.push_str(&format!("  pod_annotations = [{}]\n", globs.join(", ")));
                if !self.opts.gpusnap_runtime_options.is_empty() {
                    c.push_str(&format!(
                        "\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{}.options]\n",
                        rt.cri_handler()
                    ));
                    for (k, v) in &self.opts.gpusnap_runtime_options {
                        c.push_str(&format!("  {k} = {}\n", toml_str(Path::new(v))));
                    }
                }
            }
        }
        c.push_str(&format!(
            "\n[plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = [{}]\n  conf_dir = {}\n",
            toml_str(&d.join("cni/bin")),
            toml_str(&d.join("cni/net.d"))
        ));
        c.push_str(&format!(
            "\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"{PAUSE_IMAGE}\"\n"
        ));
        if let Some(dir) = &self.opts.cri_registry_config_path {
            c.push_str(&format!(
                "\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = {}\n",
                toml_str(dir)
            ));
        }
        // Random streaming port so that parallel CRI rigs do not collide on 10010.
        c.push_str(
            "\n[plugins.'io.containerd.grpc.v1.cri']\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n",
        );
        if self.opts.cri {
            c.push_str(&format!(
                "\n[plugins.'io.containerd.nri.v1.nri']\n  socket_path = {}\n  plugin_path = {}\n  plugin_config_path = {}\n",
                toml_str(&d.join("nri.sock")),
                toml_str(&d.join("nri/plugins")),
                toml_str(&d.join("nri/conf.d"))
            ));
        }
        c
    }

    // ----- containerd lifecycle ---------------------------------------------------------

    fn start_containerd(&mut self) -> Result<()> {
        ensure!(self.containerd.is_none(), "containerd already running");
        self.containerd = Some(Containerd::start(ContainerdSpec {
            config: self.config_path(),
            address: self.address(),
            log: self.log_path(),
            path_env: self.path_env.clone(),
            env: self.opts.containerd_env.clone(),
        })?);
        Ok(())
    }

    /// Stop containerd with `sig` (shims are left running), waiting up to `timeout`
    /// before SIGKILL.
    pub fn stop_containerd(&mut self, sig: i32, timeout: Duration) -> Result<()> {
        match self.containerd.take() {
            Some(mut c) => c.stop(sig, timeout),
            None => Ok(()),
        }
    }

    /// Stop containerd with SIGTERM (shims keep running) and start it again on the same
    /// root/state/socket/config.
    pub fn restart_containerd(&mut self) -> Result<()> {
        self.stop_containerd(libc::SIGTERM, Duration::from_secs(20))?;
        self.start_containerd()
    }

    /// Last `n` lines of containerd's log.
    pub fn log_tail(&self, n: usize) -> String {
        let s = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn import_image(&self, archive: &Path, name: &str) -> Result<()> {
        let a = archive.to_string_lossy();
        self.ctr_ok(&["images", "import", &a])
            .with_context(|| format!("importing {a}"))?;
        let names = self.ctr_ok(&["images", "ls", "-q"])?;
        ensure!(
            names.lines().any(|l| l.trim() == name),
            "after importing {a}, image {name} is not listed (images: {names:?})"
        );
        Ok(())
    }

    // ----- ctr --------------------------------------------------------------------------

    fn base(&self) -> CtrBase {
        CtrBase {
            address: self.address(),
            ns: self.ns.clone(),
            path_env: self.path_env.clone(),
        }
    }

    /// `ctr --address <sock> --namespace <ns> <args...>` as a Command (not started).
    pub fn ctr_command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        self.base().command(args)
    }

    /// Spawn ctr with `stdin` bytes whose EOF is held back until container `id`'s task
    /// has started (see [`Spawned::spawn_gated`]).
    fn ctr_spawn_task_stdin(&self, args: &[String], stdin: Vec<u8>, id: &str) -> Result<Spawned> {
        let base = self.base();
        let id = id.to_string();
        let gate = Box::new(move || {
            base.tasks().is_ok_and(|ts| {
                ts.iter()
                    .any(|t| t.id == id && t.state != TaskState::Created)
            })
        });
        Spawned::spawn_gated(self.ctr_command(args), stdin, gate)
    }

    fn ctr_timeout<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: &[S],
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Output> {
        run_with_timeout(self.ctr_command(args), stdin, timeout)
    }

    /// Run ctr with stdin from /dev/null; any exit status is returned, not an error.
    pub fn ctr<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<Output> {
        self.ctr_timeout(args, None, CTR_TIMEOUT)
    }

    /// Run ctr feeding `stdin`.
    pub fn ctr_stdin<S: AsRef<std::ffi::OsStr>>(&self, args: &[S], stdin: &[u8]) -> Result<Output> {
        self.ctr_timeout(args, Some(stdin.to_vec()), CTR_TIMEOUT)
    }

    /// Run ctr and require success; returns stdout.
    pub fn ctr_ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String> {
        let out = self.ctr(args)?;
        ensure!(
            out.status.success(),
            "`ctr {}` failed: {}",
            args.iter()
                .map(|a| a.as_ref().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            out.describe()
        );
        Ok(out.stdout_str())
    }

    /// Spawn ctr in the background (stdout/stderr collected while it runs).
    pub fn ctr_spawn<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: &[S],
        stdin: Option<Vec<u8>>,
    ) -> Result<Spawned> {
        Spawned::spawn(self.ctr_command(args), stdin)
    }

    /// Run ctr on a fresh pty (needed for `--tty`).
    pub fn ctr_pty<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: &[S],
        timeout: Duration,
    ) -> Result<PtyOutput> {
        run_in_pty(self.ctr_command(args), timeout)
    }

    // ----- containers -----------------------------------------------------------------

    fn fifo_dir(&self) -> String {
        self.dir.join("fifo").to_string_lossy().into_owned()
    }

    /// Arguments for `ctr run` (without the leading "run").
    fn run_args(
        &self,
        rt: Runtime,
        id: &str,
        cmd: &[&str],
        opts: &RunOpts,
        mode: &[&str],
    ) -> Vec<String> {
        let mut a: Vec<String> = vec!["run".into()];
        a.extend(mode.iter().map(|s| s.to_string()));
        a.extend([
            "--runtime".into(),
            rt.runtime_type().into(),
            "--fifo-dir".into(),
            self.fifo_dir(),
        ]);
        for e in &opts.env {
            a.push("--env".into());
            a.push(e.clone());
        }
        a.extend(opts.extra_args.iter().cloned());
        a.push(opts.image.clone());
        a.push(id.into());
        a.extend(cmd.iter().map(|s| s.to_string()));
        a
    }

    /// `ctr run --rm --runtime <rt> busybox <id> <cmd...>` to completion. The exit status
    /// of ctr is the container's.
    pub fn run(&self, rt: Runtime, id: &str, cmd: &[&str]) -> Result<Output> {
        self.run_with(rt, id, cmd, &RunOpts::default())
    }

    /// [`Rig::run`] with options (stdin, env, extra flags, image, timeout).
    pub fn run_with(&self, rt: Runtime, id: &str, cmd: &[&str], opts: &RunOpts) -> Result<Output> {
        self.check_runtime(rt)?;
        let args = self.run_args(rt, id, cmd, opts, &["--rm"]);
        self.ctr_spawn_task_stdin(&args, opts.stdin.clone().unwrap_or_default(), id)?
            .wait_timeout(opts.timeout)
    }

    /// `ctr run --rm --tty ...` on a pty; returns the terminal output and ctr's status.
    pub fn run_tty(&self, rt: Runtime, id: &str, cmd: &[&str]) -> Result<PtyOutput> {
        self.check_runtime(rt)?;
        let args = self.run_args(rt, id, cmd, &RunOpts::default(), &["--rm", "--tty"]);
        self.ctr_pty(&args, CTR_TIMEOUT)
    }

    /// `ctr run --rm ...` in the background: the returned handle collects output while
    /// the container runs; its exit status is the container's.
    pub fn spawn_run(&self, rt: Runtime, id: &str, cmd: &[&str]) -> Result<Spawned> {
        self.check_runtime(rt)?;
        let args = self.run_args(rt, id, cmd, &RunOpts::default(), &["--rm"]);
        self.ctr_spawn_task_stdin(&args, Vec::new(), id)
    }

    /// `ctr run -d --null-io ...`: start a container and return its task once RUNNING.
    pub fn run_detached(&self, rt: Runtime, id: &str, cmd: &[&str]) -> Result<TaskInfo> {
        self.run_detached_with(rt, id, cmd, &RunOpts::default())
    }

    /// [`Rig::run_detached`] with options (`stdin` is ignored).
    pub fn run_detached_with(
        &self,
        rt: Runtime,
        id: &str,
        cmd: &[&str],
        opts: &RunOpts,
    ) -> Result<TaskInfo> {
        self.check_runtime(rt)?;
        let args = self.run_args(rt, id, cmd, opts, &["--detach", "--null-io"]);
        let out = self.ctr_timeout(&args, None, opts.timeout)?;
        ensure!(
            out.status.success(),
            "`ctr run -d` of {id} on {rt} failed: {}",
            out.describe()
        );
        self.wait_task_state(id, TaskState::Running, Duration::from_secs(30))
    }

    /// All tasks (`ctr tasks ls`).
    pub fn tasks(&self) -> Result<Vec<TaskInfo>> {
        self.base().tasks()
    }

    /// The task of container `id`, if it has one.
    pub fn task(&self, id: &str) -> Result<Option<TaskInfo>> {
        Ok(self.tasks()?.into_iter().find(|t| t.id == id))
    }

    /// State of `id`'s task (`None`: no task).
    pub fn task_state(&self, id: &str) -> Result<Option<TaskState>> {
        Ok(self.task(id)?.map(|t| t.state))
    }

    /// Host PID of `id`'s init process.
    pub fn task_pid(&self, id: &str) -> Result<u32> {
        self.task(id)?
            .map(|t| t.pid)
            .ok_or_else(|| anyhow!("container {id} has no task"))
    }

    /// Poll until `id`'s task is in `state`.
    pub fn wait_task_state(
        &self,
        id: &str,
        state: TaskState,
        timeout: Duration,
    ) -> Result<TaskInfo> {
        wait_for(timeout, &format!("task {id} to be {state:?}"), || {
            Ok(self.task(id)?.filter(|t| t.state == state))
        })
    }

    /// Poll until `id` has no task any more.
    pub fn wait_task_gone(&self, id: &str, timeout: Duration) -> Result<()> {
        wait_for(timeout, &format!("task {id} to disappear"), || {
            Ok(if self.task(id)?.is_none() {
                Some(())
            } else {
                None
            })
        })
    }

    /// `ctr tasks kill -s <signal> <id>` (signal like "SIGTERM", "9", "KILL").
    pub fn kill(&self, id: &str, signal: &str) -> Result<()> {
        self.ctr_ok(&["tasks", "kill", "-s", signal, id])
            .map(|_| ())
    }

    /// `ctr tasks kill --all -s <signal> <id>`.
    pub fn kill_all(&self, id: &str, signal: &str) -> Result<()> {
        self.ctr_ok(&["tasks", "kill", "--all", "-s", signal, id])
            .map(|_| ())
    }

    pub fn pause(&self, id: &str) -> Result<()> {
        self.ctr_ok(&["tasks", "pause", id]).map(|_| ())
    }

    pub fn resume(&self, id: &str) -> Result<()> {
        self.ctr_ok(&["tasks", "resume", id]).map(|_| ())
    }

    /// Host PIDs of all processes in the container (`ctr tasks ps`).
    pub fn ps(&self, id: &str) -> Result<Vec<u32>> {
        self.base().ps(id)
    }

    /// `ctr tasks metrics --format json <id>` parsed.
    pub fn metrics(&self, id: &str) -> Result<serde_json::Value> {
        let out = self.ctr_ok(&["tasks", "metrics", "--format", "json", id])?;
        serde_json::from_str(&out).with_context(|| format!("parsing metrics JSON {out:?}"))
    }

    /// `ctr tasks exec --exec-id <exec_id> <id> <cmd...>` to completion.
    pub fn exec(&self, id: &str, exec_id: &str, cmd: &[&str]) -> Result<Output> {
        self.exec_with(id, exec_id, cmd, &ExecOpts::default())
    }

    pub fn exec_with(
        &self,
        id: &str,
        exec_id: &str,
        cmd: &[&str],
        opts: &ExecOpts,
    ) -> Result<Output> {
        let mut a: Vec<&str> = vec!["tasks", "exec", "--exec-id", exec_id];
        let fifo = self.fifo_dir();
        a.extend(["--fifo-dir", &fifo]);
        if opts.detach {
            a.push("--detach");
        }
        a.push(id);
        a.extend(cmd);
        let args: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        if opts.detach {
            return self.ctr_timeout(&args, None, opts.timeout);
        }
        // Hold back stdin's EOF until the exec'd process shows up in `ctr tasks ps`: a
        // pid that was not there before and already runs `cmd` (its argv equals `cmd`).
        // Matching argv matters: the container may keep forking other processes.
        let base = self.base();
        let before = base.ps(id).unwrap_or_default();
        let task = id.to_string();
        let argv: Vec<u8> = cmd.iter().flat_map(|a| a.bytes().chain([0u8])).collect();
        let gate = Box::new(move || {
            base.ps(&task).is_ok_and(|now| {
                now.iter().any(|p| {
                    !before.contains(p)
                        && fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == argv)
                })
            })
        });
        Spawned::spawn_gated(
            self.ctr_command(&args),
            opts.stdin.clone().unwrap_or_default(),
            gate,
        )?
        .wait_timeout(opts.timeout)
    }

    /// `ctr tasks exec --tty` on a pty.
    pub fn exec_tty(&self, id: &str, exec_id: &str, cmd: &[&str]) -> Result<PtyOutput> {
        let fifo = self.fifo_dir();
        let mut a: Vec<&str> = vec![
            "tasks",
            "exec",
            "--tty",
            "--exec-id",
            exec_id,
            "--fifo-dir",
            &fifo,
            id,
        ];
        a.extend(cmd);
        self.ctr_pty(&a, CTR_TIMEOUT)
    }

    /// `ctr tasks delete <id>`, returning the task's exit code. (ctr 2.x exits 0 and
    /// reports a non-zero code only as a warning: `task <id> exit with non-zero exit
    /// code <N>`.)
    pub fn delete_task(&self, id: &str) -> Result<i32> {
        let out = self.try_delete_task(id)?;
        ensure!(
            out.status.success(),
            "`ctr tasks delete {id}` failed: {}",
            out.describe()
        );
        exit_code_from_delete(&out)
    }

    /// `ctr tasks delete <id>`, raw output (for deletes expected to fail).
    pub fn try_delete_task(&self, id: &str) -> Result<Output> {
        self.ctr(&["tasks", "delete", id])
    }

    /// `ctr tasks delete --force <id>` (kills a running task first); returns the exit code.
    pub fn force_delete_task(&self, id: &str) -> Result<i32> {
        let out = self.ctr(&["tasks", "delete", "--force", id])?;
        ensure!(
            out.status.success(),
            "`ctr tasks delete --force {id}` failed: {}",
            out.describe()
        );
        exit_code_from_delete(&out)
    }

    /// `ctr containers delete <id>`.
    pub fn delete_container(&self, id: &str) -> Result<Output> {
        self.ctr(&["containers", "delete", id])
    }

    /// Container ids (`ctr containers ls -q`).
    pub fn containers(&self) -> Result<Vec<String>> {
        Ok(self
            .ctr_ok(&["containers", "ls", "-q"])?
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect())
    }

    /// Kill `id`'s task, wait for it to stop, delete it; returns its exit code.
    pub fn stop_and_delete(&self, id: &str) -> Result<Option<i32>> {
        if let Some(t) = self.task(id)? {
            if t.state == TaskState::Paused {
                let _ = self.resume(id);
            }
            if t.state != TaskState::Stopped {
                let _ = self.kill_all(id, "SIGKILL");
                self.wait_task_state(id, TaskState::Stopped, Duration::from_secs(30))?;
            }
            return self.delete_task(id).map(Some);
        }
        Ok(None)
    }

    // ----- shims, runc, mounts ---------------------------------------------------------------

    /// Shim processes serving this rig: `(pid, container id)` for every process started
    /// with `-address <this rig's socket>` (as containerd starts shims).
    pub fn shim_processes(&self) -> Vec<(u32, String)> {
        let addr = self.address().to_string_lossy().into_owned();
        let mut v = Vec::new();
        for (pid, args) in proc_cmdlines() {
            let has_addr = args.windows(2).any(|w| w[0] == "-address" && w[1] == addr);
            if !has_addr {
                continue;
            }
            let id = args
                .windows(2)
                .find(|w| w[0] == "-id")
                .map(|w| w[1].clone())
                .unwrap_or_default();
            v.push((pid, id));
        }
        v
    }

    /// PID of the shim serving container `id`.
    pub fn shim_pid(&self, id: &str) -> Option<u32> {
        self.shim_processes()
            .into_iter()
            .find(|(_, i)| i == id)
            .map(|(p, _)| p)
    }

    /// Container ids runc knows in [`Rig::runc_root`] (`runc --root ... list`).
    pub fn runc_list(&self) -> Result<Vec<String>> {
        let root = self.runc_root();
        if !root.exists() {
            return Ok(Vec::new());
        }
        let mut cmd = Command::new("runc");
        cmd.arg("--root")
            .arg(&root)
            .args(["list", "-q"])
            .env("PATH", &self.path_env);
        let out = run_with_timeout(cmd, None, CTR_TIMEOUT)?;
        ensure!(out.status.success(), "runc list failed: {}", out.describe());
        Ok(out
            .stdout_str()
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect())
    }

    /// Detaches every mount under `path`, deepest first, in up to three passes (a detach can
    /// uncover a mount below it); returns whether none is left.
    pub fn unmount_all_under(path: &Path) -> bool {
        for _ in 0..3 {
            let mut mounts = Rig::mounts_under(path);
            if mounts.is_empty() {
                break;
            }
            mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
            for m in mounts {
                if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
                    // SAFETY: umount2 with a valid NUL-terminated path.
                    unsafe {
                        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                    }
                }
            }
        }
        Rig::mounts_under(path).is_empty()
    }

    /// Mount points at or below `path` (from /proc/self/mountinfo).
    pub fn mounts_under(path: &Path) -> Vec<PathBuf> {
        let s = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        s.lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|m| PathBuf::from(unescape_mountinfo(m)))
            .filter(|m| m.starts_with(path))
            .collect()
    }

    // ----- teardown ---------------------------------------------------------------------

    fn teardown(&mut self) {
        // 1. Kill and delete tasks, delete containers, while containerd still runs.
        let alive = self.containerd.as_mut().is_some_and(Containerd::is_running);
        if alive {
            if let Ok(tasks) = self.tasks() {
                for t in &tasks {
                    if t.state == TaskState::Paused {
                        let _ = self.resume(&t.id);
                    }
                    let _ = self.ctr_timeout(
                        &["tasks", "kill", "--all", "-s", "SIGKILL", &t.id],
                        None,
                        Duration::from_secs(10),
                    );
                }
                for t in &tasks {
                    let _ = self.wait_task_state(&t.id, TaskState::Stopped, Duration::from_secs(5));
                    let _ = self.ctr_timeout(
                        &["tasks", "delete", "--force", &t.id],
                        None,
                        Duration::from_secs(10),
                    );
                }
            }
            if let Ok(cs) = self.containers() {
                for c in cs {
                    let _ = self.ctr_timeout(
                        &["containers", "delete", &c],
                        None,
                        Duration::from_secs(10),
                    );
                }
            }
        }
        // 2. Stop containerd.
        let _ = self.stop_containerd(libc::SIGTERM, Duration::from_secs(10));
        // 3. Shims still around: any process started with our address or working in our
        //    state dir.
        let state = self.state_dir();
        let addr = self.address().to_string_lossy().into_owned();
        for (pid, args) in proc_cmdlines() {
            let by_addr = args.windows(2).any(|w| w[0] == "-address" && w[1] == addr);
            let by_cwd =
                fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c.starts_with(&state));
            if by_addr || by_cwd {
                // SAFETY: kill(2) on a pid we identified as one of this rig's shims.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
        // 4. Container processes whose shim is gone: everything in cgroups under /<ns>/.
        let ns_prefix = format!("/{}/", self.ns);
        for (pid, _) in proc_cmdlines() {
            let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if cg.lines().any(|l| {
                l.splitn(3, ':')
                    .nth(2)
                    .is_some_and(|p| p.starts_with(&ns_prefix))
            }) {
                // SAFETY: kill(2) on a process inside this rig's unique cgroup namespace path.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
        // 5. runc state left behind.
        if let Ok(ids) = self.runc_list() {
            for id in ids {
                let mut cmd = Command::new("runc");
                cmd.arg("--root")
                    .arg(self.runc_root())
                    .args(["delete", "--force", &id])
                    .env("PATH", &self.path_env);
                let _ = run_with_timeout(cmd, None, Duration::from_secs(10));
            }
        }
        let _ = fs::remove_dir(self.runc_root());
        // 6. Unmount everything under the rig dir, deepest first.
        let unmount_failed = !Rig::unmount_all_under(&self.dir);
        // 7. Empty cgroup directories /<hierarchy>/<ns>[/...].
        remove_cgroup_dirs(&self.ns);
        // 8. The directory itself.
        if std::env::var_os("GPUSNAP_RIG_KEEP").is_some() {
            eprintln!(
                "gpusnap rig: keeping {} (GPUSNAP_RIG_KEEP set)",
                self.dir.display()
            );
        } else if unmount_failed {
            eprintln!(
                "gpusnap rig: mounts remain under {}; not removing it",
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- gpusnap rig {} (ns {}) containerd log tail ----\n{}\n---- end of containerd log ----",
                self.dir.display(),
                self.ns,
                self.log_tail(40)
            );
        }
        self.teardown();
    }
}

fn exit_code_from_delete(out: &Output) -> Result<i32> {
    let err = out.stderr_str();
    const MARK: &str = "exit with non-zero exit code ";
    match err.find(MARK) {
        None => Ok(0),
        Some(i) => {
            let digits: String = err[i + MARK.len()..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            digits
                .parse()
                .with_context(|| format!("cannot parse exit code from {err:?}"))
        }
    }
}

/// (pid, argv) of every process we can read.
fn proc_cmdlines() -> Vec<(u32, Vec<String>)> {
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        v.push((pid, args));
    }
    v
}

fn unescape_mountinfo(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// rmdir `<mountpoint>/<ns>` (bottom-up) in every cgroup hierarchy.
fn remove_cgroup_dirs(ns: &str) {
    let s = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for l in s.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let fstype = post.split(' ').next().unwrap_or("");
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let Some(mp) = pre.split(' ').nth(4) else {
            continue;
        };
        let dir = Path::new(&unescape_mountinfo(mp)).join(ns);
        if dir.is_dir() {
            rmdir_tree(&dir);
        }
    }
}

fn rmdir_tree(dir: &Path) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_tree(&e.path());
            }
        }
    }
    // A cgroup dir still holding processes cannot be removed: give killed ones a moment.
    if !wait_until(Duration::from_secs(2), || {
        fs::remove_dir(dir).is_ok() || !dir.exists()
    }) {
        eprintln!("gpusnap rig: could not remove cgroup {}", dir.display());
    }
}
