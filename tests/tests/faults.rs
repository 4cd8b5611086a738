//! Fault injection through the real doors: SIGKILL of CRIU, runc, the shim or gpusnap-runc at
//! each phase of a checkpoint, and CRIU stalling or crashing mid-restore. Afterwards the
//! workload is either running, thawed and reported RUNNING (pause and resume work), or stopped
//! and reported so; no runc state, frozen cgroup, rootfs mount or unsealed image is left.
//!
//! The runtimes stop at the transaction's failpoints (compiled into test builds; see
//! `gpusnap_testkit::faults`); CRIU and runc are found by what they run and killed mid-dump.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gpusnap_testkit::busybox_registry::{publish_archive, registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::checkpoint::read_in_task;
use gpusnap_testkit::faults::{self, point, Failpoints, RestoreFault};
use gpusnap_testkit::signing::CriSigNode;
use gpusnap_testkit::{
    binary, require_root, rig_bin_dir, unique, wait_some, wait_until, BusyboxContainer, OutputExt,
    Rig, RigOptions, Runtime, Spawned, TaskState,
};

/// A workload with a few hundred MiB of memory, so that a dump lasts long enough to be
/// interrupted in the middle; `/tmp/ready` appears once the memory is in place.
const BIG: &str = "x=$(busybox head -c 150000000 /dev/zero | busybox tr '\\0' a); \
                   busybox touch /tmp/ready; while true; do busybox sleep 1; done";

fn config(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("gpusnap.toml");
    std::fs::write(
        &p,
        format!(
            "[criu]\nbinary_dir = \"{}\"\n{extra}",
            rig_bin_dir().display()
        ),
    )
    .unwrap();
    p
}

struct Case {
    rig: Rig,
    fp: Failpoints,
    _dir: tempfile::TempDir,
}

fn rig_with(extra_config: &str, criu_dir: Option<&Path>) -> Result<Case> {
    require_root();
    let dir = tempfile::tempdir()?;
    let cfg = match criu_dir {
        Some(d) => {
            let p = dir.path().join("gpusnap.toml");
            std::fs::write(
                &p,
                format!("[criu]\nbinary_dir = \"{}\"\n{extra_config}", d.display()),
            )?;
            p
        }
        None => config(dir.path(), extra_config),
    };
    let fp = Failpoints::new()?;
    let rig = Rig::start_with(RigOptions {
        require_gpusnap: true,
        containerd_env: vec![
            fp.env(),
            ("GPUSNAP_CONFIG".into(), cfg.display().to_string()),
        ],
        ..RigOptions::default()
    })?;
    Ok(Case { rig, fp, _dir: dir })
}

/// A workload with little memory (a dump of a fraction of a second).
const SMALL: &str = "busybox touch /tmp/ready; while true; do busybox sleep 1; done";

fn start_big(rig: &Rig, id: &str) -> Result<PathBuf> {
    start_workload(rig, id, BIG)
}

fn start_workload(rig: &Rig, id: &str, script: &str) -> Result<PathBuf> {
    rig.run_detached(Runtime::Gpusnap, id, &["sh", "-c", script])?;
    ensure!(
        wait_until(Duration::from_secs(60), || read_in_task(
            rig,
            id,
            "/tmp/ready"
        )
        .is_some()),
        "{id} never got its memory"
    );
    faults::cgroup_of_runc_state(&rig.runc_root(), id).context("the container's cgroup")
}

fn ctr_checkpoint(rig: &Rig, id: &str, image_dir: &Path, exit: bool) -> Result<Spawned> {
    let mut args = vec!["tasks", "checkpoint"];
    if exit {
        args.push("--exit");
    }
    let img = image_dir.to_str().unwrap();
    args.extend(["--image-path", img, id]);
    Spawned::spawn(rig.ctr_command(&args), None)
}

/// What containerd reports matches the cgroup, pause and resume work, and nothing of a
/// checkpoint is left; returns the state the task ended in.
fn assert_truth(rig: &Rig, id: &str, cgroup: &Path, image_dir: &Path) -> Result<TaskState> {
    let bundle = rig.bundle_dir(id);
    let state = rig.task_state(id)?;
    match state {
        Some(TaskState::Running) => {
            ensure!(
                faults::frozen(cgroup) == Some(false),
                "{id} is reported RUNNING but its cgroup is frozen"
            );
            rig.pause(id)?;
            ensure!(rig.task_state(id)? == Some(TaskState::Paused));
            ensure!(faults::frozen(cgroup) == Some(true), "pause did not freeze");
            rig.resume(id)?;
            ensure!(rig.task_state(id)? == Some(TaskState::Running));
            ensure!(faults::frozen(cgroup) == Some(false), "resume did not thaw");
        }
        Some(TaskState::Paused) => bail!("{id} is left PAUSED: the caller had it running"),
        Some(TaskState::Stopped) | None => {
            // A stopped task of a live shim keeps its runc state until it is deleted.
            if state.is_some() {
                let _ = rig.delete_task(id);
            }
            // containerd runs the dead shim's `shim delete` on its own time, and unmounts the
            // bundle's rootfs after it: wait for the whole cleanup, then check every part of it.
            wait_until(Duration::from_secs(60), || {
                !rig.runc_root().join(id).exists()
                    && !faults::mounted(&bundle.join("rootfs"))
                    && (faults::sealed(image_dir)
                        || faults::assert_no_unsealed_images(image_dir).is_ok())
            });
            ensure!(
                !rig.runc_root().join(id).exists(),
                "runc state of stopped {id} left"
            );
            ensure!(
                faults::frozen(cgroup) != Some(true),
                "frozen cgroup of {id} left"
            );
            ensure!(
                faults::cgroup_pids(cgroup).is_empty(),
                "processes of stopped {id} left in {}",
                cgroup.display()
            );
            ensure!(
                !faults::mounted(&bundle.join("rootfs")),
                "rootfs of {id} left mounted"
            );
        }
        Some(other) => bail!("{id} is {other:?}"),
    }
    if !faults::sealed(image_dir) {
        faults::assert_no_unsealed_images(image_dir)?;
    }
    Ok(state.unwrap_or(TaskState::Stopped))
}

/// The shim dies: containerd reports the task stopped (its `shim delete` ran).
fn wait_stopped(rig: &Rig, id: &str) -> Result<()> {
    ensure!(
        wait_until(Duration::from_secs(90), || matches!(
            rig.task_state(id),
            Ok(Some(TaskState::Stopped) | None)
        )),
        "{id} not reported stopped after its shim was killed: {:?}",
        rig.task_state(id)
    );
    Ok(())
}

fn shim_pid_of_runc(id: &str) -> Result<u32> {
    let runc = faults::runc_of("checkpoint", id).context("runc checkpoint not running")?;
    Ok(runc.ppid)
}

// ----- ctr (the shim) ------------------------------------------------------------------

#[test]
fn ctr_shim_killed_before_the_dump_and_at_seal() -> Result<()> {
    let c = rig_with("", None)?;
    for (phase, exit) in [(point::BEFORE_DUMP, true), (point::BEFORE_SEAL, false)] {
        let id = unique("fault-shim");
        let cgroup = start_big(&c.rig, &id)?;
        let img = c.rig.dir().join(format!("img-{id}"));
        c.fp.arm(phase)?;
        let ctr = ctr_checkpoint(&c.rig, &id, &img, exit)?;
        let shim = c.fp.wait_reached(phase, Duration::from_secs(60))?;
        faults::kill9(shim);
        let out = ctr.wait_timeout(Duration::from_secs(60))?;
        ensure!(
            !out.status.success(),
            "checkpoint succeeded with its shim killed"
        );
        wait_stopped(&c.rig, &id)?;
        assert_truth(&c.rig, &id, &cgroup, &img).with_context(|| phase.to_string())?;
        ensure!(!faults::sealed(&img));
    }
    Ok(())
}

#[test]
fn ctr_shim_killed_mid_dump() -> Result<()> {
    let c = rig_with("", None)?;
    let id = unique("fault-shim-dump");
    let cgroup = start_big(&c.rig, &id)?;
    let img = c.rig.dir().join("img");
    let ctr = ctr_checkpoint(&c.rig, &id, &img, false)?;
    faults::wait_mid_dump(&id, &img, Duration::from_secs(60))?;
    faults::kill9(shim_pid_of_runc(&id)?);
    let _ = ctr.wait_timeout(Duration::from_secs(60))?;
    wait_stopped(&c.rig, &id)?;
    // The orphaned runc and CRIU may finish their dump: nothing may look complete or stay.
    ensure!(
        wait_until(Duration::from_secs(30), || faults::criu_of(
            "checkpoint",
            &id
        )
        .is_none()),
        "the orphaned CRIU of {id} still runs; containerd log:\n{}",
        c.rig.log_tail(40)
    );
    assert_truth(&c.rig, &id, &cgroup, &img)?;
    ensure!(
        !faults::sealed(&img),
        "a checkpoint the shim never sealed looks complete"
    );
    Ok(())
}

