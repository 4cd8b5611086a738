//! What the loaded driver can do, and the GPUs it sees.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::uuid::GpuUuid;
use super::version::DriverVersion;

/// One GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// CUDA ordinal in the process that queried it (affected by
    /// `CUDA_VISIBLE_DEVICES`); the UUID is the stable identity.
    pub index: u32,
    pub uuid: GpuUuid,
    pub name: String,
    pub total_memory_bytes: u64,
}

/// Capabilities of a loaded driver, decided by run-time symbol resolution only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub library_path: PathBuf,
    pub driver_version: DriverVersion,
    /// All six `cuCheckpointProcess*` functions resolved (CUDA 12.8, r570).
    pub checkpoint_api: bool,
    /// `gpuPairs` in the restore args may be used (CUDA 13.0, r580).
    pub gpu_remap: bool,
    /// CUDA 13.4 CustomStorage: `cuCheckpointOperationComplete` resolved at
    /// 13040 and the memory functions a storage engine needs resolved too.
    pub custom_storage: bool,
    /// Symbols that did not resolve, for logs and error messages.
    pub missing_symbols: Vec<String>,
    pub devices: Vec<DeviceInfo>,
}

impl Capabilities {
    pub fn device(&self, uuid: &GpuUuid) -> Option<&DeviceInfo> {
        self.devices.iter().find(|d| &d.uuid == uuid)
    }
}
