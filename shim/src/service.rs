//! The shim process itself: `start` (spawn or reuse the serving shim), `delete` (clean up
//! after a dead shim) and serving the Task service.

use std::{path::PathBuf, sync::Arc};

use async_trait::async_trait;
use containerd_shim::{
    asynchronous::{publisher::RemotePublisher, spawn, ExitSignal, Shim},
    protos::{api::DeleteResponse, protobuf::MessageField},
    util::convert_to_timestamp,
    Config, Error, Flags, StartOpts,
};

use gpusnap_transaction::{host::Runc, repair, Direct};

use crate::{events::EventSender, options::RuntimeSettings, task::TaskService};

/// The CRI annotation that names the pod a container belongs to; containers of one pod share
/// one shim, like containerd-shim-runc-v2 does.
const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

pub struct Service {
    namespace: String,
    id: String,
    exit: Arc<ExitSignal>,
}

/// The id whose socket this container's shim serves: the pod's sandbox id when CRI grouped
/// it, else the container id.
fn grouping_id(bundle: &std::path::Path, id: &str) -> String {
    let spec = std::fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|d| serde_json::from_slice::<serde_json::Value>(&d).ok());
    spec.as_ref()
        .and_then(|s| s.get("annotations"))
        .and_then(|a| a.get(SANDBOX_ID_ANNOTATION))
        .and_then(|v| v.as_str())
        .filter(|v| !v.is_empty())
        .unwrap_or(id)
        .to_string()
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Self {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        let bundle = std::env::current_dir().map_err(|e| Error::Other(format!("cwd: {e}")))?;
        let grouping = grouping_id(&bundle, &opts.id);
        let address = spawn(opts, &grouping, Vec::new()).await?;
        std::fs::write(bundle.join("address"), &address)
            .map_err(|e| Error::Other(format!("write shim address file: {e}")))?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        // containerd runs `shim delete` in the bundle after the serving shim died: remove the
        // runc container and the rootfs mount it left behind.
        let bundle: PathBuf =
            std::env::current_dir().map_err(|e| Error::Other(format!("cwd: {e}")))?;
        let settings = RuntimeSettings::load(&bundle, &self.namespace);
        let global = gpusnap_criu_bridge::RuncGlobal {
            binary: PathBuf::from(&settings.runc_binary),
            root: Some(settings.runc_root.clone()),
            systemd_cgroup: settings.systemd_cgroup,
            ..Default::default()
        };
        let runc_of = |id: &str| Runc::new(global.clone(), id, &Direct);
        // First a checkpoint this shim was taking: its CRIU (orphaned with its runc) holds the
        // container's tasks seized, so the kill below would wait on it (containerd gives this
        // command 5 s); every cgroup it left frozen is thawed, since the container is deleted next.
        repair::checkpoint(
            &bundle,
            Some(&bundle),
            &runc_of(&self.id),
            repair::Afterwards::Deleted,
        );
        // Then the restores this shim was running (Start of a container created from a
        // checkpoint). The shim keeps the record of every container it restores in its own
        // directory (this one: a pod's containers share the shim of its sandbox, and containerd
        // runs `delete` for the sandbox only).
        for restored in repair::restores_in(&bundle, runc_of) {
            // This shim mounted that container's rootfs; containerd deletes a pod container's
            // bundle only through the shim that is gone.
            if restored.record.bundle != bundle {
                crate::container::unmount_rootfs(&restored.record.bundle);
            }
        }
        match settings.runc(&bundle) {
            Ok(runc) => {
                let opts = runc::options::DeleteOpts { force: true };
                if let Err(e) = runc.delete(&self.id, Some(&opts)).await {
                    tracing::warn!(id = %self.id, error = %e, "runc delete during shim cleanup failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "runc not usable during shim cleanup"),
        }
        crate::container::unmount_rootfs(&bundle);
        Ok(DeleteResponse {
            pid: 0,
            exit_status: 128 + libc::SIGKILL as u32,
            exited_at: MessageField::some(convert_to_timestamp(Some(
                time::OffsetDateTime::now_utc(),
            ))),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        let events = EventSender::start(publisher, self.namespace.clone());
        TaskService::new(events, self.namespace.clone(), self.exit.clone())
    }
}
