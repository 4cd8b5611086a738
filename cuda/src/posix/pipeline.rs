//! The slot pipeline: device memory ⇄ pinned host slots ⇄ one file, with the
//! device copies of one slot overlapping the file I/O of another.
//!
//! It works on any device region (a CustomStorage mapping or memory a benchmark
//! allocated itself): a device pointer, a size, a stream and the context the
//! stream lives in. The calling thread issues the copies on the stream; up to
//! [`io_threads`] threads do positional file I/O on different chunks at once
//! (one write in flight is what kept a single writer below the storage rate);
//! one more thread computes the BLAKE3 digest in file order. Slots travel
//! between them over channels, so with `N` slots up to `N - 1` chunks are in
//! file I/O while one is being copied.
//!
//! The deadline is cooperative: both loops check it between chunks. Driver
//! calls themselves cannot be interrupted.

use std::ffi::c_void;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::driver::ffi::{CuContext, CuDevicePtr, CuStream};
use crate::driver::{CuError, Driver, MemoryApi};

/// Alignment `O_DIRECT` needs for buffers, offsets and lengths (bytes).
pub const DIRECT_ALIGN: usize = 4096;

/// How a transfer runs.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// Pinned slots (1–8).
    pub buffer_count: usize,
    /// Bytes per slot.
    pub chunk_bytes: usize,
    /// Stop between chunks once this has passed.
    pub deadline: Option<Instant>,
    /// Try `O_DIRECT`; falls back to buffered I/O where the filesystem refuses it.
    pub direct_io: bool,
    /// Threads doing file I/O at once (at most one fewer than the slots); `None`: [`io_threads`].
    pub io_threads: Option<usize>,
    /// Test hook: the writer fails with `ENOSPC` once this many bytes were written.
    #[doc(hidden)]
    pub fail_write_after: Option<u64>,
}

impl PipelineOptions {
    pub fn new(buffer_count: usize, chunk_bytes: usize) -> Self {
        Self {
            buffer_count,
            chunk_bytes,
            deadline: None,
            direct_io: true,
            io_threads: None,
            fail_write_after: None,
        }
    }
}

/// A device region and the stream/context to copy it with.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRegion {
    /// Made current on the copying thread (null: leave the current context).
    pub ctx: CuContext,
    pub dev_ptr: CuDevicePtr,
    pub size: usize,
    pub stream: CuStream,
}

// SAFETY: the handles are plain driver tokens; the driver API is thread-safe
// and the pipeline makes the context current on the thread that uses them.
unsafe impl Send for DeviceRegion {}
// SAFETY: as above; the struct is never mutated through a shared reference.
unsafe impl Sync for DeviceRegion {}

/// What one transfer did.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferStats {
    pub bytes: u64,
    /// BLAKE3 of the bytes, lowercase hex.
    pub blake3: String,
    pub elapsed: Duration,
    /// Whether `O_DIRECT` moved at least one chunk (needs page-aligned slots,
    /// which `cuMemHostAlloc` gives, and a filesystem that allows it).
    pub direct_io: bool,
}

impl TransferStats {
    /// Decimal gigabytes per second.
    pub fn gb_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s / 1e9
        } else {
            0.0
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("{call} failed: {error}")]
    Cuda { call: &'static str, error: CuError },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the operation deadline passed after {done} of {total} bytes (max_operation watchdog)"
    )]
    Deadline { done: u64, total: u64 },
    #[error(
        "extent {} has BLAKE3 {actual}, but the checkpoint recorded {expected}: it was changed or damaged",
        path.display()
    )]
    Digest {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("extent {} holds {actual} bytes, but the device region is {expected} bytes", path.display())]
    Size {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("{0}")]
    Invalid(String),
}

impl PipelineError {
    pub fn is_deadline(&self) -> bool {
        matches!(self, Self::Deadline { .. })
    }
}

fn memory(driver: &Driver) -> Result<&MemoryApi, PipelineError> {
    driver.memory_api().ok_or_else(|| {
        PipelineError::Invalid(format!(
            "driver {} lacks the context, stream or copy functions the posix pipeline needs",
            driver.version()
        ))
    })
}

fn cuda(driver: &Driver, call: &'static str, rc: u32) -> Result<(), PipelineError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(PipelineError::Cuda {
            call,
            error: driver.cu_error(rc),
        })
    }
}

