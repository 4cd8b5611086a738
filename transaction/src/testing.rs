//! A recording [`Host`] for the phases' unit tests: it runs nothing and touches no cgroup or
//! mount. It answers `criu --version` and `runc --version`, plays CRIU's dump (writing a few
//! image files) and `runc restore`, keeps a cgroup's frozen state, records every host
//! operation in order, and fails the ones a test names.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::sync::Mutex;
use std::time::Duration;

use gpusnap_criu_bridge::RunTool;

use crate::host::{Host, Runc, RuncFailure};

/// What a test can make fail, and what the host records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    /// `criu --version` (CRIU missing or broken).
    CriuVersion,
    /// `runc checkpoint` (CRIU's dump).
    Dump,
    /// The dump writes a file the digest refuses (a name that is not UTF-8): the seal fails.
    Seal,
    /// `runc restore` exits non-zero.
    Restore,
    /// `runc restore` cannot be started.
    RestoreSpawn,
    Freeze,
    Thaw,
    KillAll,
}

#[derive(Default)]
pub(crate) struct FakeHost {
    fail: Mutex<HashSet<Op>>,
    calls: Mutex<Vec<String>>,
    /// The container's cgroup: `Some(frozen)`.
    frozen: Mutex<Option<bool>>,
    /// The "CRIU" of a failing dump thaws the cgroup (as a killed CRIU may).
    pub dump_thaws: bool,
    /// Where `runc restore` looks for the restore's in-flight record, to note its phase.
    pub record_dir: Option<PathBuf>,
    /// What `runc state` answers: the init's pid and runc's status word; `None`: runc does not
    /// know the container.
    pub runc_state: Option<(u32, String)>,
}

impl FakeHost {
    pub fn new(frozen: bool) -> Self {
        FakeHost {
            frozen: Mutex::new(Some(frozen)),
            ..Default::default()
        }
    }

    pub fn fail(self, op: Op) -> Self {
        self.fail.lock().unwrap().insert(op);
        self
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// Whether any recorded call starts with `prefix`.
    pub fn called(&self, prefix: &str) -> bool {
        self.calls().iter().any(|c| c.starts_with(prefix))
    }

    pub fn frozen(&self) -> Option<bool> {
        *self.frozen.lock().unwrap()
    }

    fn fails(&self, op: Op) -> bool {
        self.fail.lock().unwrap().contains(&op)
    }

    fn record(&self, call: impl Into<String>) {
        self.calls.lock().unwrap().push(call.into());
    }

    fn runc_op(&self, name: &str, op: Op) -> Result<(), RuncFailure> {
        self.record(name);
        if self.fails(op) {
            return Err(RuncFailure {
                message: format!("runc {name} failed (exit status: 1): injected"),
                exit: Some(1),
            });
        }
        Ok(())
    }
}

fn output(code: i32, stdout: &str, stderr: &str) -> io::Result<Output> {
    Ok(Output {
        status: ExitStatus::from_raw(code << 8),
        stdout: stdout.as_bytes().to_vec(),
        stderr: stderr.as_bytes().to_vec(),
    })
}

/// The value following `flag` in `args`.
fn value_of(args: &[String], flag: &str) -> Option<PathBuf> {
    args.windows(2)
        .find(|w| w[0] == flag)
        .map(|w| PathBuf::from(&w[1]))
}

impl RunTool for FakeHost {
    fn output(&self, cmd: Command) -> io::Result<Output> {
        let program = Path::new(cmd.get_program())
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if program == "criu" {
            self.record("criu --version");
            if self.fails(Op::CriuVersion) {
                return output(1, "", "criu: broken");
            }
            return output(0, "Version: 4.1\n", "");
        }
        if args.iter().any(|a| a == "--version") {
            return output(0, "runc version 1.2.0\nspec: 1.2.0\n", "");
        }
        let sub = ["checkpoint", "delete", "state", "ps", "kill"]
            .into_iter()
            .find(|s| args.iter().any(|a| a == s))
            .unwrap_or("other");
        self.record(format!("runc {sub}"));
        match sub {
            "checkpoint" => {
                let dir = value_of(&args, "--image-path").expect("--image-path");
                // CRIU's log, and images that a scrub removes.
                std::fs::write(dir.join("dump.log"), "(00.1) dumping\n")?;
                std::fs::write(dir.join("pages-1.img"), vec![7u8; 8192])?;
                std::fs::write(dir.join("inventory.img"), b"inventory")?;
                if self.fails(Op::Seal) {
                    use std::os::unix::ffi::OsStrExt;
                    let name = std::ffi::OsStr::from_bytes(b"bad-\xff.img");
                    std::fs::write(dir.join(name), b"x")?;
                }
                if self.fails(Op::Dump) {
                    if self.dump_thaws {
                        *self.frozen.lock().unwrap() = Some(false);
                    }
                    return output(1, "", "criu failed: type NOTIFY errno 0");
                }
                output(0, "", "")
            }
            "delete" => output(0, "", ""),
            "state" => match &self.runc_state {
                Some((pid, status)) => output(
                    0,
                    &serde_json::json!({"pid": pid, "status": status}).to_string(),
                    "",
                ),
                None => output(1, "", "container does not exist"),
            },
            _ => output(1, "", "container does not exist"),
        }
    }
}

impl Host for FakeHost {
    fn run_restore(&self, _cmd: Command, _started: &dyn Fn(u32)) -> io::Result<ExitStatus> {
        // `started` is never called: the watchdog would kill the "runc" pid at the deadline.
        let phase = self
            .record_dir
            .as_deref()
            .and_then(|d| crate::inflight::RestoreInFlight::read_all(d).pop())
            .map(|r| format!("{:?}", r.phase))
            .unwrap_or_default();
        self.record(format!("runc restore {phase}").trim_end().to_string());
        if self.fails(Op::RestoreSpawn) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no runc"));
        }
        Ok(ExitStatus::from_raw(
            if self.fails(Op::Restore) { 1 } else { 0 } << 8,
        ))
    }

