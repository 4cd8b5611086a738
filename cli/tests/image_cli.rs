//! `gpusnap image build|push|pull` and `gpusnap inspect` of OCI images, end to end through the
//! binary: a sealed checkpoint (fake CRIU images + GPU extents, sealed with the real
//! `seal_checkpoint`) inside a CRI-archive-like tar, a real `docker-registry` (distribution)
//! on a loopback port, plain HTTP.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpusnap_testkit::fixtures::{fixture, CONTAINER_ID, GPU_EXTENTS};
use gpusnap_testkit::signing::{keypair, KeyPair};
use gpusnap_testkit::{describe, paths, Registry};
use serde_json::Value;

mod common;
use common::{assert_same_tree_with_origin, gpusnap, json, ok, registry, s};

/// The GPU extent the tests follow through build, push and pull.
const GPU_EXTENT: &str = GPU_EXTENTS[1];

/// Config whose `restore.checkpoint_root` is `root`, with a node store of its own in `dir`.
fn config_with_root(dir: &Path, root: &Path) -> PathBuf {
    let p = dir.join("gpusnap.toml");
    fs::write(
        &p,
        format!(
            "[restore]\ncheckpoint_root = \"{}\"\n\n[store]\nroot = \"{}\"\n",
            root.display(),
            dir.join("store").display()
        ),
    )
    .unwrap();
    p
}

