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
    state::InitState, stdio::ProcessPipes,
};

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub settings: RuntimeSettings,
    pub config: gpusnap_config::Config,
    pub runc: Arc<runc::Runc>,
    /// The init's lifecycle; [`InitState`] holds every transition.
    pub state: InitState,
    /// The init's pid, stdio and exit.
    pub init: Process,
    pub execs: HashMap<String, Process>,
    pub rootfs_mounted: bool,
    /// Exit status of init, held back while execs still run so that their exits reach
    /// containerd first.
    pub deferred_init_exit: Option<i32>,
    pub oom: Option<OomWatch>,
    /// The container shares a PID namespace (pod, host, another container): when its init
    /// exits, its other processes are killed before the exit is reported.
    pub kill_all_on_exit: bool,
}

impl Container {
    /// The runc command line (global flags) this container's runc client uses, for the
    /// checkpoint and restore transactions.
    pub fn runc_global(&self) -> gpusnap_criu_bridge::RuncGlobal {
        gpusnap_criu_bridge::RuncGlobal {
            binary: PathBuf::from(&self.settings.runc_binary),
            root: Some(self.settings.runc_root.clone()),
            log: Some(RuntimeSettings::runc_log(&self.bundle)),
            systemd_cgroup: self.settings.systemd_cgroup,
            criu_dir: self.config.criu.binary_dir.clone(),
            ..Default::default()
        }
    }

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
