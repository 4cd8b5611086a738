//! Kill: a signal to the init through `runc kill` (`--all` on request), or to an exec's pid.

use super::Container;
use crate::{errors::*, process::ProcessState, state::InitState};

impl Container {
    pub async fn kill(&self, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let target = {
            let live = self.live().await;
            let p = live
                .process(exec_id)
                .ok_or_else(|| self.exec_not_found(exec_id))?;
            let stopped = if exec_id.is_empty() {
                matches!(live.state, InitState::Stopped)
            } else {
                p.state == ProcessState::Stopped
            };
            if stopped {
                return Err(not_found(format!("process {} already finished", p.pid)));
            }
            if !live.state.has_runc_container() {
                return Err(failed_precondition(format!(
                    "container {} is waiting to be restored; start or delete it",
                    self.id
                )));
            }
            (!exec_id.is_empty()).then_some(p.pid)
        };
        match target {
            Some(pid) => signal_exec(pid, signal),
            None => {
                let opts = runc::options::KillOpts { all };
                if let Err(e) = self.runc.kill(&self.id, signal, Some(&opts)).await {
                    let text =
                        super::runc_log_error(&self.bundle).unwrap_or_else(|| runc_error_text(&e));
                    if kill_found_it_finished(&text) {
                        return Err(not_found(format!("process already finished: {text}")));
                    }
                    return Err(internal(format!("runc kill: {text}")));
                }
                Ok(())
            }
        }
    }

    /// SIGKILL to every process of the container (`runc kill --all`), after its init exited
    /// and left the others of a shared PID namespace running.
    pub(super) async fn kill_all(&self) {
        let opts = runc::options::KillOpts { all: true };
        if let Err(e) = self
            .runc
            .kill(&self.id, libc::SIGKILL as u32, Some(&opts))
            .await
        {
            tracing::debug!(id = self.id, error = %runc_error_text(&e), "kill --all after the init exited");
        }
    }
}

fn signal_exec(pid: i32, signal: u32) -> Result<()> {
    let sig = nix::sys::signal::Signal::try_from(signal as i32)
        .map_err(|_| invalid_argument(format!("{signal} is not a valid signal")))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).map_err(|e| {
        if e == nix::errno::Errno::ESRCH {
            not_found(format!("process {pid} already finished"))
        } else {
            internal(format!("signal {sig} to exec pid {pid}: {e}"))
        }
    })
}

/// Whether `runc kill` failed because the container had already finished, which containerd
/// expects as NotFound (its StopContainer then goes on), as containerd-shim-runc-v2 maps it:
/// - "container not running", "no such process": runc saw it stopped;
/// - "os: process already finished": the init exited between runc's state check and its signal
///   (seen in critest's attach test, whose container exits as it is stopped);
/// - "does not exist": runc's state is already gone;
/// - runc 1.1's `kill --all` freezes the cgroup first, which fails with "invalid state
///   transition from stopped to paused" when the container stopped during the call.
fn kill_found_it_finished(runc_error: &str) -> bool {
    let text = runc_error.to_lowercase();
    [
        "not running",
        "no such process",
        "process already finished",
        "does not exist",
        "transition from stopped",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_of_a_finished_container_is_not_found() {
        for finished in [
            "container not running",
            "unable to signal init: os: process already finished",
            "No such process",
            "container \"x\" does not exist",
            "invalid state transition from stopped to paused",
        ] {
            assert!(kill_found_it_finished(finished), "{finished}");
        }
        assert!(!kill_found_it_finished("permission denied"));
    }
}