#[test]
fn build_push_pull_extract_round_trip() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let reference = reg.image("ckpt/trainer:v1");
    let image = w.join("trainer.oci.tar");

    // build --json
    let out = ok(
        None,
        &[
            "image",
            "build",
            s(&fx.archive),
            "--tag",
            &reference,
            "-o",
            s(&image),
            "--json",
        ],
    );
    let built = json(&out);
    assert_eq!(built["image_name"], reference.as_str());
    assert_eq!(built["container_name"], "trainer");
    // The default layout: the GPU state and page images travel as chunks in pack layers.
    let layers = built["layers"].as_array().unwrap();
    assert!(
        layers.iter().all(|l| l["gpu_extent"].is_null()),
        "{built:#}"
    );
    let pack_layer = layers
        .iter()
        .find(|l| l["role"] == "chunk-pack")
        .unwrap_or_else(|| panic!("no chunk pack layer: {built:#}"));
    let pack_digest = pack_layer["descriptor"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(image.is_file());

    // inspect on the oci-archive: human and JSON
    let out = ok(None, &["inspect", s(&image)]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("OCI image"), "{text}");
    assert!(text.contains("chunk-pack"), "{text}");
    assert!(text.contains("container trainer"), "{text}");
    let info = json(&ok(None, &["inspect", s(&image), "--json"]));
    assert_eq!(info["checkpoint_name"], "trainer");
    assert_eq!(info["gpusnap_manifest"]["container_id"], CONTAINER_ID);

    // push (--plain-http; reference without a scheme)
    let out = ok(
        None,
        &[
            "image",
            "push",
            s(&image),
            &reference,
            "--plain-http",
            "--json",
        ],
    );
    let pushed = json(&out);
    assert_eq!(pushed["digest"], built["index_digest"]);
    assert!(!pushed["uploaded"].as_array().unwrap().is_empty());
    // Second push: every blob already there; human output.
    let out = ok(
        None,
        &["image", "push", s(&image), &reference, "--plain-http"],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("uploaded 0 B of"), "{text}");

    // pull --extract NAME → <restore.checkpoint_root>/NAME, from the config
    let root = w.join("checkpoints");
    let config = config_with_root(w, &root);
    let out = ok(
        Some(&config),
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "trainer-v1",
            "--json",
        ],
    );
    let pulled = json(&out);
    let dest = root.join("trainer-v1");
    assert_eq!(pulled["restore_from"], "trainer-v1");
    assert_eq!(pulled["pull"]["digest"], built["index_digest"]);
    assert_eq!(
        pulled["extracted"]["checkpoint_dir"],
        s(&dest.join("checkpoint"))
    );
    assert_same_tree_with_origin(&dest, &fx.archive_root);
    // No scratch layout left behind next to it.
    let left: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("trainer-v1")]);

    // inspect on the extracted checkpoint: complete
    let insp = json(&ok(None, &["inspect", s(&dest), "--json"]));
    assert_eq!(insp["validation"]["status"], "complete", "{insp:#}");
    let text = String::from_utf8(ok(None, &["inspect", s(&dest)]).stdout).unwrap();
    assert!(text.contains("complete"), "{text}");

    // pull --extract PATH (human output) and -o archive together
    let dest2 = w.join("by-path/ck");
    fs::create_dir_all(dest2.parent().unwrap()).unwrap();
    let archive2 = w.join("pulled.oci.tar");
    let out = ok(
        Some(&config),
        &[
            "image",
            "pull",
            &format!("http://{reference}"),
            "--extract",
            s(&dest2),
            "-o",
            s(&archive2),
        ],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("not pinned"), "{text}");
    assert!(text.contains("Signature   not checked"), "{text}");
    assert!(!text.contains("restore-from"), "{text}");
    assert_same_tree_with_origin(&dest2, &fx.archive_root);
    // The pulled oci-archive is a valid image with the same digest.
    let info2 = json(&ok(None, &["inspect", s(&archive2), "--json"]));
    assert_eq!(info2["index_digest"], built["index_digest"]);
    let dest3 = w.join("from-archive");
    // (extract by pushing the pulled archive again is covered above; here just inspect)
    assert!(!dest3.exists());

    // The classic layout (`--classic`: one layer per GPU state file, no chunks) through the
    // same door extracts to the same tree, times included.
    let classic_ref = reg.image("ckpt/trainer:classic");
    let classic = json(&ok(
        None,
        &[
            "image",
            "build",
            "--classic",
            s(&fx.archive),
            "--tag",
            &classic_ref,
            "-o",
            s(&w.join("classic.oci.tar")),
            "--json",
        ],
    ));
    let classic_layers = classic["layers"].as_array().unwrap();
    assert!(
        classic_layers.iter().any(|l| l["gpu_extent"]
            .as_str()
            .is_some_and(|p| p.ends_with(GPU_EXTENT))),
        "no GPU extent layer for {GPU_EXTENT}: {classic:#}"
    );
    assert!(classic_layers.iter().all(|l| l["role"] != "chunk-pack"));
    let classic_image = w.join("classic.oci.tar");
    ok(
        None,
        &[
            "image",
            "push",
            s(&classic_image),
            &classic_ref,
            "--plain-http",
        ],
    );
    let classic_dest = w.join("classic/ck");
    fs::create_dir_all(classic_dest.parent().unwrap()).unwrap();
    ok(
        Some(&config),
        &[
            "image",
            "pull",
            &classic_ref,
            "--plain-http",
            "--extract",
            s(&classic_dest),
        ],
    );
    assert_same_tree_with_origin(&classic_dest, &fx.archive_root);
    fs::remove_dir_all(w.join("classic")).unwrap();

    // Tamper with a chunk pack blob in the registry's storage: pull fails naming it.
    let blob = reg.blob_data(&pack_digest);
    let mut data = fs::read(&blob).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    fs::write(&blob, data).unwrap();
    let bad_dest = root.join("tampered");
    // A node store of its own: the first config's store holds the blob, verified, from the
    // pulls above, and would serve it without asking the registry.
    let fresh = w.join("fresh-node");
    fs::create_dir(&fresh).unwrap();
    let fresh_config = config_with_root(&fresh, &root);
    let out = gpusnap(
        Some(&fresh_config),
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            "tampered",
        ],
    );
    assert!(
        !out.status.success(),
        "tampered pull succeeded: {}",
        describe(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&pack_digest),
        "error does not name {pack_digest}: {err}"
    );
    assert!(err.contains("corrupt") || err.contains("bytes"), "{err}");
    assert!(
        !bad_dest.exists(),
        "a failed pull left {}",
        bad_dest.display()
    );
    let left: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left.len(),
        1,
        "failed pull left files in {}: {left:?}",
        root.display()
    );
}

