//! Node-local restores without a registry (issue 21, item 4).
//!
//! - `ctr tasks checkpoint --image-path <checkpoint_root>/NAME` of a CRI container under the
//!   gpusnap shim: the node records the checkpoint as its own, and a new pod annotated
//!   `gpusnap.io/restore-from: NAME` restores it (the counter goes on with its run token);
//!   once its manifest is changed the same annotation is refused with nothing left running.
//! - A copy of that checkpoint under another name was not sealed by the node: refused until
//!   root adopts it (`gpusnap checkpoint adopt`); a non-root user cannot; once adopted it
//!   restores.
//! - `gpusnap-runc checkpoint --image-path <checkpoint_root>/NAME` records it too (writer
//!   gpusnap-runc); a checkpoint outside the root is not recorded.
//! - A process holding a file of its writable layer open (which a node-local checkpoint does
//!   not carry) is refused by name before runc runs.

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_checkpoint::node_origin::{self, How};
use gpusnap_testkit::cmd::check;
use gpusnap_testkit::counter::{check_continues, count_of, run_token, wait_count, Count, WARM};
use gpusnap_testkit::cri::{
    counter_container, gpusnap_handler, wait_for_state, ContainerSpec, CriNode, CriNodeOptions, Pod,
};
use gpusnap_testkit::rig::BUSYBOX_IMAGE;
use gpusnap_testkit::{describe, gpusnap, paths, text, BusyboxContainer};
use k8s_cri::v1::ContainerState;

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

fn node() -> Result<CriNode> {
    let node = CriNode::start(CriNodeOptions::default())?;
    node.import_image(&paths::busybox_archive(), BUSYBOX_IMAGE)?;
    Ok(node)
}

/// A pod (annotated with `restore_from` when given) running the counter; its id and pid.
fn run(
    node: &CriNode,
    pod: &str,
    run: &str,
    restore_from: Option<&str>,
) -> Result<(Pod, String, u32)> {
    let annotations: Vec<(&str, &str)> = restore_from
        .map(|n| ("gpusnap.io/restore-from", n))
        .into_iter()
        .collect();
    let pod = node.run_pod(pod, &annotations, gpusnap_handler())?;
    let id = node.run_container(&pod, &counter_container(run))?;
    wait_for_state(
        node,
        &id,
        ContainerState::ContainerRunning,
        Duration::from_secs(30),
    )?;
    let pid = node.pid(&id)?;
    Ok((pod, id, pid))
}

