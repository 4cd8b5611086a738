//! The CUDA driver double (`cuda/fake-libcuda`) as the front-door tests use it.
//!
//! - [`Engine`] × [`Cuda`]: the storage engine gpusnap is configured with and the driver
//!   version the double reports (13.0 has no CustomStorage, 13.4 has it);
//! - [`GpuDouble`]: a private instance of the double at that version, the gpusnap config
//!   (`[cuda]` + `[storage]`) that selects it, and its "CUDA processes": a container process
//!   started with `GPUSNAP_FAKE_CUDA_ID=<id>` is keyed `id-<id>-<pid in the container>`, so its
//!   driver state and device memory survive a CRIU restore under a new host pid, as real driver
//!   state inside the process does;
//! - the driver calls the double logged for a pid, in a comparable short form, and the
//!   sequences a checkpoint and a restore must produce with each engine
//!   ([`checkpoint_calls`], [`restore_calls`]);
//! - checks of a checkpoint directory: the manifest's `gpu` section and, for the posix engine,
//!   its extent files byte for byte ([`check_gpu_checkpoint`]); that a refused checkpoint left
//!   nothing that looks complete ([`check_nothing_complete`]).

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use gpusnap_fake_libcuda::FakeCuda;

/// Where a CUDA process's device memory goes during a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The driver copies device memory into the process's host memory, which CRIU dumps.
    DriverManaged,
    /// CUDA 13.4 CustomStorage: gpusnap streams device memory into `gpusnap-gpu-*` extent
    /// files in the checkpoint directory.
    Posix,
}

impl Engine {
    /// The name in `storage.engine` and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Engine::DriverManaged => "driver-managed",
            Engine::Posix => "posix",
        }
    }

    pub fn is_driver_managed(self) -> bool {
        self == Engine::DriverManaged
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The CUDA driver version the double reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cuda {
    /// 13.0 (driver 580): the checkpoint API without CustomStorage.
    V13_0,
    /// 13.4: CustomStorage (`cuCheckpointOperationComplete`, mapped regions).
    V13_4,
}

impl Cuda {
    /// `cuDriverGetVersion`'s value.
    pub fn version(self) -> u32 {
        match self {
            Cuda::V13_0 => 13000,
            Cuda::V13_4 => 13040,
        }
    }

    /// Whether the posix engine can work on this driver.
    pub fn has_custom_storage(self) -> bool {
        self.version() >= 13040
    }
}

impl fmt::Display for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.version();
        write!(f, "CUDA {}.{}", v / 1000, v % 1000 / 10)
    }
}

/// Device memory given to each CUDA process: aligned like real allocations, several transfer
/// chunks' worth would be too slow for a matrix, one page is too little to notice a short copy.
pub const DEVICE_MEMORY_BYTES: usize = 192 * 1024;

/// A private instance of the driver double at one version, with the gpusnap config selecting
/// it and one storage engine.
pub struct GpuDouble {
    pub fake: FakeCuda,
    pub engine: Engine,
    pub cuda: Cuda,
    dir: tempfile::TempDir,
}

/// A process the double treats as a CUDA process once it runs with [`CudaProcess::env`] as
/// the container's init (pid 1 in its container).
#[derive(Clone, Debug)]
pub struct CudaProcess {
    /// `GPUSNAP_FAKE_CUDA_ID`.
    pub id: String,
    /// The double's state key, `id-<id>-1`.
    pub key: String,
}

impl CudaProcess {
    /// `GPUSNAP_FAKE_CUDA_ID=<id>`.
    pub fn env(&self) -> String {
        format!("GPUSNAP_FAKE_CUDA_ID={}", self.id)
    }

    /// (`GPUSNAP_FAKE_CUDA_ID`, id).
    pub fn env_pair(&self) -> (&'static str, &str) {
        ("GPUSNAP_FAKE_CUDA_ID", &self.id)
    }
}

impl GpuDouble {
    /// A fresh double reporting `cuda`; live processes without CUDA answer NOT_INITIALIZED,
    /// like driver 580 on the H200.
    pub fn new(engine: Engine, cuda: Cuda) -> Result<GpuDouble> {
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-cuda-")
            .tempdir_in("/tmp")
            .context("directory for the CUDA double")?;
        let fake = FakeCuda::create(dir.path().join("fake"))?;
        fake.set_driver_version(cuda.version())?;
        fake.set_unknown_pid_code(3)?;
        Ok(GpuDouble {
            fake,
            engine,
            cuda,
            dir,
        })
    }