/// One pinned slot; ownership moves between the copy and the I/O thread.
struct Slot {
    ptr: *mut u8,
}
// SAFETY: exactly one thread owns a slot at a time (it travels through channels).
unsafe impl Send for Slot {}

/// Page-locked transfer slots for transfers on one context, freed on drop.
///
/// Allocated apart from the transfer so that a caller can pin them ahead, off the path where
/// the process waits: `cuMemHostAlloc` pins page by page and takes milliseconds per slot.
pub struct TransferSlots<'a> {
    driver: &'a Driver,
    mem: &'a MemoryApi,
    ctx: CuContext,
    ptrs: Vec<*mut c_void>,
    chunk_bytes: usize,
    pinned_in: Duration,
    /// A CUDA copy or synchronisation failed during a transfer: a copy into a slot may still
    /// be in flight, so the slots must not carry another transfer.
    poisoned: bool,
}

// SAFETY: the pointers are page-locked host memory usable from any thread, and the driver
// API is thread-safe; the slots are handed to one transfer at a time (`&mut` below).
unsafe impl Send for TransferSlots<'_> {}

impl std::fmt::Debug for TransferSlots<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferSlots")
            .field("count", &self.ptrs.len())
            .field("chunk_bytes", &self.chunk_bytes)
            .finish_non_exhaustive()
    }
}

impl<'a> TransferSlots<'a> {
    /// `count` slots (1–8) of `chunk_bytes` (a positive multiple of [`DIRECT_ALIGN`]), pinned
    /// for `ctx` (made current on this thread; null: the current context).
    pub fn alloc(
        driver: &'a Driver,
        ctx: CuContext,
        count: usize,
        chunk_bytes: usize,
    ) -> Result<Self, PipelineError> {
        check_shape(count, chunk_bytes)?;
        let started = Instant::now();
        set_current(driver, ctx)?;
        let mem = memory(driver)?;
        let mut slots = Self {
            driver,
            mem,
            ctx,
            ptrs: Vec::with_capacity(count),
            chunk_bytes,
            pinned_in: Duration::ZERO,
            poisoned: false,
        };
        for _ in 0..count {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-pointer; flags 0 = page-locked for the current context.
            let rc = unsafe { (mem.mem_host_alloc)(&mut p, chunk_bytes, 0) };
            cuda(driver, "cuMemHostAlloc", rc)?;
            slots.ptrs.push(p);
        }
        slots.pinned_in = started.elapsed();
        Ok(slots)
    }

    /// The slots [`device_to_file`] and [`file_to_device`] pin for `region` with `opts`: no
    /// larger than the region needs.
    pub fn for_region(
        driver: &'a Driver,
        region: &DeviceRegion,
        opts: &PipelineOptions,
    ) -> Result<Self, PipelineError> {
        Self::alloc(
            driver,
            region.ctx,
            opts.buffer_count,
            slot_bytes(opts.chunk_bytes, region.size),
        )
    }

    pub fn count(&self) -> usize {
        self.ptrs.len()
    }

    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// How long pinning took.
    pub fn pinned_in(&self) -> Duration {
        self.pinned_in
    }

    /// Refuses slots a failed CUDA copy may still be writing to or reading from.
    fn usable(&self) -> Result<(), PipelineError> {
        if self.poisoned {
            return Err(PipelineError::Invalid(
                "these transfer slots are unusable: a CUDA copy through them failed".into(),
            ));
        }
        Ok(())
    }

    fn slots(&self) -> impl Iterator<Item = Slot> + '_ {
        self.ptrs.iter().map(|p| Slot { ptr: p.cast() })
    }

    /// I/O threads for `opts` with these slots: at most one fewer than the slots, so that the
    /// copy thread always has one.
    fn io_threads(&self, opts: &PipelineOptions) -> usize {
        let count = self.count();
        opts.io_threads.map_or_else(
            || io_threads(count),
            |n| n.clamp(1, count.saturating_sub(1).max(1)),
        )
    }
}

