//! The posix storage engine (CUDA 13.4 CustomStorage) against the fake driver:
//! the fake's mapped regions are host memory standing in for device memory.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use gpusnap_cuda::discovery::CudaProcess;
use gpusnap_cuda::driver::DeviceInfo;
use gpusnap_cuda::engine::{EngineOp, StorageEngine};
use gpusnap_cuda::orchestrate::{GpuMap, Orchestrator, OrchestratorOptions, RestoreTarget};
use gpusnap_cuda::posix::{self, extent_name, DeviceRegion, PipelineOptions, Posix, PosixDetails};

fn env13() -> Env {
    env_with(|f| f.set_driver_version(13040).unwrap())
}

fn env13_two() -> Env {
    env_with(|f| {
        f.set_driver_version(13040).unwrap();
        f.set_devices(&[
            FakeDevice::new(H200_A, "NVIDIA H200", H200_MEM),
            FakeDevice::new(H200_B, "NVIDIA H200", H200_MEM),
        ])
        .unwrap();
    })
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn op(env: &Env, pid: i32, gpus: Vec<DeviceInfo>, dir: &Path, limit: Duration) -> EngineOp {
    EngineOp {
        driver: Arc::clone(&env.driver),
        pid,
        gpus,
        deadline: Instant::now() + limit,
        storage_dir: Some(dir.to_owned()),
        saved: None,
    }
}

/// Small slots so that a region takes several chunks plus an unaligned tail.
fn engine() -> Posix {
    Posix::new(3, 4096).unwrap()
}

fn gpu_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("gpusnap-gpu-")
        })
        .collect();
    v.sort();
    v
}

fn details(v: &Option<serde_json::Value>) -> PosixDetails {
    serde_json::from_value(v.clone().expect("details")).expect("posix details")
}

#[test]
fn single_gpu_bytes_round_trip_with_digests() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let pid = 4100;
    env.fake.register(pid).unwrap();
    let vram = pattern(5 * 4096 + 123, 1);
    env.fake.set_device_memory(pid, 0, &vram).unwrap();
    env.driver.lock_process(pid, 0).unwrap();

    let a = env.driver.capabilities().devices[0].clone();
    let e = engine();
    let out = e
        .checkpoint(&op(
            &env,
            pid,
            vec![a.clone()],
            dir.path(),
            Duration::from_secs(10),
        ))
        .expect("checkpoint");
    assert_eq!(out.bytes_moved, Some(vram.len() as u64));
    assert_eq!(env.state(pid), FakeState::Checkpointed);
    let d = details(&out.details);
    assert_eq!(d.extents.len(), 1);
    let x = &d.extents[0];
    assert_eq!(x.device_uuid, a.uuid);
    assert_eq!(x.size, vram.len() as u64);
    assert_eq!(x.file, format!("gpusnap-gpu-{}", extent_name(pid, &a.uuid)));
    assert_eq!(x.blake3, blake3::hash(&vram).to_hex().to_string());
    let file = dir.path().join(&x.file);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        vram,
        "extent holds the device bytes"
    );
    assert_eq!(gpu_files(dir.path()), vec![file]);
    assert!(
        env.call_log()
            .iter()
            .any(|c| c.starts_with("operation_complete")),
        "committed: {:?}",
        env.call_log()
    );

    let mut rop = op(&env, pid, vec![a], dir.path(), Duration::from_secs(10));
    rop.saved = out.details.clone();
    let back = e.restore(&rop, &[]).expect("restore");
    assert_eq!(back.bytes_moved, Some(vram.len() as u64));
    assert_eq!(env.state(pid), FakeState::Locked);
    assert_eq!(env.fake.device_memory(pid, 0).unwrap(), Some(vram));
    env.driver.unlock_process(pid).unwrap();
}

