//! What a transaction needs from the front end that owns the container: a way to run programs.
//!
//! The containerd shim is a subreaper that collects every child itself, so it cannot wait for a
//! child with `std::process`; gpusnap-runc can. Everything else — which programs run, with which
//! arguments and environment, in which order — is the transaction's.

use std::io;
use std::process::{Command, ExitStatus};

pub use gpusnap_criu_bridge::{Direct, RunTool};

/// A front end's way of running runc and tools.
pub trait Host: RunTool {
    /// Runs `runc restore` to completion. The restored container inherits runc's stdio, so the
    /// front end attaches the container's own stdio (the shim: pipes to containerd's fifos and
    /// the console socket; gpusnap-runc: its own stdio, which its caller gave it for the
    /// container). `started` gets runc's pid as soon as it runs: the restore's deadline kills
    /// it (and CRIU) when they take too long, and the front end's wait then returns.
    fn run_restore(&self, cmd: Command, started: &dyn Fn(u32)) -> io::Result<ExitStatus>;
}

/// [`Host`] with `std::process` and inherited stdio (gpusnap-runc, tests).
impl Host for Direct {
    fn run_restore(&self, mut cmd: Command, started: &dyn Fn(u32)) -> io::Result<ExitStatus> {
        let mut child = cmd.spawn()?;
        started(child.id());
        child.wait()
    }
}
