//! The restore is an allowlist (issue 28): forged CRIU images of a real checkpoint that the
//! privilege bound of last round let through are refused before CRIU runs, through the doors
//! they were found on, and the honest checkpoint of the same container restores.
//!
//! - `gpusnap.io/restore-from` (containerd's CRI → the gpusnap shim): a node-local checkpoint
//!   of a CRI counter, copied, forged and adopted by root (as a pulled or handed-in checkpoint
//!   reaches a node): `/dev/shm` as a bind of the `/dev` tmpfs whose root climbs to a host
//!   path, the read-only `/sys/firmware` variant, a deleted mount (finding 1); every cgroup
//!   set at `/` (finding 2); RLIMIT_NOFILE raised, loginuid 0, a setuid-root file and a block
//!   device in the `/dev` tarball (finding 9).
//! - `ctr containers restore` with the gpusnap shim: the mount forgeries (finding 1).
//! - CRI CreateContainer from a real CRI checkpoint archive: every cgroup set at `/` (finding
//!   2).
//! - `gpusnap-runc restore` (the door ctr with runc.v2 + gpusnap-runc, CRI-O and Podman call):
//!   the finding 9 forgeries, the mount root, and an honest root checkpoint restored into the
//!   same container specified `--user 1000:1000` with noNewPrivileges (finding 4; through
//!   `ctr` this needs a checkpoint of a non-root task, which CRIU cannot take where it lacks
//!   CAP_SYS_RESOURCE over the task, as on the test machines).
//!
//! Each refusal: nothing of the checkpoint runs, runc never created the container, CRIU
//! wrote no restore log, and a sentinel host tree the mount forgeries aim at is unchanged.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::allowlist::{
    cgroups_at_root, dev_tarball_with, firmware_binds_host_path, loginuid_root, nofile_raised,
    shm_binds_host_path, shm_deleted, DevMember,
};
use gpusnap_testkit::can_fail::Sentinel;
use gpusnap_testkit::cmd::check;
use gpusnap_testkit::counter::{
    check_continues, count_in_file, count_of, counter_script, run_token, wait_count, COUNTER, WARM,
};
use gpusnap_testkit::cri::{
    counter_container, gpusnap_handler, wait_for_state, ContainerSpec, CriNode, CriNodeOptions,
    RunAs,
};
use gpusnap_testkit::rig::BUSYBOX_IMAGE;
use gpusnap_testkit::{describe, gpusnap, paths, BusyboxContainer, Runtime};
use k8s_cri::v1::ContainerState;

type Forge = Box<dyn Fn(&Path) -> Result<usize>>;

/// One forgery, and the words its refusal must hold.
struct Case {
    name: &'static str,
    forge: Forge,
    says: Vec<&'static str>,
}

fn case(name: &'static str, forge: Forge, says: &[&'static str]) -> Case {
    Case {
        name,
        forge,
        says: says.to_vec(),
    }
}

/// The mount forgeries of finding 1, aimed at `sentinel`.
fn mount_cases(sentinel: &Sentinel) -> Vec<Case> {
    let etc = sentinel.target("etc").display().to_string();
    let tmp = sentinel.target("tmp").display().to_string();
    vec![
        case(
            "shm-root",
            Box::new(move |d| shm_binds_host_path(d, &tmp)),
            &["root of /dev/shm is", "not a plain absolute path"],
        ),
        case(
            "firmware-root",
            Box::new(move |d| firmware_binds_host_path(d, &etc)),
            &["not a plain absolute path: CRIU would bind-mount a path outside"],
        ),
        case(
            "shm-deleted",
            Box::new(shm_deleted),
            &["mnt_entry.deleted is Bool(true): refused"],
        ),
    ]
}

