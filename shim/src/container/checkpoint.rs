//! Checkpoint of the running or paused init: the state claims it (one checkpoint or restore
//! at a time), the transaction runs it (`crate::checkpoint`), and the state records where it
//! left the task.

use std::path::PathBuf;

use gpusnap_transaction::{bundle_spec::BundleSpec, CheckpointRequest};

use super::Container;
use crate::{
    checkpoint::{self, CheckpointOptions},
    errors::*,
};

impl Container {
    /// Checkpoints the container into `image_dir`. `options_given`: containerd sent runc's
    /// checkpoint options (else CRI's work path is found here, as runc.v2 gets it).
    pub async fn checkpoint(
        &self,
        image_dir: PathBuf,
        mut opts: CheckpointOptions,
        options_given: bool,
    ) -> Result<()> {
        if !options_given && opts.work_path.is_none() {
            opts.work_path = checkpoint::cri_work_dir(&image_dir).or_else(|| {
                let spec = BundleSpec::read(&self.bundle).ok()?;
                checkpoint::cri_work_path(&spec, &self.id)
            });
        }
        let (request, ticket) = {
            let mut live = self.live().await;
            let ticket = live.state.begin_checkpoint(&self.id)?;
            let request = CheckpointRequest {
                container_id: self.id.clone(),
                bundle: self.bundle.clone(),
                init_pid: live.init.pid as u32,
                image_dir,
                work_dir: opts.work_path.clone(),
                parent: None,
                auto_dedup: false,
                criu: opts.criu.clone(),
                exit: opts.exit,
                frozen: ticket.frozen,
                runc: self.runc_global(),
                config: self.config.clone(),
                scratch_dir: self.bundle.clone(),
                // containerd's `shim delete` reads the in-flight record back from the bundle
                // if this shim is killed mid-checkpoint.
                record_dir: self.bundle.clone(),
            };
            (request, ticket)
        };
        let result = checkpoint::checkpoint(request, ticket.pending_cuda).await;
        let mut live = self.live().await;
        match result {
            Ok(report) => {
                if report.stopped {
                    // Killed after the seal, thawed first: the exit event ends it.
                    live.state.end_checkpoint(None);
                    live.state.resumed();
                } else {
                    live.state.end_checkpoint(report.pending_cuda);
                }
                Ok(())
            }
            Err(e) => {
                // The transaction put the cgroup back as the caller had it where it could;
                // containerd is told what it is (its client resumes a task it paused for the
                // checkpoint, and must not be told PAUSED about a thawed one, or vice versa).
                match gpusnap_transaction::cgroup::frozen(live.init.pid as u32) {
                    Some(frozen) => live.state.checkpoint_failed(frozen),
                    None => live.state.end_checkpoint(None),
                }
                Err(e)
            }
        }
    }
}
