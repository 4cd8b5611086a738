//! Raw CUDA driver ABI: the `#[repr(C)]` structs, enums and function-pointer
//! signatures gpusnap calls.
//!
//! Hand-written rather than generated: seven small structs whose layouts are
//! pinned by the tests at the bottom (sizes 64/64/64/64/32/24/24, x86_64), and
//! gpusnap must compile without CUDA headers. Layouts follow the CUDA 13.4
//! header. Every newer field sits in bytes older drivers reserved and required
//! to be zero, so a zeroed struct is valid on every driver.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CUresult` (a C enum; non-negative values).
pub type CuResultCode = c_uint;
/// `CUdevice`: a device ordinal handle.
pub type CuDevice = c_int;
/// `CUdeviceptr` (`unsigned long long` on 64-bit hosts).
pub type CuDevicePtr = u64;
/// `CUcontext`, opaque.
pub type CuContext = *mut c_void;
/// `CUstream`, opaque.
pub type CuStream = *mut c_void;
/// `CUcheckpointOperationHandle` (`struct CUcheckpointOperation_st *`), opaque.
pub type OperationHandle = *mut c_void;
/// `CUprocessState` (a C enum).
pub type CuProcessState = c_uint;
/// `CUdriverProcAddressQueryResult` (a C enum).
pub type ProcAddressStatus = c_uint;

/// `CU_GET_PROC_ADDRESS_DEFAULT`.
pub const GET_PROC_ADDRESS_DEFAULT: u64 = 0;
/// `CU_GET_PROC_ADDRESS_SUCCESS`.
pub const PROC_ADDRESS_SUCCESS: ProcAddressStatus = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const PROC_ADDRESS_SYMBOL_NOT_FOUND: ProcAddressStatus = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
pub const PROC_ADDRESS_VERSION_NOT_SUFFICIENT: ProcAddressStatus = 2;

/// `CUuuid`: 16 raw bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuUuid {
    pub bytes: [u8; 16],
}

/// `CUcheckpointLockArgs`.
#[doc(alias = "CUcheckpointLockArgs")]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockArgs {
    /// 0 waits forever.
    pub timeout_ms: c_uint,
    /// Must be zero.
    pub reserved0: c_uint,
    /// Must be zero.
    pub reserved1: [u64; 7],
}

/// `CUcheckpointUnlockArgs`.
#[doc(alias = "CUcheckpointUnlockArgs")]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnlockArgs {
    /// Must be zero.
    pub reserved: [u64; 8],
}

/// `CUcheckpointCheckpointArgs`, CUDA 13.4 layout (12.x: 64 reserved bytes).
#[doc(alias = "CUcheckpointCheckpointArgs")]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CheckpointArgs {
    /// NULL selects the driver-managed path. Set only when
    /// `cuCheckpointOperationComplete` resolved (CUDA 13.4).
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
    /// Must be zero.
    pub reserved: [u8; 56],
}

impl CheckpointArgs {
    pub const fn zeroed() -> Self {
        Self {
            custom_storage_info_out: std::ptr::null_mut(),
            reserved: [0; 56],
        }
    }
}

/// `CUcheckpointRestoreArgs`, CUDA 13.4 layout (still 64 bytes; 13.0 added
/// `gpuPairs`, 13.4 added `customStorageInfo_out`).
#[doc(alias = "CUcheckpointRestoreArgs")]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RestoreArgs {
    /// NULL restores onto the same GPUs. Otherwise it must cover every
    /// checkpointed GPU.
    pub gpu_pairs: *mut GpuPair,
    pub gpu_pairs_count: c_uint,
    pub padding0: c_uint,
    /// NULL restores from the driver's host copy.
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
    /// Must be zero.
    pub reserved: [u8; 40],
}

impl RestoreArgs {
    pub const fn zeroed() -> Self {
        Self {
            gpu_pairs: std::ptr::null_mut(),
            gpu_pairs_count: 0,
            padding0: 0,
            custom_storage_info_out: std::ptr::null_mut(),
            reserved: [0; 40],
        }
    }
}

