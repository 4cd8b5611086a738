//! Encrypted checkpoint images (issue 22) through `gpusnap-runc`, the door CRI-O and Podman
//! run, with the CUDA driver double as the container's driver (posix engine: the device memory
//! travels as a GPU-extent layer of its own):
//!
//! `gpusnap-runc checkpoint` → `gpusnap image build --encrypt-recipient jwe:PUB` (every layer
//! encrypted) → `gpusnap inspect` of the layout, without and with the key (and of the altered
//! images below: refused) → `gpusnap image
//! push` to a registry serving TLS with authentication → `gpusnap image pull --extract NAME`,
//! decrypting with the node's `restore.decryption_keys` → `gpusnap-runc restore` of the
//! extracted checkpoint: the same process counts on and has its device memory back.
//!
//! Before that, the refusals of `gpusnap image pull --extract` (the decryption every door
//! relies on; `gpusnap.io/restore-from` restores what it extracted): the wrong key, no key,
//! ciphertext tampered with and a wrapped key swapped between two layers (digests recomputed,
//! pushed as a registry operator could serve them). Each is refused in one line naming the
//! image (and, for the keys, the recipient that would open it) and leaves nothing: no
//! destination, no staging directory, no store reference or temporary file, only verified
//! blobs in the store; `gpusnap-runc restore` of the name it would have had is refused.

use std::fs;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::bundle::BusyboxContainer;
use gpusnap_testkit::cmd::{check, gpusnap_ok};
use gpusnap_testkit::counter::{check_continues, wait_count};
use gpusnap_testkit::crypt_doors::{key_fingerprint, NothingLeft, Refusal, TlsRegistry};
use gpusnap_testkit::gpu::{self, Cuda, Engine, GpuDouble};
use gpusnap_testkit::ocicrypt::{key_pair, recipient, KeyKind};
use gpusnap_testkit::runc_gpu::{runc_config, RuncWorkload};
use gpusnap_testkit::{describe, gpusnap, text};

fn s(p: &Path) -> Result<&str> {
    p.to_str().context("UTF-8 test path")
}

/// A gpusnap config: the double and CRIU (`gpu_config`), the checkpoint root, the node's keys,
/// a store of the test's own.
fn node_config(dir: &Path, name: &str, gpu_config: &str, keys: &[&Path]) -> Result<String> {
    let keys: Vec<String> = keys
        .iter()
        .map(|k| format!("{:?}", k.display().to_string()))
        .collect();
    let path = dir.join(format!("{name}.toml"));
    fs::write(
        &path,
        format!(
            "{gpu_config}\n[restore]\ncheckpoint_root = {:?}\ndecryption_keys = [{}]\n\n[store]\nroot = {:?}\n",
            s(&dir.join("checkpoints"))?,
            keys.join(", "),
            s(&dir.join("store"))?
        ),
    )?;
    Ok(path.display().to_string())
}

