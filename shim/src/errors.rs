//! The shim's one error, and its mapping onto the ttrpc status codes containerd turns into
//! errdefs — done once, here, at the edge.

use containerd_shim::protos::ttrpc::{self, Code};
use gpusnap_transaction::{Error as TransactionError, Refusal};

pub type Result<T> = std::result::Result<T, Error>;
pub type TtrpcResult<T> = ttrpc::Result<T>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// The container is not in a state that allows the request (including "a checkpoint is
    /// in progress").
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Transaction(#[from] TransactionError),
}

impl From<Error> for ttrpc::Error {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::NotFound(_) => Code::NOT_FOUND,
            Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Error::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            Error::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            Error::Internal(_) => Code::INTERNAL,
            Error::Transaction(TransactionError::Refused { reason, .. }) => match reason {
                Refusal::InvalidRequest => Code::INVALID_ARGUMENT,
                Refusal::Precondition | Refusal::Busy => Code::FAILED_PRECONDITION,
            },
            Error::Transaction(TransactionError::Failed { .. }) => Code::INTERNAL,
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, e.to_string()))
    }
}

pub fn not_found(msg: impl Into<String>) -> Error {
    Error::NotFound(msg.into())
}

pub fn already_exists(msg: impl Into<String>) -> Error {
    Error::AlreadyExists(msg.into())
}

pub fn invalid_argument(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

pub fn failed_precondition(msg: impl Into<String>) -> Error {
    Error::FailedPrecondition(msg.into())
}

pub fn internal(msg: impl Into<String>) -> Error {
    Error::Internal(msg.into())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn code(e: Error) -> Code {
        match ttrpc::Error::from(e) {
            ttrpc::Error::RpcStatus(s) => s.code(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn transaction_errors_map_once() {
        assert_eq!(
            code(TransactionError::busy("checkpoint in progress").into()),
            Code::FAILED_PRECONDITION
        );
        assert_eq!(
            code(TransactionError::invalid("bad option").into()),
            Code::INVALID_ARGUMENT
        );
        assert_eq!(
            code(
                TransactionError::failed(gpusnap_transaction::Outcome::ContainerUnchanged, "x")
                    .into()
            ),
            Code::INTERNAL
        );
        assert_eq!(code(not_found("c")), Code::NOT_FOUND);
    }
}
