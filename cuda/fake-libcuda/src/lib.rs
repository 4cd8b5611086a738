//! A fake `libcuda.so.1` for tests, and a helper that drives its state.
//!
//! The library itself is C (`src/fake_libcuda.c`), built by this crate's build
//! script. gpusnap loads it through exactly the same `libloading` path as the
//! real driver; only the library path differs.
//!
//! All state is kept in files under one directory so that several processes
//! (the shim, a runc wrapper, the test) see the same CUDA processes:
//!
//! | Path | Meaning |
//! |---|---|
//! | `procs/<pid>` | the pid is a CUDA process; content is its state word (`running`, `locked`, `checkpointed`, `failed`, `checkpointing`, `restoring`; empty means running) |
//! | `driver_version` | what `cuDriverGetVersion` reports (default 13000, like the 580 driver) |
//! | `devices` | lines `GPU-<uuid> <total bytes> <name>` (default: one H200) |
//! | `hidden_symbols` | names `cuGetProcAddress` pretends not to know |
//! | `init_error` | `cuInit` returns this code |
//! | `unknown_pid_code` | what calls on a non-CUDA pid return (default 1, INVALID_VALUE; the 580 driver gives 3 or 304) |
//! | `faults/<pid>/<op>` | `code=N hang_ms=N busy_ms=N then=<state> once` |
//! | `vram/<key>/<dev>` | device memory of a process (`<key>` as for `procs/`: the pid, or `id-<id>-<nspid>`); CustomStorage maps it, a driver-managed checkpoint moves it to `staged/<key>/` (process memory) and its restore back |
//! | `calls.log` | `<op> <pid> <rc> key=value...` per checkpoint-API call |
//! | `procaddr.log` | `<symbol> <version> <status> <rc>` per `cuGetProcAddress` |
//!
//! The directory is `$GPUSNAP_FAKE_CUDA_DIR`, or, when that is unset, the
//! directory that holds the loaded library. [`FakeCuda::create`] copies the
//! library into its directory, so parallel tests each get a private instance
//! (a different file is a different `dlopen` instance) without touching the
//! environment. For another process (a shim under test), either point it at
//! [`FakeCuda::library_path`] or set `GPUSNAP_FAKE_CUDA_DIR`.
//!
//! From a shell, `echo running > $DIR/procs/$PID` registers a process.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the build script put the compiled fake library.
pub const BUILT_LIBRARY: &str = env!("GPUSNAP_FAKE_LIBCUDA_PATH");

/// Environment variable that overrides the state directory.
pub const DIR_ENV: &str = "GPUSNAP_FAKE_CUDA_DIR";

/// The file name the library is copied to inside a state directory.
pub const LIBRARY_FILE_NAME: &str = "libcuda.so.1";

/// Process states as the fake stores them (same numbering as `CUprocessState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    Checkpointing,
    Restoring,
}

impl FakeState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Locked => "locked",
            Self::Checkpointed => "checkpointed",
            Self::Failed => "failed",
            Self::Checkpointing => "checkpointing",
            Self::Restoring => "restoring",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        Some(match word.trim() {
            "" | "running" => Self::Running,
            "locked" => Self::Locked,
            "checkpointed" => Self::Checkpointed,
            "failed" => Self::Failed,
            "checkpointing" => Self::Checkpointing,
            "restoring" => Self::Restoring,
            _ => return None,
        })
    }
}

impl fmt::Display for FakeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Operations a fault can be attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeOp {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
    GetState,
    RestoreThreadId,
    OperationComplete,
}

impl FakeOp {
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Checkpoint => "checkpoint",
            Self::Restore => "restore",
            Self::Unlock => "unlock",
            Self::GetState => "get_state",
            Self::RestoreThreadId => "restore_tid",
            Self::OperationComplete => "operation_complete",
        }
    }
}

