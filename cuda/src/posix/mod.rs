//! The `posix` storage engine (CUDA 13.4 CustomStorage): device memory goes
//! through pinned transfer slots in gpusnap into one extent file per GPU, never
//! through the target's host memory or CRIU's page dump.
//!
//! Checkpoint: retain every device's primary context (kept for the life of this
//! process), `cuCheckpointProcessCheckpoint` with
//! `customStorageInfo_out`, stream each GPU's mapped region into
//! `gpusnap-gpu-pid<pid>-device-<uuid>.bin` in the checkpoint directory (BLAKE3
//! while writing, fsync), then `cuCheckpointOperationComplete`, the single
//! commit point. Any failure before it removes the extents written so far.
//!
//! Restore: check the extent list against the destination GPUs (each maps to
//! exactly one extent of the same size) and every digest before touching the
//! process, then `cuCheckpointProcessRestore` with `customStorageInfo_out` (and
//! GPU pairs), stream the extents back, verify the digests again, and
//! `cuCheckpointOperationComplete`. Unlocking is the orchestrator's.

pub mod pipeline;

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use gpusnap_checkpoint::CheckpointLayout;
use gpusnap_config::{StorageConfig, PINNED_BYTES_PER_GPU_MAX};
use serde::{Deserialize, Serialize};

use crate::driver::ffi::{
    CheckpointArgs, CuContext, CustomStorageInfo, CustomStoragePerDeviceData, GpuPair, RestoreArgs,
};
use crate::driver::{Capabilities, DeviceInfo, Driver, GpuRemap, GpuUuid};
use crate::engine::{EngineError, EngineOp, EngineOutput, StorageEngine};

pub use pipeline::{
    device_to_file, device_to_file_through, digest_file, file_to_device, file_to_device_through,
    DeviceRegion, PipelineError, PipelineOptions, TransferSlots, TransferStats,
};

/// Version of [`PosixDetails`].
pub const DETAILS_FORMAT: u32 = 1;

/// One GPU's device memory of one process, as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentRecord {
    pub device_uuid: GpuUuid,
    /// Ordinal at checkpoint (informational).
    pub device_index: u32,
    pub size: u64,
    /// File name inside the checkpoint directory (`gpusnap-gpu-…`).
    pub file: String,
    /// BLAKE3 of the file, lowercase hex.
    pub blake3: String,
}

/// The posix engine's [`EngineOutput::details`]: stored in the manifest's
/// per-process record and handed back at restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixDetails {
    pub format: u32,
    pub extents: Vec<ExtentRecord>,
    pub buffer_count: u32,
    pub chunk_bytes: u64,
}

/// The `posix` engine.
#[derive(Debug, Clone)]
pub struct Posix {
    buffer_count: u32,
    chunk_bytes: u64,
    direct_io: bool,
    fail_write_after: Option<u64>,
}

impl Posix {
    pub const NAME: &'static str = "posix";

    /// `buffer_count` slots of `chunk_bytes` per GPU (≤ 1 GiB pinned per GPU).
    pub fn new(buffer_count: u32, chunk_bytes: u64) -> Result<Self, EngineError> {
        let bad = |reason: String| EngineError::Unavailable {
            engine: Self::NAME,
            reason,
        };
        if !(1..=8).contains(&buffer_count) {
            return Err(bad(format!(
                "storage.transfer_buffer_count {buffer_count} is outside 1–8"
            )));
        }
        if chunk_bytes == 0 || !chunk_bytes.is_multiple_of(pipeline::DIRECT_ALIGN as u64) {
            return Err(bad(format!(
                "storage.transfer_chunk_bytes {chunk_bytes} is not a positive multiple of 4096"
            )));
        }
        let pinned = u64::from(buffer_count).saturating_mul(chunk_bytes);
        if pinned > PINNED_BYTES_PER_GPU_MAX {
            return Err(bad(format!(
                "{buffer_count} × {chunk_bytes} bytes = {pinned} bytes of pinned memory per GPU \
                 exceeds {PINNED_BYTES_PER_GPU_MAX}"
            )));
        }
        Ok(Self {
            buffer_count,
            chunk_bytes,
            direct_io: true,
            fail_write_after: None,
        })
    }

