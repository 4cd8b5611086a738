//! Benchmark of the posix engine's slot pipeline on device memory this process
//! allocates itself (no checkpoint API involved), next to the ceilings measured
//! in the same run: pinned `cuMemcpy` DtoH/HtoD of the same size (PCIe) and a
//! plain sequential write/read of the same bytes to the same directory (storage).
//!
//! ```text
//! posix_bench --dir /mnt/nvme/bench [--size-mib 8192] [--device 0]
//!             [--slots 1,2,4,8] [--chunks-mib 16,64,256] [--io-threads 0,4,7]
//!             [--library libcuda.so.1]
//!             [--buffered] [--repeat N] [--fake]
//! ```
//! `--io-threads 0` is the engine's default for the slot count. Each row pins its slots once,
//! outside the timed transfers, as the engine does (it pins while the driver's checkpoint call
//! or the extent verification runs); the pinning time is printed beside the row. The extent
//! file is removed before each write, outside the timing, as a checkpoint writes new files.
//! Last, `digest_file` (the posix restore's verification before the driver call) is timed
//! against the same storage read ceilings.
//! `--fake` runs everything against the test double (host memory stands in for
//! device memory): checks the CPU side without a GPU. Exit 2: no GPU.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::exit;
use std::time::Instant;

use gpusnap_cuda::driver::{Driver, DriverConfig};
use gpusnap_cuda::posix::{self, DeviceRegion, PinnedBuffer, PipelineOptions};

const MIB: usize = 1 << 20;
const PINNED_CAP: usize = 1 << 30;

struct Args {
    dir: PathBuf,
    size: usize,
    device: u32,
    slots: Vec<usize>,
    chunks: Vec<usize>,
    io_threads: Vec<usize>,
    library: String,
    direct: bool,
    fake: bool,
    repeat: usize,
}

fn usage(msg: &str) -> ! {
    eprintln!("posix_bench: {msg}");
    eprintln!(
        "usage: posix_bench --dir DIR [--size-mib N] [--device I] [--slots 1,2,4,8] \
         [--chunks-mib 16,64,256] [--io-threads 0,4,7] \
         [--library PATH] [--buffered] [--repeat N] [--fake]"
    );
    exit(64)
}

fn list(v: &str) -> Vec<usize> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| usage(&format!("bad number {x:?}")))
        })
        .collect()
}

fn parse() -> Args {
    let mut a = Args {
        dir: PathBuf::new(),
        size: 0,
        device: 0,
        slots: vec![1, 2, 4, 8],
        chunks: vec![16 * MIB, 64 * MIB, 256 * MIB],
        io_threads: vec![0],
        library: "libcuda.so.1".into(),
        direct: true,
        fake: false,
        repeat: 2,
    };
    let mut it = std::env::args().skip(1);
    let mut size_mib = None;
    while let Some(k) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{k} needs a value")))
        };
        match k.as_str() {
            "--dir" => a.dir = PathBuf::from(val()),
            "--size-mib" => size_mib = Some(list(&val())[0]),
            "--device" => a.device = list(&val())[0] as u32,
            "--slots" => a.slots = list(&val()),
            "--repeat" => a.repeat = list(&val())[0].max(1),
            "--chunks-mib" => a.chunks = list(&val()).into_iter().map(|c| c * MIB).collect(),
            "--io-threads" => a.io_threads = list(&val()),
            "--library" => a.library = val(),
            "--buffered" => a.direct = false,
            "--fake" => a.fake = true,
            "-h" | "--help" => usage("help"),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if a.dir.as_os_str().is_empty() {
        usage("--dir is required");
    }
    a.size = size_mib.unwrap_or(if a.fake { 256 } else { 8192 }) * MIB;
    a
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e9
}

type Res = u32;
type FnAlloc = unsafe extern "C" fn(*mut u64, usize) -> Res;
type FnFree = unsafe extern "C" fn(u64) -> Res;

/// Device memory: cuMemAlloc on a GPU, a host Vec with the fake.
enum Memory {
    Device {
        free: FnFree,
        ptr: u64,
        _lib: libloading::Library,
    },
    Host(Vec<u8>),
}

