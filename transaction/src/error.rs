//! The one error of a checkpoint or restore transaction.
//!
//! Every failure is either a refusal, before anything was changed, or a failure after
//! something was, with the [`Outcome`] it left. Front ends map it once, at their edge: the
//! shim to a ttrpc status, gpusnap-runc to an exit code.

use std::fmt;

/// Why a transaction did not start. Nothing was changed: no process was frozen, locked or
/// signalled, and the checkpoint directory holds nothing that looks complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The request itself is malformed (bad option, relative path, bad id).
    InvalidRequest,
    /// The node, the container or the image does not allow it (CRIU missing or too old, a
    /// damaged or foreign image, an incompatible GPU, a stopped container).
    Precondition,
    /// Another checkpoint or restore of the same container or into the same directory is in
    /// progress.
    Busy,
}

/// What a failed transaction left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Checkpoint: everything was rolled back. The container runs, unlocked, and is exactly as
    /// frozen or thawed as the caller left it; nothing in the checkpoint directory looks
    /// complete.
    ContainerUnchanged,
    /// Checkpoint: the driver could not say what state the container's CUDA processes are in.
    CudaStateUnknown,
    /// Restore: nothing of the checkpoint runs (CRIU failed, or never ran).
    NothingRunning,
    /// Restore: CRIU restored the processes but their GPU state could not be; they were killed.
    RestoredProcessesKilled,
    /// Restore: CRIU failed or passed its deadline, and some processes it had restored could not
    /// be killed; the message names them and their cgroup.
    RestoredProcessesLeft,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::ContainerUnchanged => {
                "the container keeps running as before and nothing in the checkpoint directory \
                 looks complete"
            }
            Outcome::CudaStateUnknown => {
                "the state of the container's CUDA processes is unknown: check them (or restart \
                 the container) before checkpointing again"
            }
            Outcome::NothingRunning => "nothing of the checkpoint is running",
            Outcome::RestoredProcessesKilled => {
                "the restored processes were killed, because they cannot run without their GPU \
                 state"
            }
            Outcome::RestoredProcessesLeft => {
                "processes of the failed restore are still in the container's cgroup: kill them \
                 (see the pids above), then run `runc delete --force` on the container"
            }
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{message}")]
    Refused { reason: Refusal, message: String },
    #[error("{message}; {outcome}")]
    Failed {
        outcome: Outcome,
        message: String,
        /// runc's exit code, when runc itself failed (gpusnap-runc passes it on).
        runc_exit: Option<i32>,
    },
}

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Refused {
            reason: Refusal::InvalidRequest,
            message: message.into(),
        }
    }

    pub fn precondition(message: impl Into<String>) -> Self {
        Error::Refused {
            reason: Refusal::Precondition,
            message: message.into(),
        }
    }

    pub fn busy(message: impl Into<String>) -> Self {
        Error::Refused {
            reason: Refusal::Busy,
            message: message.into(),
        }
    }

    pub fn failed(outcome: Outcome, message: impl Into<String>) -> Self {
        Error::Failed {
            outcome,
            message: message.into(),
            runc_exit: None,
        }
    }

    /// The outcome of a failure; `None` for a refusal (nothing changed).
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Error::Refused { .. } => None,
            Error::Failed { outcome, .. } => Some(*outcome),
        }
    }

    /// Names the operation: "cannot checkpoint c1: …" for a refusal, "checkpoint of c1
    /// failed: …" for a failure.
    pub fn of(self, operation: &str, id: &str) -> Self {
        match self {
            Error::Refused { reason, message } => Error::Refused {
                reason,
                message: format!("cannot {operation} {id}: {message}"),
            },
            Error::Failed {
                outcome,
                message,
                runc_exit,
            } => Error::Failed {
                outcome,
                message: format!("{operation} of {id} failed: {message}"),
                runc_exit,
            },
        }
    }

    /// Prefixes the message with what was being done.
    pub fn context(self, what: impl fmt::Display) -> Self {
        match self {
            Error::Refused { reason, message } => Error::Refused {
                reason,
                message: format!("{what}: {message}"),
            },
            Error::Failed {
                outcome,
                message,
                runc_exit,
            } => Error::Failed {
                outcome,
                message: format!("{what}: {message}"),
                runc_exit,
            },
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_say_what_they_left() {
        let e = Error::failed(Outcome::ContainerUnchanged, "runc checkpoint failed")
            .of("checkpoint", "c1");
        assert_eq!(
            e.to_string(),
            "checkpoint of c1 failed: runc checkpoint failed; the container keeps running as \
             before and nothing in the checkpoint directory looks complete"
        );
        assert_eq!(
            Error::precondition("CRIU is missing")
                .of("restore", "c2")
                .to_string(),
            "cannot restore c2: CRIU is missing"
        );
        assert_eq!(e.outcome(), Some(Outcome::ContainerUnchanged));
        let r = Error::busy("another checkpoint of c1 is in progress");
        assert_eq!(r.outcome(), None);
        assert_eq!(r.to_string(), "another checkpoint of c1 is in progress");
    }
}
