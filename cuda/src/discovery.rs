//! Which of a container's processes the driver treats as CUDA processes, and
//! the `/proc` and cgroup facts gpusnap records about them.
//!
//! The probe is `cuCheckpointProcessGetRestoreThreadId` by default: it is what
//! CRIU's cuda plugin and ai-dynamo use, and `GetState` can take seconds per
//! call on large processes. [`Probe::State`] additionally matches processes
//! that hold no context (for example `--launch-job` coordinators).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::driver::{code, CallError, DeviceInfo, Driver, GpuUuid};
use crate::watchdog::{self, Finished, Job};

/// The character-device major of `/dev/nvidia*`.
const NVIDIA_MAJOR: u32 = 195;
/// Minors at or above this are control nodes (`nvidiactl` 255, `nvidia-modeset` 254).
const NVIDIA_FIRST_CONTROL_MINOR: u32 = 254;
/// Probes run in batches of this many threads.
const PROBE_BATCH: usize = 16;

/// Which driver call decides that a pid is a CUDA process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Probe {
    #[default]
    RestoreThreadId,
    State,
}

#[derive(Debug, Clone)]
pub struct DiscoveryOptions {
    /// `/proc` as seen by the caller; tests point it at fixtures.
    pub proc_root: PathBuf,
    pub probe: Probe,
    /// Watchdog for each probe call.
    pub probe_timeout: Duration,
    /// `CUresult`s that mean "not a CUDA process". Any other failure is an
    /// error: silently skipping a CUDA process would let CRIU dump it without
    /// its GPU state. Measured on an H200 with driver 580.159.04: a live
    /// process without CUDA gives NOT_INITIALIZED; a pid that does not exist
    /// gives OPERATING_SYSTEM, which is therefore accepted only when the pid
    /// has also left `/proc` (it exited while we probed).
    pub not_cuda_codes: Vec<u32>,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from("/proc"),
            probe: Probe::default(),
            probe_timeout: Duration::from_secs(60),
            not_cuda_codes: vec![code::INVALID_VALUE, code::NOT_INITIALIZED, code::NOT_FOUND],
        }
    }
}

/// A process the driver can checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaProcess {
    /// Pid in the caller's (host) namespace; what the driver API takes.
    pub host_pid: i32,
    /// Pid inside the container (last `NSpid` field); survives CRIU restore.
    pub container_pid: Option<i32>,
    /// The driver's restore thread (must stay runnable under ptrace).
    pub restore_tid: Option<i32>,
    /// GPUs the process has open, when discoverable.
    pub gpus: Vec<DeviceInfo>,
    /// Device memory in use, when a caller knows it (for example from NVML).
    pub device_memory_bytes: Option<u64>,
}

impl CudaProcess {
    /// A process known only by pid (callers that did their own discovery).
    pub fn from_pid(host_pid: i32) -> Self {
        Self {
            host_pid,
            container_pid: None,
            restore_tid: None,
            gpus: Vec::new(),
            device_memory_bytes: None,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum DiscoveryError {
    #[error("cannot discover CUDA processes: {0}")]
    Unsupported(CallError),
    #[error(
        "probing pid {pid} failed: {error}. If this is a permission error, gpusnap needs to \
         run as root (ptrace rights over the container's processes)"
    )]
    Probe { pid: i32, error: CallError },
    #[error("probing pid {pid} did not return within {limit_ms} ms (the driver call cannot be interrupted)")]
    Timeout { pid: i32, limit_ms: u64 },
    #[error("probing pid {pid} did not run to completion: {reason}")]
    Thread { pid: i32, reason: String },
    #[error("cannot read {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error(
        "no restored process has container pid {container_pid} (checkpointed as host pid \
         {checkpoint_host_pid}); restored host pids: {candidates:?}"
    )]
    NotRestored {
        container_pid: i32,
        checkpoint_host_pid: i32,
        candidates: Vec<i32>,
    },
}

