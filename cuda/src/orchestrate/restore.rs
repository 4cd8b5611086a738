//! The restore sequence.
//!
//! There is no rollback on this side: the original container is gone, so a
//! failure leaves the restored processes as they are and the caller kills
//! them. The outcome is `BeforeMutation` only when no process was touched.

use std::collections::BTreeSet;
use std::time::Instant;

use crate::driver::{GpuRemap, ProcessState};

use super::error::{Cause, Operation, OrchestrateError, Phase};
use super::gpu_map::GpuMap;
use super::record::{ms, ProcessRecord, RestoreReport, RestoreTimings, RestoredProcess};
use super::tracker::{classify, states, Action, StepFailure, StepMode, Tracked};
use super::Orchestrator;

/// A checkpointed process and its host pid after CRIU restored it.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreTarget {
    pub record: ProcessRecord,
    pub host_pid: i32,
}

impl Orchestrator {
    /// Restores each target onto its GPUs (remapped by `gpu_map`), then unlocks all.
    pub fn restore(
        &self,
        targets: &[RestoreTarget],
        gpu_map: &GpuMap,
    ) -> Result<RestoreReport, OrchestrateError> {
        let started = Instant::now();
        let budget = started + self.options.restore_budget;
        self.restore_until(
            targets,
            gpu_map,
            budget,
            RestoreTimings::default(),
            started,
            true,
        )
    }

    /// Restores each target's device memory and leaves it LOCKED (its CUDA calls block): for a
    /// caller that must not see the workload run yet. [`Orchestrator::unlock`] finishes it.
    pub fn restore_locked(
        &self,
        targets: &[RestoreTarget],
        gpu_map: &GpuMap,
    ) -> Result<RestoreReport, OrchestrateError> {
        let started = Instant::now();
        let budget = started + self.options.restore_budget;
        self.restore_until(
            targets,
            gpu_map,
            budget,
            RestoreTimings::default(),
            started,
            false,
        )
    }

    /// Unlocks processes left LOCKED by [`Orchestrator::restore_locked`].
    pub fn unlock(&self, host_pids: &[i32]) -> Result<(), OrchestrateError> {
        let started = Instant::now();
        let budget = started + self.options.restore_budget;
        let mut tracked: Vec<Tracked> = host_pids
            .iter()
            .map(|&pid| Tracked::new(pid, ProcessState::Locked, Vec::new()))
            .collect();
        let all: Vec<usize> = (0..tracked.len()).collect();
        let mode = StepMode {
            parallel: false,
            stop_on_failure: false,
            undo_late: false,
        };
        let failures = self.step(Action::Unlock, &mut tracked, &all, mode, Some(budget));
        if failures.is_empty() {
            Ok(())
        } else {
            Err(self.restore_failed(Phase::Unlock, failures, &tracked))
        }
    }

    fn restore_until(
        &self,
        targets: &[RestoreTarget],
        gpu_map: &GpuMap,
        budget: Instant,
        mut timings: RestoreTimings,
        started: Instant,
        unlock: bool,
    ) -> Result<RestoreReport, OrchestrateError> {
        let span = tracing::info_span!(
            "cuda_restore",
            engine = self.engine.name(),
            processes = targets.len()
        );
        let _entered = span.enter();
        let remaps = self.admit_restore(targets, gpu_map)?;

        let mut tracked: Vec<Tracked> = targets
            .iter()
            .zip(&remaps)
            .map(|(target, remap)| {
                let mut t = Tracked::new(
                    target.host_pid,
                    ProcessState::Checkpointed,
                    target.record.gpus.clone(),
                );
                t.remap = remap.clone();
                t.saved = target.record.engine_details.clone();
                t
            })
            .collect();
        let all: Vec<usize> = (0..tracked.len()).collect();
        let parallel = self.options.concurrency.is_parallel();

        let phase_start = Instant::now();
        let mode = StepMode {
            parallel,
            stop_on_failure: true,
            undo_late: false,
        };
        let failures = self.step(Action::Restore, &mut tracked, &all, mode, Some(budget));
        timings.restore_ms = ms(phase_start.elapsed());
        if !failures.is_empty() {
            return Err(self.restore_failed(Phase::Restore, failures, &tracked));
        }

        if unlock {
            let phase_start = Instant::now();
            let mode = StepMode {
                parallel: false,
                stop_on_failure: false,
                undo_late: false,
            };
            let failures = self.step(Action::Unlock, &mut tracked, &all, mode, Some(budget));
            timings.unlock_ms = ms(phase_start.elapsed());
            if !failures.is_empty() {
                return Err(self.restore_failed(Phase::Unlock, failures, &tracked));
            }
        }

        timings.total_ms = ms(started.elapsed());
        let report = RestoreReport {
            engine: self.engine.name().to_owned(),
            driver_version: self.driver.version(),
            processes: targets
                .iter()
                .zip(tracked)
                .map(|(target, t)| RestoredProcess {
                    host_pid: target.host_pid,
                    container_pid: target.record.container_pid,
                    checkpoint_host_pid: target.record.host_pid,
                    gpu_remap: t.remap,
                    bytes_moved: t.output.bytes_moved.unwrap_or(target.record.bytes_moved),
                    timings: t.timings,
                })
                .collect(),
            timings,
        };
        tracing::info!(
            criu_restore_ms = report.timings.criu_restore_ms,
            driver_init_wait_ms = report.timings.driver_init_wait_ms,
            restore_ms = report.timings.restore_ms,
            unlock_ms = report.timings.unlock_ms,
            total_ms = report.timings.total_ms,
            "CUDA restore finished"
        );
        Ok(report)
    }

