//! A container's GPU state as the front-ends (the containerd shim and `gpusnap-runc`) handle
//! it around CRIU: which CUDA processes there are and which engine moves their device memory
//! (decided before anything is locked), the manifest's `gpu` section, and the compatibility
//! gate a restore passes before CRIU runs. One implementation, so either front-end restores
//! what the other checkpointed.

use std::{
    collections::{BTreeSet, HashMap},
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use gpusnap_config::{Config, StorageEngine as EngineChoice};
use gpusnap_criu_bridge::{GpuProcessRecord, GpuSection};

use crate::{
    discovery::{self, CudaProcess, DiscoveryOptions},
    driver::{Capabilities, DeviceInfo},
    engine::{DriverManaged, StorageEngine},
    orchestrate::{CheckpointReport, GpuMap, ProcessRecord},
    posix::Posix,
    Driver, DriverConfig, LoadError, Orchestrator, OrchestratorOptions,
};

/// Key under which each GPU process record of the manifest carries the orchestrator's full
/// record (container pid, restore thread, GPUs, driver version, engine details).
pub const CUDA_RECORD: &str = "cuda";
/// Character-device major of `/dev/nvidia*`.
const NVIDIA_MAJOR: u32 = 195;

/// Why a container's GPU state cannot be handled; every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum GpuStateError {
    #[error("{0}")]
    Driver(String),
    #[error("finding the container's CUDA processes failed: {0}")]
    Discovery(String),
    #[error("{0}")]
    EngineUnavailable(String),
    #[error("{0}")]
    ManifestDamaged(String),
    #[error("{0}")]
    Incompatible(String),
}

pub fn orchestrator_options(config: &Config) -> OrchestratorOptions {
    OrchestratorOptions {
        // Zero asks the driver to wait forever; the watchdog (max_operation) still applies.
        lock_timeout: config.cuda.lock_timeout().unwrap_or(Duration::ZERO),
        max_operation: config.cuda.max_operation(),
        restore_budget: config.cuda.restore_budget(),
        ..Default::default()
    }
}

pub fn driver_config(config: &Config) -> DriverConfig {
    DriverConfig::with_library(&config.cuda.library)
}

/// The driver for `library`, loaded once per process (a shim serves many checkpoints).
/// `Ok(None)` when the library cannot be opened at all: no NVIDIA driver on this node.
pub fn load_driver(library: &str) -> Result<Option<Arc<Driver>>, LoadError> {
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
        Err(e) => Err(e),
    }
}

