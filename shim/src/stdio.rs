//! The stdio a runc-started process gets: pipes the shim copies to containerd's fifos, or
//! /dev/null for the streams containerd did not ask for.
//!
//! runc's own stdio becomes the container process's stdio, so every stream is set
//! explicitly: a stream left piped to the shim would be inherited by the container and keep
//! the runc invocation's output open for the container's whole life.

use std::{
    io::{PipeReader, PipeWriter, Read, Write},
    os::unix::fs::OpenOptionsExt,
    process::Stdio as StdStdio,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
};

use async_trait::async_trait;
use containerd_shim::asynchronous::io::{IoTasks, Stdio};
use tokio::{net::unix::pipe, process::Command};

#[derive(Debug)]
struct Ends<I, O> {
    stdin: Option<I>,
    stdout: Option<O>,
    stderr: Option<O>,
}

// Derived Default would demand `I: Default`; empty ends need no such thing.
impl<I, O> Default for Ends<I, O> {
    fn default() -> Self {
        Self {
            stdin: None,
            stdout: None,
            stderr: None,
        }
    }
}

#[derive(Debug, Default)]
pub struct ProcessPipes {
    /// The ends runc hands to the container process.
    child: Mutex<Ends<PipeReader, PipeWriter>>,
    /// The ends the shim copies to and from containerd's fifos.
    parent: Mutex<Ends<PipeWriter, PipeReader>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ProcessPipes {
    /// Pipes for the streams `stdio` names; none for a terminal process (it talks through
    /// the console) or for empty paths.
    pub fn new(stdio: &Stdio) -> std::io::Result<Self> {
        let pipes = Self::default();
        if stdio.terminal {
            return Ok(pipes);
        }
        let (mut child, mut parent) = (lock(&pipes.child), lock(&pipes.parent));
        if !stdio.stdin.is_empty() {
            let (r, w) = std::io::pipe()?;
            child.stdin = Some(r);
            parent.stdin = Some(w);
        }
        if !stdio.stdout.is_empty() {
            let (r, w) = std::io::pipe()?;
            child.stdout = Some(w);
            parent.stdout = Some(r);
        }
        if !stdio.stderr.is_empty() {
            let (r, w) = std::io::pipe()?;
            child.stderr = Some(w);
            parent.stderr = Some(r);
        }
        drop((child, parent));
        Ok(pipes)
    }

    /// Starts copying between the shim's pipe ends and containerd's fifos.
    pub fn start_copy(
        &self,
        stdio: &Stdio,
        io: &IoTasks,
    ) -> containerd_shim::Result<Option<StdinCopy>> {
        let mut parent = lock(&self.parent);
        let other = |e: std::io::Error| containerd_shim::Error::Other(format!("stdio pipe: {e}"));
        let stdin = parent
            .stdin
            .take()
            .map(|w| StdinCopy::start(&stdio.stdin, Box::new(w)));
        if let Some(r) = parent.stdout.take() {
            io.copy_to_fifo(
                pipe::Receiver::from_owned_fd(r.into()).map_err(other)?,
                &stdio.stdout,
            )?;
        }
        if let Some(r) = parent.stderr.take() {
            io.copy_to_fifo(
                pipe::Receiver::from_owned_fd(r.into()).map_err(other)?,
                &stdio.stderr,
            )?;
        }
        Ok(stdin)
    }

    /// Gives the child ends (or /dev/null) to a runc command.
    pub fn apply(&self, cmd: &mut Command) -> std::io::Result<()> {
        let child = lock(&self.child);
        match &child.stdin {
            Some(r) => cmd.stdin(r.try_clone()?),
            None => cmd.stdin(StdStdio::null()),
        };
        match &child.stdout {
            Some(w) => cmd.stdout(w.try_clone()?),
            None => cmd.stdout(StdStdio::null()),
        };
        match &child.stderr {
            Some(w) => cmd.stderr(w.try_clone()?),
            None => cmd.stderr(StdStdio::null()),
        };
        Ok(())
    }

    /// Drops the shim's copies of the child ends once runc has handed them to the container,
    /// so the output pipes reach EOF when the container's processes exit.
    pub fn close_child_ends(&self) {
        *lock(&self.child) = Ends::default();
    }
}

#[async_trait]
impl runc::io::Io for ProcessPipes {
    async fn set(&self, cmd: &mut Command) -> std::io::Result<()> {
        self.apply(cmd)
    }

    async fn close_after_start(&self) {
        self.close_child_ends();
    }
}

/// Copies containerd's stdin fifo into a process, with the semantics containerd clients rely
/// on: the process sees EOF once every writer of the fifo has gone (`echo x | ctr run ...`),
/// or when CloseIO asks for it, whichever comes first.
///
/// The fifo is opened in blocking mode on its own thread: a non-blocking reader opened
/// before containerd's writer would read EOF at once, and holding a writer ourselves (to
/// avoid that) would hide the client's EOF.
pub struct StdinCopy {
    sink: Arc<Mutex<Option<Box<dyn Write + Send>>>>,
    path: String,
    done: Arc<AtomicBool>,
}

impl StdinCopy {
    pub fn start(path: &str, sink: Box<dyn Write + Send>) -> Self {
        let sink = Arc::new(Mutex::new(Some(sink)));
        let done = Arc::new(AtomicBool::new(false));
        let (thread_sink, thread_done, thread_path) =
            (sink.clone(), done.clone(), path.to_string());
        let spawned = std::thread::Builder::new()
            .name("stdin-copy".into())
            .spawn(move || {
                if let Ok(mut fifo) = std::fs::File::open(&thread_path) {
                    let mut buf = vec![0u8; 32 * 1024];
                    loop {
                        let n = match fifo.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let mut guard = lock(&thread_sink);
                        let written = match guard.as_mut() {
                            Some(w) => write_all_retrying(w.as_mut(), &buf[..n]).is_ok(),
                            None => false,
                        };
                        if !written {
                            break;
                        }
                    }
                }
                lock(&thread_sink).take();
                thread_done.store(true, Ordering::Release);
            });
        if spawned.is_err() {
            tracing::warn!(path, "could not start the stdin copy thread");
        }
        Self {
            sink,
            path: path.to_string(),
            done,
        }
    }

    /// Closes the process's stdin now (CloseIO).
    pub fn close(&self) {
        lock(&self.sink).take();
    }

    /// Closes stdin and releases a copy thread still waiting for a writer to open the fifo.
    pub fn shutdown(&self) {
        self.close();
        if !self.done.load(Ordering::Acquire) {
            // Opening a writer completes the thread's pending open; closing it gives EOF.
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&self.path);
        }
    }
}

/// Writes everything, waiting out EAGAIN: a terminal master is non-blocking.
fn write_all_retrying(w: &mut dyn Write, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match w.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    w.flush()
}