#[test]
fn ctr_criu_or_runc_killed_mid_dump_leaves_it_running() -> Result<()> {
    let c = rig_with("", None)?;
    for (victim, exit) in [("criu", false), ("runc", false), ("criu", true)] {
        let id = unique("fault-dump");
        let cgroup = start_big(&c.rig, &id)?;
        let img = c.rig.dir().join(format!("img-{id}"));
        let ctr = ctr_checkpoint(&c.rig, &id, &img, exit)?;
        let criu = faults::wait_mid_dump(&id, &img, Duration::from_secs(60))?;
        faults::kill9(if victim == "criu" {
            criu.pid
        } else {
            criu.ppid
        });
        let out = ctr.wait_timeout(Duration::from_secs(120))?;
        ensure!(
            !out.status.success(),
            "checkpoint succeeded with {victim} killed"
        );
        let state = assert_truth(&c.rig, &id, &cgroup, &img)
            .with_context(|| format!("{victim} killed, exit {exit}"))?;
        // CRIU killed while its parasite code runs inside a task can kill that task: then it
        // is stopped and reported so. Otherwise it answers.
        if state == TaskState::Running {
            ensure!(
                read_in_task(&c.rig, &id, "/tmp/ready").is_some(),
                "{id} does not answer"
            );
        } else {
            ensure!(victim == "criu", "runc killed mid-dump stopped {id}");
        }
    }
    Ok(())
}

/// runc killed at seal: CRIU has finished the dump (leave-running and `--exit`) and runc is
/// killed before it returns. Nothing is sealed, the images are removed, and the task runs,
/// thawed and reported RUNNING.
#[test]
fn ctr_runc_killed_at_seal() -> Result<()> {
    require_root();
    let wrappers = tempfile::tempdir()?;
    let bin = faults::criu_wrapper(
        wrappers.path(),
        &faults::real_criu(),
        RestoreFault::StopRuncAfterDump,
    )?;
    let c = rig_with("", Some(&bin))?;
    for exit in [false, true] {
        let id = unique("fault-runc-seal");
        let cgroup = start_workload(&c.rig, &id, SMALL)?;
        let img = c.rig.dir().join(format!("img-{id}"));
        let ctr = ctr_checkpoint(&c.rig, &id, &img, exit)?;
        let runc = faults::wait_wrapper_hit(&bin, Duration::from_secs(60))?;
        ensure!(
            img.join("inventory.img").is_file(),
            "runc stopped before the dump finished"
        );
        faults::kill9(runc);
        let out = ctr.wait_timeout(Duration::from_secs(60))?;
        ensure!(
            !out.status.success(),
            "checkpoint succeeded with runc killed at seal"
        );
        let state =
            assert_truth(&c.rig, &id, &cgroup, &img).with_context(|| format!("exit {exit}"))?;
        ensure!(
            state == TaskState::Running,
            "exit {exit}: {id} is {state:?}"
        );
        ensure!(!faults::sealed(&img), "exit {exit}: sealed without runc");
        ensure!(
            read_in_task(&c.rig, &id, "/tmp/ready").is_some(),
            "{id} does not answer"
        );
    }
    Ok(())
}

/// The shim is killed while CRIU restores (stalled once it has forked the tree, so that the
/// kill lands mid-restore): containerd's `shim delete` kills the orphaned runc, CRIU and
/// restored tree; the task is reported stopped, with no runc state, process, cgroup or rootfs
/// mount left.
#[test]
fn ctr_shim_killed_mid_restore() -> Result<()> {
    require_root();
    let wrappers = tempfile::tempdir()?;
    let bin = faults::criu_wrapper(wrappers.path(), &faults::real_criu(), RestoreFault::Stall)?;
    let c = rig_with("", Some(&bin))?;
    let id = unique("fault-shim-rst");
    c.rig
        .run_detached(Runtime::Gpusnap, &id, &["sh", "-c", "sleep 100000"])?;
    let reference = format!("localhost/faults/{id}:1");
    gpusnap_testkit::checkpoint::container_checkpoint_ok(&c.rig, &id, &reference, false)?;
    gpusnap_testkit::checkpoint::kill_and_remove(&c.rig, &id)?;
    let restored = unique("fault-shim-rsd");
    let ctr = Spawned::spawn(
        c.rig
            .ctr_command(&["containers", "restore", "--live", &restored, &reference]),
        None,
    )?;
    let criu = faults::wait_wrapper_hit(&bin, Duration::from_secs(60))?;
    let runc = faults::runc_of("restore", &restored).context("runc restore not running")?;
    faults::kill9(runc.ppid);
    let out = ctr.wait_timeout(Duration::from_secs(60))?;
    ensure!(
        !out.status.success(),
        "restore succeeded with its shim killed"
    );
    wait_stopped(&c.rig, &restored)?;
    let bundle = c.rig.bundle_dir(&restored);
    let cg = PathBuf::from("/sys/fs/cgroup/freezer")
        .join(c.rig.namespace())
        .join(&restored);
    wait_until(Duration::from_secs(60), || {
        !faults::alive(criu)
            && faults::runc_of("restore", &restored).is_none()
            && !c.rig.runc_root().join(&restored).exists()
            && !faults::mounted(&bundle.join("rootfs"))
    });
    ensure!(
        !faults::alive(criu),
        "the restore's CRIU (pid {criu}) is left; containerd log:\n{}",
        c.rig.log_tail(40)
    );
    ensure!(
        faults::runc_of("restore", &restored).is_none(),
        "the orphaned runc restore is left"
    );
    ensure!(
        !c.rig.runc_root().join(&restored).exists(),
        "runc state of {restored} left: {:?}; containerd log:\n{}",
        std::fs::read_dir(c.rig.runc_root().join(&restored))
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>()),
        c.rig.log_tail(30)
    );
    ensure!(
        faults::cgroup_pids(&cg).is_empty(),
        "processes left in {}",
        cg.display()
    );
    ensure!(
        faults::frozen(&cg) != Some(true),
        "frozen cgroup of {restored} left"
    );
    ensure!(
        !faults::mounted(&bundle.join("rootfs")),
        "rootfs of {restored} left mounted"
    );
    Ok(())
}