#[test]
fn gpusnap_runc_restores_an_encrypted_image_and_pull_refusals_leave_nothing() {
    check(|| {
        let gpu = GpuDouble::new(Engine::Posix, Cuda::V13_4)?;
        let dir = gpu.scratch();
        let config = runc_config(&gpu)?;
        let env = [("GPUSNAP_CONFIG", config.as_str())];

        // The workload, checkpointed through gpusnap-runc.
        let w = RuncWorkload::start(&gpu, "enc")?;
        let (c, cuda, bytes, old_pid) = (&w.c, &w.cuda, &w.bytes, w.pid);
        let before = wait_count(&cuda.id, &c.id, 0, || w.count())?;
        let images = dir.join("images");
        let (code, _, err) = w.checkpoint(&gpu, &images, &env)?;
        ensure!(
            code == 0,
            "gpusnap-runc checkpoint failed (exit {code}):\n{err}"
        );
        gpu.check_checkpoint_calls(cuda, old_pid, false)?;

        // Encrypted for the node's key (EC) and a second recipient (RSA).
        let keys = dir.join("keys");
        fs::create_dir(&keys)?;
        let (node_key, node_pub) = key_pair(&keys, "node", KeyKind::EcP256)?;
        let (_, rsa_pub) = key_pair(&keys, "rsa", KeyKind::Rsa2048)?;
        let (other_key, _) = key_pair(&keys, "other", KeyKind::EcSec1P384)?;
        let node_kid = key_fingerprint(&node_pub)?;
        let layout = dir.join("enc");
        gpusnap_ok(&[
            "image",
            "build",
            s(&images)?,
            "--layout",
            s(&layout)?,
            "--encrypt-recipient",
            &recipient(&node_pub),
            "--encrypt-recipient",
            &recipient(&rsa_pub),
        ])?;

        // inspect without a key: what is visible, the recipients, the manifest sealed (exit 1).
        let node = node_config(dir, "node", &gpu.config(), &[&node_key])?;
        let keyless = node_config(dir, "keyless", &gpu.config(), &[])?;
        let wrong = node_config(dir, "wrong", &gpu.config(), &[&other_key])?;
        let out = gpusnap(["--config", &keyless, "inspect", s(&layout)?]);
        let shown = text(&out.stdout);
        ensure!(
            out.status.code() == Some(1),
            "inspect without a key: {}",
            describe(&out)
        );
        for want in [
            "Encrypted",
            "ECDH-ES+A256KW key",
            &node_kid,
            "RSA-OAEP",
            "NOT VERIFIED",
            "--decryption-key",
            "Layers",
        ] {
            ensure!(
                shown.contains(want),
                "inspect without a key does not show {want:?}:\n{shown}"
            );
        }
        ensure!(
            !shown.contains("Container "),
            "a sealed manifest was read:\n{shown}"
        );
        // With the node's key (from the config, and given on the command line): the whole
        // gpusnap manifest, read after the layer's HMAC matched.
        for args in [
            vec!["--config", &node, "inspect", s(&layout)?],
            vec![
                "--config",
                &keyless,
                "inspect",
                s(&layout)?,
                "--decryption-key",
                s(&node_key)?,
            ],
        ] {
            let shown = gpusnap_ok(&args)?;
            ensure!(
                shown.contains(&format!("Container   {}", c.id)) && shown.contains("Encrypted"),
                "inspect {args:?}:\n{shown}"
            );
        }
        let json: serde_json::Value = serde_json::from_str(&gpusnap_ok(&[
            "--config",
            &node,
            "inspect",
            "--json",
            s(&layout)?,
        ])?)?;
        ensure!(
            json["encryption"]["manifest_layer"]["status"] == "opened"
                && json["gpusnap_manifest"]["gpu"]["engine"] == "posix",
            "inspect --json: {}",
            json["encryption"]
        );

        // To the TLS registry: the image, and what an operator could serve instead.
        let reg = TlsRegistry::start()?;
        let conn = reg.gpusnap_args();
        let push = |layout: &Path, tag: &str| -> Result<String> {
            let r = reg.image(&format!("ckpt/enc:{tag}"));
            let mut args = vec!["image", "push", s(layout)?, &r];
            args.extend(conn.iter().map(String::as_str));
            gpusnap_ok(&args)?;
            Ok(r)
        };
        let good = push(&layout, "good")?;
        let root = dir.join("checkpoints");
        let store = dir.join("store");
        for refusal in Refusal::ALL {
            let (image, config) = match refusal {
                Refusal::WrongKey => (good.clone(), &wrong),
                Refusal::MissingKey => (good.clone(), &keyless),
                _ => {
                    let altered = dir.join(refusal.name());
                    gpusnap_testkit::cmd::run("cp", ["-a", s(&layout)?, s(&altered)?]);
                    refusal.alter(&altered)?;
                    // Both alterations reach the gpusnap manifest's layer (the last): inspect
                    // with the key refuses it too, rather than show what it decrypted.
                    let out = gpusnap(["--config", &node, "inspect", s(&altered)?]);
                    ensure!(
                        !out.status.success()
                            && String::from_utf8_lossy(&out.stderr).contains("HMAC")
                            && out.stdout.is_empty(),
                        "{refusal:?}: inspect of the altered image: {}",
                        describe(&out)
                    );
                    let r = push(&altered, refusal.name())?;
                    fs::remove_dir_all(&altered)?;
                    (r, &node)
                }
            };
            let nothing = NothingLeft::before(&root, &store)?;
            let name = format!("refused-{}", refusal.name());
            let mut args = vec![
                "--config",
                config.as_str(),
                "image",
                "pull",
                &image,
                "--extract",
                &name,
            ];
            args.extend(conn.iter().map(String::as_str));
            let out = gpusnap(&args);
            ensure!(
                !out.status.success(),
                "{refusal:?}: the pull succeeded: {}",
                describe(&out)
            );
            let err = String::from_utf8_lossy(&out.stderr);
            refusal.check_message(&err, "ckpt/enc", &node_kid)?;
            nothing.check(&format!("{refusal:?}"), &root.join(&name))?;
            // The door that would restore it finds nothing to restore.
            let ghost =
                BusyboxContainer::create(dir, &format!("{}-{}", cuda.id, refusal.name()), "true");
            let (code, _, err) = ghost.wrapper_restore(&root.join(&name), &env, dir);
            ensure!(
                code != 0 && ghost.status().is_none(),
                "{refusal:?}: gpusnap-runc restore of nothing: exit {code}, {err}"
            );
        }

        // The node's key: pulled over TLS, decrypted, restored through gpusnap-runc.
        let mut args = vec![
            "--config",
            node.as_str(),
            "image",
            "pull",
            &good,
            "--extract",
            "enc",
        ];
        args.extend(conn.iter().map(String::as_str));
        gpusnap_ok(&args)?;
        // The image of a checkpoint directory extracts to that directory itself.
        let extracted = root.join("enc");
        gpu::check_gpu_checkpoint(&extracted, Engine::Posix, Cuda::V13_4, old_pid, bytes)?;
        w.restore(&gpu, &extracted, &env)?;
        check_continues(&c.id, &before, || w.count())?;
        Ok(())
    })
}
