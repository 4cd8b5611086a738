//! Shared setup: a private fake driver per test, loaded through the real path.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpusnap_cuda::discovery::CudaProcess;
use gpusnap_cuda::driver::{DeviceInfo, Driver, DriverConfig};
use gpusnap_cuda::orchestrate::{Concurrency, OrchestratorOptions};
pub use gpusnap_fake_libcuda::{FakeCuda, FakeDevice, FakeOp, FakeState, Fault};

pub const H200_A: &str = "GPU-a1b2c3d4-0000-4000-8000-000000000001";
pub const H200_B: &str = "GPU-a1b2c3d4-0000-4000-8000-000000000002";
pub const L4: &str = "GPU-0c0c0c0c-0000-4000-8000-000000000003";
pub const H200_MEM: u64 = 150_109_880_320;

pub struct Env {
    pub fake: FakeCuda,
    pub driver: Arc<Driver>,
    _dir: tempfile::TempDir,
}

/// A fake with default settings (driver 13000, one H200).
pub fn env() -> Env {
    env_with(|_| {})
}

/// A fake configured by `setup` before the driver is loaded.
pub fn env_with(setup: impl FnOnce(&FakeCuda)) -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeCuda::create(dir.path()).expect("prepare fake libcuda");
    setup(&fake);
    let driver =
        Driver::load(&DriverConfig::with_library(fake.library_path())).expect("load fake libcuda");
    Env {
        fake,
        driver: Arc::new(driver),
        _dir: dir,
    }
}

/// Three H200s' worth of devices: two H200s and an L4.
pub fn three_devices(fake: &FakeCuda) {
    fake.set_devices(&[
        FakeDevice::new(H200_A, "NVIDIA H200", H200_MEM),
        FakeDevice::new(H200_B, "NVIDIA H200", H200_MEM),
        FakeDevice::new(L4, "NVIDIA L4", 24_152_899_584),
    ])
    .expect("devices");
}

pub fn options() -> OrchestratorOptions {
    OrchestratorOptions {
        lock_timeout: Duration::from_millis(2_000),
        max_operation: Duration::from_secs(10),
        restore_budget: Duration::from_secs(30),
        concurrency: Concurrency::Parallel,
        storage_dir: None,
    }
}

pub fn device(env: &Env, uuid: &str) -> DeviceInfo {
    env.driver
        .capabilities()
        .devices
        .iter()
        .find(|d| d.uuid.to_string() == uuid)
        .cloned()
        .expect("device present")
}

pub fn processes(pids: &[i32]) -> Vec<CudaProcess> {
    pids.iter().map(|&p| CudaProcess::from_pid(p)).collect()
}

impl Env {
    pub fn register(&self, pids: &[i32], state: FakeState) {
        for &pid in pids {
            self.fake.set_state(pid, state).expect("register");
        }
    }

    pub fn state(&self, pid: i32) -> FakeState {
        self.fake
            .state(pid)
            .expect("read state")
            .expect("registered")
    }

    pub fn states(&self, pids: &[i32]) -> Vec<FakeState> {
        pids.iter().map(|&p| self.state(p)).collect()
    }

    pub fn inject(&self, pid: i32, op: FakeOp, fault: Fault) {
        self.fake.inject(pid, op, &fault).expect("inject fault");
    }

    /// `"op pid"` for every checkpoint-API call, in order.
    pub fn call_log(&self) -> Vec<String> {
        self.fake
            .calls()
            .expect("calls")
            .iter()
            .map(|c| c.short())
            .collect()
    }

    /// Waits until the call log contains `call` (`"op pid"`); the fake writes
    /// the log line after the state.
    pub fn wait_for_call(&self, call: &str, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.call_log().iter().any(|c| c == call) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}