/// CRIU stalls mid-restore (a real CRIU, stopped once it forked the tree): the restore
/// returns within its deadline, nothing of the checkpoint runs, and the error says so.
#[test]
fn ctr_restore_deadline_and_crash() -> Result<()> {
    require_root();
    let wrappers = tempfile::tempdir()?;
    for fault in [RestoreFault::Stall, RestoreFault::Crash] {
        let bin = faults::criu_wrapper(
            &wrappers.path().join(format!("{fault:?}")),
            &faults::real_criu(),
            fault,
        )?;
        let c = rig_with("[restore]\ndeadline_seconds = 5\n", Some(&bin))?;
        let id = unique("fault-restore");
        c.rig
            .run_detached(Runtime::Gpusnap, &id, &["sh", "-c", "sleep 100000"])?;
        let reference = format!("localhost/faults/{id}:1");
        gpusnap_testkit::checkpoint::container_checkpoint_ok(&c.rig, &id, &reference, false)?;
        gpusnap_testkit::checkpoint::kill_and_remove(&c.rig, &id)?;
        let restored = unique("fault-restored");
        let t = Instant::now();
        let out = c
            .rig
            .ctr_command(&["containers", "restore", "--live", &restored, &reference])
            .stdin(Stdio::null())
            .output()?;
        let took = t.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        let running = c.rig.task_state(&restored)?;
        ensure!(
            !matches!(running, Some(TaskState::Running | TaskState::Paused)),
            "{fault:?}: the restored task runs: {running:?}\n{err}"
        );
        ensure!(
            took < Duration::from_secs(60),
            "{fault:?}: restore took {took:?}"
        );
        ensure!(
            err.contains("nothing of the checkpoint is running"),
            "{fault:?}: the error does not say what was left:\n{err}"
        );
        if fault == RestoreFault::Stall {
            ensure!(err.contains("did not finish within 5s"), "{err}");
        }
        // Nothing of the checkpoint runs anywhere: no process runs the workload's command
        // below the rig's runc root, and runc knows no such container.
        let left = c.rig.runc_root().join(&restored);
        ensure!(
            !left.join("state.json").exists(),
            "{fault:?}: runc state left: {:?}\n{err}",
            std::fs::read_dir(&left)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
        let cg = PathBuf::from("/sys/fs/cgroup/freezer")
            .join(c.rig.namespace())
            .join(&restored);
        ensure!(
            faults::cgroup_pids(&cg).is_empty(),
            "{fault:?}: processes left in {}",
            cg.display()
        );
        ensure!(
            faults::runc_of("restore", &restored).is_none(),
            "{fault:?}: runc restore is left running"
        );
    }
    Ok(())
}

// ----- CRI: a checkpoint archive, gpusnap.io/restore-from ---------------------------------

/// CRIU stalls restoring through containerd's CRI: `crictl start` of a container created from
/// a checkpoint archive, and of one in a pod annotated `gpusnap.io/restore-from`, fails within
/// the node's deadline (5 s) with an error saying what was left; the stalled CRIU is gone and
/// no process of the checkpoint (its run token) runs anywhere.
#[test]
fn cri_restore_deadline_through_the_archive_and_restore_from() -> Result<()> {
    require_root();
    let wrappers = tempfile::tempdir()?;
    let bin = faults::criu_wrapper(wrappers.path(), &faults::real_criu(), RestoreFault::Stall)?;
    let reg = registry_with_busybox()?;
    // Appended inside the node config's `[restore]` table.
    let node = CriSigNode::start_with_config(
        &reg.host(),
        &reg.image(BUSYBOX_REPO),
        &format!(
            "deadline_seconds = 5\n\n[criu]\nbinary_dir = {:?}\n",
            bin.display().to_string()
        ),
    )?;
    let work = tempfile::tempdir()?;
    let w = node.run_counter(&unique("deadline-a"))?;
    let archive = work.path().join("ck.tar");
    let count = node.checkpoint(&w, &archive)?;
    node.crictl.remove_pod(&w.pod)?;
    let name = "ck-deadline";
    publish_archive(&reg, &archive, "gpusnap/ck-deadline:1", work.path())?;
    let pulled = gpusnap_testkit::gpusnap([
        "--config",
        node.node.config_path().to_str().unwrap(),
        "image",
        "pull",
        &reg.url("gpusnap/ck-deadline:1"),
        "--extract",
        name,
    ]);
    ensure!(
        pulled.status.success(),
        "gpusnap image pull --extract: {}",
        gpusnap_testkit::describe(&pulled)
    );
    let archive = archive.to_str().unwrap().to_string();
    for (door, image, annotations) in [
        ("archive", archive.as_str(), vec![]),
        (
            "restore-from",
            node.busybox.as_str(),
            vec![("gpusnap.io/restore-from", name)],
        ),
    ] {
        let t = Instant::now();
        let err = node
            .restore(&unique(door), image, &annotations, &count)?
            .refusal()
            .with_context(|| door.to_string())?;
        let took = t.elapsed();
        ensure!(took < Duration::from_secs(60), "{door}: took {took:?}");
        ensure!(err.contains("did not finish within 5s"), "{door}: {err}");
        ensure!(
            err.contains("nothing of the checkpoint is running"),
            "{door}: the error does not say what was left: {err}"
        );
        let criu = faults::wait_wrapper_hit(&bin, Duration::from_secs(5))
            .with_context(|| format!("{door}: CRIU never stalled"))?;
        ensure!(!faults::alive(criu), "{door}: the stalled CRIU is left");
        let runs: Vec<u32> = faults::processes()
            .into_iter()
            .filter(|p| p.cmdline.iter().any(|a| a == &node.run))
            .map(|p| p.pid)
            .collect();
        ensure!(
            runs.is_empty(),
            "{door}: the checkpoint's processes {runs:?} run"
        );
    }
    Ok(())
}

// ----- gpusnap-runc --------------------------------------------------------------------

fn wrapper_spawn(c: &BusyboxContainer, args: &[&str], env: &[(String, String)]) -> Result<Spawned> {
    let mut cmd = Command::new(binary("gpusnap-runc"));
    cmd.args(c.root_args()).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Spawned::spawn(cmd, None)
}

fn runc_cgroup(c: &BusyboxContainer) -> Result<PathBuf> {
    faults::cgroup_of_runc_state(&c.runc_root, &c.id).context("cgroup of the container")
}

/// After the fault, `gpusnap-runc state` (what CRI-O and Podman call next) repairs the
/// container: running, thawed, no unsealed image, no record of the interrupted checkpoint.
fn assert_repaired(
    c: &BusyboxContainer,
    env: &[(String, String)],
    cgroup: &Path,
    img: &Path,
) -> Result<()> {
    let mut state = Command::new(binary("gpusnap-runc"));
    state
        .args(c.root_args())
        .args(["state", &c.id])
        .stdin(Stdio::null());
    for (k, v) in env {
        state.env(k, v);
    }
    let out = state.output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(v["status"] == "running", "state after the fault: {v}");
    ensure!(faults::frozen(cgroup) == Some(false), "cgroup left frozen");
    ensure!(
        !c.runc_root
            .join(&c.id)
            .join(gpusnap_transaction::inflight::INFLIGHT_FILE)
            .exists(),
        "the interrupted checkpoint's record is left"
    );
    if !faults::sealed(img) {
        faults::assert_no_unsealed_images(img)?;
    }
    // pause and resume work.
    for (cmd, want) in [("pause", "paused"), ("resume", "running")] {
        let s = c.runc().args([cmd, &c.id]).status()?;
        ensure!(s.success(), "runc {cmd}");
        ensure!(c.status().as_deref() == Some(want));
    }
    Ok(())
}

#[test]
fn gpusnap_runc_killed_before_the_dump_and_at_seal() -> Result<()> {
    require_root();
    let dir = tempfile::tempdir()?;
    let fp = Failpoints::new()?;
    let cfg = config(dir.path(), "");
    let env = vec![
        fp.env(),
        ("GPUSNAP_CONFIG".into(), cfg.display().to_string()),
    ];
    for (phase, leave_running) in [
        (point::BEFORE_DUMP, false),
        (point::BEFORE_DUMP, true),
        (point::BEFORE_SEAL, false),
        (point::AFTER_SEAL, false),
    ] {
        let c = BusyboxContainer::create(dir.path(), &unique("fault-gsr"), BIG);
        c.start();
        ensure!(wait_until(Duration::from_secs(60), || c
            .read_file("tmp/ready")
            .is_some()));
        let cgroup = runc_cgroup(&c)?;
        let img = dir.path().join(format!("img-{}", c.id));
        fp.arm(phase)?;
        let mut args = vec!["checkpoint", "--image-path", img.to_str().unwrap()];
        if leave_running {
            args.push("--leave-running");
        }
        args.push(&c.id);
        let w = wrapper_spawn(&c, &args, &env)?;
        let pid = fp.wait_reached(phase, Duration::from_secs(60))?;
        faults::kill9(pid);
        let _ = w.wait_timeout(Duration::from_secs(30))?;
        assert_repaired(&c, &env, &cgroup, &img)
            .with_context(|| format!("{phase}, leave-running {leave_running}"))?;
        if phase == point::AFTER_SEAL {
            ensure!(faults::sealed(&img), "a sealed checkpoint was removed");
        }
    }
    Ok(())
}

#[test]
fn gpusnap_runc_criu_killed_mid_dump() -> Result<()> {
    require_root();
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path(), "");
    let env = vec![("GPUSNAP_CONFIG".to_string(), cfg.display().to_string())];
    let c = BusyboxContainer::create(dir.path(), &unique("fault-gsr-criu"), BIG);
    c.start();
    ensure!(wait_until(Duration::from_secs(60), || c
        .read_file("tmp/ready")
        .is_some()));
    let cgroup = runc_cgroup(&c)?;
    let img = dir.path().join("img");
    let w = wrapper_spawn(
        &c,
        &["checkpoint", "--image-path", img.to_str().unwrap(), &c.id],
        &env,
    )?;
    let criu = match faults::wait_mid_dump(&c.id, &img, Duration::from_secs(60)) {
        Ok(p) => p,
        Err(e) => {
            let out = w.wait_timeout(Duration::from_secs(60))?;
            bail!(
                "{e:#}; gpusnap-runc: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    faults::kill9(criu.pid);
    let out = w.wait_timeout(Duration::from_secs(60))?;
    ensure!(!out.status.success());
    // CRIU killed while its parasite code runs inside a task can kill that task: then it is
    // stopped and reported so, with nothing frozen or unsealed left.
    if c.status().as_deref() == Some("stopped") {
        ensure!(
            faults::frozen(&cgroup) != Some(true),
            "stopped, cgroup left frozen"
        );
        return faults::assert_no_unsealed_images(&img);
    }
    assert_repaired(&c, &env, &cgroup, &img)
}

/// gpusnap-runc killed while CRIU restores (stalled once it has forked the tree): its restore
/// guard, or the next gpusnap-runc call naming the container (what CRI-O and Podman run next),
/// kills the orphaned runc, CRIU and restored tree and removes runc's state: the container is
/// stopped and runc says so.
#[test]
fn gpusnap_runc_killed_mid_restore() -> Result<()> {
    require_root();
    let dir = tempfile::tempdir()?;
    let bin = faults::criu_wrapper(
        &dir.path().join("criu-stall"),
        &faults::real_criu(),
        RestoreFault::Stall,
    )?;
    let cfg = dir.path().join("cfg.toml");
    std::fs::write(
        &cfg,
        format!("[criu]\nbinary_dir = \"{}\"\n", bin.display()),
    )?;
    let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
    let c = BusyboxContainer::create(dir.path(), &unique("fault-gsr-kr"), "sleep 100000");
    c.start();
    let cgroup = runc_cgroup(&c)?;
    let img = dir.path().join("img");
    let (code, _, err) = c.wrapper(
        &["checkpoint", "--image-path", img.to_str().unwrap(), &c.id],
        &env,
        dir.path(),
    );
    ensure!(code == 0, "checkpoint: {err}");
    let work = dir.path().join("restore-work");
    std::fs::create_dir_all(&work)?;
    let mut restore = Command::new(binary("gpusnap-runc"));
    restore
        .args(c.root_args())
        .args(["restore", "-d", "--image-path"])
        .arg(&img)
        .arg("--work-path")
        .arg(&work)
        .arg("--bundle")
        .arg(&c.bundle)
        .arg(&c.id)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.path().join("restore.out"))?)
        .stderr(std::fs::File::create(dir.path().join("restore.err"))?);
    let mut wrapper = restore.spawn()?;
    let criu = faults::wait_wrapper_hit(&bin, Duration::from_secs(60))?;
    faults::kill9(wrapper.id());
    let _ = wrapper.wait();
    // The restore guard repairs the moment gpusnap-runc is dead, and the next call naming the
    // container repairs what the guard has not yet reached: which of the two gets there first
    // is the scheduler's, so the stalled CRIU may already be gone here. Either way, what
    // follows must hold.
    println!(
        "after the kill, the stalled CRIU was {}",
        if faults::alive(criu) {
            "still there"
        } else {
            "already killed by the guard"
        }
    );
    // What CRI-O and Podman run next names the container.
    let (code, out, _) = c.wrapper(&["state", &c.id], &env, dir.path());
    ensure!(code != 0, "runc still reports the container: {out}");
    ensure!(
        !faults::alive(criu),
        "the restore's CRIU (pid {criu}) is left"
    );
    // runc exits once its CRIU is killed, on its own time.
    ensure!(
        wait_until(Duration::from_secs(10), || faults::runc_of(
            "restore", &c.id
        )
        .is_none()),
        "the orphaned runc restore is left"
    );
    ensure!(c.status().is_none(), "runc still knows the container");
    // runc killed mid-restore leaves its directory of the id, with a bind mount of the rootfs
    // (`criu-root`) in it.
    ensure!(
        !c.runc_root.join(&c.id).exists(),
        "runc's directory of the container is left: {:?}",
        std::fs::read_dir(c.runc_root.join(&c.id))
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    ensure!(
        faults::cgroup_pids(&cgroup).is_empty(),
        "processes left in {}",
        cgroup.display()
    );
    Ok(())
}

/// gpusnap-runc restore, detached and in the foreground, with CRIU stalling or crashing
/// mid-restore: it returns within the deadline, nothing runs, runc knows no container.
#[test]
fn gpusnap_runc_restore_deadline_and_crash() -> Result<()> {
    require_root();
    let dir = tempfile::tempdir()?;
    for (fault, detach) in [
        (RestoreFault::Stall, true),
        (RestoreFault::Stall, false),
        (RestoreFault::Crash, true),
    ] {
        let bin = faults::criu_wrapper(
            &dir.path().join(format!("criu-{fault:?}-{detach}")),
            &faults::real_criu(),
            fault,
        )?;
        let cfg = dir.path().join(format!("cfg-{fault:?}-{detach}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[criu]\nbinary_dir = \"{}\"\n[restore]\ndeadline_seconds = 5\n",
                bin.display()
            ),
        )?;
        let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
        let c = BusyboxContainer::create(dir.path(), &unique("fault-gsr-rst"), "sleep 100000");
        c.start();
        let img = dir.path().join(format!("img-{}", c.id));
        let (code, _, err) = c.wrapper(
            &["checkpoint", "--image-path", img.to_str().unwrap(), &c.id],
            &env,
            dir.path(),
        );
        ensure!(code == 0, "checkpoint: {err}");
        let t = Instant::now();
        let (code, _, err) = if detach {
            c.wrapper_restore(&img, &env, dir.path())
        } else {
            let work = dir.path().join(format!("work-{}", c.id));
            std::fs::create_dir_all(&work)?;
            c.wrapper(
                &[
                    "restore",
                    "--image-path",
                    img.to_str().unwrap(),
                    "--work-path",
                    work.to_str().unwrap(),
                    "--bundle",
                    c.bundle.to_str().unwrap(),
                    &c.id,
                ],
                &env,
                dir.path(),
            )
        };
        let took = t.elapsed();
        let what = format!("{fault:?}, detach {detach}");
        ensure!(code != 0, "{what}: restore succeeded");
        ensure!(took < Duration::from_secs(60), "{what}: took {took:?}");
        ensure!(
            err.contains("nothing of the checkpoint is running"),
            "{what}: {err}"
        );
        if fault == RestoreFault::Stall {
            ensure!(err.contains("did not finish within 5s"), "{what}: {err}");
        }
        ensure!(
            c.status().is_none(),
            "{what}: runc still knows the container"
        );
        let cg = faults::cgroup_of_runc_state(&c.runc_root, &c.id);
        ensure!(cg.is_none(), "{what}: runc state left");
        ensure!(
            wait_some(Duration::from_secs(1), || faults::runc_of("restore", &c.id)).is_none(),
            "{what}: runc restore still running"
        );
    }
    Ok(())
}

// ----- the kill matrix: every restore door × the process killed × the phase ------------------

/// Where in a restore the matrix kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// The front end is stopped before it runs runc (failpoint `restore-before-criu`).
    BeforeRunc,
    /// CRIU is held at its pre-restore script: its cgroup yard is mounted in its work
    /// directory, in the host's mount namespace.
    CriuRunning,
    /// CRIU is held at post-setup-namespaces: the restored mounts are under its mount yard,
    /// an 0777 directory in /tmp.
    RestoringMounts,
    /// runc has returned and the container runs; the front end has not reported yet (it would
    /// restore the CUDA state next: failpoint `restore-after-criu`).
    AfterCriu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    Criu,
    Runc,
    /// The shim, or gpusnap-runc.
    FrontEnd,
}

/// The cases of every door: each process that exists at each phase.
const MATRIX: [(At, Victim); 8] = [
    (At::BeforeRunc, Victim::FrontEnd),
    (At::CriuRunning, Victim::Criu),
    (At::CriuRunning, Victim::Runc),
    (At::CriuRunning, Victim::FrontEnd),
    (At::RestoringMounts, Victim::Criu),
    (At::RestoringMounts, Victim::Runc),
    (At::RestoringMounts, Victim::FrontEnd),
    (At::AfterCriu, Victim::FrontEnd),
];

/// The workload every door checkpoints: it writes nothing (so restoring it needs no rootfs
/// diff) and carries the door's run token in its command line, so that any process of the
/// checkpoint can be found anywhere on the host.
const QUIET: &str = "while true; do sleep 1; done";

/// A restore door, as the matrix drives it.
trait Door {
    fn name(&self) -> &'static str;
    /// The front end's name in the table.
    fn front_end(&self) -> &'static str;
    fn failpoints(&self) -> &Failpoints;
    fn phases(&self) -> &faults::CriuPhases;
    /// The token in the checkpointed workload's command line.
    fn token(&self) -> &str;
    /// Starts a restore of the door's checkpoint into a new container `id`; the client runs
    /// until the restore succeeded or failed.
    fn start_restore(&self, id: &str) -> Result<Spawned>;
    /// How containerd reports container `id`: `None` when it has no task.
    fn state(&self, id: &str) -> Option<String>;
    /// The processes in container `id`'s cgroup.
    fn cgroup_pids(&self, id: &str) -> Vec<u32>;
    fn runc_state(&self, id: &str) -> PathBuf;
    fn bundle(&self, id: &str) -> PathBuf;
    /// Deletes container `id` (and its pod) as its user would after the failure.
    fn remove(&self, id: &str);
    /// The directory below which mounts are the door's own (its containerd's).
    fn own_dir(&self) -> PathBuf;
}

/// Runs every case of [`MATRIX`] on `door`, prints the door's table and fails naming every
/// case that left something.
fn kill_matrix(door: &dyn Door) -> Result<()> {
    let mut rows = Vec::new();
    for (at, victim) in MATRIX {
        let outcome = kill_case(door, at, victim);
        let row = format!(
            "| {} | {} | {at:?} | {} |",
            door.name(),
            match victim {
                Victim::FrontEnd => door.front_end(),
                Victim::Criu => "CRIU",
                Victim::Runc => "runc",
            },
            match &outcome {
                Ok(()) => "nothing".to_string(),
                Err(e) => format!("{e:#}").replace('\n', " "),
            }
        );
        eprintln!("{row}");
        rows.push((row, outcome.is_ok()));
    }
    let failed: Vec<&String> = rows.iter().filter(|(_, ok)| !ok).map(|(r, _)| r).collect();
    ensure!(
        failed.is_empty(),
        "kill -9 left something behind:\n{}",
        failed
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// One case: restore, hold it at `at`, SIGKILL `victim`, and check what is left once the
/// client returned and containerd cleaned up: no process of the checkpoint anywhere, no runc
/// state, none of CRIU's yards (the ones it had set up at the phase are named), no new CRIU
/// directory in /tmp, no new mount of the door's or CRIU's, containerd not reporting the
/// container running and its cgroup empty; then the container is deleted and its bundle must
/// go (containerd cannot remove a bundle with CRIU's yard mounted in it).
fn kill_case(door: &dyn Door, at: At, victim: Victim) -> Result<()> {
    let id = unique("km");
    let tmp_before = faults::criu_tmp_dirs();
    let mounts_before = faults::criu_or_own_mounts(&door.own_dir());
    let (fp, phases) = (door.failpoints(), door.phases());
    let arm = |on: bool| -> Result<()> {
        match at {
            At::BeforeRunc if on => fp.arm(point::BEFORE_RESTORE)?,
            At::BeforeRunc => fp.disarm(point::BEFORE_RESTORE),
            At::AfterCriu if on => fp.arm(point::AFTER_CRIU)?,
            At::AfterCriu => fp.disarm(point::AFTER_CRIU),
            At::CriuRunning if on => phases.arm(faults::criu_phase::PRE_RESTORE)?,
            At::CriuRunning => phases.disarm(faults::criu_phase::PRE_RESTORE),
            At::RestoringMounts if on => phases.arm(faults::criu_phase::POST_SETUP_NAMESPACES)?,
            At::RestoringMounts => phases.disarm(faults::criu_phase::POST_SETUP_NAMESPACES),
        }
        Ok(())
    };
    arm(true)?;
    let client = door.start_restore(&id)?;
    let reached = match at {
        At::BeforeRunc => fp
            .wait_reached(point::BEFORE_RESTORE, Duration::from_secs(60))
            .map(|pid| (pid, None)),
        At::AfterCriu => fp
            .wait_reached(point::AFTER_CRIU, Duration::from_secs(60))
            .map(|pid| (pid, None)),
        At::CriuRunning => phases
            .wait_reached(faults::criu_phase::PRE_RESTORE, Duration::from_secs(60))
            .map(|h| (0, Some(h))),
        At::RestoringMounts => phases
            .wait_reached(
                faults::criu_phase::POST_SETUP_NAMESPACES,
                Duration::from_secs(60),
            )
            .map(|h| (0, Some(h))),
    };
    let (stopped, held) = match reached {
        Ok(r) => r,
        Err(e) => {
            arm(false)?;
            let out = client.wait_timeout(Duration::from_secs(120));
            door.remove(&id);
            bail!("the phase was not reached ({e:#}); the client: {out:?}");
        }
    };
    // What there is to leave at this phase (else the case would prove nothing).
    match (at, &held) {
        (At::CriuRunning, Some(h)) => ensure!(
            h.cgroup_yard.as_deref().is_some_and(faults::mounted),
            "CRIU's cgroup yard is not mounted at {at:?}: {h:?}"
        ),
        (At::RestoringMounts, Some(h)) => ensure!(
            h.mount_yard.as_deref().is_some_and(Path::is_dir),
            "CRIU's mount yard is not there at {at:?}: {h:?}"
        ),
        (At::AfterCriu, _) => ensure!(
            !faults::processes_with(door.token()).is_empty(),
            "nothing of the checkpoint runs at {at:?}"
        ),
        _ => {}
    }
    let pid = match (victim, &held) {
        (Victim::FrontEnd, None) => stopped,
        (Victim::FrontEnd, Some(h)) => h.front_end,
        (Victim::Criu, Some(h)) => h.criu,
        (Victim::Runc, Some(h)) => h.runc,
        (_, None) => bail!("no {victim:?} at {at:?}"),
    };
    faults::kill9(pid);
    let out = client.wait_timeout(Duration::from_secs(180))?;
    let said = format!("{}{}", out.stdout_str(), out.stderr_str());
    let mut left = Vec::new();
    if out.status.success() {
        left.push(format!("the restore succeeded with {victim:?} killed"));
    }
    // A CRIU killed mid-restore is noticed when it dies (by the watch, or by runc itself
    // when nothing else holds CRIU's socket), not at the deadline (60 s here).
    if victim == Victim::Criu && said.contains("did not finish within") {
        left.push(format!(
            "CRIU's death was noticed only at the deadline: {}",
            said.trim()
        ));
    }
    let bundle = door.bundle(&id);
    let lingering = || -> Vec<String> {
        let mut l = Vec::new();
        let procs = faults::processes_with(door.token());
        if !procs.is_empty() {
            l.push(format!(
                "processes of the checkpoint run: {:?}",
                procs
                    .iter()
                    .map(|p| (p.pid, p.comm.clone()))
                    .collect::<Vec<_>>()
            ));
        }
        if let Some(h) = &held {
            for (what, pid) in [("CRIU", h.criu), ("runc", h.runc)] {
                if faults::alive(pid) {
                    l.push(format!("{what} (pid {pid}) runs"));
                }
            }
            if let Some(y) = &h.cgroup_yard {
                if y.exists() || faults::mounted(y) {
                    l.push(format!("CRIU's cgroup yard {} is left", y.display()));
                }
            }
            if let Some(y) = &h.mount_yard {
                if y.exists() {
                    l.push(format!("CRIU's mount yard {} is left", y.display()));
                }
            }
        }
        if door.runc_state(&id).exists() {
            l.push(format!(
                "runc state {} is left",
                door.runc_state(&id).display()
            ));
        }
        // Other tests of this binary restore at the same time, so yards elsewhere may be
        // theirs: a held restore's own yards are checked above by name; without one, any new
        // CRIU directory in /tmp counts.
        let tmp: Vec<String> = faults::criu_tmp_dirs()
            .into_iter()
            .filter(|n| !tmp_before.contains(n))
            .collect();
        if held.is_none() && !tmp.is_empty() {
            l.push(format!("CRIU directories in /tmp: {tmp:?}"));
        }
        // CRIU's (the container's and its pod's own mounts stay until they are deleted).
        // CRIU's work directory, where its cgroup yard is mounted, is in this door's own
        // directory; another test's restore mounts its yard in its own.
        let own = door.own_dir();
        let mounts: Vec<PathBuf> = faults::criu_or_own_mounts(&own)
            .into_iter()
            .filter(|m| {
                !mounts_before.contains(m)
                    && m.starts_with(&own)
                    && m.to_string_lossy().contains("/.criu.")
            })
            .collect();
        if !mounts.is_empty() {
            l.push(format!("CRIU's mounts left in the host: {mounts:?}"));
        }
        let state = door.state(&id);
        let cgroup = door.cgroup_pids(&id);
        if state.as_deref() == Some("RUNNING") {
            l.push("containerd reports the container running".into());
        }
        if !cgroup.is_empty() {
            l.push(format!(
                "containerd reports {state:?} but pids {cgroup:?} are in its cgroup"
            ));
        }
        l
    };
    // containerd's cleanup after a dead shim, and gpusnap-runc's guard, run on their own time.
    // Once a look finds nothing, that is the answer: a second look could see a CRIU directory
    // that a concurrent test's restore has just made.
    if !wait_until(Duration::from_secs(60), || lingering().is_empty()) {
        left.extend(lingering());
    }
    door.remove(&id);
    let new_mounts = || -> Vec<PathBuf> {
        faults::criu_or_own_mounts(&door.own_dir())
            .into_iter()
            .filter(|m| !mounts_before.contains(m))
            .collect()
    };
    // Nothing mounted keeps containerd from removing the bundle (CRI leaves the bundle of a
    // pod container whose shim died, mounts or not: containerd's own doing).
    if !wait_until(Duration::from_secs(60), || new_mounts().is_empty()) {
        left.push(format!(
            "after the container was deleted, mounts are left (bundle {}): {:?}",
            bundle.display(),
            new_mounts()
        ));
    }
    if left.is_empty() {
        Ok(())
    } else {
        bail!("{}", left.join("; "))
    }
}

/// The CRIU phase wrapper, the failpoints, and a gpusnap config naming the wrapper's CRIU
/// (with a deadline long enough that only a death noticed at once is reported at once).
struct MatrixParts {
    fp: Failpoints,
    phases: faults::CriuPhases,
    config: PathBuf,
    token: String,
    dir: tempfile::TempDir,
}

impl MatrixParts {
    fn new() -> Result<MatrixParts> {
        require_root();
        let dir = tempfile::tempdir()?;
        let phases = faults::CriuPhases::install(&dir.path().join("criu"), &faults::real_criu())?;
        let config = dir.path().join("gpusnap.toml");
        std::fs::write(&config, Self::config_text(&phases))?;
        Ok(MatrixParts {
            fp: Failpoints::new()?,
            phases,
            config,
            token: gpusnap_testkit::counter::run_token(),
            dir,
        })
    }

    fn config_text(phases: &faults::CriuPhases) -> String {
        format!(
            "[criu]\nbinary_dir = \"{}\"\n[restore]\ndeadline_seconds = 60\n",
            phases.bin_dir().display()
        )
    }

    fn containerd_env(&self) -> Vec<(String, String)> {
        vec![
            self.fp.env(),
            ("GPUSNAP_CONFIG".into(), self.config.display().to_string()),
        ]
    }
}

/// `ctr containers restore --live` of a `ctr containers checkpoint --task` image, through the
/// gpusnap shim or through containerd-shim-runc-v2 with gpusnap-runc as its runc.
struct CtrDoor {
    rig: Rig,
    parts: MatrixParts,
    image: String,
    /// The checkpointed container: `ctr containers restore` creates the container from the
    /// image's spec, so every restored container has its cgroup path.
    source: String,
    runc_v2: bool,
}

impl CtrDoor {
    fn start(runc_v2: bool) -> Result<CtrDoor> {
        let parts = MatrixParts::new()?;
        let rig = Rig::start_with(RigOptions {
            require_gpusnap: true,
            containerd_env: parts.containerd_env(),
            ..RigOptions::default()
        })?;
        let id = unique("km-src");
        let (rt, extra_args) = if runc_v2 {
            (
                Runtime::RuncV2,
                vec![
                    "--runc-binary".to_string(),
                    binary("gpusnap-runc").display().to_string(),
                ],
            )
        } else {
            (Runtime::Gpusnap, Vec::new())
        };
        rig.run_detached_with(
            rt,
            &id,
            &["sh", "-c", QUIET, parts.token.as_str()],
            &gpusnap_testkit::RunOpts {
                extra_args,
                ..Default::default()
            },
        )?;
        let image = format!("localhost/faults/{id}:1");
        gpusnap_testkit::checkpoint::container_checkpoint_ok(&rig, &id, &image, false)?;
        gpusnap_testkit::checkpoint::kill_and_remove(&rig, &id)?;
        ensure!(
            wait_until(Duration::from_secs(30), || faults::processes_with(
                &parts.token
            )
            .is_empty()),
            "the checkpointed workload still runs"
        );
        Ok(CtrDoor {
            rig,
            parts,
            image,
            source: id,
            runc_v2,
        })
    }
}

impl Door for CtrDoor {
    fn name(&self) -> &'static str {
        if self.runc_v2 {
            "ctr, runc.v2 + gpusnap-runc"
        } else {
            "ctr, gpusnap shim"
        }
    }
    fn front_end(&self) -> &'static str {
        if self.runc_v2 {
            "gpusnap-runc"
        } else {
            "shim"
        }
    }
    fn failpoints(&self) -> &Failpoints {
        &self.parts.fp
    }
    fn phases(&self) -> &faults::CriuPhases {
        &self.parts.phases
    }
    fn token(&self) -> &str {
        &self.parts.token
    }
    fn start_restore(&self, id: &str) -> Result<Spawned> {
        Spawned::spawn(
            self.rig
                .ctr_command(&["containers", "restore", "--live", id, &self.image]),
            None,
        )
    }
    fn state(&self, id: &str) -> Option<String> {
        match self.rig.task_state(id).ok()? {
            Some(TaskState::Running) => Some("RUNNING".into()),
            Some(other) => Some(format!("{other:?}")),
            None => None,
        }
    }
    fn cgroup_pids(&self, _id: &str) -> Vec<u32> {
        faults::cgroup_pids(
            &PathBuf::from("/sys/fs/cgroup/freezer")
                .join(self.rig.namespace())
                .join(&self.source),
        )
    }
    fn runc_state(&self, id: &str) -> PathBuf {
        self.rig.runc_root().join(id)
    }
    fn bundle(&self, id: &str) -> PathBuf {
        self.rig.bundle_dir(id)
    }
    fn remove(&self, id: &str) {
        let _ = self.rig.ctr(&["tasks", "delete", "--force", id]);
        let _ = self.rig.delete_container(id);
    }
    fn own_dir(&self) -> PathBuf {
        self.rig.dir().to_path_buf()
    }
}

/// containerd's CRI through the gpusnap shim: a container created from a `crictl checkpoint
/// --export` archive, or one in a pod annotated `gpusnap.io/restore-from` with a checkpoint
/// the node sealed into its checkpoint root.
struct CriDoor {
    crictl: gpusnap_testkit::crictl::Crictl,
    node: gpusnap_testkit::cri::CriNode,
    _registry: gpusnap_testkit::registry::Registry,
    /// The base image, in the registry (CRI restores an archive onto an image it can pull).
    busybox: String,
    parts: MatrixParts,
    /// The archive (CRI door), or the checkpoint's name under the root (restore-from).
    source: String,
    restore_from: bool,
    pods: std::sync::Mutex<Vec<(String, gpusnap_testkit::crictl::CrictlPod)>>,
}

impl CriDoor {
    fn start(restore_from: bool) -> Result<CriDoor> {
        use gpusnap_testkit::cri::{CriNode, CriNodeOptions};
        let parts = MatrixParts::new()?;
        let registry = registry_with_busybox()?;
        let busybox = registry.image(BUSYBOX_REPO);
        let node = CriNode::start(CriNodeOptions {
            registry_host: Some(registry.host()),
            // Appended inside the node config's `[restore]` table.
            gpusnap_config: format!(
                "deadline_seconds = 60\n\n[criu]\nbinary_dir = \"{}\"\n",
                parts.phases.bin_dir().display()
            ),
            rig: RigOptions {
                containerd_env: vec![parts.fp.env()],
                ..RigOptions::default()
            },
            ..Default::default()
        })?;
        let crictl = gpusnap_testkit::crictl::Crictl::for_node(&node)?;
        crictl.ok(&["pull", busybox.as_str()])?;
        let pod = crictl.run_pod(
            &unique("km-src"),
            gpusnap_testkit::cri::gpusnap_handler(),
            gpusnap_testkit::crictl::PidMode::Container,
            &[],
        )?;
        let id = crictl.create(
            &pod,
            "quiet",
            &busybox,
            &["sh", "-c", QUIET, parts.token.as_str()],
            &[],
        )?;
        crictl.start(&id)?;
        ensure!(
            wait_until(Duration::from_secs(30), || !faults::processes_with(
                &parts.token
            )
            .is_empty()),
            "the workload does not run"
        );
        let source = if restore_from {
            let name = "km-ck".to_string();
            let dir = node.checkpoint_root().join(&name);
            node.ctr_k8s(&[
                "tasks",
                "checkpoint",
                "--image-path",
                dir.to_str().context("path")?,
                &id,
            ])?;
            name
        } else {
            let archive = parts.dir.path().join("ck.tar");
            crictl.checkpoint_export(&id, &archive)?;
            archive.display().to_string()
        };
        crictl.remove_pod(&pod)?;
        ensure!(
            wait_until(Duration::from_secs(30), || faults::processes_with(
                &parts.token
            )
            .is_empty()),
            "the checkpointed workload still runs"
        );
        Ok(CriDoor {
            crictl,
            node,
            _registry: registry,
            busybox,
            parts,
            source,
            restore_from,
            pods: Default::default(),
        })
    }
}

impl Door for CriDoor {
    fn name(&self) -> &'static str {
        if self.restore_from {
            "CRI, gpusnap.io/restore-from"
        } else {
            "CRI, checkpoint archive"
        }
    }
    fn front_end(&self) -> &'static str {
        "shim"
    }
    fn failpoints(&self) -> &Failpoints {
        &self.parts.fp
    }
    fn phases(&self) -> &faults::CriuPhases {
        &self.parts.phases
    }
    fn token(&self) -> &str {
        &self.parts.token
    }
    fn start_restore(&self, id: &str) -> Result<Spawned> {
        let annotations: Vec<(&str, &str)> = if self.restore_from {
            vec![("gpusnap.io/restore-from", self.source.as_str())]
        } else {
            Vec::new()
        };
        let pod = self.crictl.run_pod(
            id,
            gpusnap_testkit::cri::gpusnap_handler(),
            gpusnap_testkit::crictl::PidMode::Container,
            &annotations,
        )?;
        let image = if self.restore_from {
            self.busybox.as_str()
        } else {
            self.source.as_str()
        };
        let cid = self.crictl.create(
            &pod,
            "quiet",
            image,
            &["sh", "-c", QUIET, self.parts.token.as_str()],
            &[],
        )?;
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((cid.clone(), pod));
        // The case knows the container by its pod's name; the pod maps it to CRI's id.
        Spawned::spawn(self.crictl.command(&["start", cid.as_str()]), None)
    }
    fn state(&self, id: &str) -> Option<String> {
        let cid = self.cid(id)?;
        self.crictl
            .state(&cid)
            .ok()
            .map(|s| s.trim_start_matches("CONTAINER_").to_string())
    }
    fn cgroup_pids(&self, id: &str) -> Vec<u32> {
        self.cid(id)
            .map(|cid| self.node.cgroup_procs(&cid))
            .unwrap_or_default()
    }
    fn runc_state(&self, id: &str) -> PathBuf {
        Path::new(gpusnap_testkit::cri::CRI_RUNC_ROOT).join(self.cid(id).unwrap_or_default())
    }
    fn bundle(&self, id: &str) -> PathBuf {
        self.node
            .rig
            .state_dir()
            .join("io.containerd.runtime.v2.task")
            .join(gpusnap_testkit::cri::CRI_NAMESPACE)
            .join(self.cid(id).unwrap_or_default())
    }
    fn remove(&self, id: &str) {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, pod)) = pods.iter().find(|(_, p)| p.name == id) {
            let _ = self.crictl.remove_pod(pod);
        }
    }
    fn own_dir(&self) -> PathBuf {
        self.node.rig.dir().to_path_buf()
    }
}

