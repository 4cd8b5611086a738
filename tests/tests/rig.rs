//! Tests of the rig itself: isolation between rigs, teardown, CRI mode, runtime
//! resolution. Needs root and `scripts/setup-env.sh`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::rig::{BUSYBOX_IMAGE, PAUSE_IMAGE};
use gpusnap_testkit::{paths, OutputExt, Rig, RigOptions, Runtime, TaskState};

fn check(f: fn() -> Result<()>) {
    if let Err(e) = f() {
        panic!("{e:#}");
    }
}

fn any_process_mentions(needle: &str) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
}

/// Two rigs side by side see nothing of each other, and dropping one removes all of
/// its traces (dir, processes, runc state, cgroups) without disturbing the other.
#[test]
fn rigs_are_isolated_and_clean_up() {
    check(|| {
        let a = Rig::start()?;
        let b = Rig::start()?;
        ensure!(a.dir() != b.dir() && a.namespace() != b.namespace() && a.address() != b.address());
        a.run_detached(Runtime::RuncV2, "same-id", &["sleep", "1000"])?;
        b.run_detached(Runtime::RuncV2, "same-id", &["sleep", "1000"])?;
        let (pa, pb) = (a.task_pid("same-id")?, b.task_pid("same-id")?);
        ensure!(pa != pb, "both rigs report pid {pa}");
        a.run_detached(Runtime::RuncV2, "only-in-a", &["sleep", "1000"])?;
        ensure!(b.task("only-in-a")?.is_none(), "rig b sees rig a's task");

        let a_dir = a.dir().to_path_buf();
        let a_addr = a.address().to_string_lossy().into_owned();
        let a_runc = a.runc_root();
        let a_ns = a.namespace().to_string();
        drop(a); // tasks still running: teardown must kill them
        ensure!(!a_dir.exists(), "rig dir {} left behind", a_dir.display());
        ensure!(
            !a_runc.exists(),
            "runc root {} left behind",
            a_runc.display()
        );
        ensure!(
            !any_process_mentions(&a_addr),
            "processes of the dropped rig remain"
        );
        ensure!(
            !Path::new("/sys/fs/cgroup/memory").join(&a_ns).exists(),
            "memory cgroup of {a_ns} left"
        );
        ensure!(
            !Path::new("/sys/fs/cgroup").join(&a_ns).exists(),
            "cgroup of {a_ns} left"
        );
        ensure!(
            std::fs::read_to_string("/proc/self/mountinfo")?
                .lines()
                .all(|l| !l.contains(a_dir.to_str().unwrap())),
            "mounts of the dropped rig remain"
        );
        ensure!(
            matches!(proc_state(pa), None | Some('Z')),
            "task of the dropped rig (pid {pa}) still alive"
        );
        // b is untouched.
        ensure!(
            b.task_state("same-id")? == Some(TaskState::Running),
            "rig b's task disturbed"
        );
        Ok(())
    })
}

fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|v| v.trim().chars().next())
}