#[test]
fn several_processes_on_two_gpus_through_the_orchestrator() {
    let env = env13_two();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (device(&env, H200_A), device(&env, H200_B));
    // 501 uses both GPUs, 502 only B.
    let m501a = pattern(3 * 4096 + 7, 11);
    let m501b = pattern(4096 * 2, 12);
    let m502b = pattern(10_001, 13);
    env.fake.register(501).unwrap();
    env.fake.register(502).unwrap();
    env.fake.set_device_memory(501, 0, &m501a).unwrap();
    env.fake.set_device_memory(501, 1, &m501b).unwrap();
    env.fake.set_device_memory(502, 1, &m502b).unwrap();

    let options = OrchestratorOptions {
        storage_dir: Some(dir.path().to_owned()),
        ..options()
    };
    let orch = Orchestrator::new(Arc::clone(&env.driver), Arc::new(engine()), options);
    let procs = vec![
        CudaProcess {
            gpus: vec![a.clone(), b.clone()],
            ..CudaProcess::from_pid(501)
        },
        CudaProcess {
            gpus: vec![b.clone()],
            ..CudaProcess::from_pid(502)
        },
    ];
    let report = orch
        .checkpoint(&procs, false, || Ok::<(), std::io::Error>(()))
        .expect("checkpoint");
    assert_eq!(report.engine, "posix");
    assert_eq!(env.states(&[501, 502]), vec![FakeState::Checkpointed; 2]);
    assert_eq!(
        gpu_files(dir.path()).len(),
        3,
        "one extent per process per GPU"
    );
    let r501 = report.processes.iter().find(|p| p.host_pid == 501).unwrap();
    let d501 = details(&r501.engine_details);
    assert_eq!(d501.extents.len(), 2);
    assert_eq!(
        d501.extents.iter().map(|x| x.size).sum::<u64>(),
        (m501a.len() + m501b.len()) as u64
    );
    for x in &d501.extents {
        let bytes = std::fs::read(dir.path().join(&x.file)).unwrap();
        assert_eq!(x.blake3, blake3::hash(&bytes).to_hex().to_string());
    }

    let targets: Vec<RestoreTarget> = report
        .processes
        .iter()
        .map(|r| RestoreTarget {
            record: r.clone(),
            host_pid: r.host_pid,
        })
        .collect();
    orch.restore(&targets, &GpuMap::new()).expect("restore");
    assert_eq!(env.states(&[501, 502]), vec![FakeState::Running; 2]);
    assert_eq!(env.fake.device_memory(501, 0).unwrap(), Some(m501a));
    assert_eq!(env.fake.device_memory(501, 1).unwrap(), Some(m501b));
    assert_eq!(env.fake.device_memory(502, 1).unwrap(), Some(m502b));
}

fn assert_before_commit(env: &Env, pid: i32, dir: &Path, err: &str) {
    assert!(err.contains("before commit"), "{err}");
    assert!(
        gpu_files(dir).is_empty(),
        "partial extents removed: {:?}",
        gpu_files(dir)
    );
    assert!(
        !env.call_log()
            .iter()
            .any(|c| c.starts_with("operation_complete")),
        "no commit: {:?}",
        env.call_log()
    );
    assert_eq!(env.state(pid), FakeState::Checkpointing);
}

#[test]
fn disk_full_midway_removes_partial_extents_before_commit() {
    let env = env13_two();
    let dir = tempfile::tempdir().unwrap();
    let pid = 601;
    env.fake.register(pid).unwrap();
    env.fake
        .set_device_memory(pid, 0, &pattern(8 * 4096, 1))
        .unwrap();
    env.fake
        .set_device_memory(pid, 1, &pattern(8 * 4096, 2))
        .unwrap();
    env.driver.lock_process(pid, 0).unwrap();
    let gpus = vec![device(&env, H200_A), device(&env, H200_B)];
    let err = engine()
        .with_write_fault(3 * 4096)
        .checkpoint(&op(&env, pid, gpus, dir.path(), Duration::from_secs(10)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("No space left") || err.contains("os error 28"),
        "{err}"
    );
    assert_before_commit(&env, pid, dir.path(), &err);
}

#[test]
fn unwritable_extent_path_fails_before_commit_and_cleans_the_other_gpu() {
    let env = env13_two();
    let dir = tempfile::tempdir().unwrap();
    let pid = 602;
    env.fake.register(pid).unwrap();
    env.fake
        .set_device_memory(pid, 0, &pattern(6 * 4096, 1))
        .unwrap();
    env.fake
        .set_device_memory(pid, 1, &pattern(6 * 4096, 2))
        .unwrap();
    env.driver.lock_process(pid, 0).unwrap();
    let (a, b) = (device(&env, H200_A), device(&env, H200_B));
    // GPU B's extent path is a directory: opening it for writing fails.
    let blocked = dir
        .path()
        .join(format!("gpusnap-gpu-{}", extent_name(pid, &b.uuid)));
    std::fs::create_dir(&blocked).unwrap();
    let err = engine()
        .checkpoint(&op(
            &env,
            pid,
            vec![a, b.clone()],
            dir.path(),
            Duration::from_secs(10),
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&b.uuid.to_string()), "{err}");
    assert_before_commit(&env, pid, dir.path(), &err);
}

#[test]
fn the_watchdog_deadline_stops_the_copy_loop() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let pid = 603;
    env.fake.register(pid).unwrap();
    env.fake
        .set_device_memory(pid, 0, &pattern(16 * 4096, 3))
        .unwrap();
    env.driver.lock_process(pid, 0).unwrap();
    // The checkpoint call itself outlives the deadline; the copy loop must notice.
    env.inject(
        pid,
        FakeOp::Checkpoint,
        Fault::hang(Duration::from_millis(300)),
    );
    let started = Instant::now();
    let err = engine()
        .checkpoint(&op(
            &env,
            pid,
            vec![],
            dir.path(),
            Duration::from_millis(100),
        ))
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(err.contains("deadline"), "{err}");
    assert_before_commit(&env, pid, dir.path(), &err);
}

