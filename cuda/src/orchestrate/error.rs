//! Orchestration failures, classified by what they left behind.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::discovery::DiscoveryError;
use crate::driver::{LoadError, ProcessState};
use crate::engine::EngineError;

/// Errors from caller callbacks (the CRIU dump or restore).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a failure left behind. Every [`OrchestrateError`] carries exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing was changed: every CUDA process is as it was before the call.
    BeforeMutation,
    /// Processes were changed and then put back: all are running and unlocked.
    RolledBack,
    /// A driver call failed or timed out mid-way, or rollback failed: some
    /// process is not known to be back where it started.
    OutcomeUnknown,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BeforeMutation => "before mutation",
            Self::RolledBack => "rolled back",
            Self::OutcomeUnknown => "outcome unknown",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Checkpoint,
    Restore,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Checkpoint => "checkpoint",
            Self::Restore => "restore",
        })
    }
}

/// Where in the sequence the failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Checks before any process is touched.
    Admission,
    Lock,
    Checkpoint,
    /// The caller's CRIU dump.
    Dump,
    /// Leave-running: CUDA restore after the dump.
    Resume,
    /// Leave-running: unlock after the dump.
    ResumeUnlock,
    /// The caller's CRIU restore.
    CriuRestore,
    DriverInit,
    PidMapping,
    Restore,
    Unlock,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Admission => "admission",
            Self::Lock => "lock",
            Self::Checkpoint => "checkpoint",
            Self::Dump => "CRIU dump",
            Self::Resume => "CUDA restore after the dump",
            Self::ResumeUnlock => "unlock after the dump",
            Self::CriuRestore => "CRIU restore",
            Self::DriverInit => "CUDA driver initialisation",
            Self::PidMapping => "mapping restored pids",
            Self::Restore => "CUDA restore",
            Self::Unlock => "unlock",
        })
    }
}

/// The first failure, which aborted the sequence.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error("{0}")]
    Engine(EngineError),
    #[error(
        "{call} for pid {pid} did not return within {limit_ms} ms; driver calls cannot be \
         interrupted, so it may still complete"
    )]
    Timeout {
        call: String,
        pid: i32,
        limit_ms: u64,
    },
    #[error("{call} on pid {pid} did not run to completion: {reason}")]
    Thread {
        call: String,
        pid: i32,
        reason: String,
    },
    #[error("the {budget_ms} ms restore budget ran out before {call} for pid {pid}")]
    BudgetExhausted {
        call: String,
        pid: i32,
        budget_ms: u64,
    },
    #[error("CRIU dump failed: {0}")]
    Dump(BoxError),
    #[error("CRIU restore failed: {0}")]
    CriuRestore(BoxError),
    #[error("{0}")]
    DriverInit(LoadError),
    #[error("{0}")]
    Discovery(DiscoveryError),
    #[error("{0}")]
    Admission(String),
}

/// A process's last known state when the error was returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutcome {
    pub pid: i32,
    /// `None`: unknown (a call timed out, or the state query failed).
    pub state: Option<ProcessState>,
}

impl fmt::Display for ProcessOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.state {
            Some(state) => write!(f, "pid {}: {state}", self.pid),
            None => write!(f, "pid {}: unknown", self.pid),
        }
    }
}

/// A transition that did not work (during rollback, or besides the first failure).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedStep {
    pub pid: i32,
    /// `lock`, `checkpoint`, `restore` or `unlock`.
    pub action: String,
    pub reason: String,
}

/// A failed checkpoint or restore. The Display text names the phase, the
/// cause and the [`Outcome`], so a log line alone says whether the workload is
/// running.
#[derive(Debug)]
pub struct OrchestrateError {
    pub operation: Operation,
    pub phase: Phase,
    /// The process the first failure concerned.
    pub pid: Option<i32>,
    pub outcome: Outcome,
    /// Boxed to keep `Result<_, OrchestrateError>` small.
    pub cause: Box<Cause>,
    /// Every process's last known state.
    pub processes: Vec<ProcessOutcome>,
    /// Rollback steps that did not work.
    pub rollback_failures: Vec<FailedStep>,
    /// Failures of other processes in the same phase, after the first.
    pub other_failures: Vec<FailedStep>,
    /// The CRIU dump had completed: the image is usable even though the
    /// workload could not be resumed.
    pub dump_completed: bool,
}

impl OrchestrateError {
    pub(crate) fn before_mutation(operation: Operation, phase: Phase, cause: Cause) -> Self {
        Self {
            operation,
            phase,
            pid: None,
            outcome: Outcome::BeforeMutation,
            cause: Box::new(cause),
            processes: Vec::new(),
            rollback_failures: Vec::new(),
            other_failures: Vec::new(),
            dump_completed: false,
        }
    }

    /// The driver's `CUresult` behind the failure, if any.
    pub fn cuda_code(&self) -> Option<u32> {
        match self.cause.as_ref() {
            Cause::Engine(e) => e.cuda_code(),
            _ => None,
        }
    }
}

impl fmt::Display for OrchestrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CUDA {} failed during {}", self.operation, self.phase)?;
        if let Some(pid) = self.pid {
            write!(f, " of pid {pid}")?;
        }
        write!(f, ": {}; ", self.cause)?;
        match (self.outcome, self.operation) {
            (Outcome::BeforeMutation, _) => {
                f.write_str("before mutation: no CUDA process was changed")?;
            }
            (Outcome::RolledBack, _) => {
                f.write_str(
                    "rolled back: every CUDA process gpusnap changed is running and unlocked again",
                )?;
            }
            (Outcome::OutcomeUnknown, op) => {
                f.write_str("outcome unknown: ")?;
                let states: Vec<String> = self.processes.iter().map(ToString::to_string).collect();
                write!(f, "last known states [{}]", states.join(", "))?;
                match op {
                    Operation::Checkpoint => {
                        f.write_str("; the workload may be stuck, do not assume it is running")?
                    }
                    Operation::Restore => f.write_str("; the restored workload is not usable")?,
                }
            }
        }
        let list = |steps: &[FailedStep]| {
            steps
                .iter()
                .map(|r| format!("{} pid {}: {}", r.action, r.pid, r.reason))
                .collect::<Vec<_>>()
                .join("; ")
        };
        if !self.other_failures.is_empty() {
            write!(f, "; also failed: {}", list(&self.other_failures))?;
        }
        if !self.rollback_failures.is_empty() {
            write!(f, "; rollback failed: {}", list(&self.rollback_failures))?;
        }
        if self.dump_completed {
            f.write_str("; the CRIU dump itself completed")?;
        }
        Ok(())
    }
}

impl std::error::Error for OrchestrateError {}