    pub fn from_config(storage: &StorageConfig) -> Result<Self, EngineError> {
        Self::new(storage.transfer_buffer_count, storage.transfer_chunk_bytes)
    }

    /// Use buffered I/O only (no `O_DIRECT` attempt).
    pub fn buffered(mut self) -> Self {
        self.direct_io = false;
        self
    }

    /// Test hook: every extent write fails with `ENOSPC` after `bytes`.
    #[doc(hidden)]
    pub fn with_write_fault(mut self, bytes: u64) -> Self {
        self.fail_write_after = Some(bytes);
        self
    }

    fn options(&self, deadline: Instant) -> PipelineOptions {
        PipelineOptions {
            buffer_count: self.buffer_count as usize,
            chunk_bytes: self.chunk_bytes as usize,
            deadline: Some(deadline),
            direct_io: self.direct_io,
            fail_write_after: self.fail_write_after,
            ..PipelineOptions::new(self.buffer_count as usize, self.chunk_bytes as usize)
        }
    }

    fn fail(pid: i32, reason: String) -> EngineError {
        EngineError::Transfer {
            engine: Self::NAME,
            pid,
            reason,
        }
    }
}

/// The extent file name of `pid`'s memory on `uuid`.
pub fn extent_name(pid: i32, uuid: &GpuUuid) -> String {
    format!("pid{pid}-device-{uuid}.bin")
}

/// Primary contexts this process retained, per driver library and ordinal.
/// Never released: the driver may fault a target whose context reference the
/// checkpointing process dropped while the target lives,
/// so they are held until this process (the shim) exits.
fn retained() -> &'static Mutex<HashMap<(PathBuf, u32), usize>> {
    static RETAINED: OnceLock<Mutex<HashMap<(PathBuf, u32), usize>>> = OnceLock::new();
    RETAINED.get_or_init(Default::default)
}

/// Retains (once per process) and returns the primary context of device `ordinal`.
pub fn retain_primary_context(driver: &Driver, ordinal: u32) -> Result<CuContext, PipelineError> {
    let key = (driver.library_path().to_owned(), ordinal);
    let mut map = retained().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&ctx) = map.get(&key) {
        return Ok(ctx as CuContext);
    }
    let mem = driver.memory_api().ok_or_else(|| {
        PipelineError::Invalid("the driver lacks cuDevicePrimaryCtxRetain".into())
    })?;
    let mut ctx: CuContext = std::ptr::null_mut();
    let dev = i32::try_from(ordinal).unwrap_or(i32::MAX);
    // SAFETY: valid out-pointer; `dev` is an ordinal the driver listed.
    let rc = unsafe { (mem.primary_ctx_retain)(&mut ctx, dev) };
    if rc != 0 {
        return Err(PipelineError::Cuda {
            call: "cuDevicePrimaryCtxRetain",
            error: driver.cu_error(rc),
        });
    }
    map.insert(key, ctx as usize);
    Ok(ctx)
}

/// Makes `ctx` current on the calling thread (before allocating or copying).
///
/// # Safety
/// `ctx` must be a live context of this driver, e.g. from [`retain_primary_context`].
pub unsafe fn make_current(driver: &Driver, ctx: CuContext) -> Result<(), PipelineError> {
    let mem = driver
        .memory_api()
        .ok_or_else(|| PipelineError::Invalid("the driver lacks cuCtxSetCurrent".into()))?;
    // SAFETY: the caller vouches for `ctx`.
    let rc = unsafe { (mem.ctx_set_current)(ctx) };
    if rc == 0 {
        Ok(())
    } else {
        Err(PipelineError::Cuda {
            call: "cuCtxSetCurrent",
            error: driver.cu_error(rc),
        })
    }
}

/// A page-locked host buffer (for benchmarks measuring the PCIe ceiling).
pub struct PinnedBuffer<'a> {
    driver: &'a Driver,
    ptr: *mut u8,
    len: usize,
}