#[test]
fn build_from_checkpoint_dir_to_layout_and_extract_refusals() {
    let fx = fixture();
    let w = fx.work.path();
    let cp = fx.archive_root.join("checkpoint");
    let layout = w.join("layout");
    let out = ok(
        None,
        &[
            "image",
            "build",
            s(&cp),
            "--tag",
            "localhost/ckpt/plain:v1",
            "--layout",
            s(&layout),
            "--container-name",
            "plain",
        ],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("localhost/ckpt/plain:v1"), "{text}");
    assert!(text.contains("gpusnap image push"), "{text}");
    assert!(layout.join("oci-layout").is_file());
    let info = json(&ok(None, &["inspect", s(&layout), "--json"]));
    assert_eq!(info["checkpoint_name"], "plain");

    // No output given: clap refuses before anything is read.
    let out = gpusnap(None, &["image", "build", s(&cp), "--tag", "x/y:z"]);
    assert!(!out.status.success());

    // A bare --extract name that is not a checkpoint name is refused.
    let config = config_with_root(w, &w.join("root"));
    let out = gpusnap(
        Some(&config),
        &[
            "image",
            "pull",
            "127.0.0.1:1/a:b",
            "--plain-http",
            "--extract",
            "..",
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a checkpoint name"),
        "{}",
        describe(&out)
    );

    // A checkpoint altered after sealing is not published.
    let mut data = fs::read(cp.join(GPU_EXTENT)).unwrap();
    data[10] ^= 0xff;
    fs::write(cp.join(GPU_EXTENT), data).unwrap();
    let out = gpusnap(
        None,
        &[
            "image",
            "build",
            s(&cp),
            "-o",
            s(&w.join("bad.oci.tar")),
            "--json",
        ],
    );
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(GPU_EXTENT), "{err}");
    assert!(!w.join("bad.oci.tar").exists());
}

// ---- TLS + htpasswd registry, signatures by policy, interruption ----------------------------