    /// A scratch directory removed with the double.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// The gpusnap config tables that load this double and select the engine.
    pub fn config(&self) -> String {
        format!(
            "[cuda]\nlibrary = \"{}\"\nlock_timeout_ms = 2000\n\n[storage]\nengine = \"{}\"\n",
            self.fake.library_path().display(),
            self.engine.name()
        )
    }

    /// [`GpuDouble::config`] plus `extra`, written to `<scratch>/gpusnap.toml`.
    pub fn write_config(&self, extra: &str) -> Result<PathBuf> {
        let path = self.dir.path().join("gpusnap.toml");
        fs::write(&path, format!("{extra}\n{}", self.config()))?;
        Ok(path)
    }

    /// Registers a CUDA process (RUNNING) for a container init started with its env, and gives
    /// it [`DEVICE_MEMORY_BYTES`] of random device memory on device 0; returns the process and
    /// the bytes.
    pub fn cuda_process(&self, name: &str) -> Result<(CudaProcess, Vec<u8>)> {
        let id = crate::cmd::unique(name);
        let key = FakeCuda::id_key(&id, 1);
        fs::write(self.fake.dir().join("procs").join(&key), "running\n")?;
        let bytes = crate::fixtures::noise(DEVICE_MEMORY_BYTES, seed());
        self.fake.set_device_memory_of(&key, 0, &bytes)?;
        Ok((CudaProcess { id, key }, bytes))
    }

    /// The double's state word for `p` (`running`, `locked`, `checkpointed`, ...).
    pub fn state(&self, p: &CudaProcess) -> String {
        fs::read_to_string(self.fake.dir().join("procs").join(&p.key))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// `p`'s device memory on device 0 (`None`: the device holds none for it).
    pub fn device_memory(&self, p: &CudaProcess) -> Result<Option<Vec<u8>>> {
        Ok(self.fake.device_memory_of(&p.key, 0)?)
    }

    /// What CRIU hands the driver when it restores `p`: state CHECKPOINTED, device memory gone
    /// (in process memory with the driver-managed engine, in gpusnap's files with posix).
    pub fn emulate_criu_restore(&self, p: &CudaProcess) -> Result<()> {
        self.fake
            .emulate_criu_restore(&p.key, self.engine.is_driver_managed())?;
        Ok(())
    }

    /// The driver calls logged for host pid `pid`, in order, as [`short`] forms.
    pub fn calls(&self, pid: u32) -> Vec<String> {
        self.fake
            .calls()
            .unwrap_or_default()
            .iter()
            .filter(|c| c.pid == pid as i32)
            .map(short)
            .collect()
    }

    /// Every call the double logged, in order, as `op pid rc ...` lines (for messages).
    pub fn call_log(&self) -> String {
        fs::read_to_string(self.fake.dir().join("calls.log")).unwrap_or_default()
    }

    /// Checks that `p` (host pid `pid`) ran through a checkpoint exactly as `engine` must:
    /// calls in order, then the state it is left in.
    pub fn check_checkpoint_calls(&self, p: &CudaProcess, pid: u32, resumed: bool) -> Result<()> {
        let want = checkpoint_calls(self.engine, resumed);
        let got = self.calls(pid);
        ensure!(
            got == want,
            "driver calls for the checkpointed pid {pid}: {got:?}, want {want:?}\nwhole log:\n{}",
            self.call_log()
        );
        let state = self.state(p);
        let want_state = if resumed { "running" } else { "checkpointed" };
        ensure!(
            state == want_state,
            "the CUDA process is {state:?} after the checkpoint, want {want_state:?}"
        );
        Ok(())
    }

    /// Checks that the restored `p` (new host pid `pid`) was restored and unlocked as `engine`
    /// must, is RUNNING, and that its device memory is exactly `bytes`.
    pub fn check_restored(&self, p: &CudaProcess, pid: u32, bytes: &[u8]) -> Result<()> {
        let want = restore_calls(self.engine);
        let got = self.calls(pid);
        ensure!(
            got == want,
            "driver calls for the restored pid {pid}: {got:?}, want {want:?}\nwhole log:\n{}",
            self.call_log()
        );
        let state = self.state(p);
        ensure!(
            state == "running",
            "the restored CUDA process is {state:?}, want \"running\" (unlocked)"
        );
        self.check_device_memory(p, bytes, "after the restore")
    }

    /// `p`'s device memory is exactly `bytes`.
    pub fn check_device_memory(&self, p: &CudaProcess, bytes: &[u8], when: &str) -> Result<()> {
        let got = self
            .device_memory(p)?
            .with_context(|| format!("no device memory for {} {when}", p.key))?;
        ensure!(
            got.len() == bytes.len(),
            "device memory {when}: {} bytes, {} before the checkpoint",
            got.len(),
            bytes.len()
        );
        ensure!(
            got == bytes,
            "device memory {when} differs from the bytes set before the checkpoint (first \
             difference at byte {})",
            got.iter().zip(bytes).position(|(a, b)| a != b).unwrap_or(0)
        );
        Ok(())
    }

    /// A refused checkpoint: no driver call for `pid` (nor for any other process: the double
    /// logged none), the process still RUNNING (unlocked), its device memory untouched.
    pub fn check_untouched(&self, p: &CudaProcess, pid: u32, bytes: &[u8]) -> Result<()> {
        let got = self.calls(pid);
        ensure!(
            got.is_empty(),
            "the refused checkpoint called the driver for pid {pid}: {got:?}"
        );
        let log = self.call_log();
        ensure!(
            log.is_empty(),
            "the refused checkpoint called the driver:\n{log}"
        );
        let state = self.state(p);
        ensure!(
            state == "running",
            "the CUDA process is {state:?} after a refused checkpoint, want \"running\""
        );
        self.check_device_memory(p, bytes, "after the refused checkpoint")
    }
}

fn seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32) ^ N.fetch_add(0x9e37, Ordering::Relaxed)
}

