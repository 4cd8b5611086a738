//! The restore sequence: identity and remapped GPUs, admission checks,
//! failures, the budget, and the CRIU-overlapped entry point.

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use gpusnap_cuda::discovery;
use gpusnap_cuda::driver::{code, DriverVersion, ProcessState};
use gpusnap_cuda::orchestrate::{
    Cause, GpuMap, Orchestrator, OrchestratorOptions, Outcome, Phase, PhaseTimings, ProcessRecord,
    RestoreReport, RestoreTarget,
};

fn record(env: &Env, host_pid: i32, container_pid: Option<i32>, gpus: &[&str]) -> ProcessRecord {
    ProcessRecord {
        host_pid,
        container_pid,
        restore_tid: Some(host_pid),
        gpus: gpus.iter().map(|u| device(env, u)).collect(),
        driver_version: DriverVersion(13000),
        engine: "driver-managed".into(),
        bytes_moved: 0,
        timings: PhaseTimings::default(),
        engine_details: None,
    }
}

fn target(env: &Env, pid: i32, gpus: &[&str]) -> RestoreTarget {
    RestoreTarget {
        record: record(env, pid, None, gpus),
        host_pid: pid,
    }
}

fn orchestrator(env: &Env) -> Orchestrator {
    Orchestrator::driver_managed(Arc::clone(&env.driver), options())
}

#[test]
fn restores_onto_the_same_gpus_then_unlocks() {
    let env = env_with(three_devices);
    env.register(&[201, 202], FakeState::Checkpointed);
    let targets = [target(&env, 201, &[H200_A]), target(&env, 202, &[H200_B])];
    let report = orchestrator(&env)
        .restore(&targets, &GpuMap::new())
        .expect("restore succeeds");

    assert_eq!(env.states(&[201, 202]), vec![FakeState::Running; 2]);
    let log = env.call_log();
    let mut restores = log[..2].to_vec();
    restores.sort();
    assert_eq!(restores, ["restore 201", "restore 202"]);
    assert_eq!(&log[2..], ["unlock 201", "unlock 202"]);
    let calls = env.fake.calls().unwrap();
    assert!(
        calls
            .iter()
            .filter(|c| c.op == "restore")
            .all(|c| c.args["pairs"] == "none"),
        "{calls:?}"
    );

    assert_eq!(report.engine, "driver-managed");
    assert!(report.processes.iter().all(|p| p.gpu_remap.is_empty()));
    assert!(report
        .processes
        .iter()
        .all(|p| p.timings.restore_ms.is_some() && p.timings.unlock_ms.is_some()));
    let json = serde_json::to_string(&report).unwrap();
    let back: RestoreReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back.processes[0].checkpoint_host_pid, 201);
}

#[test]
fn remaps_gpus_when_given_a_map() {
    let env = env_with(three_devices);
    env.register(&[201], FakeState::Checkpointed);
    let map: GpuMap = format!("{H200_A}={H200_B}").parse().unwrap();
    let report = orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &map)
        .unwrap();

    let calls = env.fake.calls().unwrap();
    let restore = calls.iter().find(|c| c.op == "restore").unwrap();
    assert_eq!(restore.args["pairs"], format!("{H200_A}:{H200_B}"));
    let pairs = &report.processes[0].gpu_remap;
    assert_eq!(pairs.len(), 1);
    assert_eq!(
        (pairs[0].old.to_string(), pairs[0].new.to_string()),
        (H200_A.to_owned(), H200_B.to_owned())
    );
    assert_eq!(env.state(201), FakeState::Running);
}

#[test]
fn identity_pairs_are_not_sent() {
    let env = env_with(three_devices);
    env.register(&[201], FakeState::Checkpointed);
    // The map moves a GPU this process did not use.
    let map: GpuMap = format!("{H200_B}={H200_A}").parse().unwrap();
    let report = orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &map)
        .unwrap();
    assert!(report.processes[0].gpu_remap.is_empty());
    assert_eq!(env.fake.calls().unwrap()[0].args["pairs"], "none");
}