impl<'a> PinnedBuffer<'a> {
    pub fn new(driver: &'a Driver, len: usize) -> Result<Self, PipelineError> {
        let mem = driver
            .memory_api()
            .ok_or_else(|| PipelineError::Invalid("the driver lacks cuMemHostAlloc".into()))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (mem.mem_host_alloc)(&mut p, len.max(1), 0) };
        if rc != 0 {
            return Err(PipelineError::Cuda {
                call: "cuMemHostAlloc",
                error: driver.cu_error(rc),
            });
        }
        Ok(Self {
            driver,
            ptr: p.cast(),
            len,
        })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated above, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Copies `region` through this buffer in buffer-sized pieces (device → host
    /// when `to_host`, else host → device), synchronising once per piece.
    pub fn sweep(&mut self, region: &DeviceRegion, to_host: bool) -> Result<(), PipelineError> {
        let mem = self.driver.memory_api().expect("checked in new");
        let mut off = 0usize;
        while off < region.size {
            let len = self.len.min(region.size - off);
            let dev = region.dev_ptr + off as u64;
            // SAFETY: both ranges are in bounds; the stream is the region's.
            let rc = unsafe {
                if to_host {
                    (mem.memcpy_dtoh_async)(self.ptr.cast(), dev, len, region.stream)
                } else {
                    (mem.memcpy_htod_async)(dev, self.ptr.cast_const().cast(), len, region.stream)
                }
            };
            if rc != 0 {
                return Err(PipelineError::Cuda {
                    call: if to_host {
                        "cuMemcpyDtoHAsync"
                    } else {
                        "cuMemcpyHtoDAsync"
                    },
                    error: self.driver.cu_error(rc),
                });
            }
            // SAFETY: the region's stream.
            let rc = unsafe { (mem.stream_synchronize)(region.stream) };
            if rc != 0 {
                return Err(PipelineError::Cuda {
                    call: "cuStreamSynchronize",
                    error: self.driver.cu_error(rc),
                });
            }
            off += len;
        }
        Ok(())
    }
}

impl Drop for PinnedBuffer<'_> {
    fn drop(&mut self) {
        if let Some(mem) = self.driver.memory_api() {
            // SAFETY: allocated by cuMemHostAlloc in `new`.
            unsafe { (mem.mem_free_host)(self.ptr.cast()) };
        }
    }
}

/// Retains every device's primary context (the driver requires all the target
/// uses; taking all is the superset NVIDIA's own sample uses).
fn retain_all(driver: &Driver, pid: i32) -> Result<HashMap<u32, CuContext>, EngineError> {
    let mut out = HashMap::new();
    for d in &driver.capabilities().devices {
        let ctx = retain_primary_context(driver, d.index).map_err(|e| {
            Posix::fail(
                pid,
                format!(
                    "retaining the primary context of GPU {} failed: {e}",
                    d.uuid
                ),
            )
        })?;
        out.insert(d.index, ctx);
    }
    Ok(out)
}

/// The regions the driver mapped.
///
/// # Safety
/// `info` must be the driver's live result of a CustomStorage call.
unsafe fn regions(
    info: *mut CustomStorageInfo,
) -> Option<(CustomStorageInfo, Vec<CustomStoragePerDeviceData>)> {
    if info.is_null() {
        return None;
    }
    // SAFETY: per the caller.
    let value = unsafe { *info };
    if value.device_count == 0 || value.per_device_data.is_null() {
        return Some((value, Vec::new()));
    }
    // SAFETY: `per_device_data` has `device_count` entries (API contract).
    let per =
        unsafe { std::slice::from_raw_parts(value.per_device_data, value.device_count as usize) }
            .to_vec();
    Some((value, per))
}

