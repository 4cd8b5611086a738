//! runc command lines: checkpoint, restore and the helper calls (pause, resume, kill, state).
//!
//! The `runc` crate implements neither checkpoint nor restore, so the argument vectors are built
//! here, following go-runc's flag mapping. The result is a [`RuncCommand`] value rather than a
//! spawned process: how runc runs is the front end's business (the shim runs it under its
//! subreaper; restore needs the container's stdio, which only the front end owns).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::criu_log::{criu_log_tail, LogTail};
use crate::options::{validate_container_id, CriuFlags, OptionsError};

/// runc's global flags (everything before the subcommand) and the environment runc and CRIU
/// run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuncGlobal {
    /// runc binary; a bare name is looked up on `PATH` by the OS.
    pub binary: PathBuf,
    /// `--root`: runc's state directory (containerd uses `/run/containerd/runc/<namespace>`).
    pub root: Option<PathBuf>,
    /// `--log`.
    pub log: Option<PathBuf>,
    /// `--log-format` for `--log`; `None` means `json` (what containerd parses, and what
    /// [`runc_log_error`] reads).
    pub log_format: Option<String>,
    /// `--systemd-cgroup`
    pub systemd_cgroup: bool,
    /// `--criu`: the CRIU binary runc runs; `None` lets runc run `criu` from its `PATH`.
    pub criu: Option<PathBuf>,
    /// Directory holding the `criu` to use, put in front of runc's `PATH` (runc execs `criu`
    /// from its own `PATH` unless `--criu` names it).
    pub criu_dir: Option<PathBuf>,
    /// Environment for runc, which passes its whole environment on to CRIU (e.g. the plugin
    /// directory, see [`crate::plugins`]).
    pub env: Vec<(OsString, OsString)>,
    /// Other global flags a caller gave runc (`--rootless`, `--debug`), passed on unchanged.
    pub extra: Vec<OsString>,
}

impl Default for RuncGlobal {
    fn default() -> Self {
        RuncGlobal {
            binary: PathBuf::from("runc"),
            root: None,
            log: None,
            log_format: None,
            systemd_cgroup: false,
            criu: None,
            criu_dir: None,
            env: Vec::new(),
            extra: Vec::new(),
        }
    }
}