#[test]
fn unknown_target_gpu_is_refused_before_mutation() {
    let env = env_with(three_devices);
    env.register(&[201], FakeState::Checkpointed);
    let map: GpuMap = format!("{H200_A}=GPU-ffffffff-0000-4000-8000-000000000000")
        .parse()
        .unwrap();
    let err = orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &map)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert_eq!(err.phase, Phase::Admission);
    assert!(env.call_log().is_empty());
    assert!(
        err.to_string()
            .contains("GPU-ffffffff-0000-4000-8000-000000000000"),
        "{err}"
    );
    assert!(
        err.to_string().contains("which this host does not have"),
        "{err}"
    );
}

#[test]
fn a_missing_checkpointed_gpu_without_a_map_is_refused_with_a_hint() {
    let source = env_with(three_devices);
    let rec = record(&source, 201, None, &[H200_B]);
    let env = env(); // this host only has H200_A
    env.register(&[201], FakeState::Checkpointed);
    let err = orchestrator(&env)
        .restore(
            &[RestoreTarget {
                record: rec,
                host_pid: 201,
            }],
            &GpuMap::new(),
        )
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    let text = err.to_string();
    assert!(
        text.contains(H200_B) && text.contains("pass a GPU map"),
        "{text}"
    );
    assert!(env.call_log().is_empty());
}

#[test]
fn a_different_gpu_type_is_refused() {
    let env = env_with(three_devices);
    env.register(&[201], FakeState::Checkpointed);
    let map: GpuMap = format!("{H200_A}={L4}").parse().unwrap();
    let err = orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &map)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert!(
        err.to_string()
            .contains("checkpointed on a NVIDIA H200 and cannot be restored onto NVIDIA L4"),
        "{err}"
    );
}

#[test]
fn remapping_needs_a_13_0_driver() {
    let env = env_with(|f| {
        three_devices(f);
        f.set_driver_version(12080).unwrap();
    });
    env.register(&[201], FakeState::Checkpointed);
    let map: GpuMap = format!("{H200_A}={H200_B}").parse().unwrap();
    let err = orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &map)
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert!(
        err.to_string().contains("needs driver r580 (CUDA 13.0)"),
        "{err}"
    );
    // Without a map the same driver restores fine (NULL gpuPairs).
    orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &GpuMap::new())
        .unwrap();
    assert_eq!(env.state(201), FakeState::Running);
}

#[test]
fn a_checkpoint_from_another_engine_is_refused() {
    let env = env();
    env.register(&[201], FakeState::Checkpointed);
    let mut t = target(&env, 201, &[H200_A]);
    t.record.engine = "posix".into();
    let err = orchestrator(&env)
        .restore(&[t], &GpuMap::new())
        .unwrap_err();
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert!(
        err.to_string()
            .contains("checkpointed with storage engine `posix`"),
        "{err}"
    );
}

#[test]
fn a_refused_restore_is_before_mutation() {
    let env = env();
    // Not checkpointed: the driver refuses with ILLEGAL_STATE and nothing changes.
    env.register(&[201], FakeState::Running);
    let err = orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &GpuMap::new())
        .unwrap_err();
    assert_eq!(err.cuda_code(), Some(code::ILLEGAL_STATE));
    assert_eq!(err.outcome, Outcome::BeforeMutation);
    assert_eq!(err.phase, Phase::Restore);
    assert_eq!(env.state(201), FakeState::Running);
}