/// Which GPU each mapped region belongs to, in ordinal order: the process's
/// GPUs when their count matches, else every GPU when that matches.
// TODO: derive it from cuStreamGetCtx_v2(stream) → device instead.
fn devices_for(
    caps: &Capabilities,
    gpus: &[DeviceInfo],
    count: usize,
) -> Result<Vec<DeviceInfo>, String> {
    let mut candidates: Vec<DeviceInfo> = gpus
        .iter()
        .filter_map(|g| caps.device(&g.uuid).cloned())
        .collect();
    if candidates.len() != count {
        candidates = caps.devices.clone();
    }
    if candidates.len() != count {
        return Err(format!(
            "the driver mapped {count} device regions, but the process uses {} GPUs and the node \
             has {}; cannot tell which region belongs to which GPU",
            gpus.len(),
            caps.devices.len()
        ));
    }
    candidates.sort_by_key(|d| d.index);
    Ok(candidates)
}

fn remove_all(paths: &[PathBuf]) {
    for p in paths {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %p.display(), error = %e, "removing a partial extent failed")
            }
        }
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

fn storage_dir(op: &EngineOp) -> Result<&Path, EngineError> {
    op.storage_dir.as_deref().ok_or_else(|| {
        Posix::fail(
            op.pid,
            "no checkpoint directory was given to the posix engine (OrchestratorOptions::storage_dir); \
             nothing was copied"
                .into(),
        )
    })
}

/// Runs `work` for every region at once (one copy thread per GPU).
fn per_device<T: Send>(
    jobs: Vec<T>,
    work: impl Fn(T) -> Result<TransferStats, PipelineError> + Sync,
) -> Vec<Result<TransferStats, PipelineError>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let work = &work;
                scope.spawn(move || work(job))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(PipelineError::Invalid("a copy thread panicked".into()))
                })
            })
            .collect()
    })
}

/// Pins transfer slots for each GPU of `gpus` (ordinal, slot size), one thread per GPU,
/// while `meanwhile` runs on this one: pinning takes milliseconds per slot, and both callers
/// run it where the process waits (the driver's checkpoint call, the extent verification).
/// Each thread retains the GPU's primary context first (a no-op once it is retained).
fn pin_while<'d, R>(
    driver: &'d Driver,
    gpus: Vec<(u32, usize)>,
    count: usize,
    meanwhile: impl FnOnce() -> R,
) -> (HashMap<u32, Result<TransferSlots<'d>, PipelineError>>, R) {
    std::thread::scope(|scope| {
        let pinning: Vec<_> = gpus
            .into_iter()
            .map(|(index, slot_bytes)| {
                let slots = scope.spawn(move || {
                    let ctx = retain_primary_context(driver, index)?;
                    TransferSlots::alloc(driver, ctx, count, slot_bytes)
                });
                (index, slots)
            })
            .collect();
        let out = meanwhile();
        let pinned = pinning
            .into_iter()
            .filter_map(|(index, h)| h.join().ok().map(|slots| (index, slots)))
            .collect();
        (pinned, out)
    })
}

/// One extent transfer through the slots pinned for its GPU, or through slots of its own
/// where none were pinned ahead or pinning ahead failed (it is tried once more, as before
/// pinning moved ahead, and that failure is the one reported).
fn through_pinned<'d>(
    pinned: Option<Result<TransferSlots<'d>, PipelineError>>,
    fresh: impl FnOnce() -> Result<TransferStats, PipelineError>,
    through: impl FnOnce(&mut TransferSlots<'d>) -> Result<TransferStats, PipelineError>,
) -> Result<TransferStats, PipelineError> {
    match pinned {
        Some(Ok(mut slots)) => through(&mut slots),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "pinning transfer slots ahead failed; pinning at the transfer");
            fresh()
        }
        None => fresh(),
    }
}

impl StorageEngine for Posix {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn keeps_memory_in_files(&self) -> bool {
        true
    }

    fn admit(&self, caps: &Capabilities) -> Result<(), EngineError> {
        if caps.custom_storage {
            Ok(())
        } else {
            Err(EngineError::Unavailable {
                engine: Self::NAME,
                reason: format!(
                    "it needs CUDA 13.4 CustomStorage (cuCheckpointOperationComplete at version \
                     13040 plus the context and copy functions); driver {} does not provide it \
                     (missing: {}). Nothing was locked; use storage.engine = \"driver-managed\" \
                     or upgrade the driver",
                    caps.driver_version,
                    caps.missing_symbols.join(", ")
                ),
            })
        }
    }