/// Finds the CUDA processes among `host_pids`, in the order given.
pub fn find_cuda_processes(
    driver: &Arc<Driver>,
    host_pids: &[i32],
    options: &DiscoveryOptions,
) -> Result<Vec<CudaProcess>, DiscoveryError> {
    let started = Instant::now();
    if !driver.capabilities().checkpoint_api {
        return Err(DiscoveryError::Unsupported(CallError::Unavailable {
            call: "cuCheckpointProcessGetRestoreThreadId",
            driver_version: driver.version(),
            reason: "the per-process checkpoint API needs driver r570 (CUDA 12.8) or newer",
        }));
    }

    // Once it has called cuInit the caller is itself a "CUDA process" to the
    // driver (seen on 580.159.04); it must never lock or checkpoint itself.
    let me = std::process::id() as i32;
    let host_pids: Vec<i32> = host_pids.iter().copied().filter(|&p| p != me).collect();
    let mut found = Vec::new();
    for batch in host_pids.chunks(PROBE_BATCH) {
        let jobs = batch
            .iter()
            .map(|&pid| {
                let driver = Arc::clone(driver);
                let probe = options.probe;
                Job::new(pid, move || match probe {
                    Probe::RestoreThreadId => driver.restore_thread_id(pid).map(Some),
                    Probe::State => driver.process_state(pid).map(|_| None),
                })
            })
            .collect();
        let deadline = Instant::now() + options.probe_timeout;
        for (pid, finished) in watchdog::run_all("probe", jobs, deadline) {
            match finished {
                Finished::Done {
                    value: Ok(restore_tid),
                    ..
                } => {
                    found.push(describe(driver, pid, restore_tid, &options.proc_root));
                }
                Finished::Done {
                    value: Err(error), ..
                } => {
                    let code = error.code();
                    if code.is_some_and(|c| options.not_cuda_codes.contains(&c)) {
                        tracing::trace!(pid, %error, "not a CUDA process");
                    } else if code == Some(code::OPERATING_SYSTEM)
                        && !options.proc_root.join(pid.to_string()).exists()
                    {
                        tracing::debug!(pid, "process exited while being probed");
                    } else {
                        return Err(DiscoveryError::Probe { pid, error });
                    }
                }
                Finished::TimedOut { .. } => {
                    return Err(DiscoveryError::Timeout {
                        pid,
                        limit_ms: options.probe_timeout.as_millis() as u64,
                    })
                }
                Finished::NotStarted { reason } | Finished::Panicked { message: reason } => {
                    return Err(DiscoveryError::Thread { pid, reason })
                }
            }
        }
    }
    tracing::info!(
        probed = host_pids.len(),
        cuda_processes = found.len(),
        pids = ?found.iter().map(|p| p.host_pid).collect::<Vec<_>>(),
        discovery_ms = started.elapsed().as_secs_f64() * 1e3,
        "CUDA process discovery finished"
    );
    Ok(found)
}

fn describe(driver: &Driver, pid: i32, restore_tid: Option<i32>, proc_root: &Path) -> CudaProcess {
    let container_pid = container_pid(proc_root, pid).unwrap_or_else(|e| {
        tracing::debug!(pid, error = %e, "no NSpid for process");
        None
    });
    let gpus = gpus_in_use(proc_root, pid, &driver.capabilities().devices);
    CudaProcess {
        host_pid: pid,
        container_pid,
        restore_tid,
        gpus,
        device_memory_bytes: None,
    }
}

/// The pid inside the innermost pid namespace: the last `NSpid:` field of
/// `/proc/<pid>/status`. `None` on kernels without `NSpid`.
pub fn container_pid(proc_root: &Path, host_pid: i32) -> io::Result<Option<i32>> {
    let status = fs::read_to_string(proc_root.join(host_pid.to_string()).join("status"))?;
    Ok(parse_nspid(&status))
}

fn parse_nspid(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .and_then(|rest| rest.split_whitespace().last())
        .and_then(|last| last.parse().ok())
}

