//! Mapping shim failures onto ttrpc status codes that containerd turns into errdefs.

use containerd_shim::protos::ttrpc::{self, Code};

pub type TtrpcResult<T> = ttrpc::Result<T>;

fn status(code: Code, msg: impl Into<String>) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg.into()))
}

pub fn not_found(msg: impl Into<String>) -> ttrpc::Error {
    status(Code::NOT_FOUND, msg)
}

pub fn already_exists(msg: impl Into<String>) -> ttrpc::Error {
    status(Code::ALREADY_EXISTS, msg)
}

pub fn invalid_argument(msg: impl Into<String>) -> ttrpc::Error {
    status(Code::INVALID_ARGUMENT, msg)
}

pub fn failed_precondition(msg: impl Into<String>) -> ttrpc::Error {
    status(Code::FAILED_PRECONDITION, msg)
}

pub fn internal(msg: impl Into<String>) -> ttrpc::Error {
    status(Code::INTERNAL, msg)
}

pub fn runc_error_text(err: &runc::error::Error) -> String {
    match err {
        runc::error::Error::CommandFailed {
            status,
            stdout,
            stderr,
        } => {
            let out = format!("{} {}", stdout.trim(), stderr.trim());
            format!("runc exited with {status}: {}", out.trim())
        }
        other => other.to_string(),
    }
}
