//! One signature policy on every restore door (issue 20, item 3).
//!
//! With `restore.signature_policy = "require"` and a trusted key, an unsigned checkpoint is
//! refused before anything runs, and a signed one restores (the counter goes on), through:
//!
//! - `ctr containers checkpoint --task` → content store → `ctr containers restore --live`;
//! - CRI restore from a checkpoint archive and from a checkpoint image (crictl, containerd);
//! - the pod annotation `gpusnap.io/restore-from` (directory signature, and a registry
//!   signature verified at pull);
//! - gpusnap-runc under Podman (`--export` / `--import`, zstd archives) and CRI-O.
//!
//! Who signs: the node at seal (`checkpoint.signing_key`; the shim and gpusnap-runc), and
//! `gpusnap checkpoint sign` on a directory or an archive. A checkpoint signed on node A
//! restores on node B that trusts A's public key; a manifest changed after signing, and a
//! signature by a key B does not trust, are refused. The signature file is checked with
//! openssl alone (what `cosign verify-blob --key` checks), and one openssl made is accepted.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::busybox_registry::{publish_archive, registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::checkpoint::{
    container_checkpoint_ok, container_restore, criu_tar_blob, kill_and_remove, parse_tar,
    read_in_task, rewrite_criu_tar, tar_member, CkRig,
};
use gpusnap_testkit::cmd::{check, gpusnap_ok};
use gpusnap_testkit::counter::{
    check_continues, parse_count, run_token, wait_count, Count, COUNTER, WARM,
};
use gpusnap_testkit::fixtures::{make_checkpoint_dir, tar_tree};
use gpusnap_testkit::signing::{
    archive_checkpoint_file, archive_with_diff_file, keypair, layer_with_file, openssl_verify,
    set_policy, spec_blob_edited, CheckpointBlob, CriSigNode, KeyPair, Policy, MANIFEST,
    RW_LAYER_MEDIA_TYPE, SIGNATURE, SPEC_MEDIA_TYPE,
};
use gpusnap_testkit::{
    describe, gpusnap, text, unique, OutputExt, Registry, RigOptions, Runtime, TaskState,
};

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

/// The refusal names the policy, what was wrong and what to do.
fn assert_refusal(err: &str, why: &str) -> Result<()> {
    for part in [
        "signature_policy = require",
        why,
        "keys tried",
        "gpusnap checkpoint sign",
        "checkpoint.signing_key",
    ] {
        ensure!(
            err.contains(part),
            "{part:?} missing from the refusal: {err}"
        );
    }
    Ok(())
}

/// `require`, trusting `trusted`, the node signing with `signing_key`.
fn require<'a>(trusted: &'a Path, signing_key: Option<&'a Path>) -> Policy<'a> {
    Policy {
        policy: "require",
        trusted: vec![trusted],
        signing_key,
    }
}

const UNSIGNED: &str = "gpusnap-manifest.json.sig is missing";
const UNTRUSTED: &str = "not a signature of this manifest by any trusted key";

/// Two operators' keys: `a` is trusted by the restoring nodes, `b` is not.
struct Keys {
    _dir: tempfile::TempDir,
    a: KeyPair,
    b: KeyPair,
}

fn keys() -> Result<Keys> {
    let dir = tempfile::tempdir()?;
    let a = keypair(dir.path(), "a")?;
    let b = keypair(dir.path(), "b")?;
    Ok(Keys { _dir: dir, a, b })
}

// ----- gpusnap checkpoint sign / verify, and the format ------------------------------------

/// `gpusnap checkpoint sign DIR` writes what `cosign sign-blob` writes: openssl verifies it
/// with the public key; `gpusnap checkpoint verify` accepts it with that key only; and a
/// signature made with openssl alone (as cosign would make it) is accepted too.
#[test]
fn directory_signatures_are_cosign_blob_signatures() {
    check(|| {
        let k = keys()?;
        let work = tempfile::tempdir()?;
        let dir = work.path().join("ck");
        fs::create_dir(&dir)?;
        make_checkpoint_dir(&dir);
        let out = gpusnap_ok(&["checkpoint", "sign", s(&dir), "--key", s(&k.a.private)])?;
        ensure!(out.contains(SIGNATURE), "{out}");
        let sig = fs::read(dir.join(SIGNATURE))?;
        openssl_verify(&k.a.public, &sig, &dir.join(MANIFEST))?;
        ensure!(
            openssl_verify(&k.b.public, &sig, &dir.join(MANIFEST)).is_err(),
            "openssl verified a signature with the wrong key"
        );
        gpusnap_ok(&["checkpoint", "verify", s(&dir), "--key", s(&k.a.public)])?;
        let other = gpusnap(["checkpoint", "verify", s(&dir), "--key", s(&k.b.public)]);
        ensure!(!other.status.success(), "{}", describe(&other));

        // Made by openssl: `openssl dgst -sha256 -sign KEY MANIFEST | base64 -w0`.
        let der = work.path().join("sig.der");
        let made = std::process::Command::new("openssl")
            .args(["dgst", "-sha256", "-sign", s(&k.b.private), "-out", s(&der)])
            .arg(dir.join(MANIFEST))
            .output()?;
        ensure!(made.status.success(), "{}", describe(&made));
        let b64 = std::process::Command::new("openssl")
            .args(["base64", "-A", "-in", s(&der)])
            .output()?;
        ensure!(b64.status.success(), "{}", describe(&b64));
        fs::write(dir.join(SIGNATURE), &b64.stdout)?;
        gpusnap_ok(&["checkpoint", "verify", s(&dir), "--key", s(&k.b.public)])?;

        // Not a gpusnap checkpoint: nothing to sign.
        let empty = work.path().join("empty");
        fs::create_dir(&empty)?;
        let out = gpusnap(["checkpoint", "sign", s(&empty), "--key", s(&k.a.private)]);
        ensure!(
            !out.status.success() && text(&out.stderr).contains("not a gpusnap checkpoint"),
            "{}",
            describe(&out)
        );
        Ok(())
    })
}