/// Every pid in a cgroup v2 directory and its descendants (`cgroup.procs`),
/// sorted and deduplicated.
pub fn cgroup_pids(cgroup_dir: &Path) -> Result<Vec<i32>, DiscoveryError> {
    let mut pids = Vec::new();
    collect_cgroup_pids(cgroup_dir, &mut pids, true)?;
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

fn collect_cgroup_pids(dir: &Path, pids: &mut Vec<i32>, top: bool) -> Result<(), DiscoveryError> {
    let io_err = |path: &Path, e: io::Error| DiscoveryError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let procs = dir.join("cgroup.procs");
    match fs::read_to_string(&procs) {
        Ok(text) => pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok())),
        // A child cgroup removed while we walk is not an error; the top one is.
        Err(e) if !top && e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(&procs, e)),
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if !top && e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        // file_type() does not follow symlinks, so a link cannot make us loop.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_cgroup_pids(&entry.path(), pids, false)?;
        }
    }
    Ok(())
}

/// GPUs `pid` has open: its `/dev/nvidiaN` descriptors, mapped to UUIDs through
/// `/proc/driver/nvidia/gpus/*/information`, then to `devices`. Empty when any
/// of that is unreadable (no driver proc files, no ptrace rights).
pub fn gpus_in_use(proc_root: &Path, pid: i32, devices: &[DeviceInfo]) -> Vec<DeviceInfo> {
    let minors = match open_nvidia_minors(proc_root, pid) {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(pid, error = %e, "cannot list the process's GPU descriptors");
            return Vec::new();
        }
    };
    let uuids = nvidia_minor_uuids(proc_root);
    gpus_for_minors(&minors, &uuids, devices)
}

fn open_nvidia_minors(proc_root: &Path, pid: i32) -> io::Result<Vec<u32>> {
    let fd_dir = proc_root.join(pid.to_string()).join("fd");
    let mut minors = Vec::new();
    for entry in fs::read_dir(fd_dir)? {
        // metadata() on /proc/<pid>/fd/N follows the magic link to the device node.
        let Ok(meta) = fs::metadata(entry?.path()) else {
            continue;
        };
        if !meta.file_type().is_char_device() {
            continue;
        }
        let rdev = meta.rdev();
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        if major == NVIDIA_MAJOR && minor < NVIDIA_FIRST_CONTROL_MINOR {
            minors.push(minor);
        }
    }
    minors.sort_unstable();
    minors.dedup();
    Ok(minors)
}

/// Device minor → UUID from the driver's proc files.
pub fn nvidia_minor_uuids(proc_root: &Path) -> BTreeMap<u32, GpuUuid> {
    let mut map = BTreeMap::new();
    let Ok(entries) = fs::read_dir(proc_root.join("driver/nvidia/gpus")) else {
        return map;
    };
    for entry in entries.flatten() {
        if let Ok(text) = fs::read_to_string(entry.path().join("information")) {
            if let Some((minor, uuid)) = parse_gpu_information(&text) {
                map.insert(minor, uuid);
            }
        }
    }
    map
}

fn parse_gpu_information(text: &str) -> Option<(u32, GpuUuid)> {
    let mut minor = None;
    let mut uuid = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "Device Minor" => minor = value.trim().parse().ok(),
            "GPU UUID" => uuid = value.trim().parse().ok(),
            _ => {}
        }
    }
    Some((minor?, uuid?))
}

fn gpus_for_minors(
    minors: &[u32],
    uuids: &BTreeMap<u32, GpuUuid>,
    devices: &[DeviceInfo],
) -> Vec<DeviceInfo> {
    minors
        .iter()
        .filter_map(|m| uuids.get(m))
        .filter_map(|uuid| devices.iter().find(|d| &d.uuid == uuid).cloned())
        .collect()
}

/// Where a checkpointed process was: its host pid then and, when known, its pid inside the
/// container (what the orchestrator's record keeps of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedPid {
    pub host_pid: i32,
    pub container_pid: Option<i32>,
}

