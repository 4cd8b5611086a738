//! A minimal CUDA workload for hardware smoke tests: holds `MIB` MiB of device
//! memory filled with a pattern, keeps touching it, and verifies all of it at
//! the end. Exit status 0 means the memory survived whatever happened to the
//! process in between (lock, checkpoint, restore, unlock).
//!
//! Usage: `gpu_hold MIB SECONDS`. Prints `ready` once the memory is in place.
//! Uses raw driver entry points (not gpusnap's binding) on purpose: it stands
//! in for an unrelated application.

use std::ffi::c_void;
use std::io::Write;
use std::time::{Duration, Instant};

type Res = u32;

fn check(what: &str, rc: Res) {
    if rc != 0 {
        eprintln!("gpu_hold: {what} failed with CUresult {rc}");
        std::process::exit(2);
    }
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
    let bytes = mib << 20;

    // SAFETY: loading the system CUDA driver.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }.expect("load libcuda.so.1");
    // SAFETY: (all) these are the driver's exported C entry points with these
    // signatures (the _v2 names are the 64-bit ABI).
    let (init, device_get, retain, set_current, alloc, htod, dtoh) = unsafe {
        (
            *lib.get::<unsafe extern "C" fn(u32) -> Res>(b"cuInit\0")
                .unwrap(),
            *lib.get::<unsafe extern "C" fn(*mut i32, i32) -> Res>(b"cuDeviceGet\0")
                .unwrap(),
            *lib.get::<unsafe extern "C" fn(*mut *mut c_void, i32) -> Res>(
                b"cuDevicePrimaryCtxRetain\0",
            )
            .unwrap(),
            *lib.get::<unsafe extern "C" fn(*mut c_void) -> Res>(b"cuCtxSetCurrent\0")
                .unwrap(),
            *lib.get::<unsafe extern "C" fn(*mut u64, usize) -> Res>(b"cuMemAlloc_v2\0")
                .unwrap(),
            *lib.get::<unsafe extern "C" fn(u64, *const c_void, usize) -> Res>(
                b"cuMemcpyHtoD_v2\0",
            )
            .unwrap(),
            *lib.get::<unsafe extern "C" fn(*mut c_void, u64, usize) -> Res>(b"cuMemcpyDtoH_v2\0")
                .unwrap(),
        )
    };

    let host: Vec<u8> = (0..bytes).map(pattern).collect();
    let mut dev: u64 = 0;
    // SAFETY: (all calls below) valid out-pointers and buffers of the sizes passed.
    unsafe {
        check("cuInit", init(0));
        let mut device = 0;
        check("cuDeviceGet", device_get(&mut device, 0));
        let mut ctx = std::ptr::null_mut();
        check("cuDevicePrimaryCtxRetain", retain(&mut ctx, device));
        check("cuCtxSetCurrent", set_current(ctx));
        check("cuMemAlloc", alloc(&mut dev, bytes));
        check("cuMemcpyHtoD", htod(dev, host.as_ptr().cast(), bytes));
    }
    println!("ready {}", std::process::id());
    std::io::stdout().flush().ok();

    let chunk = 1 << 20;
    let mut probe = vec![0u8; chunk];
    let mut rounds = 0u64;
    let mut longest_stall = Duration::ZERO;
    let until = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < until {
        let offset = (rounds as usize * chunk) % bytes;
        let started = Instant::now();
        // SAFETY: `probe` holds `chunk` bytes; the range is inside the allocation.
        unsafe {
            check(
                "cuMemcpyDtoH",
                dtoh(probe.as_mut_ptr().cast(), dev + offset as u64, chunk),
            )
        };
        longest_stall = longest_stall.max(started.elapsed());
        if probe[..] != host[offset..offset + chunk] {
            eprintln!("gpu_hold: mismatch at offset {offset} in round {rounds}");
            std::process::exit(1);
        }
        rounds += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut back = vec![0u8; bytes];
    // SAFETY: `back` holds `bytes` bytes.
    unsafe { check("cuMemcpyDtoH", dtoh(back.as_mut_ptr().cast(), dev, bytes)) };
    let mismatches = back.iter().zip(&host).filter(|(a, b)| a != b).count();
    println!(
        "done rounds={rounds} mismatches={mismatches} longest_stall_ms={}",
        longest_stall.as_millis()
    );
    std::process::exit(if mismatches == 0 { 0 } else { 1 });
}