// ----- ctr ---------------------------------------------------------------------------------

fn ctr_count(rig: &CkRig, id: &str) -> Option<Count> {
    parse_count(&read_in_task(rig, id, "/tmp/count")?)
}

/// A counter under gpusnap, checkpointed into `image` with `ctr containers checkpoint --task
/// --rw` (leaving it running; the writable layer with the counter's file travels), then
/// killed; the count at the checkpoint.
fn ctr_checkpoint(rig: &CkRig, id: &str, image: &str) -> Result<Count> {
    let run = run_token();
    rig.run_detached(Runtime::Gpusnap, id, &["sh", "-c", COUNTER, run.as_str()])?;
    let before = wait_count(&run, id, WARM, || ctr_count(rig, id))?;
    container_checkpoint_ok(rig, id, image, true)?;
    kill_and_remove(rig, id)?;
    Ok(before)
}

/// `ctr containers restore --live --rw ID IMAGE`: `Ok(None)` when it runs the checkpointed
/// process going on, `Ok(Some(error))` when refused (nothing runs).
fn ctr_restore(rig: &CkRig, id: &str, image: &str, checkpointed: &Count) -> Result<Option<String>> {
    let out = container_restore(rig, id, image, true, true)?;
    if !out.status.success() {
        ensure!(
            rig.task_state(id)? != Some(TaskState::Running),
            "ctr restore failed but {id} runs: {}",
            out.describe()
        );
        return Ok(Some(out.describe()));
    }
    rig.wait_task_state(id, TaskState::Running, Duration::from_secs(30))?;
    check_continues(id, checkpointed, || ctr_count(rig, id))?;
    Ok(None)
}

/// `ctr` checkpoint images under require: unsigned and signed-by-an-untrusted-key refused,
/// signed by the node's key restored; the signature travels in the image's criu.tar and
/// openssl verifies it there; the manifest changed in the content store with the old
/// signature kept is refused.
#[test]
fn ctr_checkpoint_images_restore_only_when_signed_by_a_trusted_key() {
    check(|| {
        let k = keys()?;
        let conf_dir = tempfile::tempdir()?;
        let config = conf_dir.path().join("gpusnap.toml");
        let policy = |signing_key| require(&k.a.public, signing_key);
        set_policy(&config, &policy(None))?;
        let rig = CkRig::start_with(RigOptions {
            require_gpusnap: true,
            containerd_env: vec![("GPUSNAP_CONFIG".into(), s(&config).into())],
            ..RigOptions::default()
        })?;

        // Unsigned (no signing key on this node yet).
        let before = ctr_checkpoint(&rig, "unsigned", "ck/unsigned:1")?;
        let blob = criu_tar_blob(&rig, "ck/unsigned:1")?;
        ensure!(
            tar_member(&fs::read(&blob)?, SIGNATURE)?.is_none(),
            "a node without checkpoint.signing_key signed"
        );
        let err = ctr_restore(&rig, "unsigned-r", "ck/unsigned:1", &before)?
            .context("an unsigned checkpoint was restored under require")?;
        assert_refusal(&err, UNSIGNED)?;

        // Signed by a key this node does not trust.
        set_policy(&config, &policy(Some(&k.b.private)))?;
        let before = ctr_checkpoint(&rig, "untrusted", "ck/untrusted:1")?;
        let err = ctr_restore(&rig, "untrusted-r", "ck/untrusted:1", &before)?
            .context("a checkpoint signed by an untrusted key was restored")?;
        assert_refusal(&err, UNTRUSTED)?;

        // Signed at seal by the node's trusted key: restored, the counter goes on.
        set_policy(&config, &policy(Some(&k.a.private)))?;
        let before = ctr_checkpoint(&rig, "signed", "ck/signed:1")?;
        let blob = criu_tar_blob(&rig, "ck/signed:1")?;
        let tar = fs::read(&blob)?;
        let sig = tar_member(&tar, SIGNATURE)?.context("no signature in the criu.tar")?;
        let manifest = tar_member(&tar, MANIFEST)?.context("no manifest in the criu.tar")?;
        let m = conf_dir.path().join("manifest.json");
        fs::write(&m, &manifest)?;
        openssl_verify(&k.a.public, &sig, &m)?;
        ensure!(
            ctr_restore(&rig, "signed-r", "ck/signed:1", &before)?.is_none(),
            "refused"
        );

        // The manifest changed in the content store (still a valid manifest for the files),
        // the signature kept: refused for the signature, before validation.
        let before_tamper = before.clone();
        let original = rewrite_criu_tar(&blob, |entries| {
            let e = entries
                .iter_mut()
                .find(|e| e.name().trim_start_matches("./") == MANIFEST)
                .context("manifest entry")?;
            let mut json: serde_json::Value = serde_json::from_slice(&manifest)?;
            json["container_id"] = "someone-else".into();
            e.set_data(serde_json::to_vec_pretty(&json)?);
            Ok(())
        })?;
        ensure!(!parse_tar(&original)?.is_empty());
        let err = ctr_restore(&rig, "tampered-r", "ck/signed:1", &before_tamper)?
            .context("a changed manifest was restored with the old signature")?;
        assert_refusal(&err, UNTRUSTED)?;
        Ok(())
    })
}

