//! Stdio wiring for a process runc is about to start (init, exec or restored init), and the
//! pid file runc writes for it.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use containerd_shim::asynchronous::io::{Pty, Stdio};

use crate::{console::ConsoleSocket, process::Process, stdio::ProcessPipes};

#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("set up stdio: {0}")]
    Setup(#[source] std::io::Error),
    #[error("open stdio fifos: {0}")]
    Fifos(#[source] containerd_shim::Error),
    #[error("receive terminal from runc: {0}")]
    ReceiveTerminal(#[source] std::io::Error),
    #[error("terminal: {0}")]
    Terminal(#[source] containerd_shim::Error),
    #[error("terminal stdin: {0}")]
    TerminalStdin(#[source] std::io::Error),
    #[error("terminal stdout: {0}")]
    TerminalStdout(#[source] containerd_shim::Error),
}

impl From<StdioError> for crate::errors::Error {
    fn from(e: StdioError) -> Self {
        crate::errors::internal(e.to_string())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PidFileError {
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pid file {} holds {text:?}: {source}", path.display())]
    Parse {
        path: PathBuf,
        text: String,
        source: std::num::ParseIntError,
    },
}

impl From<PidFileError> for crate::errors::Error {
    fn from(e: PidFileError) -> Self {
        crate::errors::internal(e.to_string())
    }
}

/// Either a console socket (tty) or pipes. `finish` is called after runc returns to hook the
/// streams to containerd's fifos.
pub struct StdioSetup {
    pub pipes: Arc<ProcessPipes>,
    pub console: Option<ConsoleSocket>,
}

impl StdioSetup {
    /// Makes the pipes (or console socket) for `process` and starts copying its stdin.
    pub fn new(process: &mut Process) -> Result<Self, StdioError> {
        let stdio: &Stdio = &process.stdio;
        let console = if stdio.terminal {
            Some(ConsoleSocket::new().map_err(StdioError::Setup)?)
        } else {
            None
        };
        let pipes = Arc::new(ProcessPipes::new(stdio).map_err(StdioError::Setup)?);
        process.stdin = pipes
            .start_copy(&process.stdio, &process.io)
            .map_err(StdioError::Fifos)?;
        Ok(Self { pipes, console })
    }

    /// After runc failed, or a restore was refused before it ran: the shim's ends of the
    /// pipes are closed, then the process's copies shut down. The output copies end only when
    /// every writer is closed; with the shim's still open, the shutdown would wait out the
    /// copies' drain timeout (10 s) before the caller heard of the failure.
    pub async fn abandon(self, process: &Process) {
        self.pipes.close_child_ends();
        drop(self);
        process.shutdown_io().await;
    }

    pub fn console_path(&self) -> Option<PathBuf> {
        self.console.as_ref().map(|c| c.path().to_path_buf())
    }

    /// Connects the process's streams (pipes or terminal) to containerd's fifos.
    pub async fn finish(self, process: &mut Process) -> Result<(), StdioError> {
        if let Some(console) = self.console {
            let master = console
                .receive_master()
                .await
                .map_err(StdioError::ReceiveTerminal)?;
            let pty = Pty::new(master).map_err(StdioError::Terminal)?;
            if !process.stdio.stdin.is_empty() {
                // The copy writes from its own thread, so it gets its own descriptor.
                let master = std::os::fd::AsFd::as_fd(&pty)
                    .try_clone_to_owned()
                    .map_err(StdioError::TerminalStdin)?;
                process.stdin = Some(crate::stdio::StdinCopy::start(
                    &process.stdio.stdin,
                    Box::new(std::fs::File::from(master)),
                ));
            }
            if !process.stdio.stdout.is_empty() {
                process
                    .io
                    .copy_to_fifo(pty.clone(), &process.stdio.stdout)
                    .map_err(StdioError::TerminalStdout)?;
            }
            process.pty = Some(pty);
        }
        Ok(())
    }
}

/// Reads the pid runc wrote.
pub fn read_pid(path: &Path) -> Result<i32, PidFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| PidFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.trim().parse().map_err(|source| PidFileError::Parse {
        path: path.to_path_buf(),
        text: text.clone(),
        source,
    })
}
