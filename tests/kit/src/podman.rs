//! Debian's Podman (4.3) with a configuration of its own, running `gpusnap-runc` as the OCI
//! runtime `gpusnap` — registered by `gpusnap install --podman-conf`, so the install is
//! tested through the front door too.
//!
//! Everything Podman keeps lives under one temporary directory: `--root`, `--runroot`,
//! `--tmpdir`, its events log, the network config directory; `CONTAINERS_CONF` and
//! `CONTAINERS_STORAGE_CONF` point at files there (Podman then reads no other containers.conf).
//! Podman is run with the test's own environment (the user's `PATH`): the calls Podman makes
//! with no `PATH` at all (`kill`, `delete --force`) happen inside Podman, as for a user.
//!
//! runc's state stays at its default root (`/run/runc`, where Podman's runtime calls put it);
//! container ids are unique, and the checks look for this instance's ids only.
//!
//! Also here: process-table checks; the counter workload is re-exported from
//! [`crate::counter`].

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::cmd::{describe, run_with_timeout, trimmed_stdout_ok};
use crate::paths::{self, busybox_archive, require_tool};
use crate::rig::Rig;

/// The busybox image in the rig's OCI archive.
pub const BUSYBOX_IMAGE: &str = "docker.io/gpusnap/busybox:test";
/// runc's default state root, which Podman's runtime calls use.
pub const RUNC_ROOT: &str = "/run/runc";
/// The runtime name `gpusnap install` registers.
pub const RUNTIME: &str = "gpusnap";

pub use crate::counter::{check_continues, parse_count, wait_count, Count, COUNTER, WARM};

/// Host pids whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(raw) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if line.contains(needle) {
            found.push((pid, line.trim_end().to_string()));
        }
    }
    found
}

/// runc's containers under `root` (`runc list`), as (id, status).
pub fn runc_list(root: &Path) -> Result<Vec<(String, String)>> {
    let out = Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["list", "--format", "json"])
        .env("PATH", crate::containerd::system_path())
        .stdin(Stdio::null())
        .output()
        .context("running runc list")?;
    ensure!(out.status.success(), "runc list: {}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() || text.trim() == "null" {
        return Ok(Vec::new());
    }
    let v: serde_json::Value = serde_json::from_str(&text).context("runc list output")?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["id"].as_str()?.to_string(),
                c["status"].as_str()?.to_string(),
            ))
        })
        .collect())
}

/// Nothing of `ids` is known to runc under `root`, and no process carries `marker` in its
/// command line (the workload, or a conmon of one of the ids).
pub fn check_nothing_running(root: &Path, ids: &[&str], marker: &str) -> Result<()> {
    let left: Vec<(String, String)> = runc_list(root)?
        .into_iter()
        .filter(|(id, _)| ids.contains(&id.as_str()))
        .collect();
    ensure!(
        left.is_empty(),
        "runc still has {left:?} under {}",
        root.display()
    );
    // This test process itself never carries the marker; a `runc list` child has exited. A
    // conmon whose container was just removed may take a moment to exit on a loaded node:
    // only one still there after that counts.
    let procs_left = || {
        let mut procs = processes_with(marker);
        for id in ids {
            procs.extend(processes_with(id));
        }
        procs
    };
    crate::wait_until(Duration::from_secs(10), || procs_left().is_empty());
    let procs = procs_left();
    ensure!(procs.is_empty(), "processes left running: {procs:?}");
    Ok(())
}

/// A private Podman configuration with `gpusnap` registered.
pub struct Podman {
    dir: tempfile::TempDir,
    podman: PathBuf,
    /// The containers.conf Podman reads (`CONTAINERS_CONF`), as `gpusnap install` left it.
    pub conf: PathBuf,
    /// The gpusnap config `gpusnap install` wrote (defaults, absolute runc and CRIU paths).
    pub gpusnap_config: PathBuf,
    /// `gpusnap install`'s output, for messages.
    pub install_output: String,
}

impl Podman {
    /// Writes the base configuration, registers gpusnap-runc with `gpusnap install
    /// --podman-conf`, and loads the busybox image from the rig's OCI archive.
    pub fn new() -> Result<Podman> {
        let podman = require_tool("podman", "podman (Debian 12: podman conmon)");
        require_tool("conmon", "conmon");
        let dir = tempfile::Builder::new()
            .prefix("gpp-")
            .tempdir_in("/tmp")
            .context("podman scratch directory")?;
        let d = dir.path();
        let conf = d.join("containers.conf");
        // Podman raises a root container's nofile and nproc limits to 1048576; without
        // CAP_SYS_RESOURCE (CI's machines) runc may not, so they are set below this
        // process's hard limits.
        let nofile = rlimit(libc::RLIMIT_NOFILE).min(1024);
        let nproc = rlimit(libc::RLIMIT_NPROC).min(4096);
        fs::write(
            &conf,
            format!(
                "# The test's own Podman configuration; `gpusnap install` adds the runtime.\n\
                 [containers]\n\
                 netns = \"none\"\n\
                 default_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc={nproc}:{nproc}\"]\n\
                 \n\
                 [engine]\n\
                 # No systemd as pid 1 here.\n\
                 cgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"file\"\n\
                 events_logfile_path = \"{events}\"\n\
                 \n\
                 [network]\n\
                 network_config_dir = \"{net}\"\n",
                events = d.join("events.log").display(),
                net = d.join("net").display(),
            ),
        )?;
        fs::write(
            d.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                d.join("root").display(),
                d.join("runroot").display()
            ),
        )?;
        let gpusnap_config = d.join("gpusnap.toml");
        let wrapper = paths::binary("gpusnap-runc");
        let args: Vec<String> = vec![
            "--config".into(),
            gpusnap_config.display().to_string(),
            "install".into(),
            "--podman-conf".into(),
            conf.display().to_string(),
            "--runc-wrapper-path".into(),
            wrapper.display().to_string(),
            "--skip-containerd".into(),
            "--skip-crio".into(),
            "--criu-config".into(),
            d.join("criu-runc.conf").display().to_string(),
            "--criu-network-lock".into(),
            "skip".into(),
            "--state-file".into(),
            d.join("install-state.json").display().to_string(),
        ];
        let out = crate::cmd::gpusnap(&args);
        ensure!(
            out.status.success(),
            "gpusnap {}: {}",
            args.join(" "),
            describe(&out)
        );
        let p = Podman {
            dir,
            podman,
            conf,
            gpusnap_config,
            install_output: describe(&out),
        };
        let load = p.run(&["load", "-i", &busybox_archive().display().to_string()])?;
        ensure!(
            load.status.success(),
            "podman load of {}: {}",
            busybox_archive().display(),
            describe(&load)
        );
        Ok(p)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `podman` with this configuration and the caller's environment otherwise.
    pub fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let d = self.dir.path();
        let mut cmd = Command::new(&self.podman);
        cmd.env("CONTAINERS_CONF", &self.conf)
            .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
            .arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs podman (2 minutes at most).
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<Output> {
        run_with_timeout(self.command(args), None, Duration::from_secs(120))
    }