/// The task and tarball forgeries of finding 9.
fn task_cases() -> Vec<Case> {
    vec![
        case(
            "nofile",
            Box::new(|d| nofile_raised(d, 20000)),
            &[
                "rlimits[RLIMIT_NOFILE] has hard limit",
                "lacks CAP_SYS_RESOURCE to raise it",
            ],
        ),
        case(
            "loginuid",
            Box::new(loginuid_root),
            &["loginuid is 0", "CAP_AUDIT_CONTROL"],
        ),
        case(
            "setuid",
            Box::new(|d| dev_tarball_with(d, DevMember::SetuidRoot("rootsh"))),
            &["holds \"rootsh\", which is setuid"],
        ),
        case(
            "blockdev",
            Box::new(|d| dev_tarball_with(d, DevMember::Block("sda", 8, 0))),
            &["holds \"sda\", a block device 8:0 at /dev/sda"],
        ),
    ]
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    let cp = Command::new("cp").args(["-a", s(from), s(to)]).output()?;
    ensure!(cp.status.success(), "{}", describe(&cp));
    Ok(())
}

/// Where a checkpoint directory keeps its CRIU images.
fn images_of(dir: &Path) -> PathBuf {
    let nested = dir.join("checkpoint");
    if nested.is_dir() {
        nested
    } else {
        dir.to_path_buf()
    }
}

/// No `restore.log` anywhere under `dir`: CRIU never ran on it.
fn no_restore_log(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        ensure!(
            e.file_name() != "restore.log",
            "CRIU ran: {}",
            e.path().display()
        );
        if e.file_type()?.is_dir() {
            no_restore_log(&e.path())?;
        }
    }
    Ok(())
}

// ----- door: gpusnap.io/restore-from ---------------------------------------------------------

/// A restore-from pod that must be refused: the CRI error, after checking nothing runs.
fn refused_from(node: &CriNode, pod: &str, run_tok: &str, name: &str) -> Result<String> {
    refused_from_as(node, pod, run_tok, name, None)
}

/// [`refused_from`] with the container's user set as a pod's securityContext sets it.
fn refused_from_as(
    node: &CriNode,
    pod: &str,
    run_tok: &str,
    name: &str,
    run_as: Option<RunAs>,
) -> Result<String> {
    let pod = node.run_pod(pod, &[("gpusnap.io/restore-from", name)], gpusnap_handler())?;
    let err = match node.create_container_as(&pod, &counter_container(run_tok), run_as) {
        Err(e) => e.to_string(),
        Ok(id) => {
            let started = node.cri.start_container(&id);
            ensure!(started.is_err(), "restore-from {name} started");
            ensure!(
                node.state(&id)? != ContainerState::ContainerRunning,
                "{id} runs after a refused restore"
            );
            ensure!(
                node.cgroup_procs(&id).is_empty(),
                "processes left in {id}'s cgroup"
            );
            ensure!(node.runc_state(&id).is_none(), "runc knows {id}");
            started.unwrap_err().to_string()
        }
    };
    node.remove_pod(&pod.id)?;
    Ok(err)
}