impl Drop for TransferSlots<'_> {
    fn drop(&mut self) {
        if self.ptrs.is_empty() {
            return;
        }
        // On a short-lived thread with the allocating context current: freeing needs a
        // context, and making one current here would change the dropping thread's state.
        // Addresses as integers: raw pointers are not Send.
        let (driver, mem, ctx) = (self.driver, self.mem, self.ctx as usize);
        let ptrs: Vec<usize> = std::mem::take(&mut self.ptrs)
            .into_iter()
            .map(|p| p as usize)
            .collect();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                if ctx != 0 {
                    let _ = set_current(driver, ctx as CuContext);
                }
                for p in ptrs {
                    // SAFETY: allocated by cuMemHostAlloc in `alloc`; every transfer that used
                    // these slots joined its threads before returning, and a slot a failed copy
                    // may still target is never freed early (the poisoned slots are freed here,
                    // after the failed transfer returned).
                    let rc = unsafe { (mem.mem_free_host)(p as *mut c_void) };
                    if rc != 0 {
                        tracing::warn!(error = %driver.cu_error(rc), "cuMemFreeHost failed");
                    }
                }
            });
        });
    }
}

/// Slot size for a region of `size` bytes: `chunk_bytes`, or less for a smaller region,
/// rounded up to the `O_DIRECT` alignment.
pub fn slot_bytes(chunk_bytes: usize, size: usize) -> usize {
    chunk_bytes.min(size.max(1).next_multiple_of(DIRECT_ALIGN))
}

fn check_shape(count: usize, chunk_bytes: usize) -> Result<(), PipelineError> {
    if !(1..=8).contains(&count) {
        return Err(PipelineError::Invalid(format!(
            "transfer buffer count {count} is outside 1–8"
        )));
    }
    if chunk_bytes == 0 || !chunk_bytes.is_multiple_of(DIRECT_ALIGN) {
        return Err(PipelineError::Invalid(format!(
            "transfer chunk of {chunk_bytes} bytes is not a positive multiple of {DIRECT_ALIGN}"
        )));
    }
    Ok(())
}

fn check_options(opts: &PipelineOptions) -> Result<(), PipelineError> {
    check_shape(opts.buffer_count, opts.chunk_bytes)
}

fn set_current(driver: &Driver, ctx: CuContext) -> Result<(), PipelineError> {
    if ctx.is_null() {
        return Ok(());
    }
    let mem = memory(driver)?;
    // SAFETY: `ctx` is a retained primary context.
    cuda(driver, "cuCtxSetCurrent", unsafe {
        (mem.ctx_set_current)(ctx)
    })
}

fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

fn wait_left(deadline: Option<Instant>) -> Duration {
    deadline.map_or(Duration::from_secs(3600 * 24), |d| {
        d.saturating_duration_since(Instant::now())
    })
}

/// An open extent file, `O_DIRECT` when the filesystem allows it.
struct Extent {
    file: File,
    path: PathBuf,
    direct: bool,
}

impl Extent {
    fn open(path: &Path, write: bool, direct: bool) -> Result<Self, PipelineError> {
        let open = |flags: i32| {
            let mut o = OpenOptions::new();
            if write {
                o.write(true).create(true).truncate(true).mode(0o600);
            } else {
                o.read(true);
            }
            o.custom_flags(flags).open(path)
        };
        let what = if write {
            "creating extent"
        } else {
            "opening extent"
        };
        if direct {
            match open(libc::O_DIRECT) {
                Ok(file) => {
                    return Ok(Self {
                        file,
                        path: path.to_owned(),
                        direct: true,
                    })
                }
                // tmpfs and some FUSE filesystems refuse O_DIRECT.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(source) => {
                    return Err(PipelineError::Io {
                        what,
                        path: path.to_owned(),
                        source,
                    })
                }
            }
        }
        let file = open(0).map_err(|source| PipelineError::Io {
            what,
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            file,
            path: path.to_owned(),
            direct: false,
        })
    }

    /// Drops `O_DIRECT` for the rest of the file (unaligned tail, or refused).
    fn go_buffered(&mut self) {
        if !self.direct {
            return;
        }
        let fd = self.file.as_raw_fd();
        // SAFETY: fcntl on an fd this struct owns.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT);
            }
        }
        self.direct = false;
    }

    fn aligned(&self, buf: *const u8, len: usize, offset: u64) -> bool {
        (buf as usize).is_multiple_of(DIRECT_ALIGN)
            && len.is_multiple_of(DIRECT_ALIGN)
            && offset.is_multiple_of(DIRECT_ALIGN as u64)
    }

    /// Another handle on the same open file, for another I/O thread.
    fn try_clone(&self) -> Result<Self, PipelineError> {
        Ok(Self {
            file: self
                .file
                .try_clone()
                .map_err(|e| self.err("duplicating extent handle", e))?,
            path: self.path.clone(),
            direct: self.direct,
        })
    }

    fn err(&self, what: &'static str, source: io::Error) -> PipelineError {
        PipelineError::Io {
            what,
            path: self.path.clone(),
            source,
        }
    }

    /// Whether `O_DIRECT` did the write.
    fn write_at(&mut self, data: &[u8], offset: u64) -> Result<bool, PipelineError> {
        if self.direct && !self.aligned(data.as_ptr(), data.len(), offset) {
            self.go_buffered();
        }
        match self.file.write_all_at(data, offset) {
            Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                self.go_buffered();
                self.file
                    .write_all_at(data, offset)
                    .map_err(|e| self.err("writing extent", e))?;
                Ok(false)
            }
            r => r
                .map(|()| self.direct)
                .map_err(|e| self.err("writing extent", e)),
        }
    }

    /// Whether `O_DIRECT` did the read.
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<bool, PipelineError> {
        if self.direct && !self.aligned(buf.as_ptr(), buf.len(), offset) {
            self.go_buffered();
        }
        match self.file.read_exact_at(buf, offset) {
            Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                self.go_buffered();
                self.file
                    .read_exact_at(buf, offset)
                    .map_err(|e| self.err("reading extent", e))?;
                Ok(false)
            }
            r => r
                .map(|()| self.direct)
                .map_err(|e| self.err("reading extent", e)),
        }
    }
}

