//! A container the shim runs: its bundle, runc client, init process and execs.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use containerd_shim::{
    asynchronous::io::{Pty, Stdio},
    protos::api::Mount,
};

use crate::{
    console::ConsoleSocket, oom::OomWatch, options::RuntimeSettings, process::Process,
    stdio::ProcessPipes,
};

/// What Create recorded for a task that Start must restore from a checkpoint.
#[derive(Debug, Clone)]
pub struct PendingRestore {
    pub image: PathBuf,
    /// containerd's parent checkpoint (pre-dump chains); runc restores from `image`, which
    /// references its parent itself, so this is only logged.
    pub parent: Option<PathBuf>,
    /// Writable-layer changes to apply to the rootfs before CRIU runs (a pod restoring from a
    /// CRI checkpoint archive; containerd applies it itself on its own restore paths).
    pub rootfs_diff: Option<PathBuf>,
}

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub settings: RuntimeSettings,
    pub config: gpusnap_config::Config,
    pub runc: Arc<runc::Runc>,
    pub init: Process,
    pub execs: HashMap<String, Process>,
    pub rootfs_mounted: bool,
    pub restore: Option<PendingRestore>,
    /// Exit status of init, held back while execs still run so that their exits reach
    /// containerd first.
    pub deferred_init_exit: Option<i32>,
    pub oom: Option<OomWatch>,
    /// CUDA processes a checkpoint of a paused task left checkpointed (device memory in host
    /// memory), to be restored and unlocked when the task is resumed.
    pub pending_cuda_resume: Option<PendingCudaResume>,
}

/// See [`Container::pending_cuda_resume`]: the driver can only restore device memory while
/// the processes run, and the caller (ctr, CRI) must find the task frozen exactly as CRIU
/// dumped it so that the rootfs diff it takes next matches the images.
pub struct PendingCudaResume {
    pub orchestrator: gpusnap_cuda::Orchestrator,
    pub records: Vec<gpusnap_cuda::orchestrate::ProcessRecord>,
}

impl Container {
    pub fn process(&self, exec_id: &str) -> Option<&Process> {
        if exec_id.is_empty() {
            Some(&self.init)
        } else {
            self.execs.get(exec_id)
        }
    }

    pub fn running_execs(&self) -> usize {
        self.execs.values().filter(|p| p.is_alive()).count()
    }
}

/// Mounts the rootfs containerd handed over (usually one overlay mount) at `<bundle>/rootfs`.
pub fn mount_rootfs(bundle: &Path, mounts: &[Mount]) -> Result<bool, String> {
    if mounts.is_empty() {
        return Ok(false);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target).map_err(|e| format!("create {}: {e}", target.display()))?;
    for m in mounts {
        containerd_shim::mount::mount_rootfs(Some(&m.type_), Some(&m.source), &m.options, &target)
            .map_err(|e| {
                format!(
                    "mount {} ({}) on {}: {e}",
                    m.source,
                    m.type_,
                    target.display()
                )
            })?;
    }
    Ok(true)
}

pub fn unmount_rootfs(bundle: &Path) {
    let target = bundle.join("rootfs");
    if let Err(e) = containerd_shim::mount::umount_recursive(target.to_str(), 0) {
        tracing::warn!(path = %target.display(), error = %e, "unmounting rootfs failed");
    }
}

/// Stdio wiring for a process about to be started by runc: either a console socket (tty) or
/// pipes. `finish` is called after runc returns to hook the streams to containerd's fifos.
pub struct StdioSetup {
    pub pipes: Arc<ProcessPipes>,
    pub console: Option<ConsoleSocket>,
}

impl StdioSetup {
    pub fn new(stdio: &Stdio) -> std::io::Result<Self> {
        let console = if stdio.terminal {
            Some(ConsoleSocket::new()?)
        } else {
            None
        };
        Ok(Self {
            pipes: Arc::new(ProcessPipes::new(stdio)?),
            console,
        })
    }

    pub fn console_path(&self) -> Option<PathBuf> {
        self.console.as_ref().map(|c| c.path().to_path_buf())
    }

    /// Connects the process's streams (pipes or terminal) to containerd's fifos.
    pub async fn finish(self, process: &mut Process) -> Result<(), String> {
        if let Some(console) = self.console {
            let master = console
                .receive_master()
                .await
                .map_err(|e| format!("receive terminal from runc: {e}"))?;
            let pty = Pty::new(master).map_err(|e| format!("terminal: {e}"))?;
            if !process.stdio.stdin.is_empty() {
                // The copy writes from its own thread, so it gets its own descriptor.
                let master = std::os::fd::AsFd::as_fd(&pty)
                    .try_clone_to_owned()
                    .map_err(|e| format!("terminal stdin: {e}"))?;
                process.stdin = Some(crate::stdio::StdinCopy::start(
                    &process.stdio.stdin,
                    Box::new(std::fs::File::from(master)),
                ));
            }
            if !process.stdio.stdout.is_empty() {
                process
                    .io
                    .copy_to_fifo(pty.clone(), &process.stdio.stdout)
                    .map_err(|e| format!("terminal stdout: {e}"))?;
            }
            process.pty = Some(pty);
        }
        Ok(())
    }
}

/// Reads the pid runc wrote.
pub fn read_pid(path: &Path) -> Result<i32, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|e| format!("pid file {} holds {text:?}: {e}", path.display()))
}