#[test]
fn restore_from_refuses_forged_mounts_cgroups_limits_and_tarballs() {
    check(|| {
        let sentinel = Sentinel::new()?;
        let before_sentinel = sentinel.snapshot();
        let node = CriNode::start(CriNodeOptions::default())?;
        node.import_image(&paths::busybox_archive(), BUSYBOX_IMAGE)?;
        let root = node.checkpoint_root();
        let tok = run_token();
        let pod = node.run_pod("allow-src", &[], gpusnap_handler())?;
        let id = node.run_container(&pod, &counter_container(&tok))?;
        wait_for_state(
            &node,
            &id,
            ContainerState::ContainerRunning,
            Duration::from_secs(30),
        )?;
        let pid = node.pid(&id)?;
        wait_count(&tok, "the counter", WARM, || count_of(pid))?;
        let honest = root.join("ck-honest");
        let before = node.checkpoint_counter_to(&id, pid, &tok, &honest)?;
        node.remove_pod(&pod.id)?;

        let mut cases = mount_cases(&sentinel);
        cases.push(case(
            "cgroup-root",
            Box::new(cgroups_at_root),
            &[
                "cgroup.img: sets set",
                "path \"/\" is not the dumped cgroup",
            ],
        ));
        cases.extend(task_cases());
        let config = node.config_path();
        let mut failures = Vec::new();
        for c in &cases {
            let name = format!("ck-{}", c.name);
            let dir = root.join(&name);
            copy_dir(&honest, &dir)?;
            (c.forge)(&images_of(&dir)).with_context(|| c.name)?;
            let out = gpusnap(["--config", s(config), "checkpoint", "adopt", s(&dir)]);
            ensure!(out.status.success(), "adopt {}: {}", c.name, describe(&out));
            let err = refused_from(&node, &format!("allow-{}", c.name), &tok, &name)?;
            no_restore_log(&dir)?;
            let missing: Vec<&&str> = c.says.iter().filter(|w| !err.contains(**w)).collect();
            if !missing.is_empty() {
                failures.push(format!("{}: {missing:?} missing from {err}", c.name));
            }
        }
        // Finding 4 on the door it was found on: the honest root checkpoint, restored into a
        // pod whose container runs as uid 1000 with allowPrivilegeEscalation false
        // (noNewPrivileges): that container's own process has uid 1000 and no capability, so
        // the checkpoint's uid 0 and CapEff are refused.
        let user = root.join("ck-user");
        copy_dir(&honest, &user)?;
        let out = gpusnap(["--config", s(config), "checkpoint", "adopt", s(&user)]);
        ensure!(out.status.success(), "adopt ck-user: {}", describe(&out));
        let run_as = RunAs {
            uid: 1000,
            gid: 1000,
            no_new_privs: true,
        };
        let err = refused_from_as(&node, "allow-user", &tok, "ck-user", Some(run_as))?;
        no_restore_log(&user)?;
        let says = "uid is 0, but the container spec's user is uid 1000";
        if !err.contains(says) {
            failures.push(format!("user: {says:?} missing from {err}"));
        }

        let after = sentinel.snapshot();
        ensure!(
            before_sentinel == after,
            "the sentinel changed: {}",
            Sentinel::diff(&before_sentinel, &after)
        );
        ensure!(failures.is_empty(), "{}", failures.join("\n"));

        // The honest checkpoint of the same container restores and counts on.
        let pod = node.run_pod(
            "allow-honest",
            &[("gpusnap.io/restore-from", "ck-honest")],
            gpusnap_handler(),
        )?;
        let id = node.run_container(&pod, &counter_container(&tok))?;
        wait_for_state(
            &node,
            &id,
            ContainerState::ContainerRunning,
            Duration::from_secs(30),
        )?;
        let pid = node.pid(&id)?;
        check_continues("ck-honest", &before, || count_of(pid))?;
        node.remove_pod(&pod.id)
    })
}

// ----- door: ctr containers restore with the gpusnap shim ----------------------------------

#[test]
fn ctr_restore_refuses_forged_mount_roots() {
    use gpusnap_testkit::checkpoint::{container_checkpoint_ok, kill_and_remove, CkRig};
    use gpusnap_testkit::refused_restore::CriuTar;
    check(|| {
        let sentinel = Sentinel::new()?;
        let before_sentinel = sentinel.snapshot();
        let rig = CkRig::start_for(Runtime::Gpusnap)?;
        let run = run_token();
        rig.run_detached(
            Runtime::Gpusnap,
            "src",
            &["sh", "-c", COUNTER, run.as_str()],
        )?;
        let src_pid = rig.task_pid("src")?;
        wait_count(&run, "src", WARM, || count_of(src_pid))?;
        let image = "ck/allowlist:1";
        container_checkpoint_ok(&rig, "src", image, true)?;
        let before = count_of(src_pid).context("no count after the checkpoint")?;
        kill_and_remove(&rig, "src")?;

        let criu_tar = CriuTar::of(&rig, image)?;
        let mut failures: Vec<String> = Vec::new();
        for (i, c) in mount_cases(&sentinel).iter().enumerate() {
            let restore =
                criu_tar.restore_altered(&format!("forged{i}"), |d| (c.forge)(d).map(drop))?;
            criu_tar.put_back()?;
            ensure!(
                !restore.succeeded,
                "{}: the forged restore succeeded",
                c.name
            );
            ensure!(
                !restore.running,
                "{}: the forged restore left a task",
                c.name
            );
            let missing: Vec<&&str> = c
                .says
                .iter()
                .filter(|w| !restore.stderr.contains(**w))
                .collect();
            if !missing.is_empty() {
                failures.push(format!(
                    "{}: {missing:?} missing from {}",
                    c.name, restore.stderr
                ));
            }
        }

        let after = sentinel.snapshot();
        ensure!(
            before_sentinel == after,
            "the sentinel changed: {}",
            Sentinel::diff(&before_sentinel, &after)
        );
        ensure!(failures.is_empty(), "{}", failures.join("\n"));

        gpusnap_testkit::checkpoint::container_restore_live_ok(&rig, "honest", image, true)?;
        let pid = rig.task_pid("honest")?;
        check_continues("honest", &before, || count_of(pid))?;
        Ok(())
    })
}