    /// Checks everything that can be checked without touching a process, and
    /// returns each target's GPU pairs.
    fn admit_restore(
        &self,
        targets: &[RestoreTarget],
        gpu_map: &GpuMap,
    ) -> Result<Vec<Vec<GpuRemap>>, OrchestrateError> {
        let refuse =
            |cause| OrchestrateError::before_mutation(Operation::Restore, Phase::Admission, cause);
        let caps = self.driver.capabilities();
        self.engine
            .admit(caps)
            .map_err(|e| refuse(Cause::Engine(e)))?;

        let visible = || {
            caps.devices
                .iter()
                .map(|d| format!("{} ({})", d.uuid, d.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut seen = BTreeSet::new();
        let mut remaps = Vec::with_capacity(targets.len());
        for target in targets {
            let record = &target.record;
            let pid = target.host_pid;
            if !seen.insert(pid) {
                return Err(refuse(Cause::Admission(format!(
                    "pid {pid} is listed twice"
                ))));
            }
            if record.engine != self.engine.name() {
                return Err(refuse(Cause::Admission(format!(
                    "pid {pid} was checkpointed with storage engine `{}`, but this restore uses `{}`",
                    record.engine,
                    self.engine.name()
                ))));
            }
            let mut remap = gpu_map.remap_for(&record.gpus);
            // Identity pairs say nothing the driver would not assume; dropping
            // them keeps `gpuPairs` NULL, which every driver accepts.
            if remap.iter().all(|p| p.old == p.new) {
                remap.clear();
            }
            if !remap.is_empty() && !caps.gpu_remap {
                return Err(refuse(Cause::Admission(format!(
                    "pid {pid} must move to other GPUs, which needs driver r580 (CUDA 13.0) or newer; \
                     this driver is {}",
                    caps.driver_version
                ))));
            }
            // Where each checkpointed GPU lands; the same chip type is required.
            for old in &record.gpus {
                let new = remap
                    .iter()
                    .find(|p| p.old == old.uuid)
                    .map_or(old.uuid, |p| p.new);
                let Some(device) = caps.device(&new) else {
                    let hint = if remap.is_empty() {
                        "; pass a GPU map to restore onto other GPUs"
                    } else {
                        ""
                    };
                    return Err(refuse(Cause::Admission(format!(
                        "pid {pid} needs GPU {new} (checkpointed on {} {}), which this host does not \
                         have (visible: {}){hint}",
                        old.name,
                        old.uuid,
                        visible()
                    ))));
                };
                if device.name != old.name {
                    return Err(refuse(Cause::Admission(format!(
                        "pid {pid} was checkpointed on a {} and cannot be restored onto {} ({}); \
                         the driver needs the same GPU type",
                        old.name, device.name, device.uuid
                    ))));
                }
            }
            for pair in &remap {
                if caps.device(&pair.new).is_none() {
                    return Err(refuse(Cause::Admission(format!(
                        "GPU map target {} for pid {pid} is not on this host (visible: {})",
                        pair.new,
                        visible()
                    ))));
                }
            }
            remaps.push(remap);
        }
        Ok(remaps)
    }

    fn restore_failed(
        &self,
        phase: Phase,
        failures: Vec<StepFailure>,
        tracked: &[Tracked],
    ) -> OrchestrateError {
        let mut failures = failures.into_iter();
        let first = failures
            .next()
            .expect("restore_failed is called with at least one failure");
        let err = OrchestrateError {
            operation: Operation::Restore,
            phase,
            pid: Some(first.pid),
            outcome: classify(tracked, ProcessState::Checkpointed),
            cause: Box::new(first.cause),
            processes: states(tracked),
            rollback_failures: Vec::new(),
            other_failures: failures.map(StepFailure::into_failed_step).collect(),
            dump_completed: false,
        };
        tracing::error!(outcome = %err.outcome, error = %err, "CUDA restore failed");
        err
    }
}