impl RuncGlobal {
    fn global_args(&self, with_log: bool) -> Vec<OsString> {
        let mut args = Vec::new();
        if let Some(root) = &self.root {
            args.push("--root".into());
            args.push(root.into());
        }
        if let (Some(log), true) = (&self.log, with_log) {
            args.push("--log".into());
            args.push(log.into());
            args.push("--log-format".into());
            args.push(self.log_format.as_deref().unwrap_or("json").into());
        }
        if self.systemd_cgroup {
            args.push("--systemd-cgroup".into());
        }
        if let Some(criu) = &self.criu {
            args.push("--criu".into());
            args.push(criu.into());
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    /// The `PATH` runc should run with: `criu_dir` in front of `base`. `None` when nothing
    /// needs to change, so the child simply inherits the caller's environment.
    pub fn path_env(&self, base: Option<&OsStr>) -> Option<OsString> {
        let dir = self.criu_dir.as_ref()?;
        let mut parts = vec![dir.clone()];
        if let Some(base) = base {
            parts.extend(std::env::split_paths(base));
        }
        // join_paths fails only if a part contains ':'; fall back to the dir alone, which still
        // finds criu (runc itself is exec'd by absolute path or from the caller's PATH).
        Some(std::env::join_paths(parts).unwrap_or_else(|_| dir.clone().into_os_string()))
    }

    /// The search path CRIU probing should use so it finds the same `criu` runc will run.
    pub fn effective_search_path(&self) -> OsString {
        if let Some(dir) = self.criu.as_deref().and_then(Path::parent) {
            return dir.as_os_str().to_owned();
        }
        let inherited = std::env::var_os("PATH");
        self.path_env(inherited.as_deref())
            .or(inherited)
            .unwrap_or_default()
    }

    fn command(&self, with_log: bool, sub: Vec<OsString>) -> RuncCommand {
        let mut args = self.global_args(with_log);
        args.extend(sub);
        let mut env = self.env.clone();
        if let Some(path) = self.path_env(std::env::var_os("PATH").as_deref()) {
            env.push(("PATH".into(), path));
        }
        RuncCommand {
            program: self.binary.clone(),
            args,
            env,
        }
    }

    /// `runc [global] checkpoint [--leave-running] --image-path DIR [...] ID`.
    pub fn checkpoint(&self, id: &str, dump: &Dump) -> Result<RuncCommand, OptionsError> {
        validate_container_id(id)?;
        dump.flags.validate()?;
        require_abs("checkpoint path", &dump.image_dir)?;
        let mut sub: Vec<OsString> = vec!["checkpoint".into()];
        // Without --leave-running runc destroys the container after the dump.
        if dump.leave_running {
            sub.push("--leave-running".into());
        }
        sub.push("--image-path".into());
        sub.push((&dump.image_dir).into());
        if let Some(work) = &dump.work_dir {
            require_abs("work path", work)?;
            sub.push("--work-path".into());
            sub.push(work.into());
        }
        if let Some(parent) = &dump.parent {
            sub.push("--parent-path".into());
            sub.push(parent.into());
        }
        if dump.auto_dedup {
            sub.push("--auto-dedup".into());
        }
        sub.extend(dump.flags.to_args().into_iter().map(OsString::from));
        sub.push(id.into());
        Ok(self.command(true, sub))
    }

    /// `runc [global] restore [--detach] [--no-subreaper] [--no-pivot] --bundle B --image-path I
    /// [--work-path W] [--pid-file P] [--console-socket S] [flags] ID`.
    pub fn restore(&self, id: &str, r: &Restore) -> Result<RuncCommand, OptionsError> {
        validate_container_id(id)?;
        r.flags.validate()?;
        require_abs("image path", &r.image_dir)?;
        require_abs("bundle", &r.bundle)?;
        let mut sub: Vec<OsString> = vec!["restore".into()];
        if r.detach {
            sub.push("--detach".into());
        }
        if r.no_subreaper {
            sub.push("--no-subreaper".into());
        }
        if r.no_pivot {
            sub.push("--no-pivot".into());
        }
        sub.push("--bundle".into());
        sub.push((&r.bundle).into());
        sub.push("--image-path".into());
        sub.push((&r.image_dir).into());
        for (flag, path) in [
            ("--work-path", &r.work_dir),
            ("--pid-file", &r.pid_file),
            ("--console-socket", &r.console_socket),
        ] {
            if let Some(p) = path {
                require_abs(flag.trim_start_matches('-'), p)?;
                sub.push(flag.into());
                sub.push(p.into());
            }
        }
        sub.extend(r.flags.to_args().into_iter().map(OsString::from));
        sub.push(id.into());
        Ok(self.command(true, sub))
    }

    /// A helper call (`pause`, `resume`, `state`, `ps`, `kill`, `delete`) on one container.
    /// These leave `--log` out: their failures are reported by the caller, and they must not
    /// interleave with the log of the command a caller is waiting for.
    pub fn helper(&self, args: &[&str]) -> RuncCommand {
        self.command(false, args.iter().map(OsString::from).collect())
    }
}

/// What `runc checkpoint` is asked to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dump {
    pub image_dir: PathBuf,
    /// CRIU's work directory (`--work-path`): dump.log lands here.
    pub work_dir: Option<PathBuf>,
    /// `--parent-path`: the pre-dump this dump builds on.
    pub parent: Option<PathBuf>,
    /// `--auto-dedup`
    pub auto_dedup: bool,
    pub leave_running: bool,
    pub flags: CriuFlags,
}

impl Dump {
    /// Where CRIU writes `dump.log`: the work directory if set, else the image directory.
    pub fn criu_log(&self) -> PathBuf {
        self.work_dir
            .as_deref()
            .unwrap_or(&self.image_dir)
            .join(crate::DUMP_LOG)
    }
}

/// What `runc restore` is asked to do. [`Restore::new`] sets the Go runc shim's defaults:
/// `--detach --no-subreaper` (the front end reaps the restored init itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restore {
    pub image_dir: PathBuf,
    pub bundle: PathBuf,
    /// CRIU's work directory (`--work-path`): restore.log lands here.
    pub work_dir: Option<PathBuf>,
    /// `--pid-file`: runc writes the restored init's host pid here.
    pub pid_file: Option<PathBuf>,
    /// `--console-socket` for terminal containers.
    pub console_socket: Option<PathBuf>,
    pub detach: bool,
    pub no_subreaper: bool,
    pub no_pivot: bool,
    pub flags: CriuFlags,
}