/// With `cri: true` the CRI plugins load, the pause image is there, and the runtimes
/// `runc` and `gpusnap` are registered with their runtime types.
#[test]
fn cri_rig_registers_runtimes() {
    check(|| {
        let rig = Rig::start_with(RigOptions {
            cri: true,
            ..Default::default()
        })?;
        let plugins = rig.ctr_ok(&["plugins", "ls"])?;
        // Columns: TYPE ID PLATFORMS STATUS.
        let status = |ty: &str, id: &str| -> Option<String> {
            plugins.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3 && f[0] == ty && f[1] == id).then(|| f[f.len() - 1].to_string())
            })
        };
        for (ty, id) in [
            ("io.containerd.grpc.v1", "cri"),
            ("io.containerd.cri.v1", "runtime"),
            ("io.containerd.cri.v1", "images"),
        ] {
            ensure!(
                status(ty, id).as_deref() == Some("ok"),
                "plugin {ty}.{id}: {:?}\n{plugins}",
                status(ty, id)
            );
        }
        let images = rig.ctr_ok(&["images", "ls", "-q"])?;
        ensure!(
            images.lines().any(|l| l == PAUSE_IMAGE) && images.lines().any(|l| l == BUSYBOX_IMAGE),
            "{images}"
        );

        let mut dump = Command::new(paths::rig_bin_dir().join("containerd"));
        dump.arg("--config")
            .arg(rig.config_path())
            .args(["config", "dump"]);
        let out = dump.output().context("containerd config dump")?;
        ensure!(out.status.success(), "config dump: {}", out.describe());
        let cfg = out.stdout_str();
        for rt in Runtime::ALL {
            let section = format!(
                "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{}]",
                rt.cri_handler()
            );
            let at = cfg
                .find(&section)
                .with_context(|| format!("{section} missing in config dump"))?;
            let body = &cfg[at..];
            let body = &body[..body[section.len()..]
                .find("\n    [")
                .map_or(body.len(), |i| i + section.len())];
            ensure!(
                body.contains(&format!("runtime_type = '{}'", rt.runtime_type()))
                    || body.contains(&format!("runtime_type = \"{}\"", rt.runtime_type())),
                "{section} lacks runtime_type {}:\n{body}",
                rt.runtime_type()
            );
        }
        // Plain ctr still works against a CRI-enabled rig.
        let out = rig.run(Runtime::RuncV2, "cri-mode", &["echo", "ok"])?;
        ensure!(
            out.code() == Some(0) && out.stdout == b"ok\n",
            "{}",
            out.describe()
        );
        Ok(())
    })
}

/// containerd maps `io.containerd.<name>.<version>` to `containerd-shim-<name>-<version>`
/// on its PATH; an unknown runtime fails with that binary name in the error.
#[test]
fn runtime_name_resolves_to_shim_binary_on_path() {
    check(|| {
        let rig = Rig::start()?;
        let out = rig.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.containerd.nosuchshim.v7",
            BUSYBOX_IMAGE,
            "nosuch",
            "true",
        ])?;
        ensure!(
            !out.status.success(),
            "unknown runtime ran: {}",
            out.describe()
        );
        ensure!(
            out.stderr_str().contains("containerd-shim-nosuchshim-v7"),
            "error does not name the binary: {}",
            out.describe()
        );
        let _ = rig.delete_container("nosuch");

        // The runc shim is found through <prefix>/bin on containerd's PATH.
        let out = rig.run(Runtime::RuncV2, "found", &["true"])?;
        ensure!(out.status.success(), "{}", out.describe());
        // The gpusnap shim, when built, is linked into <rig>/bin, first on PATH.
        if let Ok(shim) = rig.gpusnap_shim() {
            let link = rig
                .dir()
                .join("bin")
                .join(Runtime::Gpusnap.shim_binary_name());
            ensure!(
                std::fs::read_link(&link)? == shim,
                "{} does not point at {}",
                link.display(),
                shim.display()
            );
            ensure!(rig
                .path_env()
                .to_string_lossy()
                .starts_with(rig.dir().join("bin").to_str().unwrap()));
        }
        Ok(())
    })
}

/// restart_containerd keeps the same socket and state; images and containers persist.
#[test]
fn restart_keeps_state() {
    check(|| {
        let mut rig = Rig::start()?;
        let t = rig.run_detached(Runtime::RuncV2, "persist", &["sleep", "1000"])?;
        rig.restart_containerd()?;
        ensure!(
            rig.ctr_ok(&["images", "ls", "-q"])?.contains(BUSYBOX_IMAGE),
            "image lost across restart"
        );
        ensure!(
            rig.containers()? == vec!["persist".to_string()],
            "containers: {:?}",
            rig.containers()?
        );
        let after = rig.wait_task_state("persist", TaskState::Running, Duration::from_secs(10))?;
        ensure!(after.pid == t.pid, "pid changed across restart");
        Ok(())
    })
}