impl CriDoor {
    /// CRI's id of the container in the pod named `id`.
    fn cid(&self, id: &str) -> Option<String> {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, p)| p.name == id)
            .map(|(c, _)| c.clone())
    }
}

#[test]
fn kill_matrix_ctr_shim() -> Result<()> {
    kill_matrix(&CtrDoor::start(false)?)
}

#[test]
fn kill_matrix_ctr_runc_v2_gpusnap_runc() -> Result<()> {
    kill_matrix(&CtrDoor::start(true)?)
}

#[test]
fn kill_matrix_cri_archive() -> Result<()> {
    kill_matrix(&CriDoor::start(false)?)
}

#[test]
fn kill_matrix_restore_from() -> Result<()> {
    kill_matrix(&CriDoor::start(true)?)
}

/// A restore held after CRIU, before its CUDA state is restored (the fake driver double
/// stands in for the GPU), and the shim killed there: the CRIU-restored CUDA process (still
/// checkpointed in the driver) is killed with everything else, its state never restored, and
/// nothing of the container is left.
#[test]
fn ctr_shim_killed_before_the_cuda_restore() -> Result<()> {
    use gpusnap_testkit::counter::{count_of, wait_count, COUNTER, WARM};
    use gpusnap_testkit::gpu::{Cuda, Engine, GpuDouble};
    require_root();
    let gpu = GpuDouble::new(Engine::DriverManaged, Cuda::V13_4)?;
    let config = gpu.write_config(&gpusnap_testkit::paths::criu_config())?;
    let fp = Failpoints::new()?;
    let rig = Rig::start_with(RigOptions {
        require_gpusnap: true,
        containerd_env: vec![fp.env()],
        ..RigOptions::default()
    })?;
    let (cuda, _bytes) = gpu.cuda_process("cuda-rst")?;
    let id = cuda.id.clone();
    let task = rig.run_detached_with(
        Runtime::Gpusnap,
        &id,
        &["sh", "-c", COUNTER, cuda.id.as_str()],
        &gpusnap_testkit::RunOpts {
            env: vec![cuda.env()],
            extra_args: vec!["--runtime-config-path".into(), config.display().to_string()],
            ..Default::default()
        },
    )?;
    wait_count(&cuda.id, &id, WARM, || count_of(task.pid))?;
    let image = format!("docker.io/gpusnap/ck-{id}:1");
    // --rw: the counter may hold /tmp/count open at the dump.
    gpusnap_testkit::checkpoint::container_checkpoint_ok(&rig, &id, &image, true)?;
    gpusnap_testkit::checkpoint::kill_and_remove(&rig, &id)?;
    gpu.emulate_criu_restore(&cuda)?;
    fp.arm(point::AFTER_CRIU)?;
    let ctr = Spawned::spawn(
        rig.ctr_command(&["containers", "restore", "--rw", "--live", &id, &image]),
        None,
    )?;
    let shim = fp.wait_reached(point::AFTER_CRIU, Duration::from_secs(60))?;
    let restored = faults::processes_with(&cuda.id);
    ensure!(
        !restored.is_empty(),
        "CRIU restored nothing before the CUDA restore"
    );
    ensure!(
        gpu.state(&cuda) == "checkpointed",
        "the CUDA process is {} before its restore",
        gpu.state(&cuda)
    );
    faults::kill9(shim);
    let out = ctr.wait_timeout(Duration::from_secs(60))?;
    ensure!(
        !out.status.success(),
        "restore succeeded with its shim killed"
    );
    wait_stopped(&rig, &id)?;
    let cg = PathBuf::from("/sys/fs/cgroup/freezer")
        .join(rig.namespace())
        .join(&id);
    wait_until(Duration::from_secs(60), || {
        faults::processes_with(&cuda.id).is_empty() && !rig.runc_root().join(&id).exists()
    });
    let left = faults::processes_with(&cuda.id);
    ensure!(
        left.is_empty(),
        "the CRIU-restored processes run: {:?}",
        left.iter().map(|p| p.pid).collect::<Vec<_>>()
    );
    ensure!(
        !rig.runc_root().join(&id).exists(),
        "runc state of {id} left"
    );
    ensure!(
        faults::cgroup_pids(&cg).is_empty(),
        "processes left in {}",
        cg.display()
    );
    for p in restored {
        ensure!(
            !gpu.calls(p.pid).iter().any(|c| c.contains("restore")),
            "the CUDA state of pid {} was restored after its runtime died: {:?}",
            p.pid,
            gpu.calls(p.pid)
        );
    }
    Ok(())
}

