//! CUDA versions as the driver encodes them (`1000 * major + 10 * minor`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A CUDA version number, e.g. `13000` for 13.0. Serialised as the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DriverVersion(pub u32);

impl DriverVersion {
    /// `cuCheckpointProcess*` (driver r570).
    pub const CHECKPOINT_API: Self = Self(12080);
    /// `CUcheckpointGpuPair` / `gpuPairs` in the restore args (driver r580).
    pub const GPU_REMAP: Self = Self(13000);
    /// CustomStorage and `cuCheckpointOperationComplete`.
    pub const CUSTOM_STORAGE: Self = Self(13040);

    pub fn major(self) -> u32 {
        self.0 / 1000
    }

    pub fn minor(self) -> u32 {
        (self.0 % 1000) / 10
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CUDA {}.{}", self.major(), self.minor())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_nvidia_smi() {
        assert_eq!(DriverVersion(13000).to_string(), "CUDA 13.0");
        assert_eq!(DriverVersion(12080).to_string(), "CUDA 12.8");
        assert_eq!(DriverVersion(13040).to_string(), "CUDA 13.4");
        assert_eq!(
            serde_json::to_string(&DriverVersion(13000)).unwrap(),
            "13000"
        );
    }
}
