//! The checkpoint sequence.

use std::collections::BTreeSet;
use std::time::Instant;

use crate::discovery::CudaProcess;
use crate::driver::ProcessState;

use super::error::{BoxError, Cause, Operation, OrchestrateError, Phase};
use super::record::{ms, CheckpointReport, CheckpointTimings, ProcessRecord};
use super::tracker::{classify, indices_in, states, Action, StepFailure, StepMode, Tracked};
use super::Orchestrator;

impl Orchestrator {
    /// Lock all `processes` (in order) → checkpoint all → `dump` (the caller's
    /// CRIU dump) → if `leave_running`, restore all and unlock all.
    ///
    /// Without `leave_running` the processes are left CHECKPOINTED, as CRIU
    /// expects when it kills the tree after the dump.
    ///
    /// Any failure before the dump completed rolls back: checkpointed
    /// processes are restored and locked ones unlocked, and the error's
    /// [`super::Outcome`] says whether that worked.
    pub fn checkpoint<F, E>(
        &self,
        processes: &[CudaProcess],
        leave_running: bool,
        dump: F,
    ) -> Result<CheckpointReport, OrchestrateError>
    where
        F: FnOnce() -> Result<(), E>,
        E: Into<BoxError>,
    {
        let started = Instant::now();
        let span = tracing::info_span!(
            "cuda_checkpoint",
            engine = self.engine.name(),
            processes = processes.len(),
            leave_running
        );
        let _entered = span.enter();
        self.admit_checkpoint(processes)?;

        let mut tracked: Vec<Tracked> = processes
            .iter()
            .map(|p| Tracked::new(p.host_pid, ProcessState::Running, p.gpus.clone()))
            .collect();
        let all: Vec<usize> = (0..tracked.len()).collect();
        let parallel = self.options.concurrency.is_parallel();
        let mut timings = CheckpointTimings::default();

        // Locks go in order and stop at the first failure: there is no point
        // in pausing more of a workload that is about to be resumed.
        let phase_start = Instant::now();
        let lock_mode = StepMode {
            parallel: false,
            stop_on_failure: true,
            undo_late: true,
        };
        let failures = self.step(Action::Lock, &mut tracked, &all, lock_mode, None);
        timings.lock_ms = ms(phase_start.elapsed());
        if !failures.is_empty() {
            return Err(self.abort(Phase::Lock, failures, &mut tracked));
        }

        let phase_start = Instant::now();
        let checkpoint_mode = StepMode {
            parallel,
            stop_on_failure: true,
            undo_late: true,
        };
        let failures = self.step(
            Action::Checkpoint,
            &mut tracked,
            &all,
            checkpoint_mode,
            None,
        );
        timings.checkpoint_ms = ms(phase_start.elapsed());
        if !failures.is_empty() {
            return Err(self.abort(Phase::Checkpoint, failures, &mut tracked));
        }

        let phase_start = Instant::now();
        let dumped = dump();
        timings.dump_ms = ms(phase_start.elapsed());
        tracing::info!(
            dump_ms = timings.dump_ms,
            ok = dumped.is_ok(),
            "CRIU dump callback returned"
        );
        if let Err(error) = dumped {
            let failure = StepFailure {
                pid: 0,
                action: Action::Checkpoint,
                cause: Cause::Dump(error.into()),
            };
            let mut err = self.abort(Phase::Dump, vec![failure], &mut tracked);
            err.pid = None;
            return Err(err);
        }

        if leave_running {
            let phase_start = Instant::now();
            self.resume_after_dump(&mut tracked, parallel)?;
            timings.resume_ms = Some(ms(phase_start.elapsed()));
        }

        timings.total_ms = ms(started.elapsed());
        let version = self.driver.version();
        let report = CheckpointReport {
            engine: self.engine.name().to_owned(),
            driver_version: version,
            left_running: leave_running,
            processes: processes
                .iter()
                .zip(tracked)
                .map(|(p, t)| ProcessRecord {
                    host_pid: p.host_pid,
                    container_pid: p.container_pid,
                    restore_tid: p.restore_tid,
                    gpus: p.gpus.clone(),
                    driver_version: version,
                    engine: self.engine.name().to_owned(),
                    bytes_moved: t.output.bytes_moved.or(p.device_memory_bytes).unwrap_or(0),
                    timings: t.timings,
                    engine_details: t.output.details,
                })
                .collect(),
            timings,
        };
        tracing::info!(
            lock_ms = report.timings.lock_ms,
            checkpoint_ms = report.timings.checkpoint_ms,
            dump_ms = report.timings.dump_ms,
            resume_ms = report.timings.resume_ms,
            total_ms = report.timings.total_ms,
            "CUDA checkpoint finished"
        );
        Ok(report)
    }