    fn checkpoint(&self, op: &EngineOp) -> Result<EngineOutput, EngineError> {
        let pid = op.pid;
        let driver = &*op.driver;
        let dir = storage_dir(op)?;
        let layout = CheckpointLayout::new(dir);
        if Instant::now() >= op.deadline {
            return Err(Self::fail(
                pid,
                "the operation deadline passed before the checkpoint call; nothing was mapped"
                    .into(),
            ));
        }
        let contexts = retain_all(driver, pid)?;

        let mut info: *mut CustomStorageInfo = std::ptr::null_mut();
        let mut args = CheckpointArgs::zeroed();
        args.custom_storage_info_out = &mut info;
        if !driver.capabilities().custom_storage {
            return Err(self.admit(driver.capabilities()).unwrap_err());
        }
        // Region sizes are known only after the call: full-size slots.
        let pin_for = op
            .gpus
            .iter()
            .filter_map(|g| driver.capabilities().device(&g.uuid))
            .map(|d| (d.index, self.chunk_bytes as usize))
            .collect();
        let (mut pinned, called) = pin_while(
            driver,
            pin_for,
            self.buffer_count as usize,
            // SAFETY: `info` outlives the call and the driver has CustomStorage.
            || unsafe { driver.checkpoint_process_with(pid, &mut args) },
        );
        called?;
        // SAFETY: the driver just returned it.
        let Some((info_value, per)) = (unsafe { regions(info) }) else {
            return Err(Self::fail(
                pid,
                "the driver returned no CustomStorage mapping".into(),
            ));
        };
        let before_commit = |reason: String, paths: &[PathBuf]| {
            remove_all(paths);
            sync_dir(dir);
            Self::fail(
                pid,
                format!(
                    "{reason}; failed before commit (cuCheckpointOperationComplete was not \
                     called): partial extents removed, no valid copy of the device memory \
                     exists, and the process stays CHECKPOINTING (CUDA has no abort)"
                ),
            )
        };
        let devices = devices_for(driver.capabilities(), &op.gpus, per.len())
            .map_err(|r| before_commit(r, &[]))?;
        let jobs: Vec<(DeviceInfo, DeviceRegion, PathBuf)> = devices
            .into_iter()
            .zip(&per)
            .map(|(d, r)| {
                let path = layout.gpu_file(&extent_name(pid, &d.uuid));
                let region = DeviceRegion {
                    ctx: contexts
                        .get(&d.index)
                        .copied()
                        .unwrap_or(std::ptr::null_mut()),
                    dev_ptr: r.dev_ptr,
                    size: r.size,
                    stream: r.stream,
                };
                (d, region, path)
            })
            .collect();
        let paths: Vec<PathBuf> = jobs.iter().map(|j| j.2.clone()).collect();
        let opts = self.options(op.deadline);
        let started = Instant::now();
        let transfers: Vec<_> = jobs
            .iter()
            .map(|(d, region, path)| (*region, path.clone(), pinned.remove(&d.index)))
            .collect();
        drop(pinned);
        let results = per_device(transfers, |(region, path, slots)| {
            through_pinned(
                slots,
                || device_to_file(driver, &region, &path, &opts),
                |s| device_to_file_through(driver, &region, &path, s, &opts),
            )
        });
        let mut extents = Vec::new();
        let mut errors = Vec::new();
        for ((d, _, path), r) in jobs.iter().zip(results) {
            match r {
                Ok(stats) => {
                    tracing::info!(pid, gpu = %d.uuid, bytes = stats.bytes, gbps = stats.gb_per_s(), direct_io = stats.direct_io, "extent written");
                    extents.push(ExtentRecord {
                        device_uuid: d.uuid,
                        device_index: d.index,
                        size: stats.bytes,
                        file: path
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                        blake3: stats.blake3,
                    })
                }
                Err(e) => errors.push(format!("GPU {}: {e}", d.uuid)),
            }
        }
        if !errors.is_empty() {
            return Err(before_commit(errors.join("; "), &paths));
        }
        sync_dir(dir);
        // The single commit point.
        // SAFETY: the handle is from the checkpoint above, not yet completed.
        if let Err(e) = unsafe { driver.complete_operation(pid, info_value.handle) } {
            return Err(before_commit(format!("{e}"), &paths));
        }
        let bytes: u64 = extents.iter().map(|e| e.size).sum();
        tracing::info!(
            pid,
            bytes,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "posix checkpoint committed"
        );
        let details = PosixDetails {
            format: DETAILS_FORMAT,
            extents,
            buffer_count: self.buffer_count,
            chunk_bytes: self.chunk_bytes,
        };
        Ok(EngineOutput {
            bytes_moved: Some(bytes),
            details: Some(
                serde_json::to_value(&details).map_err(|e| Self::fail(pid, e.to_string()))?,
            ),
        })
    }