/// An injected fault. The fields combine: hang first, then fail with `code`
/// (optionally moving the process to `then`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fault {
    /// Return this `CUresult` instead of performing the transition.
    pub code: Option<u32>,
    /// Sleep this long inside the call before doing anything (watchdog tests).
    pub hang: Option<Duration>,
    /// Lock only: outstanding GPU work the lock has to wait for. A lock with a
    /// smaller non-zero timeout returns `CUDA_ERROR_NOT_READY` after the timeout.
    pub busy: Option<Duration>,
    /// State to store (on failure with `code`, or instead of the normal target).
    pub then: Option<FakeState>,
    /// Fire once, then disappear.
    pub once: bool,
}

impl Fault {
    pub fn fail(code: u32) -> Self {
        Self {
            code: Some(code),
            ..Self::default()
        }
    }

    pub fn hang(duration: Duration) -> Self {
        Self {
            hang: Some(duration),
            ..Self::default()
        }
    }

    pub fn busy(duration: Duration) -> Self {
        Self {
            busy: Some(duration),
            ..Self::default()
        }
    }

    pub fn then(mut self, state: FakeState) -> Self {
        self.then = Some(state);
        self
    }

    pub fn once(mut self) -> Self {
        self.once = true;
        self
    }

    fn render(&self) -> String {
        let mut tokens = Vec::new();
        if let Some(code) = self.code {
            tokens.push(format!("code={code}"));
        }
        if let Some(hang) = self.hang {
            tokens.push(format!("hang_ms={}", hang.as_millis()));
        }
        if let Some(busy) = self.busy {
            tokens.push(format!("busy_ms={}", busy.as_millis()));
        }
        if let Some(state) = self.then {
            tokens.push(format!("then={state}"));
        }
        if self.once {
            tokens.push("once".to_owned());
        }
        tokens.join(" ") + "\n"
    }
}

/// A fake GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDevice {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
    pub uuid: String,
    pub name: String,
    pub total_memory: u64,
}

impl FakeDevice {
    pub fn new(uuid: &str, name: &str, total_memory: u64) -> Self {
        Self {
            uuid: uuid.to_owned(),
            name: name.to_owned(),
            total_memory,
        }
    }
}

/// One line of `calls.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeCall {
    /// `lock`, `checkpoint`, `restore`, `unlock`, `operation_complete`
    pub op: String,
    pub pid: i32,
    /// The `CUresult` returned.
    pub code: u32,
    /// Extra arguments, e.g. `timeout_ms`, `pairs`, `storage`.
    pub args: BTreeMap<String, String>,
}

impl FakeCall {
    /// `"lock 42"`-style short form, handy for asserting call order.
    pub fn short(&self) -> String {
        format!("{} {}", self.op, self.pid)
    }
}

/// One line of `procaddr.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcAddressRequest {
    pub symbol: String,
    pub version: u32,
    /// `CUdriverProcAddressQueryResult`: 0 found, 1 not found, 2 version not sufficient.
    pub status: u32,
    pub code: u32,
}

/// A fake driver instance rooted at one directory.
#[derive(Debug, Clone)]
pub struct FakeCuda {
    dir: PathBuf,
}

impl FakeCuda {
    /// Prepares `dir` (created if needed) and copies the fake library into it.
    pub fn create(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(dir.join("procs"))?;
        fs::create_dir_all(dir.join("faults"))?;
        fs::copy(BUILT_LIBRARY, dir.join(LIBRARY_FILE_NAME))?;
        Ok(Self { dir })
    }