// ----- CRI: archives, checkpoint images, restore-from -------------------------------------

/// Node A signs at seal with key a (its own policy off); node B requires a signature by a.
struct TwoNodes {
    k: Keys,
    reg: Registry,
    a: CriSigNode,
    b: CriSigNode,
    work: tempfile::TempDir,
}

fn two_nodes() -> Result<TwoNodes> {
    let k = keys()?;
    let reg = registry_with_busybox()?;
    let busybox = reg.image(BUSYBOX_REPO);
    let a = CriSigNode::start(
        &reg.host(),
        &busybox,
        &Policy {
            policy: "off",
            trusted: vec![],
            signing_key: Some(&k.a.private),
        },
    )?;
    let b = CriSigNode::start(
        &reg.host(),
        &busybox,
        &Policy {
            policy: "require",
            trusted: vec![&k.a.public],
            signing_key: None,
        },
    )?;
    Ok(TwoNodes {
        k,
        reg,
        a,
        b,
        work: tempfile::tempdir()?,
    })
}

impl TwoNodes {
    /// A counter on `node`, exported to `<work>/<name>.tar` and its pod removed.
    fn export(&self, node: &CriSigNode, name: &str) -> Result<(PathBuf, Count)> {
        let w = node.run_counter(&unique(name))?;
        let archive = self.work.path().join(format!("{name}.tar"));
        let count = node.checkpoint(&w, &archive)?;
        node.crictl.remove_pod(&w.pod)?;
        Ok((archive, count))
    }
}

/// CRI restores from an archive: B refuses B's own unsigned export, restores it once
/// `gpusnap checkpoint sign` signed the archive with a, restores A's export (signed at seal on
/// A) — signed on one node, restored on another — and refuses an archive signed with b and one
/// whose manifest changed after A signed it.
#[test]
fn cri_archives_restore_across_nodes_only_when_signed_by_a_trusted_key() {
    check(|| {
        let t = two_nodes()?;
        let (unsigned, u_count) = t.export(&t.b, "unsigned")?;
        ensure!(
            archive_checkpoint_file(&unsigned, SIGNATURE)?.is_none(),
            "B has no signing key but its export is signed"
        );
        let err =
            t.b.restore(&unique("u-refused"), s(&unsigned), &[], &u_count)?
                .refusal()?;
        assert_refusal(&err, UNSIGNED)?;

        // An untrusted key's signature, on a copy.
        let by_b = t.work.path().join("by-b.tar");
        fs::copy(&unsigned, &by_b)?;
        gpusnap_ok(&["checkpoint", "sign", s(&by_b), "--key", s(&t.k.b.private)])?;
        let err =
            t.b.restore(&unique("b-refused"), s(&by_b), &[], &u_count)?
                .refusal()?;
        assert_refusal(&err, UNTRUSTED)?;

        // The operator signs the archive in place with a trusted key.
        gpusnap_ok(&[
            "checkpoint",
            "sign",
            s(&unsigned),
            "--key",
            s(&t.k.a.private),
        ])?;
        let sig = archive_checkpoint_file(&unsigned, SIGNATURE)?.context("no signature")?;
        let m = t.work.path().join("u-manifest.json");
        fs::write(
            &m,
            archive_checkpoint_file(&unsigned, MANIFEST)?.context("manifest")?,
        )?;
        openssl_verify(&t.k.a.public, &sig, &m)?;
        t.b.restore(&unique("u-signed"), s(&unsigned), &[], &u_count)?
            .running()?;

        // Signed at seal on A, restored on B.
        let (signed, s_count) = t.export(&t.a, "from-a")?;
        ensure!(
            archive_checkpoint_file(&signed, SIGNATURE)?.is_some(),
            "A's export carries no signature"
        );
        t.b.restore(&unique("from-a"), s(&signed), &[], &s_count)?
            .running()?;

        // The manifest changed after signing, the signature kept.
        let unpacked = t.work.path().join("tampered");
        fs::create_dir(&unpacked)?;
        tar::Archive::new(fs::File::open(&signed)?).unpack(&unpacked)?;
        let manifest = unpacked.join("checkpoint").join(MANIFEST);
        let mut json: serde_json::Value = serde_json::from_slice(&fs::read(&manifest)?)?;
        json["container_id"] = "someone-else".into();
        fs::write(&manifest, serde_json::to_vec_pretty(&json)?)?;
        let tampered = t.work.path().join("tampered.tar");
        tar_tree(&unpacked, &tampered);
        let err =
            t.b.restore(&unique("tampered"), s(&tampered), &[], &s_count)?
                .refusal()?;
        assert_refusal(&err, UNTRUSTED)?;
        Ok(())
    })
}

