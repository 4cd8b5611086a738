//! `runc checkpoint` / `runc restore` command lines.
//!
//! The `runc` crate implements neither (reference §6), so we build the argument vectors here,
//! following go-runc's flag mapping (reference §9). The result is a [`RuncCommand`] value rather
//! than a spawned process: restore must run with the container's stdio, which only the shim
//! owns, so stdio is never set here. The shim runs it with
//! `tokio::process::Command::from(cmd.to_command())`.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::criu_log::{criu_log_tail, LogTail, DUMP_LOG};
use crate::options::{validate_container_id, CheckpointOptions, OptionsError, RestoreOptions};

/// runc's global flags, i.e. everything before the subcommand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuncGlobal {
    /// runc binary; a bare name is looked up on `PATH` by the OS.
    pub binary: PathBuf,
    /// `--root`: runc's state directory (containerd uses `/run/containerd/runc/<namespace>`).
    pub root: Option<PathBuf>,
    /// `--log` (always paired with `--log-format json`, which is what containerd parses).
    pub log: Option<PathBuf>,
    /// `--systemd-cgroup`
    pub systemd_cgroup: bool,
    /// Directory holding the `criu` to use. runc execs `criu` from its own `PATH` (reference
    /// §16), so this is prepended to the `PATH` runc gets.
    pub criu_dir: Option<PathBuf>,
}

impl Default for RuncGlobal {
    fn default() -> Self {
        RuncGlobal {
            binary: PathBuf::from("runc"),
            root: None,
            log: None,
            systemd_cgroup: false,
            criu_dir: None,
        }
    }
}

impl RuncGlobal {
    fn push_global_args(&self, args: &mut Vec<OsString>) {
        if let Some(root) = &self.root {
            args.push("--root".into());
            args.push(root.into());
        }
        if let Some(log) = &self.log {
            args.push("--log".into());
            args.push(log.into());
            args.push("--log-format".into());
            args.push("json".into());
        }
        if self.systemd_cgroup {
            args.push("--systemd-cgroup".into());
        }
    }

    /// The `PATH` runc should run with: `criu_dir` in front of `base`. `None` when nothing
    /// needs to change, so the child simply inherits the shim's environment.
    pub fn path_env(&self, base: Option<&OsStr>) -> Option<OsString> {
        let dir = self.criu_dir.as_ref()?;
        let mut parts = vec![dir.clone()];
        if let Some(base) = base {
            parts.extend(std::env::split_paths(base));
        }
        // join_paths fails only if a part contains ':'; fall back to the dir alone, which still
        // finds criu (runc itself is exec'd by absolute path or from the shim's PATH).
        Some(std::env::join_paths(parts).unwrap_or_else(|_| dir.clone().into_os_string()))
    }

    /// The search path CRIU probing should use so it finds the same `criu` runc will run.
    pub fn effective_search_path(&self) -> OsString {
        let inherited = std::env::var_os("PATH");
        self.path_env(inherited.as_deref())
            .or(inherited)
            .unwrap_or_default()
    }
}

/// A fully built runc invocation, not yet spawned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuncCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// `PATH` override for the child; `None` inherits.
    pub path_env: Option<OsString>,
}

impl RuncCommand {
    /// A `std::process::Command` with program, args and `PATH` set and stdio untouched.
    /// Convert with `tokio::process::Command::from` for async use.
    pub fn to_command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        if let Some(path) = &self.path_env {
            cmd.env("PATH", path);
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

// Flags shared by checkpoint and restore, in go-runc's order.
struct CriuFlags<'a> {
    open_tcp: bool,
    external_unix_sockets: bool,
    terminal: bool,
    file_locks: bool,
    empty_namespaces: &'a [String],
    cgroups_mode: Option<crate::options::CgroupsMode>,
}

impl CriuFlags<'_> {
    fn push(&self, args: &mut Vec<OsString>) {
        if self.open_tcp {
            args.push("--tcp-established".into());
        }
        if self.external_unix_sockets {
            args.push("--ext-unix-sk".into());
        }
        if self.terminal {
            args.push("--shell-job".into());
        }
        if self.file_locks {
            args.push("--file-locks".into());
        }
        if let Some(mode) = self.cgroups_mode {
            args.push("--manage-cgroups-mode".into());
            args.push(mode.as_str().into());
        }
        for ns in self.empty_namespaces {
            args.push("--empty-ns".into());
            args.push(ns.into());
        }
    }
}