    /// Attaches to a directory another process prepared; copies nothing.
    pub fn attach(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The private copy of the library whose state is this directory.
    pub fn library_path(&self) -> PathBuf {
        self.dir.join(LIBRARY_FILE_NAME)
    }

    /// Makes `pid` a CUDA process in state RUNNING.
    pub fn register(&self, pid: i32) -> io::Result<()> {
        self.set_state(pid, FakeState::Running)
    }

    pub fn set_state(&self, pid: i32, state: FakeState) -> io::Result<()> {
        write_atomic(
            &self.dir.join("procs").join(pid.to_string()),
            format!("{state}\n").as_bytes(),
        )
    }

    /// The stored state, `None` when `pid` is not a CUDA process.
    pub fn state(&self, pid: i32) -> io::Result<Option<FakeState>> {
        match fs::read_to_string(self.dir.join("procs").join(pid.to_string())) {
            Ok(word) => FakeState::parse(&word).map(Some).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad state word {word:?}"),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn unregister(&self, pid: i32) -> io::Result<()> {
        fs::remove_file(self.dir.join("procs").join(pid.to_string()))
    }

    /// `13000` is CUDA 13.0. At 13040 or above `cuCheckpointOperationComplete` appears.
    /// With `true`, every `cuMemcpy*Async` fails with `CUDA_ERROR_ILLEGAL_ADDRESS` (700).
    pub fn fail_copies(&self, fail: bool) -> io::Result<()> {
        let path = self.dir.join("copies_fail");
        if fail {
            fs::write(path, b"")
        } else {
            match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }

    pub fn set_driver_version(&self, version: u32) -> io::Result<()> {
        fs::write(self.dir.join("driver_version"), format!("{version}\n"))
    }

    pub fn set_devices(&self, devices: &[FakeDevice]) -> io::Result<()> {
        let text: String = devices
            .iter()
            .map(|d| format!("{} {} {}\n", d.uuid, d.total_memory, d.name))
            .collect();
        fs::write(self.dir.join("devices"), text)
    }

    /// `cuGetProcAddress` will answer "symbol not found" for `symbol`.
    pub fn hide_symbol(&self, symbol: &str) -> io::Result<()> {
        use std::io::Write;
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("hidden_symbols"))?;
        writeln!(file, "{symbol}")
    }

    /// What calls on a pid that is not a CUDA process return (default
    /// `CUDA_ERROR_INVALID_VALUE`).
    pub fn set_unknown_pid_code(&self, code: u32) -> io::Result<()> {
        fs::write(self.dir.join("unknown_pid_code"), format!("{code}\n"))
    }

    pub fn set_init_error(&self, code: u32) -> io::Result<()> {
        fs::write(self.dir.join("init_error"), format!("{code}\n"))
    }

    pub fn inject(&self, pid: i32, op: FakeOp, fault: &Fault) -> io::Result<()> {
        let dir = self.dir.join("faults").join(pid.to_string());
        fs::create_dir_all(&dir)?;
        write_atomic(&dir.join(op.file_name()), fault.render().as_bytes())
    }

    pub fn clear_fault(&self, pid: i32, op: FakeOp) -> io::Result<()> {
        let path = self
            .dir
            .join("faults")
            .join(pid.to_string())
            .join(op.file_name());
        match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Device memory of `pid` on device `index` (CustomStorage tests).
    pub fn set_device_memory(&self, pid: i32, index: u32, bytes: &[u8]) -> io::Result<()> {
        self.set_device_memory_of(&pid.to_string(), index, bytes)
    }

    pub fn device_memory(&self, pid: i32, index: u32) -> io::Result<Option<Vec<u8>>> {
        self.device_memory_of(&pid.to_string(), index)
    }

    /// The state key of a process started with `GPUSNAP_FAKE_CUDA_ID=<id>` and pid `nspid` in
    /// its container: its state and device memory survive a CRIU restore under that key.
    pub fn id_key(id: &str, nspid: u32) -> String {
        format!("id-{id}-{nspid}")
    }

    /// Device memory of the process with state key `key` on device `index`.
    pub fn set_device_memory_of(&self, key: &str, index: u32, bytes: &[u8]) -> io::Result<()> {
        let dir = self.dir.join("vram").join(key);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join(index.to_string()), bytes)
    }

    pub fn device_memory_of(&self, key: &str, index: u32) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.dir.join("vram").join(key).join(index.to_string())) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What a CRIU restore of a checkpointed CUDA process hands the driver: a process in state
    /// CHECKPOINTED whose device memory is gone. With the driver-managed engine the memory was
    /// in the process's host memory, which CRIU restored (`staged/`); with a storage engine it
    /// is in gpusnap's files and the device holds nothing until gpusnap's restore.
    ///
    /// Driver-managed: a process resumed after its checkpoint (left running) has its memory on
    /// the device again, and that is what the dump holds; one that stayed CHECKPOINTED until it
    /// was killed still has it staged, which is kept.
    pub fn emulate_criu_restore(&self, key: &str, driver_managed: bool) -> io::Result<()> {
        fs::create_dir_all(self.dir.join("procs"))?;
        fs::write(self.dir.join("procs").join(key), "checkpointed\n")?;
        let vram = self.dir.join("vram").join(key);
        if driver_managed {
            let staged = self.dir.join("staged");
            fs::create_dir_all(&staged)?;
            if vram.exists() {
                let _ = fs::remove_dir_all(staged.join(key));
                fs::rename(&vram, staged.join(key))?;
            }
        } else if let Ok(entries) = fs::read_dir(&vram) {
            for e in entries.flatten() {
                if !e.file_name().to_string_lossy().ends_with(".size") {
                    fs::remove_file(e.path())?;
                }
            }
        }
        Ok(())
    }

    /// Every checkpoint-API call so far, in order.
    pub fn calls(&self) -> io::Result<Vec<FakeCall>> {
        let text = read_or_empty(&self.dir.join("calls.log"))?;
        Ok(text.lines().filter_map(parse_call).collect())
    }

    /// Calls for one pid, as `"op rc"` strings.
    pub fn calls_for(&self, pid: i32) -> io::Result<Vec<String>> {
        Ok(self
            .calls()?
            .into_iter()
            .filter(|c| c.pid == pid)
            .map(|c| format!("{} {}", c.op, c.code))
            .collect())
    }

    pub fn proc_address_requests(&self) -> io::Result<Vec<ProcAddressRequest>> {
        let text = read_or_empty(&self.dir.join("procaddr.log"))?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let mut it = line.split_whitespace();
                Some(ProcAddressRequest {
                    symbol: it.next()?.to_owned(),
                    version: it.next()?.parse().ok()?,
                    status: it.next()?.parse().ok()?,
                    code: it.next()?.parse().ok()?,
                })
            })
            .collect())
    }
}

