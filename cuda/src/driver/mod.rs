//! A thin CUDA driver binding loaded at run time.
//!
//! Only `cuInit` and `cuGetProcAddress_v2` come from `dlsym`. Everything else is
//! resolved through `cuGetProcAddress` at an explicit CUDA version, because
//! `dlsym` returns the base ABI of versioned entry points (for example the v1
//! `cuDeviceGetUuid`, which reports the parent GPU under MIG), while
//! `cuGetProcAddress` returns the ABI of the version asked for. Whether a
//! feature exists is decided by that resolution alone, never by version
//! arithmetic.

mod capabilities;
mod error;
pub mod ffi;
mod init;
mod state;
mod uuid;
mod version;

use std::borrow::Cow;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::time::Instant;

use libloading::Library;

pub use capabilities::{Capabilities, DeviceInfo};
pub use error::{code, CallError, CuError, CuResult, LoadError, ResolveError};
pub use init::{PendingDriver, ReadyOrPending};
pub use state::ProcessState;
pub use uuid::{GpuRemap, GpuUuid, ParseUuidError};
pub use version::DriverVersion;

use error::static_name;
use ffi::*;

/// The library name the NVIDIA driver installs.
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";

/// Where to load the driver from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// A bare name is searched like `dlopen` does; a path is used as is. Tests
    /// point this at the fake library.
    pub library_path: PathBuf,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            library_path: PathBuf::from(DEFAULT_LIBRARY),
        }
    }
}

impl DriverConfig {
    pub fn with_library(path: impl Into<PathBuf>) -> Self {
        Self {
            library_path: path.into(),
        }
    }
}

/// Device queries every gpusnap operation needs.
#[derive(Debug, Clone, Copy)]
struct DeviceApi {
    get_count: FnDeviceGetCount,
    get: FnDeviceGet,
    get_name: FnDeviceGetName,
    get_uuid: FnDeviceGetUuid,
    total_mem: FnDeviceTotalMem,
}

/// The six per-process checkpoint functions (CUDA 12.8).
#[derive(Debug, Clone, Copy)]
struct CheckpointApi {
    lock: FnProcessLock,
    checkpoint: FnProcessCheckpoint,
    restore: FnProcessRestore,
    unlock: FnProcessUnlock,
    get_state: FnProcessGetState,
    get_restore_thread_id: FnProcessGetRestoreThreadId,
}

/// Context, stream and copy functions a storage engine uses to move the
/// CustomStorage mappings (the posix engine).
#[allow(dead_code)] // consumed by the storage engine that lands next
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoryApi {
    pub(crate) primary_ctx_retain: FnDevicePrimaryCtxRetain,
    pub(crate) primary_ctx_release: FnDevicePrimaryCtxRelease,
    pub(crate) ctx_set_current: FnCtxSetCurrent,
    pub(crate) memcpy_dtoh_async: FnMemcpyDtoHAsync,
    pub(crate) memcpy_htod_async: FnMemcpyHtoDAsync,
    pub(crate) mem_host_alloc: FnMemHostAlloc,
    pub(crate) mem_free_host: FnMemFreeHost,
    pub(crate) stream_synchronize: FnStreamSynchronize,
}

/// A loaded and initialised CUDA driver. Thread-safe: the driver API is, and
/// the struct holds only function pointers and immutable data.
pub struct Driver {
    path: PathBuf,
    version: DriverVersion,
    error_name: Option<FnGetErrorText>,
    error_string: Option<FnGetErrorText>,
    devices: DeviceApi,
    checkpoint: Option<CheckpointApi>,
    operation_complete: Option<FnOperationComplete>,
    #[allow(dead_code)] // consumed by the storage engine that lands next
    memory: Option<MemoryApi>,
    capabilities: Capabilities,
    /// Never unloaded: after `cuInit` the driver runs its own threads, and a
    /// driver call abandoned by the watchdog may still be executing in it.
    _library: ManuallyDrop<Library>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("checkpoint_api", &self.checkpoint.is_some())
            .field("custom_storage", &self.capabilities.custom_storage)
            .finish_non_exhaustive()
    }
}

/// Resolves entry points through `cuGetProcAddress_v2`.
struct Resolver<'a> {
    get_proc: FnGetProcAddressV2,
    missing: &'a mut Vec<String>,
}

