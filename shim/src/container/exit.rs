//! Exits of the container's processes, in the order containerd needs: an exec's exit at once,
//! the init's only after every exec's (and after an OOM kill that ended it), and, in a shared
//! PID namespace, only after the processes it left behind were killed.

use super::{Container, Live};
use crate::process::{ExitInfo, Process};

/// One exit to report.
pub struct Exit {
    pub container_id: String,
    /// The exec's id, or the container's for the init.
    pub id: String,
    pub pid: u32,
    pub info: ExitInfo,
}

/// What an exit of a pid means for a container.
pub enum ExitOutcome {
    /// Not one of its processes.
    NotOurs,
    /// The exits to report now, in order (none when the init's is held back).
    Report(Vec<Exit>),
    /// Its init exited in a shared PID namespace: [`Container::kill_all_after_exit`] runs next,
    /// outside the exit loop.
    KillAllFirst,
}

impl Container {
    fn exit_of(&self, p: &Process, info: ExitInfo) -> Exit {
        Exit {
            container_id: self.id.clone(),
            id: if p.exec_id.is_empty() {
                self.id.clone()
            } else {
                p.exec_id.clone()
            },
            pid: p.pid as u32,
            info,
        }
    }

    /// Process `pid` exited with `code`.
    pub async fn exited(&self, pid: i32, code: i32) -> ExitOutcome {
        let mut live = self.live().await;
        if live.init.pid == pid && live.state.is_alive() {
            if live.kill_all_on_exit {
                // The container has no PID namespace of its own (shared with the pod, the
                // host, or another container), so its other processes outlive the init and
                // would keep its stdio open. Like containerd-shim-runc-v2: kill them all,
                // then report the exit.
                live.kill_all_on_exit = false;
                return ExitOutcome::KillAllFirst;
            }
            return ExitOutcome::Report(self.init_exited(&mut live, code));
        }
        let Some(e) = live
            .execs
            .values_mut()
            .find(|p| p.pid == pid && p.is_alive())
        else {
            return ExitOutcome::NotOurs;
        };
        let info = e.set_exited(code);
        let mut exits = vec![self.exit_of(e, info)];
        if live.running_execs() == 0 {
            if let Some(code) = live.deferred_init_exit.take() {
                exits.push(self.report_init_exit(&mut live, code));
            }
        }
        ExitOutcome::Report(exits)
    }

    /// After [`ExitOutcome::KillAllFirst`]: kills what the init left running. The caller
    /// then reports [`Container::init_exit`] under its lifecycle lock.
    pub async fn kill_all_after_exit(&self) {
        self.kill_all().await;
    }

    /// The init exited with `code` (after [`Container::kill_all_after_exit`]).
    pub async fn init_exit(&self, code: i32) -> Vec<Exit> {
        let mut live = self.live().await;
        self.init_exited(&mut live, code)
    }

    /// The init exited: report it once every exec has (execs die with the init in its pid
    /// namespace; they are killed here in case the namespace is shared).
    fn init_exited(&self, live: &mut Live, code: i32) -> Vec<Exit> {
        if !live.state.is_alive() {
            return Vec::new();
        }
        if live.running_execs() > 0 {
            live.deferred_init_exit = Some(code);
            for e in live.execs.values().filter(|p| p.is_alive()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(e.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Vec::new();
        }
        vec![self.report_init_exit(live, code)]
    }

    fn report_init_exit(&self, live: &mut Live, code: i32) -> Exit {
        // An OOM kill can be what ended the init: report it before the exit, as containerd
        // expects (it marks the container OOMKilled only when TaskOOM came first).
        if let Some(oom) = live.oom.take() {
            oom.final_check();
        }
        live.state.exited();
        let info = live.init.set_exited(code);
        self.exit_of(&live.init, info)
    }
}
