//! Start of a task created from a checkpoint: the restore transaction, with the container's
//! stdio, becomes its init.

use gpusnap_transaction::{RestoreCommand, RestoreRequest};

use super::{stdio_setup::StdioSetup, Container};
use crate::{checkpoint, errors::*, process::Process, state::PendingRestore};

impl Container {
    /// Restores the pending checkpoint; the restored init's pid. A failed restore leaves the
    /// task created from the checkpoint, to be started again or deleted.
    pub(super) async fn restore(&self, restore: PendingRestore) -> Result<u32> {
        let result = self.restore_init(&restore).await;
        let mut live = self.live().await;
        let init = match result {
            Ok(init) => init,
            Err(e) => {
                live.state.restore_failed(restore);
                return Err(e);
            }
        };
        let pid = init.pid;
        live.init.pid = pid;
        live.init.io = init.io;
        live.init.pty = init.pty;
        live.init.stdin = init.stdin;
        live.state.started();
        self.watch_oom(&mut live);
        if let Some(parent) = &restore.parent {
            tracing::info!(id = self.id, pid, parent = %parent.display(), "restored (parent checkpoint given)");
        }
        Ok(pid as u32)
    }

    /// Runs the restore transaction with the container's stdio; returns the restored init.
    async fn restore_init(&self, restore: &PendingRestore) -> Result<Process> {
        let stdio = self.live().await.init.stdio.clone();
        let own = checkpoint::own_dir(&self.bundle);
        let mut init = Process::new("", stdio);
        let setup = StdioSetup::new(&mut init)?;
        let request = RestoreRequest {
            container_id: self.id.clone(),
            bundle: self.bundle.clone(),
            checkpoint_dir: restore.image.clone(),
            rootfs_diff: restore.rootfs_diff.clone(),
            signature_evidence: restore.signature_evidence.clone(),
            checkpoint_mount: None,
            began: None,
            in_place: None,
            runc: self.runc_global(),
            config: self.config.clone(),
            scratch_dir: own.clone(),
            command: RestoreCommand::Build {
                work_dir: checkpoint::restore_work_dir(&own, &self.bundle, &self.id),
                pid_file: self.bundle.join("init.pid"),
                console_socket: setup.console_path(),
                no_pivot: self.settings.no_pivot_root,
                terminal: init.stdio.terminal,
            },
        };
        let report =
            match checkpoint::restore(request, restore.volume.clone(), setup.pipes.clone()).await {
                Ok(r) => r,
                Err(e) => {
                    setup.abandon(&init).await;
                    return Err(e);
                }
            };
        init.pid = report.init_pid as i32;
        setup.finish(&mut init).await?;
        Ok(init)
    }
}