impl Resolver<'_> {
    /// Available only if the call succeeds, the pointer is non-null and the
    /// status is `CU_GET_PROC_ADDRESS_SUCCESS`.
    fn raw(&self, symbol: &CStr, version: DriverVersion) -> Result<*mut c_void, ResolveError> {
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status: ProcAddressStatus = u32::MAX;
        let requested = c_int::try_from(version.0).unwrap_or(c_int::MAX);
        // SAFETY: `symbol` is NUL-terminated; `pfn` and `status` are valid
        // out-pointers for the duration of the call; the signature matches the
        // CUDA 12.0+ `cuGetProcAddress_v2` ABI.
        let rc = unsafe {
            (self.get_proc)(
                symbol.as_ptr(),
                &mut pfn,
                requested,
                GET_PROC_ADDRESS_DEFAULT,
                &mut status,
            )
        };
        if rc != code::SUCCESS {
            return Err(ResolveError::Call(CuError::from_code(rc)));
        }
        match status {
            PROC_ADDRESS_SUCCESS if !pfn.is_null() => Ok(pfn),
            PROC_ADDRESS_SUCCESS => Err(ResolveError::Null),
            PROC_ADDRESS_SYMBOL_NOT_FOUND => Err(ResolveError::NotFound),
            PROC_ADDRESS_VERSION_NOT_SUFFICIENT => Err(ResolveError::VersionNotSufficient),
            other => Err(ResolveError::Status(other)),
        }
    }

    /// # Safety
    /// `F` must be the function-pointer type of `symbol` at `version`.
    unsafe fn get<F: Copy>(
        &self,
        symbol: &CStr,
        version: DriverVersion,
    ) -> Result<F, ResolveError> {
        let ptr = self.raw(symbol, version)?;
        // SAFETY: the caller guarantees `F` is the matching fn-pointer type.
        Ok(unsafe { fn_from_ptr(ptr) })
    }

    /// Like `get`, but records a miss instead of failing.
    ///
    /// # Safety
    /// As for [`Resolver::get`].
    unsafe fn optional<F: Copy>(&mut self, symbol: &CStr, version: DriverVersion) -> Option<F> {
        // SAFETY: forwarded from the caller.
        match unsafe { self.get(symbol, version) } {
            Ok(f) => Some(f),
            Err(reason) => {
                let name = symbol.to_string_lossy().into_owned();
                tracing::debug!(symbol = %name, version = version.0, %reason, "driver symbol unavailable");
                self.missing.push(name);
                None
            }
        }
    }
}

/// # Safety
/// `F` must be a function-pointer type and `ptr` a function of that type.
unsafe fn fn_from_ptr<F: Copy>(ptr: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked above); the caller guarantees the type.
    unsafe { std::mem::transmute_copy(&ptr) }
}

fn text_of(f: FnGetErrorText, rc: u32) -> Option<String> {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: `text` is a valid out-pointer; the driver returns a pointer to a
    // static NUL-terminated string or leaves it null.
    let status = unsafe { f(rc, &mut text) };
    if status != code::SUCCESS || text.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated and static per the driver API contract.
    Some(
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned(),
    )
}