// ----- one deadline over every phase ---------------------------------------------------------

/// The restore's deadline covers the phases before runc too: a phase that takes longer than
/// `restore.deadline_seconds` (held there by the test build's failpoint) ends the restore with
/// a refusal that names the phase and invites a retry, before anything runs; through
/// gpusnap-runc (CRI-O's and Podman's door) for several phases, and through the shim.
#[test]
fn the_restore_deadline_covers_the_phases_before_runc() -> Result<()> {
    require_root();
    let dir = tempfile::tempdir()?;
    let fp = Failpoints::new()?;
    let cfg = config(dir.path(), "[restore]\ndeadline_seconds = 3\n");
    let (fp_key, fp_dir) = fp.env();
    let env = [
        ("GPUSNAP_CONFIG", cfg.to_str().unwrap()),
        (fp_key.as_str(), fp_dir.as_str()),
    ];
    let c = BusyboxContainer::create(dir.path(), &unique("fault-dl"), "sleep 100000");
    c.start();
    let img = dir.path().join("img");
    let (code, _, err) = c.wrapper(
        &["checkpoint", "--image-path", img.to_str().unwrap(), &c.id],
        &env,
        dir.path(),
    );
    ensure!(code == 0, "checkpoint: {err}");
    for phase in [
        "validate",
        "criu-prepare",
        "privilege-check",
        "open-files-check",
    ] {
        let name = point::after_phase(phase);
        fp.arm_sleep(&name, 4)?;
        let (code, _, err) = c.wrapper_restore(&img, &env, dir.path());
        fp.disarm(&name);
        ensure!(code != 0, "{phase}: restored past the deadline");
        ensure!(
            err.contains("did not finish within 3s")
                && err.contains(&format!("in the {phase} phase"))
                && err.contains("try again"),
            "{phase}: {err}"
        );
        ensure!(err.contains("nothing was changed"), "{phase}: {err}");
        ensure!(c.status().is_none(), "{phase}: runc knows the container");
    }

    let rig_dir = tempfile::tempdir()?;
    let cfg = config(rig_dir.path(), "[restore]\ndeadline_seconds = 3\n");
    let rig = Rig::start_with(RigOptions {
        require_gpusnap: true,
        containerd_env: vec![
            fp.env(),
            ("GPUSNAP_CONFIG".into(), cfg.display().to_string()),
        ],
        ..RigOptions::default()
    })?;
    let id = unique("fault-dl");
    rig.run_detached(Runtime::Gpusnap, &id, &["sh", "-c", "sleep 100000"])?;
    let image = format!("localhost/faults/{id}:1");
    gpusnap_testkit::checkpoint::container_checkpoint_ok(&rig, &id, &image, false)?;
    gpusnap_testkit::checkpoint::kill_and_remove(&rig, &id)?;
    let name = point::after_phase("privilege-check");
    fp.arm_sleep(&name, 4)?;
    let out = rig.ctr(&["containers", "restore", "--live", &id, &image])?;
    fp.disarm(&name);
    let err = out.stderr_str();
    ensure!(!out.status.success(), "ctr: restored past the deadline");
    ensure!(
        err.contains("did not finish within 3s") && err.contains("in the privilege-check phase"),
        "ctr: {err}"
    );
    ensure!(
        faults::runc_of("restore", &id).is_none() && !rig.runc_root().join(&id).exists(),
        "ctr: runc ran"
    );
    Ok(())
}