/// A call as `op rc`, plus `storage=…` where the double logged which storage the call used and
/// `kind=…` for `operation_complete` (`lock 0`, `checkpoint 0 storage=custom`,
/// `operation_complete 0 kind=restore`).
pub fn short(c: &gpusnap_fake_libcuda::FakeCall) -> String {
    let mut s = format!("{} {}", c.op, c.code);
    for k in ["storage", "kind"] {
        if let Some(v) = c.args.get(k) {
            s.push_str(&format!(" {k}={v}"));
        }
    }
    s
}

/// The calls a checkpoint makes on the CUDA process with `engine`; `resumed`: restored and
/// unlocked after the dump (the container keeps running), else left CHECKPOINTED for the
/// container's end.
pub fn checkpoint_calls(engine: Engine, resumed: bool) -> Vec<String> {
    let mut v: Vec<&str> = match engine {
        Engine::DriverManaged => vec!["lock 0", "checkpoint 0 storage=driver"],
        Engine::Posix => vec![
            "lock 0",
            "checkpoint 0 storage=custom",
            "operation_complete 0 kind=checkpoint",
        ],
    };
    if resumed {
        v.extend(match engine {
            Engine::DriverManaged => &["restore 0", "unlock 0"][..],
            Engine::Posix => &[
                "restore 0 storage=custom",
                "operation_complete 0 kind=restore",
                "unlock 0",
            ][..],
        });
    }
    v.into_iter().map(String::from).collect()
}

/// The calls a restore makes on the restored CUDA process with `engine`.
pub fn restore_calls(engine: Engine) -> Vec<String> {
    match engine {
        Engine::DriverManaged => vec!["restore 0", "unlock 0"],
        Engine::Posix => vec![
            "restore 0 storage=custom",
            "operation_complete 0 kind=restore",
            "unlock 0",
        ],
    }
    .into_iter()
    .map(String::from)
    .collect()
}

/// Prefix of gpusnap's GPU state files in a checkpoint directory.
pub const GPU_FILE_PREFIX: &str = "gpusnap-gpu-";

/// The `gpusnap-gpu-*` files in `dir`, by name.
pub fn gpu_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(GPU_FILE_PREFIX))
        .collect();
    v.sort();
    v
}