impl Driver {
    /// Loads the library, runs `cuInit(0)`, resolves entry points and lists devices.
    pub fn load(config: &DriverConfig) -> Result<Self, LoadError> {
        let started = Instant::now();
        let path = config.library_path.clone();

        // SAFETY: loading runs the library's initialisers. The library is the
        // system's CUDA driver (or the test double) that the operator configured.
        let library = unsafe { Library::new(&path) }.map_err(|e| LoadError::Library {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let library = ManuallyDrop::new(library);

        let missing_entry =
            |symbol: &'static str, e: libloading::Error| LoadError::MissingEntryPoint {
                path: path.clone(),
                symbol,
                reason: e.to_string(),
            };
        // SAFETY: the symbol has this C signature in every driver that exports it.
        let init: FnInit = unsafe { library.get::<FnInit>(b"cuInit\0") }
            .map(|s| *s)
            .map_err(|e| missing_entry("cuInit", e))?;
        // SAFETY: `cuGetProcAddress_v2` has the five-argument CUDA 12 signature.
        let get_proc: FnGetProcAddressV2 =
            unsafe { library.get::<FnGetProcAddressV2>(b"cuGetProcAddress_v2\0") }
                .map(|s| *s)
                .map_err(|e| missing_entry("cuGetProcAddress_v2", e))?;

        let mut missing = Vec::new();
        let mut resolver = Resolver {
            get_proc,
            missing: &mut missing,
        };

        // Error text first, so that a failing cuInit is still reported by name.
        let any = DriverVersion(6000);
        // SAFETY: cuGetErrorName has FnGetErrorText's signature since CUDA 6.0.
        let error_name = unsafe { resolver.optional::<FnGetErrorText>(c"cuGetErrorName", any) };
        // SAFETY: cuGetErrorString has FnGetErrorText's signature since CUDA 6.0.
        let error_string = unsafe { resolver.optional::<FnGetErrorText>(c"cuGetErrorString", any) };
        let name_error = |rc: u32| CuError {
            code: rc,
            name: error_name
                .and_then(|f| text_of(f, rc))
                .map_or_else(|| static_name(rc), Cow::Owned),
            description: error_string.and_then(|f| text_of(f, rc)),
        };

        // SAFETY: cuInit(0) is the documented way to initialise the driver API.
        let rc = unsafe { init(0) };
        if rc != code::SUCCESS {
            return Err(LoadError::Init {
                path,
                error: name_error(rc),
            });
        }

        // SAFETY: cuDriverGetVersion has had this signature since CUDA 2.2.
        let get_version: FnDriverGetVersion =
            unsafe { resolver.get(c"cuDriverGetVersion", DriverVersion(2020)) }.map_err(
                |reason| LoadError::Resolve {
                    path: path.clone(),
                    symbol: "cuDriverGetVersion",
                    requested: DriverVersion(2020),
                    driver_version: DriverVersion(0),
                    reason,
                },
            )?;
        let mut raw_version: c_int = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { get_version(&mut raw_version) };
        if rc != code::SUCCESS {
            return Err(LoadError::Version {
                path,
                error: name_error(rc),
            });
        }
        let version = DriverVersion(u32::try_from(raw_version).unwrap_or(0));

        // Asking for a version above the driver's is an error by contract, so
        // the basic functions are requested at the lower of the two. Their
        // newest ABIs (v2 UUID, v2 primary-context release) predate 12.0.
        let base = version.min(DriverVersion::CHECKPOINT_API);
        let required = |symbol: &'static str, reason: ResolveError| LoadError::Resolve {
            path: path.clone(),
            symbol,
            requested: base,
            driver_version: version,
            reason,
        };
        // SAFETY: (all five) each type is that symbol's signature at `base` (>= 11.4).
        let devices = unsafe {
            DeviceApi {
                get_count: resolver
                    .get(c"cuDeviceGetCount", base)
                    .map_err(|r| required("cuDeviceGetCount", r))?,
                get: resolver
                    .get(c"cuDeviceGet", base)
                    .map_err(|r| required("cuDeviceGet", r))?,
                get_name: resolver
                    .get(c"cuDeviceGetName", base)
                    .map_err(|r| required("cuDeviceGetName", r))?,
                get_uuid: resolver
                    .get(c"cuDeviceGetUuid", base)
                    .map_err(|r| required("cuDeviceGetUuid", r))?,
                total_mem: resolver
                    .get(c"cuDeviceTotalMem", base)
                    .map_err(|r| required("cuDeviceTotalMem", r))?,
            }
        };

        let ckpt = DriverVersion::CHECKPOINT_API;
        // SAFETY: (all six) the types are the CUDA 12.8 prototypes.
        let checkpoint = unsafe {
            let lock = resolver.optional(c"cuCheckpointProcessLock", ckpt);
            let checkpoint = resolver.optional(c"cuCheckpointProcessCheckpoint", ckpt);
            let restore = resolver.optional(c"cuCheckpointProcessRestore", ckpt);
            let unlock = resolver.optional(c"cuCheckpointProcessUnlock", ckpt);
            let get_state = resolver.optional(c"cuCheckpointProcessGetState", ckpt);
            let get_restore_thread_id =
                resolver.optional(c"cuCheckpointProcessGetRestoreThreadId", ckpt);
            match (
                lock,
                checkpoint,
                restore,
                unlock,
                get_state,
                get_restore_thread_id,
            ) {
                (Some(lock), Some(checkpoint), Some(restore), Some(unlock), Some(gs), Some(rt)) => {
                    Some(CheckpointApi {
                        lock,
                        checkpoint,
                        restore,
                        unlock,
                        get_state: gs,
                        get_restore_thread_id: rt,
                    })
                }
                _ => None,
            }
        };

        // SAFETY: the CUDA 13.4 prototype. Requested at 13040 whatever the
        // driver reports: the resolution result is the admission test.
        let operation_complete = unsafe {
            resolver.optional::<FnOperationComplete>(
                c"cuCheckpointOperationComplete",
                DriverVersion::CUSTOM_STORAGE,
            )
        };

        // SAFETY: (all eight) each type is that symbol's signature at `base`.
        let memory = unsafe {
            let retain = resolver.optional(c"cuDevicePrimaryCtxRetain", base);
            let release = resolver.optional(c"cuDevicePrimaryCtxRelease", base);
            let set_current = resolver.optional(c"cuCtxSetCurrent", base);
            let dtoh = resolver.optional(c"cuMemcpyDtoHAsync", base);
            let htod = resolver.optional(c"cuMemcpyHtoDAsync", base);
            let host_alloc = resolver.optional(c"cuMemHostAlloc", base);
            let free_host = resolver.optional(c"cuMemFreeHost", base);
            let sync = resolver.optional(c"cuStreamSynchronize", base);
            match (
                retain,
                release,
                set_current,
                dtoh,
                htod,
                host_alloc,
                free_host,
                sync,
            ) {
                (Some(a), Some(b), Some(c), Some(d), Some(e), Some(f), Some(g), Some(h)) => {
                    Some(MemoryApi {
                        primary_ctx_retain: a,
                        primary_ctx_release: b,
                        ctx_set_current: c,
                        memcpy_dtoh_async: d,
                        memcpy_htod_async: e,
                        mem_host_alloc: f,
                        mem_free_host: g,
                        stream_synchronize: h,
                    })
                }
                _ => None,
            }
        };

        let mut driver = Self {
            path: path.clone(),
            version,
            error_name,
            error_string,
            devices,
            checkpoint,
            operation_complete,
            memory,
            capabilities: Capabilities {
                library_path: path.clone(),
                driver_version: version,
                checkpoint_api: false,
                gpu_remap: false,
                custom_storage: false,
                missing_symbols: missing,
                devices: Vec::new(),
            },
            _library: library,
        };
        let devices = driver.list_devices().map_err(|error| LoadError::Devices {
            path: path.clone(),
            error,
        })?;
        let checkpoint_api = driver.checkpoint.is_some();
        driver.capabilities.checkpoint_api = checkpoint_api;
        driver.capabilities.gpu_remap = checkpoint_api && version >= DriverVersion::GPU_REMAP;
        driver.capabilities.custom_storage =
            checkpoint_api && driver.operation_complete.is_some() && driver.memory.is_some();
        driver.capabilities.devices = devices;

        let caps = &driver.capabilities;
        tracing::info!(
            library = %path.display(),
            driver_version = version.0,
            checkpoint_api = caps.checkpoint_api,
            gpu_remap = caps.gpu_remap,
            custom_storage = caps.custom_storage,
            devices = caps.devices.len(),
            missing_symbols = ?caps.missing_symbols,
            load_ms = started.elapsed().as_secs_f64() * 1e3,
            "CUDA driver loaded"
        );
        Ok(driver)
    }

