//! Task checkpoint and restore (filled in by the checkpoint/restore work).

use containerd_shim::{
    api::StartResponse,
    protos::api::{CheckpointTaskRequest, Empty},
};

use crate::{container::PendingRestore, errors::*, task::TaskService};

impl TaskService {
    pub async fn checkpoint_task(&self, _req: CheckpointTaskRequest) -> TtrpcResult<Empty> {
        Err(unimplemented("checkpoint is not implemented yet"))
    }

    pub async fn start_restore(&self, _id: &str, _restore: PendingRestore) -> TtrpcResult<StartResponse> {
        Err(unimplemented("restore is not implemented yet"))
    }
}
