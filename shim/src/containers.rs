//! The containers one shim serves (one, or every container of a pod), and the node's copies
//! of image-volume checkpoints they restored from, swept when the pod is gone.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{container::Container, errors::*};

#[derive(Default)]
pub struct ShimState {
    pub containers: HashMap<String, Arc<Container>>,
    /// Where the node's copies of image-volume checkpoints are (each container's
    /// `<restore.checkpoint_root>/.gpusnap-volumes` that exists): swept of copies no pod holds
    /// when a container is deleted and when the shim shuts down — after containerd removed the
    /// pod's image volumes (`gpusnap_transaction::volume`).
    pub volume_caches: BTreeSet<PathBuf>,
    /// The image volumes this shim's containers restored from (their mount directories).
    pub volume_mounts: BTreeSet<PathBuf>,
}

/// The sweep of image-volume copies left for when the shim's last container is gone.
pub struct FinalSweep {
    caches: BTreeSet<PathBuf>,
    mounts: BTreeSet<PathBuf>,
}

impl ShimState {
    pub fn container(&self, id: &str) -> Result<Arc<Container>> {
        self.containers
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(format!("container {id} not found")))
    }

    /// Adds a created container, with the image volume its pending restore copies from.
    pub fn insert(&mut self, mut c: Container) {
        if let Some((cache, mount)) = c.pending_volume() {
            self.volume_caches.insert(cache);
            self.volume_mounts.insert(mount);
        }
        self.containers.insert(c.id.clone(), Arc::new(c));
    }

    /// Once the shim serves no container: the sweep it owes, if any. `None` while it still
    /// serves one (one shim can serve a whole pod: it only goes away with its last container).
    pub fn final_sweep(&self) -> Option<Option<FinalSweep>> {
        if !self.containers.is_empty() {
            return None;
        }
        Some((!self.volume_caches.is_empty()).then(|| FinalSweep {
            caches: self.volume_caches.clone(),
            mounts: self.volume_mounts.clone(),
        }))
    }
}

impl FinalSweep {
    /// The pod is gone. containerd removes its image volumes right after it stopped the
    /// sandbox, which is what shuts this shim down: wait (briefly) for them to go, then
    /// remove the copies only they held.
    pub async fn run(self) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while self.mounts.iter().any(|m| m.exists()) && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caches = self.caches;
        let _ = tokio::task::spawn_blocking(move || {
            caches
                .iter()
                .for_each(|c| drop(gpusnap_transaction::volume::sweep(c)))
        })
        .await;
    }
}