    pub fn library_path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> DriverVersion {
        self.version
    }

    /// Capabilities and devices, determined once at load.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Names a `CUresult` through the driver, falling back to the static table.
    pub fn cu_error(&self, rc: u32) -> CuError {
        CuError {
            code: rc,
            name: self
                .error_name
                .and_then(|f| text_of(f, rc))
                .map_or_else(|| static_name(rc), Cow::Owned),
            description: self.error_string.and_then(|f| text_of(f, rc)),
        }
    }

    fn cu_check(&self, rc: u32) -> CuResult<()> {
        if rc == code::SUCCESS {
            Ok(())
        } else {
            Err(self.cu_error(rc))
        }
    }

    fn list_devices(&self) -> CuResult<Vec<DeviceInfo>> {
        let mut count: c_int = 0;
        // SAFETY: valid out-pointer; the driver is initialised.
        self.cu_check(unsafe { (self.devices.get_count)(&mut count) })?;
        (0..count)
            .map(|ordinal| self.device_info(ordinal))
            .collect()
    }

    fn device_info(&self, ordinal: c_int) -> CuResult<DeviceInfo> {
        let api = &self.devices;
        let mut device: CuDevice = 0;
        // SAFETY: valid out-pointer; the ordinal is below the reported count.
        self.cu_check(unsafe { (api.get)(&mut device, ordinal) })?;

        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer length passed matches the buffer.
        self.cu_check(unsafe { (api.get_name)(name.as_mut_ptr(), name.len() as c_int, device) })?;
        // The driver NUL-terminates within `len`; guard anyway.
        name[name.len() - 1] = 0;
        // SAFETY: NUL-terminated above.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();

        let mut uuid = CuUuid::default();
        // SAFETY: valid out-pointer of the CUuuid layout.
        self.cu_check(unsafe { (api.get_uuid)(&mut uuid, device) })?;

        let mut total: usize = 0;
        // SAFETY: valid out-pointer (size_t in the v2 ABI).
        self.cu_check(unsafe { (api.total_mem)(&mut total, device) })?;

        Ok(DeviceInfo {
            index: ordinal.unsigned_abs(),
            uuid: uuid.into(),
            name,
            total_memory_bytes: total as u64,
        })
    }

