//! Pause and Resume: the init's cgroup frozen and thawed through runc; a resume also brings
//! back CUDA processes a checkpoint of the paused task left checkpointed.

use super::Container;
use crate::errors::*;

impl Container {
    pub async fn pause(&self) -> Result<()> {
        {
            let mut live = self.live().await;
            Self::reconcile_frozen(&mut live);
            // Claims the transition first, so a checkpoint cannot start in between.
            live.state.pause(&self.id)?;
        }
        if let Err(e) = self.runc.pause(&self.id).await {
            self.live().await.state.resumed();
            return Err(self.runc_failure("runc pause", &e));
        }
        Ok(())
    }

    pub async fn resume(&self) -> Result<()> {
        {
            let mut live = self.live().await;
            Self::reconcile_frozen(&mut live);
            live.state.check_resume(&self.id)?;
        }
        self.runc
            .resume(&self.id)
            .await
            .map_err(|e| self.runc_failure("runc resume", &e))?;
        let pending = self.live().await.state.resumed();
        if let Some(pending) = pending {
            crate::checkpoint::resume_cuda(&self.id, pending).await?;
        }
        Ok(())
    }
}