fn parse_call(line: &str) -> Option<FakeCall> {
    let mut it = line.split_whitespace();
    let op = it.next()?.to_owned();
    let pid = it.next()?.parse().ok()?;
    let code = it.next()?.parse().ok()?;
    let args = it
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Some(FakeCall {
        op,
        pid,
        code,
        args,
    })
}

fn read_or_empty(path: &Path) -> io::Result<String> {
    match fs::read_to_string(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        other => other,
    }
}

/// The fake reads these files from other processes; never expose a torn write.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    fs::write(&tmp, bytes)?;
    fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_renders_tokens_the_c_side_parses() {
        let fault = Fault::fail(999).then(FakeState::Failed).once();
        assert_eq!(fault.render(), "code=999 then=failed once\n");
        let hang = Fault::hang(Duration::from_millis(1500));
        assert_eq!(hang.render(), "hang_ms=1500\n");
    }

    #[test]
    fn call_lines_parse() {
        let call = parse_call("restore 12 0 pairs=GPU-a:GPU-b").expect("parses");
        assert_eq!(call.op, "restore");
        assert_eq!(call.pid, 12);
        assert_eq!(call.code, 0);
        assert_eq!(
            call.args.get("pairs").map(String::as_str),
            Some("GPU-a:GPU-b")
        );
    }

    #[test]
    fn built_library_exists() {
        assert!(
            Path::new(BUILT_LIBRARY).is_file(),
            "{BUILT_LIBRARY} missing"
        );
    }
}