    fn freeze(&self, _runc: &Runc<'_>) -> Result<(), RuncFailure> {
        self.runc_op("freeze", Op::Freeze)?;
        *self.frozen.lock().unwrap() = Some(true);
        Ok(())
    }

    fn thaw(&self, _runc: &Runc<'_>) -> Result<(), RuncFailure> {
        self.runc_op("thaw", Op::Thaw)?;
        *self.frozen.lock().unwrap() = Some(false);
        Ok(())
    }

    fn kill_all(&self, _runc: &Runc<'_>) -> Result<(), RuncFailure> {
        self.runc_op("kill-all", Op::KillAll)
    }

    fn cgroup_pids(&self, _init_pid: u32) -> Option<Vec<u32>> {
        // Pids no process has: nothing reads a real process's files.
        Some(vec![u32::MAX - 1])
    }

    fn cgroup_frozen(&self, _pid: u32) -> Option<bool> {
        self.frozen()
    }

    fn thaw_cgroup(&self, _pid: u32) -> io::Result<()> {
        self.record("thaw-cgroup");
        *self.frozen.lock().unwrap() = Some(false);
        Ok(())
    }

    fn cgroup_frozen_at(&self, _dir: &Path) -> Option<bool> {
        self.frozen()
    }

    fn thaw_cgroup_at(&self, dir: &Path) -> io::Result<()> {
        self.record(format!("thaw-cgroup-at {}", dir.display()));
        *self.frozen.lock().unwrap() = Some(false);
        Ok(())
    }

    fn kill_cgroup(&self, dir: &Path, _wait: Duration) -> (usize, Vec<u32>) {
        self.record(format!("kill-cgroup {}", dir.display()));
        (0, Vec::new())
    }

    fn remove_cgroup(&self, dir: &Path) {
        self.record(format!("remove-cgroup {}", dir.display()));
    }

    fn clear_criu_yards(&self, work_dir: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
        self.record(format!("clear-yards {}", work_dir.display()));
        (Vec::new(), Vec::new())
    }

    fn detach_criu_root(&self, runc_dir: &Path) {
        self.record(format!("detach-criu-root {}", runc_dir.display()));
    }

    fn kill_criu_writing(&self, image_dir: &Path) -> usize {
        self.record(format!("kill-criu-writing {}", image_dir.display()));
        0
    }
}

/// A node for the tests: a `criu` and a `runc` (never run), a bundle whose spec names a
/// rootfs and a cgroup, scratch and image directories, all under one temporary directory.
pub(crate) struct Node {
    pub dir: tempfile::TempDir,
}

impl Node {
    pub fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        for tool in ["criu", "runc"] {
            std::fs::write(bin.join(tool), "#!/bin/false\n").unwrap();
            std::fs::set_permissions(bin.join(tool), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            serde_json::json!({
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs"},
                "linux": {"cgroupsPath": "/gpusnap-test/c1"}
            })
            .to_string(),
        )
        .unwrap();
        Node { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn runc(&self) -> gpusnap_criu_bridge::RuncGlobal {
        gpusnap_criu_bridge::RuncGlobal {
            binary: self.path("bin/runc"),
            root: Some(self.path("runc-root")),
            criu: Some(self.path("bin/criu")),
            ..Default::default()
        }
    }

    /// A configuration with no CUDA driver to load (a CPU-only node).
    pub fn config(&self) -> gpusnap_config::Config {
        let mut config = gpusnap_config::Config::default();
        config.cuda.library = self.path("no-libcuda.so.1").display().to_string();
        config
    }
}