/// Checkpoint images (`gpusnap image build` / `push`, CRI pull) and `gpusnap.io/restore-from`
/// under require on B: the directory signature made on A travels through build, push, pull
/// (under require too) and extraction and is accepted by both doors; the unsigned image is
/// refused by both (the pull refuses it) — until its registry signature (`gpusnap image sign`)
/// is verified at pull, which the annotation door passes on to the transaction as evidence.
#[test]
fn cri_checkpoint_images_and_restore_from_under_require() {
    check(|| {
        let t = two_nodes()?;
        let (signed, s_count) = t.export(&t.a, "img-signed")?;
        let (unsigned, u_count) = t.export(&t.b, "img-unsigned")?;
        let signed_ref = publish_archive(&t.reg, &signed, "gpusnap/ck:signed", t.work.path())?;
        let unsigned_ref =
            publish_archive(&t.reg, &unsigned, "gpusnap/ck:unsigned", t.work.path())?;

        // The checkpoint image as the container image (containerd's CRI restore).
        t.b.crictl.ok(&["pull", &unsigned_ref])?;
        let err =
            t.b.restore(&unique("img-u"), &unsigned_ref, &[], &u_count)?
                .refusal()?;
        assert_refusal(&err, UNSIGNED)?;
        t.b.crictl.ok(&["pull", &signed_ref])?;
        t.b.restore(&unique("img-s"), &signed_ref, &[], &s_count)?
            .running()?;

        // Extracted under B's checkpoint root by B's own pull (require): the signed one is
        // accepted on its directory signature, the unsigned one refused at pull; the
        // annotation then names what was pulled.
        let root = t.b.node.checkpoint_root();
        for (tag, name) in [("signed", "ck-signed"), ("unsigned", "ck-unsigned")] {
            let out = gpusnap([
                "--config",
                s(t.b.node.config_path()),
                "image",
                "pull",
                &t.reg.url(&format!("gpusnap/ck:{tag}")),
                "--extract",
                name,
            ]);
            ensure!(
                out.status.success() == (tag == "signed"),
                "pull of {tag}: {}",
                describe(&out)
            );
        }
        ensure!(
            root.join("ck-signed/checkpoint").join(SIGNATURE).is_file(),
            "the signature did not survive build, push, pull and extraction"
        );
        ensure!(!root.join("ck-unsigned").exists());
        t.b.restore(
            &unique("rf-s"),
            &t.b.busybox,
            &[("gpusnap.io/restore-from", "ck-signed")],
            &s_count,
        )?
        .running()?;

        // The unsigned image gets a registry signature by a; B's own pull (require) verifies
        // it, and the annotation door passes that on: restored without a directory signature.
        gpusnap_ok(&[
            "image",
            "sign",
            &t.reg.url("gpusnap/ck:unsigned"),
            "--key",
            s(&t.k.a.private),
        ])?;
        gpusnap_ok(&[
            "--config",
            s(t.b.node.config_path()),
            "image",
            "pull",
            &t.reg.url("gpusnap/ck:unsigned"),
            "--extract",
            "ck-registry-signed",
        ])?;
        ensure!(!root
            .join("ck-registry-signed/checkpoint")
            .join(SIGNATURE)
            .exists());
        t.b.restore(
            &unique("rf-reg"),
            &t.b.busybox,
            &[("gpusnap.io/restore-from", "ck-registry-signed")],
            &u_count,
        )?
        .running()?;
        Ok(())
    })
}

// ----- gpusnap-runc: Podman and CRI-O -------------------------------------------------------