impl Memory {
    fn ptr(&mut self) -> u64 {
        match self {
            Memory::Device { ptr, .. } => *ptr,
            Memory::Host(v) => v.as_mut_ptr() as u64,
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Device { free, ptr, .. } = self {
            // SAFETY: allocated by cuMemAlloc_v2 below.
            unsafe { free(*ptr) };
        }
    }
}

fn alloc_device(driver: &Driver, size: usize) -> Result<Memory, String> {
    // SAFETY: the library is the driver already loaded by `Driver::load`.
    let lib =
        unsafe { libloading::Library::new(driver.library_path()) }.map_err(|e| e.to_string())?;
    // SAFETY: the documented cuMemAlloc_v2 / cuMemFree_v2 prototypes.
    let (alloc, free) = unsafe {
        (
            *lib.get::<FnAlloc>(b"cuMemAlloc_v2\0")
                .map_err(|e| format!("cuMemAlloc_v2: {e}"))?,
            *lib.get::<FnFree>(b"cuMemFree_v2\0")
                .map_err(|e| format!("cuMemFree_v2: {e}"))?,
        )
    };
    let mut ptr = 0u64;
    // SAFETY: valid out-pointer; a context is current.
    let rc = unsafe { alloc(&mut ptr, size) };
    if rc != 0 {
        return Err(format!(
            "cuMemAlloc_v2({size}) failed: {}",
            driver.cu_error(rc)
        ));
    }
    Ok(Memory::Device {
        free,
        ptr,
        _lib: lib,
    })
}

/// Plain sequential write then read of `size` bytes through `buf` (O_DIRECT when allowed).
fn storage_ceiling(
    path: &Path,
    buf: &mut [u8],
    size: usize,
    direct: bool,
) -> std::io::Result<(f64, f64)> {
    let open = |write: bool, flags: i32| {
        let mut o = OpenOptions::new();
        if write {
            o.write(true).create(true).truncate(true);
        } else {
            o.read(true);
        }
        o.custom_flags(flags).open(path)
    };
    let aligned = (buf.as_ptr() as usize).is_multiple_of(4096)
        && buf.len().is_multiple_of(4096)
        && size.is_multiple_of(4096);
    let flags = if direct && aligned { libc::O_DIRECT } else { 0 };
    let mut f = open(true, flags).or_else(|_| open(true, 0))?;
    let t = Instant::now();
    let mut done = 0;
    while done < size {
        let n = buf.len().min(size - done);
        f.write_all(&buf[..n])?;
        done += n;
    }
    f.sync_all()?;
    let w = t.elapsed().as_secs_f64();
    drop(f);
    let mut f = open(false, flags).or_else(|_| open(false, 0))?;
    // Best effort: drop cached pages so buffered reads hit the device.
    // SAFETY: plain fadvise on an fd we own.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    let t = Instant::now();
    let mut done = 0;
    while done < size {
        let n = buf.len().min(size - done);
        f.read_exact(&mut buf[..n])?;
        done += n;
    }
    let r = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(path);
    Ok((gbps(size, w), gbps(size, r)))
}

/// The same sequential write then read as [`storage_ceiling`], by `threads` threads on
/// disjoint quarters of the file with positional I/O, each through its own page-aligned
/// 64 MiB buffer: the pipeline writes with several threads, so a one-thread ceiling would
/// understate what the storage can take.
fn storage_ceiling_parallel(
    path: &Path,
    size: usize,
    threads: usize,
    direct: bool,
) -> std::io::Result<(f64, f64)> {
    use std::os::unix::fs::FileExt;
    const BUF: usize = 64 * MIB;
    let layout = std::alloc::Layout::from_size_align(BUF, 4096).expect("layout");
    struct Aligned(*mut u8, std::alloc::Layout);
    // SAFETY: each buffer is used by exactly one thread at a time.
    unsafe impl Send for Aligned {}
    impl Drop for Aligned {
        fn drop(&mut self) {
            // SAFETY: allocated below with this layout.
            unsafe { std::alloc::dealloc(self.0, self.1) }
        }
    }
    let mut bufs: Vec<Aligned> = (0..threads)
        .map(|i| {
            // SAFETY: non-zero size; checked for null below.
            let p = unsafe { std::alloc::alloc(layout) };
            assert!(!p.is_null(), "out of memory");
            // SAFETY: fresh allocation of BUF bytes; touched so timing excludes first faults.
            unsafe { std::ptr::write_bytes(p, 0x5a ^ i as u8, BUF) };
            Aligned(p, layout)
        })
        .collect();
    let per = size.div_ceil(threads).next_multiple_of(4096);
    let open = |write: bool, flags: i32| {
        let mut o = OpenOptions::new();
        if write {
            o.write(true).create(true).truncate(true);
        } else {
            o.read(true);
        }
        o.custom_flags(flags).open(path)
    };
    let flags = if direct && size.is_multiple_of(4096) {
        libc::O_DIRECT
    } else {
        0
    };
    let run = |write: bool, bufs: &mut Vec<Aligned>| -> std::io::Result<f64> {
        let f = open(write, flags).or_else(|_| open(write, 0))?;
        let t = Instant::now();
        std::thread::scope(|sc| -> std::io::Result<()> {
            let hs: Vec<_> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| {
                    let f = &f;
                    sc.spawn(move || -> std::io::Result<()> {
                        let (start, end) = ((i * per).min(size), ((i + 1) * per).min(size));
                        let mut off = start;
                        while off < end {
                            let n = BUF.min(end - off);
                            // SAFETY: this thread owns the buffer; n <= BUF.
                            let buf = unsafe { std::slice::from_raw_parts_mut(b.0, n) };
                            if write {
                                f.write_all_at(buf, off as u64)?;
                            } else {
                                f.read_exact_at(buf, off as u64)?;
                            }
                            off += n;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("ceiling thread")?;
            }
            Ok(())
        })?;
        if write {
            f.sync_all()?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let w = run(true, &mut bufs)?;
    if let Ok(f) = File::open(path) {
        // SAFETY: plain fadvise on an fd we own.
        unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
    }
    let r = run(false, &mut bufs)?;
    let _ = std::fs::remove_file(path);
    Ok((gbps(size, w), gbps(size, r)))
}

/// The row label of a pipeline setting: slots, chunk, I/O threads.
fn label(opts: &PipelineOptions) -> String {
    format!(
        "{:>5} {:>6}MiB {:>3}",
        opts.buffer_count,
        opts.chunk_bytes / MIB,
        opts.io_threads
            .unwrap_or_else(|| posix::pipeline::io_threads(opts.buffer_count)),
    )
}

/// Drops `path`'s pages from the page cache (no effect on tmpfs).
fn evict(path: &Path) {
    if let Ok(f) = File::open(path) {
        // SAFETY: plain fadvise on a fresh fd.
        unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
    }
}

/// One measured device→file then file→device of the whole region through `slots`.
fn round_trip(
    driver: &Driver,
    region: &DeviceRegion,
    path: &Path,
    slots: &mut posix::TransferSlots<'_>,
    opts: &PipelineOptions,
) -> Option<(posix::TransferStats, posix::TransferStats)> {
    // A checkpoint writes new files: do not time freeing the previous extent's pages.
    let _ = std::fs::remove_file(path);
    let w = match posix::device_to_file_through(driver, region, path, slots, opts) {
        Ok(w) => w,
        Err(e) => {
            println!("{}   device→file failed: {e}", label(opts));
            return None;
        }
    };
    evict(path);
    match posix::file_to_device_through(driver, region, path, Some(&w.blake3), slots, opts) {
        Ok(r) => Some((w, r)),
        Err(e) => {
            println!("{}   file→device failed: {e}", label(opts));
            None
        }
    }
}

fn main() {
    let args = parse();
    std::fs::create_dir_all(&args.dir)
        .unwrap_or_else(|e| usage(&format!("{}: {e}", args.dir.display())));

    let fake_dir = tempfile::tempdir().expect("tempdir");
    let library: PathBuf = if args.fake {
        let fake = gpusnap_fake_libcuda::FakeCuda::create(fake_dir.path()).expect("fake libcuda");
        fake.set_driver_version(13040).expect("fake version");
        fake.library_path()
    } else {
        PathBuf::from(&args.library)
    };
    let driver = match Driver::load(&DriverConfig::with_library(&library)) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("no GPU: {e}");
            exit(2)
        }
    };
    let Some(dev) = driver
        .capabilities()
        .devices
        .iter()
        .find(|d| d.index == args.device)
        .cloned()
    else {
        eprintln!(
            "no GPU: device {} not found ({} devices)",
            args.device,
            driver.capabilities().devices.len()
        );
        exit(2)
    };
    let ctx = match posix::retain_primary_context(&driver, dev.index) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("no GPU: {e}");
            exit(2)
        }
    };
    // SAFETY: `ctx` was just retained from this driver.
    unsafe { posix::make_current(&driver, ctx) }.expect("cuCtxSetCurrent");
    let mut mem = if args.fake {
        Memory::Host(vec![0u8; args.size])
    } else {
        match alloc_device(&driver, args.size) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("no GPU: {e}");
                exit(2)
            }
        }
    };
    let region = DeviceRegion {
        ctx,
        dev_ptr: mem.ptr(),
        size: args.size,
        stream: std::ptr::null_mut(), // the legacy default stream
    };
    println!(
        "posix_bench: {} ({}) driver {} {}, {} MiB, dir {}{}",
        dev.name,
        dev.uuid,
        driver.version(),
        if args.fake { "FAKE" } else { "" },
        args.size / MIB,
        args.dir.display(),
        if args.direct { "" } else { " (buffered)" }
    );