    fn admit_checkpoint(&self, processes: &[CudaProcess]) -> Result<(), OrchestrateError> {
        let refuse = |cause| {
            Err(OrchestrateError::before_mutation(
                Operation::Checkpoint,
                Phase::Admission,
                cause,
            ))
        };
        if processes.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.engine.admit(self.driver.capabilities()) {
            return refuse(Cause::Engine(e));
        }
        let mut seen = BTreeSet::new();
        for p in processes {
            if p.host_pid <= 0 {
                return refuse(Cause::Admission(format!("invalid pid {}", p.host_pid)));
            }
            if p.host_pid == std::process::id() as i32 {
                return refuse(Cause::Admission(format!(
                    "pid {} is this process; gpusnap cannot checkpoint itself",
                    p.host_pid
                )));
            }
            if !seen.insert(p.host_pid) {
                return refuse(Cause::Admission(format!(
                    "pid {} is listed twice",
                    p.host_pid
                )));
            }
        }
        Ok(())
    }

    /// Leave-running: restore all, then unlock all that are locked, even if
    /// some restores failed (a paused process helps nobody).
    fn resume_after_dump(
        &self,
        tracked: &mut [Tracked],
        parallel: bool,
    ) -> Result<(), OrchestrateError> {
        let all: Vec<usize> = (0..tracked.len()).collect();
        let restore_mode = StepMode {
            parallel,
            stop_on_failure: false,
            undo_late: true,
        };
        let restore_failures = self.step(Action::Restore, tracked, &all, restore_mode, None);
        let locked = indices_in(tracked, ProcessState::Locked);
        let unlock_mode = StepMode {
            parallel: false,
            stop_on_failure: false,
            undo_late: false,
        };
        let unlock_failures = self.step(Action::Unlock, tracked, &locked, unlock_mode, None);

        if tracked
            .iter()
            .all(|t| t.state == Some(ProcessState::Running))
        {
            if !restore_failures.is_empty() || !unlock_failures.is_empty() {
                tracing::warn!("resume reported errors, but every CUDA process is running");
            }
            return Ok(());
        }
        let phase = if restore_failures.is_empty() {
            Phase::ResumeUnlock
        } else {
            Phase::Resume
        };
        let mut failures = restore_failures.into_iter().chain(unlock_failures);
        let Some(first) = failures.next() else {
            // Not all running, yet nothing failed: cannot happen, but say so.
            return Err(OrchestrateError {
                operation: Operation::Checkpoint,
                phase: Phase::ResumeUnlock,
                pid: None,
                outcome: super::Outcome::OutcomeUnknown,
                cause: Box::new(Cause::Admission(
                    "processes did not return to running".into(),
                )),
                processes: states(tracked),
                rollback_failures: Vec::new(),
                other_failures: Vec::new(),
                dump_completed: true,
            });
        };
        let err = OrchestrateError {
            operation: Operation::Checkpoint,
            phase,
            pid: Some(first.pid),
            outcome: super::Outcome::OutcomeUnknown,
            cause: Box::new(first.cause),
            processes: states(tracked),
            rollback_failures: Vec::new(),
            other_failures: failures.map(StepFailure::into_failed_step).collect(),
            dump_completed: true,
        };
        tracing::error!(error = %err, "CUDA resume after dump failed");
        Err(err)
    }

    /// Rolls back after a failure before or during the dump.
    fn abort(
        &self,
        phase: Phase,
        failures: Vec<StepFailure>,
        tracked: &mut [Tracked],
    ) -> OrchestrateError {
        let mut failures = failures.into_iter();
        let first = failures
            .next()
            .expect("abort is called with at least one failure");
        tracing::error!(%phase, pid = first.pid, cause = %first.cause, "CUDA checkpoint failed; rolling back");
        let rollback_failures = self.roll_back(tracked);
        let err = OrchestrateError {
            operation: Operation::Checkpoint,
            phase,
            pid: Some(first.pid),
            outcome: classify(tracked, ProcessState::Running),
            cause: Box::new(first.cause),
            processes: states(tracked),
            rollback_failures,
            other_failures: failures.map(StepFailure::into_failed_step).collect(),
            dump_completed: false,
        };
        tracing::error!(outcome = %err.outcome, error = %err, "CUDA checkpoint aborted");
        err
    }
}
