//! Delete of a container whose init is not running: out of the shim's table, then runc's
//! container, stdio, rootfs and the node's unheld image-volume copies.

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use gpusnap_criu_bridge::{classify_runc_error, RuncErrorKind};

use super::Container;
use crate::{errors::*, process::ExitInfo, state::InitState};

/// A container taken out of the shim's table by Delete, not yet cleaned up.
pub struct Removed {
    container: Arc<Container>,
    had_runc_container: bool,
}

/// What Delete reports.
pub struct Deleted {
    pub pid: u32,
    pub exit: Option<ExitInfo>,
    /// The node's cache of image-volume copies this container's configuration names, when it
    /// exists (swept again when the shim shuts down).
    pub volume_cache: Option<PathBuf>,
}

impl Container {
    /// Takes container `id` out of `containers` unless its init runs or is being restored.
    /// The check and the removal happen under the container's lock, so a Start racing with
    /// the Delete finds the container gone (stopped).
    pub async fn remove(
        containers: &mut HashMap<String, Arc<Container>>,
        id: &str,
    ) -> Result<Removed> {
        let container = containers
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(format!("container {id} not found")))?;
        let had_runc_container = {
            let mut live = container.live().await;
            if live.state.is_alive() || matches!(live.state, InitState::Restoring) {
                return Err(failed_precondition(format!(
                    "container {id} is still running; kill it before deleting it"
                )));
            }
            let had = live.state.has_runc_container();
            live.state.exited();
            containers.remove(id);
            had
        };
        Ok(Removed {
            container,
            had_runc_container,
        })
    }
}

impl Removed {
    pub async fn delete(self) -> Deleted {
        let c = &self.container;
        if self.had_runc_container {
            let opts = runc::options::DeleteOpts { force: true };
            if let Err(e) = c.runc.delete(&c.id, Some(&opts)).await {
                let text = super::runc_log_error(&c.bundle).unwrap_or_else(|| runc_error_text(&e));
                if classify_runc_error(&text) != RuncErrorKind::ContainerMissing {
                    tracing::warn!(id = %c.id, error = %text, "runc delete failed");
                }
            }
        }
        let live = c.live().await;
        live.init.shutdown_io().await;
        for e in live.execs.values() {
            e.shutdown_io().await;
        }
        if live.rootfs_mounted {
            super::unmount_rootfs(&c.bundle);
        }
        // containerd removes a pod's image volumes when the pod stops: the node's copies of
        // volume checkpoints that no pod holds any more go (gpusnap_transaction::volume).
        let cache = c
            .config
            .restore
            .checkpoint_root
            .join(gpusnap_transaction::volume::CACHE_DIR);
        let volume_cache = cache.is_dir().then(|| cache.clone());
        if volume_cache.is_some() {
            let _ = tokio::task::spawn_blocking(move || gpusnap_transaction::volume::sweep(&cache))
                .await;
        }
        Deleted {
            pid: live.init.pid as u32,
            exit: live.init.exit,
            volume_cache,
        }
    }
}