/// `CUcheckpointGpuPair` (CUDA 13.0).
#[doc(alias = "CUcheckpointGpuPair")]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuPair {
    /// The GPU the process was checkpointed on.
    pub old_uuid: CuUuid,
    /// The GPU to restore onto.
    pub new_uuid: CuUuid,
}

/// `CUcheckpointCustomStoragePerDeviceData` (CUDA 13.4).
#[doc(alias = "CUcheckpointCustomStoragePerDeviceData")]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CustomStoragePerDeviceData {
    /// One contiguous mapping of the target's memory on this GPU, valid in the
    /// caller's context.
    pub dev_ptr: CuDevicePtr,
    pub size: usize,
    /// A stream in that GPU's primary context.
    pub stream: CuStream,
}

/// `CUcheckpointCustomStorageInfo` (CUDA 13.4). The driver allocates it.
#[doc(alias = "CUcheckpointCustomStorageInfo")]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CustomStorageInfo {
    /// Passed to `cuCheckpointOperationComplete`.
    pub handle: OperationHandle,
    /// `device_count` entries.
    pub per_device_data: *mut CustomStoragePerDeviceData,
    pub device_count: c_uint,
}

// Entry points resolved with dlsym.
pub type FnInit = unsafe extern "C" fn(flags: c_uint) -> CuResultCode;
pub type FnGetProcAddressV2 = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut ProcAddressStatus,
) -> CuResultCode;

// Everything else, resolved with cuGetProcAddress at an explicit version.
pub type FnDriverGetVersion = unsafe extern "C" fn(version: *mut c_int) -> CuResultCode;
pub type FnGetErrorText =
    unsafe extern "C" fn(error: CuResultCode, text: *mut *const c_char) -> CuResultCode;
pub type FnDeviceGetCount = unsafe extern "C" fn(count: *mut c_int) -> CuResultCode;
pub type FnDeviceGet = unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> CuResultCode;
pub type FnDeviceGetName =
    unsafe extern "C" fn(name: *mut c_char, len: c_int, device: CuDevice) -> CuResultCode;
pub type FnDeviceGetUuid =
    unsafe extern "C" fn(uuid: *mut CuUuid, device: CuDevice) -> CuResultCode;
pub type FnDeviceTotalMem =
    unsafe extern "C" fn(bytes: *mut usize, device: CuDevice) -> CuResultCode;
pub type FnDevicePrimaryCtxRetain =
    unsafe extern "C" fn(ctx: *mut CuContext, device: CuDevice) -> CuResultCode;
pub type FnDevicePrimaryCtxRelease = unsafe extern "C" fn(device: CuDevice) -> CuResultCode;
pub type FnCtxSetCurrent = unsafe extern "C" fn(ctx: CuContext) -> CuResultCode;
pub type FnMemcpyDtoHAsync = unsafe extern "C" fn(
    dst: *mut c_void,
    src: CuDevicePtr,
    bytes: usize,
    stream: CuStream,
) -> CuResultCode;
pub type FnMemcpyHtoDAsync = unsafe extern "C" fn(
    dst: CuDevicePtr,
    src: *const c_void,
    bytes: usize,
    stream: CuStream,
) -> CuResultCode;
pub type FnMemHostAlloc =
    unsafe extern "C" fn(ptr: *mut *mut c_void, bytes: usize, flags: c_uint) -> CuResultCode;
pub type FnMemFreeHost = unsafe extern "C" fn(ptr: *mut c_void) -> CuResultCode;
pub type FnStreamSynchronize = unsafe extern "C" fn(stream: CuStream) -> CuResultCode;

pub type FnProcessLock = unsafe extern "C" fn(pid: c_int, args: *mut LockArgs) -> CuResultCode;
pub type FnProcessCheckpoint =
    unsafe extern "C" fn(pid: c_int, args: *mut CheckpointArgs) -> CuResultCode;
