//! One containerd process: started with a config file, ready once `ctr version` answers on its
//! socket, stopped by its pid. [`crate::Rig`] runs its containerd through this; tests that
//! need a containerd with a config of their own (e.g. one `gpusnap install` wrote) use
//! [`start_with_config`].

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::cmd::run_with_timeout;
use crate::paths;

/// How long containerd may take to answer after it was started.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of one `ctr` call made through [`Containerd::ctr`].
pub const CTR_TIMEOUT: Duration = Duration::from_secs(60);

/// What to start containerd with.
#[derive(Clone, Debug)]
pub struct ContainerdSpec {
    /// `containerd --config <config>`.
    pub config: PathBuf,
    /// Its gRPC socket (`[grpc] address` of the config), polled for readiness.
    pub address: PathBuf,
    /// Where its stdout and stderr go (appended: a restarted containerd keeps the old lines).
    pub log: PathBuf,
    /// `PATH` for containerd, inherited by the shims it starts, runc and CRIU.
    pub path_env: OsString,
    /// More environment for containerd.
    pub env: Vec<(String, String)>,
}

impl ContainerdSpec {
    /// A spec with the default `PATH`: the rig prefix's bin dir in front of the system `PATH`.
    pub fn new(config: &Path, address: &Path, log: &Path) -> ContainerdSpec {
        ContainerdSpec {
            config: config.to_path_buf(),
            address: address.to_path_buf(),
            log: log.to_path_buf(),
            path_env: default_path_env(),
            env: Vec::new(),
        }
    }
}

/// `<rig prefix>/bin:<system PATH>`.
pub fn default_path_env() -> OsString {
    let mut p = OsString::from(paths::rig_bin_dir());
    p.push(":");
    p.push(system_path());
    p
}

/// The test process's `PATH`, or the usual system directories when it has none.
pub fn system_path() -> OsString {
    std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into())
}

/// A running containerd, stopped (SIGTERM, then SIGKILL after 10 s) when dropped.
pub struct Containerd {
    child: Option<Child>,
    spec: ContainerdSpec,
}

/// Starts containerd with `config` (whose `[grpc] address` is `address`), logging to `log`,
/// with the default `PATH`; returns once it answers.
pub fn start_with_config(config: &Path, address: &Path, log: &Path) -> Result<Containerd> {
    Containerd::start(ContainerdSpec::new(config, address, log))
}

impl Containerd {
    /// Starts containerd in a process group of its own (signals aimed at the test's process
    /// group do not reach it) and waits until `ctr version` answers on its socket.
    pub fn start(spec: ContainerdSpec) -> Result<Containerd> {
        let containerd = paths::rig_bin_dir().join("containerd");
        ensure!(
            paths::is_executable(&containerd),
            "{} missing: run scripts/setup-env.sh first",
            containerd.display()
        );
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .with_context(|| format!("opening {}", spec.log.display()))?;
        let child = Command::new(&containerd)
            .arg("--config")
            .arg(&spec.config)
            .env("PATH", &spec.path_env)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("spawning containerd")?;
        let mut c = Containerd {
            child: Some(child),
            spec,
        };
        c.wait_ready()?;
        Ok(c)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(st) = child.try_wait()? {
                    self.child = None;
                    bail!(
                        "containerd exited during start-up ({st}); log tail:\n{}",
                        self.log_tail(30)
                    );
                }
            }
            if self.spec.address.exists() {
                if let Ok(o) = run_with_timeout(
                    self.ctr_command(None, &["version"]),
                    None,
                    Duration::from_secs(5),
                ) {
                    if o.status.success() {
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "containerd not ready after {READY_TIMEOUT:?}; log tail:\n{}",
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// containerd's pid (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Its gRPC socket.
    pub fn address(&self) -> &Path {
        &self.spec.address
    }

    /// Its config file.
    pub fn config(&self) -> &Path {
        &self.spec.config
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.spec.log
    }

    /// The whole log.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.spec.log).unwrap_or_default()
    }

    /// Last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let s = self.log_text();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// `ctr --address <socket> [--namespace <ns>] <args...>` with containerd's `PATH` (not
    /// started).
    pub fn ctr_command<S: AsRef<OsStr>>(&self, namespace: Option<&str>, args: &[S]) -> Command {
        let mut cmd = Command::new(paths::rig_bin_dir().join("ctr"));
        cmd.arg("--address").arg(&self.spec.address);
        if let Some(ns) = namespace {
            cmd.arg("--namespace").arg(ns);
        }
        cmd.args(args).env("PATH", &self.spec.path_env);
        cmd
    }

    /// Runs ctr (default namespace) with stdin from /dev/null; any exit status is returned.
    pub fn ctr<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<Output> {
        run_with_timeout(self.ctr_command(None, args), None, CTR_TIMEOUT)
    }

    /// Sends `sig` and waits up to `timeout` for containerd to exit, then SIGKILLs it. Shims
    /// it started keep running. The socket is removed (a killed containerd leaves it).
    pub fn stop(&mut self, sig: i32, timeout: Duration) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe {
            libc::kill(child.id() as libc::pid_t, sig);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = fs::remove_file(&self.spec.address);
        Ok(())
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.stop(libc::SIGTERM, Duration::from_secs(10));
    }
}
