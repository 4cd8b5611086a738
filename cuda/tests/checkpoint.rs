//! The checkpoint sequence and every rollback path, observed through the fake
//! driver's state files and call log.

mod common;

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use gpusnap_cuda::driver::{code, ProcessState};
use gpusnap_cuda::orchestrate::{
    Cause, CheckpointReport, Concurrency, Orchestrator, OrchestratorOptions, Outcome, Phase,
};

const PIDS: [i32; 3] = [101, 102, 103];

fn orchestrator(env: &Env) -> Orchestrator {
    orchestrator_with(env, options())
}

fn orchestrator_with(env: &Env, options: OrchestratorOptions) -> Orchestrator {
    Orchestrator::driver_managed(Arc::clone(&env.driver), options)
}

fn running_env() -> Env {
    let env = env();
    env.register(&PIDS, FakeState::Running);
    env
}

fn ok_dump() -> Result<(), std::io::Error> {
    Ok(())
}

#[test]
fn leave_running_locks_checkpoints_dumps_restores_and_unlocks() {
    let env = running_env();
    let mut procs = processes(&PIDS);
    procs[0].container_pid = Some(1);
    procs[0].gpus = vec![device(&env, H200_A)];
    procs[1].device_memory_bytes = Some(8 << 30);

    let seen_in_dump = Cell::new(Vec::new());
    let report = orchestrator(&env)
        .checkpoint(&procs, true, || {
            seen_in_dump.set(env.states(&PIDS));
            ok_dump()
        })
        .expect("checkpoint succeeds");

    assert_eq!(
        seen_in_dump.take(),
        vec![FakeState::Checkpointed; 3],
        "dump must see every process checkpointed"
    );
    assert_eq!(env.states(&PIDS), vec![FakeState::Running; 3]);

    let log = env.call_log();
    assert_eq!(
        &log[..3],
        ["lock 101", "lock 102", "lock 103"],
        "locks in order: {log:?}"
    );
    let mut checkpoints = log[3..6].to_vec();
    checkpoints.sort();
    assert_eq!(
        checkpoints,
        ["checkpoint 101", "checkpoint 102", "checkpoint 103"]
    );
    let mut restores = log[6..9].to_vec();
    restores.sort();
    assert_eq!(restores, ["restore 101", "restore 102", "restore 103"]);
    assert_eq!(&log[9..], ["unlock 101", "unlock 102", "unlock 103"]);
    let calls = env.fake.calls().unwrap();
    assert!(calls.iter().all(|c| c.code == 0), "{calls:?}");
    let lock = calls.iter().find(|c| c.op == "lock").unwrap();
    assert_eq!(
        lock.args["timeout_ms"], "2000",
        "configured lock timeout reaches the driver"
    );

    assert!(report.left_running);
    assert_eq!(report.engine, "driver-managed");
    assert_eq!(report.driver_version.0, 13000);
    assert_eq!(report.processes.len(), 3);
    let first = &report.processes[0];
    assert_eq!((first.host_pid, first.container_pid), (101, Some(1)));
    assert_eq!(first.gpus[0].uuid.to_string(), H200_A);
    assert_eq!(first.engine, "driver-managed");
    assert_eq!(first.bytes_moved, 0, "unknown stays 0");
    assert_eq!(
        report.processes[1].bytes_moved,
        8 << 30,
        "known device memory is recorded"
    );
    for p in &report.processes {
        let t = &p.timings;
        assert!(
            t.lock_ms.is_some()
                && t.checkpoint_ms.is_some()
                && t.restore_ms.is_some()
                && t.unlock_ms.is_some()
        );
    }
    assert!(report.timings.resume_ms.is_some());
    assert!(report.timings.total_ms >= report.timings.dump_ms);

    let json = serde_json::to_string(&report).unwrap();
    let back: CheckpointReport = serde_json::from_str(&json).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
    assert_eq!(back.processes[1].bytes_moved, 8 << 30);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["processes"][0]["gpus"][0]["uuid"], H200_A);
    assert!(value["processes"][0]["timings"]["lock_ms"].is_number());
}

#[test]
fn without_leave_running_processes_stay_checkpointed() {
    let env = running_env();
    let report = orchestrator(&env)
        .checkpoint(&processes(&PIDS), false, ok_dump)
        .unwrap();
    assert_eq!(env.states(&PIDS), vec![FakeState::Checkpointed; 3]);
    assert!(!report.left_running);
    assert!(report.timings.resume_ms.is_none());
    assert!(env
        .call_log()
        .iter()
        .all(|c| !c.starts_with("restore") && !c.starts_with("unlock")));
}