#[test]
fn a_failed_restore_of_one_process_is_outcome_unknown_and_nothing_is_unlocked() {
    let env = env();
    env.register(&[201, 202], FakeState::Checkpointed);
    env.inject(202, FakeOp::Restore, Fault::fail(code::OUT_OF_MEMORY));
    let targets = [target(&env, 201, &[H200_A]), target(&env, 202, &[H200_A])];
    let err = orchestrator(&env)
        .restore(&targets, &GpuMap::new())
        .unwrap_err();

    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert_eq!(err.pid, Some(202));
    assert_eq!(
        env.states(&[201, 202]),
        vec![FakeState::Locked, FakeState::Checkpointed]
    );
    assert!(
        env.call_log().iter().all(|c| !c.starts_with("unlock")),
        "a partial workload stays locked"
    );
    let by_pid: Vec<(i32, Option<ProcessState>)> =
        err.processes.iter().map(|p| (p.pid, p.state)).collect();
    assert_eq!(
        by_pid,
        vec![
            (201, Some(ProcessState::Locked)),
            (202, Some(ProcessState::Checkpointed))
        ]
    );
    let text = err.to_string();
    assert!(
        text.starts_with("CUDA restore failed during CUDA restore of pid 202"),
        "{text}"
    );
    assert!(text.contains("CUDA_ERROR_OUT_OF_MEMORY (2)"), "{text}");
    assert!(
        text.contains("the restored workload is not usable"),
        "{text}"
    );
}

#[test]
fn an_unlock_failure_after_restore_is_outcome_unknown() {
    let env = env();
    env.register(&[201], FakeState::Checkpointed);
    env.inject(201, FakeOp::Unlock, Fault::fail(code::UNKNOWN));
    let err = orchestrator(&env)
        .restore(&[target(&env, 201, &[H200_A])], &GpuMap::new())
        .unwrap_err();
    assert_eq!(err.phase, Phase::Unlock);
    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert_eq!(env.state(201), FakeState::Locked);
}

#[test]
fn the_restore_budget_bounds_a_hanging_restore() {
    let env = env();
    env.register(&[201], FakeState::Checkpointed);
    env.inject(
        201,
        FakeOp::Restore,
        Fault::hang(Duration::from_millis(1500)),
    );
    let options = OrchestratorOptions {
        restore_budget: Duration::from_millis(300),
        ..options()
    };
    let started = Instant::now();
    let err = Orchestrator::driver_managed(Arc::clone(&env.driver), options)
        .restore(&[target(&env, 201, &[H200_A])], &GpuMap::new())
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "waited for the hung call"
    );
    assert_eq!(err.outcome, Outcome::OutcomeUnknown);
    assert!(
        matches!(*err.cause, Cause::Timeout { pid: 201, .. }),
        "{:?}",
        err.cause
    );
    assert!(
        err.to_string()
            .contains("driver-managed restore for pid 201 did not return within"),
        "{err}"
    );
}

/// A `/proc` with `status` files whose NSpid maps host pids to container pids.
fn fake_proc(root: &Path, pids: &[(i32, i32)]) {
    for (host, inner) in pids {
        let dir = root.join(host.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("status"),
            format!("Name:\tpython\nPid:\t{host}\nNSpid:\t{host}\t{inner}\n"),
        )
        .unwrap();
    }
}

#[test]
fn restored_processes_are_found_by_container_pid_and_a_missing_one_is_named() {
    let env = env();
    let proc_dir = tempfile::tempdir().unwrap();
    // Checkpointed as host pids 101/102 (container pids 1/7); CRIU restored them as 5001/5002.
    fake_proc(proc_dir.path(), &[(5001, 1), (5002, 7), (5003, 9)]);
    let records = [
        record(&env, 101, Some(1), &[H200_A]),
        record(&env, 102, Some(7), &[H200_A]),
    ]
    .map(|r| r.recorded_pid());
    assert_eq!(
        discovery::map_restored_pids(&records, &[5001, 5002, 5003], proc_dir.path()).unwrap(),
        vec![5001, 5002]
    );
    let err = discovery::map_restored_pids(&records, &[5001, 5003], proc_dir.path()).unwrap_err();
    assert!(
        err.to_string()
            .contains("no restored process has container pid 7"),
        "{err}"
    );
}