/// Podman with gpusnap-runc under require: an unsigned zstd export is refused at import, the
/// same archive signed in place (still zstd) by `gpusnap checkpoint sign` is imported and goes
/// on. Then gpusnap-runc signs at seal with the node's config in its default place
/// (`/etc/gpusnap/config.toml`, put back as it was afterwards): Podman 4.3 hands the
/// runtime's `checkpoint` no `GPUSNAP_CONFIG`, so that is where the node's signing key is
/// read from; the export carries a signature `gpusnap checkpoint verify` accepts, and imports
/// under require.
#[test]
fn podman_import_and_restore_under_require() {
    use gpusnap_testkit::podman::{self as pm, Podman};
    check(|| {
        let k = keys()?;
        let p = Podman::new()?;
        let policy = |signing_key| require(&k.a.public, signing_key);
        set_policy(&p.gpusnap_config, &policy(None))?;
        let marker = unique("gps-counter");

        let a = unique("gps-a");
        p.run_counter(&a, &marker)?;
        pm::wait_count(&marker, &a, pm::WARM, || p.count(&a))?;
        let before = pm::wait_count(&marker, &a, 0, || p.count(&a))?;
        let export = p.dir().join("a.tar.zst");
        p.ok(&["container", "checkpoint", "--export", s(&export), &a])?;
        let b = unique("gps-b");
        let out = p.run(&["container", "restore", "--import", s(&export), "--name", &b])?;
        ensure!(
            !out.status.success(),
            "an unsigned export was imported: {}",
            describe(&out)
        );
        assert_refusal(&text(&out.stderr), UNSIGNED)?;

        gpusnap_ok(&["checkpoint", "sign", s(&export), "--key", s(&k.a.private)])?;
        ensure!(
            fs::read(&export)?.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]),
            "the signed archive is no longer zstd"
        );
        let c = unique("gps-c");
        p.ok(&["container", "restore", "--import", s(&export), "--name", &c])?;
        pm::check_continues(&c, &before, || p.count(&c))?;

        // The node's config in its default place, with the signing key: signed at seal.
        let node = p.dir().join("node-config.toml");
        fs::copy(&p.gpusnap_config, &node)?;
        set_policy(&node, &policy(Some(&k.a.private)))?;
        let _node_config = gpusnap_testkit::can_fail::CriuConfigFile::replace(
            // gpusnap-runc's default config path (gpusnap_config::DEFAULT_CONFIG_PATH).
            Path::new("/etc/gpusnap/config.toml"),
            &fs::read_to_string(&node)?,
        )?;
        let before = pm::wait_count(&marker, &c, 0, || p.count(&c))?;
        let sealed = p.dir().join("c.tar.zst");
        p.ok(&["container", "checkpoint", "--export", s(&sealed), &c])?;
        ensure!(
            archive_checkpoint_file(&sealed, SIGNATURE)?.is_some(),
            "gpusnap-runc did not sign at seal under Podman"
        );
        gpusnap_ok(&["checkpoint", "verify", s(&sealed), "--key", s(&k.a.public)])?;
        let d = unique("gps-d");
        p.ok(&["container", "restore", "--import", s(&sealed), "--name", &d])?;
        pm::check_continues(&d, &before, || p.count(&d))?;

        // Signed at seal, its rootfs diff replaced (one file added): Podman applies it, the
        // restore compares the container's writable layer with the signed one and refuses.
        let plain = p.dir().join("d.tar");
        p.ok(&[
            "container",
            "checkpoint",
            "--export",
            s(&plain),
            "--compress",
            "none",
            &d,
        ])?;
        let replaced = p.dir().join("d-replaced.tar");
        archive_with_diff_file(&plain, &replaced, EVIL, EVIL_DATA)?;
        let e = unique("gps-e");
        let out = p.run(&[
            "container",
            "restore",
            "--import",
            s(&replaced),
            "--name",
            &e,
        ])?;
        ensure!(
            !out.status.success(),
            "an export with a replaced rootfs diff was imported: {}",
            describe(&out)
        );
        let err = text(&out.stderr);
        for part in ["writable layer", "rootfs-diff.tar", &format!("/{EVIL}")] {
            ensure!(
                err.contains(part),
                "{part:?} missing from the refusal: {err}"
            );
        }
        let f = unique("gps-f");
        p.ok(&["container", "restore", "--import", s(&plain), "--name", &f])?;

        for name in [&a, &b, &c, &d, &e, &f] {
            let _ = p.run(&["rm", "-f", "-t", "1", name]);
        }
        Ok(())
    })
}