// ----- CRIU's configuration: soft cgroup mode, nothing the model does not know --------------

/// A directory of root's, 0755, in /run (a trusted place for a CRIU config file), removed on
/// drop.
struct RootConfDir(PathBuf);

impl RootConfDir {
    fn new() -> Result<RootConfDir> {
        let d = PathBuf::from("/run").join(unique("gpusnap-test-criu-conf"));
        std::fs::create_dir(&d)?;
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(RootConfDir(d))
    }

    /// Writes `file` (0644 unless `mode`) with `text`.
    fn write(&self, text: &str, mode: u32) -> Result<PathBuf> {
        let f = self.0.join("runc.conf");
        std::fs::write(&f, text)?;
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        Ok(f)
    }
}

impl Drop for RootConfDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A container spec's `org.criu.config` names the CRIU config file runc hands CRIU, which CRIU
/// applies over runc's settings (on `ctr containers restore` the spec comes with the
/// checkpoint image). Through ctr with the gpusnap shim and with runc.v2 + gpusnap-runc: a
/// root-owned file with harmless options checkpoints and restores; the same file set to
/// another cgroup mode, to an action script, or made writable by others refuses the restore
/// before CRIU runs, naming the file; a file in a world-writable directory refuses the
/// checkpoint, and the container runs on.
#[test]
fn org_criu_config_that_undercuts_the_model_is_refused() -> Result<()> {
    require_root();
    for runc_v2 in [false, true] {
        let door = if runc_v2 { "runc.v2" } else { "shim" };
        let dir = tempfile::tempdir()?;
        let cfg = config(dir.path(), "");
        let rig = Rig::start_with(RigOptions {
            require_gpusnap: true,
            containerd_env: vec![("GPUSNAP_CONFIG".into(), cfg.display().to_string())],
            ..RigOptions::default()
        })?;
        let conf = RootConfDir::new()?;
        let file = conf.write("tcp-established\nnetwork-lock iptables\n", 0o644)?;
        let run = |id: &str, annotated: &Path| -> Result<()> {
            let mut extra_args = vec![format!(
                "--annotation=org.criu.config={}",
                annotated.display()
            )];
            let rt = if runc_v2 {
                extra_args.extend([
                    "--runc-binary".to_string(),
                    binary("gpusnap-runc").display().to_string(),
                ]);
                Runtime::RuncV2
            } else {
                Runtime::Gpusnap
            };
            rig.run_detached_with(
                rt,
                id,
                &["sh", "-c", "sleep 100000"],
                &gpusnap_testkit::RunOpts {
                    extra_args,
                    ..Default::default()
                },
            )?;
            Ok(())
        };
        let id = unique("fault-conf");
        run(&id, &file)?;
        let image = format!("localhost/faults/{id}:1");
        gpusnap_testkit::checkpoint::container_checkpoint_ok(&rig, &id, &image, false)
            .with_context(|| format!("{door}: a harmless file"))?;
        gpusnap_testkit::checkpoint::kill_and_remove(&rig, &id)?;
        for (text, mode, says) in [
            ("manage-cgroups full\n", 0o644, "cgroup mode to \"full\""),
            (
                "tcp-established\naction-script /bin/true\n",
                0o644,
                "run a program",
            ),
            ("tcp-established\n", 0o666, "writable by others"),
        ] {
            conf.write(text, mode)?;
            let out =
                gpusnap_testkit::checkpoint::container_restore(&rig, &id, &image, false, true)?;
            let err = out.stderr_str();
            ensure!(
                !out.status.success(),
                "{door}: restored with {text:?} (mode {mode:o})"
            );
            ensure!(
                err.contains(&file.display().to_string()) && err.contains(says),
                "{door}, {text:?}: {err}"
            );
            ensure!(
                faults::runc_of("restore", &id).is_none() && !rig.runc_root().join(&id).exists(),
                "{door}: runc ran"
            );
            let _ = rig.ctr(&["tasks", "delete", "--force", &id]);
            let _ = rig.delete_container(&id);
        }
        conf.write("tcp-established\n", 0o644)?;
        gpusnap_testkit::checkpoint::container_restore_live_ok(&rig, &id, &image, false)
            .with_context(|| format!("{door}: the harmless file again"))?;
        gpusnap_testkit::checkpoint::kill_and_remove(&rig, &id)?;

        // Checkpoint side: a file anyone may replace.
        let open_dir = tempfile::tempdir()?;
        std::fs::set_permissions(
            open_dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )?;
        let loose = open_dir.path().join("runc.conf");
        std::fs::write(&loose, "tcp-established\n")?;
        let id = unique("fault-conf");
        run(&id, &loose)?;
        let out = gpusnap_testkit::checkpoint::container_checkpoint(
            &rig,
            &id,
            &format!("localhost/faults/{id}:1"),
            false,
        )?;
        let err = out.stderr_str();
        ensure!(
            !out.status.success(),
            "{door}: checkpointed with {}",
            loose.display()
        );
        ensure!(
            err.contains("org.criu.config") && err.contains("writable by others"),
            "{door}: {err}"
        );
        ensure!(
            rig.task_state(&id)? == Some(TaskState::Running),
            "{door}: the refused checkpoint stopped the container"
        );
    }
    Ok(())
}

