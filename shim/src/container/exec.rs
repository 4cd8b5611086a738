//! Execs: added (Exec), started (`runc exec`), their terminal and stdin, and deleted.

use containerd_shim::asynchronous::io::Stdio;

use super::{
    stdio_setup::{read_pid, StdioSetup},
    Container,
};
use crate::{
    errors::*,
    process::{ExitInfo, Process, ProcessState},
};

/// What Delete of an exec reports.
pub struct DeletedExec {
    pub pid: u32,
    pub exit: Option<ExitInfo>,
}

impl Container {
    /// Records an exec to be started; the init must be alive.
    pub async fn add_exec(
        &self,
        exec_id: &str,
        stdio: Stdio,
        spec: oci_spec::runtime::Process,
    ) -> Result<()> {
        let mut live = self.live().await;
        if !live.state.is_alive() {
            return Err(self.not_running());
        }
        if exec_id.is_empty() {
            return Err(invalid_argument("exec needs an exec id"));
        }
        if live.execs.contains_key(exec_id) {
            return Err(already_exists(format!(
                "exec {exec_id} already exists in container {}",
                self.id
            )));
        }
        let mut p = Process::new(exec_id, stdio);
        p.spec = Some(spec);
        live.execs.insert(exec_id.to_string(), p);
        Ok(())
    }

    /// Runs an exec added before; its pid.
    pub async fn start_exec(&self, exec_id: &str) -> Result<u32> {
        let (spec, stdio) = {
            let live = self.live().await;
            if !live.state.is_alive() {
                return Err(self.not_running());
            }
            let p = live
                .execs
                .get(exec_id)
                .ok_or_else(|| self.exec_not_found(exec_id))?;
            if p.state != ProcessState::Created {
                return Err(failed_precondition(format!(
                    "exec {exec_id} was already started"
                )));
            }
            let spec = p
                .spec
                .clone()
                .ok_or_else(|| internal(format!("exec {exec_id} has no process spec")))?;
            (spec, p.stdio.clone())
        };
        let mut proc_io = Process::new(exec_id, stdio);
        let setup = StdioSetup::new(&mut proc_io)?;
        let pid_file = self.bundle.join(format!("exec-{exec_id}.pid"));
        let opts = runc::options::ExecOpts {
            io: Some(setup.pipes.clone()),
            pid_file: Some(pid_file.clone()),
            console_socket: setup.console_path(),
            detach: true,
        };
        if let Err(e) = self.runc.exec(&self.id, &spec, Some(&opts)).await {
            setup.abandon(&proc_io).await;
            return Err(self.runc_failure(&format!("runc exec {exec_id}"), &e));
        }
        let pid = read_pid(&pid_file)?;
        let _ = std::fs::remove_file(&pid_file);
        proc_io.pid = pid;
        setup.finish(&mut proc_io).await?;
        let mut live = self.live().await;
        let p = live
            .execs
            .get_mut(exec_id)
            .ok_or_else(|| not_found(format!("exec {exec_id} was deleted while starting")))?;
        p.pid = pid;
        p.io = proc_io.io;
        p.pty = proc_io.pty;
        p.stdin = proc_io.stdin;
        p.state = ProcessState::Running;
        Ok(pid as u32)
    }

    /// Removes an exec that is not running, once its stdio is drained.
    pub async fn delete_exec(&self, exec_id: &str) -> Result<DeletedExec> {
        let p = {
            let mut live = self.live().await;
            match live.execs.get(exec_id) {
                None => return Err(self.exec_not_found(exec_id)),
                Some(p) if p.is_alive() => {
                    return Err(failed_precondition(format!(
                        "exec {exec_id} is still running; kill it before deleting it"
                    )))
                }
                Some(_) => live.execs.remove(exec_id).expect("checked above"),
            }
        };
        p.shutdown_io().await;
        Ok(DeletedExec {
            pid: p.pid as u32,
            exit: p.exit,
        })
    }

    /// Resizes the terminal of the init (`exec_id` empty) or an exec.
    pub async fn resize_pty(&self, exec_id: &str, width: u32, height: u32) -> Result<()> {
        let live = self.live().await;
        let p = live
            .process(exec_id)
            .ok_or_else(|| not_found(format!("exec {exec_id} not found")))?;
        let pty = p
            .pty
            .as_ref()
            .ok_or_else(|| failed_precondition("the process has no terminal to resize"))?;
        crate::console::resize(pty, width, height)
            .map_err(|e| internal(format!("resize terminal: {e}")))
    }

    /// CloseIO of the init (`exec_id` empty) or an exec: closes its stdin when `stdin`.
    pub async fn close_io(&self, exec_id: &str, stdin: bool) -> Result<()> {
        let live = self.live().await;
        let p = live
            .process(exec_id)
            .ok_or_else(|| not_found(format!("exec {exec_id} not found")))?;
        if let Some(copy) = p.stdin.as_ref().filter(|_| stdin) {
            copy.close();
        }
        Ok(())
    }
}
