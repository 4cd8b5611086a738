//! What containerd asks of a container without changing it (State, Pids, Stats, Wait), and
//! Update of its resources.

use std::collections::HashMap;

use containerd_shim::{
    asynchronous::io::Stdio,
    protos::{protobuf::well_known_types::any::Any, types::task::Status},
};

use super::Container;
use crate::{errors::*, process::ExitInfo};

/// The state of the init or an exec, as State reports it.
pub struct ProcessView {
    /// The exec's id, or the container's for the init.
    pub id: String,
    pub exec_id: String,
    pub pid: u32,
    pub stdio: Stdio,
    pub status: Status,
    pub exit: Option<ExitInfo>,
}

/// One process of the container, and the exec it is when it is one.
pub struct PidInfo {
    pub pid: u32,
    pub exec_id: Option<String>,
}

impl Container {
    pub async fn process_state(&self, exec_id: &str) -> Result<ProcessView> {
        let live = self.live().await;
        let p = live
            .process(exec_id)
            .ok_or_else(|| self.exec_not_found(exec_id))?;
        Ok(ProcessView {
            id: if p.exec_id.is_empty() {
                self.id.clone()
            } else {
                p.exec_id.clone()
            },
            exec_id: p.exec_id.clone(),
            pid: p.pid as u32,
            stdio: p.stdio.clone(),
            status: if exec_id.is_empty() {
                live.state.status()
            } else {
                p.status()
            },
            exit: p.exit,
        })
    }

    /// The container's processes (`runc ps`).
    pub async fn pids(&self) -> Result<Vec<PidInfo>> {
        let execs: HashMap<i32, String> = self
            .live()
            .await
            .execs
            .values()
            .map(|p| (p.pid, p.exec_id.clone()))
            .collect();
        let pids = self
            .runc
            .ps(&self.id)
            .await
            .map_err(|e| self.runc_failure("runc ps", &e))?;
        Ok(pids
            .into_iter()
            .map(|pid| PidInfo {
                pid: pid as u32,
                exec_id: execs.get(&(pid as i32)).cloned(),
            })
            .collect())
    }

    /// The metrics of the running init's cgroup.
    pub async fn stats(&self) -> Result<Any> {
        let pid = {
            let live = self.live().await;
            if !live.state.is_alive() {
                return Err(self.not_running());
            }
            live.init.pid as u32
        };
        Ok(
            tokio::task::spawn_blocking(move || crate::stats::collect(pid))
                .await
                .map_err(|e| internal(e.to_string()))??,
        )
    }

    pub async fn update(&self, resources: &oci_spec::runtime::LinuxResources) -> Result<()> {
        self.runc
            .update(&self.id, resources)
            .await
            .map_err(|e| self.runc_failure("runc update", &e))
    }

    /// What waits for the init (`exec_id` empty) or an exec to exit: held by
    /// [`ExitWatch::exited`] without the container, so that the wait ends when the process is
    /// deleted.
    pub async fn exit_watch(&self, exec_id: &str) -> Result<ExitWatch> {
        Ok(ExitWatch {
            container_id: self.id.clone(),
            rx: self
                .live()
                .await
                .process(exec_id)
                .ok_or_else(|| not_found(format!("exec {exec_id} not found")))?
                .wait_handle(),
        })
    }
}

pub struct ExitWatch {
    container_id: String,
    rx: tokio::sync::watch::Receiver<Option<ExitInfo>>,
}

impl ExitWatch {
    /// The process's exit, once it exited; NotFound when it was deleted first.
    pub async fn exited(mut self) -> Result<ExitInfo> {
        loop {
            if let Some(info) = *self.rx.borrow_and_update() {
                return Ok(info);
            }
            if self.rx.changed().await.is_err() {
                return Err(not_found(format!(
                    "process of {} was deleted before it exited",
                    self.container_id
                )));
            }
        }
    }
}