/// A restore-from pod whose start is refused: the CRI error, after checking nothing runs.
fn refused(node: &CriNode, pod: &str, run_tok: &str, name: &str) -> Result<String> {
    let pod = node.run_pod(pod, &[("gpusnap.io/restore-from", name)], gpusnap_handler())?;
    let err = match node.create_container(&pod, &counter_container(run_tok)) {
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

fn restored(node: &CriNode, pod: &str, run_tok: &str, name: &str, before: &Count) -> Result<()> {
    let (pod, _id, pid) =
        run(node, pod, run_tok, Some(name)).with_context(|| format!("restore-from {name}"))?;
    check_continues(name, before, || count_of(pid))?;
    node.remove_pod(&pod.id)
}

fn record_of(root: &Path, name: &str) -> Result<node_origin::NodeRecord> {
    let fd = gpusnap_checkpoint::beneath::open_root(root)?;
    Ok(node_origin::lookup(fd.as_fd(), root, name)?
        .with_context(|| format!("no node record of {name}"))?
        .0)
}

#[test]
fn ctr_checkpoint_into_the_root_restores_by_annotation_and_adopt_is_for_root() {
    check(|| {
        let node = node()?;
        let root = node.checkpoint_root();
        let tok = run_token();
        let (pod, id, pid) = run(&node, "local-a", &tok, None)?;
        wait_count(&tok, "the counter", WARM, || count_of(pid))?;
        let dir = root.join("ck-local");
        // The new pod gets the image's rootfs afresh: no write of the counter may be caught.
        let before = node.checkpoint_counter_to(&id, pid, &tok, &dir)?;
        node.remove_pod(&pod.id)?;

        let record = record_of(&root, "ck-local")?;
        ensure!(
            matches!(&record.how, How::Sealed { writer, container_id }
                if writer == "containerd-shim-gpusnap-v2" && container_id == &id),
            "record: {record:?}"
        );
        // A copy under another name, before anything restores from the original.
        let copy = root.join("ck-copy");
        let cp = Command::new("cp")
            .args(["-a", s(&dir), s(&copy)])
            .output()?;
        ensure!(cp.status.success(), "{}", describe(&cp));

        restored(&node, "local-b", &tok, "ck-local", &before)?;

        // Not sealed by the node: refused, until root adopts it.
        let err = refused(&node, "copy-refused", &tok, "ck-copy")?;
        ensure!(
            err.contains("neither sealed by this node") && err.contains("gpusnap checkpoint adopt"),
            "{err}"
        );
        let config = node.config_path();
        let adopt = ["--config", s(config), "checkpoint", "adopt", s(&copy)];
        let nobody = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(paths::binary("gpusnap"))
            .args(adopt)
            .output()?;
        ensure!(
            !nobody.status.success() && text(&nobody.stderr).contains("must run as root"),
            "{}",
            describe(&nobody)
        );
        ensure!(
            record_of(&root, "ck-copy").is_err(),
            "a non-root adopt left a record"
        );
        let out = gpusnap(adopt);
        ensure!(out.status.success(), "{}", describe(&out));
        ensure!(
            text(&out.stdout).contains("gpusnap.io/restore-from: ck-copy"),
            "{}",
            describe(&out)
        );
        restored(&node, "copy-b", &tok, "ck-copy", &before)?;

        // Modified after sealing (a valid manifest, another digest): refused, nothing left.
        let manifest = dir.join("gpusnap-manifest.json");
        let mut json: serde_json::Value = serde_json::from_slice(&fs::read(&manifest)?)?;
        json["container_id"] = "someone-else".into();
        fs::write(&manifest, serde_json::to_vec(&json)?)?;
        let err = refused(&node, "local-tampered", &tok, "ck-local")?;
        ensure!(
            err.contains("modified after this node sealed or adopted it"),
            "{err}"
        );
        Ok(())
    })
}

#[test]
fn gpusnap_runc_checkpoint_into_the_root_is_recorded() {
    check(|| {
        let work = tempfile::tempdir()?;
        let root = work.path().join("checkpoints");
        fs::create_dir(&root)?;
        let config = work.path().join("gpusnap.toml");
        fs::write(
            &config,
            format!(
                "[restore]\ncheckpoint_root = \"{}\"\n[criu]\nbinary_dir = \"{}\"\n",
                root.display(),
                paths::rig_bin_dir().display()
            ),
        )?;
        let env = [("GPUSNAP_CONFIG", s(&config))];
        for (id, dir) in [
            ("lo-runc-in", root.join("ck-runc")),
            ("lo-runc-out", work.path().join("elsewhere")),
        ] {
            let c = BusyboxContainer::create(work.path(), id, "while true; do sleep 0.1; done");
            c.start();
            let (code, _, err) = c.wrapper(
                &["checkpoint", "--image-path", s(&dir), id],
                &env,
                work.path(),
            );
            ensure!(code == 0, "gpusnap-runc checkpoint of {id} failed: {err}");
        }
        let record = record_of(&root, "ck-runc")?;
        ensure!(
            matches!(&record.how, How::Sealed { writer, container_id }
                if writer == "gpusnap-runc" && container_id == "lo-runc-in"),
            "record: {record:?}"
        );
        let fd = gpusnap_checkpoint::beneath::open_root(&root.join("ck-runc"))?;
        ensure!(record.manifest_sha256 == node_origin::manifest_sha256_at(fd.as_fd())?);
        let records =
            fs::read_dir(root.join(gpusnap_checkpoint::layout::NODE_RECORDS_DIR))?.count();
        ensure!(
            records == 1,
            "{records} records: the checkpoint outside the root was recorded"
        );
        Ok(())
    })
}

/// A node-local checkpoint carries no writable layer, and the new pod's container starts from
/// the image's rootfs: a process that held a file of its layer open is refused by
/// `gpusnap.io/restore-from` before runc runs, naming the file (CRIU would fail mid-restore).
#[test]
fn restore_from_refuses_a_process_holding_a_file_the_new_rootfs_lacks() {
    check(|| {
        let node = node()?;
        let root = node.checkpoint_root();
        let pod = node.run_pod("held-a", &[], gpusnap_handler())?;
        let held = ContainerSpec {
            name: "held".into(),
            image: BUSYBOX_IMAGE.into(),
            command: [
                "sh",
                "-c",
                "exec 3>/tmp/held; echo x >&3; while :; do sleep 0.1; done",
            ]
            .map(String::from)
            .to_vec(),
            env: vec![],
        };
        let id = node.run_container(&pod, &held)?;
        wait_for_state(
            &node,
            &id,
            ContainerState::ContainerRunning,
            Duration::from_secs(30),
        )?;
        let pid = node.pid(&id)?;
        ensure!(
            gpusnap_testkit::wait_until(Duration::from_secs(10), || {
                fs::read_to_string(format!("/proc/{pid}/root/tmp/held")).is_ok_and(|s| s == "x\n")
            }),
            "the container did not write /tmp/held"
        );
        let dir = root.join("ck-held");
        node.ctr_k8s(&["tasks", "checkpoint", "--image-path", s(&dir), &id])?;
        node.remove_pod(&pod.id)?;

        let err = refused(&node, "held-b", &run_token(), "ck-held")?;
        for want in [
            "/tmp/held (missing)",
            "hold files open",
            "nothing was restored",
        ] {
            ensure!(err.contains(want), "the refusal lacks {want:?}: {err}");
        }
        Ok(())
    })
}