#[test]
fn sequential_mode_checkpoints_in_order() {
    let env = running_env();
    let options = OrchestratorOptions {
        concurrency: Concurrency::Sequential,
        ..options()
    };
    orchestrator_with(&env, options)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap();
    assert_eq!(
        env.call_log(),
        [
            "lock 101",
            "lock 102",
            "lock 103",
            "checkpoint 101",
            "checkpoint 102",
            "checkpoint 103",
            "restore 101",
            "restore 102",
            "restore 103",
            "unlock 101",
            "unlock 102",
            "unlock 103"
        ]
    );
}

#[test]
fn lock_failure_on_the_second_pid_unlocks_the_first() {
    let env = running_env();
    env.inject(102, FakeOp::Lock, Fault::fail(code::ILLEGAL_STATE));
    let dumped = Cell::new(false);
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, || {
            dumped.set(true);
            ok_dump()
        })
        .unwrap_err();

    assert!(!dumped.get(), "no dump after a failed lock");
    assert_eq!(env.states(&PIDS), vec![FakeState::Running; 3]);
    assert_eq!(
        env.call_log(),
        ["lock 101", "lock 102", "unlock 101"],
        "pid 103 is never touched"
    );
    assert_eq!(err.outcome, Outcome::RolledBack);
    assert_eq!(err.phase, Phase::Lock);
    assert_eq!(err.pid, Some(102));
    assert_eq!(err.cuda_code(), Some(code::ILLEGAL_STATE));
    assert!(err.rollback_failures.is_empty());
    let text = err.to_string();
    assert!(
        text.starts_with("CUDA checkpoint failed during lock of pid 102: "),
        "{text}"
    );
    assert!(text.contains("CUDA_ERROR_ILLEGAL_STATE (401)"), "{text}");
    assert!(
        text.ends_with(
            "rolled back: every CUDA process gpusnap changed is running and unlocked again"
        ),
        "{text}"
    );
}

#[test]
fn lock_failure_on_the_first_pid_is_before_mutation() {
    let env = running_env();
    env.inject(101, FakeOp::Lock, Fault::fail(code::NOT_SUPPORTED));
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert_eq!(env.call_log(), ["lock 101"]);
    assert_eq!(env.states(&PIDS), vec![FakeState::Running; 3]);
    assert!(
        err.to_string()
            .contains("before mutation: no CUDA process was changed"),
        "{err}"
    );
}

#[test]
fn lock_timeout_reports_not_ready_and_rolls_back() {
    let env = running_env();
    // pid 102 has 2 s of GPU work in flight; the lock gives up after 100 ms.
    env.inject(102, FakeOp::Lock, Fault::busy(Duration::from_secs(2)));
    let options = OrchestratorOptions {
        lock_timeout: Duration::from_millis(100),
        ..options()
    };
    let err = orchestrator_with(&env, options)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.cuda_code(), Some(code::NOT_READY));
    assert_eq!(err.outcome, Outcome::RolledBack);
    assert_eq!(env.states(&PIDS), vec![FakeState::Running; 3]);
    // NOT_READY from a lock is documented to leave the process running: no state query.
    assert_eq!(env.call_log(), ["lock 101", "lock 102", "unlock 101"]);
    assert!(
        err.to_string().contains("CUDA_ERROR_NOT_READY (600)"),
        "{err}"
    );
    assert!(
        err.to_string().contains("waited 100 ms")
            && err.to_string().contains("raise cuda.lock_timeout_ms"),
        "the lock timeout does not say what to raise: {err}"
    );
}

#[test]
fn checkpoint_failure_restores_the_others_and_unlocks_all() {
    let env = running_env();
    env.inject(102, FakeOp::Checkpoint, Fault::fail(code::OUT_OF_MEMORY));
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();

    assert_eq!(env.states(&PIDS), vec![FakeState::Running; 3]);
    assert_eq!(err.outcome, Outcome::RolledBack);
    assert_eq!(err.phase, Phase::Checkpoint);
    assert_eq!(err.pid, Some(102));
    let log = env.call_log();
    assert!(
        log.contains(&"restore 101".to_owned()) && log.contains(&"restore 103".to_owned()),
        "{log:?}"
    );
    assert!(
        !log.contains(&"restore 102".to_owned()),
        "102 was never checkpointed: {log:?}"
    );
    let unlocks: Vec<&String> = log.iter().filter(|c| c.starts_with("unlock")).collect();
    assert_eq!(unlocks, ["unlock 101", "unlock 102", "unlock 103"]);
    let text = err.to_string();
    assert!(text.contains("during checkpoint of pid 102"), "{text}");
    assert!(text.contains("CUDA_ERROR_OUT_OF_MEMORY (2)"), "{text}");
    assert!(text.contains("rolled back"), "{text}");
}