/// CRI-O with gpusnap-runc under require: an unsigned export is refused at `crictl start`,
/// signed with `gpusnap checkpoint sign` it restores into a new pod; with the node's
/// signing key gpusnap-runc signs at seal and the export restores.
#[test]
fn crio_restore_under_require() {
    use gpusnap_testkit::crio::{Crio, BUSYBOX_IMAGE};
    use gpusnap_testkit::podman as pm;
    check(|| {
        let k = keys()?;
        let c = Crio::start(None)?;
        let policy = |signing_key| require(&k.a.public, signing_key);
        set_policy(&c.gpusnap_config, &policy(None))?;
        let marker = unique("gcs-counter");
        let counter = |name: &str| -> Result<(String, Count)> {
            let (pod, cfg) = c.run_pod(name)?;
            let id = c.create_and_start(
                &pod,
                &cfg,
                &c.container_config("counter", BUSYBOX_IMAGE, Some(&marker), &[]),
            )?;
            pm::wait_count(&marker, name, pm::WARM, || c.count(&id))?;
            let before = pm::wait_count(&marker, name, 0, || c.count(&id))?;
            Ok((id, before))
        };
        let export = |id: &str, archive: &Path| -> Result<Count> {
            let before = pm::wait_count(&marker, id, 0, || c.count(id))?;
            c.ok(&["checkpoint", &format!("--export={}", archive.display()), id])?;
            Ok(before)
        };
        // `Ok(Some(err))` when `crictl start` refuses.
        let restore = |name: &str, archive: &Path, before: &Count| -> Result<Option<String>> {
            let (pod, cfg) = c.run_pod(name)?;
            let ctr = c.container_config("counter", s(archive), None, &[]);
            let created = c.create(&pod, &cfg, &ctr)?;
            ensure!(created.status.success(), "{}", describe(&created));
            let id = text(&created.stdout).trim().to_string();
            let started = c.crictl(&["start", &id])?;
            if !started.status.success() {
                return Ok(Some(text(&started.stderr)));
            }
            pm::check_continues(name, before, || c.count(&id))?;
            Ok(None)
        };

        let (a, _) = counter(&unique("gcs-a"))?;
        let archive = c.dir().join("a.tar");
        let before = export(&a, &archive)?;
        let err = restore(&unique("gcs-u"), &archive, &before)?
            .context("an unsigned archive was restored")?;
        assert_refusal(&err, UNSIGNED)?;
        gpusnap_ok(&["checkpoint", "sign", s(&archive), "--key", s(&k.a.private)])?;
        ensure!(
            restore(&unique("gcs-s"), &archive, &before)?.is_none(),
            "refused"
        );

        set_policy(&c.gpusnap_config, &policy(Some(&k.a.private)))?;
        let (d, _) = counter(&unique("gcs-d"))?;
        let archive = c.dir().join("d.tar");
        let before = export(&d, &archive)?;
        ensure!(
            archive_checkpoint_file(&archive, SIGNATURE)?.is_some(),
            "gpusnap-runc did not sign at seal"
        );
        ensure!(
            restore(&unique("gcs-n"), &archive, &before)?.is_none(),
            "refused"
        );
        // The same export, its rootfs diff replaced (one file added): CRI-O applies it, the
        // restore compares the container's writable layer with the signed one and refuses.
        let replaced = c.dir().join("d-replaced.tar");
        archive_with_diff_file(&archive, &replaced, EVIL, EVIL_DATA)?;
        let err = restore(&unique("gcs-r"), &replaced, &before)?
            .context("an export with a replaced rootfs diff was restored")?;
        for part in ["writable layer", "rootfs-diff.tar", &format!("/{EVIL}")] {
            ensure!(
                err.contains(part),
                "{part:?} missing from the refusal: {err}"
            );
        }
        c.remove_all_pods()?;
        Ok(())
    })
}

// ----- require covers every part of the checkpoint (issue 28, finding 3) ------------------

/// A file the replaced layers add: what an attacker would make the restored container run.
const EVIL: &str = "bin/gpusnap-evil";
const EVIL_DATA: &[u8] = b"#!/bin/sh\necho owned > /dev/kmsg\n";

/// Which shim `ctr` restores through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CtrDoor {
    /// containerd-shim-gpusnap-v2.
    Shim,
    /// containerd-shim-runc-v2 with gpusnap-runc as its runc binary (`BinaryName`, carried by
    /// the checkpoint image's runtime options into the restore).
    RuncV2GpusnapRunc,
}

/// A private containerd whose gpusnap (shim or gpusnap-runc, through `GPUSNAP_CONFIG`)
/// requires checkpoints signed by `k.a` and signs at seal with it.
fn require_rig(k: &Keys, door: CtrDoor, dir: &Path) -> Result<CkRig> {
    let config = dir.join("gpusnap.toml");
    // gpusnap-runc runs runc, which runs criu from its PATH: name CRIU's directory.
    fs::write(&config, gpusnap_testkit::paths::criu_config())?;
    set_policy(&config, &require(&k.a.public, Some(&k.a.private)))?;
    CkRig::start_with(RigOptions {
        require_gpusnap: door == CtrDoor::Shim,
        containerd_env: vec![("GPUSNAP_CONFIG".into(), s(&config).into())],
        ..RigOptions::default()
    })
}

