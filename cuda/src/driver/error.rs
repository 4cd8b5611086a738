//! `CUresult` as a Rust error, and errors of the binding itself.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;

use super::version::DriverVersion;

/// `CUresult` values gpusnap reasons about.
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const NOT_INITIALIZED: u32 = 3;
    pub const NO_DEVICE: u32 = 100;
    pub const INVALID_CONTEXT: u32 = 201;
    pub const OPERATING_SYSTEM: u32 = 304;
    pub const ILLEGAL_STATE: u32 = 401;
    pub const NOT_FOUND: u32 = 500;
    pub const NOT_READY: u32 = 600;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const STREAM_CAPTURE_UNSUPPORTED: u32 = 900;
    pub const UNKNOWN: u32 = 999;
}

/// A failed driver call's `CUresult`, with its symbolic name.
///
/// The name comes from `cuGetErrorName` when the driver has it, else from a
/// static table (so errors stay readable even when `cuInit` itself failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CuError {
    pub code: u32,
    pub name: Cow<'static, str>,
    /// `cuGetErrorString`, when available.
    pub description: Option<String>,
}

/// Result of a raw driver call.
pub type CuResult<T> = Result<T, CuError>;

impl CuError {
    /// An error named from the static table only.
    pub fn from_code(code: u32) -> Self {
        Self {
            code,
            name: static_name(code),
            description: None,
        }
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.code)?;
        if let Some(text) = &self.description {
            write!(f, ": {text}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CuError {}

/// Fallback names. Values from the CUDA 13 `cuda.h` `cudaError_enum`.
pub(crate) fn static_name(code: u32) -> Cow<'static, str> {
    let name = match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        102 => "CUDA_ERROR_DEVICE_NOT_LICENSED",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        401 => "CUDA_ERROR_ILLEGAL_STATE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        900 => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        909 => "CUDA_ERROR_TIMEOUT",
        999 => "CUDA_ERROR_UNKNOWN",
        other => return Cow::Owned(format!("CUresult {other}")),
    };
    Cow::Borrowed(name)
}

/// A failed call of the per-process checkpoint API.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error("{call}(pid {pid}) returned {error}")]
    Cuda {
        call: &'static str,
        pid: i32,
        error: CuError,
    },
    #[error(
        "{call} is not available in driver {driver_version}: {reason}; \
         upgrade the NVIDIA driver"
    )]
    Unavailable {
        call: &'static str,
        driver_version: DriverVersion,
        reason: &'static str,
    },
}

impl CallError {
    /// The `CUresult`, when the driver returned one.
    pub fn code(&self) -> Option<u32> {
        match self {
            Self::Cuda { error, .. } => Some(error.code),
            Self::Unavailable { .. } => None,
        }
    }
}

/// Why `cuGetProcAddress` gave no entry point for a symbol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("cuGetProcAddress returned {0}")]
    Call(CuError),
    #[error("cuGetProcAddress returned a null pointer")]
    Null,
    #[error("symbol not found")]
    NotFound,
    #[error("version not sufficient")]
    VersionNotSufficient,
    #[error("cuGetProcAddress status {0}")]
    Status(u32),
}

/// Loading the driver library failed. Every variant says what is missing and
/// what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "cannot load the CUDA driver library `{path}`: {reason}. Install the NVIDIA driver \
         (r570 or newer for checkpointing) or point gpusnap's CUDA library path at libcuda.so.1"
    )]
    Library { path: PathBuf, reason: String },

    #[error(
        "`{path}` has no `{symbol}`: it is not a CUDA driver, or one older than CUDA 12.0; \
         gpusnap needs driver r570 (CUDA 12.8) or newer"
    )]
    MissingEntryPoint {
        path: PathBuf,
        symbol: &'static str,
        reason: String,
    },

    #[error(
        "cuInit failed in `{path}`: {error}. Check that the NVIDIA kernel module is loaded, \
         that /dev/nvidiactl and /dev/nvidia* are accessible, and that the driver and kernel \
         module versions match"
    )]
    Init { path: PathBuf, error: CuError },

    #[error(
        "`{path}` (driver {driver_version}): required function `{symbol}` is unavailable at \
         CUDA version {requested}: {reason}"
    )]
    Resolve {
        path: PathBuf,
        symbol: &'static str,
        requested: DriverVersion,
        driver_version: DriverVersion,
        #[source]
        reason: ResolveError,
    },

    #[error("listing GPUs through `{path}` failed: {error}")]
    Devices { path: PathBuf, error: CuError },

    #[error("cuDriverGetVersion failed in `{path}`: {error}")]
    Version { path: PathBuf, error: CuError },

    #[error("cannot start the CUDA driver initialisation thread: {reason}")]
    Thread { reason: String },

    #[error(
        "CUDA driver initialisation did not finish within {waited_ms} ms \
         (it continues in the background)"
    )]
    InitTimeout { waited_ms: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_carries_name_and_number() {
        let err = CuError::from_code(code::NOT_READY);
        assert_eq!(err.to_string(), "CUDA_ERROR_NOT_READY (600)");
        let err = CuError {
            description: Some("device not ready".into()),
            ..err
        };
        assert_eq!(
            err.to_string(),
            "CUDA_ERROR_NOT_READY (600): device not ready"
        );
    }

    #[test]
    fn unknown_codes_keep_their_number() {
        assert_eq!(
            CuError::from_code(12345).to_string(),
            "CUresult 12345 (12345)"
        );
    }

    #[test]
    fn table_covers_checkpoint_api_codes() {
        for c in [1, 2, 3, 201, 304, 401, 600, 801, 900] {
            assert!(static_name(c).starts_with("CUDA_ERROR_"), "{c}");
        }
    }
}
