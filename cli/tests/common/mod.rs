//! Helpers shared by the gpusnap-cli integration tests. Everything runs against the real
//! binaries (`gpusnap`, `gpusnap-runc`), the real runc, CRIU and containerd the rig installs.

#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const GPUSNAP: &str = env!("CARGO_BIN_EXE_gpusnap");
pub const GPUSNAP_RUNC: &str = env!("CARGO_BIN_EXE_gpusnap-runc");
pub const RIG_BIN: &str = "/opt/gpusnap-rig/bin";

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A name unique to this test process and call.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test runs containers and containerd: run it as root (CI does)"
    );
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// Runs a command to completion with stdin closed.
pub fn run<I, S>(program: impl AsRef<OsStr>, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(program.as_ref())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {:?}: {e}", program.as_ref()))
}

pub fn gpusnap<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(GPUSNAP, args)
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every file under `dir` with its content, for "nothing changed" assertions.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// A private containerd on its own sockets, killed (by its pid) when dropped.
pub struct Containerd {
    child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Containerd {
    pub fn start(config: &Path, socket: PathBuf, log: PathBuf) -> Containerd {
        let log_file = fs::File::create(&log).unwrap();
        let child = Command::new(Path::new(RIG_BIN).join("containerd"))
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("starting containerd");
        let mut c = Containerd { child, socket, log };
        let ready = wait_for(Duration::from_secs(30), || {
            if let Ok(Some(status)) = c.child.try_wait() {
                panic!("containerd exited ({status}):\n{}", c.log_text());
            }
            let out = c.ctr(&["version"]);
            out.status.success().then_some(())
        });
        assert!(ready.is_some(), "containerd not ready:\n{}", c.log_text());
        c
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        let mut full = vec!["--address".to_owned(), self.socket.display().to_string()];
        full.extend(args.iter().map(|a| a.to_string()));
        run(Path::new(RIG_BIN).join("ctr"), full)
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        if wait_for(Duration::from_secs(10), || {
            self.child.try_wait().ok().flatten()
        })
        .is_none()
        {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A runc container made from the static busybox, with its own runc root. Killed and deleted
/// when dropped.
pub struct BusyboxContainer {
    pub id: String,
    pub bundle: PathBuf,
    pub runc_root: PathBuf,
}

/// The counter loop the checkpoint tests run: writes an increasing number to /tmp/count.
pub const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done";

impl BusyboxContainer {
    /// Creates the bundle under `dir` (rootfs from /bin/busybox, spec from `runc spec`).
    pub fn create(dir: &Path, id: &str, script: &str) -> BusyboxContainer {
        let bundle = dir.join(format!("bundle-{id}"));
        let rootfs = bundle.join("rootfs");
        for d in ["bin", "proc", "sys", "dev", "tmp", "etc", "root"] {
            fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for tool in ["sh", "sleep", "cat", "echo"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(tool)).unwrap();
        }
        let out = run("runc", ["spec", "--bundle", bundle.to_str().unwrap()]);
        assert!(out.status.success(), "runc spec: {}", describe(&out));
        let spec_path = bundle.join("config.json");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&fs::read(&spec_path).unwrap()).unwrap();
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
        spec["root"]["readonly"] = false.into();
        fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        BusyboxContainer {
            id: id.to_owned(),
            bundle,
            runc_root: dir.join("runc-root"),
        }
    }

    pub fn root_args(&self) -> Vec<String> {
        vec!["--root".into(), self.runc_root.display().to_string()]
    }

    /// `runc run -d` with stdio on /dev/null (the container must not hold the test's pipes).
    pub fn start(&self) {
        let status = Command::new("runc")
            .args(self.root_args())
            .args(["run", "-d", "--bundle"])
            .arg(&self.bundle)
            .arg(&self.id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "runc run failed: {status}");
    }

    /// `runc state` status, `None` when runc does not know the container.
    pub fn status(&self) -> Option<String> {
        let mut args = self.root_args();
        args.extend(["state".into(), self.id.clone()]);
        let out = run("runc", args);
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["status"].as_str().map(str::to_owned)
    }

    /// The counter the container writes into its rootfs.
    pub fn count(&self) -> Option<u64> {
        fs::read_to_string(self.bundle.join("rootfs/tmp/count"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// `gpusnap-runc <root> <args...>` with stdio of its own (restore hands stdio to the
    /// container, which must not keep the test's pipes open).
    pub fn wrapper(
        &self,
        args: &[&str],
        envs: &[(&str, &str)],
        out_dir: &Path,
    ) -> (i32, String, String) {
        let stdout_path = out_dir.join(format!("{}.stdout", unique("w")));
        let stderr_path = out_dir.join(format!("{}.stderr", unique("w")));
        let mut cmd = Command::new(GPUSNAP_RUNC);
        cmd.args(self.root_args())
            .args(args)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout_path).unwrap())
            .stderr(fs::File::create(&stderr_path).unwrap());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let status = cmd.status().unwrap();
        (
            status.code().unwrap_or(-1),
            fs::read_to_string(&stdout_path).unwrap_or_default(),
            fs::read_to_string(&stderr_path).unwrap_or_default(),
        )
    }
}

impl Drop for BusyboxContainer {
    fn drop(&mut self) {
        let mut kill = self.root_args();
        kill.extend(["kill".into(), self.id.clone(), "KILL".into()]);
        let _ = run("runc", kill);
        let mut del = self.root_args();
        del.extend(["delete".into(), "--force".into(), self.id.clone()]);
        let _ = run("runc", del);
    }
}