/// How many threads do file I/O at once with `buffer_count` slots: all slots but
/// the one being copied (at most 7, with 8 slots). On the H200 seven readers read a tmpfs
/// extent at 12–16 GB/s where four reached 10–12, and seven writers were no slower.
pub fn io_threads(buffer_count: usize) -> usize {
    buffer_count.saturating_sub(1).max(1)
}

/// Hashes slots in file order on its own thread (they may arrive out of order
/// from several I/O threads), each slot on all cores, then frees them, so that
/// the digest overlaps the file I/O instead of adding to it.
fn hash_slots(rx: mpsc::Receiver<(Slot, usize, u64)>, free_tx: mpsc::Sender<Slot>) -> String {
    let mut hasher = blake3::Hasher::new();
    let mut next = 0u64;
    let mut waiting: std::collections::BTreeMap<u64, (Slot, usize)> = Default::default();
    for (slot, len, offset) in rx {
        waiting.insert(offset, (slot, len));
        while let Some((slot, len)) = waiting.remove(&next) {
            // update_rayon spreads one slot over all cores (same digest as a serial
            // update): a single hashing core would cap the pipeline below the storage rate.
            // SAFETY: the slot holds `len` valid bytes and nobody writes it until
            // it is freed below.
            hasher.update_rayon(unsafe { std::slice::from_raw_parts(slot.ptr, len) });
            next += len as u64;
            // The other side may be done already.
            let _ = free_tx.send(slot);
        }
    }
    hasher.finalize().to_hex().to_string()
}

/// Joins every I/O thread of a transfer: their results, or the first error (a panic counts
/// as one).
fn join_all<T>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T, PipelineError>>>,
    role: &str,
) -> Result<Vec<T>, PipelineError> {
    let mut out = Vec::with_capacity(handles.len());
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(PipelineError::Invalid(format!(
                    "an extent {role} thread panicked"
                )));
            }
        }
    }
    first_err.map_or(Ok(out), Err)
}

/// A receiver shared by several I/O threads.
type Shared<T> = std::sync::Arc<std::sync::Mutex<mpsc::Receiver<T>>>;

fn shared<T>(rx: mpsc::Receiver<T>) -> Shared<T> {
    std::sync::Arc::new(std::sync::Mutex::new(rx))
}

fn take<T>(rx: &Shared<T>) -> Option<T> {
    rx.lock().unwrap_or_else(|e| e.into_inner()).recv().ok()
}

