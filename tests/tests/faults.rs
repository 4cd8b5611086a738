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
    binary, require_root, rig_bin_dir, unique, wait_some, wait_until, BusyboxContainer, Rig,
    RigOptions, Runtime, Spawned, TaskState,
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

/// gpusnap-runc killed while CRIU restores (stalled once it has forked the tree): the next
/// gpusnap-runc call naming the container (what CRI-O and Podman run next) kills the orphaned
/// runc, CRIU and restored tree and removes runc's state: the container is stopped and runc
/// says so.
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
    ensure!(
        faults::alive(criu),
        "the stalled CRIU went with gpusnap-runc: nothing left to repair"
    );
    // What CRI-O and Podman run next names the container.
    let (code, out, _) = c.wrapper(&["state", &c.id], &env, dir.path());
    ensure!(code != 0, "runc still reports the container: {out}");
    ensure!(
        !faults::alive(criu),
        "the restore's CRIU (pid {criu}) is left"
    );
    ensure!(
        faults::runc_of("restore", &c.id).is_none(),
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
