//! The binding against the fake driver: loading, capabilities, entry-point
//! resolution, error naming and the per-process state machine.

mod common;

use std::time::Duration;

use common::*;
use gpusnap_cuda::driver::{
    code, CallError, Driver, DriverConfig, DriverVersion, LoadError, PendingDriver, ProcessState,
};

#[test]
fn loads_the_fake_and_reports_capabilities() {
    let env = env();
    let caps = env.driver.capabilities();
    assert_eq!(caps.library_path, env.fake.library_path());
    assert_eq!(caps.driver_version, DriverVersion(13000));
    assert!(caps.checkpoint_api);
    assert!(caps.gpu_remap);
    // Like the 580 driver on our H200: no cuCheckpointOperationComplete.
    assert!(!caps.custom_storage);
    assert_eq!(
        caps.missing_symbols,
        vec!["cuCheckpointOperationComplete".to_owned()]
    );

    assert_eq!(caps.devices.len(), 1);
    let gpu = &caps.devices[0];
    assert_eq!(gpu.index, 0);
    // The v1 (dlsym) ABI of cuDeviceGetUuid in the fake flips the last byte;
    // getting the configured UUID proves the v2 entry point was resolved.
    assert_eq!(gpu.uuid.to_string(), H200_A);
    assert_eq!(gpu.name, "NVIDIA H200");
    assert_eq!(gpu.total_memory_bytes, H200_MEM);

    let json = serde_json::to_value(caps).unwrap();
    assert_eq!(json["devices"][0]["uuid"], H200_A);
    assert_eq!(json["driver_version"], 13000);
}

#[test]
fn lists_configured_devices_in_order() {
    let env = env_with(three_devices);
    let devices = &env.driver.capabilities().devices;
    let listed: Vec<(u32, String, String)> = devices
        .iter()
        .map(|d| (d.index, d.uuid.to_string(), d.name.clone()))
        .collect();
    assert_eq!(
        listed,
        vec![
            (0, H200_A.to_owned(), "NVIDIA H200".to_owned()),
            (1, H200_B.to_owned(), "NVIDIA H200".to_owned()),
            (2, L4.to_owned(), "NVIDIA L4".to_owned()),
        ]
    );
}

#[test]
fn entry_points_come_from_get_proc_address_at_explicit_versions() {
    let env = env();
    let requests = env.fake.proc_address_requests().unwrap();
    let version_of = |symbol: &str| {
        requests
            .iter()
            .find(|r| r.symbol == symbol)
            .map(|r| r.version)
            .unwrap_or_else(|| panic!("{symbol} not requested"))
    };
    for symbol in [
        "cuCheckpointProcessLock",
        "cuCheckpointProcessCheckpoint",
        "cuCheckpointProcessRestore",
        "cuCheckpointProcessUnlock",
        "cuCheckpointProcessGetState",
        "cuCheckpointProcessGetRestoreThreadId",
    ] {
        assert_eq!(version_of(symbol), 12080, "{symbol}");
    }
    assert_eq!(version_of("cuCheckpointOperationComplete"), 13040);
    assert!(
        version_of("cuDeviceGetUuid") >= 11040,
        "needs the v2 UUID ABI"
    );
    // 13040 > driver 13000: the documented answer is INVALID_VALUE.
    let complete = requests
        .iter()
        .find(|r| r.symbol == "cuCheckpointOperationComplete")
        .unwrap();
    assert_eq!(complete.code, code::INVALID_VALUE);
}

#[test]
fn custom_storage_appears_with_a_13_4_driver() {
    let env = env_with(|f| f.set_driver_version(13040).unwrap());
    let caps = env.driver.capabilities();
    assert_eq!(caps.driver_version, DriverVersion(13040));
    assert!(caps.custom_storage, "{caps:?}");
    assert!(
        caps.missing_symbols.is_empty(),
        "{:?}",
        caps.missing_symbols
    );
}

#[test]
fn operation_complete_hidden_on_a_13_4_driver_means_no_custom_storage() {
    let env = env_with(|f| {
        f.set_driver_version(13040).unwrap();
        f.hide_symbol("cuCheckpointOperationComplete").unwrap();
    });
    let caps = env.driver.capabilities();
    assert!(caps.checkpoint_api);
    assert!(!caps.custom_storage);
    let status = env
        .fake
        .proc_address_requests()
        .unwrap()
        .into_iter()
        .find(|r| r.symbol == "cuCheckpointOperationComplete")
        .unwrap();
    assert_eq!(
        (status.code, status.status),
        (0, 1),
        "SUCCESS with SYMBOL_NOT_FOUND"
    );
}