/// The counter on `door`, checkpointed with `ctr containers checkpoint --task --rw` into
/// `image` (signed at seal), then killed and removed.
fn ctr_checkpoint_on(rig: &CkRig, door: CtrDoor, id: &str, image: &str) -> Result<Count> {
    let run = run_token();
    match door {
        CtrDoor::Shim => {
            rig.run_detached(Runtime::Gpusnap, id, &["sh", "-c", COUNTER, run.as_str()])?;
        }
        CtrDoor::RuncV2GpusnapRunc => {
            let opts = gpusnap_testkit::RunOpts {
                extra_args: vec![
                    "--runc-binary".into(),
                    gpusnap_testkit::binary("gpusnap-runc")
                        .display()
                        .to_string(),
                ],
                ..Default::default()
            };
            rig.run_detached_with(
                Runtime::RuncV2,
                id,
                &["sh", "-c", COUNTER, run.as_str()],
                &opts,
            )?;
        }
    }
    let before = wait_count(&run, id, WARM, || ctr_count(rig, id))?;
    container_checkpoint_ok(rig, id, image, true)?;
    kill_and_remove(rig, id)?;
    Ok(before)
}

/// Under require, through `door`: the node-signed checkpoint image restores and goes on; the
/// same image with its rw layer replaced (one file added) or its spec widened
/// (`linux.resources.devices` = `a *:* rwm`) is refused before CRIU runs, the refusal naming
/// the part (and the first differing path, or the field).
fn ctr_require_covers_every_part(door: CtrDoor) -> Result<()> {
    let k = keys()?;
    let dir = tempfile::tempdir()?;
    let rig = require_rig(&k, door, dir.path())?;
    let image = "ck/whole:1";
    let before = ctr_checkpoint_on(&rig, door, "whole", image)?;

    // The rw layer replaced: containerd applies it to the new container's snapshot.
    let rw = CheckpointBlob::of(&rig, image, RW_LAYER_MEDIA_TYPE)?;
    rw.replace(&layer_with_file(rw.pristine(), EVIL, EVIL_DATA)?)?;
    let err = ctr_restore(&rig, "rw-replaced", image, &before)?
        .context("a checkpoint whose rw layer was replaced was restored under require")?;
    for part in [
        "writable layer",
        "rw layer",
        &format!("/{EVIL}"),
        "signature_policy = require",
    ] {
        ensure!(
            err.contains(part),
            "{part:?} missing from the refusal: {err}"
        );
    }
    ensure!(
        !err.contains("criu failed"),
        "refused by CRIU, not before it: {err}"
    );
    eprintln!("{door:?}, rw layer replaced: refused as it must be: {err}");
    rig.ctr(&["containers", "delete", "rw-replaced"])?;
    rw.put_back()?;

    // The spec widened: containerd writes it as the new container's config.json.
    let spec = CheckpointBlob::of(&rig, image, SPEC_MEDIA_TYPE)?;
    spec.replace(&spec_blob_edited(spec.pristine(), |v| {
        v["linux"]["resources"]["devices"] = serde_json::json!([{"allow": true, "access": "rwm"}]);
    })?)?;
    let err = ctr_restore(&rig, "spec-widened", image, &before)?
        .context("a checkpoint whose spec was widened was restored under require")?;
    for part in [
        "the spec of the container being restored",
        "linux.resources.devices",
        "signature_policy = require",
    ] {
        ensure!(
            err.contains(part),
            "{part:?} missing from the refusal: {err}"
        );
    }
    eprintln!("{door:?}, spec widened: refused as it must be: {err}");
    rig.ctr(&["containers", "delete", "spec-widened"])?;
    spec.put_back()?;

    // As signed: restored, the counter goes on.
    ensure!(
        ctr_restore(&rig, "as-signed", image, &before)?.is_none(),
        "the signed checkpoint was refused"
    );
    Ok(())
}

#[test]
fn ctr_through_the_shim_require_covers_the_rw_layer_and_the_spec() {
    check(|| ctr_require_covers_every_part(CtrDoor::Shim))
}

#[test]
fn ctr_through_runc_v2_and_gpusnap_runc_require_covers_the_rw_layer_and_the_spec() {
    check(|| ctr_require_covers_every_part(CtrDoor::RuncV2GpusnapRunc))
}