/// Reads `<dir>/gpusnap-manifest.json`.
pub fn manifest(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join("gpusnap-manifest.json");
    let text =
        fs::read_to_string(&path).with_context(|| format!("no manifest at {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Checks the GPU side of the sealed checkpoint directory `dir`: the manifest's `gpu` section
/// names `engine`, one CUDA process (host pid `host_pid`, pid 1 in the container, that engine,
/// the double's driver version); with posix, one `gpusnap-gpu-*` extent per GPU, listed in the
/// engine's record and in the manifest's inventory with its size, holding exactly `bytes`;
/// with driver-managed, no such file. Returns the manifest.
pub fn check_gpu_checkpoint(
    dir: &Path,
    engine: Engine,
    cuda: Cuda,
    host_pid: u32,
    bytes: &[u8],
) -> Result<serde_json::Value> {
    let m = manifest(dir)?;
    let gpu = &m["gpu"];
    ensure!(
        gpu["engine"] == engine.name(),
        "manifest gpu.engine {}, want {engine}: {gpu}",
        gpu["engine"]
    );
    ensure!(
        gpu["driver_version"] == cuda.version(),
        "manifest gpu.driver_version {}, want {}",
        gpu["driver_version"],
        cuda.version()
    );
    let procs = gpu["processes"].as_array().context("gpu.processes")?;
    ensure!(procs.len() == 1, "one CUDA process in the container: {gpu}");
    let p = &procs[0];
    ensure!(p["host_pid"] == host_pid, "gpu process host_pid: {p}");
    let cuda_rec = &p["cuda"];
    ensure!(cuda_rec["container_pid"] == 1, "cuda.container_pid: {p}");
    ensure!(cuda_rec["engine"] == engine.name(), "cuda.engine: {p}");
    ensure!(
        cuda_rec["driver_version"] == cuda.version(),
        "cuda.driver_version: {p}"
    );

    let inventory: Vec<(String, u64)> = m["images"]["files"]
        .as_array()
        .context("images.files")?
        .iter()
        .filter_map(|f| Some((f["path"].as_str()?.to_string(), f["size"].as_u64()?)))
        .collect();
    let listed_gpu: Vec<&(String, u64)> = inventory
        .iter()
        .filter(|(n, _)| n.starts_with(GPU_FILE_PREFIX))
        .collect();
    let on_disk = gpu_files(dir);
    match engine {
        Engine::DriverManaged => {
            ensure!(
                on_disk.is_empty() && listed_gpu.is_empty(),
                "driver-managed writes no GPU files: on disk {on_disk:?}, listed {listed_gpu:?}"
            );
        }
        Engine::Posix => {
            let extents = cuda_rec["engine_details"]["extents"]
                .as_array()
                .with_context(|| format!("cuda.engine_details.extents: {p}"))?;
            ensure!(
                extents.len() == 1,
                "one extent for the one GPU: {extents:?}"
            );
            let file = extents[0]["file"].as_str().context("extent file")?;
            ensure!(
                file.starts_with(GPU_FILE_PREFIX),
                "extent file {file:?} is not a {GPU_FILE_PREFIX}* file"
            );
            ensure!(
                extents[0]["size"] == bytes.len(),
                "extent size {} in the engine record, {} bytes of device memory",
                extents[0]["size"],
                bytes.len()
            );
            ensure!(
                on_disk == [file.to_string()],
                "GPU files in {}: {on_disk:?}, want [{file}]",
                dir.display()
            );
            ensure!(
                listed_gpu == [&(file.to_string(), bytes.len() as u64)],
                "the manifest inventory lists GPU files {listed_gpu:?}, want {file} with {} bytes",
                bytes.len()
            );
            let data = fs::read(dir.join(file))?;
            ensure!(
                data == bytes,
                "{file} ({} bytes) does not hold exactly the device memory ({} bytes)",
                data.len(),
                bytes.len()
            );
            ensure!(
                extents[0]["blake3"] == blake3_hex(&data),
                "extent BLAKE3 in the engine record does not match {file}"
            );
        }
    }
    Ok(m)
}

fn blake3_hex(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// A refused checkpoint left nothing in `dir` that looks like a checkpoint: no manifest, no
/// CRIU image, no GPU file. A missing directory is fine.
pub fn check_nothing_complete(dir: &Path) -> Result<()> {
    let left: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ensure!(
        left.iter().all(|n| !n.ends_with(".img")
            && !n.starts_with(GPU_FILE_PREFIX)
            && n != "gpusnap-manifest.json"),
        "a refused checkpoint left {left:?} in {}",
        dir.display()
    );
    Ok(())
}

/// The error of a posix checkpoint on a driver without CustomStorage names the engine, the
/// 13.4 requirement and the way out.
pub fn check_posix_refusal(err: &str) -> Result<()> {
    ensure!(
        err.contains("posix") && err.contains("13.4"),
        "the refusal does not name the posix engine and its CUDA 13.4 requirement: {err}"
    );
    ensure!(
        err.contains("driver-managed"),
        "the refusal does not say what to use instead: {err}"
    );
    Ok(())
}

/// Unpacks a CRI checkpoint archive into `dest`; returns `dest/checkpoint`, the checkpoint
/// directory inside.
pub fn unpack_cri_archive(archive: &Path, dest: &Path) -> Result<PathBuf> {
    let file = fs::File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
    tar::Archive::new(file)
        .unpack(dest)
        .with_context(|| format!("unpacking {}", archive.display()))?;
    Ok(dest.join("checkpoint"))
}