// ----- door: gpusnap-runc --------------------------------------------------------------------

#[test]
fn gpusnap_runc_refuses_forged_limits_tarballs_mount_roots_and_a_root_checkpoint_as_a_user() {
    check(|| {
        let sentinel = Sentinel::new()?;
        let before_sentinel = sentinel.snapshot();
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        let config = dir.join("config.toml");
        paths::write_criu_config(&config, "")?;
        let env = [("GPUSNAP_CONFIG", s(&config))];
        let run = run_token();
        let c = BusyboxContainer::create(dir, "allow-runc", &counter_script(&run));
        c.start();
        let count = || count_in_file(&c.bundle.join("rootfs/tmp/count"));
        wait_count(&run, &c.id, WARM, count)?;
        let images = dir.join("images");
        let (code, _, err) = c.wrapper(
            &["checkpoint", "--image-path", s(&images), &c.id],
            &env,
            dir,
        );
        ensure!(
            code == 0,
            "gpusnap-runc checkpoint failed (exit {code}):\n{err}"
        );
        let before = count().context("no count after the checkpoint")?;

        let mut cases = task_cases();
        cases.extend(mount_cases(&sentinel).into_iter().take(1));
        let mut failures = Vec::new();
        for case in &cases {
            let forged = dir.join(format!("forged-{}", case.name));
            copy_dir(&images, &forged)?;
            (case.forge)(&forged)?;
            if let Err(e) = gpusnap_testkit::refused_restore::gpusnap_runc_refuses(
                &c,
                &forged,
                case.says[0],
                dir,
            ) {
                failures.push(format!("{}: {e}", case.name));
            }
        }
        // Finding 4: the honest root checkpoint restored into the same container specified as
        // `--user 1000:1000` with noNewPrivileges and containerd's default capabilities
        // (CAP_SETUID in the bounding and permitted sets, none ambient): its own process
        // would run as uid 1000 with no capability.
        let spec_path = c.bundle.join("config.json");
        let spec = fs::read(&spec_path)?;
        let mut user: serde_json::Value = serde_json::from_slice(&spec)?;
        let caps = serde_json::json!([
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FSETID",
            "CAP_FOWNER",
            "CAP_MKNOD",
            "CAP_NET_RAW",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETFCAP",
            "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE",
            "CAP_SYS_CHROOT",
            "CAP_KILL",
            "CAP_AUDIT_WRITE"
        ]);
        user["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
        user["process"]["noNewPrivileges"] = true.into();
        user["process"]["capabilities"] =
            serde_json::json!({"bounding": caps, "permitted": caps, "effective": caps});
        fs::write(&spec_path, serde_json::to_vec(&user)?)?;
        let as_user = gpusnap_testkit::refused_restore::gpusnap_runc_refuses(
            &c,
            &images,
            "uid is 0, but the container spec's user is uid 1000 and its ambient set",
            dir,
        );
        fs::write(&spec_path, spec)?;
        if let Err(e) = as_user {
            failures.push(format!("user: {e}"));
        }

        let after = sentinel.snapshot();
        ensure!(
            before_sentinel == after,
            "the sentinel changed: {}",
            Sentinel::diff(&before_sentinel, &after)
        );
        ensure!(failures.is_empty(), "{}", failures.join("\n"));

        let (code, _, err) = c.wrapper_restore(&images, &env, dir);
        ensure!(code == 0, "the honest restore failed (exit {code}):\n{err}");
        check_continues(&c.id, &before, count)?;
        Ok(())
    })
}

// ----- door: CRI checkpoint archives -------------------------------------------------------

/// CRI CreateContainer + StartContainer from a real CRI checkpoint archive (CheckpointContainer
/// of a gpusnap container) whose `cgroup.img` puts every set at `/` (finding 2): refused before
/// runc creates anything; the pristine archive restores.
#[test]
fn cri_archive_refuses_cgroup_sets_outside_the_container() {
    check(|| {
        let reg = gpusnap_testkit::Registry::start()?;
        gpusnap_oci_image::push(
            &paths::busybox_archive(),
            &reg.url("gpusnap/busybox:test"),
            &gpusnap_oci_image::RegistryOptions::default(),
        )
        .context("pushing busybox to the test registry")?;
        let node = CriNode::start(CriNodeOptions {
            registry_host: Some(reg.host()),
            ..Default::default()
        })?;
        let image = reg.image("gpusnap/busybox:test");
        node.cri
            .pull_image(&image)
            .map_err(anyhow::Error::from)
            .context("CRI PullImage of busybox")?;
        let pod = node.run_pod("allow-cri-src", &[], gpusnap_handler())?;
        let spec = ContainerSpec {
            name: "src".into(),
            image,
            command: vec!["sleep".into(), "1000".into()],
            env: vec![],
        };
        let id = node.run_container(&pod, &spec)?;
        let pristine = node.scratch().join("pristine.tar");
        node.cri
            .checkpoint_container(&id, &pristine, 60)
            .map_err(anyhow::Error::from)
            .context("CRI CheckpointContainer")?;
        node.remove_pod(&pod.id)?;

        let tree = tempfile::tempdir()?;
        tar::Archive::new(fs::File::open(&pristine)?).unpack(tree.path())?;
        cgroups_at_root(&tree.path().join("checkpoint"))?;
        let forged = node.scratch().join("forged.tar");
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.append_dir_all(".", tree.path())?;
        fs::write(&forged, b.into_inner()?)?;

        let pod = node.run_pod("allow-cri", &[], gpusnap_handler())?;
        let forged_spec = ContainerSpec {
            name: "forged".into(),
            image: forged.display().to_string(),
            ..spec.clone()
        };
        let err = match node.create_container(&pod, &forged_spec) {
            Err(e) => e.to_string(),
            Ok(id) => {
                let started = node.cri.start_container(&id);
                ensure!(started.is_err(), "the forged archive started");
                ensure!(node.runc_state(&id).is_none(), "runc created {id}");
                ensure!(
                    node.cgroup_procs(&id).is_empty(),
                    "processes in {id}'s cgroup"
                );
                started.unwrap_err().to_string()
            }
        };
        ensure!(
            err.contains("cgroup.img: sets set")
                && err.contains("path \"/\" is not the dumped cgroup"),
            "{err}"
        );

        let honest_spec = ContainerSpec {
            name: "honest".into(),
            image: pristine.display().to_string(),
            ..spec
        };
        let id = node.create_container(&pod, &honest_spec)?;
        node.cri
            .start_container(&id)
            .map_err(anyhow::Error::from)
            .context("starting the honest archive")?;
        wait_for_state(
            &node,
            &id,
            ContainerState::ContainerRunning,
            Duration::from_secs(30),
        )?;
        node.remove_pod(&pod.id)
    })
}