/// CRI (crictl, containerd) under require on B: A's export, signed at seal, restores; the same
/// archive with its `rootfs-diff.tar` replaced (one file added; containerd applies it between
/// the shim's Create and Start) is refused before CRIU runs, naming `rootfs-diff.tar` and the
/// path; the signed archive restored into a container whose CRI request widens the spec (one
/// more capability than the pod that was checkpointed had) is refused, naming the field.
#[test]
fn cri_require_refuses_a_replaced_rootfs_diff_and_a_widened_spec() {
    check(|| {
        let t = two_nodes()?;
        let (signed, count) = t.export(&t.a, "diff")?;
        let replaced = t.work.path().join("diff-replaced.tar");
        archive_with_diff_file(&signed, &replaced, EVIL, EVIL_DATA)?;
        ensure!(
            archive_checkpoint_file(&replaced, SIGNATURE)?
                == archive_checkpoint_file(&signed, SIGNATURE)?,
            "the replaced archive must carry A's signature unchanged"
        );
        let err =
            t.b.restore(&unique("diff-replaced"), s(&replaced), &[], &count)?
                .refusal()?;
        for part in [
            "writable layer",
            "rootfs-diff.tar",
            &format!("/{EVIL}"),
            "signature_policy = require",
        ] {
            ensure!(
                err.contains(part),
                "{part:?} missing from the refusal: {err}"
            );
        }
        ensure!(
            !err.contains("criu failed"),
            "refused by CRIU, not before it: {err}"
        );
        eprintln!("CRI, rootfs-diff.tar replaced: refused as it must be: {err}");

        // The kubelet's request decides the restored container's spec on this door; the
        // signature bounds it by the checkpointed container's.
        let widened = serde_json::json!({"capabilities": {"add_capabilities": ["SYS_ADMIN"]}});
        let err =
            t.b.start_pod_with(&unique("spec-widened"), &[], s(&signed), &widened)?
                .refusal()?;
        for part in [
            "the spec of the container being restored",
            "CAP_SYS_ADMIN",
            "signature_policy = require",
        ] {
            ensure!(
                err.contains(part),
                "{part:?} missing from the refusal: {err}"
            );
        }
        ensure!(
            !err.contains("criu failed"),
            "refused by CRIU, not before it: {err}"
        );
        eprintln!("CRI, spec widened: refused as it must be: {err}");

        t.b.restore(&unique("diff-signed"), s(&signed), &[], &count)?
            .running()?;
        Ok(())
    })
}

/// `gpusnap.io/restore-from` after `gpusnap image pull --extract` on B, whose policy is
/// `require` for the pull too: an image with no registry signature but whose checkpoint
/// directory A signed at seal is pulled (verified after extraction, before it is put in
/// place) and restores; the same checkpoint with its rootfs diff replaced is pulled (the
/// directory signature holds) but refused at restore, before CRIU runs, naming
/// `rootfs-diff.tar` and the path; B's own unsigned export is refused at pull and leaves
/// nothing in the checkpoint root.
#[test]
fn restore_from_after_a_pull_under_require_covers_the_rootfs_diff() {
    check(|| {
        let t = two_nodes()?;
        let (signed, count) = t.export(&t.a, "rf")?;
        let replaced = t.work.path().join("rf-replaced.tar");
        archive_with_diff_file(&signed, &replaced, EVIL, EVIL_DATA)?;
        let (unsigned, _) = t.export(&t.b, "rf-unsigned")?;
        for (archive, tag) in [
            (&signed, "signed"),
            (&replaced, "replaced"),
            (&unsigned, "unsigned"),
        ] {
            publish_archive(&t.reg, archive, &format!("gpusnap/rf:{tag}"), t.work.path())?;
        }
        let root = t.b.node.checkpoint_root();
        let pull = |tag: &str, name: &str| {
            gpusnap([
                "--config",
                s(t.b.node.config_path()),
                "image",
                "pull",
                &t.reg.url(&format!("gpusnap/rf:{tag}")),
                "--extract",
                name,
            ])
        };
        for (tag, name) in [("signed", "rf-signed"), ("replaced", "rf-replaced")] {
            let out = pull(tag, name);
            ensure!(
                out.status.success(),
                "pull of {tag} under require: {}",
                describe(&out)
            );
            ensure!(
                text(&out.stdout).contains("the checkpoint's own signature verified"),
                "{}",
                describe(&out)
            );
        }
        let out = pull("unsigned", "rf-unsigned");
        ensure!(
            !out.status.success(),
            "an unsigned image was pulled under require: {}",
            describe(&out)
        );
        let err = text(&out.stderr);
        ensure!(
            err.contains("signature_policy = require") && err.contains(SIGNATURE),
            "{err}"
        );
        let left: Vec<String> = fs::read_dir(&root)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        ensure!(
            !left.iter().any(|n| n.contains("rf-unsigned")),
            "the refused pull left {left:?} in {}",
            root.display()
        );

        let err =
            t.b.restore(
                &unique("rf-replaced"),
                &t.b.busybox,
                &[("gpusnap.io/restore-from", "rf-replaced")],
                &count,
            )?
            .refusal()?;
        for part in [
            "writable layer",
            "rootfs-diff.tar",
            "applied by gpusnap",
            &format!("/{EVIL}"),
            "signature_policy = require",
        ] {
            ensure!(
                err.contains(part),
                "{part:?} missing from the refusal: {err}"
            );
        }
        eprintln!("restore-from, rootfs diff replaced: refused as it must be: {err}");
        t.b.restore(
            &unique("rf-signed"),
            &t.b.busybox,
            &[("gpusnap.io/restore-from", "rf-signed")],
            &count,
        )?
        .running()?;
        Ok(())
    })
}
