//! Running runc under the shim's subreaper.
//!
//! The shim crate reaps every child on SIGCHLD (`waitpid(-1)`) so that container processes
//! re-parented to the shim are collected. That steals the exit status from
//! `tokio::process::Child::wait`, so runc invocations are awaited through the same exit
//! monitor instead: subscribe first, spawn, then wait for the exit event of that pid.

use std::{os::unix::process::ExitStatusExt, process::ExitStatus};

use async_trait::async_trait;
use containerd_shim::monitor::{monitor_subscribe, monitor_unsubscribe, ExitEvent, Subject, Topic};
use tokio::{io::AsyncReadExt, process::Command};

#[derive(Debug, Default)]
pub struct ReaperSpawner;

/// Spawns `cmd` and waits for its exit through the shim's monitor. Returns the exit status,
/// pid and whatever it wrote to piped stdout/stderr.
pub async fn run_reaped(cmd: Command) -> std::io::Result<(ExitStatus, u32, String, String)> {
    run_reaped_with(cmd, |_| {}).await
}

/// [`run_reaped`], telling `spawned` the child's pid as soon as it runs.
pub async fn run_reaped_with(
    mut cmd: Command,
    spawned: impl FnOnce(u32),
) -> std::io::Result<(ExitStatus, u32, String, String)> {
    let sub = monitor_subscribe(Topic::Pid)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let sub_id = sub.id;
    let mut rx = sub.rx;
    cmd.kill_on_drop(false);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = monitor_unsubscribe(sub_id).await;
            return Err(e);
        }
    };
    let pid = child.id().unwrap_or_default();
    spawned(pid);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let read_out = async move {
        let mut buf = Vec::new();
        if let Some(mut s) = stdout {
            let _ = s.read_to_end(&mut buf).await;
        }
        String::from_utf8_lossy(&buf).into_owned()
    };
    let read_err = async move {
        let mut buf = Vec::new();
        if let Some(mut s) = stderr {
            let _ = s.read_to_end(&mut buf).await;
        }
        String::from_utf8_lossy(&buf).into_owned()
    };
    let wait_exit = async move {
        while let Some(ExitEvent { subject, exit_code }) = rx.recv().await {
            if matches!(subject, Subject::Pid(p) if p as u32 == pid) {
                return exit_code;
            }
        }
        -1
    };
    let (out, err, code) = tokio::join!(read_out, read_err, wait_exit);
    let _ = monitor_unsubscribe(sub_id).await;
    // The monitor reports 128+signal for signalled children; runc itself exits normally, so
    // encode the code the way waitpid would for a normal exit.
    Ok((ExitStatus::from_raw((code & 0xff) << 8), pid, out, err))
}

#[async_trait]
impl runc::Spawner for ReaperSpawner {
    async fn execute(
        &self,
        cmd: Command,
    ) -> Result<(ExitStatus, u32, String, String), runc::error::Error> {
        run_reaped(cmd)
            .await
            .map_err(runc::error::Error::ProcessSpawnFailed)
    }
}