/// Sets its flag when the thread holding it unwinds.
struct StopOnPanic<'s>(&'s std::sync::atomic::AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// [`take`], giving up once `stop` is set.
fn take_unless<T>(rx: &Shared<T>, stop: &std::sync::atomic::AtomicBool) -> Option<T> {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(Duration::from_millis(20))
        {
            Ok(v) => return Some(v),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
    None
}

/// Device → pinned slots → `path` (created or truncated, fsynced), with the
/// BLAKE3 of the bytes. On error the file is left for the caller to remove.
/// Pins its slots first ([`TransferSlots::for_region`]), and its time includes that.
pub fn device_to_file(
    driver: &Driver,
    region: &DeviceRegion,
    path: &Path,
    opts: &PipelineOptions,
) -> Result<TransferStats, PipelineError> {
    check_options(opts)?;
    let started = Instant::now();
    let mut slots = TransferSlots::for_region(driver, region, opts)?;
    let mut stats = device_to_file_through(driver, region, path, &mut slots, opts)?;
    stats.elapsed = started.elapsed();
    Ok(stats)
}

/// [`device_to_file`] through slots pinned ahead (for `region.ctx`); `opts`' slot count and
/// chunk size are the slots' own.
pub fn device_to_file_through(
    driver: &Driver,
    region: &DeviceRegion,
    path: &Path,
    pinned: &mut TransferSlots<'_>,
    opts: &PipelineOptions,
) -> Result<TransferStats, PipelineError> {
    pinned.usable()?;
    let started = Instant::now();
    set_current(driver, region.ctx)?;
    let mem = memory(driver)?;
    let extent = Extent::open(path, true, opts.direct_io)?;
    let chunk = pinned.chunk_bytes();
    let total = region.size as u64;

    let (filled_tx, filled_rx) = mpsc::sync_channel::<(Slot, usize, u64)>(pinned.count());
    let (free_tx, free_rx) = mpsc::channel::<Slot>();
    for s in pinned.slots() {
        let _ = free_tx.send(s);
    }
    let deadline = opts.deadline;
    let fail_after = opts.fail_write_after;

    let (hash_tx, hash_rx) = mpsc::channel::<(Slot, usize, u64)>();
    let writers: Vec<Extent> = (0..pinned.io_threads(opts))
        .map(|_| extent.try_clone())
        .collect::<Result<_, _>>()?;
    let filled_rx = shared(filled_rx);
    let written = std::sync::atomic::AtomicU64::new(0);

    let (copied, writer, digest) = std::thread::scope(|scope| {
        let hasher = scope.spawn(move || hash_slots(hash_rx, free_tx));
        let handles: Vec<_> = writers
            .into_iter()
            .map(|mut extent| {
                let (filled_rx, hash_tx, written) = (filled_rx.clone(), hash_tx.clone(), &written);
                scope.spawn(move || -> Result<bool, PipelineError> {
                    let mut used_direct = false;
                    while let Some((slot, len, offset)) = take(&filled_rx) {
                        // SAFETY: the copy thread filled `len` bytes of this slot and
                        // synchronised the stream before handing it over.
                        let data = unsafe { std::slice::from_raw_parts(slot.ptr, len) };
                        let before =
                            written.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
                        if fail_after.is_some_and(|limit| before + len as u64 > limit) {
                            return Err(extent.err(
                                "writing extent",
                                io::Error::from_raw_os_error(libc::ENOSPC),
                            ));
                        }
                        used_direct |= extent.write_at(data, offset)?;
                        let _ = hash_tx.send((slot, len, offset));
                    }
                    Ok(used_direct)
                })
            })
            .collect();
        drop(hash_tx);
        let writer = scope.spawn(move || -> Result<bool, PipelineError> {
            let used_direct = join_all(handles, "writer")?.into_iter().any(|d| d);
            extent
                .file
                .sync_all()
                .map_err(|e| extent.err("syncing extent", e))?;
            Ok(used_direct)
        });

        let mut offset = 0u64;
        let copied = loop {
            if offset >= total {
                break Ok(offset);
            }
            if past(deadline) {
                break Err(PipelineError::Deadline {
                    done: offset,
                    total,
                });
            }
            let slot = match free_rx.recv_timeout(wait_left(deadline)) {
                Ok(s) => s,
                Err(RecvTimeoutError::Timeout) => {
                    break Err(PipelineError::Deadline {
                        done: offset,
                        total,
                    })
                }
                // The writer stopped; its error is the one to report.
                Err(RecvTimeoutError::Disconnected) => break Ok(offset),
            };
            let len = chunk.min((total - offset) as usize);
            // SAFETY: the slot holds `chunk >= len` bytes; the source range lies
            // inside the region; the stream belongs to the current context.
            let rc = unsafe {
                (mem.memcpy_dtoh_async)(
                    slot.ptr.cast(),
                    region.dev_ptr + offset,
                    len,
                    region.stream,
                )
            };
            if let Err(e) = cuda(driver, "cuMemcpyDtoHAsync", rc) {
                break Err(e);
            }
            // SAFETY: a stream of the current context.
            let rc = unsafe { (mem.stream_synchronize)(region.stream) };
            if let Err(e) = cuda(driver, "cuStreamSynchronize", rc) {
                break Err(e);
            }
            if filled_tx.send((slot, len, offset)).is_err() {
                break Ok(offset);
            }
            offset += len as u64;
        };
        drop(filled_tx);
        drop(free_rx);
        let writer = writer.join();
        (copied, writer, hasher.join())
    });

    let writer =
        writer.map_err(|_| PipelineError::Invalid("the extent writer thread panicked".into()))?;
    let digest =
        digest.map_err(|_| PipelineError::Invalid("the hashing thread panicked".into()))?;
    if matches!(copied, Err(PipelineError::Cuda { .. })) {
        pinned.poisoned = true;
    }
    let copied = copied?;
    let direct_io = writer?;
    if copied != total {
        return Err(PipelineError::Invalid(format!(
            "copied {copied} of {total} bytes to {}",
            path.display()
        )));
    }
    Ok(TransferStats {
        bytes: total,
        blake3: digest,
        elapsed: started.elapsed(),
        direct_io,
    })
}

/// `path` → pinned slots → device. The file must hold exactly `region.size`
/// bytes; with `expected` its BLAKE3 (computed while reading) must match.
/// Pins its slots first ([`TransferSlots::for_region`]), and its time includes that.
pub fn file_to_device(
    driver: &Driver,
    region: &DeviceRegion,
    path: &Path,
    expected: Option<&str>,
    opts: &PipelineOptions,
) -> Result<TransferStats, PipelineError> {
    check_options(opts)?;
    let started = Instant::now();
    let mut slots = TransferSlots::for_region(driver, region, opts)?;
    let mut stats = file_to_device_through(driver, region, path, expected, &mut slots, opts)?;
    stats.elapsed = started.elapsed();
    Ok(stats)
}

/// [`file_to_device`] through slots pinned ahead (for `region.ctx`); `opts`' slot count and
/// chunk size are the slots' own.
pub fn file_to_device_through(
    driver: &Driver,
    region: &DeviceRegion,
    path: &Path,
    expected: Option<&str>,
    pinned: &mut TransferSlots<'_>,
    opts: &PipelineOptions,
) -> Result<TransferStats, PipelineError> {
    pinned.usable()?;
    let started = Instant::now();
    set_current(driver, region.ctx)?;
    let mem = memory(driver)?;
    let extent = Extent::open(path, false, opts.direct_io)?;
    let total = region.size as u64;
    let actual = extent
        .file
        .metadata()
        .map_err(|e| extent.err("inspecting extent", e))?
        .len();
    if actual != total {
        return Err(PipelineError::Size {
            path: path.to_owned(),
            expected: total,
            actual,
        });
    }
    let chunk = pinned.chunk_bytes();
    let (filled_tx, filled_rx) = mpsc::sync_channel::<(Slot, usize, u64)>(pinned.count());
    let (free_tx, free_rx) = mpsc::channel::<Slot>();
    for s in pinned.slots() {
        let _ = free_tx.send(s);
    }
    let deadline = opts.deadline;

    let (hash_tx, hash_rx) = mpsc::channel::<(Slot, usize, u64)>();
    let readers: Vec<Extent> = (0..pinned.io_threads(opts))
        .map(|_| extent.try_clone())
        .collect::<Result<_, _>>()?;
    let free_rx = shared(free_rx);
    let next_offset = std::sync::atomic::AtomicU64::new(0);

    let (copied, reader, digest) = std::thread::scope(|scope| {
        let hasher = scope.spawn(move || hash_slots(hash_rx, free_tx));
        let handles: Vec<_> = readers
            .into_iter()
            .map(|mut extent| {
                let (free_rx, filled_tx, next_offset) =
                    (free_rx.clone(), filled_tx.clone(), &next_offset);
                scope.spawn(move || -> Result<bool, PipelineError> {
                    let mut used_direct = false;
                    loop {
                        if past(deadline) {
                            return Err(PipelineError::Deadline {
                                done: next_offset.load(std::sync::atomic::Ordering::Relaxed),
                                total,
                            });
                        }
                        let Some(slot) = take(&free_rx) else {
                            break; // the copy loop gave up
                        };
                        let offset = next_offset
                            .fetch_add(chunk as u64, std::sync::atomic::Ordering::Relaxed);
                        if offset >= total {
                            break;
                        }
                        let len = chunk.min((total - offset) as usize);
                        // SAFETY: this thread owns the slot, which holds `chunk >= len` bytes.
                        let buf = unsafe { std::slice::from_raw_parts_mut(slot.ptr, len) };
                        used_direct |= extent.read_at(buf, offset)?;
                        if filled_tx.send((slot, len, offset)).is_err() {
                            break;
                        }
                    }
                    Ok(used_direct)
                })
            })
            .collect();
        drop(filled_tx);
        let reader = scope.spawn(move || -> Result<bool, PipelineError> {
            Ok(join_all(handles, "reader")?.into_iter().any(|d| d))
        });

        let mut done = 0u64;
        let copied = loop {
            if done >= total {
                break Ok(done);
            }
            if past(deadline) {
                break Err(PipelineError::Deadline { done, total });
            }
            let (slot, len, offset) = match filled_rx.recv_timeout(wait_left(deadline)) {
                Ok(v) => v,
                Err(RecvTimeoutError::Timeout) => {
                    break Err(PipelineError::Deadline { done, total })
                }
                Err(RecvTimeoutError::Disconnected) => break Ok(done),
            };
            // SAFETY: the reader filled `len` bytes; the destination range lies
            // inside the region; the stream belongs to the current context.
            let rc = unsafe {
                (mem.memcpy_htod_async)(
                    region.dev_ptr + offset,
                    slot.ptr.cast_const().cast(),
                    len,
                    region.stream,
                )
            };
            if let Err(e) = cuda(driver, "cuMemcpyHtoDAsync", rc) {
                break Err(e);
            }
            // The slot may be refilled only once the copy out of it finished.
            // SAFETY: a stream of the current context.
            let rc = unsafe { (mem.stream_synchronize)(region.stream) };
            if let Err(e) = cuda(driver, "cuStreamSynchronize", rc) {
                break Err(e);
            }
            done += len as u64;
            // Hashed after the copy (the slot is unchanged), then refilled.
            let _ = hash_tx.send((slot, len, offset));
        };
        drop(hash_tx);
        drop(filled_rx);
        let reader = reader.join();
        (copied, reader, hasher.join())
    });

    let reader =
        reader.map_err(|_| PipelineError::Invalid("the extent reader thread panicked".into()))?;
    let digest =
        digest.map_err(|_| PipelineError::Invalid("the hashing thread panicked".into()))?;
    if matches!(copied, Err(PipelineError::Cuda { .. })) {
        pinned.poisoned = true;
    }
    let copied = copied?;
    let direct_io = reader?;
    if copied != total {
        return Err(PipelineError::Invalid(format!(
            "copied {copied} of {total} bytes from {}",
            path.display()
        )));
    }
    if let Some(expected) = expected {
        if !expected.eq_ignore_ascii_case(&digest) {
            return Err(PipelineError::Digest {
                path: path.to_owned(),
                expected: expected.to_owned(),
                actual: digest,
            });
        }
    }
    Ok(TransferStats {
        bytes: total,
        blake3: digest,
        elapsed: started.elapsed(),
        direct_io,
    })
}

/// Bytes per read of [`digest_file`].
const DIGEST_PIECE: usize = 8 << 20;
/// Buffers of [`digest_file`]: one more than its readers, so the hasher always has one.
const DIGEST_BUFFERS: usize = 8;

/// BLAKE3 of a whole file (its length when opened), checking the deadline between reads.
///
/// Several threads read pieces at once and one thread hashes them in file order, each piece
/// on all cores: one reading and hashing thread reaches a fraction of what the storage and
/// the CPU take, and this runs before a restore, while the process waits.
pub fn digest_file(path: &Path, deadline: Option<Instant>) -> Result<(u64, String), PipelineError> {
    let io_err = |source| PipelineError::Io {
        what: "reading extent",
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let total = file.metadata().map_err(io_err)?.len();
    let pieces = total.div_ceil(DIGEST_PIECE as u64).max(1) as usize;
    let mut buffers: Vec<Vec<u8>> = (0..DIGEST_BUFFERS.min(pieces + 1))
        .map(|_| vec![0u8; DIGEST_PIECE])
        .collect();
    let (free_tx, free_rx) = mpsc::channel::<Slot>();
    for b in &mut buffers {
        let _ = free_tx.send(Slot {
            ptr: b.as_mut_ptr(),
        });
    }
    let (hash_tx, hash_rx) = mpsc::channel::<(Slot, usize, u64)>();
    let free_rx = shared(free_rx);
    let next_offset = std::sync::atomic::AtomicU64::new(0);
    // A failed reader leaves a gap the hasher never gets past, so the others must stop rather
    // than wait for a buffer it will not free.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let readers = io_threads(buffers.len());
    let (read, digest) = std::thread::scope(|scope| {
        let hasher = scope.spawn(move || hash_slots(hash_rx, free_tx));
        let handles: Vec<_> = (0..readers)
            .map(|_| {
                let (free_rx, hash_tx, next_offset, file, stop) =
                    (free_rx.clone(), hash_tx.clone(), &next_offset, &file, &stop);
                scope.spawn(move || -> Result<(), PipelineError> {
                    // A panicking reader leaves a gap too.
                    let _stop_on_panic = StopOnPanic(stop);
                    let fail = |e: PipelineError| {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        Err(e)
                    };
                    loop {
                        let Some(slot) = take_unless(&free_rx, stop) else {
                            return Ok(());
                        };
                        let offset = next_offset
                            .fetch_add(DIGEST_PIECE as u64, std::sync::atomic::Ordering::Relaxed);
                        if offset >= total {
                            return Ok(());
                        }
                        if past(deadline) {
                            return fail(PipelineError::Deadline {
                                done: offset,
                                total,
                            });
                        }
                        let len = DIGEST_PIECE.min((total - offset) as usize);
                        // SAFETY: this thread owns the slot, a buffer of DIGEST_PIECE >= len
                        // bytes that outlives the scope.
                        let buf = unsafe { std::slice::from_raw_parts_mut(slot.ptr, len) };
                        if let Err(e) = file.read_exact_at(buf, offset) {
                            return fail(if e.kind() == io::ErrorKind::UnexpectedEof {
                                PipelineError::Invalid(format!(
                                    "extent {} shrank while it was being verified",
                                    path.display()
                                ))
                            } else {
                                io_err(e)
                            });
                        }
                        if hash_tx.send((slot, len, offset)).is_err() {
                            return Ok(());
                        }
                    }
                })
            })
            .collect();
        drop(hash_tx);
        let read = join_all(handles, "reader");
        // The readers are gone: the hasher finishes once the last piece is hashed.
        (read, hasher.join())
    });
    read?;
    let digest =
        digest.map_err(|_| PipelineError::Invalid("the hashing thread panicked".into()))?;
    Ok((total, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect()
    }

    #[test]
    fn digest_file_matches_a_serial_hash_at_every_piece_boundary() {
        let dir = tempfile::tempdir().unwrap();
        // Around one piece, and more pieces than buffers (the buffers are reused).
        let sizes = [
            0,
            1,
            DIGEST_PIECE - 1,
            DIGEST_PIECE,
            DIGEST_PIECE + 1,
            (DIGEST_BUFFERS + 2) * DIGEST_PIECE + 4097,
        ];
        let all = data(*sizes.iter().max().unwrap());
        for size in sizes {
            let path = dir.path().join(format!("extent-{size}.bin"));
            std::fs::write(&path, &all[..size]).unwrap();
            let (len, digest) = digest_file(&path, None).unwrap();
            assert_eq!(len, size as u64);
            assert_eq!(
                digest,
                blake3::hash(&all[..size]).to_hex().to_string(),
                "{size} bytes"
            );
        }
    }

    #[test]
    fn digest_file_stops_at_the_deadline_and_names_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("extent.bin");
        std::fs::write(&path, data(3 * DIGEST_PIECE)).unwrap();
        let past = Instant::now() - Duration::from_secs(1);
        let err = digest_file(&path, Some(past)).unwrap_err();
        assert!(err.is_deadline(), "{err}");
        let err = digest_file(&dir.path().join("gone.bin"), None).unwrap_err();
        assert!(err.to_string().contains("gone.bin"), "{err}");
    }
}