    // Fill the device and measure the PCIe ceilings with one 256 MiB pinned buffer.
    let mut pinned = PinnedBuffer::new(&driver, 256 * MIB).expect("pinned buffer");
    for (i, b) in pinned.as_mut_slice().iter_mut().enumerate() {
        *b = (i.wrapping_mul(2654435761) >> 13) as u8;
    }
    let t = Instant::now();
    pinned.sweep(&region, false).expect("HtoD fill");
    let htod = gbps(args.size, t.elapsed().as_secs_f64());
    let t = Instant::now();
    pinned.sweep(&region, true).expect("DtoH");
    let dtoh = gbps(args.size, t.elapsed().as_secs_f64());
    // Warm-up, not measured: the first pass over fresh memory pays the VM's first touch of
    // its pages (and tmpfs's first allocation), which would flatter whichever case ran second.
    let ceiling_path = args.dir.join("posix-bench-ceiling.bin");
    storage_ceiling(&ceiling_path, pinned.as_mut_slice(), args.size, args.direct)
        .expect("storage warm-up");
    let path = args.dir.join("posix-bench-extent.bin");
    let warm = PipelineOptions::new(args.slots[0], args.chunks[0]);
    if let Ok(w) = posix::device_to_file(&driver, &region, &path, &warm) {
        let _ = posix::file_to_device(&driver, &region, &path, Some(&w.blake3), &warm);
    }
    let _ = std::fs::remove_file(&path);
    // The ceiling is the better of two measurements, one before and one after the sweep, so
    // that the ratios are not flattered by a slow first ceiling.
    let (mut disk_w, mut disk_r) =
        storage_ceiling(&ceiling_path, pinned.as_mut_slice(), args.size, args.direct)
            .expect("storage ceiling");
    println!("ceilings: PCIe DtoH {dtoh:.2} GB/s, HtoD {htod:.2} GB/s; storage write {disk_w:.2} GB/s, read {disk_r:.2} GB/s (before the sweep)");
    println!(
        "{:>5} {:>9} {:>3} {:>12} {:>12} {:>6} {:>8}   (best of {} runs per row; pinning apart)",
        "slots", "chunk", "io", "dev→file", "file→dev", "direct", "pinning", args.repeat
    );

