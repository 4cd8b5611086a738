//! The CUDA side of checkpoint and restore, as the shim drives it: which driver, which
//! processes, which storage engine, the GPU section of the manifest, and the compatibility
//! gate a restore passes before CRIU runs. The sequencing and rollback live in the cuda crate.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock},
};

use gpusnap_config::{Config, StorageEngine as EngineChoice};
use gpusnap_criu_bridge::{GpuProcessRecord, GpuSection};
use gpusnap_cuda::{
    discovery::{self, CudaProcess, DiscoveryOptions},
    driver::{Capabilities, DeviceInfo},
    orchestrate::{CheckpointReport, GpuMap, ProcessRecord},
    Driver, DriverConfig, LoadError, Orchestrator, OrchestratorOptions,
};

/// Key under which each GPU process record carries the cuda crate's full record.
const CUDA_RECORD: &str = "cuda";

/// The driver for `library`, loaded once per shim. `Ok(None)` when the library cannot be
/// opened at all: no NVIDIA driver on this node, so no process can be using CUDA.
pub fn load_driver(library: &str) -> Result<Option<Arc<Driver>>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Driver>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(d) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(library) {
        return Ok(Some(d.clone()));
    }
    match Driver::load(&DriverConfig::with_library(library)) {
        Ok(d) => {
            let d = Arc::new(d);
            cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(library.to_string(), d.clone());
            Ok(Some(d))
        }
        Err(LoadError::Library { .. }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

pub fn orchestrator_options(config: &Config) -> OrchestratorOptions {
    OrchestratorOptions {
        lock_timeout: config.cuda.lock_timeout().unwrap_or_default(),
        max_operation: config.cuda.max_operation(),
        restore_budget: config.cuda.restore_budget(),
        ..Default::default()
    }
}

/// The orchestrator for the configured storage engine, or the reason it cannot run here.
/// Called before anything is locked: choosing `posix` on a driver without the 13.4 API fails
/// here, with the workload untouched.
pub fn orchestrator(driver: Arc<Driver>, config: &Config) -> Result<Orchestrator, String> {
    let caps = driver.capabilities();
    match config.storage.engine {
        EngineChoice::DriverManaged => Ok(Orchestrator::driver_managed(
            driver,
            orchestrator_options(config),
        )),
        EngineChoice::Posix if !caps.custom_storage => Err(format!(
            "storage engine `posix` (device memory copied by gpusnap into files) needs a CUDA 13.4 \
             driver, where cuCheckpointOperationComplete resolves at version 13040; this node's \
             driver reports CUDA {} and does not provide it. Nothing was locked; choose \
             storage.engine = \"driver-managed\" (gpusnap.io/storage-engine: driver-managed) or \
             upgrade the driver",
            caps.driver_version
        )),
        EngineChoice::Posix => Err(
            "storage engine `posix` is not available in this gpusnap build; nothing was locked; \
             choose storage.engine = \"driver-managed\""
                .to_string(),
        ),
    }
}

/// The container's CUDA processes among `pids`.
///
/// A process's GPUs come from its open `/dev/nvidiaN` descriptors. When they cannot be
/// determined, every GPU the driver lists is recorded instead: the restore gate then demands
/// at least that many GPUs of those types, which is conservative but never lets a restore
/// start on a node that cannot hold the process.
pub fn discover(driver: &Arc<Driver>, pids: &[u32]) -> Result<Vec<CudaProcess>, String> {
    let pids: Vec<i32> = pids.iter().map(|&p| p as i32).collect();
    let mut procs = discovery::find_cuda_processes(driver, &pids, &DiscoveryOptions::default())
        .map_err(|e| e.to_string())?;
    for p in procs.iter_mut().filter(|p| p.gpus.is_empty()) {
        tracing::warn!(
            pid = p.host_pid,
            gpus = driver.capabilities().devices.len(),
            "GPUs of a CUDA process not found among its open /dev/nvidia* files; \
             recording every GPU the driver lists"
        );
        p.gpus = driver.capabilities().devices.clone();
    }
    Ok(procs)
}

/// The manifest's GPU section for a checkpoint report.
pub fn section(report: &CheckpointReport) -> Result<GpuSection, String> {
    let mut processes = Vec::with_capacity(report.processes.len());
    for p in &report.processes {
        let mut extra = serde_json::Map::new();
        extra.insert(
            CUDA_RECORD.to_string(),
            serde_json::to_value(p).map_err(|e| format!("encode GPU record: {e}"))?,
        );
        processes.push(GpuProcessRecord {
            host_pid: p.host_pid as u32,
            devices: p.gpus.iter().map(|g| g.uuid.to_string()).collect(),
            extra,
        });
    }
    let mut extra = serde_json::Map::new();
    extra.insert(
        "driver_version".into(),
        serde_json::json!(report.driver_version.0),
    );
    extra.insert(
        "timings".into(),
        serde_json::to_value(&report.timings).map_err(|e| format!("encode GPU timings: {e}"))?,
    );
    Ok(GpuSection {
        engine: report.engine.clone(),
        processes,
        extra,
    })
}

/// The cuda crate's records back from a manifest's GPU section.
pub fn records(section: &GpuSection) -> Result<Vec<ProcessRecord>, String> {
    section
        .processes
        .iter()
        .map(|p| {
            let v = p.extra.get(CUDA_RECORD).ok_or_else(|| {
                format!(
                    "GPU record of pid {} has no `{CUDA_RECORD}` entry: the manifest is damaged",
                    p.host_pid
                )
            })?;
            serde_json::from_value(v.clone())
                .map_err(|e| format!("GPU record of pid {}: {e}", p.host_pid))
        })
        .collect()
}

/// The compatibility gate, run before CRIU: this node's driver can restore these processes,
/// with the same GPU type for every checkpointed GPU. Returns the GPU map: identity where the
/// checkpointed GPU is present, otherwise the next unused GPU of the same type (the driver then
/// gets UUID pairs).
pub fn gate(
    caps: &Capabilities,
    engine: &str,
    records: &[ProcessRecord],
) -> Result<GpuMap, String> {
    if !caps.checkpoint_api {
        return Err(format!(
            "this node's CUDA driver ({}) has no process checkpoint API (needs r570 / CUDA 12.8 or newer)",
            caps.driver_version
        ));
    }
    if let Some(r) = records.iter().find(|r| r.engine != engine) {
        return Err(format!(
            "pid {} was checkpointed with storage engine `{}` but the manifest says `{engine}`",
            r.host_pid, r.engine
        ));
    }
    if let Some(r) = records
        .iter()
        .find(|r| r.driver_version.0 > caps.driver_version.0)
    {
        return Err(format!(
            "the checkpoint was taken with CUDA driver API {} but this node's driver is older ({}); \
             restore it on a node with the same or a newer driver",
            r.driver_version, caps.driver_version
        ));
    }
    let mut wanted: Vec<&DeviceInfo> = Vec::new();
    for g in records.iter().flat_map(|r| &r.gpus) {
        if !wanted.iter().any(|w| w.uuid == g.uuid) {
            wanted.push(g);
        }
    }
    if wanted.len() > caps.devices.len() {
        return Err(format!(
            "the checkpoint uses {} GPUs but this node has {} ({})",
            wanted.len(),
            caps.devices.len(),
            describe(&caps.devices)
        ));
    }
    let mut map = GpuMap::new();
    let mut taken: BTreeSet<String> = BTreeSet::new();
    // Identity first, so a restore on the same node never moves anything.
    for w in &wanted {
        if let Some(d) = caps.device(&w.uuid) {
            if d.name != w.name {
                return Err(format!(
                    "GPU {} was a {} at checkpoint but is a {} here",
                    w.uuid, w.name, d.name
                ));
            }
            taken.insert(d.uuid.to_string());
        }
    }
    for w in wanted.iter().filter(|w| caps.device(&w.uuid).is_none()) {
        let target = caps
            .devices
            .iter()
            .find(|d| d.name == w.name && !taken.contains(&d.uuid.to_string()))
            .ok_or_else(|| {
                format!(
                    "the checkpoint ran on a {} ({}) and this node has no free GPU of that type ({})",
                    w.name,
                    w.uuid,
                    describe(&caps.devices)
                )
            })?;
        if !caps.gpu_remap {
            return Err(format!(
                "restoring onto other GPUs ({} → {}) needs driver r580 (CUDA 13.0) or newer; this is {}",
                w.uuid, target.uuid, caps.driver_version
            ));
        }
        taken.insert(target.uuid.to_string());
        map.insert(w.uuid, target.uuid);
    }
    Ok(map)
}

fn describe(devices: &[DeviceInfo]) -> String {
    if devices.is_empty() {
        return "none".to_string();
    }
    devices
        .iter()
        .map(|d| format!("{} {}", d.name, d.uuid))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Library path configured for this container.
pub fn library(config: &Config) -> PathBuf {
    PathBuf::from(&config.cuda.library)
}
