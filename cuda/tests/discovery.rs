//! Finding CUDA processes through the fake driver.

mod common;

use std::time::Duration;

use common::*;
use gpusnap_cuda::discovery::{find_cuda_processes, DiscoveryError, DiscoveryOptions, Probe};
use gpusnap_cuda::driver::code;

#[test]
fn finds_only_the_processes_the_driver_knows() {
    let env = env();
    let me = std::process::id() as i32;
    // A real process, so that /proc has its NSpid.
    let parent = std::os::unix::process::parent_id() as i32;
    // Fake pids above the kernel's pid_max: no real process can hold them, so /proc has no
    // entry for them however busy the machine is.
    let pid_max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304);
    let [f0, f1, f2, f3] = [1, 2, 3, 4].map(|n| pid_max + n);
    env.register(&[parent, me, f1], FakeState::Running);
    env.register(&[f2], FakeState::Locked);

    let found = find_cuda_processes(
        &env.driver,
        &[f0, parent, me, f1, f2, f3],
        &DiscoveryOptions::default(),
    )
    .expect("discovery works");
    let pids: Vec<i32> = found.iter().map(|p| p.host_pid).collect();
    assert_eq!(pids, vec![parent, f1, f2], "never the caller itself");

    let mine = &found[0];
    assert_eq!(
        mine.restore_tid,
        Some(parent),
        "the fake's restore thread is the main thread"
    );
    // Read from the real /proc: this test process has an NSpid line.
    assert!(mine.container_pid.is_some());
    assert!(mine.gpus.is_empty(), "no /dev/nvidia* descriptors here");
    assert_eq!(mine.device_memory_bytes, None);
    // Fake pids have no /proc entry: no container pid, and no error either.
    assert_eq!(found[1].container_pid, None);
}

#[test]
fn unexpected_probe_errors_are_not_swallowed() {
    let env = env();
    let proc_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(proc_dir.path().join("4001")).unwrap();
    env.register(&[4001], FakeState::Running);
    env.inject(
        4001,
        FakeOp::RestoreThreadId,
        Fault::fail(code::OPERATING_SYSTEM),
    );
    let options = DiscoveryOptions {
        proc_root: proc_dir.path().to_owned(),
        ..DiscoveryOptions::default()
    };
    let err = find_cuda_processes(&env.driver, &[4001], &options).unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Probe { pid: 4001, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("CUDA_ERROR_OPERATING_SYSTEM (304)"), "{text}");
    assert!(text.contains("run as root"), "{text}");
}

#[test]
fn a_process_that_exited_while_probed_is_skipped() {
    // The 580 driver answers OPERATING_SYSTEM for a pid that does not exist.
    let env = env_with(|f| f.set_unknown_pid_code(code::OPERATING_SYSTEM).unwrap());
    let proc_dir = tempfile::tempdir().unwrap();
    env.register(&[4001], FakeState::Running);
    std::fs::create_dir(proc_dir.path().join("4001")).unwrap();
    let options = DiscoveryOptions {
        proc_root: proc_dir.path().to_owned(),
        ..DiscoveryOptions::default()
    };
    let found = find_cuda_processes(&env.driver, &[4001, 4002], &options).unwrap();
    assert_eq!(found.iter().map(|p| p.host_pid).collect::<Vec<_>>(), [4001]);
}

#[test]
fn non_cuda_processes_as_the_580_driver_reports_them_are_skipped() {
    let env = env_with(|f| f.set_unknown_pid_code(code::NOT_INITIALIZED).unwrap());
    env.register(&[4001], FakeState::Running);
    let found = find_cuda_processes(&env.driver, &[1, 4001], &DiscoveryOptions::default()).unwrap();
    assert_eq!(found.iter().map(|p| p.host_pid).collect::<Vec<_>>(), [4001]);
}

#[test]
fn state_probe_also_works() {
    let env = env();
    env.register(&[4001], FakeState::Checkpointed);
    let options = DiscoveryOptions {
        probe: Probe::State,
        ..DiscoveryOptions::default()
    };
    let found = find_cuda_processes(&env.driver, &[4000, 4001], &options).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].host_pid, 4001);
    assert_eq!(found[0].restore_tid, None);
}

#[test]
fn a_hanging_probe_times_out() {
    let env = env();
    env.register(&[4001], FakeState::Running);
    env.inject(
        4001,
        FakeOp::RestoreThreadId,
        Fault::hang(Duration::from_millis(1000)),
    );
    let options = DiscoveryOptions {
        probe_timeout: Duration::from_millis(100),
        ..DiscoveryOptions::default()
    };
    let err = find_cuda_processes(&env.driver, &[4001], &options).unwrap_err();
    assert!(
        matches!(
            err,
            DiscoveryError::Timeout {
                pid: 4001,
                limit_ms: 100
            }
        ),
        "{err:?}"
    );
}

#[test]
fn many_pids_are_probed_in_batches() {
    let env = env();
    let cuda: Vec<i32> = (5000..5040).step_by(3).collect();
    env.register(&cuda, FakeState::Running);
    let all: Vec<i32> = (5000..5040).collect();
    let found = find_cuda_processes(&env.driver, &all, &DiscoveryOptions::default()).unwrap();
    assert_eq!(found.iter().map(|p| p.host_pid).collect::<Vec<_>>(), cuda);
}

#[test]
fn without_the_checkpoint_api_discovery_says_why() {
    let env = env_with(|f| {
        f.hide_symbol("cuCheckpointProcessGetRestoreThreadId")
            .unwrap()
    });
    let err = find_cuda_processes(&env.driver, &[1], &DiscoveryOptions::default()).unwrap_err();
    assert!(matches!(err, DiscoveryError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("r570"), "{err}");
}
