//! A container's GPU state around CRIU, for both directions of the transaction: which CUDA
//! processes there are and which engine moves their device memory (decided before anything is
//! locked), the manifest's `gpu` section, the compatibility gate a restore passes before CRIU
//! runs, and the CUDA restore after it.

use std::{
    collections::{BTreeSet, HashMap},
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::Path,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use gpusnap_checkpoint::{GpuProcessRecord, GpuSection};
use gpusnap_config::Config;
use gpusnap_cuda::{
    discovery::{self, CudaProcess, DiscoveryOptions},
    driver::{Capabilities, DeviceInfo},
    engine::StorageEngine,
    engines::{engine_by_name, engine_names},
    orchestrate::{CheckpointReport, GpuMap, ProcessRecord, RestoreReport, RestoreTarget},
    Driver, DriverConfig, LoadError, OrchestrateError, Orchestrator, OrchestratorOptions,
    PendingDriver,
};

use crate::error::{Error, Result};
use crate::host::RuncFailure;

/// Why CUDA processes left checkpointed (or locked) could not be resumed.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The frozen container could not be thawed for the driver.
    #[error("{0}")]
    Thaw(#[source] RuncFailure),
    /// The container could not be frozen again after the driver was done.
    #[error("{0}")]
    Refreeze(#[source] RuncFailure),
    /// The driver's restore or unlock failed.
    #[error(transparent)]
    Driver(#[from] OrchestrateError),
}

/// Why the GPU state of restored processes could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum GpuRestoreError {
    /// A checkpointed CUDA process was not found among the restored ones.
    #[error(transparent)]
    Discovery(#[from] discovery::DiscoveryError),
    #[error(transparent)]
    Driver(#[from] OrchestrateError),
}

/// A storage engine this build does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "storage engine `{name}` does not exist in this gpusnap; choose one of {}",
    engine_names().join(", ")
)]
pub struct UnknownEngine {
    pub name: String,
}

/// Key under which each GPU process record of the manifest carries the orchestrator's full
/// record (container pid, restore thread, GPUs, driver version, engine details).
pub const CUDA_RECORD: &str = "cuda";
/// Character-device major of `/dev/nvidia*`.
const NVIDIA_MAJOR: u32 = 195;

/// Orchestrator settings from the node's configuration; engines that write files (posix) put
/// them in `checkpoint_dir`, next to CRIU's images.
pub fn orchestrator_options(config: &Config, checkpoint_dir: &Path) -> OrchestratorOptions {
    OrchestratorOptions {
        // Zero asks the driver to wait forever; the watchdog (max_operation) still applies.
        lock_timeout: config.cuda.lock_timeout().unwrap_or(Duration::ZERO),
        max_operation: config.cuda.max_operation(),
        restore_budget: config.cuda.restore_budget(),
        storage_dir: Some(checkpoint_dir.to_path_buf()),
        ..Default::default()
    }
}

/// The driver for `library`, loaded once per process (a shim serves many checkpoints; a
/// second caller waits for a load in progress instead of starting another).
pub fn cached_driver(library: &str) -> std::result::Result<Arc<Driver>, LoadError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Driver>>>> = OnceLock::new();
    static LOADING: Mutex<()> = Mutex::new(());
    let cache = CACHE.get_or_init(Default::default);
    let cached = || {
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(library)
            .cloned()
    };
    if let Some(d) = cached() {
        return Ok(d);
    }
    let _loading = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = cached() {
        return Ok(d);
    }
    let d = Arc::new(Driver::load(&DriverConfig::with_library(library))?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(library.to_string(), d.clone());
    Ok(d)
}

/// [`cached_driver`], with `Ok(None)` when the library cannot be opened at all: no NVIDIA
/// driver on this node.
pub fn load_driver(library: &str) -> std::result::Result<Option<Arc<Driver>>, LoadError> {
    match cached_driver(library) {
        Ok(d) => Ok(Some(d)),
        Err(LoadError::Library { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Loads the driver in the background when a container has NVIDIA devices, so its first
/// checkpoint or restore does not pay for `cuInit`.
pub fn prewarm_driver(library: &str) {
    let library = library.to_string();
    let _ = std::thread::Builder::new()
        .name("gpusnap-cuda-prewarm".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            match cached_driver(&library) {
                Ok(_) => tracing::debug!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "CUDA driver loaded ahead of use"
                ),
                Err(e) => tracing::debug!(error = %e, "CUDA driver not loaded ahead of use"),
            }
        });
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

/// Whether this build has a storage engine called `name`; the error lists the ones it has.
pub fn check_engine_name(name: &str) -> std::result::Result<(), UnknownEngine> {
    if engine_names().contains(&name) {
        Ok(())
    } else {
        Err(UnknownEngine {
            name: name.to_string(),
        })
    }
}

/// The engine called `name`, admitted on this driver, or a refusal that says what to do.
fn engine(config: &Config, name: &str, caps: &Capabilities) -> Result<Arc<dyn StorageEngine>> {
    let engine = engine_by_name(name, &config.storage)
        .ok_or_else(|| {
            let unknown = UnknownEngine {
                name: name.to_string(),
            };
            Error::precondition(unknown.to_string()).caused_by(unknown)
        })?
        .map_err(|e| Error::precondition(e.to_string()))?;
    engine
        .admit(caps)
        .map_err(|e| Error::precondition(e.to_string()))?;
    Ok(engine)
}

/// The container's CUDA processes and the orchestrator that checkpoints them.
#[derive(Debug)]
pub struct GpuCheckpoint {
    pub orchestrator: Orchestrator,
    pub processes: Vec<CudaProcess>,
}

/// Decides, before anything is touched, whether the container has CUDA processes and whether
/// the configured storage engine can move their memory on this driver; `None` for a CPU-only
/// container.
///
/// No loadable driver means no process can be using CUDA — unless one holds an NVIDIA device
/// open (a driver installed where gpusnap does not look): that is refused, since CRIU cannot
/// dump GPU state and the restore would be silently broken. A process's GPUs come from its open
/// `/dev/nvidiaN` files; when they cannot be determined, every GPU the driver lists is
/// recorded, so the restore gate never places the process on a node too small for it.
pub fn plan_checkpoint(
    config: &Config,
    pids: &[u32],
    checkpoint_dir: &Path,
) -> Result<Option<GpuCheckpoint>> {
    let pids: Vec<i32> = pids.iter().filter_map(|&p| i32::try_from(p).ok()).collect();
    let driver = match load_driver(&config.cuda.library) {
        Ok(Some(d)) => d,
        result => {
            if uses_nvidia_devices(Path::new("/proc"), &pids) {
                let why = match result {
                    Err(e) => e.to_string(),
                    _ => format!("`{}` cannot be opened", config.cuda.library),
                };
                return Err(Error::precondition(format!(
                    "the container has NVIDIA devices open, but the CUDA driver cannot be loaded \
                     ({why}); refusing to checkpoint it without its GPU state (set cuda.library)"
                )));
            }
            if let Err(e) = result {
                tracing::debug!(error = %e, "CUDA driver unusable and no NVIDIA device open; CPU-only checkpoint");
            }
            return Ok(None);
        }
    };
    let mut processes =
        discovery::find_cuda_processes(&driver, &pids, &DiscoveryOptions::default()).map_err(
            |e| {
                Error::precondition(format!(
                    "finding the container's CUDA processes failed: {e}"
                ))
            },
        )?;
    if processes.is_empty() {
        return Ok(None);
    }
    let caps = driver.capabilities();
    for p in processes.iter_mut().filter(|p| p.gpus.is_empty()) {
        tracing::warn!(
            pid = p.host_pid,
            gpus = caps.devices.len(),
            "GPUs of a CUDA process not found among its open /dev/nvidia* files; recording every GPU the driver lists"
        );
        p.gpus = caps.devices.clone();
    }
    let engine = engine(config, config.storage.engine.as_str(), caps)?;
    tracing::info!(
        processes = processes.len(),
        engine = engine.name(),
        "CUDA processes found"
    );
    Ok(Some(GpuCheckpoint {
        orchestrator: Orchestrator::new(
            driver.clone(),
            engine,
            orchestrator_options(config, checkpoint_dir),
        ),
        processes,
    }))
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
pub fn restore_records(gpu: &GpuSection) -> Result<Vec<ProcessRecord>> {
    check_engine_name(&gpu.engine).map_err(|e| {
        Error::precondition(format!(
            "the checkpoint's GPU state was taken with storage engine `{}`, which this gpusnap \
             build cannot restore ({e})",
            gpu.engine
        ))
    })?;
    gpu.processes
        .iter()
        .map(|p| {
            let raw = p.extra.get(CUDA_RECORD).ok_or_else(|| {
                Error::precondition(format!(
                    "GPU record of pid {} has no `{CUDA_RECORD}` entry: the manifest is damaged",
                    p.host_pid
                ))
            })?;
            serde_json::from_value(raw.clone())
                .map_err(|e| Error::precondition(format!("GPU record of pid {}: {e}", p.host_pid)))
        })
        .collect()
}

/// A restore's GPU side, gated before CRIU runs.
pub struct GpuRestore {
    orchestrator: Orchestrator,
    map: GpuMap,
    records: Vec<ProcessRecord>,
}

impl GpuRestore {
    /// Waits for the driver `pending` (started early, so `cuInit` overlaps the digest
    /// verification), admits the checkpoint's engine and runs the compatibility gate: this
    /// node's driver and GPUs can take these processes.
    pub fn prepare(
        pending: PendingDriver,
        config: &Config,
        gpu: &GpuSection,
        checkpoint_dir: &Path,
    ) -> Result<GpuRestore> {
        let records = restore_records(gpu)?;
        let (driver, waited) = pending.join(config.cuda.restore_budget()).map_err(|e| {
            Error::precondition(format!(
                "the checkpoint holds GPU state but the CUDA driver is not usable here: {e}"
            ))
        })?;
        tracing::debug!(
            waited_ms = waited.as_millis() as u64,
            "CUDA driver ready for restore"
        );
        let engine = engine(config, &gpu.engine, driver.capabilities()).map_err(|e| {
            e.context(format!(
                "the checkpoint needs storage engine `{}` to restore",
                gpu.engine
            ))
        })?;
        let map = gate(driver.capabilities(), &records)?;
        Ok(GpuRestore {
            orchestrator: Orchestrator::new(
                driver,
                engine,
                orchestrator_options(config, checkpoint_dir),
            ),
            map,
            records,
        })
    }

    pub fn processes(&self) -> usize {
        self.records.len()
    }

    /// After CRIU restored the tree: finds each checkpointed CUDA process among `restored`
    /// (host pids) by its container pid, restores its device memory onto the gated GPUs and
    /// unlocks it.
    pub fn run(self, restored: &[u32]) -> std::result::Result<RestoreReport, GpuRestoreError> {
        let restored: Vec<i32> = restored
            .iter()
            .filter_map(|&p| i32::try_from(p).ok())
            .collect();
        let host_pids = {
            let recorded: Vec<_> = self
                .records
                .iter()
                .map(ProcessRecord::recorded_pid)
                .collect();
            discovery::map_restored_pids(&recorded, &restored, Path::new("/proc"))?
        };
        let targets: Vec<RestoreTarget> = self
            .records
            .into_iter()
            .zip(host_pids)
            .map(|(record, host_pid)| RestoreTarget { record, host_pid })
            .collect();
        Ok(self.orchestrator.restore(&targets, &self.map)?)
    }
}

/// CUDA processes a checkpoint of a frozen container left CHECKPOINTED: the driver can only
/// bring their device memory back while they run, and the caller (containerd's client, a runc
/// caller that paused first) must find the container frozen exactly as CRIU dumped it, so that
/// a rootfs diff taken next matches the images. [`PendingCudaResume::resume`] runs once the
/// caller has thawed the container.
#[derive(Debug)]
pub struct PendingCudaResume {
    orchestrator: Orchestrator,
    records: Vec<ProcessRecord>,
    /// The device memory is back already (engines whose memory lives in files, which the
    /// caller may delete once the checkpoint is handed over); only the unlock remains.
    memory_restored: bool,
}

impl PendingCudaResume {
    pub(crate) fn new(orchestrator: Orchestrator, records: Vec<ProcessRecord>) -> Self {
        PendingCudaResume {
            orchestrator,
            records,
            memory_restored: false,
        }
    }

    /// Whether only the unlock remains (see [`PendingCudaResume::from_records`]).
    pub fn memory_restored(&self) -> bool {
        self.memory_restored
    }

    /// Brings the device memory back now, leaving the processes LOCKED, so the resume needs
    /// nothing from the checkpoint directory. The processes must run (be thawed) for this.
    pub(crate) fn restore_memory_now(mut self) -> std::result::Result<Self, ResumeError> {
        let targets = self.targets();
        self.orchestrator.restore_locked(&targets, &GpuMap::new())?;
        self.memory_restored = true;
        Ok(self)
    }

    fn targets(&self) -> Vec<RestoreTarget> {
        self.records
            .iter()
            .cloned()
            .map(|record| RestoreTarget {
                host_pid: record.host_pid,
                record,
            })
            .collect()
    }

    /// The records, to keep across processes (gpusnap-runc exits between the checkpoint and
    /// the caller's resume): [`PendingCudaResume::save`].
    pub(crate) fn records(&self) -> &[ProcessRecord] {
        &self.records
    }

    /// Loads the driver again for records kept by [`Self::records`]; `memory_restored` as
    /// [`Self::memory_restored`] said ([`PendingCudaResume::take`]).
    pub(crate) fn from_records(
        config: &Config,
        records: Vec<ProcessRecord>,
        memory_restored: bool,
    ) -> Result<Self> {
        let driver = match load_driver(&config.cuda.library) {
            Ok(Some(d)) => d,
            Ok(None) => {
                return Err(Error::precondition(format!(
                    "`{}` cannot be opened to resume the container's CUDA processes",
                    config.cuda.library
                )))
            }
            Err(e) => return Err(Error::precondition(e.to_string())),
        };
        let engine_name = records
            .first()
            .map(|r| r.engine.clone())
            .unwrap_or_else(|| config.storage.engine.to_string());
        let engine = engine(config, &engine_name, driver.capabilities())?;
        let options = OrchestratorOptions {
            storage_dir: None,
            ..orchestrator_options(config, Path::new("/"))
        };
        Ok(PendingCudaResume {
            orchestrator: Orchestrator::new(driver, engine, options),
            records,
            memory_restored,
        })
    }

    /// CUDA restore (unless done already) and unlock of the processes, in place (same pids).
    /// The container must be running (thawed).
    pub fn resume(self) -> std::result::Result<(), ResumeError> {
        if self.memory_restored {
            let pids: Vec<i32> = self.records.iter().map(|r| r.host_pid).collect();
            return Ok(self.orchestrator.unlock(&pids)?);
        }
        self.orchestrator.restore(&self.targets(), &GpuMap::new())?;
        Ok(())
    }
}

/// The compatibility gate, run before CRIU: this node's driver can restore these processes,
/// with the same GPU type for every checkpointed GPU. Returns the GPU map: identity where the
/// checkpointed GPU is present, otherwise the next unused GPU of the same type (the driver then
/// gets UUID pairs).
pub fn gate(caps: &Capabilities, records: &[ProcessRecord]) -> Result<GpuMap> {
    let refuse = |m: String| Err(Error::precondition(m));
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
    use gpusnap_cuda::driver::{DriverVersion, GpuUuid};
    use gpusnap_cuda::engine::DriverManaged;
    use gpusnap_cuda::posix::Posix;

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
            engine(&config, DriverManaged::NAME, &c).unwrap().name(),
            DriverManaged::NAME
        );
        let err = engine(&config, Posix::NAME, &c).unwrap_err().to_string();
        assert!(err.contains("13.4"), "{err}");
        c.custom_storage = true;
        assert_eq!(
            engine(&config, Posix::NAME, &c).unwrap().name(),
            Posix::NAME
        );
        let err = engine(&config, "pagebroker", &c).unwrap_err().to_string();
        assert!(
            err.contains("pagebroker") && err.contains("driver-managed, posix"),
            "{err}"
        );
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