    fn restore(&self, op: &EngineOp, remap: &[GpuRemap]) -> Result<EngineOutput, EngineError> {
        let pid = op.pid;
        let driver = &*op.driver;
        let caps = driver.capabilities();
        let dir = storage_dir(op)?;
        let layout = CheckpointLayout::new(dir);
        let refuse = |reason: String| {
            Self::fail(
                pid,
                format!("{reason}; nothing was restored (the process is still CHECKPOINTED)"),
            )
        };
        let saved = op
            .saved
            .clone()
            .ok_or_else(|| refuse("the checkpoint record has no posix extent list".into()))?;
        let details: PosixDetails = serde_json::from_value(saved)
            .map_err(|e| refuse(format!("the posix extent list is damaged: {e}")))?;
        if details.format != DETAILS_FORMAT {
            return Err(refuse(format!(
                "unknown posix extent format {}",
                details.format
            )));
        }

        // Destination GPU of each extent: exactly one extent per device, same size.
        let mut planned: Vec<(DeviceInfo, ExtentRecord, PathBuf)> = Vec::new();
        for e in &details.extents {
            let target = remap
                .iter()
                .find(|r| r.old == e.device_uuid)
                .map_or(e.device_uuid, |r| r.new);
            let dev = caps.device(&target).cloned().ok_or_else(|| {
                refuse(format!(
                    "GPU {target} (for the extent of {}) is not on this node",
                    e.device_uuid
                ))
            })?;
            if planned.iter().any(|(d, _, _)| d.uuid == dev.uuid) {
                return Err(refuse(format!("two extents map to GPU {}", dev.uuid)));
            }
            let path = layout
                .try_gpu_file(e.file.strip_prefix("gpusnap-gpu-").unwrap_or(""))
                .ok_or_else(|| refuse(format!("invalid extent file name {:?}", e.file)))?;
            planned.push((dev, e.clone(), path));
        }
        planned.sort_by_key(|(d, _, _)| d.index);
        if !remap.is_empty() && !caps.gpu_remap {
            return Err(refuse(
                "restoring onto other GPUs needs driver r580 (CUDA 13.0) or newer".into(),
            ));
        }
        let pin_for = planned
            .iter()
            .map(|(d, e, _)| {
                let size = usize::try_from(e.size).unwrap_or(usize::MAX);
                (
                    d.index,
                    pipeline::slot_bytes(self.chunk_bytes as usize, size),
                )
            })
            .collect();
        let (mut pinned, verified) = pin_while(
            driver,
            pin_for,
            self.buffer_count as usize,
            || -> Result<(), EngineError> {
                for (_, e, path) in &planned {
                    let (len, digest) = digest_file(path, Some(op.deadline))
                        .map_err(|err| refuse(err.to_string()))?;
                    if len != e.size {
                        return Err(refuse(format!(
                            "extent {} holds {len} bytes, the checkpoint recorded {}",
                            path.display(),
                            e.size
                        )));
                    }
                    if !digest.eq_ignore_ascii_case(&e.blake3) {
                        return Err(refuse(format!(
                            "extent {} has BLAKE3 {digest}, but the checkpoint recorded {}: it was changed or damaged",
                            path.display(),
                            e.blake3
                        )));
                    }
                }
                Ok(())
            },
        );
        verified?;
        let contexts = retain_all(driver, pid)?;
        let mut pairs: Vec<GpuPair> = remap
            .iter()
            .map(|r| GpuPair {
                old_uuid: r.old.to_ffi(),
                new_uuid: r.new.to_ffi(),
            })
            .collect();
        let mut info: *mut CustomStorageInfo = std::ptr::null_mut();
        let mut args = RestoreArgs::zeroed();
        if !pairs.is_empty() {
            args.gpu_pairs = pairs.as_mut_ptr();
            args.gpu_pairs_count = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        }
        args.custom_storage_info_out = &mut info;
        if Instant::now() >= op.deadline {
            return Err(refuse(
                "the operation deadline passed while verifying extents".into(),
            ));
        }
        // SAFETY: `pairs` and `info` outlive the call; CustomStorage admitted.
        unsafe { driver.restore_process_with(pid, &mut args) }?;
        // SAFETY: the driver just returned it.
        let Some((info_value, per)) = (unsafe { regions(info) }) else {
            return Err(Self::fail(
                pid,
                "the driver returned no CustomStorage mapping".into(),
            ));
        };
        let before_commit = |reason: String| {
            Self::fail(
                pid,
                format!(
                    "{reason}; failed before commit (cuCheckpointOperationComplete was not \
                     called): the process stays RESTORING (CUDA has no abort); the extents are \
                     kept"
                ),
            )
        };
        if per.len() != planned.len() {
            return Err(before_commit(format!(
                "the driver mapped {} device regions for {} saved extents",
                per.len(),
                planned.len()
            )));
        }
        let mut jobs = Vec::new();
        for ((d, e, path), r) in planned.iter().zip(&per) {
            if r.size as u64 != e.size {
                return Err(before_commit(format!(
                    "GPU {} got a {}-byte region for a {}-byte extent",
                    d.uuid, r.size, e.size
                )));
            }
            let region = DeviceRegion {
                ctx: contexts
                    .get(&d.index)
                    .copied()
                    .unwrap_or(std::ptr::null_mut()),
                dev_ptr: r.dev_ptr,
                size: r.size,
                stream: r.stream,
            };
            jobs.push((
                region,
                path.clone(),
                e.blake3.clone(),
                pinned.remove(&d.index),
            ));
        }
        drop(pinned);
        // O_DIRECT stays on although the validation and the verification above just read each
        // extent through the page cache: posix_bench's restore sequence found buffered copies
        // no faster (1.03-1.05x slower on the development VM's disk, test double, 2 and 4 GiB);
        // storage the host does not cache might tell otherwise.
        let opts = self.options(op.deadline);
        let results = per_device(jobs, |(region, path, digest, slots)| {
            through_pinned(
                slots,
                || file_to_device(driver, &region, &path, Some(&digest), &opts),
                |s| file_to_device_through(driver, &region, &path, Some(&digest), s, &opts),
            )
        });
        let errors: Vec<String> = planned
            .iter()
            .zip(&results)
            .filter_map(|((d, _, _), r)| r.as_ref().err().map(|e| format!("GPU {}: {e}", d.uuid)))
            .collect();
        if !errors.is_empty() {
            return Err(before_commit(errors.join("; ")));
        }
        for ((d, _, _), stats) in planned.iter().zip(results.iter().flatten()) {
            tracing::info!(pid, gpu = %d.uuid, bytes = stats.bytes, gbps = stats.gb_per_s(), direct_io = stats.direct_io, "extent read");
        }
        // SAFETY: the handle is from the restore above, not yet completed.
        unsafe { driver.complete_operation(pid, info_value.handle) }?;
        let bytes = planned.iter().map(|(_, e, _)| e.size).sum();
        Ok(EngineOutput {
            bytes_moved: Some(bytes),
            details: None,
        })
    }
}