/// gpusnap-runc (the door CRI-O and Podman call with their own runc flags) refuses a restore
/// with `--manage-cgroups-mode full` or `strict` before CRIU runs, and restores with `soft`;
/// and a node `/etc/criu/runc.conf` (here in a private mount namespace: an overlay on /etc)
/// that sets another cgroup mode refuses the restore, naming the file.
#[test]
fn gpusnap_runc_restores_only_in_crius_soft_cgroup_mode() -> Result<()> {
    require_root();
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path(), "");
    let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
    let c = BusyboxContainer::create(dir.path(), &unique("fault-cgm"), "sleep 100000");
    c.start();
    let img = dir.path().join("img");
    let (code, _, err) = c.wrapper(
        &["checkpoint", "--image-path", img.to_str().unwrap(), &c.id],
        &env,
        dir.path(),
    );
    ensure!(code == 0, "checkpoint: {err}");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work)?;
    let restore_args = |mode: Option<&str>| {
        let mut a = vec![
            "restore".to_string(),
            "-d".into(),
            "--image-path".into(),
            img.display().to_string(),
            "--work-path".into(),
            work.display().to_string(),
            "--bundle".into(),
            c.bundle.display().to_string(),
        ];
        if let Some(m) = mode {
            a.extend(["--manage-cgroups-mode".into(), m.to_string()]);
        }
        a.push(c.id.clone());
        a
    };
    for mode in ["full", "strict"] {
        let args = restore_args(Some(mode));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = c.wrapper(&args, &env, dir.path());
        ensure!(code != 0, "restored with --manage-cgroups-mode {mode}");
        ensure!(
            err.contains(&format!("--manage-cgroups-mode {mode}")) && err.contains("soft"),
            "{mode}: {err}"
        );
        ensure!(c.status().is_none(), "{mode}: runc knows the container");
    }

    // The node's runc.conf, seen only by this gpusnap-runc: an overlay on /etc in a mount
    // namespace of its own.
    let upper = dir.path().join("etc-upper");
    let workdir = dir.path().join("etc-work");
    std::fs::create_dir_all(upper.join("criu"))?;
    std::fs::create_dir_all(&workdir)?;
    std::fs::write(upper.join("criu/runc.conf"), "manage-cgroups=full\n")?;
    let args = restore_args(None);
    let script = format!(
        "mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc && exec \"$@\"",
        upper.display(),
        workdir.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
        "sh",
    ])
    .arg(binary("gpusnap-runc"))
    .args(c.root_args())
    .args(&args)
    .envs(env);
    let (code, _, err) = gpusnap_testkit::bundle::run_detached_stdio(cmd, dir.path());
    ensure!(code != 0, "restored with a node runc.conf setting full");
    ensure!(
        err.contains("/etc/criu/runc.conf") && err.contains("cgroup mode to \"full\""),
        "node runc.conf: {err}"
    );
    ensure!(
        c.status().is_none(),
        "node runc.conf: runc knows the container"
    );

    let args = restore_args(Some("soft"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = c.wrapper(&args, &env, dir.path());
    ensure!(code == 0, "soft: {err}");
    ensure!(
        c.status().as_deref() == Some("running"),
        "soft: not running"
    );
    Ok(())
}