    let mut best = (0.0f64, 0.0f64);
    let mut rows_digest: Option<String> = None;
    let mut rows = Vec::new();
    let mut most_io = 1;
    for &chunk in &args.chunks {
        for &slots in &args.slots {
            if slots * chunk > PINNED_CAP {
                println!(
                    "{slots:>5} {:>6}MiB   skipped: {} MiB pinned exceeds the 1 GiB/GPU cap",
                    chunk / MIB,
                    slots * chunk / MIB
                );
                continue;
            }
            let mut seen_io = Vec::new();
            for &io in &args.io_threads {
                let mut base = PipelineOptions::new(slots, chunk);
                base.io_threads = (io > 0).then_some(io);
                // What the pipeline will use (it clamps to the slots): run each once.
                let used = base.io_threads.map_or_else(
                    || posix::pipeline::io_threads(slots),
                    |n| n.clamp(1, slots.saturating_sub(1).max(1)),
                );
                if seen_io.contains(&used) {
                    continue;
                }
                seen_io.push(used);
                base.io_threads = Some(used);
                most_io = most_io.max(used);
                let opts = PipelineOptions {
                    direct_io: args.direct,
                    ..base
                };
                let mut slots = match posix::TransferSlots::for_region(&driver, &region, &opts) {
                    Ok(s) => s,
                    Err(e) => {
                        println!("{}   pinning failed: {e}", label(&opts));
                        continue;
                    }
                };
                let pinning_ms = slots.pinned_in().as_secs_f64() * 1e3;
                let (mut wg, mut rg, mut direct) = (0.0f64, 0.0f64, true);
                for _ in 0..args.repeat {
                    let Some((w, r)) = round_trip(&driver, &region, &path, &mut slots, &opts)
                    else {
                        // The extent on disk is gone or partial now.
                        rows_digest = None;
                        break;
                    };
                    rows_digest = Some(w.blake3.clone());
                    wg = wg.max(w.gb_per_s());
                    rg = rg.max(r.gb_per_s());
                    direct &= w.direct_io && r.direct_io;
                }
                if wg == 0.0 {
                    continue;
                }
                best = (best.0.max(wg), best.1.max(rg));
                println!(
                    "{} {wg:>7.2} GB/s {rg:>7.2} GB/s {direct:>6} {pinning_ms:>5.0} ms",
                    label(&opts)
                );
                rows.push((label(&opts), wg, rg));
            }
        }
    }
    // The posix restore verifies each extent before the driver call: time it on the last
    // extent written (its digest must match the one the write computed).
    let verify = rows_digest.as_ref().map(|expected| {
        let t = Instant::now();
        let got = posix::digest_file(&path, None).expect("digest_file");
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(
            &got.1, expected,
            "digest_file disagrees with the pipeline's digest"
        );
        gbps(args.size, secs)
    });
    // A posix restore reads each extent twice: the verification before the driver call, then
    // the copy to the device. From a cold cache (as on another node), verification plus copy,
    // with the copy through O_DIRECT (storage again) or buffered (the page cache the
    // verification just filled); alternating, twice each, at the engine's default slots.
    // (Not with --buffered: both copies would be buffered.)
    let sequence = rows_digest
        .as_ref()
        .filter(|_| args.direct)
        .and_then(|expected| {
            let opts = PipelineOptions::new(8, 16 * MIB);
            let mut slots = posix::TransferSlots::for_region(&driver, &region, &opts).ok()?;
            let mut best = [f64::MAX, f64::MAX];
            for direct in [true, false, false, true] {
                evict(&path);
                let t = Instant::now();
                posix::digest_file(&path, None).expect("digest_file");
                let copy = PipelineOptions {
                    direct_io: direct,
                    ..opts.clone()
                };
                posix::file_to_device_through(
                    &driver,
                    &region,
                    &path,
                    Some(expected),
                    &mut slots,
                    &copy,
                )
                .expect("file→device after verification");
                let i = usize::from(!direct);
                best[i] = best[i].min(t.elapsed().as_secs_f64());
            }
            Some(best)
        });
    let _ = std::fs::remove_file(&path);
    let (w2, r2) = storage_ceiling(&ceiling_path, pinned.as_mut_slice(), args.size, args.direct)
        .expect("storage ceiling");
    drop(pinned);
    println!("ceilings: storage write {w2:.2} GB/s, read {r2:.2} GB/s (after the sweep)");
    disk_w = disk_w.max(w2);
    disk_r = disk_r.max(r2);
    // The storage with as many threads as the pipeline used at most (and with 4), so that
    // more I/O threads cannot flatter the ratios.
    let mut thread_counts = vec![4, most_io.max(2)];
    thread_counts.dedup();
    for threads in thread_counts {
        let (w3, r3) = storage_ceiling_parallel(&ceiling_path, args.size, threads, args.direct)
            .expect("parallel storage ceiling");
        println!("ceilings: storage write {w3:.2} GB/s, read {r3:.2} GB/s ({threads} threads)");
        disk_w = disk_w.max(w3);
        disk_r = disk_r.max(r3);
    }
    let ckpt_ceiling = dtoh.min(disk_w);
    let rest_ceiling = htod.min(disk_r);
    println!(
        "{:>5} {:>9} {:>3} {:>8} {:>8}   (of min(PCIe DtoH, storage write) = {ckpt_ceiling:.2} GB/s and min(PCIe HtoD, storage read) = {rest_ceiling:.2} GB/s)",
        "slots", "chunk", "io", "dev→file", "file→dev"
    );
    for (label, wg, rg) in rows {
        println!(
            "{label} {:>7.0}% {:>7.0}%",
            100.0 * wg / ckpt_ceiling,
            100.0 * rg / rest_ceiling
        );
    }
    if let Some([direct, buffered]) = sequence {
        println!(
            "restore sequence from a cold cache (verify, then copy to the device; 8 × 16 MiB, best of 2): copy with O_DIRECT {:.0} ms, buffered {:.0} ms ({:.2}x)",
            direct * 1e3,
            buffered * 1e3,
            buffered / direct
        );
    }
    if let Some(v) = verify {
        println!(
            "extent verification (digest_file, before the restore call): {v:.2} GB/s ({:.0}% of the storage read ceiling {disk_r:.2})",
            100.0 * v / disk_r
        );
    }
    println!(
        "best: device→file {:.2} GB/s ({:.0}% of min(PCIe DtoH, storage write) = {:.2}); file→device {:.2} GB/s ({:.0}% of min(PCIe HtoD, storage read) = {:.2})",
        best.0,
        100.0 * best.0 / ckpt_ceiling,
        ckpt_ceiling,
        best.1,
        100.0 * best.1 / rest_ceiling,
        rest_ceiling
    );
    // Keep the sweep's device memory alive until here.
    let _ = mem.ptr();
}