#[test]
fn checkpoint_leaving_a_process_failed_is_outcome_unknown() {
    let env = running_env();
    env.inject(
        102,
        FakeOp::Checkpoint,
        Fault::fail(code::UNKNOWN).then(FakeState::Failed),
    );
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();

    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert_eq!(
        env.states(&PIDS),
        vec![FakeState::Running, FakeState::Failed, FakeState::Running]
    );
    let failed = err.processes.iter().find(|p| p.pid == 102).unwrap();
    assert_eq!(failed.state, Some(ProcessState::Failed));
    let text = err.to_string();
    assert!(text.contains("outcome unknown"), "{text}");
    assert!(text.contains("pid 102: failed"), "{text}");
    assert!(text.contains("pid 101: running"), "{text}");
}

#[test]
fn unreadable_state_after_a_failure_is_outcome_unknown() {
    let env = running_env();
    env.inject(102, FakeOp::Checkpoint, Fault::fail(code::UNKNOWN));
    env.inject(102, FakeOp::GetState, Fault::fail(code::OPERATING_SYSTEM));
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert_eq!(
        err.processes.iter().find(|p| p.pid == 102).unwrap().state,
        None
    );
    // The others are still rolled back; 102 is left alone because its state is unknown.
    assert_eq!(env.state(101), FakeState::Running);
    assert_eq!(env.state(103), FakeState::Running);
    assert!(!env.call_log().contains(&"unlock 102".to_owned()));
    assert!(err.to_string().contains("pid 102: unknown"), "{err}");
}

#[test]
fn dump_failure_restores_and_unlocks_everything() {
    let env = running_env();
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), false, || {
            Err(std::io::Error::other("criu dump exited with 1"))
        })
        .unwrap_err();

    assert_eq!(env.states(&PIDS), vec![FakeState::Running; 3]);
    assert_eq!(err.outcome, Outcome::RolledBack);
    assert_eq!(err.phase, Phase::Dump);
    assert_eq!(err.pid, None);
    assert!(matches!(*err.cause, Cause::Dump(_)));
    let text = err.to_string();
    assert!(
        text.starts_with(
            "CUDA checkpoint failed during CRIU dump: CRIU dump failed: criu dump exited with 1;"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(
            "rolled back: every CUDA process gpusnap changed is running and unlocked again"
        ),
        "{text}"
    );
}

#[test]
fn failed_rollback_restore_is_outcome_unknown_and_listed() {
    let env = running_env();
    env.inject(101, FakeOp::Restore, Fault::fail(code::OUT_OF_MEMORY));
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, || {
            Err(std::io::Error::other("criu dump failed"))
        })
        .unwrap_err();

    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert_eq!(
        env.states(&PIDS),
        vec![
            FakeState::Checkpointed,
            FakeState::Running,
            FakeState::Running
        ]
    );
    assert_eq!(err.rollback_failures.len(), 1);
    assert_eq!(
        (
            err.rollback_failures[0].pid,
            err.rollback_failures[0].action.as_str()
        ),
        (101, "restore")
    );
    let text = err.to_string();
    assert!(text.contains("pid 101: checkpointed"), "{text}");
    assert!(text.contains("rollback failed: restore pid 101"), "{text}");
}

#[test]
fn restore_failure_after_the_dump_keeps_the_image_and_reports_unknown() {
    let env = running_env();
    env.inject(102, FakeOp::Restore, Fault::fail(code::OUT_OF_MEMORY));
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();

    assert_eq!(err.phase, Phase::Resume);
    assert_eq!(err.pid, Some(102));
    assert!(err.dump_completed);
    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    // The others were still resumed.
    assert_eq!(
        env.states(&PIDS),
        vec![
            FakeState::Running,
            FakeState::Checkpointed,
            FakeState::Running
        ]
    );
    let text = err.to_string();
    assert!(
        text.contains("during CUDA restore after the dump of pid 102"),
        "{text}"
    );
    assert!(text.ends_with("the CRIU dump itself completed"), "{text}");
}