impl Restore {
    pub fn new(image_dir: impl Into<PathBuf>, bundle: impl Into<PathBuf>) -> Self {
        Restore {
            image_dir: image_dir.into(),
            bundle: bundle.into(),
            work_dir: None,
            pid_file: None,
            console_socket: None,
            detach: true,
            no_subreaper: true,
            no_pivot: false,
            flags: CriuFlags::default(),
        }
    }

    /// Where CRIU writes `restore.log`.
    pub fn criu_log(&self) -> PathBuf {
        self.work_dir
            .as_deref()
            .unwrap_or(&self.image_dir)
            .join(crate::RESTORE_LOG)
    }
}

// Relative paths would resolve against runc's cwd (the bundle), which is never what a caller
// holding a containerd path meant.
fn require_abs(field: &'static str, path: &Path) -> Result<(), OptionsError> {
    if path.as_os_str().is_empty() {
        return Err(OptionsError::Empty { field });
    }
    if !path.is_absolute() {
        return Err(OptionsError::RelativePath {
            field,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// A fully built runc invocation, not yet spawned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuncCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Set on top of the inherited environment.
    pub env: Vec<(OsString, OsString)>,
}

impl RuncCommand {
    /// A `std::process::Command` with program, args and environment set and stdio untouched.
    pub fn to_command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Arguments as lossy strings, for logs and tests.
    pub fn args_lossy(&self) -> Vec<String> {
        self.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
}

impl fmt::Display for RuncCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program.display())?;
        for a in &self.args {
            write!(f, " {}", a.to_string_lossy())?;
        }
        Ok(())
    }
}

/// The last error runc wrote to its JSON `--log`, which says what went wrong far better than
/// its exit status.
pub fn runc_log_error(log: &Path) -> Option<String> {
    // runc's log of one container stays small; read only its tail all the same.
    const TAIL: u64 = 64 * 1024;
    let mut f = std::fs::File::open(log).ok()?;
    let len = f.metadata().ok()?.len();
    if len > TAIL {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(len - TAIL)).ok()?;
    }
    let mut raw = Vec::new();
    f.read_to_end(&mut raw).ok()?;
    String::from_utf8_lossy(&raw).lines().rev().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v.get("level")?.as_str()? == "error")
            .then(|| v.get("msg")?.as_str().map(str::to_string))?
    })
}

