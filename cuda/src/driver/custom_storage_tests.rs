//! CUDA 13.4 CustomStorage through the fake driver: exercises the 13.4 struct
//! layouts across the C boundary and the fake's CHECKPOINTING/RESTORING states,
//! which the posix storage engine will build on.

use std::ffi::c_void;
use std::ptr;

use gpusnap_fake_libcuda::{FakeCuda, FakeState};

use super::ffi::{
    CheckpointArgs, CuContext, CustomStorageInfo, CustomStoragePerDeviceData, RestoreArgs,
};
use super::{code, Driver, DriverConfig, ProcessState};

fn regions(info: *mut CustomStorageInfo) -> (CustomStorageInfo, Vec<CustomStoragePerDeviceData>) {
    assert!(!info.is_null(), "driver returned no storage info");
    // SAFETY: the (fake) driver returned a valid, live info struct.
    let info = unsafe { *info };
    // SAFETY: `per_device_data` has `device_count` entries per the API contract.
    let per =
        unsafe { std::slice::from_raw_parts(info.per_device_data, info.device_count as usize) }
            .to_vec();
    (info, per)
}

#[test]
fn checkpoint_and_restore_through_mapped_regions() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeCuda::create(dir.path()).unwrap();
    fake.set_driver_version(13040).unwrap();
    let pid = 321;
    fake.register(pid).unwrap();
    let vram: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fake.set_device_memory(pid, 0, &vram).unwrap();

    let driver = Driver::load(&DriverConfig::with_library(fake.library_path())).unwrap();
    assert!(driver.capabilities().custom_storage);
    let mem = *driver.memory_api().expect("memory functions resolved");
    driver.lock_process(pid, 0).unwrap();

    // The caller must hold every device's primary context first.
    let mut info: *mut CustomStorageInfo = ptr::null_mut();
    let mut args = CheckpointArgs::zeroed();
    args.custom_storage_info_out = &mut info;
    // SAFETY: `info` outlives the call; the driver has CustomStorage.
    let err = unsafe { driver.checkpoint_process_with(pid, &mut args) }.unwrap_err();
    assert_eq!(err.code(), Some(code::INVALID_CONTEXT));

    let mut ctx: CuContext = ptr::null_mut();
    // SAFETY: valid out-pointer, device 0 exists.
    assert_eq!(unsafe { (mem.primary_ctx_retain)(&mut ctx, 0) }, 0);
    // SAFETY: as above.
    unsafe { driver.checkpoint_process_with(pid, &mut args) }.unwrap();
    assert_eq!(fake.state(pid).unwrap(), Some(FakeState::Checkpointing));
    assert_eq!(
        driver.process_state(pid).unwrap(),
        ProcessState::Checkpointing
    );

    let (info_value, per) = regions(info);
    assert_eq!(per.len(), 1);
    assert_eq!(per[0].size, vram.len());
    let mut host = vec![0u8; per[0].size];
    // SAFETY: `host` has `size` bytes; the region is mapped until completion.
    let rc = unsafe {
        (mem.memcpy_dtoh_async)(
            host.as_mut_ptr().cast::<c_void>(),
            per[0].dev_ptr,
            per[0].size,
            per[0].stream,
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: the stream came from the driver.
    assert_eq!(unsafe { (mem.stream_synchronize)(per[0].stream) }, 0);
    assert_eq!(host, vram);
    // SAFETY: the handle is from the checkpoint above and not yet completed.
    unsafe { driver.complete_operation(pid, info_value.handle) }.unwrap();
    assert_eq!(fake.state(pid).unwrap(), Some(FakeState::Checkpointed));
    assert_eq!(
        fake.device_memory(pid, 0).unwrap(),
        None,
        "device memory released"
    );

    let mut info: *mut CustomStorageInfo = ptr::null_mut();
    let mut args = RestoreArgs::zeroed();
    args.custom_storage_info_out = &mut info;
    // SAFETY: `info` outlives the call.
    unsafe { driver.restore_process_with(pid, &mut args) }.unwrap();
    assert_eq!(fake.state(pid).unwrap(), Some(FakeState::Restoring));
    let (info_value, per) = regions(info);
    assert_eq!(
        per[0].size,
        vram.len(),
        "restore maps the checkpointed size"
    );
    // SAFETY: the region has `size` bytes and `host` too.
    let rc = unsafe {
        (mem.memcpy_htod_async)(
            per[0].dev_ptr,
            host.as_ptr().cast::<c_void>(),
            per[0].size,
            per[0].stream,
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: the handle is from the restore above.
    unsafe { driver.complete_operation(pid, info_value.handle) }.unwrap();
    assert_eq!(fake.state(pid).unwrap(), Some(FakeState::Locked));
    assert_eq!(fake.device_memory(pid, 0).unwrap(), Some(vram));

    driver.unlock_process(pid).unwrap();
    assert_eq!(fake.state(pid).unwrap(), Some(FakeState::Running));
    // SAFETY: releases the reference retained above.
    assert_eq!(unsafe { (mem.primary_ctx_release)(0) }, 0);
}

#[test]
fn custom_storage_fields_are_rejected_by_a_13_0_driver() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeCuda::create(dir.path()).unwrap();
    fake.register(7).unwrap();
    let driver = Driver::load(&DriverConfig::with_library(fake.library_path())).unwrap();
    driver.lock_process(7, 0).unwrap();
    let mut info: *mut CustomStorageInfo = ptr::null_mut();
    let mut args = CheckpointArgs::zeroed();
    args.custom_storage_info_out = &mut info;
    // SAFETY: deliberately misuses a 13.4 field on a 13.0 driver; nothing is written.
    let err = unsafe { driver.checkpoint_process_with(7, &mut args) }.unwrap_err();
    assert_eq!(err.code(), Some(code::INVALID_VALUE));
    // SAFETY: a null handle; the driver is asked nothing because the symbol is absent.
    let err = unsafe { driver.complete_operation(7, ptr::null_mut()) }.unwrap_err();
    assert!(err.to_string().contains("CUDA 13.4 CustomStorage"), "{err}");
}
