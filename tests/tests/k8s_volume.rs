//! Restore from the pod spec alone (issue 30, the restore half), through the CRI door as the
//! kubelet drives it: a pod mounts the checkpoint image as an image volume (KEP-4639; CRI
//! `mounts[].image`, read-only) and is annotated `gpusnap.io/restore-from-volume: MOUNT_PATH`;
//! "node B" has its own containerd and node store and nothing done on it beforehand but the
//! image pull the kubelet makes for an image volume (`crictl pull`).
//!
//! - a counter checkpointed through CRI on "node A", published with `gpusnap image build` +
//!   `push` (chunked), restored on node B by two pods at once: one copy of the checkpoint on
//!   the node, both count on; a container whose start failed (the restore's deadline passed
//!   after the rootfs diff was applied) drops its hold, and the copy no other pod uses goes
//!   with it; the container created again restores (copied again from the volume containerd
//!   keeps: nothing pulled again); the pods' removal takes the copies with them;
//! - the node's limits, through `crictl start`: the node store full (`restore.max_volume_bytes`)
//!   and the restore's deadline passing during the copy are refused saying so, with nothing
//!   left; a shim killed mid-copy leaves a half-made copy that `gpusnap store gc` removes,
//!   while the copy a running pod holds stays; killed again, the next restore from a volume
//!   on the node removes it before it copies, and restores;
//! - with `restore.page_fill_min_bytes`: the page images read where the volume holds them (no
//!   copy of them on the node), every piece checked as it is read; a flipped page fails the
//!   start naming the file, leaving nothing;
//! - under `restore.signature_policy = require`: an image signed at seal restores; the same
//!   image without its signature (refused before anything of it is copied), a forged one (a page flipped, built without verification)
//!   and an image that is no checkpoint are refused at `crictl start`, saying why, with
//!   nothing running and nothing left on the node.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Result};
use gpusnap_testkit::busybox_registry::{publish_archive, registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::cmd::{check, gpusnap_ok};
use gpusnap_testkit::counter::{check_continues, count_of, Count};
use gpusnap_testkit::cri::{gpusnap_handler, CriNode, CriNodeOptions};
use gpusnap_testkit::crictl::{Crictl, CrictlPod, PidMode};
use gpusnap_testkit::faults::{point, Failpoints};
use gpusnap_testkit::rig::RigOptions;
use gpusnap_testkit::signing::{keypair, CriSigNode, Policy, Restored};
use gpusnap_testkit::Registry;
use serde_json::{json, Value};

/// Where the pods mount the checkpoint image, and the annotation that names it.
const MOUNT: &str = "/gpusnap/checkpoint";
const ANNOTATION: &str = "gpusnap.io/restore-from-volume";

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

fn run_ok(program: &str, args: &[&str]) -> Result<()> {
    let out = gpusnap_testkit::run(program, args);
    ensure!(
        out.status.success(),
        "{program} {args:?}: {}",
        gpusnap_testkit::describe(&out)
    );
    Ok(())
}

/// The image volume as the kubelet passes it to CRI.
fn image_mount(reference: &str) -> Value {
    json!({"container_path": MOUNT, "image": {"image": reference}, "readonly": true})
}

/// A node whose shim reads failpoints from `fp` (for the retry).
fn node_with_failpoints(reg: &Registry, busybox: &str, fp: &Failpoints) -> Result<CriSigNode> {
    let node = CriNode::start(CriNodeOptions {
        registry_host: Some(reg.host()),
        rig: RigOptions {
            containerd_env: vec![fp.env()],
            ..Default::default()
        },
        ..Default::default()
    })?;
    let crictl = Crictl::for_node(&node)?;
    crictl.ok(&["pull", busybox])?;
    Ok(CriSigNode {
        crictl,
        node,
        busybox: busybox.to_string(),
        run: gpusnap_testkit::counter::run_token(),
    })
}

/// The node's copies of volume checkpoints (`<checkpoint_root>/.gpusnap-volumes`): every entry.
fn copies(node: &CriSigNode) -> Vec<String> {
    let dir = node.node.checkpoint_root().join(".gpusnap-volumes");
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The copies' directories (64-hex-digit names: the image digests).
fn copy_dirs(node: &CriSigNode) -> Vec<PathBuf> {
    copies(node)
        .into_iter()
        .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|n| node.node.checkpoint_root().join(".gpusnap-volumes").join(n))
        .collect()
}

/// A new pod annotated to restore from the image volume `reference`, its counter container
/// started; when it runs it must be the checkpointed counter going on.
fn restore_from_volume(
    node: &CriSigNode,
    name: &str,
    reference: &str,
    checkpointed: &Count,
) -> Result<(CrictlPod, String, Restored)> {
    let pod = node.crictl.run_pod(
        name,
        gpusnap_handler(),
        PidMode::Container,
        &[(ANNOTATION, MOUNT)],
    )?;
    let (id, r) = node.start_in(&pod, &node.busybox, &[image_mount(reference)], 0)?;
    if let Restored::Runs(w) = &r {
        check_continues(name, checkpointed, || count_of(w.pid))?;
    }
    Ok((pod, id, r))
}

/// "Node A": a counter checkpointed through CRI (`crictl checkpoint --export`) into
/// `work/trainer.tar`; the archive and the count at the checkpoint. Node A is gone after.
fn counter_checkpointed_on_node_a(reg: &Registry, work: &Path) -> Result<(PathBuf, Count)> {
    let node_a = CriSigNode::start_with_config(&reg.host(), &reg.image(BUSYBOX_REPO), "")?;
    let counter = node_a.run_counter("trainer")?;
    let archive = work.join("trainer.tar");
    let checkpointed = node_a.checkpoint(&counter, &archive)?;
    Ok((archive, checkpointed))
}

/// A restore from the image volume `reference` in new pod `name` whose start fails saying each
/// of `why`, with nothing running and nothing left in the node's copies; the pod is removed.
fn refused_leaving_nothing(
    node: &CriSigNode,
    name: &str,
    reference: &str,
    checkpointed: &Count,
    why: &[&str],
) -> Result<()> {
    let (pod, id, r) = restore_from_volume(node, name, reference, checkpointed)?;
    let refused = r.refusal()?;
    ensure!(
        why.iter().all(|w| refused.contains(w)),
        "{name}: the refusal says why ({why:?}): {refused}"
    );
    ensure!(
        node.crictl.state(&id)? != "CONTAINER_RUNNING",
        "{name}: runs after its refusal"
    );
    ensure!(
        copies(node).is_empty(),
        "{name}: the refusal left {:?} on the node",
        copies(node)
    );
    node.crictl.remove_pod(&pod)?;
    Ok(())
}

/// Adds `line` under `[restore]` of the node's config (the shim reads it per container), or
/// removes it again.
fn restore_setting(node: &CriSigNode, line: &str, on: bool) -> Result<()> {
    let path = node.node.config_path();
    let old = fs::read_to_string(path)?;
    let new = if on {
        old.replacen("[restore]\n", &format!("[restore]\n{line}\n"), 1)
    } else {
        old.replace(&format!("{line}\n"), "")
    };
    fs::write(path, new)?;
    Ok(())
}

#[test]
fn image_volume_restores_on_a_node_that_did_nothing_beforehand() {
    check(|| {
        let reg = registry_with_busybox()?;
        let busybox = reg.image(BUSYBOX_REPO);
        let work = tempfile::tempdir()?;
        let (archive, checkpointed) = counter_checkpointed_on_node_a(&reg, work.path())?;
        let reference = publish_archive(&reg, &archive, "ckpt/trainer:1", work.path())?;
        // The same checkpoint in the classic layout: another image, so another copy.
        gpusnap_ok(&[
            "image",
            "push",
            s(&archive),
            &reg.url("ckpt/trainer:classic"),
            "--classic",
        ])?;
        let classic = reg.image("ckpt/trainer:classic");

        let fp = Failpoints::new()?;
        let node_b = node_with_failpoints(&reg, &busybox, &fp)?;
        // What the kubelet does for an image volume: pull the image like any other.
        node_b.crictl.ok(&["pull", &reference])?;
        node_b.crictl.ok(&["pull", &classic])?;

        // Two pods restoring the same image at once: both count on, from one copy.
        let (one, two) = std::thread::scope(|sc| {
            let a = sc.spawn(|| restore_from_volume(&node_b, "twin-1", &reference, &checkpointed));
            let b = sc.spawn(|| restore_from_volume(&node_b, "twin-2", &reference, &checkpointed));
            (a.join(), b.join())
        });
        let one = one.map_err(|_| anyhow::anyhow!("twin-1 panicked"))??;
        let two = two.map_err(|_| anyhow::anyhow!("twin-2 panicked"))??;
        one.2.running()?;
        two.2.running()?;
        let made = copy_dirs(&node_b);
        ensure!(made.len() == 1, "one copy expected: {:?}", copies(&node_b));
        let copy = &made[0];
        let holders_file = copy.with_extension("holders.json");
        let holders: Vec<String> = serde_json::from_slice(&fs::read(&holders_file)?)?;
        ensure!(holders.len() == 2, "both pods hold the copy: {holders:?}");
        ensure!(
            !copy.join("checkpoint/.gpusnap-chunks").exists()
                && !copy.join("checkpoint/gpusnap-chunks.json").exists()
                && copy.join("checkpoint/pages-1.img").is_file(),
            "the copy holds the assembled checkpoint, not chunks"
        );

        // A start that fails after the rootfs diff was applied (the restore's deadline passes):
        // its hold goes, and with it the copy no other pod uses; the kubelet creates the
        // container again, which restores (from the volume containerd keeps for the pod).
        restore_setting(&node_b, "deadline_seconds = 10", true)?;
        fp.arm_sleep(&point::after_phase("rootfs-diff"), 12)?;
        let (pod, _, first) = restore_from_volume(&node_b, "retry", &classic, &checkpointed)?;
        let failed = first.refusal()?;
        ensure!(
            failed.contains("ran out of time in the rootfs-diff phase"),
            "the failed start says why: {failed}"
        );
        ensure!(
            failed.contains("was removed: no other pod uses it"),
            "the failed start says what became of the copy: {failed}"
        );
        fp.disarm(&point::after_phase("rootfs-diff"));
        restore_setting(&node_b, "deadline_seconds = 10", false)?;
        ensure!(
            copy_dirs(&node_b) == made,
            "the failed start left its copy, or took the twins': {:?}",
            copies(&node_b)
        );
        let (_, again) = node_b.start_in(&pod, &busybox, &[image_mount(&classic)], 1)?;
        let again = again.running()?;
        check_continues("retry", &checkpointed, || count_of(again.pid))?;
        ensure!(
            copy_dirs(&node_b).len() == 2,
            "the retry restores from a copy of its own: {:?}",
            copies(&node_b)
        );

        // The pods go (and containerd removes their image volumes): so does the copy.
        for p in [&one.0, &two.0, &pod] {
            node_b.crictl.remove_pod(p)?;
        }
        let left = gpusnap_testkit::wait_some(Duration::from_secs(30), || {
            let c = copies(&node_b);
            c.iter()
                .all(|n| !n.ends_with(".holders.json") && n.len() != 64)
                .then_some(c)
        });
        ensure!(
            left.is_some(),
            "the copy outlived its pods: {:?}",
            copies(&node_b)
        );
        Ok(())
    })
}

#[test]
fn image_volume_refusals_say_why_and_leave_nothing() {
    check(|| {
        let reg = registry_with_busybox()?;
        let busybox = reg.image(BUSYBOX_REPO);
        let work = tempfile::tempdir()?;
        let key = keypair(work.path(), "node-a")?;
        // Node A signs what it seals (the container's spec and writable layer included).
        let node_a = CriSigNode::start(
            &reg.host(),
            &busybox,
            &Policy {
                policy: "off",
                trusted: vec![],
                signing_key: Some(&key.private),
            },
        )?;
        let counter = node_a.run_counter("trainer")?;
        let archive = work.path().join("trainer.tar");
        let checkpointed = node_a.checkpoint(&counter, &archive)?;
        drop(node_a);
        let signed = publish_archive(&reg, &archive, "ckpt/trainer:signed", work.path())?;
        // The same checkpoint without its signature, and one with a page flipped (its OCI
        // digests consistent: built without gpusnap's verification).
        let tree = work.path().join("tree");
        fs::create_dir_all(&tree)?;
        run_ok("tar", &["-xf", s(&archive), "-C", s(&tree)])?;
        let unsigned_tree = work.path().join("unsigned");
        run_ok("cp", &["-a", s(&tree), s(&unsigned_tree)])?;
        fs::remove_file(unsigned_tree.join("checkpoint/gpusnap-manifest.json.sig"))?;
        gpusnap_ok(&[
            "image",
            "push",
            s(&unsigned_tree),
            &reg.url("ckpt/trainer:unsigned"),
        ])?;
        gpusnap_testkit::fixtures::flip_byte(&tree.join("checkpoint/pages-1.img"));
        gpusnap_ok(&[
            "image",
            "push",
            s(&tree),
            &reg.url("ckpt/trainer:forged"),
            "--no-verify",
        ])?;

        let node_b = CriSigNode::start(
            &reg.host(),
            &busybox,
            &Policy {
                policy: "require",
                trusted: vec![&key.public],
                signing_key: None,
            },
        )?;
        let cases: [(&str, String, &[&str]); 3] = [
            (
                "unsigned",
                reg.image("ckpt/trainer:unsigned"),
                // Decided on the volume, before a file of it was copied.
                &[
                    "has no signature this node trusts",
                    "nothing of the image volume at /gpusnap/checkpoint was copied",
                ],
            ),
            ("forged", reg.image("ckpt/trainer:forged"), &["pages-1.img"]),
            (
                "not-a-checkpoint",
                busybox.clone(),
                &["does not hold a restorable gpusnap checkpoint"],
            ),
        ];
        for (name, reference, why) in &cases {
            node_b.crictl.ok(&["pull", reference])?;
            refused_leaving_nothing(&node_b, name, reference, &checkpointed, why)?;
        }

        // Signed at seal, with the container it restores into as signed: restored.
        node_b.crictl.ok(&["pull", &signed])?;
        restore_from_volume(&node_b, "signed", &signed, &checkpointed)?
            .2
            .running()?;
        Ok(())
    })
}

/// `restore.page_fill_min_bytes` with an image volume: the page images are not copied onto
/// the node. The restore reads them where containerd unpacked the image, checks every piece
/// against the sealed manifest as it reads it, writes for CRIU only the pages it still
/// restores, and writes the rest into the tasks CRIU left stopped. The counter goes on; the
/// node's copy holds no page image. A page flipped in the image (built without verification)
/// fails the start naming the file, with nothing running and nothing left on the node.
#[test]
fn image_volume_page_images_are_read_where_they_lie() {
    check(|| {
        let reg = registry_with_busybox()?;
        let busybox = reg.image(BUSYBOX_REPO);
        let work = tempfile::tempdir()?;
        let (archive, checkpointed) = counter_checkpointed_on_node_a(&reg, work.path())?;
        let reference = publish_archive(&reg, &archive, "ckpt/trainer:fill", work.path())?;
        let tree = work.path().join("tree");
        fs::create_dir_all(&tree)?;
        run_ok("tar", &["-xf", s(&archive), "-C", s(&tree)])?;
        gpusnap_testkit::fixtures::flip_byte(&tree.join("checkpoint/pages-1.img"));
        gpusnap_ok(&[
            "image",
            "push",
            s(&tree),
            &reg.url("ckpt/trainer:fill-forged"),
            "--no-verify",
        ])?;
        let forged = reg.image("ckpt/trainer:fill-forged");

        let node_b = CriSigNode::start_with_config(&reg.host(), &busybox, "")?;
        // Every page image of at least a page is read in place; every private area of a
        // page or more is written by the shim.
        restore_setting(&node_b, "page_fill_min_bytes = 4096", true)?;
        node_b.crictl.ok(&["pull", &reference])?;
        node_b.crictl.ok(&["pull", &forged])?;

        let (pod, _, r) = restore_from_volume(&node_b, "filled", &reference, &checkpointed)?;
        r.running()?;
        let made = copy_dirs(&node_b);
        ensure!(made.len() == 1, "one copy expected: {:?}", copies(&node_b));
        let ckpt = made[0].join("checkpoint");
        ensure!(
            ckpt.join("gpusnap-manifest.json").is_file() && !ckpt.join("pages-1.img").exists(),
            "the copy holds the checkpoint without its page image: {:?}",
            fs::read_dir(&ckpt)?
                .flatten()
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
        let log = node_b.node.rig.log_tail(600);
        ensure!(
            log.lines().any(|l| l.contains("restore complete")
                && l.contains("page_fill_bytes=")
                && !l.contains("page_fill_bytes=0")),
            "the shim wrote no pages itself:\n{}",
            log.lines()
                .filter(|l| l.contains("page") || l.contains("restore complete"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        node_b.crictl.remove_pod(&pod)?;

        refused_leaving_nothing(
            &node_b,
            "forged",
            &forged,
            &checkpointed,
            &["pages-1.img", "corrupted"],
        )?;
        Ok(())
    })
}

/// The half-made copies (`.build-…`) in the node's cache.
fn builds(node: &CriSigNode) -> Vec<String> {
    copies(node)
        .into_iter()
        .filter(|n| n.starts_with(".build-"))
        .collect()
}

/// A pod restoring from the volume `reference` whose shim is killed (SIGKILL) mid-copy (at the
/// armed failpoint): its start must fail; the pod is returned for removal.
fn killed_mid_copy(
    node: &CriSigNode,
    fp: &Failpoints,
    name: &str,
    reference: &str,
    checkpointed: &Count,
) -> Result<CrictlPod> {
    fp.arm(point::VOLUME_COPYING)?;
    std::thread::scope(|sc| -> Result<CrictlPod> {
        let start = sc.spawn(|| restore_from_volume(node, name, reference, checkpointed));
        let shim = fp.wait_reached(point::VOLUME_COPYING, Duration::from_secs(120))?;
        gpusnap_testkit::faults::kill9(shim);
        let (pod, _, r) = start
            .join()
            .map_err(|_| anyhow::anyhow!("the killed start panicked"))??;
        ensure!(
            matches!(r, Restored::Refused(_)),
            "the start whose shim was killed runs"
        );
        Ok(pod)
    })
}

#[test]
fn image_volume_node_limits_say_why_and_a_killed_copy_is_swept() {
    check(|| {
        let reg = registry_with_busybox()?;
        let busybox = reg.image(BUSYBOX_REPO);
        let work = tempfile::tempdir()?;
        let node_a = CriSigNode::start_with_config(&reg.host(), &busybox, "")?;
        let counter = node_a.run_counter("trainer")?;
        let archive = work.path().join("trainer.tar");
        let checkpointed = node_a.checkpoint(&counter, &archive)?;
        let reference = publish_archive(&reg, &archive, "ckpt/trainer:1", work.path())?;
        gpusnap_ok(&[
            "image",
            "push",
            s(&archive),
            &reg.url("ckpt/trainer:classic"),
            "--classic",
        ])?;
        let classic = reg.image("ckpt/trainer:classic");
        drop(node_a);

        let fp = Failpoints::new()?;
        let node_b = node_with_failpoints(&reg, &busybox, &fp)?;
        node_b.crictl.ok(&["pull", &reference])?;
        node_b.crictl.ok(&["pull", &classic])?;
        let refused = |name: &str, why: &[&str]| -> Result<()> {
            let (pod, id, r) = restore_from_volume(&node_b, name, &reference, &checkpointed)?;
            let e = r.refusal()?;
            for part in why {
                ensure!(e.contains(part), "{name}: the refusal says {part:?}: {e}");
            }
            ensure!(
                node_b.crictl.state(&id)? != "CONTAINER_RUNNING",
                "{name}: runs after its refusal"
            );
            ensure!(
                copies(&node_b).is_empty(),
                "{name}: the refusal left {:?} on the node",
                copies(&node_b)
            );
            node_b.crictl.remove_pod(&pod)
        };

        // The node store full: the copy would take the node's copies past the setting.
        restore_setting(&node_b, "max_volume_bytes = 1024", true)?;
        refused(
            "store-full",
            &[
                "node store of image-volume checkpoints",
                "is full",
                "restore.max_volume_bytes",
                "nothing was copied",
            ],
        )?;
        restore_setting(&node_b, "max_volume_bytes = 1024", false)?;

        // The restore's one deadline passes while the checkpoint is copied.
        restore_setting(&node_b, "deadline_seconds = 5", true)?;
        fp.arm_sleep(&point::after_phase("volume-copy"), 7)?;
        refused(
            "copy-deadline",
            &[
                "ran out of time in the volume-copy phase",
                "nothing was changed",
                "what was copied of the image volume",
            ],
        )?;
        fp.disarm(&point::after_phase("volume-copy"));
        restore_setting(&node_b, "deadline_seconds = 5", false)?;

        // A pod restored from one image holds its copy; the shim of a pod restoring another
        // is killed mid-copy, leaving that copy half-made.
        let (keeper, _, kept) = restore_from_volume(&node_b, "keeper", &reference, &checkpointed)?;
        let kept = kept.running()?;
        let held = copy_dirs(&node_b);
        ensure!(held.len() == 1, "one copy expected: {:?}", copies(&node_b));
        let killed_pod = killed_mid_copy(&node_b, &fp, "killed", &classic, &checkpointed)?;
        ensure!(
            builds(&node_b).len() == 1,
            "the killed copy left no half-made copy to sweep (the test shows nothing): {:?}",
            copies(&node_b)
        );
        let gc = gpusnap_ok(&[
            "--config",
            s(node_b.node.config_path()),
            "store",
            "gc",
            "--no-verify",
            "--json",
        ])?;
        let gc: Value = serde_json::from_str(&gc)?;
        let swept = gc["removed_volume_copies"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ensure!(
            swept.len() == 1 && swept[0].as_str().is_some_and(|p| p.contains("/.build-")),
            "gc removed {swept:?}"
        );
        ensure!(
            builds(&node_b).is_empty() && copy_dirs(&node_b) == held,
            "gc left the half-made copy or took the held one: {:?}",
            copies(&node_b)
        );
        check_continues("keeper", &checkpointed, || count_of(kept.pid))?;

        // The killed pod goes (no shim of its own is left to sweep): the next collection takes
        // its hold of a copy never made, and keeps the held copy.
        node_b.crictl.remove_pod(&killed_pod)?;
        gpusnap_ok(&[
            "--config",
            s(node_b.node.config_path()),
            "store",
            "gc",
            "--no-verify",
        ])?;
        let held_names: Vec<String> = held
            .iter()
            .flat_map(|d| {
                let n = d
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                [n.clone(), format!("{n}.holders.json"), format!("{n}.lock")]
            })
            .collect();
        ensure!(
            copies(&node_b) == held_names,
            "after the killed pod went, gc left {:?}",
            copies(&node_b)
        );
        node_b.crictl.remove_pod(&keeper)?;
        let left = gpusnap_testkit::wait_some(Duration::from_secs(30), || {
            let c = copies(&node_b);
            c.iter()
                .all(|n| !n.ends_with(".holders.json") && n.len() != 64)
                .then_some(c)
        });
        ensure!(
            left.is_some(),
            "the copy outlived its pods: {:?}",
            copies(&node_b)
        );

        // Without gc: a shim killed mid-copy again, and the next volume restore on the node
        // sweeps the half-made copy before it copies (the kubelet's retry, in a pod of its
        // own), restores, and leaves no build behind.
        let killed_again = killed_mid_copy(&node_b, &fp, "killed-2", &classic, &checkpointed)?;
        ensure!(
            builds(&node_b).len() == 1,
            "the second killed copy left no half-made copy: {:?}",
            copies(&node_b)
        );
        // containerd cleans up after the killed shim on its own time: until then the sandbox's
        // removal fails with "ttrpc: closed".
        let mut removed = Err(anyhow::anyhow!("not tried"));
        gpusnap_testkit::wait_until(Duration::from_secs(30), || {
            removed = node_b.crictl.remove_pod(&killed_again);
            removed.is_ok()
        });
        removed?;
        let (retry, _, retried) = restore_from_volume(&node_b, "retry", &classic, &checkpointed)?;
        retried.running()?;
        ensure!(
            builds(&node_b).is_empty(),
            "the next restore left the killed copy's build: {:?}",
            copies(&node_b)
        );
        node_b.crictl.remove_pod(&retry)?;
        Ok(())
    })
}