/// `runc [global] checkpoint [--leave-running] --image-path DIR [--work-path W] [flags] ID`.
///
/// `image_dir` is the resolved destination (see [`CheckpointOptions::resolve_image_dir`]);
/// `opts.image_path` is not consulted again here.
pub fn checkpoint_command(
    global: &RuncGlobal,
    container_id: &str,
    image_dir: &Path,
    opts: &CheckpointOptions,
) -> Result<RuncCommand, OptionsError> {
    validate_container_id(container_id)?;
    opts.validate()?;
    if !image_dir.is_absolute() {
        return Err(OptionsError::RelativePath {
            field: "checkpoint path",
            path: image_dir.to_path_buf(),
        });
    }
    let mut args = Vec::new();
    global.push_global_args(&mut args);
    args.push("checkpoint".into());
    // Without --leave-running runc destroys the container after the dump (reference §16).
    if !opts.exit {
        args.push("--leave-running".into());
    }
    args.push("--image-path".into());
    args.push(image_dir.into());
    if let Some(work) = &opts.work_path {
        args.push("--work-path".into());
        args.push(work.into());
    }
    CriuFlags {
        open_tcp: opts.open_tcp,
        external_unix_sockets: opts.external_unix_sockets,
        terminal: opts.terminal,
        file_locks: opts.file_locks,
        empty_namespaces: &opts.empty_namespaces,
        cgroups_mode: opts.cgroups_mode,
    }
    .push(&mut args);
    args.push(container_id.into());
    Ok(RuncCommand {
        program: global.binary.clone(),
        args,
        path_env: global.path_env(std::env::var_os("PATH").as_deref()),
    })
}