pub type FnProcessRestore =
    unsafe extern "C" fn(pid: c_int, args: *mut RestoreArgs) -> CuResultCode;
pub type FnProcessUnlock = unsafe extern "C" fn(pid: c_int, args: *mut UnlockArgs) -> CuResultCode;
pub type FnProcessGetState =
    unsafe extern "C" fn(pid: c_int, state: *mut CuProcessState) -> CuResultCode;
pub type FnProcessGetRestoreThreadId =
    unsafe extern "C" fn(pid: c_int, tid: *mut c_int) -> CuResultCode;
pub type FnOperationComplete = unsafe extern "C" fn(handle: OperationHandle) -> CuResultCode;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn lock_args_layout() {
        assert_eq!(size_of::<LockArgs>(), 64);
        assert_eq!(offset_of!(LockArgs, timeout_ms), 0);
        assert_eq!(offset_of!(LockArgs, reserved0), 4);
        assert_eq!(offset_of!(LockArgs, reserved1), 8);
    }

    #[test]
    fn unlock_args_layout() {
        assert_eq!(size_of::<UnlockArgs>(), 64);
        assert_eq!(offset_of!(UnlockArgs, reserved), 0);
    }

    #[test]
    fn checkpoint_args_layout() {
        assert_eq!(size_of::<CheckpointArgs>(), 64);
        assert_eq!(offset_of!(CheckpointArgs, custom_storage_info_out), 0);
        assert_eq!(offset_of!(CheckpointArgs, reserved), 8);
    }

    #[test]
    fn restore_args_layout() {
        assert_eq!(size_of::<RestoreArgs>(), 64);
        assert_eq!(offset_of!(RestoreArgs, gpu_pairs), 0);
        assert_eq!(offset_of!(RestoreArgs, gpu_pairs_count), 8);
        assert_eq!(offset_of!(RestoreArgs, padding0), 12);
        assert_eq!(offset_of!(RestoreArgs, custom_storage_info_out), 16);
        assert_eq!(offset_of!(RestoreArgs, reserved), 24);
    }

    #[test]
    fn gpu_pair_layout() {
        assert_eq!(size_of::<CuUuid>(), 16);
        assert_eq!(size_of::<GpuPair>(), 32);
        assert_eq!(offset_of!(GpuPair, old_uuid), 0);
        assert_eq!(offset_of!(GpuPair, new_uuid), 16);
    }

    #[test]
    fn custom_storage_layouts() {
        assert_eq!(size_of::<CustomStoragePerDeviceData>(), 24);
        assert_eq!(offset_of!(CustomStoragePerDeviceData, dev_ptr), 0);
        assert_eq!(offset_of!(CustomStoragePerDeviceData, size), 8);
        assert_eq!(offset_of!(CustomStoragePerDeviceData, stream), 16);

        assert_eq!(size_of::<CustomStorageInfo>(), 24);
        assert_eq!(offset_of!(CustomStorageInfo, handle), 0);
        assert_eq!(offset_of!(CustomStorageInfo, per_device_data), 8);
        assert_eq!(offset_of!(CustomStorageInfo, device_count), 16);
        assert_eq!(
            align_of::<CustomStorageInfo>(),
            8,
            "4 bytes of tail padding"
        );
    }

    #[test]
    fn zeroed_args_are_all_zero_bytes() {
        fn bytes<T>(value: &T) -> &[u8] {
            // SAFETY: reading the initialised bytes of a plain repr(C) value
            // with no padding holes in these types (checked by the sizes above).
            unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
        }
        assert!(bytes(&CheckpointArgs::zeroed()).iter().all(|b| *b == 0));
        assert!(bytes(&RestoreArgs::zeroed()).iter().all(|b| *b == 0));
        assert!(bytes(&LockArgs::default()).iter().all(|b| *b == 0));
        assert!(bytes(&UnlockArgs::default()).iter().all(|b| *b == 0));
    }
}
