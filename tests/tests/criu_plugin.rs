//! CRIU's own cuda plugin stays out of every CRIU run gpusnap starts.
//!
//! A plugin double (tests/fixtures/criu_plugin_double.c) is built as `cuda_plugin.so` — the
//! name of CRIU's cuda plugin — and as `other_plugin.so`, into one plugin directory that
//! containerd's environment names (`CRIU_LIBS_DIR`, which reaches CRIU through the shim and
//! runc, as CRIU's default directory would on a GPU node). Each double logs every hook CRIU
//! calls. The control (containerd-shim-runc-v2) shows that CRIU loads both in this
//! environment; through gpusnap, the cuda plugin never runs — neither at checkpoint nor at
//! restore — while the other plugin still does.

use std::{fs, path::Path, process::Command, time::Duration};

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::{OutputExt, Rig, RigOptions, Runtime, TaskState};

const COUNTER: &[&str] = &[
    "sh",
    "-c",
    "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done",
];

/// Builds the double as `<dir>/<name>.so`.
fn build_double(dir: &Path, name: &str) -> Result<()> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/criu_plugin_double.c");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror"])
        .arg(format!("-DPLUGIN_NAME=\"{name}\""))
        .arg("-o")
        .arg(dir.join(format!("{name}.so")))
        .arg(&source)
        .output()
        .context("running cc")?;
    ensure!(
        out.status.success(),
        "building the plugin double: {}",
        out.describe()
    );
    Ok(())
}

struct PluginRig {
    rig: Rig,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl PluginRig {
    fn start(rt: Runtime) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let plugins = dir.path().join("plugins");
        fs::create_dir(&plugins)?;
        build_double(&plugins, "cuda_plugin")?;
        build_double(&plugins, "other_plugin")?;
        let log = dir.path().join("plugins.log");
        let rig = Rig::start_with(RigOptions {
            require_gpusnap: rt == Runtime::Gpusnap,
            containerd_env: vec![
                ("CRIU_LIBS_DIR".into(), plugins.display().to_string()),
                ("GPUSNAP_PLUGIN_LOG".into(), log.display().to_string()),
            ],
            ..Default::default()
        })?;
        Ok(Self {
            rig,
            log,
            _dir: dir,
        })
    }

    /// The hooks each double logged: (cuda_plugin's, other_plugin's).
    fn hooks(&self) -> (Vec<String>, Vec<String>) {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let of = |name: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| l.strip_prefix(&format!("{name} ")))
                .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
                .collect()
        };
        (of("cuda_plugin"), of("other_plugin"))
    }
}

fn checkpoint_and_restore(p: &PluginRig, rt: Runtime, id: &str) -> Result<()> {
    p.rig.run_detached(rt, id, COUNTER)?;
    let image = format!("docker.io/gpusnap/ck-plugin-{id}:1");
    p.rig
        .ctr_ok(&["containers", "checkpoint", "--task", id, &image])?;
    p.rig.stop_and_delete(id)?;
    p.rig.delete_container(id)?;
    p.rig
        .ctr_ok(&["containers", "restore", "--live", id, &image])?;
    p.rig
        .wait_task_state(id, TaskState::Running, Duration::from_secs(30))?;
    Ok(())
}

#[test]
fn criu_loads_the_plugins_in_this_environment_under_runc_v2() -> Result<()> {
    let p = PluginRig::start(Runtime::RuncV2)?;
    checkpoint_and_restore(&p, Runtime::RuncV2, "control")?;
    let (cuda, _) = p.hooks();
    for hook in ["PAUSE_DEVICES", "CHECKPOINT_DEVICES", "RESUME_DEVICES_LATE"] {
        ensure!(
            cuda.iter().any(|h| h == hook),
            "the control must show CRIU calling the cuda plugin's {hook}: {cuda:?}"
        );
    }
    Ok(())
}

#[test]
fn gpusnap_runs_criu_without_the_cuda_plugin_and_keeps_the_others() -> Result<()> {
    let p = PluginRig::start(Runtime::Gpusnap)?;
    checkpoint_and_restore(&p, Runtime::Gpusnap, "gs")?;
    let (cuda, other) = p.hooks();
    ensure!(
        cuda.is_empty(),
        "CRIU's cuda plugin ran in a CRIU run gpusnap started: {cuda:?}"
    );
    for hook in ["PAUSE_DEVICES", "CHECKPOINT_DEVICES", "RESUME_DEVICES_LATE"] {
        ensure!(
            other.iter().any(|h| h == hook),
            "other plugins still run in gpusnap's CRIU runs ({hook} missing): {other:?}"
        );
    }
    Ok(())
}