/// Pairs checkpoint records with the processes CRIU restored, by container pid
/// (CRIU restores the pids inside the container's namespace; host pids
/// change). Returns one host pid per record, in record order. A record without
/// a container pid keeps its host pid, which must then be among `candidates`.
pub fn map_restored_pids(
    records: &[RecordedPid],
    candidates: &[i32],
    proc_root: &Path,
) -> Result<Vec<i32>, DiscoveryError> {
    let mut by_container_pid = BTreeMap::new();
    for &host_pid in candidates {
        match container_pid(proc_root, host_pid) {
            Ok(Some(inner)) => {
                by_container_pid.insert(inner, host_pid);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(host_pid, error = %e, "cannot read NSpid of restored process")
            }
        }
    }
    records
        .iter()
        .map(|record| {
            let wanted = record.container_pid.unwrap_or(record.host_pid);
            let found = match record.container_pid {
                Some(inner) => by_container_pid.get(&inner).copied(),
                None => candidates
                    .contains(&record.host_pid)
                    .then_some(record.host_pid),
            };
            found.ok_or_else(|| DiscoveryError::NotRestored {
                container_pid: wanted,
                checkpoint_host_pid: record.host_pid,
                candidates: candidates.to_vec(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_last_field_is_the_container_pid() {
        let status = "Name:\tpython\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t7\nNSpgid:\t1\n";
        assert_eq!(parse_nspid(status), Some(7));
        assert_eq!(parse_nspid("NSpid:\t99\n"), Some(99));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn own_process_has_an_nspid() {
        let me = std::process::id() as i32;
        let inner = container_pid(Path::new("/proc"), me).expect("read own status");
        assert!(inner.is_some(), "kernel without NSpid?");
    }

    #[test]
    fn cgroup_walk_is_recursive_sorted_and_deduplicated() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("cgroup.procs"), "30\n10\n").unwrap();
        fs::create_dir_all(root.join("child/grandchild")).unwrap();
        fs::write(root.join("child/cgroup.procs"), "20\n").unwrap();
        fs::write(root.join("child/grandchild/cgroup.procs"), "40\n10\n").unwrap();
        fs::create_dir_all(root.join("empty")).unwrap();
        fs::write(root.join("empty/cgroup.procs"), "").unwrap();
        assert_eq!(cgroup_pids(root).unwrap(), vec![10, 20, 30, 40]);
    }

    #[test]
    fn cgroup_walk_reports_a_missing_top_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let err = cgroup_pids(&dir.path().join("gone")).unwrap_err();
        assert!(err.to_string().contains("cgroup.procs"), "{err}");
    }

    const INFORMATION: &str = "Model: \t\t NVIDIA H200\nIRQ:   \t\t 145\n\
        GPU UUID: \t GPU-a1b2c3d4-0000-4000-8000-000000000001\nVideo BIOS: \t 96.00.74.00.01\n\
        Bus Type: \t PCIe\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 3\nGPU Excluded:\t No\n";

    #[test]
    fn driver_information_gives_minor_and_uuid() {
        let (minor, uuid) = parse_gpu_information(INFORMATION).expect("parses");
        assert_eq!(minor, 3);
        assert_eq!(uuid.to_string(), "GPU-a1b2c3d4-0000-4000-8000-000000000001");
    }

    #[test]
    fn minors_map_to_driver_devices() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = dir.path().join("driver/nvidia/gpus/0000:18:00.0");
        fs::create_dir_all(&gpu).unwrap();
        fs::write(gpu.join("information"), INFORMATION).unwrap();
        let uuids = nvidia_minor_uuids(dir.path());
        let uuid: GpuUuid = "GPU-a1b2c3d4-0000-4000-8000-000000000001".parse().unwrap();
        assert_eq!(uuids.get(&3), Some(&uuid));

        let devices = vec![DeviceInfo {
            index: 0,
            uuid,
            name: "NVIDIA H200".into(),
            total_memory_bytes: 1,
        }];
        let gpus = gpus_for_minors(&[3, 5], &uuids, &devices);
        assert_eq!(gpus, devices);
        assert!(gpus_for_minors(&[5], &uuids, &devices).is_empty());
    }

    #[test]
    fn gpus_in_use_is_empty_without_nvidia_descriptors() {
        let me = std::process::id() as i32;
        assert!(gpus_in_use(Path::new("/proc"), me, &[]).is_empty());
    }
}
