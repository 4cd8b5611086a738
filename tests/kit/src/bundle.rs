//! [`BusyboxContainer`]: a runc-level container (no containerd) made from the host's static
//! busybox, with a runc root of its own, for tests of runc, CRIU and `gpusnap-runc`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cmd::{describe, run, unique};
use crate::paths;

/// The counter loop the checkpoint tests run: writes an increasing number to `/tmp/count`
/// ten times a second (read it with [`BusyboxContainer::count`]). Each round overwrites the
/// file in place (`1<>` does not truncate) with one fixed-width `write`, so the file always
/// holds a whole number: a dump that catches the shell inside the redirection leaves the
/// previous or the new value, never an empty file, and the file's size never changes.
pub const COUNTER: &str =
    "i=0; while true; do i=$((i+1)); printf '%010d\\n' $i 1<>/tmp/count; sleep 0.1; done";

/// The static busybox the bundles are made from.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

/// A runc container made from the static busybox, with its own runc root. Killed and deleted
/// when dropped.
pub struct BusyboxContainer {
    pub id: String,
    pub bundle: PathBuf,
    pub runc_root: PathBuf,
}

impl BusyboxContainer {
    /// Creates the bundle `<dir>/bundle-<id>` (rootfs from /bin/busybox, spec from `runc spec`,
    /// no terminal, writable rootfs) running `/bin/sh -c <script>`; runc's root is
    /// `<dir>/runc-root`. Nothing is started yet.
    pub fn create(dir: &Path, id: &str, script: &str) -> BusyboxContainer {
        assert!(
            Path::new(HOST_BUSYBOX).is_file(),
            "{HOST_BUSYBOX} missing: install a static busybox (Debian: busybox-static)"
        );
        let bundle = dir.join(format!("bundle-{id}"));
        let rootfs = bundle.join("rootfs");
        for d in ["bin", "proc", "sys", "dev", "tmp", "etc", "root"] {
            fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        fs::copy(HOST_BUSYBOX, rootfs.join("bin/busybox")).unwrap();
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

    /// Changes the bundle's `config.json` (before [`BusyboxContainer::start`]).
    pub fn edit_spec(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = self.bundle.join("config.json");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        edit(&mut spec);
        fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    }

    /// Adds `KEY=VALUE` to the container process's environment (before
    /// [`BusyboxContainer::start`]).
    pub fn add_env(&self, kv: &str) {
        self.edit_spec(|spec| {
            let env = &mut spec["process"]["env"];
            if !env.is_array() {
                *env = serde_json::json!([]);
            }
            env.as_array_mut().unwrap().push(kv.into());
        });
    }

    /// `--root <runc root>`, runc's global flags selecting this container's state.
    pub fn root_args(&self) -> Vec<String> {
        vec!["--root".into(), self.runc_root.display().to_string()]
    }

    /// `runc --root <runc root>` (not started).
    pub fn runc(&self) -> Command {
        let mut c = Command::new("runc");
        c.args(self.root_args());
        c
    }

    /// `runc run -d` with stdio on /dev/null (the container must not hold the test's pipes).
    pub fn start(&self) {
        let status = self
            .runc()
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
        self.state()?["status"].as_str().map(str::to_owned)
    }

    /// Host pid of the container's init, `None` when runc does not know the container.
    pub fn pid(&self) -> Option<i32> {
        self.state()?["pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
    }

    /// `runc state`, parsed.
    pub fn state(&self) -> Option<serde_json::Value> {
        let out = self
            .runc()
            .args(["state", &self.id])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The counter [`COUNTER`] writes into the rootfs (`None` while absent).
    pub fn count(&self) -> Option<u64> {
        self.read_file("tmp/count")?.trim().parse().ok()
    }

    /// A file of the container's rootfs, by its path relative to the rootfs.
    pub fn read_file(&self, rel: &str) -> Option<String> {
        fs::read_to_string(self.bundle.join("rootfs").join(rel)).ok()
    }

    /// `gpusnap-runc --root <runc root> <args...>` with `envs` added to the environment and
    /// stdio of its own (a restore hands its stdio to the container, which must not keep the
    /// test's pipes open): stdout and stderr go through files in `out_dir`. Returns (exit
    /// code, stdout, stderr); -1 when killed by a signal.
    pub fn wrapper(
        &self,
        args: &[&str],
        envs: &[(&str, &str)],
        out_dir: &Path,
    ) -> (i32, String, String) {
        let mut cmd = Command::new(paths::binary("gpusnap-runc"));
        cmd.args(self.root_args()).args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        run_detached_stdio(cmd, out_dir)
    }
}

impl BusyboxContainer {
    /// `gpusnap-runc restore -d --image-path <images> --work-path <out_dir>/restore-work
    /// --bundle <bundle> <id>`, as [`BusyboxContainer::wrapper`] runs it.
    pub fn wrapper_restore(
        &self,
        images: &Path,
        envs: &[(&str, &str)],
        out_dir: &Path,
    ) -> (i32, String, String) {
        let work = out_dir.join("restore-work");
        fs::create_dir_all(&work).unwrap();
        let (images, work, bundle) = (
            images.to_str().unwrap(),
            work.to_str().unwrap(),
            self.bundle.to_str().unwrap(),
        );
        self.wrapper(
            &[
                "restore",
                "-d",
                "--image-path",
                images,
                "--work-path",
                work,
                "--bundle",
                bundle,
                &self.id,
            ],
            envs,
            out_dir,
        )
    }
}

/// Runs `cmd` with stdin on /dev/null and stdout/stderr in fresh files under `out_dir`;
/// returns (exit code or -1, stdout, stderr).
pub fn run_detached_stdio(mut cmd: Command, out_dir: &Path) -> (i32, String, String) {
    let name = unique("out");
    let stdout_path = out_dir.join(format!("{name}.stdout"));
    let stderr_path = out_dir.join(format!("{name}.stderr"));
    let status = cmd
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout_path).unwrap())
        .stderr(fs::File::create(&stderr_path).unwrap())
        .status()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        status.code().unwrap_or(-1),
        fs::read_to_string(&stdout_path).unwrap_or_default(),
        fs::read_to_string(&stderr_path).unwrap_or_default(),
    )
}

impl Drop for BusyboxContainer {
    fn drop(&mut self) {
        let quiet = |args: &[&str]| {
            let _ = self
                .runc()
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        quiet(&["kill", &self.id, "KILL"]);
        quiet(&["delete", "--force", &self.id]);
    }
}