/// Whether any of `pids` has an NVIDIA device node open.
pub fn uses_nvidia_devices(proc_root: &Path, pids: &[i32]) -> bool {
    pids.iter().any(|pid| {
        std::fs::read_dir(proc_root.join(pid.to_string()).join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .any(|m| m.file_type().is_char_device() && libc::major(m.rdev()) == NVIDIA_MAJOR)
    })
}

/// What a checkpoint must do about GPUs.
#[derive(Debug)]
pub enum CheckpointGpu {
    CpuOnly,
    Cuda {
        orchestrator: Orchestrator,
        processes: Vec<CudaProcess>,
    },
}

/// Decides, before anything is touched, whether the container has CUDA processes and whether
/// the configured storage engine can move their memory on this driver.
///
/// No loadable driver means no process can be using CUDA — unless one holds an NVIDIA device
/// open (a driver installed where gpusnap does not look): that is refused, since CRIU cannot
/// dump GPU state and the restore would be silently broken. A process's GPUs come from its open
/// `/dev/nvidiaN` files; when they cannot be determined, every GPU the driver lists is
/// recorded, so the restore gate never places the process on a node too small for it.
pub fn prepare_checkpoint(config: &Config, pids: &[i32]) -> Result<CheckpointGpu, GpuStateError> {
    prepare_checkpoint_to(config, pids, None)
}

/// [`prepare_checkpoint`] for a checkpoint written to `storage_dir` (the checkpoint directory):
/// the posix engine puts its extent files there (`gpusnap-gpu-*`, flat) and refuses to run
/// without one.
pub fn prepare_checkpoint_to(
    config: &Config,
    pids: &[i32],
    storage_dir: Option<PathBuf>,
) -> Result<CheckpointGpu, GpuStateError> {
    let driver = match load_driver(&config.cuda.library) {
        Ok(Some(d)) => d,
        result => {
            if uses_nvidia_devices(Path::new("/proc"), pids) {
                let why = match result {
                    Err(e) => e.to_string(),
                    _ => format!("`{}` cannot be opened", config.cuda.library),
                };
                return Err(GpuStateError::Driver(format!(
                    "the container has NVIDIA devices open, but the CUDA driver cannot be loaded \
                     ({why}); refusing to checkpoint it without its GPU state (set cuda.library)"
                )));
            }
            if let Err(e) = result {
                tracing::debug!(error = %e, "CUDA driver unusable and no NVIDIA device open; CPU-only checkpoint");
            }
            return Ok(CheckpointGpu::CpuOnly);
        }
    };
    let mut processes = discovery::find_cuda_processes(&driver, pids, &DiscoveryOptions::default())
        .map_err(|e| GpuStateError::Discovery(e.to_string()))?;
    if processes.is_empty() {
        return Ok(CheckpointGpu::CpuOnly);
    }
    for p in processes.iter_mut().filter(|p| p.gpus.is_empty()) {
        tracing::warn!(
            pid = p.host_pid,
            gpus = driver.capabilities().devices.len(),
            "GPUs of a CUDA process not found among its open /dev/nvidia* files; recording every GPU the driver lists"
        );
        p.gpus = driver.capabilities().devices.clone();
    }
    let caps = driver.capabilities();
    let orchestrator = match config.storage.engine {
        EngineChoice::DriverManaged => {
            Orchestrator::driver_managed(driver.clone(), orchestrator_options(config))
        }
        EngineChoice::Posix if storage_dir.is_none() => {
            return Err(GpuStateError::EngineUnavailable(
                "storage engine `posix` needs the checkpoint directory to write extent files to, \
                 and none was given; nothing was locked"
                    .to_string(),
            ))
        }
        EngineChoice::Posix if !caps.custom_storage => {
            return Err(GpuStateError::EngineUnavailable(format!(
                "storage engine `posix` (device memory copied by gpusnap into files) needs a CUDA \
                 13.4 driver, where cuCheckpointOperationComplete resolves at version 13040; this \
                 node's driver reports {} and does not provide it. Nothing was locked; \
                 choose storage.engine = \"driver-managed\" (gpusnap.io/storage-engine: \
                 driver-managed) or upgrade the driver",
                caps.driver_version
            )))
        }
        EngineChoice::Posix => {
            let engine = Posix::from_config(&config.storage).map_err(|e| {
                GpuStateError::EngineUnavailable(format!("{e}; nothing was locked"))
            })?;
            Orchestrator::new(
                driver.clone(),
                Arc::new(engine),
                orchestrator_options(config),
            )
        }
    };
    tracing::info!(
        pids = ?processes.iter().map(|p| p.host_pid).collect::<Vec<_>>(),
        engine = config.storage.engine.as_str(),
        "CUDA processes found"
    );
    Ok(CheckpointGpu::Cuda {
        orchestrator,
        processes,
    })
}

/// The engine that restores a checkpoint taken with `engine` (the manifest's `gpu.engine`),
/// refused before anything is touched when this driver cannot run it.
pub fn restore_engine(
    config: &Config,
    caps: &Capabilities,
    engine: &str,
) -> Result<Arc<dyn StorageEngine>, GpuStateError> {
    let chosen: Arc<dyn StorageEngine> = match engine {
        DriverManaged::NAME => Arc::new(DriverManaged),
        Posix::NAME => Arc::new(
            Posix::from_config(&config.storage)
                .map_err(|e| GpuStateError::EngineUnavailable(e.to_string()))?,
        ),
        other => {
            return Err(GpuStateError::Incompatible(format!(
                "the checkpoint's GPU state was taken with storage engine `{other}`, which this \
                 gpusnap build cannot restore"
            )))
        }
    };
    chosen.admit(caps).map_err(|e| {
        GpuStateError::Incompatible(format!("{e}; the checkpoint needs it to restore"))
    })?;
    Ok(chosen)
}

/// The orchestrator that restores a checkpoint whose manifest says `gpu.engine == engine`,
/// reading extent files (posix) from `checkpoint_dir`.
pub fn restore_orchestrator(
    driver: Arc<Driver>,
    config: &Config,
    engine: &str,
    checkpoint_dir: Option<PathBuf>,
) -> Result<Orchestrator, GpuStateError> {
    let chosen = restore_engine(config, driver.capabilities(), engine)?;
    let options = OrchestratorOptions {
        storage_dir: checkpoint_dir,
        ..orchestrator_options(config)
    };
    Ok(Orchestrator::new(driver, chosen, options))
}

/// The manifest's `gpu` section for a finished checkpoint.
pub fn section(report: &CheckpointReport) -> GpuSection {
    let mut extra = serde_json::Map::new();
    extra.insert("driver_version".into(), report.driver_version.0.into());
    extra.insert(
        "timings".into(),
        serde_json::to_value(&report.timings).unwrap_or_default(),
    );
    GpuSection {
        engine: report.engine.clone(),
        processes: report
            .processes
            .iter()
            .map(|p| {
                let mut e = serde_json::Map::new();
                e.insert(
                    CUDA_RECORD.into(),
                    serde_json::to_value(p).unwrap_or_default(),
                );
                GpuProcessRecord {
                    host_pid: p.host_pid as u32,
                    devices: p.gpus.iter().map(|d| d.uuid.to_string()).collect(),
                    extra: e,
                }
            })
            .collect(),
        extra,
    }
}

/// The orchestrator records of a checkpoint, checked before any restore work.
pub fn restore_records(gpu: &GpuSection) -> Result<Vec<ProcessRecord>, GpuStateError> {
    if gpu.engine != DriverManaged::NAME && gpu.engine != Posix::NAME {
        return Err(GpuStateError::Incompatible(format!(
            "the checkpoint's GPU state was taken with storage engine `{}`, which this gpusnap \
             build cannot restore",
            gpu.engine
        )));
    }
    gpu.processes
        .iter()
        .map(|p| {
            let raw = p.extra.get(CUDA_RECORD).ok_or_else(|| {
                GpuStateError::ManifestDamaged(format!(
                    "GPU record of pid {} has no `{CUDA_RECORD}` entry: the manifest is damaged",
                    p.host_pid
                ))
            })?;
            serde_json::from_value(raw.clone()).map_err(|e| {
                GpuStateError::ManifestDamaged(format!("GPU record of pid {}: {e}", p.host_pid))
            })
        })
        .collect()
}

/// The compatibility gate, run before CRIU: this node's driver can restore these processes,
/// with the same GPU type for every checkpointed GPU. Returns the GPU map: identity where the
/// checkpointed GPU is present, otherwise the next unused GPU of the same type (the driver then
/// gets UUID pairs).
pub fn gate(caps: &Capabilities, records: &[ProcessRecord]) -> Result<GpuMap, GpuStateError> {
    let refuse = |m: String| Err(GpuStateError::Incompatible(m));
    if !caps.checkpoint_api {
        return refuse(format!(
            "this node's CUDA driver ({}) has no process checkpoint API (needs r570 / CUDA 12.8 or newer)",
            caps.driver_version
        ));
    }
    if let Some(r) = records
        .iter()
        .find(|r| r.driver_version.0 > caps.driver_version.0)
    {
        return refuse(format!(
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
        return refuse(format!(
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
                return refuse(format!(
                    "GPU {} was a {} at checkpoint but is a {} here",
                    w.uuid, w.name, d.name
                ));
            }
            taken.insert(d.uuid.to_string());
        }
    }
    for w in wanted.iter().filter(|w| caps.device(&w.uuid).is_none()) {
        let Some(target) = caps
            .devices
            .iter()
            .find(|d| d.name == w.name && !taken.contains(&d.uuid.to_string()))
        else {
            return refuse(format!(
                "the checkpoint ran on a {} ({}) and this node has no free GPU of that type ({})",
                w.name,
                w.uuid,
                describe(&caps.devices)
            ));
        };
        if !caps.gpu_remap {
            return refuse(format!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{DriverVersion, GpuUuid};

    fn dev(uuid: &str, name: &str) -> DeviceInfo {
        DeviceInfo {
            index: 0,
            uuid: uuid.parse().unwrap(),
            name: name.into(),
            total_memory_bytes: 1 << 30,
        }
    }

    fn caps(devices: Vec<DeviceInfo>, version: u32) -> Capabilities {
        Capabilities {
            library_path: "libcuda.so.1".into(),
            driver_version: DriverVersion(version),
            checkpoint_api: true,
            gpu_remap: version >= 13000,
            custom_storage: false,
            missing_symbols: vec![],
            devices,
        }
    }

    fn record(gpus: Vec<DeviceInfo>, version: u32) -> ProcessRecord {
        serde_json::from_value(serde_json::json!({
            "host_pid": 10, "container_pid": 1, "restore_tid": 10, "gpus": gpus,
            "driver_version": version, "engine": "driver-managed", "bytes_moved": 0, "timings": {}
        }))
        .unwrap()
    }

    const A: &str = "GPU-11111111-1111-1111-1111-111111111111";
    const B: &str = "GPU-22222222-2222-2222-2222-222222222222";

    #[test]
    fn same_gpus_give_an_identity_map() {
        let map = gate(
            &caps(vec![dev(A, "NVIDIA H200")], 13000),
            &[record(vec![dev(A, "NVIDIA H200")], 13000)],
        )
        .unwrap();
        assert!(map.is_empty());
    }

    #[test]
    fn another_gpu_of_the_same_type_is_mapped() {
        let map = gate(
            &caps(vec![dev(B, "NVIDIA H200")], 13000),
            &[record(vec![dev(A, "NVIDIA H200")], 13000)],
        )
        .unwrap();
        let pairs: Vec<(GpuUuid, GpuUuid)> = map.iter().map(|(a, b)| (*a, *b)).collect();
        assert_eq!(pairs, vec![(A.parse().unwrap(), B.parse().unwrap())]);
    }

    #[test]
    fn other_types_older_drivers_and_too_few_gpus_are_refused() {
        let err = gate(
            &caps(vec![dev(B, "NVIDIA A100")], 13000),
            &[record(vec![dev(A, "NVIDIA H200")], 13000)],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("no free GPU of that type"),
            "{err}"
        );
        let err = gate(
            &caps(vec![dev(A, "NVIDIA H200")], 12080),
            &[record(vec![dev(A, "NVIDIA H200")], 13000)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("older"), "{err}");
        let err = gate(
            &caps(vec![dev(A, "NVIDIA H200")], 13000),
            &[record(
                vec![dev(A, "NVIDIA H200"), dev(B, "NVIDIA H200")],
                13000,
            )],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("uses 2 GPUs but this node has 1"),
            "{err}"
        );
        let err = gate(
            &caps(vec![dev(B, "NVIDIA H200")], 12080),
            &[record(vec![dev(A, "NVIDIA H200")], 12080)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("r580"), "{err}");
    }

    #[test]
    fn restore_engines_follow_the_manifest_and_the_capability_gate() {
        let config = Config::default();
        let mut c = caps(vec![], 13000);
        assert_eq!(
            restore_engine(&config, &c, DriverManaged::NAME)
                .unwrap()
                .name(),
            DriverManaged::NAME
        );
        let err = restore_engine(&config, &c, Posix::NAME)
            .unwrap_err()
            .to_string();
        assert!(err.contains("13.4"), "{err}");
        c.custom_storage = true;
        assert_eq!(
            restore_engine(&config, &c, Posix::NAME).unwrap().name(),
            Posix::NAME
        );
        let err = restore_engine(&config, &c, "pagebroker")
            .unwrap_err()
            .to_string();
        assert!(err.contains("pagebroker"), "{err}");
    }

    #[test]
    fn foreign_engines_and_damaged_records_are_refused() {
        let mut gpu = GpuSection {
            engine: "pagebroker".into(),
            processes: vec![],
            extra: serde_json::Map::new(),
        };
        assert!(restore_records(&gpu)
            .unwrap_err()
            .to_string()
            .contains("pagebroker"));
        gpu.engine = Posix::NAME.into();
        assert!(restore_records(&gpu).unwrap().is_empty());
        gpu.engine = DriverManaged::NAME.into();
        assert!(restore_records(&gpu).unwrap().is_empty());
        gpu.processes.push(GpuProcessRecord {
            host_pid: 7,
            devices: vec![],
            extra: serde_json::Map::new(),
        });
        let err = restore_records(&gpu).unwrap_err().to_string();
        assert!(err.contains("pid 7") && err.contains("`cuda`"), "{err}");
    }

    #[test]
    fn own_process_has_no_nvidia_devices() {
        let me = std::process::id() as i32;
        assert!(!uses_nvidia_devices(Path::new("/proc"), &[me]));
    }
}
