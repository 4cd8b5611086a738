//! What a transaction needs from the front end that owns the container: a way to run programs,
//! and the host operations its phases and their rollbacks perform on the container (freeze,
//! thaw, kill, its cgroup's pids, the mounts a failed restore leaves).
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
use std::process::{Command, ExitStatus};
use std::time::Duration;

pub use gpusnap_criu_bridge::{Direct, RunTool};

use crate::runc::{Runc, RuncFailure};

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
    /// whose work directory is `work_dir` ([`crate::leftovers::clear_criu_yards`]).
    fn clear_criu_yards(&self, work_dir: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
        crate::leftovers::clear_criu_yards(work_dir)
    }

    /// Detaches the `criu-root` bind mount runc makes in its directory `runc_dir` of a
    /// container it restores.
    fn detach_criu_root(&self, runc_dir: &Path) {
        crate::leftovers::detach_criu_root(runc_dir)
    }

    /// SIGKILLs every CRIU still writing `image_dir` ([`crate::leftovers::kill_criu_writing`]).
    fn kill_criu_writing(&self, image_dir: &Path) -> usize {
        crate::leftovers::kill_criu_writing(image_dir)
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
