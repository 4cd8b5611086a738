//! Encrypted checkpoint images through the `gpusnap` binary and a TLS registry with
//! authentication (Debian's `docker-registry`), interoperating with Debian's skopeo both ways:
//! `image build|push --encrypt-recipient`, `image pull --extract` with the node's
//! `restore.decryption_keys`, and the refusals (wrong key, no key) leaving nothing behind.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpusnap_testkit::crypt_doors::TlsRegistry;
use gpusnap_testkit::describe;
use gpusnap_testkit::fixtures::fixture;
use gpusnap_testkit::ocicrypt::{key_pair, KeyKind};
use serde_json::Value;

mod common;
use common::{assert_same_tree_with_origin, gpusnap, ok, s};

/// (skopeo 1.9 reads PKCS#8 private keys only; gpusnap also reads SEC1, which `other` is.)
fn skopeo(args: &[&str]) {
    let out = Command::new("skopeo").args(args).output().unwrap();
    assert!(out.status.success(), "skopeo {args:?}: {}", describe(&out));
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

/// The image manifest of an OCI layout (through an image index if there is one).
fn layers_of(layout: &Path) -> Vec<Value> {
    let blob = |d: &Value| layout.join("blobs/sha256").join(&d.as_str().unwrap()[7..]);
    let mut desc = read_json(&layout.join("index.json"))["manifests"][0].clone();
    loop {
        let doc = read_json(&blob(&desc["digest"]));
        if let Some(l) = doc.get("layers") {
            return l.as_array().unwrap().clone();
        }
        desc = doc["manifests"][0].clone();
    }
}

fn config(dir: &Path, root: &Path, keys: &[&Path]) -> PathBuf {
    let name: Vec<&str> = keys
        .iter()
        .filter_map(|k| k.file_stem()?.to_str())
        .collect();
    let p = dir.join(format!("gpusnap-{}.toml", name.join("-")));
    let keys: Vec<String> = keys.iter().map(|k| format!("{:?}", s(k))).collect();
    fs::write(
        &p,
        format!(
            "[restore]\ncheckpoint_root = {:?}\ndecryption_keys = [{}]\n",
            s(root),
            keys.join(", ")
        ),
    )
    .unwrap();
    p
}

#[test]
fn encrypted_images_through_tls_registry_and_skopeo() {
    let reg = TlsRegistry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let fx = fixture();
    let w = fx.work.path();
    let (ec_key, ec_pub) = key_pair(w, "node", KeyKind::EcP256).unwrap();
    let (rsa_key, rsa_pub) = key_pair(w, "rsa", KeyKind::Rsa2048).unwrap();
    let (other_key, _) = key_pair(w, "other", KeyKind::EcSec1P384).unwrap();
    let certs = reg.cert_dir();
    let creds = reg.creds();
    let conn = reg.gpusnap_args();
    let with_conn = |args: &[&str]| -> Vec<String> {
        args.iter()
            .map(|a| a.to_string())
            .chain(conn.iter().cloned())
            .collect()
    };
    let run = |config: Option<&Path>, args: Vec<String>| {
        let v: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(config, &v)
    };
    let root = w.join("checkpoints");
    let node = config(w, &root, &[&ec_key]);

    let plain = w.join("plain");
    ok(
        None,
        &["image", "build", s(&fx.archive), "--layout", s(&plain)],
    );
    let enc = w.join("enc");
    let ec_spec = format!("jwe:{}", s(&ec_pub));
    let rsa_spec = format!("jwe:{}", s(&rsa_pub));
    ok(
        None,
        &[
            "image",
            "build",
            s(&fx.archive),
            "--layout",
            s(&enc),
            "--encrypt-recipient",
            &ec_spec,
            "--encrypt-recipient",
            &rsa_spec,
        ],
    );
    let plain_layers = layers_of(&plain);
    assert!(layers_of(&enc)
        .iter()
        .all(|l| l["mediaType"].as_str().unwrap().ends_with("+encrypted")));

    // build --encrypt-recipient → push (TLS) → skopeo decrypts: byte-identical plain layers.
    let enc_ref = reg.image("ckpt/enc:1");
    run(None, with_conn(&["image", "push", s(&enc), &enc_ref]));
    let dec = w.join("dec");
    skopeo(&[
        "copy",
        "--src-cert-dir",
        s(certs),
        "--src-creds",
        &creds,
        "--decryption-key",
        s(&rsa_key),
        &format!("docker://{enc_ref}"),
        &format!("oci:{}:plain", s(&dec)),
    ]);
    let dec_layers = layers_of(&dec);
    assert_eq!(dec_layers.len(), plain_layers.len());
    for (d, p) in dec_layers.iter().zip(&plain_layers) {
        assert_eq!(
            (&d["digest"], &d["mediaType"]),
            (&p["digest"], &p["mediaType"])
        );
    }
    fs::remove_dir_all(&dec).unwrap();

    // pull --extract with the node's key from the config; then inspect the checkpoint.
    run(
        Some(&node),
        with_conn(&["image", "pull", &enc_ref, "--extract", "mine"]),
    );
    assert_same_tree_with_origin(&root.join("mine"), &fx.archive_root);
    ok(None, &["inspect", s(&root.join("mine").join("checkpoint"))]);
    assert_eq!(
        fs::metadata(root.join("mine"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );

    // push --encrypt-recipient of the plain layout (left plain), pulled with the key.
    let pushed_ref = reg.image("ckpt/pushed:1");
    run(
        None,
        with_conn(&[
            "image",
            "push",
            s(&plain),
            &pushed_ref,
            "--encrypt-recipient",
            &ec_spec,
        ]),
    );
    assert_eq!(layers_of(&plain), plain_layers);
    run(
        Some(&node),
        with_conn(&["image", "pull", &pushed_ref, "--extract", "pushed"]),
    );
    assert_same_tree_with_origin(&root.join("pushed"), &fx.archive_root);

    // skopeo encrypts → gpusnap pulls and extracts.
    let sko_ref = reg.image("ckpt/sko:1");
    skopeo(&[
        "copy",
        "--dest-cert-dir",
        s(certs),
        "--dest-creds",
        &creds,
        "--encryption-key",
        &ec_spec,
        &format!("oci:{}", s(&plain)),
        &format!("docker://{sko_ref}"),
    ]);
    run(
        Some(&node),
        with_conn(&["image", "pull", &sko_ref, "--extract", "theirs"]),
    );
    assert_same_tree_with_origin(&root.join("theirs"), &fx.archive_root);

    // Refusals: the wrong key, no key. One line naming the image and the recipients; nothing left.
    let before: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for (cfg, want) in [
        (
            config(w, &root, &[&other_key]),
            "none of the configured keys",
        ),
        (config(w, &root, &[]), "no decryption key is configured"),
    ] {
        let args = with_conn(&["image", "pull", &enc_ref, "--extract", "refused"]);
        let v: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = gpusnap(Some(&cfg), &v);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && err.contains("ckpt/enc"), "{err}");
        assert!(
            err.contains("ECDH-ES+A256KW") && err.contains("RSA-OAEP"),
            "{err}"
        );
        assert_eq!(err.matches("encrypted for").count(), 1, "{err}");
        let after: Vec<_> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            after.len(),
            before.len(),
            "a refusal left something in {}",
            root.display()
        );
    }
    // A key file others can read is refused before anything is fetched.
    fs::set_permissions(&ec_key, fs::Permissions::from_mode(0o644)).unwrap();
    let args = with_conn(&["image", "pull", &enc_ref, "--extract", "refused"]);
    let v: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = gpusnap(Some(&node), &v);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 0600"),
        "{}",
        describe(&out)
    );
}
