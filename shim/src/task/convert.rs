//! containerd's protocol types to the shim's and back, for the Task service's edge.

use containerd_shim::{
    api::{CreateTaskRequest, DeleteResponse, PidsResponse, StateResponse},
    asynchronous::io::Stdio,
    protos::{
        events::task::{TaskCreate, TaskDelete, TaskExit, TaskIO},
        protobuf::{
            well_known_types::{any::Any, timestamp::Timestamp},
            MessageField,
        },
        shim::oci::ProcessDetails,
        types::task::ProcessInfo,
    },
    util::{convert_to_any, convert_to_timestamp},
};

use crate::{
    container::{Exit, PidInfo, ProcessView},
    errors::*,
    process::ExitInfo,
};

pub fn stdio(terminal: bool, stdin: &str, stdout: &str, stderr: &str) -> Stdio {
    Stdio::new(stdin, stdout, stderr, terminal)
}

pub fn timestamp(exit: Option<ExitInfo>) -> MessageField<Timestamp> {
    MessageField::some(convert_to_timestamp(exit.map(|e| e.at)))
}

/// A runtime-spec part (an exec's process, resources) containerd sends as JSON in an `Any`.
pub fn decode_json<T: serde::de::DeserializeOwned>(
    what: &str,
    any: &MessageField<Any>,
) -> Result<T> {
    let any = any
        .as_ref()
        .ok_or_else(|| invalid_argument(format!("{what} is missing")))?;
    serde_json::from_slice(&any.value).map_err(|e| {
        invalid_argument(format!(
            "{what} ({}) is not valid runtime-spec JSON: {e}",
            any.type_url
        ))
    })
}

pub fn task_exit(e: Exit) -> TaskExit {
    TaskExit {
        container_id: e.container_id,
        id: e.id,
        pid: e.pid,
        exit_status: e.info.status,
        exited_at: timestamp(Some(e.info)),
        ..Default::default()
    }
}

pub fn task_create(req: CreateTaskRequest, pid: u32) -> TaskCreate {
    TaskCreate {
        container_id: req.id,
        bundle: req.bundle,
        rootfs: req.rootfs,
        io: MessageField::some(TaskIO {
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            terminal: req.terminal,
            ..Default::default()
        }),
        checkpoint: req.checkpoint,
        pid,
        ..Default::default()
    }
}

pub fn task_delete(id: &str, pid: u32, exit: Option<ExitInfo>) -> TaskDelete {
    TaskDelete {
        container_id: id.to_string(),
        pid,
        exit_status: exit.map(|e| e.status).unwrap_or_default(),
        exited_at: timestamp(exit),
        id: id.to_string(),
        ..Default::default()
    }
}

pub fn delete_response(pid: u32, exit: Option<ExitInfo>) -> DeleteResponse {
    DeleteResponse {
        pid,
        exit_status: exit.map(|e| e.status).unwrap_or_default(),
        exited_at: timestamp(exit),
        ..Default::default()
    }
}

pub fn state_response(bundle: &std::path::Path, p: ProcessView) -> StateResponse {
    let mut resp = StateResponse {
        id: p.id,
        bundle: bundle.to_string_lossy().into_owned(),
        pid: p.pid,
        status: p.status.into(),
        stdin: p.stdio.stdin,
        stdout: p.stdio.stdout,
        stderr: p.stdio.stderr,
        terminal: p.stdio.terminal,
        exec_id: p.exec_id,
        ..Default::default()
    };
    if let Some(exit) = p.exit {
        resp.exit_status = exit.status;
        resp.exited_at = timestamp(Some(exit));
    }
    resp
}

/// The container's processes, each exec's with its exec id in `ProcessDetails`.
pub fn pids_response(pids: Vec<PidInfo>) -> Result<PidsResponse> {
    let mut processes = Vec::with_capacity(pids.len());
    for p in pids {
        let mut info = ProcessInfo {
            pid: p.pid,
            ..Default::default()
        };
        if let Some(exec_id) = p.exec_id {
            let details = ProcessDetails {
                exec_id,
                ..Default::default()
            };
            let any = convert_to_any(Box::new(details))
                .map_err(|e| internal(format!("encode process details: {e}")))?;
            info.info = MessageField::some(any);
        }
        processes.push(info);
    }
    Ok(PidsResponse {
        processes,
        ..Default::default()
    })
}
