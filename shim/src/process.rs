//! One process of a container: the init process or an exec, with its stdio and exit.

use containerd_shim::{
    asynchronous::io::{IoTasks, Pty, Stdio},
    protos::types::task::Status,
};
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::stdio::StdinCopy;

#[derive(Clone, Copy, Debug)]
pub struct ExitInfo {
    pub status: u32,
    pub at: OffsetDateTime,
}

/// An exec's lifecycle (the init's is [`crate::state::InitState`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessState {
    Created,
    Running,
    Stopped,
}

pub struct Process {
    pub exec_id: String,
    pub pid: i32,
    pub state: ProcessState,
    pub stdio: Stdio,
    pub io: IoTasks,
    pub pty: Option<Pty>,
    pub stdin: Option<StdinCopy>,
    pub exit: Option<ExitInfo>,
    exit_tx: watch::Sender<Option<ExitInfo>>,
    /// The runtime-spec process of an exec, kept until Start runs it.
    pub spec: Option<oci_spec::runtime::Process>,
}

impl Process {
    pub fn new(exec_id: &str, stdio: Stdio) -> Self {
        let (exit_tx, _) = watch::channel(None);
        Self {
            exec_id: exec_id.to_string(),
            pid: 0,
            state: ProcessState::Created,
            stdio,
            io: IoTasks::default(),
            pty: None,
            stdin: None,
            exit: None,
            exit_tx,
            spec: None,
        }
    }

    pub fn set_exited(&mut self, status: i32) -> ExitInfo {
        let info = ExitInfo {
            status: status as u32,
            at: OffsetDateTime::now_utc(),
        };
        self.state = ProcessState::Stopped;
        self.exit = Some(info);
        self.exit_tx.send_replace(Some(info));
        info
    }

    pub fn wait_handle(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit_tx.subscribe()
    }

    pub fn is_alive(&self) -> bool {
        self.state == ProcessState::Running
    }

    pub fn status(&self) -> Status {
        match self.state {
            ProcessState::Created => Status::CREATED,
            ProcessState::Running => Status::RUNNING,
            ProcessState::Stopped => Status::STOPPED,
        }
    }
}

impl Process {
    /// Stops copying stdio: lets the output copies drain, then releases containerd's fifos.
    pub async fn shutdown_io(&self) {
        if let Some(stdin) = &self.stdin {
            stdin.shutdown();
        }
        self.io.shutdown().await;
    }
}
