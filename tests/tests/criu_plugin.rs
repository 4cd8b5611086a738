//! CRIU's own cuda plugin stays out of every CRIU run gpusnap starts, through every door.
//!
//! A plugin double (tests/fixtures/criu_plugin_double.c) is built as `cuda_plugin.so` — the
//! name of CRIU's cuda plugin — and as `other_plugin.so`, into one plugin directory. Each
//! double logs every hook CRIU calls. CRIU is pointed at that directory the two ways a GPU node
//! does it: `CRIU_LIBS_DIR` in the environment of whatever starts runc (containerd, CRI-O,
//! Podman), and a `libdir` line in CRIU's own default config file `/etc/criu/default.conf`.
//! The controls (containerd-shim-runc-v2, plain runc) show that CRIU loads both doubles in each
//! setting; through gpusnap — the shim under `ctr` and under CRI (`CheckpointContainer` and a
//! restore from the archive, with the `gpusnap` runtime handler), and `gpusnap-runc` — the cuda
//! plugin never runs, neither at checkpoint nor at restore, while the other plugin still does
//! (so the test also fails when the setting never reached CRIU).

use std::{fs, path::Path, process::Command, time::Duration};

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::bundle::BusyboxContainer;
use gpusnap_testkit::busybox_registry::{registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::can_fail::{CriuConfigFile, CRIU_DEFAULT_CONF};
use gpusnap_testkit::counter::{
    check_continues, count_in_file, count_of, counter_command, counter_script, run_token,
    wait_count, WARM,
};
use gpusnap_testkit::cri::{gpusnap_handler, wait_for_state, ContainerSpec};
use gpusnap_testkit::{
    paths, CriNode, CriNodeOptions, OutputExt, Registry, Rig, RigOptions, Runtime,
};
use k8s_cri::v1::ContainerState;

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

/// The two doubles in a plugin directory, and the log they write.
struct Doubles {
    plugins: std::path::PathBuf,
    log: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Doubles {
    fn build() -> Result<Doubles> {
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-plugins-")
            .tempdir_in("/tmp")?;
        let plugins = dir.path().join("plugins");
        fs::create_dir(&plugins)?;
        build_double(&plugins, "cuda_plugin")?;
        build_double(&plugins, "other_plugin")?;
        Ok(Doubles {
            log: dir.path().join("plugins.log"),
            plugins,
            dir,
        })
    }

    /// The environment that makes CRIU load the doubles from their directory and lets them log.
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("CRIU_LIBS_DIR".into(), self.plugins.display().to_string()),
            ("GPUSNAP_PLUGIN_LOG".into(), self.log.display().to_string()),
        ]
    }

    /// Only the log: CRIU finds the doubles some other way (a config file's `libdir`).
    fn log_env(&self) -> Vec<(String, String)> {
        vec![("GPUSNAP_PLUGIN_LOG".into(), self.log.display().to_string())]
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

    /// The control: CRIU called the cuda double's device hooks.
    fn check_cuda_plugin_ran(&self, door: &str) -> Result<()> {
        let (cuda, _) = self.hooks();
        for hook in ["PAUSE_DEVICES", "CHECKPOINT_DEVICES", "RESUME_DEVICES_LATE"] {
            ensure!(
                cuda.iter().any(|h| h == hook),
                "{door}: the control must show CRIU calling the cuda plugin's {hook}: {cuda:?}"
            );
        }
        Ok(())
    }

    /// gpusnap: the cuda double never ran, the other one ran at checkpoint and restore.
    fn check_only_other_plugin_ran(&self, door: &str) -> Result<()> {
        let (cuda, other) = self.hooks();
        ensure!(
            cuda.is_empty(),
            "{door}: CRIU's cuda plugin ran in a CRIU run gpusnap started: {cuda:?}"
        );
        for hook in ["PAUSE_DEVICES", "CHECKPOINT_DEVICES", "RESUME_DEVICES_LATE"] {
            ensure!(
                other.iter().any(|h| h == hook),
                "{door}: other plugins still run in gpusnap's CRIU runs ({hook} missing): {other:?}"
            );
        }
        Ok(())
    }
}

struct PluginRig {
    rig: Rig,
    doubles: Doubles,
}

impl PluginRig {
    /// A private containerd whose environment names the doubles' directory (`CRIU_LIBS_DIR`).
    fn start(rt: Runtime) -> Result<Self> {
        let doubles = Doubles::build()?;
        let rig = Rig::start_with(RigOptions {
            require_gpusnap: rt == Runtime::Gpusnap,
            containerd_env: doubles.env(),
            ..Default::default()
        })?;
        Ok(Self { rig, doubles })
    }
}

/// `ctr c checkpoint --task --rw`, kill, `ctr c restore --live --rw`: the restored task is
/// the checkpointed counter. `--rw` because the counter writes into its rootfs: a dump that
/// catches it inside a write records the open file, and CRIU cannot reopen it in a fresh
/// rootfs ("criu failed: type NOTIFY errno 0" under runc.v2 now and then before this).
fn checkpoint_and_restore(rig: &Rig, rt: Runtime, id: &str) -> Result<()> {
    let run = run_token();
    let command = counter_command(&run);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let task = rig.run_detached(rt, id, &command)?;
    wait_count(&run, id, WARM, || count_of(task.pid))?;
    let before = wait_count(&run, id, 0, || count_of(task.pid))?;
    let image = format!("docker.io/gpusnap/ck-plugin-{id}:1");
    rig.ctr_ok(&["containers", "checkpoint", "--task", "--rw", id, &image])?;
    rig.stop_and_delete(id)?;
    rig.delete_container(id)?;
    rig.ctr_ok(&["containers", "restore", "--live", "--rw", id, &image])?;
    let t = rig.wait_task_state(
        id,
        gpusnap_testkit::TaskState::Running,
        Duration::from_secs(30),
    )?;
    check_continues(id, &before, || count_of(t.pid)).map(drop)
}

// ----- ctr (the shim), plugins named by CRIU_LIBS_DIR -----------------------------------------

/// The test that puts a `libdir` into CRIU's machine-wide default config changes what every
/// CRIU run in this process loads: it runs alone, the others share.
static CRIU_CONFIG: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn criu_config_shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CRIU_CONFIG.read().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn criu_loads_the_plugins_in_this_environment_under_runc_v2() -> Result<()> {
    let _config = criu_config_shared();
    let p = PluginRig::start(Runtime::RuncV2)?;
    checkpoint_and_restore(&p.rig, Runtime::RuncV2, "control")?;
    p.doubles.check_cuda_plugin_ran("ctr, runc.v2")
}

#[test]
fn gpusnap_runs_criu_without_the_cuda_plugin_and_keeps_the_others() -> Result<()> {
    let _config = criu_config_shared();
    let p = PluginRig::start(Runtime::Gpusnap)?;
    checkpoint_and_restore(&p.rig, Runtime::Gpusnap, "gs")?;
    p.doubles.check_only_other_plugin_ran("ctr, gpusnap shim")
}

// ----- gpusnap-runc (CRI-O, Podman), plugins named by CRIU_LIBS_DIR ---------------------------

/// The rig's CRIU 4.x, for runc (plain runc finds `criu` on its PATH).
fn path_with_rig_criu() -> String {
    format!(
        "{}:{}",
        paths::rig_bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A counter container checkpointed (`checkpoint --image-path`, which destroys it) and
/// restored (`restore -d`) by `wrapper` — gpusnap-runc or plain runc — with `env`; the restored
/// process is the checkpointed one.
fn runc_checkpoint_and_restore(gpusnap: bool, dir: &Path, env: &[(String, String)]) -> Result<()> {
    let run = run_token();
    let c = BusyboxContainer::create(dir, &run, &counter_script(&run));
    let count = || count_in_file(&c.bundle.join("rootfs/tmp/count"));
    c.start();
    wait_count(&run, &c.id, WARM, count)?;
    let before = wait_count(&run, &c.id, 0, count)?;
    let images = dir.join("images");
    let work = dir.join("restore-work");
    fs::create_dir_all(&work)?;
    let (images_s, work_s, bundle_s) = (
        images.display().to_string(),
        work.display().to_string(),
        c.bundle.display().to_string(),
    );
    let checkpoint = ["checkpoint", "--image-path", &images_s, &c.id];
    let restore = [
        "restore",
        "-d",
        "--image-path",
        &images_s,
        "--work-path",
        &work_s,
        "--bundle",
        &bundle_s,
        &c.id,
    ];
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for args in [&checkpoint[..], &restore[..]] {
        let (code, _, err) = if gpusnap {
            c.wrapper(args, &envs, dir)
        } else {
            let mut cmd = c.runc();
            cmd.args(args).envs(envs.iter().copied());
            gpusnap_testkit::bundle::run_detached_stdio(cmd, dir)
        };
        ensure!(
            code == 0,
            "{} {args:?} (exit {code}):
{err}",
            if gpusnap { "gpusnap-runc" } else { "runc" }
        );
    }
    check_continues(&c.id, &before, count).map(drop)
}

/// gpusnap-runc's environment: the doubles' directory and log, CRIU 4.x from the rig.
fn runc_env(doubles: &Doubles, config: &Path) -> Vec<(String, String)> {
    let mut env = doubles.env();
    env.push(("PATH".into(), path_with_rig_criu()));
    env.push(("GPUSNAP_CONFIG".into(), config.display().to_string()));
    env
}

fn gpusnap_runc_config(dir: &Path) -> Result<std::path::PathBuf> {
    let config = dir.join("gpusnap.toml");
    paths::write_criu_config(&config, "")?;
    Ok(config)
}

#[test]
fn criu_loads_the_plugins_under_plain_runc() -> Result<()> {
    let _config = criu_config_shared();
    gpusnap_testkit::require_root();
    let d = Doubles::build()?;
    let config = gpusnap_runc_config(d.dir.path())?;
    runc_checkpoint_and_restore(false, d.dir.path(), &runc_env(&d, &config))?;
    d.check_cuda_plugin_ran("plain runc")
}

#[test]
fn gpusnap_runc_runs_criu_without_the_cuda_plugin_and_keeps_the_others() -> Result<()> {
    let _config = criu_config_shared();
    gpusnap_testkit::require_root();
    let d = Doubles::build()?;
    let config = gpusnap_runc_config(d.dir.path())?;
    runc_checkpoint_and_restore(true, d.dir.path(), &runc_env(&d, &config))?;
    d.check_only_other_plugin_ran("gpusnap-runc")
}

// ----- CRI (containerd's CRI, the gpusnap runtime handler) ------------------------------------

/// CRI `CheckpointContainer` of a counter in a pod run with `handler`, then a new pod whose
/// container restores from the archive (containerd's CRI restore); the restored process is the
/// checkpointed one.
fn cri_checkpoint_and_restore(node: &CriNode, image: &str, handler: &str) -> Result<()> {
    let run = run_token();
    let spec = ContainerSpec {
        name: "counter".into(),
        image: image.into(),
        command: counter_command(&run),
        env: vec![],
    };
    let pod = node.run_pod(&format!("plug-{run}"), &[], handler)?;
    let id = node.run_container(&pod, &spec)?;
    let pid = node.pid(&id)?;
    wait_count(&run, &id, WARM, || count_of(pid))?;
    let before = wait_count(&run, &id, 0, || count_of(pid))?;
    let archive = node.scratch().join(format!("{run}.tar"));
    node.cri
        .checkpoint_container(&id, &archive, 60)
        .map_err(anyhow::Error::from)
        .context("CRI CheckpointContainer")?;
    node.remove_pod(&pod.id)?;
    let pod = node.run_pod(&format!("plug-{run}-r"), &[], handler)?;
    let restored = node.run_container(
        &pod,
        &ContainerSpec {
            image: archive.display().to_string(),
            ..spec
        },
    )?;
    wait_for_state(
        node,
        &restored,
        ContainerState::ContainerRunning,
        Duration::from_secs(30),
    )?;
    let pid = node.pid(&restored)?;
    check_continues(&restored, &before, || count_of(pid))?;
    node.remove_pod(&pod.id)
}

/// A CRI node whose containerd names the doubles' directory, with the busybox image pulled
/// from a private registry (a restore from a CRI archive pulls its base image by name).
fn cri_node(doubles: &Doubles) -> Result<(Registry, CriNode, String)> {
    let reg = registry_with_busybox()?;
    let node = CriNode::start(CriNodeOptions {
        registry_host: Some(reg.host()),
        rig: RigOptions {
            containerd_env: doubles.env(),
            ..Default::default()
        },
        ..Default::default()
    })?;
    let image = reg.image(BUSYBOX_REPO);
    node.cri
        .pull_image(&image)
        .map_err(anyhow::Error::from)
        .context("CRI PullImage of busybox")?;
    Ok((reg, node, image))
}

#[test]
fn criu_loads_the_plugins_under_cri_with_runc_v2() -> Result<()> {
    let _config = criu_config_shared();
    let d = Doubles::build()?;
    let (_reg, node, image) = cri_node(&d)?;
    cri_checkpoint_and_restore(&node, &image, Runtime::RuncV2.cri_handler())?;
    d.check_cuda_plugin_ran("CRI, runc handler")
}

#[test]
fn gpusnap_runs_criu_without_the_cuda_plugin_under_cri() -> Result<()> {
    let _config = criu_config_shared();
    let d = Doubles::build()?;
    let (_reg, node, image) = cri_node(&d)?;
    cri_checkpoint_and_restore(&node, &image, gpusnap_handler())?;
    d.check_only_other_plugin_ran("CRI, gpusnap handler")
}

// ----- CRIU's own default config file names the plugin directory ------------------------------

/// `libdir <doubles>` in `/etc/criu/default.conf` (put back as it was when the test ends, also
/// on a panic), nothing in the environment: CRIU loads the cuda double for runc.v2 and plain
/// runc, never for gpusnap's shim or gpusnap-runc, which still load the other double.
#[test]
fn a_libdir_in_criu_default_config_does_not_bring_the_cuda_plugin_back() -> Result<()> {
    let _config = CRIU_CONFIG.write().unwrap_or_else(|e| e.into_inner());
    gpusnap_testkit::require_root();
    let mut failures = Vec::new();
    {
        let d = Doubles::build()?;
        let _conf = CriuConfigFile::replace(
            Path::new(CRIU_DEFAULT_CONF),
            &format!(
                "# written by gpusnap's tests (criu_plugin.rs); removed when the test ends\nlibdir {}\n",
                d.plugins.display()
            ),
        )?;
        let cases: [(&str, &DoorRun, bool); 4] = [
            ("ctr, runc.v2", &|d| conf_ctr(d, Runtime::RuncV2), true),
            (
                "ctr, gpusnap shim",
                &|d| conf_ctr(d, Runtime::Gpusnap),
                false,
            ),
            ("plain runc", &|d| conf_runc(d, false), true),
            ("gpusnap-runc", &|d| conf_runc(d, true), false),
        ];
        for (door, case, control) in cases {
            let _ = fs::remove_file(&d.log);
            let checked = case(&d).and_then(|()| {
                if control {
                    d.check_cuda_plugin_ran(door)
                } else {
                    d.check_only_other_plugin_ran(door)
                }
            });
            if let Err(e) = checked {
                failures.push(format!("{door}: {e:#}"));
            }
        }
    }
    ensure!(
        failures.is_empty(),
        "with libdir in {CRIU_DEFAULT_CONF}:\n{}",
        failures.join("\n")
    );
    Ok(())
}

/// One door's checkpoint and restore with the doubles.
type DoorRun = dyn Fn(&Doubles) -> Result<()>;

fn conf_ctr(d: &Doubles, rt: Runtime) -> Result<()> {
    let rig = Rig::start_with(RigOptions {
        require_gpusnap: rt == Runtime::Gpusnap,
        containerd_env: d.log_env(),
        ..Default::default()
    })?;
    checkpoint_and_restore(&rig, rt, "conf")
}

fn conf_runc(d: &Doubles, gpusnap: bool) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("gpusnap-plugconf-")
        .tempdir_in("/tmp")?;
    let config = gpusnap_runc_config(dir.path())?;
    let mut env = d.log_env();
    env.push(("PATH".into(), path_with_rig_criu()));
    env.push(("GPUSNAP_CONFIG".into(), config.display().to_string()));
    runc_checkpoint_and_restore(gpusnap, dir.path(), &env)
}