#[test]
fn a_past_deadline_touches_nothing() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    env.fake.register(604).unwrap();
    env.driver.lock_process(604, 0).unwrap();
    let mut o = op(&env, 604, vec![], dir.path(), Duration::ZERO);
    o.deadline = Instant::now() - Duration::from_millis(1);
    let err = engine().checkpoint(&o).unwrap_err().to_string();
    assert!(err.contains("deadline"), "{err}");
    assert_eq!(env.state(604), FakeState::Locked);
    assert!(gpu_files(dir.path()).is_empty());
}

fn checkpointed(env: &Env, pid: i32, dir: &Path) -> (Posix, EngineOp, Vec<u8>) {
    env.fake.register(pid).unwrap();
    let vram = pattern(7 * 4096 + 99, pid as u32);
    env.fake.set_device_memory(pid, 0, &vram).unwrap();
    env.driver.lock_process(pid, 0).unwrap();
    let e = engine();
    let out = e
        .checkpoint(&op(env, pid, vec![], dir, Duration::from_secs(10)))
        .expect("checkpoint");
    let mut rop = op(env, pid, vec![], dir, Duration::from_secs(10));
    rop.saved = out.details;
    (e, rop, vram)
}

#[test]
fn a_tampered_extent_is_refused_before_the_restore_call() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let (e, rop, _) = checkpointed(&env, 701, dir.path());
    let file = gpu_files(dir.path()).remove(0);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[4097] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let err = e.restore(&rop, &[]).unwrap_err().to_string();
    assert!(
        err.contains("BLAKE3") && err.contains("nothing was restored"),
        "{err}"
    );
    assert_eq!(env.state(701), FakeState::Checkpointed);
    assert!(!env.call_log().iter().any(|c| c.starts_with("restore")));
}

#[test]
fn a_truncated_or_missing_extent_or_record_is_refused() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let (e, rop, _) = checkpointed(&env, 702, dir.path());
    let file = gpu_files(dir.path()).remove(0);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 1]).unwrap();
    let err = e.restore(&rop, &[]).unwrap_err().to_string();
    assert!(err.contains("bytes"), "{err}");
    std::fs::remove_file(&file).unwrap();
    let err = e.restore(&rop, &[]).unwrap_err().to_string();
    assert!(err.contains("No such file"), "{err}");
    let mut no_record = rop.clone();
    no_record.saved = None;
    let err = e.restore(&no_record, &[]).unwrap_err().to_string();
    assert!(err.contains("no posix extent list"), "{err}");
    assert_eq!(env.state(702), FakeState::Checkpointed);
}

#[test]
fn posix_is_refused_on_a_13_0_driver_and_without_a_directory() {
    let env = env();
    let err = engine()
        .admit(env.driver.capabilities())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("13.4") && err.contains("Nothing was locked"),
        "{err}"
    );
    let env = env13();
    engine().admit(env.driver.capabilities()).unwrap();
    env.fake.register(801).unwrap();
    env.driver.lock_process(801, 0).unwrap();
    let mut o = op(
        &env,
        801,
        vec![],
        Path::new("/nonexistent"),
        Duration::from_secs(5),
    );
    o.storage_dir = None;
    let err = engine().checkpoint(&o).unwrap_err().to_string();
    assert!(err.contains("no checkpoint directory"), "{err}");
    assert_eq!(env.state(801), FakeState::Locked);
    assert!(Posix::new(8, 256 << 20).is_err(), "2 GiB pinned per GPU");
    assert!(Posix::new(0, 4096).is_err());
    assert!(Posix::new(4, 1000).is_err());
}

