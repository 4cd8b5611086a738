//! Per-process state tracking and the one primitive every phase uses: run one
//! transition on a set of processes under the watchdog, then record what is
//! known about each process afterwards.
//!
//! gpusnap tracks states itself instead of polling `GetState` (seconds per
//! call on large processes). It asks the driver only after a call failed,
//! because then the state is genuinely in doubt.

use std::sync::Arc;
use std::time::Instant;

use crate::driver::{code, CallError, DeviceInfo, Driver, GpuRemap, ProcessState};
use crate::engine::{EngineError, EngineOp, EngineOutput, StorageEngine};
use crate::watchdog::{self, Finished, Job};

use super::error::{Cause, FailedStep, Outcome, ProcessOutcome};
use super::record::{ms, PhaseTimings};
use super::Orchestrator;

/// One state transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl Action {
    fn label(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Checkpoint => "checkpoint",
            Self::Restore => "restore",
            Self::Unlock => "unlock",
        }
    }

    fn target(self) -> ProcessState {
        match self {
            Self::Lock | Self::Restore => ProcessState::Locked,
            Self::Checkpoint => ProcessState::Checkpointed,
            Self::Unlock => ProcessState::Running,
        }
    }

    fn call_name(self, engine: &str) -> String {
        match self {
            Self::Lock => "cuCheckpointProcessLock".into(),
            Self::Unlock => "cuCheckpointProcessUnlock".into(),
            Self::Checkpoint => format!("{engine} checkpoint"),
            Self::Restore => format!("{engine} restore"),
        }
    }
}

/// What gpusnap knows about one process.
#[derive(Debug, Clone)]
pub(crate) struct Tracked {
    pub(crate) pid: i32,
    pub(crate) gpus: Vec<DeviceInfo>,
    /// Restore only: the GPU pairs for this process.
    pub(crate) remap: Vec<GpuRemap>,
    /// Restore only: engine details saved at checkpoint.
    pub(crate) saved: Option<serde_json::Value>,
    /// `None` once a call timed out or the state query failed.
    pub(crate) state: Option<ProcessState>,
    /// Some call changed (or may have changed) this process.
    pub(crate) touched: bool,
    pub(crate) timings: PhaseTimings,
    pub(crate) output: EngineOutput,
}

impl Tracked {
    pub(crate) fn new(pid: i32, state: ProcessState, gpus: Vec<DeviceInfo>) -> Self {
        Self {
            pid,
            gpus,
            remap: Vec::new(),
            saved: None,
            state: Some(state),
            touched: false,
            timings: PhaseTimings::default(),
            output: EngineOutput::default(),
        }
    }
}

/// A transition that did not happen as asked.
#[derive(Debug)]
pub(crate) struct StepFailure {
    pub(crate) pid: i32,
    pub(crate) action: Action,
    pub(crate) cause: Cause,
}