    fn checkpoint_api(&self, call: &'static str) -> Result<&CheckpointApi, CallError> {
        self.checkpoint.as_ref().ok_or(CallError::Unavailable {
            call,
            driver_version: self.version,
            reason: "the per-process checkpoint API needs driver r570 (CUDA 12.8) or newer",
        })
    }

    fn check(&self, call: &'static str, pid: i32, rc: u32) -> Result<(), CallError> {
        if rc == code::SUCCESS {
            Ok(())
        } else {
            Err(CallError::Cuda {
                call,
                pid,
                error: self.cu_error(rc),
            })
        }
    }

    /// RUNNING → LOCKED. `timeout_ms == 0` waits forever.
    pub fn lock_process(&self, pid: i32, timeout_ms: u32) -> Result<(), CallError> {
        const CALL: &str = "cuCheckpointProcessLock";
        let api = self.checkpoint_api(CALL)?;
        let mut args = LockArgs {
            timeout_ms,
            ..LockArgs::default()
        };
        // SAFETY: resolved with this prototype; `args` is valid for the call
        // and its reserved fields are zero.
        let rc = unsafe { (api.lock)(pid, &mut args) };
        self.check(CALL, pid, rc)
            .map_err(|e| lock_timeout_hint(e, timeout_ms))
    }

    /// LOCKED → CHECKPOINTED on the driver-managed path (device memory is
    /// copied into host memory inside the target).
    pub fn checkpoint_process(&self, pid: i32) -> Result<(), CallError> {
        let mut args = CheckpointArgs::zeroed();
        // SAFETY: zeroed args select the driver-managed path; no out-pointers.
        unsafe { self.checkpoint_process_with(pid, &mut args) }
    }

    /// `cuCheckpointProcessCheckpoint` with caller-built arguments (CustomStorage).
    ///
    /// # Safety
    /// `args` must be valid for the driver version: a non-null
    /// `custom_storage_info_out` only when [`Capabilities::custom_storage`] is
    /// true, pointing at writable storage for the driver's result.
    pub unsafe fn checkpoint_process_with(
        &self,
        pid: i32,
        args: &mut CheckpointArgs,
    ) -> Result<(), CallError> {
        const CALL: &str = "cuCheckpointProcessCheckpoint";
        let api = self.checkpoint_api(CALL)?;
        // SAFETY: resolved with this prototype; the caller vouches for `args`.
        let rc = unsafe { (api.checkpoint)(pid, args) };
        self.check(CALL, pid, rc)
    }

    /// CHECKPOINTED → LOCKED on the driver-managed path. An empty `remap`
    /// restores onto the same GPUs (NULL `gpuPairs`, valid on every driver);
    /// otherwise it must cover every GPU the process was checkpointed on.
    pub fn restore_process(&self, pid: i32, remap: &[GpuRemap]) -> Result<(), CallError> {
        const CALL: &str = "cuCheckpointProcessRestore";
        if !remap.is_empty() && !self.capabilities.gpu_remap {
            return Err(CallError::Unavailable {
                call: CALL,
                driver_version: self.version,
                reason: "restoring onto different GPUs needs driver r580 (CUDA 13.0) or newer",
            });
        }
        let mut pairs: Vec<GpuPair> = remap
            .iter()
            .map(|r| GpuPair {
                old_uuid: r.old.to_ffi(),
                new_uuid: r.new.to_ffi(),
            })
            .collect();
        let mut args = RestoreArgs::zeroed();
        if !pairs.is_empty() {
            args.gpu_pairs = pairs.as_mut_ptr();
            args.gpu_pairs_count = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        }
        // SAFETY: `pairs` outlives the call and `gpuPairs` is only set on
        // drivers that know the field (checked above).
        unsafe { self.restore_process_with(pid, &mut args) }
    }