#[test]
fn the_pipeline_runs_on_plain_memory_with_any_slot_count() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let src = pattern(9 * 4096 + 5, 77);
    let big = pattern(5 * (2 << 20) + 4096 * 3 + 5, 78);
    // (data, chunk, I/O threads): small chunks, a chunk that is not a power of two, and more
    // I/O threads than the default.
    let cases: Vec<(&[u8], usize, Option<usize>)> = vec![
        (&src, 8192, None),
        (&src, 12288, None),
        (&big, 2 << 20, Some(7)),
        (&big, 4 << 20, None),
    ];
    for (n, (data, chunk, io_threads)) in cases.into_iter().enumerate() {
        for slots in [1usize, 2, 8] {
            let region = DeviceRegion {
                ctx: std::ptr::null_mut(),
                dev_ptr: data.as_ptr() as u64,
                size: data.len(),
                stream: std::ptr::null_mut(),
            };
            let path = dir.path().join(format!("case-{n}-{slots}.bin"));
            let opts = PipelineOptions {
                io_threads,
                ..PipelineOptions::new(slots, chunk)
            };
            let w = posix::device_to_file(&env.driver, &region, &path, &opts).unwrap();
            assert_eq!(
                std::fs::read(&path).unwrap(),
                data,
                "case {n}, {slots} slots"
            );
            assert_eq!(
                w.blake3,
                blake3::hash(data).to_hex().to_string(),
                "case {n}"
            );
            let mut dst = vec![0u8; data.len()];
            let back = DeviceRegion {
                dev_ptr: dst.as_mut_ptr() as u64,
                ..region
            };
            let r =
                posix::file_to_device(&env.driver, &back, &path, Some(&w.blake3), &opts).unwrap();
            assert_eq!(r.blake3, w.blake3);
            assert_eq!(dst, data, "case {n}, {slots} slots");
            // A changed byte is caught.
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[data.len() / 2] ^= 1;
            std::fs::write(&path, &bytes).unwrap();
            let err = posix::file_to_device(&env.driver, &back, &path, Some(&w.blake3), &opts)
                .unwrap_err();
            assert!(err.to_string().contains("changed or damaged"), "{err}");
        }
    }
    for slots in [1usize, 2, 4, 8] {
        // The fake's "device pointers" are host addresses.
        let region = DeviceRegion {
            ctx: std::ptr::null_mut(),
            dev_ptr: src.as_ptr() as u64,
            size: src.len(),
            stream: std::ptr::null_mut(),
        };
        let path = dir.path().join(format!("bench-{slots}.bin"));
        let opts = PipelineOptions::new(slots, 8192);
        let w = posix::device_to_file(&env.driver, &region, &path, &opts).unwrap();
        assert_eq!(w.bytes, src.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), src);
        assert_eq!(w.blake3, blake3::hash(&src).to_hex().to_string());
        let mut dst = vec![0u8; src.len()];
        let back = DeviceRegion {
            dev_ptr: dst.as_mut_ptr() as u64,
            ..region
        };
        let r = posix::file_to_device(&env.driver, &back, &path, Some(&w.blake3), &opts).unwrap();
        assert_eq!(r.blake3, w.blake3);
        assert_eq!(dst, src, "{slots} slots");
    }
}

#[test]
fn the_watchdog_deadline_stops_the_restore_copy_loop() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let (e, mut rop, _) = checkpointed(&env, 703, dir.path());
    env.inject(
        703,
        FakeOp::Restore,
        Fault::hang(Duration::from_millis(300)),
    );
    rop.deadline = Instant::now() + Duration::from_millis(100);
    let err = e.restore(&rop, &[]).unwrap_err().to_string();
    assert!(
        err.contains("deadline") && err.contains("before commit"),
        "{err}"
    );
    assert_eq!(env.state(703), FakeState::Restoring);
    let commits = env
        .call_log()
        .iter()
        .filter(|c| c.starts_with("operation_complete"))
        .count();
    assert_eq!(
        commits,
        1,
        "only the checkpoint's commit: {:?}",
        env.call_log()
    );
    assert_eq!(
        gpu_files(dir.path()).len(),
        1,
        "extents are kept after a failed restore"
    );
}