#[test]
fn checkpoint_watchdog_expiry_is_outcome_unknown_and_rolls_back_the_rest() {
    let env = running_env();
    env.inject(
        102,
        FakeOp::Checkpoint,
        Fault::hang(Duration::from_millis(1500)),
    );
    let options = OrchestratorOptions {
        max_operation: Duration::from_millis(300),
        ..options()
    };
    let dumped = Cell::new(false);
    let err = orchestrator_with(&env, options)
        .checkpoint(&processes(&PIDS), true, || {
            dumped.set(true);
            ok_dump()
        })
        .unwrap_err();

    assert!(!dumped.get());
    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert_eq!(err.phase, Phase::Checkpoint);
    assert_eq!(err.pid, Some(102));
    assert!(
        matches!(*err.cause, Cause::Timeout { pid: 102, .. }),
        "{:?}",
        err.cause
    );
    assert_eq!(
        err.processes.iter().find(|p| p.pid == 102).unwrap().state,
        None
    );
    assert_eq!(env.state(101), FakeState::Running);
    assert_eq!(env.state(103), FakeState::Running);
    let text = err.to_string();
    assert!(
        text.contains("driver-managed checkpoint for pid 102 did not return within"),
        "{text}"
    );
    assert!(text.contains("pid 102: unknown"), "{text}");

    // The abandoned call finishes later; its result is undone in the background.
    assert!(
        env.wait_for_call("unlock 102", Duration::from_secs(10)),
        "late checkpoint was not undone"
    );
    let log = env.call_log();
    assert!(
        log.ends_with(&["restore 102".to_owned(), "unlock 102".to_owned()]),
        "{log:?}"
    );
    assert_eq!(env.state(102), FakeState::Running);
}

#[test]
fn lock_watchdog_expiry_is_outcome_unknown_and_the_late_lock_is_undone() {
    let env = running_env();
    env.inject(101, FakeOp::Lock, Fault::hang(Duration::from_millis(800)));
    let options = OrchestratorOptions {
        max_operation: Duration::from_millis(200),
        ..options()
    };
    let err = orchestrator_with(&env, options)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert_eq!(err.phase, Phase::Lock);
    assert!(
        err.to_string()
            .contains("cuCheckpointProcessLock for pid 101 did not return within"),
        "{err}"
    );
    // The lock completes after 800 ms and is then undone in the background.
    assert!(env.wait_for_call("unlock 101", Duration::from_secs(10)));
    assert_eq!(env.call_log(), ["lock 101", "unlock 101"]);
    assert_eq!(env.states(&PIDS), vec![FakeState::Running; 3]);
}

#[test]
fn missing_checkpoint_api_is_refused_before_mutation() {
    let env = env_with(|f| f.hide_symbol("cuCheckpointProcessGetState").unwrap());
    env.register(&PIDS, FakeState::Running);
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert_eq!(err.phase, Phase::Admission);
    assert!(env.call_log().is_empty());
    let text = err.to_string();
    assert!(text.contains("cuCheckpointProcessGetState"), "{text}");
    assert!(text.contains("r570"), "{text}");
}

#[test]
fn duplicate_pids_are_refused_before_mutation() {
    let env = running_env();
    let err = orchestrator(&env)
        .checkpoint(&processes(&[101, 101]), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert!(err.to_string().contains("pid 101 is listed twice"), "{err}");
    assert!(env.call_log().is_empty());
}

#[test]
fn a_lock_held_by_someone_else_is_not_undone() {
    let env = running_env();
    // 102 was locked by another tool; our lock is refused and we must not unlock it.
    env.fake.set_state(102, FakeState::Locked).unwrap();
    let err = orchestrator(&env)
        .checkpoint(&processes(&PIDS), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.cuda_code(), Some(code::ILLEGAL_STATE));
    assert_eq!(err.outcome, Outcome::RolledBack);
    assert_eq!(
        env.states(&PIDS),
        vec![FakeState::Running, FakeState::Locked, FakeState::Running]
    );
    assert_eq!(env.call_log(), ["lock 101", "lock 102", "unlock 101"]);
}

#[test]
fn no_cuda_processes_still_runs_the_dump() {
    let env = env();
    let dumped = Cell::new(false);
    let report = orchestrator(&env)
        .checkpoint(&[], true, || {
            dumped.set(true);
            ok_dump()
        })
        .unwrap();
    assert!(dumped.get());
    assert!(report.processes.is_empty());
    assert!(env.call_log().is_empty());
}

#[test]
fn the_caller_itself_is_refused_before_mutation() {
    let env = env();
    let me = std::process::id() as i32;
    env.register(&[me], FakeState::Running);
    let err = orchestrator(&env)
        .checkpoint(&processes(&[me]), true, ok_dump)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert!(
        err.to_string().contains("gpusnap cannot checkpoint itself"),
        "{err}"
    );
    assert!(env.call_log().is_empty());
}
