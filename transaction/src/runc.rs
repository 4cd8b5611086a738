//! runc, run through the front end's [`Host`]: the dump, the restore and the helper calls.

use std::path::Path;
use std::process::{ExitStatus, Output};

use gpusnap_criu_bridge::{criu_log_tail, runc_cmd::ERROR_LOG_LINES, runc_log_error};
use gpusnap_criu_bridge::{RuncCommand, RuncGlobal};

use crate::host::Host;

/// A failed runc run, in runc's and CRIU's own words.
#[derive(Debug, Clone)]
pub struct RuncFailure {
    pub message: String,
    pub exit: Option<i32>,
}

impl std::fmt::Display for RuncFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RuncFailure {}

/// One container's runc.
pub struct Runc<'a> {
    pub global: RuncGlobal,
    pub id: String,
    host: &'a dyn Host,
}

impl<'a> Runc<'a> {
    pub fn new(global: RuncGlobal, id: impl Into<String>, host: &'a dyn Host) -> Self {
        Runc {
            global,
            id: id.into(),
            host,
        }
    }

    pub fn host(&self) -> &'a dyn Host {
        self.host
    }

    /// Runs `cmd` to completion; a failure carries runc's last logged error (or its stderr)
    /// and the tail of `criu_log`.
    pub fn run(&self, cmd: &RuncCommand, criu_log: Option<&Path>) -> Result<Output, RuncFailure> {
        let what = cmd
            .args_lossy()
            .into_iter()
            .find(|a| !a.starts_with('-') && !is_global_value(cmd, a))
            .unwrap_or_default();
        let out = self
            .host
            .output(cmd.to_command())
            .map_err(|e| RuncFailure {
                message: format!("cannot run {}: {e}", cmd.program.display()),
                exit: None,
            })?;
        if out.status.success() {
            return Ok(out);
        }
        Err(self.failure(&what, out.status, &out.stderr, criu_log))
    }

    /// The failure of a runc run that exited with `status`.
    pub fn failure(
        &self,
        what: &str,
        status: ExitStatus,
        stderr: &[u8],
        criu_log: Option<&Path>,
    ) -> RuncFailure {
        let runc_said = self
            .global
            .log
            .as_deref()
            .and_then(runc_log_error)
            .unwrap_or_else(|| String::from_utf8_lossy(stderr).trim().to_string());
        let criu_said = criu_log
            .and_then(|log| criu_log_tail(log, ERROR_LOG_LINES).ok())
            .filter(|t| !t.is_empty())
            .map(|t| format!("\n{t}"))
            .unwrap_or_default();
        RuncFailure {
            message: format!("runc {what} failed ({status}): {runc_said}{criu_said}"),
            exit: status.code(),
        }
    }

    /// Runs `runc <args> <id>`.
    pub(crate) fn helper(&self, args: &[&str]) -> Result<Output, RuncFailure> {
        let mut full: Vec<&str> = args.to_vec();
        full.push(&self.id);
        self.run(&self.global.helper(&full), None)
    }

    /// Freezes the container ([`Host::freeze`]: `runc pause`).
    pub fn pause(&self) -> Result<(), RuncFailure> {
        self.host.freeze(self)
    }

    /// Thaws the container ([`Host::thaw`]: `runc resume`).
    pub fn resume(&self) -> Result<(), RuncFailure> {
        self.host.thaw(self)
    }

    /// SIGKILL to every process of the container ([`Host::kill_all`]: `runc kill --all`). A
    /// frozen container is thawed by the caller first: frozen processes die only once thawed.
    pub fn kill_all(&self) -> Result<(), RuncFailure> {
        self.host.kill_all(self)
    }

    /// `runc state`: the init's pid and runc's status word (`running`, `paused`, ...).
    pub fn state(&self) -> Option<(u32, String)> {
        let out = self.helper(&["state"]).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some((
            u32::try_from(v.get("pid")?.as_u64()?).ok()?,
            v.get("status")?.as_str()?.to_string(),
        ))
    }

    /// Every pid of the container: from its cgroup, else `runc ps`.
    pub fn pids(&self, init_pid: u32) -> Vec<u32> {
        if let Some(pids) = self.host.cgroup_pids(init_pid).filter(|p| !p.is_empty()) {
            return pids;
        }
        let mut pids: Vec<u32> = self
            .helper(&["ps", "--format", "json"])
            .ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or_default();
        if pids.is_empty() && init_pid > 0 {
            pids.push(init_pid);
        }
        pids
    }
}

/// Whether `arg` is the value of one of runc's global value flags in `cmd` (so it is not
/// mistaken for the subcommand).
fn is_global_value(cmd: &RuncCommand, arg: &str) -> bool {
    let args = cmd.args_lossy();
    args.windows(2).any(|w| {
        matches!(
            w[0].as_str(),
            "--root" | "--log" | "--log-format" | "--criu"
        ) && w[1] == arg
    })
}