/// `runc [global] restore [--detach] [--no-subreaper] [--no-pivot] --bundle B --image-path I
/// [--work-path W] [--pid-file P] [--console-socket S] [flags] ID`.
pub fn restore_command(
    global: &RuncGlobal,
    container_id: &str,
    opts: &RestoreOptions,
) -> Result<RuncCommand, OptionsError> {
    validate_container_id(container_id)?;
    opts.validate()?;
    let mut args = Vec::new();
    global.push_global_args(&mut args);
    args.push("restore".into());
    if opts.detach {
        args.push("--detach".into());
    }
    if opts.no_subreaper {
        args.push("--no-subreaper".into());
    }
    if opts.no_pivot {
        args.push("--no-pivot".into());
    }
    args.push("--bundle".into());
    args.push((&opts.bundle).into());
    args.push("--image-path".into());
    args.push((&opts.image_path).into());
    if let Some(work) = &opts.work_path {
        args.push("--work-path".into());
        args.push(work.into());
    }
    if let Some(pid_file) = &opts.pid_file {
        args.push("--pid-file".into());
        args.push(pid_file.into());
    }
    if let Some(sock) = &opts.console_socket {
        args.push("--console-socket".into());
        args.push(sock.into());
    }
    CriuFlags {
        open_tcp: opts.open_tcp,
        external_unix_sockets: opts.external_unix_sockets,
        terminal: opts.terminal,
        file_locks: opts.file_locks,
        empty_namespaces: &opts.empty_namespaces,
        cgroups_mode: opts.cgroups_mode,
    }
    .push(&mut args);
    args.push(container_id.into());
    Ok(RuncCommand {
        program: global.binary.clone(),
        args,
        path_env: global.path_env(std::env::var_os("PATH").as_deref()),
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

/// Runs a checkpoint command to completion with stdin closed and output captured.
///
/// On failure the error carries runc's stderr and the tail of `<criu_log_dir>/dump.log`
/// (see [`CheckpointOptions::criu_log_dir`]). `timeout` kills runc if CRIU hangs: a frozen
/// container must not stay frozen forever.
pub fn run_checkpoint(
    cmd: &RuncCommand,
    criu_log_dir: &Path,
    timeout: Option<Duration>,
) -> Result<RunOutput, RuncError> {
    run_captured(cmd, &criu_log_dir.join(DUMP_LOG), timeout)
}

/// Like [`run_checkpoint`] for any runc command, reading `criu_log` on failure.
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
            tracing::error!(%command, ?timeout, "runc timed out; killed");
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
            log: Some("/run/b/log.json".into()),
            systemd_cgroup: true,
            criu_dir: None,
        }
    }

    fn cp_args(g: &RuncGlobal, o: &CheckpointOptions) -> Vec<String> {
        checkpoint_command(g, "ctr1", Path::new("/cp"), o)
            .unwrap()
            .args_lossy()
    }

    #[test]
    fn global_flags_precede_subcommand() {
        let args = cp_args(&global(), &CheckpointOptions::default());
        assert_eq!(
            args,
            [
                "--root",
                "/run/containerd/runc/k8s.io",
                "--log",
                "/run/b/log.json",
                "--log-format",
                "json",
                "--systemd-cgroup",
                "checkpoint",
                "--leave-running",
                "--image-path",
                "/cp",
                "ctr1"
            ]
        );
        let bare = cp_args(&RuncGlobal::default(), &CheckpointOptions::default());
        assert_eq!(
            bare,
            [
                "checkpoint",
                "--leave-running",
                "--image-path",
                "/cp",
                "ctr1"
            ]
        );
    }

    /// Every combination of the boolean checkpoint options maps to exactly its flags.
    #[test]
    fn every_checkpoint_bool_combination() {
        let flags = [
            "--leave-running",
            "--tcp-established",
            "--ext-unix-sk",
            "--shell-job",
            "--file-locks",
        ];
        for bits in 0u32..32 {
            let on = |i: u32| bits & (1 << i) != 0;
            let o = CheckpointOptions {
                exit: !on(0),
                open_tcp: on(1),
                external_unix_sockets: on(2),
                terminal: on(3),
                file_locks: on(4),
                ..Default::default()
            };
            let args = cp_args(&RuncGlobal::default(), &o);
            for (i, flag) in flags.iter().enumerate() {
                assert_eq!(
                    args.iter().any(|a| a == flag),
                    on(i as u32),
                    "bits {bits:05b} flag {flag}: {args:?}"
                );
            }
            assert_eq!(args.first().unwrap(), "checkpoint");
            assert_eq!(args.last().unwrap(), "ctr1");
            assert_eq!(args.len(), 4 + bits.count_ones() as usize);
        }
    }

    #[test]
    fn checkpoint_valued_options() {
        for mode in CgroupsMode::NAMES {
            let o = CheckpointOptions {
                exit: true,
                work_path: Some("/work".into()),
                image_path: Some("/ignored".into()),
                cgroups_mode: Some(mode.parse().unwrap()),
                empty_namespaces: vec!["network".into(), "network".into()],
                ..Default::default()
            };
            assert_eq!(
                cp_args(&RuncGlobal::default(), &o),
                [
                    "checkpoint",
                    "--image-path",
                    "/cp",
                    "--work-path",
                    "/work",
                    "--manage-cgroups-mode",
                    mode,
                    "--empty-ns",
                    "network",
                    "--empty-ns",
                    "network",
                    "ctr1"
                ]
            );
        }
    }

    #[test]
    fn checkpoint_rejects_bad_input_before_building() {
        let g = RuncGlobal::default();
        let o = CheckpointOptions::default();
        assert!(checkpoint_command(&g, "--root", Path::new("/cp"), &o).is_err());
        assert!(checkpoint_command(&g, "c", Path::new("rel"), &o).is_err());
        let bad_ns = CheckpointOptions {
            empty_namespaces: vec!["ipc".into()],
            ..Default::default()
        };
        assert!(checkpoint_command(&g, "c", Path::new("/cp"), &bad_ns).is_err());
    }

    #[test]
    fn restore_defaults() {
        let r = RestoreOptions::new("/img", "/bundle");
        let cmd = restore_command(&RuncGlobal::default(), "ctr1", &r).unwrap();
        assert_eq!(
            cmd.args_lossy(),
            [
                "restore",
                "--detach",
                "--no-subreaper",
                "--bundle",
                "/bundle",
                "--image-path",
                "/img",
                "ctr1"
            ]
        );
    }

    #[test]
    fn restore_all_options() {
        let mut r = RestoreOptions::new("/img", "/bundle");
        r.work_path = Some("/work".into());
        r.pid_file = Some("/bundle/init.pid".into());
        r.console_socket = Some("/tmp/console.sock".into());
        r.no_pivot = true;
        r.open_tcp = true;
        r.external_unix_sockets = true;
        r.terminal = true;
        r.file_locks = true;
        r.empty_namespaces = vec!["network".into()];
        r.cgroups_mode = Some(CgroupsMode::Ignore);
        let cmd = restore_command(&global(), "ctr1", &r).unwrap();
        assert_eq!(
            cmd.args_lossy()[7..],
            [
                "restore",
                "--detach",
                "--no-subreaper",
                "--no-pivot",
                "--bundle",
                "/bundle",
                "--image-path",
                "/img",
                "--work-path",
                "/work",
                "--pid-file",
                "/bundle/init.pid",
                "--console-socket",
                "/tmp/console.sock",
                "--tcp-established",
                "--ext-unix-sk",
                "--shell-job",
                "--file-locks",
                "--manage-cgroups-mode",
                "ignore",
                "--empty-ns",
                "network",
                "ctr1"
            ]
        );
    }

    /// Every combination of restore booleans maps to exactly its flags.
    #[test]
    fn every_restore_bool_combination() {
        let flags = [
            "--detach",
            "--no-subreaper",
            "--no-pivot",
            "--tcp-established",
            "--ext-unix-sk",
            "--shell-job",
            "--file-locks",
        ];
        for bits in 0u32..128 {
            let on = |i: u32| bits & (1 << i) != 0;
            let mut r = RestoreOptions::new("/img", "/b");
            r.detach = on(0);
            r.no_subreaper = on(1);
            r.no_pivot = on(2);
            r.open_tcp = on(3);
            r.external_unix_sockets = on(4);
            r.terminal = on(5);
            r.file_locks = on(6);
            let args = restore_command(&RuncGlobal::default(), "c", &r)
                .unwrap()
                .args_lossy();
            for (i, flag) in flags.iter().enumerate() {
                assert_eq!(args.iter().any(|a| a == flag), on(i as u32), "{args:?}");
            }
            assert_eq!(args.len(), 6 + bits.count_ones() as usize);
        }
    }

    #[test]
    fn criu_dir_is_prepended_to_path() {
        let g = RuncGlobal {
            criu_dir: Some("/opt/gpusnap-rig/bin".into()),
            ..Default::default()
        };
        assert_eq!(
            g.path_env(Some(OsStr::new("/usr/sbin:/usr/bin"))).unwrap(),
            "/opt/gpusnap-rig/bin:/usr/sbin:/usr/bin"
        );
        assert_eq!(g.path_env(None).unwrap(), "/opt/gpusnap-rig/bin");
        assert_eq!(RuncGlobal::default().path_env(Some(OsStr::new("/x"))), None);
        let cmd =
            checkpoint_command(&g, "c", Path::new("/cp"), &CheckpointOptions::default()).unwrap();
        let path = cmd.path_env.clone().unwrap();
        assert!(path.to_string_lossy().starts_with("/opt/gpusnap-rig/bin"));
        let std_cmd = cmd.to_command();
        assert!(std_cmd
            .get_envs()
            .any(|(k, v)| k == "PATH" && v == Some(path.as_os_str())));
        assert!(g
            .effective_search_path()
            .to_string_lossy()
            .starts_with("/opt/gpusnap-rig/bin"));
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

    #[test]
    fn run_checkpoint_success_captures_output() {
        let dir = tempfile::tempdir().unwrap();
        let g = script(dir.path(), "echo \"$@\"");
        let cmd = checkpoint_command(&g, "c", dir.path(), &CheckpointOptions::default()).unwrap();
        let out = run_checkpoint(&cmd, dir.path(), Some(Duration::from_secs(30))).unwrap();
        assert!(
            out.stdout.starts_with("checkpoint --leave-running"),
            "{}",
            out.stdout
        );
    }

    #[test]
    fn run_checkpoint_failure_includes_stderr_and_dump_log() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(DUMP_LOG),
            "(0.1) start\n(0.2) Error (criu/files-reg.c:1): Can't dump file\n(0.3) end\n",
        )
        .unwrap();
        let g = script(
            dir.path(),
            "echo 'criu failed: type NOTIFY errno 0' >&2; exit 1",
        );
        let cmd = checkpoint_command(&g, "c", dir.path(), &CheckpointOptions::default()).unwrap();
        let err = run_checkpoint(&cmd, dir.path(), None).unwrap_err();
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
    fn run_checkpoint_failure_without_log() {
        let dir = tempfile::tempdir().unwrap();
        let g = script(dir.path(), "echo 'container does not exist' >&2; exit 1");
        let cmd = checkpoint_command(&g, "c", dir.path(), &CheckpointOptions::default()).unwrap();
        let err = run_checkpoint(&cmd, dir.path(), None).unwrap_err();
        assert!(matches!(err, RuncError::Failed { criu_log: None, .. }));
        assert!(err.to_string().contains("container does not exist"));
    }

    #[test]
    fn run_checkpoint_timeout_kills() {
        let dir = tempfile::tempdir().unwrap();
        let g = script(dir.path(), "exec sleep 30");
        let cmd = checkpoint_command(&g, "c", dir.path(), &CheckpointOptions::default()).unwrap();
        let started = Instant::now();
        let err = run_checkpoint(&cmd, dir.path(), Some(Duration::from_millis(200))).unwrap_err();
        assert!(matches!(err, RuncError::TimedOut { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn grandchild_holding_the_pipe_does_not_hang() {
        let dir = tempfile::tempdir().unwrap();
        let g = script(dir.path(), "sleep 5 & echo started; exit 0");
        let cmd = checkpoint_command(&g, "c", dir.path(), &CheckpointOptions::default()).unwrap();
        let started = Instant::now();
        let out = run_checkpoint(&cmd, dir.path(), None).unwrap();
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
        let cmd =
            checkpoint_command(&g, "c", Path::new("/cp"), &CheckpointOptions::default()).unwrap();
        let err = run_checkpoint(&cmd, Path::new("/cp"), None).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/runc"), "{err}");
    }
}