    /// Runs podman and returns its stdout, trimmed; an error with both streams otherwise.
    pub fn ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String> {
        trimmed_stdout_ok("podman", args, &self.run(args)?)
    }

    /// `podman run -d --runtime gpusnap --name NAME busybox sh -c COUNTER MARKER`; returns the
    /// full container id. `marker` becomes the shell's `$0`, so the workload's processes can
    /// be found in the process table.
    pub fn run_counter(&self, name: &str, marker: &str) -> Result<String> {
        self.ok(&[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            "--name",
            name,
            BUSYBOX_IMAGE,
            "sh",
            "-c",
            COUNTER,
            marker,
        ])
    }

    /// The counter of container `name`, read with `podman exec` (`None` while absent).
    pub fn count(&self, name: &str) -> Option<Count> {
        let out = self.run(&["exec", name, "cat", "/tmp/count"]).ok()?;
        if !out.status.success() {
            return None;
        }
        parse_count(&String::from_utf8_lossy(&out.stdout))
    }

    /// `podman inspect --format FORMAT NAME`.
    pub fn inspect(&self, name: &str, format: &str) -> Result<String> {
        self.ok(&["inspect", "--format", format, name])
    }

    /// Full ids of every container Podman knows.
    pub fn ids(&self) -> Vec<String> {
        self.ok(&["ps", "-a", "-q", "--no-trunc"])
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

/// The hard limit of `resource` for this process.
fn rlimit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    unsafe {
        libc::getrlimit(resource, &mut r);
    }
    r.rlim_max
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Podman's own removal first; then whatever it left: runc state, conmon, mounts.
        let ids = self.ids();
        let _ = self.run(&["rm", "-a", "-f", "-t", "0"]);
        for id in &ids {
            let _ = Command::new("runc")
                .args(["--root", RUNC_ROOT, "delete", "--force", id])
                .env("PATH", crate::containerd::system_path())
                .stdin(Stdio::null())
                .output();
            for (pid, _) in processes_with(id) {
                // SAFETY: kill(2) of a conmon naming this instance's container id.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
        let mut mounts = Rig::mounts_under(self.dir.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in mounts {
            if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
                // SAFETY: umount2 with a valid NUL-terminated path under this directory.
                unsafe {
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
    }
}

/// `gpusnap-runc --root RUNC_ROOT checkpoint --leave-running --image-path IMAGE ID` with the
/// gpusnap config `config`: a node checkpoint of a running container, as an operator of a
/// CRI-O or Podman node makes one into `restore.checkpoint_root`.
pub fn checkpoint_leave_running(
    runc_root: &Path,
    config: &Path,
    image: &Path,
    id: &str,
) -> Result<()> {
    let mut cmd = Command::new(paths::binary("gpusnap-runc"));
    cmd.arg("--root")
        .arg(runc_root)
        .args(["checkpoint", "--leave-running", "--image-path"])
        .arg(image)
        .arg(id)
        .env("GPUSNAP_CONFIG", config);
    let out = run_with_timeout(cmd, None, Duration::from_secs(120))?;
    ensure!(
        out.status.success(),
        "gpusnap-runc checkpoint: {}",
        describe(&out)
    );
    Ok(())
}

/// Sets `restore.checkpoint_root` in the gpusnap config `config`, keeping everything else.
pub fn set_checkpoint_root(config: &Path, root: &Path) -> Result<()> {
    set_restore_setting(config, "checkpoint_root", &root.display().to_string())
}

/// Sets `restore.<key>` to the string `value` in the gpusnap config `config`, keeping
/// everything else.
pub fn set_restore_setting(config: &Path, key: &str, value: &str) -> Result<()> {
    let old =
        fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let mut doc: toml_edit::DocumentMut = old
        .parse()
        .with_context(|| format!("parsing {}", config.display()))?;
    if doc.get("restore").is_none() {
        doc.insert("restore", toml_edit::Item::Table(toml_edit::Table::new()));
    }
    let restore = doc["restore"]
        .as_table_mut()
        .with_context(|| format!("restore in {} is not a table", config.display()))?;
    restore.insert(key, toml_edit::value(value));
    fs::write(config, doc.to_string()).with_context(|| format!("writing {}", config.display()))
}