impl StepFailure {
    pub(crate) fn into_failed_step(self) -> FailedStep {
        FailedStep {
            pid: self.pid,
            action: self.action.label().into(),
            reason: self.cause.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct StepMode {
    pub(crate) parallel: bool,
    /// Sequential mode only: stop at the first failure.
    pub(crate) stop_on_failure: bool,
    /// Undo a transition that completes after its deadline (checkpoint side:
    /// the goal after any failure is a running workload).
    pub(crate) undo_late: bool,
}

pub(crate) fn states(tracked: &[Tracked]) -> Vec<ProcessOutcome> {
    tracked
        .iter()
        .map(|t| ProcessOutcome {
            pid: t.pid,
            state: t.state,
        })
        .collect()
}

/// Nothing touched: `BeforeMutation` (every failure was a refusal that left
/// its process as it was). Every touched process back at `baseline`:
/// `RolledBack`. Anything else: `OutcomeUnknown`.
pub(crate) fn classify(tracked: &[Tracked], baseline: ProcessState) -> Outcome {
    let mut touched = tracked.iter().filter(|t| t.touched).peekable();
    if touched.peek().is_none() {
        Outcome::BeforeMutation
    } else if touched.all(|t| t.state == Some(baseline)) {
        Outcome::RolledBack
    } else {
        Outcome::OutcomeUnknown
    }
}

impl Orchestrator {
    /// Deadline of one driver operation: `max_operation` from now, capped by
    /// the overall budget. `None` when the budget is already spent.
    fn op_deadline(&self, budget: Option<Instant>) -> Option<Instant> {
        let now = Instant::now();
        let own = now + self.options.max_operation;
        match budget {
            Some(b) if b <= now => None,
            Some(b) => Some(own.min(b)),
            None => Some(own),
        }
    }

    /// Runs `action` on `tracked[i]` for each `i` in `which`.
    pub(crate) fn step(
        &self,
        action: Action,
        tracked: &mut [Tracked],
        which: &[usize],
        mode: StepMode,
        budget: Option<Instant>,
    ) -> Vec<StepFailure> {
        let mut failures = Vec::new();
        if which.is_empty() {
            return failures;
        }
        let started = Instant::now();
        if mode.parallel {
            let Some(deadline) = self.op_deadline(budget) else {
                return which
                    .iter()
                    .map(|&i| self.budget_failure(action, tracked[i].pid))
                    .collect();
            };
            let jobs = which
                .iter()
                .map(|&i| self.job(action, &tracked[i], deadline, mode.undo_late))
                .collect();
            let results = watchdog::run_all(action.label(), jobs, deadline);
            for ((_, finished), &i) in results.into_iter().zip(which) {
                failures.extend(self.settle(action, &mut tracked[i], finished, budget));
            }
        } else {
            for &i in which {
                let Some(deadline) = self.op_deadline(budget) else {
                    failures.push(self.budget_failure(action, tracked[i].pid));
                    if mode.stop_on_failure {
                        break;
                    }
                    continue;
                };
                let job = self.job(action, &tracked[i], deadline, mode.undo_late);
                let finished = watchdog::run_one(action.label(), job, deadline);
                if let Some(failure) = self.settle(action, &mut tracked[i], finished, budget) {
                    failures.push(failure);
                    if mode.stop_on_failure {
                        break;
                    }
                }
            }
        }
        tracing::info!(
            phase = action.label(),
            processes = which.len(),
            failed = failures.len(),
            parallel = mode.parallel,
            elapsed_ms = ms(started.elapsed()),
            "CUDA phase finished"
        );
        failures
    }

    fn budget_failure(&self, action: Action, pid: i32) -> StepFailure {
        StepFailure {
            pid,
            action,
            cause: Cause::BudgetExhausted {
                call: action.call_name(self.engine.name()),
                pid,
                budget_ms: self.options.restore_budget.as_millis() as u64,
            },
        }
    }

    fn job(
        &self,
        action: Action,
        t: &Tracked,
        deadline: Instant,
        undo_late: bool,
    ) -> Job<Result<EngineOutput, EngineError>> {
        let pid = t.pid;
        let driver = Arc::clone(&self.driver);
        let engine = Arc::clone(&self.engine);
        let op = EngineOp {
            driver: Arc::clone(&self.driver),
            pid,
            gpus: t.gpus.clone(),
            deadline,
            storage_dir: self.options.storage_dir.clone(),
            saved: t.saved.clone(),
        };
        let remap = t.remap.clone();
        let lock_timeout_ms =
            u32::try_from(self.options.lock_timeout.as_millis()).unwrap_or(u32::MAX);

        let mut late_op = op.clone();
        let max_operation = self.options.max_operation;
        let late_driver = Arc::clone(&driver);
        let late_engine = Arc::clone(&engine);
        let work = move || -> Result<EngineOutput, EngineError> {
            match action {
                Action::Lock => driver.lock_process(pid, lock_timeout_ms)?,
                Action::Checkpoint => return engine.checkpoint(&op),
                Action::Restore => return engine.restore(&op, &remap),
                Action::Unlock => driver.unlock_process(pid)?,
            }
            Ok(EngineOutput::default())
        };
        let job = Job::new(pid, work);
        if !undo_late {
            return job;
        }
        job.on_late(move |result| {
            if result.is_ok() {
                // The original deadline has passed; the undo gets its own.
                late_op.deadline = Instant::now() + max_operation;
                undo_late_transition(action, &late_driver, late_engine.as_ref(), &late_op);
            }
        })
    }

    /// Records the result of one call and returns the failure, if any.
    fn settle(
        &self,
        action: Action,
        t: &mut Tracked,
        finished: Finished<Result<EngineOutput, EngineError>>,
        budget: Option<Instant>,
    ) -> Option<StepFailure> {
        let pid = t.pid;
        let set_timing = |t: &mut Tracked, elapsed| {
            let slot = match action {
                Action::Lock => &mut t.timings.lock_ms,
                Action::Checkpoint => &mut t.timings.checkpoint_ms,
                Action::Restore => &mut t.timings.restore_ms,
                Action::Unlock => &mut t.timings.unlock_ms,
            };
            *slot = Some(ms(elapsed));
        };
        let cause = match finished {
            Finished::Done {
                value: Ok(output),
                elapsed,
            } => {
                set_timing(t, elapsed);
                t.state = Some(action.target());
                t.touched = true;
                if matches!(action, Action::Checkpoint | Action::Restore) {
                    t.output = output;
                }
                tracing::debug!(
                    pid,
                    phase = action.label(),
                    elapsed_ms = ms(elapsed),
                    "CUDA transition done"
                );
                return None;
            }
            Finished::Done {
                value: Err(error),
                elapsed,
            } => {
                set_timing(t, elapsed);
                let before = t.state;
                if !state_unchanged_after(action, &error) {
                    t.state = self.query_state(pid, budget);
                    // After a refusal the queried state is the one the process
                    // already had (someone else may hold a lock): not ours to undo.
                    t.touched |= t.state != before && !is_refusal(&error);
                }
                tracing::warn!(
                    pid,
                    phase = action.label(),
                    %error,
                    state_after = ?t.state,
                    "CUDA transition failed"
                );
                Cause::Engine(error)
            }
            Finished::TimedOut { waited } => {
                t.state = None;
                t.touched = true;
                Cause::Timeout {
                    call: action.call_name(self.engine.name()),
                    pid,
                    limit_ms: waited.as_millis() as u64,
                }
            }
            Finished::Panicked { message } => {
                t.state = self.query_state(pid, budget);
                t.touched = true;
                Cause::Thread {
                    call: action.call_name(self.engine.name()),
                    pid,
                    reason: format!("it panicked: {message}"),
                }
            }
            Finished::NotStarted { reason } => Cause::Thread {
                call: action.call_name(self.engine.name()),
                pid,
                reason,
            },
        };
        Some(StepFailure { pid, action, cause })
    }

    /// Asks the driver after a failed call. `None` if that fails too.
    fn query_state(&self, pid: i32, budget: Option<Instant>) -> Option<ProcessState> {
        let deadline = self.op_deadline(budget)?;
        let driver = Arc::clone(&self.driver);
        match watchdog::run_one(
            "state",
            Job::new(pid, move || driver.process_state(pid)),
            deadline,
        ) {
            Finished::Done {
                value: Ok(state), ..
            } => Some(state),
            Finished::Done {
                value: Err(error), ..
            } => {
                tracing::warn!(pid, %error, "cannot query CUDA process state after a failure");
                None
            }
            Finished::TimedOut { waited } => {
                tracing::warn!(
                    pid,
                    waited_ms = waited.as_millis() as u64,
                    "CUDA process state query did not finish in time"
                );
                None
            }
            Finished::NotStarted { reason } | Finished::Panicked { message: reason } => {
                tracing::warn!(pid, %reason, "CUDA process state query did not run");
                None
            }
        }
    }

    /// Restores CHECKPOINTED processes and unlocks LOCKED ones, so that the
    /// workload runs again. Returns what could not be undone.
    pub(crate) fn roll_back(&self, tracked: &mut [Tracked]) -> Vec<FailedStep> {
        let started = Instant::now();
        let parallel = self.options.concurrency.is_parallel();
        let checkpointed = touched_in(tracked, ProcessState::Checkpointed);
        let mode = StepMode {
            parallel,
            stop_on_failure: false,
            undo_late: true,
        };
        let mut failures = self.step(Action::Restore, tracked, &checkpointed, mode, None);

        let locked = touched_in(tracked, ProcessState::Locked);
        let mode = StepMode {
            parallel: false,
            stop_on_failure: false,
            undo_late: false,
        };
        failures.extend(self.step(Action::Unlock, tracked, &locked, mode, None));

        tracing::info!(
            restored = checkpointed.len(),
            unlocked = locked.len(),
            failed = failures.len(),
            elapsed_ms = ms(started.elapsed()),
            "CUDA rollback finished"
        );
        failures
            .into_iter()
            .map(StepFailure::into_failed_step)
            .collect()
    }
}

pub(crate) fn indices_in(tracked: &[Tracked], state: ProcessState) -> Vec<usize> {
    tracked
        .iter()
        .enumerate()
        .filter(|(_, t)| t.state == Some(state))
        .map(|(i, _)| i)
        .collect()
}

/// Like [`indices_in`], limited to processes gpusnap changed: rollback must
/// not undo someone else's lock.
fn touched_in(tracked: &[Tracked], state: ProcessState) -> Vec<usize> {
    indices_in(tracked, state)
        .into_iter()
        .filter(|&i| tracked[i].touched)
        .collect()
}

/// Failures that provably changed nothing, so no state query is needed: the
/// call never reached the driver, or a lock timed out (documented to leave
/// the target RUNNING).
fn state_unchanged_after(action: Action, error: &EngineError) -> bool {
    match error {
        EngineError::Unavailable { .. } | EngineError::Driver(CallError::Unavailable { .. }) => {
            true
        }
        EngineError::Driver(CallError::Cuda { error, .. }) => {
            action == Action::Lock && error.code == code::NOT_READY
        }
        EngineError::Transfer { .. } => false,
    }
}

/// Codes with which the driver refuses a call up front (state or argument
/// checks), changing nothing.
fn is_refusal(error: &EngineError) -> bool {
    matches!(
        error.cuda_code(),
        Some(
            code::ILLEGAL_STATE | code::INVALID_VALUE | code::NOT_INITIALIZED | code::NOT_SUPPORTED
        )
    )
}

/// Runs on an abandoned watchdog thread when a transition completed after the
/// orchestrator gave up on it and rolled back: put the process back to running.
fn undo_late_transition(
    action: Action,
    driver: &Driver,
    engine: &dyn StorageEngine,
    op: &EngineOp,
) {
    let pid = op.pid;
    let result = match action {
        Action::Lock | Action::Restore => driver.unlock_process(pid).map_err(EngineError::from),
        Action::Checkpoint => engine
            .restore(op, &[])
            .and_then(|_| driver.unlock_process(pid).map_err(EngineError::from)),
        Action::Unlock => return,
    };
    match result {
        Ok(()) => tracing::warn!(
            pid,
            late = action.label(),
            "undid a transition that finished after its deadline"
        ),
        Err(error) => tracing::error!(
            pid,
            late = action.label(),
            %error,
            "could not undo a transition that finished after its deadline"
        ),
    }
}