#[test]
fn aligned_slots_go_through_o_direct_where_the_filesystem_allows() {
    let env = env13();
    // The current directory's filesystem, not /tmp (which may be tmpfs).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // Page-aligned source so that the fake's memcpy-based "device" is irrelevant;
    // the slots are what O_DIRECT needs aligned: 64 MiB malloc is not, so this only
    // checks the fallback keeps bytes intact and reports honestly.
    let src = pattern(3 << 20, 5);
    let region = DeviceRegion {
        ctx: std::ptr::null_mut(),
        dev_ptr: src.as_ptr() as u64,
        size: src.len(),
        stream: std::ptr::null_mut(),
    };
    let path = dir.path().join("direct.bin");
    let w = posix::device_to_file(
        &env.driver,
        &region,
        &path,
        &PipelineOptions::new(2, 1 << 20),
    )
    .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), src);
    let mut buffered = PipelineOptions::new(2, 1 << 20);
    buffered.direct_io = false;
    let b = posix::device_to_file(&env.driver, &region, &path, &buffered).unwrap();
    assert!(!b.direct_io, "buffered mode never reports O_DIRECT");
    assert_eq!(w.blake3, b.blake3);
}

#[test]
fn slots_pinned_ahead_carry_several_transfers_both_ways() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(3 * (1 << 20) + 4096 + 7, 91);
    let region = DeviceRegion {
        ctx: std::ptr::null_mut(),
        dev_ptr: data.as_ptr() as u64,
        size: data.len(),
        stream: std::ptr::null_mut(),
    };
    // The slots' own count and chunk size rule, not the options'.
    let opts = PipelineOptions::new(8, 64 << 20);
    let mut slots = posix::TransferSlots::alloc(&env.driver, region.ctx, 3, 1 << 20).unwrap();
    assert_eq!((slots.count(), slots.chunk_bytes()), (3, 1 << 20));
    for round in 0..2 {
        let path = dir.path().join(format!("round-{round}.bin"));
        let w =
            posix::device_to_file_through(&env.driver, &region, &path, &mut slots, &opts).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data, "round {round}");
        assert_eq!(w.blake3, blake3::hash(&data).to_hex().to_string());
        let mut dst = vec![0u8; data.len()];
        let back = DeviceRegion {
            dev_ptr: dst.as_mut_ptr() as u64,
            ..region
        };
        let r = posix::file_to_device_through(
            &env.driver,
            &back,
            &path,
            Some(&w.blake3),
            &mut slots,
            &opts,
        )
        .unwrap();
        assert_eq!(r.blake3, w.blake3);
        assert_eq!(dst, data, "round {round}");
    }
    for (count, chunk) in [(0, 1 << 20), (9, 1 << 20), (2, 4095)] {
        let err = posix::TransferSlots::alloc(&env.driver, region.ctx, count, chunk).unwrap_err();
        assert!(err.to_string().contains("transfer"), "{err}");
    }
}

#[test]
fn a_region_smaller_than_a_slot_with_an_unaligned_size_goes_through() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    for size in [1usize, 5000, 4096 + 1] {
        let data = pattern(size, 93);
        let region = DeviceRegion {
            ctx: std::ptr::null_mut(),
            dev_ptr: data.as_ptr() as u64,
            size,
            stream: std::ptr::null_mut(),
        };
        let opts = PipelineOptions::new(4, 1 << 20);
        let path = dir.path().join(format!("small-{size}.bin"));
        let w = posix::device_to_file(&env.driver, &region, &path, &opts).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data, "{size} bytes");
        let mut dst = vec![0u8; size];
        let back = DeviceRegion {
            dev_ptr: dst.as_mut_ptr() as u64,
            ..region
        };
        posix::file_to_device(&env.driver, &back, &path, Some(&w.blake3), &opts).unwrap();
        assert_eq!(dst, data, "{size} bytes");
    }
}

#[test]
fn slots_a_failed_copy_went_through_carry_no_further_transfer() {
    let env = env13();
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(3 << 20, 95);
    let region = DeviceRegion {
        ctx: std::ptr::null_mut(),
        dev_ptr: data.as_ptr() as u64,
        size: data.len(),
        stream: std::ptr::null_mut(),
    };
    let opts = PipelineOptions::new(2, 1 << 20);
    let path = dir.path().join("extent.bin");
    let mut slots = posix::TransferSlots::alloc(&env.driver, region.ctx, 2, 1 << 20).unwrap();
    env.fake.fail_copies(true).unwrap();
    let err =
        posix::device_to_file_through(&env.driver, &region, &path, &mut slots, &opts).unwrap_err();
    assert!(
        err.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{err}"
    );
    env.fake.fail_copies(false).unwrap();
    let err =
        posix::device_to_file_through(&env.driver, &region, &path, &mut slots, &opts).unwrap_err();
    assert!(err.to_string().contains("unusable"), "{err}");
    // Fresh slots work again.
    let w = posix::device_to_file(&env.driver, &region, &path, &opts).unwrap();
    assert_eq!(w.blake3, blake3::hash(&data).to_hex().to_string());
}
