//! Start of the init: `runc start`, or the restore Create left pending.

use super::Container;
use crate::{errors::*, state::StartKind};

impl Container {
    /// Starts (or restores) the init; its pid.
    pub async fn start(&self) -> Result<u32> {
        let kind = self.live().await.state.start(&self.id)?;
        if let StartKind::Restore(restore) = kind {
            return self.restore(restore).await;
        }
        self.runc
            .start(&self.id)
            .await
            .map_err(|e| self.runc_failure("runc start", &e))?;
        let mut live = self.live().await;
        live.state.started();
        Ok(live.init.pid as u32)
    }
}