use gpusnap_testkit::registry::RegistrySetup;

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn secure_registry_sign_and_pull_by_policy() {
    let reg = Registry::start_with(RegistrySetup::secure()).unwrap_or_else(|e| panic!("{e:#}"));
    let fx = fixture();
    let w = fx.work.path();
    let image = w.join("trainer.oci.tar");
    ok(None, &["image", "build", s(&fx.archive), "-o", s(&image)]);
    let ca = reg.ca_file().unwrap();
    let docker = reg.write_docker_config(&w.join("docker")).unwrap();
    let conn = ["--ca-file", s(&ca), "--registry-config", s(&docker)];
    let KeyPair {
        private: key,
        public,
    } = keypair(w, "signer").unwrap();
    let signed = reg.image("ckpt/trainer:signed");
    // Another repository: a signature binds a digest, so any tag of the same digest in the
    // same repository is signed too.
    let unsigned = reg.image("ckpt/plain:unsigned");

    // push --sign-key, and a plain push.
    let mut args = vec![
        "image",
        "push",
        s(&image),
        &signed,
        "--sign-key",
        s(&key),
        "--json",
    ];
    args.extend(conn);
    let pushed = json(&ok(None, &args));
    let digest = pushed["digest"].as_str().unwrap().to_owned();
    assert_eq!(pushed["signature"]["digest"], digest.as_str());
    let mut args = vec!["image", "push", s(&image), &unsigned];
    args.extend(conn);
    ok(None, &args);
    // Without the CA file the push fails on the certificate, not silently over HTTP.
    let out = gpusnap(
        None,
        &[
            "image",
            "push",
            s(&image),
            &unsigned,
            "--registry-config",
            s(&docker),
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .to_lowercase()
            .contains("certificate"),
        "{}",
        describe(&out)
    );

    // `image sign` by digest (a second signature, same key is fine).
    let pinned = reg.image(&format!("ckpt/trainer@{digest}"));
    let mut args = vec!["image", "sign", &pinned, "--key", s(&key)];
    args.extend(conn);
    let text = String::from_utf8(ok(None, &args).stdout).unwrap();
    assert!(
        text.contains(&format!("sha256-{}.sig", &digest[7..])),
        "{text}"
    );

    // Policy require with the key: signed pull extracts, origin record says verified.
    let root = w.join("checkpoints");
    let config = w.join("gpusnap.toml");
    fs::write(
        &config,
        format!(
            "[restore]\ncheckpoint_root = \"{}\"\nsignature_policy = \"require\"\nsignature_keys = [\"{}\"]\n",
            root.display(),
            public.display()
        ),
    )
    .unwrap();
    let mut args = vec!["image", "pull", &signed, "--extract", "signed", "--json"];
    args.extend(conn);
    let pulled = json(&ok(Some(&config), &args));
    assert_eq!(pulled["pull"]["signature"]["status"], "verified");
    assert_eq!(pulled["pull"]["pinned"], false);
    assert!(
        pulled["verification"].as_str().unwrap().contains("signed"),
        "{pulled:#}"
    );
    let origin: Value =
        serde_json::from_slice(&fs::read(root.join("signed/gpusnap-origin.json")).unwrap())
            .unwrap();
    assert_eq!(origin["signature"]["status"], "verified");
    assert_eq!(origin["signature"]["key"], s(&public));
    assert_eq!(origin["pinned"], false);

    // Unsigned under require: refused, nothing in the checkpoint root but the first one.
    let mut args = vec!["image", "pull", &unsigned, "--extract", "unsigned"];
    args.extend(conn);
    let out = gpusnap(Some(&config), &args);
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("signature_policy = require"), "{err}");
    assert_eq!(entries(&root), vec!["signed".to_owned()]);

    // warn: pulled, and the origin record says what was missing.
    fs::write(
        &config,
        fs::read_to_string(&config)
            .unwrap()
            .replace("\"require\"", "\"warn\""),
    )
    .unwrap();
    let mut args = vec!["image", "pull", &unsigned, "--extract", "unsigned"];
    args.extend(conn);
    let text = String::from_utf8(ok(Some(&config), &args).stdout).unwrap();
    assert!(text.contains("MISSING"), "{text}");
    let origin: Value =
        serde_json::from_slice(&fs::read(root.join("unsigned/gpusnap-origin.json")).unwrap())
            .unwrap();
    assert_eq!(origin["signature"]["status"], "missing");
}

/// SIGINT during a pull: the pull stops at once (even while waiting on the network), exits
/// 130, and leaves nothing beside its destination.
#[test]
fn interrupted_pull_leaves_nothing() {
    // A "registry" that accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming().take(4) {
            conns.push(c);
        }
        std::thread::sleep(std::time::Duration::from_secs(20));
    });
    drop(hold);
    let w = tempfile::tempdir().unwrap();
    let out_dir = w.path().join("out");
    fs::create_dir_all(&out_dir).unwrap();
    let mut child = Command::new(paths::binary("gpusnap"))
        .args([
            "image",
            "pull",
            &format!("http://127.0.0.1:{port}/ckpt/x:v1"),
            "--extract",
            s(&out_dir.join("ck")),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Give it time to create its staging directories and block on the registry.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the pull ended before the signal"
    );
    // Only the child this test started, by its pid.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "{}",
        describe(&out)
    );
    assert_eq!(entries(&out_dir), Vec::<String>::new());
}
