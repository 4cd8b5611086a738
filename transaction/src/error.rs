//! The one error of a checkpoint or restore transaction.
//!
//! Every failure is either a refusal, before anything was changed, or a failure after
//! something was, with the [`Outcome`] it left. Front ends map it once, at their edge: the
//! shim to a ttrpc status, gpusnap-runc to an exit code.
//!
//! Each phase of a transaction has its own error type (`checkpoint::prepare::PrepareError`,
//! `restore::apply::ApplyError`, ...) that keeps what caused it; converting one into this
//! error decides the category (refused or failed, and the outcome) once, and keeps the cause
//! as the [`std::error::Error::source`] of the result.

use std::fmt;

/// What caused an error, kept for its chain (`source()`); the message already says it in words.
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

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
    Refused {
        reason: Refusal,
        message: String,
        /// What the refusal was caused by, when it was an error of its own.
        #[source]
        source: Option<Source>,
    },
    #[error("{message}; {outcome}")]
    Failed {
        outcome: Outcome,
        message: String,
        /// runc's exit code, when runc itself failed (gpusnap-runc passes it on).
        runc_exit: Option<i32>,
        /// What the failure was caused by, when it was an error of its own.
        #[source]
        source: Option<Source>,
    },
}

impl Error {
    pub fn refused(reason: Refusal, message: impl Into<String>) -> Self {
        Error::Refused {
            reason,
            message: message.into(),
            source: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::refused(Refusal::InvalidRequest, message)
    }

    pub fn precondition(message: impl Into<String>) -> Self {
        Error::refused(Refusal::Precondition, message)
    }

    pub fn busy(message: impl Into<String>) -> Self {
        Error::refused(Refusal::Busy, message)
    }

    pub fn failed(outcome: Outcome, message: impl Into<String>) -> Self {
        Error::Failed {
            outcome,
            message: message.into(),
            runc_exit: None,
            source: None,
        }
    }

    /// Keeps `cause` as the error's source.
    pub fn caused_by(mut self, cause: impl Into<Source>) -> Self {
        match &mut self {
            Error::Refused { source, .. } | Error::Failed { source, .. } => {
                *source = Some(cause.into())
            }
        }
        self
    }

    /// runc's exit code, when runc itself failed.
    pub fn with_runc_exit(mut self, exit: Option<i32>) -> Self {
        if let Error::Failed { runc_exit, .. } = &mut self {
            *runc_exit = exit;
        }
        self
    }

    /// The refusal's reason; `None` for a failure.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Refused { reason, .. } => Some(*reason),
            Error::Failed { .. } => None,
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
            Error::Refused {
                reason,
                message,
                source,
            } => Error::Refused {
                reason,
                message: format!("cannot {operation} {id}: {message}"),
                source,
            },
            Error::Failed {
                outcome,
                message,
                runc_exit,
                source,
            } => Error::Failed {
                outcome,
                message: format!("{operation} of {id} failed: {message}"),
                runc_exit,
                source,
            },
        }
    }

    /// Prefixes the message with what was being done.
    pub fn context(self, what: impl fmt::Display) -> Self {
        self.map_message(|message| format!("{what}: {message}"))
    }

    /// The same error with its message rewritten (category, outcome and source kept).
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Error::Refused {
                reason,
                message,
                source,
            } => Error::Refused {
                reason,
                message: f(message),
                source,
            },
            Error::Failed {
                outcome,
                message,
                runc_exit,
                source,
            } => Error::Failed {
                outcome,
                message: f(message),
                runc_exit,
                source,
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

    #[test]
    fn the_cause_survives_naming_and_context() {
        use std::error::Error as _;
        let io = std::io::Error::other("disk on fire");
        let e = Error::precondition("cannot use /ck: disk on fire")
            .caused_by(io)
            .context("preparing")
            .of("checkpoint", "c1");
        assert_eq!(
            e.to_string(),
            "cannot checkpoint c1: preparing: cannot use /ck: disk on fire"
        );
        assert_eq!(e.source().unwrap().to_string(), "disk on fire");
        let f = Error::failed(Outcome::NothingRunning, "runc restore failed")
            .with_runc_exit(Some(3))
            .caused_by(std::io::Error::other("criu"));
        assert!(matches!(
            f,
            Error::Failed {
                runc_exit: Some(3),
                ..
            }
        ));
        assert_eq!(f.source().unwrap().to_string(), "criu");
    }
}