#[test]
fn a_missing_checkpoint_symbol_disables_the_api_with_a_clear_error() {
    let env = env_with(|f| f.hide_symbol("cuCheckpointProcessUnlock").unwrap());
    let caps = env.driver.capabilities();
    assert!(!caps.checkpoint_api);
    assert!(!caps.gpu_remap);
    assert!(caps
        .missing_symbols
        .contains(&"cuCheckpointProcessUnlock".to_owned()));

    let err = env.driver.lock_process(42, 0).unwrap_err();
    assert!(
        matches!(
            err,
            CallError::Unavailable {
                call: "cuCheckpointProcessLock",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("driver r570 (CUDA 12.8) or newer"), "{text}");
    assert!(text.contains("driver CUDA 13.0"), "{text}");
}

#[test]
fn an_old_driver_has_no_checkpoint_api() {
    let env = env_with(|f| f.set_driver_version(12040).unwrap());
    let caps = env.driver.capabilities();
    assert_eq!(caps.driver_version, DriverVersion(12040));
    assert!(!caps.checkpoint_api);
    // Basic functions were requested at the driver's own version, not above it.
    let requests = env.fake.proc_address_requests().unwrap();
    let uuid = requests
        .iter()
        .find(|r| r.symbol == "cuDeviceGetUuid")
        .unwrap();
    assert_eq!(uuid.version, 12040);
    assert_eq!(caps.devices.len(), 1);
}

#[test]
fn missing_library_is_a_clean_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-libcuda.so.1");
    let err = Driver::load(&DriverConfig::with_library(&path)).unwrap_err();
    assert!(matches!(err, LoadError::Library { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("Install the NVIDIA driver"), "{text}");
    assert!(text.contains("r570"), "{text}");
}

#[test]
fn default_config_points_at_libcuda_so_1() {
    assert_eq!(
        DriverConfig::default().library_path.to_str(),
        Some("libcuda.so.1")
    );
    // This build machine has no NVIDIA driver; where one exists, loading works.
    if let Err(err) = Driver::load(&DriverConfig::default()) {
        assert!(err.to_string().contains("libcuda.so.1"), "{err}");
    }
}

#[test]
fn a_library_that_is_not_a_driver_is_rejected() {
    let err = Driver::load(&DriverConfig::with_library("libm.so.6")).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::MissingEntryPoint {
                symbol: "cuInit",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a CUDA driver"), "{err}");
}

#[test]
fn cuinit_failure_is_named_through_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeCuda::create(dir.path()).unwrap();
    fake.set_init_error(code::NO_DEVICE).unwrap();
    let err = Driver::load(&DriverConfig::with_library(fake.library_path())).unwrap_err();
    let LoadError::Init { error, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(error.code, 100);
    assert_eq!(error.name, "CUDA_ERROR_NO_DEVICE");
    assert!(
        error
            .description
            .as_deref()
            .unwrap()
            .starts_with("fake libcuda"),
        "{error}"
    );
    assert!(err.to_string().contains("NVIDIA kernel module"), "{err}");
}

#[test]
fn error_names_fall_back_to_the_static_table() {
    let env = env_with(|f| {
        f.hide_symbol("cuGetErrorName").unwrap();
        f.hide_symbol("cuGetErrorString").unwrap();
    });
    let err = env.driver.lock_process(4242, 0).unwrap_err();
    let CallError::Cuda { error, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(error.name, "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(error.description, None);
    assert_eq!(
        err.to_string(),
        "cuCheckpointProcessLock(pid 4242) returned CUDA_ERROR_INVALID_VALUE (1)"
    );
}

#[test]
fn errors_carry_the_driver_name_and_description() {
    let env = env();
    let err = env.driver.unlock_process(4242).unwrap_err();
    assert_eq!(err.code(), Some(code::INVALID_VALUE));
    assert_eq!(
        err.to_string(),
        "cuCheckpointProcessUnlock(pid 4242) returned CUDA_ERROR_INVALID_VALUE (1): fake libcuda: invalid argument"
    );
}

#[test]
fn the_state_machine_matches_the_driver() {
    let env = env();
    let pid = 777;
    env.register(&[pid], FakeState::Running);
    let d = &env.driver;
    let code_of = |e: CallError| e.code();

    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Running);
    assert_eq!(d.restore_thread_id(pid).unwrap(), pid);
    assert_eq!(
        d.checkpoint_process(pid).map_err(code_of),
        Err(Some(code::ILLEGAL_STATE))
    );
    d.lock_process(pid, 1000).unwrap();
    assert_eq!(
        d.lock_process(pid, 1000).map_err(code_of),
        Err(Some(code::ILLEGAL_STATE))
    );
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    d.checkpoint_process(pid).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Checkpointed);
    assert_eq!(
        d.unlock_process(pid).map_err(code_of),
        Err(Some(code::ILLEGAL_STATE))
    );
    d.restore_process(pid, &[]).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    d.unlock_process(pid).unwrap();
    assert_eq!(env.state(pid), FakeState::Running);

    assert_eq!(
        d.process_state(999_999).map_err(code_of),
        Err(Some(code::INVALID_VALUE))
    );
    let calls = env.fake.calls().unwrap();
    let lock = calls
        .iter()
        .find(|c| c.op == "lock" && c.code == 0)
        .unwrap();
    assert_eq!(
        lock.args.get("timeout_ms").map(String::as_str),
        Some("1000")
    );
    let restore = calls.iter().find(|c| c.op == "restore").unwrap();
    assert_eq!(restore.args.get("pairs").map(String::as_str), Some("none"));
}

#[test]
fn a_lock_timeout_is_not_ready_and_leaves_the_process_running() {
    let env = env();
    env.register(&[5], FakeState::Running);
    env.inject(5, FakeOp::Lock, Fault::busy(Duration::from_millis(400)));
    let err = env.driver.lock_process(5, 50).unwrap_err();
    assert_eq!(err.code(), Some(code::NOT_READY));
    assert_eq!(env.state(5), FakeState::Running);
    // A long enough timeout waits for the work and locks.
    env.driver.lock_process(5, 2000).unwrap();
    assert_eq!(env.state(5), FakeState::Locked);
}

#[test]
fn failed_state_is_reported() {
    let env = env();
    env.register(&[9], FakeState::Failed);
    assert_eq!(env.driver.process_state(9).unwrap(), ProcessState::Failed);
}

#[test]
fn pending_driver_joins_after_background_load() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeCuda::create(dir.path()).unwrap();
    let pending = PendingDriver::spawn(DriverConfig::with_library(fake.library_path()));
    let (driver, _waited) = pending.join(Duration::from_secs(10)).expect("loads");
    assert!(driver.capabilities().checkpoint_api);

    let missing = PendingDriver::spawn(DriverConfig::with_library(dir.path().join("missing.so")));
    let err = missing.join(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, LoadError::Library { .. }), "{err:?}");
}

const CHILD_PID_ENV: &str = "GPUSNAP_TEST_CHILD_PID";

/// Helper run in a child process by `state_is_shared_across_processes`.
#[test]
#[ignore = "helper, run in a child process by state_is_shared_across_processes"]
fn child_locks_a_pid_through_the_env_dir() {
    let Ok(pid) = std::env::var(CHILD_PID_ENV) else {
        return;
    };
    // The original build output, not a copy: the directory comes from the env.
    let driver = Driver::load(&DriverConfig::with_library(
        gpusnap_fake_libcuda::BUILT_LIBRARY,
    ))
    .unwrap();
    driver.lock_process(pid.parse().unwrap(), 0).unwrap();
}

#[test]
fn state_is_shared_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeCuda::create(dir.path()).unwrap();
    fake.register(31337).unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_locks_a_pid_through_the_env_dir",
            "--ignored",
            "--quiet",
        ])
        .env(gpusnap_fake_libcuda::DIR_ENV, dir.path())
        .env(CHILD_PID_ENV, "31337")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "child failed: {status}");
    assert_eq!(fake.state(31337).unwrap(), Some(FakeState::Locked));
    let driver = Driver::load(&DriverConfig::with_library(fake.library_path())).unwrap();
    assert_eq!(driver.process_state(31337).unwrap(), ProcessState::Locked);
    assert_eq!(fake.calls_for(31337).unwrap(), ["lock 0"]);
}