    /// `cuCheckpointProcessRestore` with caller-built arguments.
    ///
    /// # Safety
    /// Every pointer in `args` must be valid for the call, and fields newer
    /// than the driver must be zero.
    pub unsafe fn restore_process_with(
        &self,
        pid: i32,
        args: &mut RestoreArgs,
    ) -> Result<(), CallError> {
        const CALL: &str = "cuCheckpointProcessRestore";
        let api = self.checkpoint_api(CALL)?;
        // SAFETY: resolved with this prototype; the caller vouches for `args`.
        let rc = unsafe { (api.restore)(pid, args) };
        self.check(CALL, pid, rc)
    }

    /// LOCKED → RUNNING.
    pub fn unlock_process(&self, pid: i32) -> Result<(), CallError> {
        const CALL: &str = "cuCheckpointProcessUnlock";
        let api = self.checkpoint_api(CALL)?;
        let mut args = UnlockArgs::default();
        // SAFETY: resolved with this prototype; zeroed args valid for the call.
        let rc = unsafe { (api.unlock)(pid, &mut args) };
        self.check(CALL, pid, rc)
    }

    /// `cuCheckpointProcessGetState`. Slow on real drivers (seconds on large
    /// processes), so gpusnap tracks state itself and only asks after errors.
    pub fn process_state(&self, pid: i32) -> Result<ProcessState, CallError> {
        const CALL: &str = "cuCheckpointProcessGetState";
        let api = self.checkpoint_api(CALL)?;
        let mut raw: CuProcessState = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (api.get_state)(pid, &mut raw) };
        self.check(CALL, pid, rc)?;
        Ok(ProcessState::from_raw(raw))
    }

    /// `cuCheckpointProcessGetRestoreThreadId`: succeeds for CUDA processes.
    pub fn restore_thread_id(&self, pid: i32) -> Result<i32, CallError> {
        const CALL: &str = "cuCheckpointProcessGetRestoreThreadId";
        let api = self.checkpoint_api(CALL)?;
        let mut tid: c_int = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (api.get_restore_thread_id)(pid, &mut tid) };
        self.check(CALL, pid, rc)?;
        Ok(tid)
    }

    /// `cuCheckpointOperationComplete` (CUDA 13.4). `pid` only labels errors.
    ///
    /// # Safety
    /// `handle` must come from a CustomStorage checkpoint or restore of this
    /// driver that has not been completed yet.
    pub unsafe fn complete_operation(
        &self,
        pid: i32,
        handle: OperationHandle,
    ) -> Result<(), CallError> {
        const CALL: &str = "cuCheckpointOperationComplete";
        let complete = self.operation_complete.ok_or(CallError::Unavailable {
            call: CALL,
            driver_version: self.version,
            reason: "storage engines need CUDA 13.4 CustomStorage",
        })?;
        // SAFETY: the caller vouches for the handle.
        let rc = unsafe { complete(handle) };
        self.check(CALL, pid, rc)
    }

    #[allow(dead_code)] // consumed by the storage engine that lands next
    pub(crate) fn memory_api(&self) -> Option<&MemoryApi> {
        self.memory.as_ref()
    }
}

#[cfg(test)]
mod custom_storage_tests;

/// A lock that gave up waiting for the process's GPU work (`CUDA_ERROR_NOT_READY` or
/// `CUDA_ERROR_TIMEOUT` with a bounded timeout) says which setting to raise: the default
/// bound exists so that a person waiting on a checkpoint is not kept waiting forever.
fn lock_timeout_hint(mut e: CallError, timeout_ms: u32) -> CallError {
    if let CallError::Cuda { error, .. } = &mut e {
        if timeout_ms > 0 && matches!(error.code, code::NOT_READY | 909) {
            let hint = format!(
                "the lock waited {timeout_ms} ms for the process's CUDA work to finish; raise \
                 cuda.lock_timeout_ms (pod annotation gpusnap.io/cuda-lock-timeout-ms) above the \
                 longest kernel or copy the workload runs, or set 0 to wait without a limit"
            );
            error.description = Some(match error.description.take() {
                Some(d) => format!("{d}; {hint}"),
                None => hint,
            });
        }
    }
    e
}