/// Why a synchronous runc run failed.
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for {program}: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` timed out after {timeout:?} and was killed{}", describe_log(.criu_log.as_ref()))]
    TimedOut {
        command: String,
        timeout: Duration,
        criu_log: Option<LogTail>,
    },
    #[error(
        "`{command}` failed ({status}): {stderr}{}",
        describe_log(.criu_log.as_ref())
    )]
    Failed {
        command: String,
        status: ExitStatus,
        /// runc's stderr, trimmed; runc prints its final error there even with `--log`.
        stderr: String,
        /// Error lines and tail of CRIU's log, when it could be read.
        criu_log: Option<LogTail>,
    },
}

fn describe_log(log: Option<&LogTail>) -> String {
    match log {
        Some(tail) if !tail.is_empty() => format!("\n{tail}"),
        Some(tail) => format!("\n{} is empty", tail.path.display()),
        None => String::new(),
    }
}

/// Output of a successful synchronous run.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// How many CRIU log lines an error carries.
pub const ERROR_LOG_LINES: usize = 10;

/// Runs a runc command to completion with stdin closed and output captured; on failure the
/// error carries runc's stderr and the tail of `criu_log`. `timeout` kills runc if CRIU hangs:
/// a frozen container must not stay frozen forever.
///
/// Not for `runc restore`: the restored container inherits runc's stdio, which must be the
/// container's own pipes or FIFOs, not ours. Spawn restore from [`RuncCommand::to_command`]
/// with the container's stdio instead.
pub fn run_captured(
    cmd: &RuncCommand,
    criu_log: &Path,
    timeout: Option<Duration>,
) -> Result<RunOutput, RuncError> {
    let command = cmd.to_string();
    let program = cmd.program.display().to_string();
    let started = Instant::now();
    tracing::debug!(%command, "running runc");
    let mut child = crate::exec::spawn(
        cmd.to_command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .map_err(|source| RuncError::Spawn {
        program: program.clone(),
        source,
    })?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = match wait_with_deadline(&mut child, timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            tracing::error!(%command, timeout_ms = timeout.map(|t| t.as_millis() as u64), "runc timed out; killed");
            return Err(RuncError::TimedOut {
                command,
                timeout: timeout.unwrap_or_default(),
                criu_log: criu_log_tail(criu_log, ERROR_LOG_LINES).ok(),
            });
        }
        Err(source) => return Err(RuncError::Wait { program, source }),
    };
    // One grace period for both pipes, not one each.
    let grace_end = Instant::now() + PIPE_GRACE;
    let stdout = stdout.collect(grace_end);
    let stderr = stderr.collect(grace_end);
    let elapsed = started.elapsed();
    if status.success() {
        tracing::debug!(%command, elapsed_ms = elapsed.as_millis() as u64, "runc succeeded");
        return Ok(RunOutput {
            stdout,
            stderr,
            elapsed,
        });
    }
    let criu_log = match criu_log_tail(criu_log, ERROR_LOG_LINES) {
        Ok(tail) => Some(tail),
        Err(err) => {
            // runc can fail before CRIU starts (bad id, missing criu): no log is normal then.
            tracing::debug!(path = %criu_log.display(), %err, "no CRIU log to attach");
            None
        }
    };
    tracing::error!(%command, %status, stderr = %stderr.trim(), "runc failed");
    Err(RuncError::Failed {
        command,
        status,
        stderr: stderr.trim().to_owned(),
        criu_log,
    })
}

/// Output of one child pipe, read on its own thread.
struct Drained {
    buf: Arc<Mutex<Vec<u8>>>,
    eof: mpsc::Receiver<()>,
}

/// How long to wait for pipe EOF after the child exited. A grandchild that inherited the pipe
/// (CRIU helpers, or a container if this is misused for restore) can hold it open forever; we
/// then return what was read so far instead of hanging.
const PIPE_GRACE: Duration = Duration::from_secs(2);

impl Drained {
    fn collect(self, grace_end: Instant) -> String {
        let _ = self
            .eof
            .recv_timeout(grace_end.saturating_duration_since(Instant::now()));
        let buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&buf).into_owned()
    }
}

// Drains on a thread so a chatty child cannot block on a full pipe while we wait for it.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> Drained {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let (tx, eof) = mpsc::channel();
    let sink = Arc::clone(&buf);
    thread::spawn(move || {
        if let Some(mut p) = pipe {
            let mut chunk = [0u8; 8192];
            loop {
                match p.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => sink
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
        let _ = tx.send(());
    });
    Drained { buf, eof }
}

/// `Ok(None)` when the deadline passed first.
fn wait_with_deadline(
    child: &mut Child,
    timeout: Option<Duration>,
) -> std::io::Result<Option<ExitStatus>> {
    let Some(timeout) = timeout else {
        return child.wait().map(Some);
    };
    let deadline = Instant::now() + timeout;
    // std has no wait-with-timeout; poll with a short sleep that grows to 50 ms so fast
    // commands return quickly and slow ones cost little CPU.
    let mut nap = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::CgroupsMode;

    fn global() -> RuncGlobal {
        RuncGlobal {
            binary: "/usr/bin/runc".into(),
            root: Some("/run/containerd/runc/k8s.io".into()),
            log: Some("/b/log.json".into()),
            systemd_cgroup: true,
            ..Default::default()
        }
    }

    fn args(cmd: &RuncCommand) -> Vec<String> {
        cmd.args_lossy()
    }

    #[test]
    fn global_flags_precede_subcommand_and_helpers_leave_the_log_out() {
        let dump = Dump {
            image_dir: "/cp".into(),
            leave_running: true,
            ..Default::default()
        };
        let cmd = global().checkpoint("c1", &dump).unwrap();
        assert_eq!(cmd.program, Path::new("/usr/bin/runc"));
        assert_eq!(
            args(&cmd),
            [
                "--root",
                "/run/containerd/runc/k8s.io",
                "--log",
                "/b/log.json",
                "--log-format",
                "json",
                "--systemd-cgroup",
                "checkpoint",
                "--leave-running",
                "--image-path",
                "/cp",
                "c1"
            ]
        );
        assert_eq!(
            args(&global().helper(&["pause", "c1"])),
            [
                "--root",
                "/run/containerd/runc/k8s.io",
                "--systemd-cgroup",
                "pause",
                "c1"
            ]
        );
    }

    #[test]
    fn checkpoint_with_every_option() {
        let dump = Dump {
            image_dir: "/cp".into(),
            work_dir: Some("/w".into()),
            parent: Some("../pre".into()),
            auto_dedup: true,
            leave_running: false,
            flags: CriuFlags {
                tcp_established: true,
                file_locks: true,
                manage_cgroups_mode: Some(CgroupsMode::Full),
                empty_ns: vec!["network".into()],
                ..Default::default()
            },
        };
        let g = RuncGlobal::default();
        assert_eq!(
            args(&g.checkpoint("c", &dump).unwrap()),
            [
                "checkpoint",
                "--image-path",
                "/cp",
                "--work-path",
                "/w",
                "--parent-path",
                "../pre",
                "--auto-dedup",
                "--tcp-established",
                "--file-locks",
                "--manage-cgroups-mode",
                "full",
                "--empty-ns",
                "network",
                "c"
            ]
        );
        assert_eq!(dump.criu_log(), Path::new("/w/dump.log"));
    }

    #[test]
    fn bad_input_is_refused_before_building() {
        let g = RuncGlobal::default();
        let mut dump = Dump {
            image_dir: "rel".into(),
            ..Default::default()
        };
        assert!(matches!(
            g.checkpoint("c", &dump),
            Err(OptionsError::RelativePath { .. })
        ));
        dump.image_dir = "/cp".into();
        assert!(matches!(
            g.checkpoint("-c", &dump),
            Err(OptionsError::InvalidContainerId { .. })
        ));
        dump.flags.empty_ns = vec!["pid".into()];
        assert!(g.checkpoint("c", &dump).is_err());
        let r = Restore::new("/cp", "bundle");
        assert!(g
            .restore("c", &r)
            .unwrap_err()
            .to_string()
            .contains("bundle"));
    }

    #[test]
    fn restore_defaults_and_every_option() {
        let g = RuncGlobal::default();
        let mut r = Restore::new("/cp", "/b");
        assert_eq!(
            args(&g.restore("c", &r).unwrap()),
            [
                "restore",
                "--detach",
                "--no-subreaper",
                "--bundle",
                "/b",
                "--image-path",
                "/cp",
                "c"
            ]
        );
        r.no_pivot = true;
        r.work_dir = Some("/w".into());
        r.pid_file = Some("/b/init.pid".into());
        r.console_socket = Some("/tmp/c.sock".into());
        r.flags.shell_job = true;
        assert_eq!(
            args(&g.restore("c", &r).unwrap()),
            [
                "restore",
                "--detach",
                "--no-subreaper",
                "--no-pivot",
                "--bundle",
                "/b",
                "--image-path",
                "/cp",
                "--work-path",
                "/w",
                "--pid-file",
                "/b/init.pid",
                "--console-socket",
                "/tmp/c.sock",
                "--shell-job",
                "c"
            ]
        );
        assert_eq!(r.criu_log(), Path::new("/w/restore.log"));
    }

    #[test]
    fn criu_dir_goes_in_front_of_path_and_env_is_passed_on() {
        let g = RuncGlobal {
            criu_dir: Some("/opt/gpusnap-rig/bin".into()),
            env: vec![("CRIU_LIBS_DIR".into(), "/run/x".into())],
            ..Default::default()
        };
        let cmd = g.helper(&["state", "c"]);
        let path = cmd
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .unwrap();
        assert!(path.starts_with("/opt/gpusnap-rig/bin"), "{path}");
        assert!(cmd.env.contains(&("CRIU_LIBS_DIR".into(), "/run/x".into())));
        assert!(g
            .effective_search_path()
            .to_string_lossy()
            .starts_with("/opt/gpusnap-rig/bin"));
        let named = RuncGlobal {
            criu: Some("/usr/local/sbin/criu".into()),
            ..Default::default()
        };
        assert_eq!(named.effective_search_path(), "/usr/local/sbin");
        assert!(args(&named.helper(&["ps", "c"]))
            .starts_with(&["--criu".to_string(), "/usr/local/sbin/criu".to_string()]));
    }

    #[test]
    fn runc_log_error_is_the_last_error_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.json");
        std::fs::write(
            &log,
            "{\"level\":\"error\",\"msg\":\"first\"}\nnot json\n{\"level\":\"error\",\"msg\":\"criu failed: type NOTIFY errno 0\"}\n{\"level\":\"info\",\"msg\":\"x\"}\n",
        )
        .unwrap();
        assert_eq!(
            runc_log_error(&log).as_deref(),
            Some("criu failed: type NOTIFY errno 0")
        );
        assert_eq!(runc_log_error(&dir.path().join("none")), None);
    }

    fn script(dir: &Path, body: &str) -> RuncGlobal {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-runc");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        RuncGlobal {
            binary: path,
            ..Default::default()
        }
    }

    fn dump_of(dir: &Path) -> Dump {
        Dump {
            image_dir: dir.to_path_buf(),
            leave_running: true,
            ..Default::default()
        }
    }

    #[test]
    fn run_success_captures_output() {
        let dir = tempfile::tempdir().unwrap();
        let g = script(dir.path(), "echo \"$@\"");
        let dump = dump_of(dir.path());
        let cmd = g.checkpoint("c", &dump).unwrap();
        let out = run_captured(&cmd, &dump.criu_log(), Some(Duration::from_secs(30))).unwrap();
        assert!(
            out.stdout.starts_with("checkpoint --leave-running"),
            "{}",
            out.stdout
        );
    }

    #[test]
    fn run_failure_includes_stderr_and_dump_log() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(crate::DUMP_LOG),
            "(0.1) start\n(0.2) Error (criu/files-reg.c:1): Can't dump file\n(0.3) end\n",
        )
        .unwrap();
        let g = script(
            dir.path(),
            "echo 'criu failed: type NOTIFY errno 0' >&2; exit 1",
        );
        let dump = dump_of(dir.path());
        let cmd = g.checkpoint("c", &dump).unwrap();
        let err = run_captured(&cmd, &dump.criu_log(), None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("criu failed: type NOTIFY"), "{msg}");
        assert!(msg.contains("Can't dump file"), "{msg}");
        assert!(matches!(
            err,
            RuncError::Failed {
                criu_log: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn run_timeout_kills() {
        let dir = tempfile::tempdir().unwrap();
        let g = script(dir.path(), "exec sleep 30");
        let dump = dump_of(dir.path());
        let cmd = g.checkpoint("c", &dump).unwrap();
        let started = Instant::now();
        let err =
            run_captured(&cmd, &dump.criu_log(), Some(Duration::from_millis(200))).unwrap_err();
        assert!(matches!(err, RuncError::TimedOut { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn grandchild_holding_the_pipe_does_not_hang() {
        let dir = tempfile::tempdir().unwrap();
        let g = script(dir.path(), "sleep 5 & echo started; exit 0");
        let dump = dump_of(dir.path());
        let cmd = g.checkpoint("c", &dump).unwrap();
        let started = Instant::now();
        let out = run_captured(&cmd, &dump.criu_log(), None).unwrap();
        assert_eq!(out.stdout.trim(), "started");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn spawn_failure_names_program() {
        let g = RuncGlobal {
            binary: "/nonexistent/runc".into(),
            ..Default::default()
        };
        let cmd = g.helper(&["state", "c"]);
        let err = run_captured(&cmd, Path::new("/cp/dump.log"), None).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/runc"), "{err}");
    }
}
