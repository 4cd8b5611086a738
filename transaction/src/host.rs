//! What a transaction needs from the front end that owns the container: a way to run programs,
//! the container's runc run through it ([`Runc`]: the host's operations take it and it holds
//! the host, so the two live together), and the host operations its phases and their
//! rollbacks perform on the container (freeze, thaw, kill, its cgroup's pids, the mounts a
//! failed restore leaves).
//!
//! The containerd shim is a subreaper that collects every child itself, so it cannot wait for a
//! child with `std::process`; gpusnap-runc can. Everything else — which programs run, with which
//! arguments and environment, in which order — is the transaction's.
//!
//! Every host operation but [`Host::run_restore`] has its real implementation as the trait's
//! default, so the shim's and gpusnap-runc's hosts only say how they run programs; the unit
//! tests' recording host (`testing.rs`) replaces them all, which is how each phase's rollback
//! is tested without root, a container or runc.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::time::Duration;

use gpusnap_criu_bridge::{criu_log_tail, runc_cmd::ERROR_LOG_LINES, runc_log_error};
pub use gpusnap_criu_bridge::{Direct, RunTool};
use gpusnap_criu_bridge::{RuncCommand, RuncGlobal};

/// A front end's way of running runc and tools, and the host operations on the container.
pub trait Host: RunTool {
    /// Runs `runc restore` to completion. The restored container inherits runc's stdio, so the
    /// front end attaches the container's own stdio (the shim: pipes to containerd's fifos and
    /// the console socket; gpusnap-runc: its own stdio, which its caller gave it for the
    /// container). `started` gets runc's pid as soon as it runs: the restore's deadline kills
    /// it (and CRIU) when they take too long, and the front end's wait then returns.
    fn run_restore(&self, cmd: Command, started: &dyn Fn(u32)) -> io::Result<ExitStatus>;

    /// Freezes the container (`runc pause`).
    fn freeze(&self, runc: &Runc<'_>) -> Result<(), RuncFailure> {
        runc.helper(&["pause"]).map(|_| ())
    }

    /// Thaws the container (`runc resume`).
    fn thaw(&self, runc: &Runc<'_>) -> Result<(), RuncFailure> {
        runc.helper(&["resume"]).map(|_| ())
    }

    /// SIGKILL to every process of the container (`runc kill --all`).
    fn kill_all(&self, runc: &Runc<'_>) -> Result<(), RuncFailure> {
        // runc takes the signal after the id.
        let cmd = runc.global.helper(&["kill", "--all", &runc.id, "KILL"]);
        runc.run(&cmd, None).map(|_| ())
    }

    /// Every pid in the cgroup of `init_pid` and its sub-cgroups, from cgroupfs; `None` when
    /// the cgroup cannot be read (then runc is asked).
    fn cgroup_pids(&self, init_pid: u32) -> Option<Vec<u32>> {
        crate::cgroup::pids(init_pid)
    }

    /// Whether the cgroup of `pid` is frozen; `None` when it cannot be read.
    fn cgroup_frozen(&self, pid: u32) -> Option<bool> {
        crate::cgroup::frozen(pid)
    }

    /// Thaws the cgroup of `pid` through cgroupfs, for when runc does not know the container
    /// as paused (its state is its own; the cgroup is what runs or not).
    fn thaw_cgroup(&self, pid: u32) -> io::Result<()> {
        let dir = crate::cgroup::dir_of(pid)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup found"))?;
        crate::cgroup::thaw_at(&dir)
    }

    /// Whether the cgroup at `dir` is frozen; `None` when it cannot be read
    /// ([`crate::cgroup::frozen_at`]).
    fn cgroup_frozen_at(&self, dir: &Path) -> Option<bool> {
        crate::cgroup::frozen_at(dir)
    }

    /// Thaws the cgroup at `dir` through cgroupfs ([`crate::cgroup::thaw_at`]): the cgroup a
    /// dead container's runc state or spec names, when no live init leads to it.
    fn thaw_cgroup_at(&self, dir: &Path) -> io::Result<()> {
        crate::cgroup::thaw_at(dir)
    }

    /// Kills every process in the cgroup at `dir` and below and waits up to `wait` for it to
    /// empty ([`crate::cgroup::kill_all_at`]): how many it found, and the pids left.
    fn kill_cgroup(&self, dir: &Path, wait: Duration) -> (usize, Vec<u32>) {
        crate::cgroup::kill_all_at(dir, wait)
    }

    /// Removes the (empty) cgroup at `dir` ([`crate::cgroup::remove_at`]).
    fn remove_cgroup(&self, dir: &Path) {
        crate::cgroup::remove_at(dir)
    }

    /// Detaches and removes the yards CRIU left in the host's mount namespace for the restore
    /// whose work directory is `work_dir` ([`crate::criu_remains::clear_criu_yards`]).
    fn clear_criu_yards(&self, work_dir: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
        crate::criu_remains::clear_criu_yards(work_dir)
    }

    /// Detaches the `criu-root` bind mount runc makes in its directory `runc_dir` of a
    /// container it restores.
    fn detach_criu_root(&self, runc_dir: &Path) {
        crate::criu_remains::detach_criu_root(runc_dir)
    }

    /// SIGKILLs every CRIU still writing `image_dir` ([`crate::criu_remains::kill_criu_writing`]).
    fn kill_criu_writing(&self, image_dir: &Path) -> usize {
        crate::criu_remains::kill_criu_writing(image_dir)
    }
}

/// [`Host`] with `std::process` and inherited stdio (gpusnap-runc, tests).
impl Host for Direct {
    fn run_restore(&self, mut cmd: Command, started: &dyn Fn(u32)) -> io::Result<ExitStatus> {
        let mut child = cmd.spawn()?;
        started(child.id());
        child.wait()
    }
}

// ----- runc, run through the host: the dump, the restore and the helper calls -----

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

    /// After a failed or interrupted checkpoint, puts the cgroup back as frozen or thawed as
    /// the caller had it (`frozen`): a CRIU killed mid-dump may leave the cgroup it froze
    /// frozen, or thaw one the caller froze.
    pub fn settle_freezer(&self, init_pid: u32, frozen: bool) {
        let Some(now) = self.host.cgroup_frozen(init_pid) else {
            return;
        };
        if now == frozen {
            return;
        }
        let result = if frozen { self.pause() } else { self.resume() };
        if let Err(e) = result {
            // runc may not know the container as paused (its state is its own); the cgroup
            // is what runs or not.
            let thawed = !frozen && self.host.thaw_cgroup(init_pid).is_ok();
            if !thawed {
                tracing::error!(id = %self.id, frozen, error = %e, "cannot put the container's cgroup back as the caller had it");
                return;
            }
        }
        tracing::warn!(id = %self.id, frozen, "the container's cgroup was put back as the caller had it after the failed checkpoint");
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
