//! Encrypted checkpoint images in ocicrypt's format, against Debian's skopeo both ways (through
//! OCI layout directories), and the refusals: wrong key, missing key, ciphertext tampered with
//! (digests recomputed, as a registry operator could), a wrapped key swapped between layers.
//! Every refusal must leave nothing at the destination.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpusnap_oci_image::crypt::{self, Decryption};
use gpusnap_oci_image::{self as image, BuildOptions, Digest, ExtractOptions, OriginSeed};
use gpusnap_testkit::fixtures::*;
use gpusnap_testkit::ocicrypt::{key_pair, KeyKind};
use serde_json::Value;

/// (skopeo 1.9 reads PKCS#8 private keys only; gpusnap also reads SEC1, which `other` is.)
fn skopeo(args: &[&str]) {
    let out = Command::new("skopeo").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "skopeo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

/// The image manifest of a layout (through an image index if there is one).
fn manifest_of(layout: &Path) -> Value {
    let mut desc = read_json(&layout.join("index.json"))["manifests"][0].clone();
    loop {
        let doc = read_json(&blob(layout, desc["digest"].as_str().unwrap()));
        if doc.get("layers").is_some() {
            return doc;
        }
        desc = doc["manifests"][0].clone();
    }
}

/// Rewrites the manifest of a gpusnap layout (index.json → index → manifest) with `edit`,
/// recomputing every digest up the chain as whoever controls the registry could.
fn tamper_manifest(layout: &Path, edit: impl FnOnce(&mut Value)) {
    let put = |v: &Value| -> (String, u64) {
        let bytes = serde_json::to_vec(v).unwrap();
        let d = Digest::of(&bytes);
        fs::write(blob(layout, d.as_str()), &bytes).unwrap();
        (d.as_str().to_owned(), bytes.len() as u64)
    };
    let mut top = read_json(&layout.join("index.json"));
    let index_digest = top["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let mut index = read_json(&blob(layout, &index_digest));
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let mut manifest = read_json(&blob(layout, &manifest_digest));
    edit(&mut manifest);
    let (d, n) = put(&manifest);
    index["manifests"][0]["digest"] = d.into();
    index["manifests"][0]["size"] = n.into();
    let (d, n) = put(&index);
    top["manifests"][0]["digest"] = d.into();
    top["manifests"][0]["size"] = n.into();
    fs::write(layout.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
}

fn extract(
    layout: &Path,
    dest: &Path,
    keys: &[PathBuf],
) -> Result<image::Extracted, image::ImageError> {
    let seed = OriginSeed {
        source: "test".into(),
        pinned: false,
        signature: gpusnap_checkpoint::origin::SignatureCheck::NotChecked,
    };
    let opts = ExtractOptions {
        decryption: Decryption::load(keys)?,
        ..Default::default()
    };
    image::extract_with(layout, None, dest, &seed, &opts)
}

fn copy_dir(from: &Path, to: &Path) {
    assert!(Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success());
}

#[test]
fn gpusnap_and_skopeo_encrypt_and_decrypt_each_others_images() {
    let fx = fixture();
    let w = fx.work.path();
    let (ec_key, ec_pub) = key_pair(w, "ec", KeyKind::EcP256).unwrap();
    let (rsa_key, rsa_pub) = key_pair(w, "rsa", KeyKind::Rsa2048).unwrap();
    let (other_key, _) = key_pair(w, "other", KeyKind::EcSec1P384).unwrap();

    let plain = w.join("plain");
    image::build(
        &fx.archive,
        &BuildOptions {
            layout_dir: Some(plain.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let enc = w.join("enc");
    let built = image::build(
        &fx.archive,
        &BuildOptions {
            layout_dir: Some(enc.clone()),
            encrypt_to: Some(
                crypt::recipients(&[
                    format!("jwe:{}", ec_pub.display()),
                    format!("jwe:{}", rsa_pub.display()),
                ])
                .unwrap(),
            ),
            ..Default::default()
        },
    )
    .unwrap();
    let plain_manifest = manifest_of(&plain);
    let enc_manifest = manifest_of(&enc);
    let plain_layers = plain_manifest["layers"].as_array().unwrap();
    let enc_layers = enc_manifest["layers"].as_array().unwrap();
    assert_eq!(plain_layers.len(), enc_layers.len());
    for (p, e) in plain_layers.iter().zip(enc_layers) {
        assert_eq!(
            e["mediaType"],
            format!("{}+encrypted", p["mediaType"].as_str().unwrap())
        );
        assert!(e["annotations"]["org.opencontainers.image.enc.keys.jwe"].is_string());
        assert!(e["annotations"]["org.opencontainers.image.enc.pubopts"].is_string());
        // The role annotations survive; no plain blob is left in the encrypted layout.
        assert_eq!(
            e["annotations"]["io.gpusnap.layer.role"],
            p["annotations"]["io.gpusnap.layer.role"]
        );
        assert!(!blob(&enc, p["digest"].as_str().unwrap()).exists());
    }
    assert_eq!(built.layers.len(), enc_layers.len());
    assert!(built
        .layers
        .iter()
        .all(|l| l.descriptor.media_type.ends_with("+encrypted")));

    // gpusnap → skopeo: decrypting gives byte-identical plain layers (same digests), with
    // either recipient's key.
    for (key, name) in [(&ec_key, "dec-ec"), (&rsa_key, "dec-rsa")] {
        let dec = w.join(name);
        skopeo(&[
            "copy",
            "--decryption-key",
            key.to_str().unwrap(),
            &format!("oci:{}", enc.display()),
            &format!("oci:{}:plain", dec.display()),
        ]);
        let dec_layers = manifest_of(&dec)["layers"].as_array().unwrap().clone();
        for (p, d) in plain_layers.iter().zip(&dec_layers) {
            assert_eq!(d["digest"], p["digest"], "{name}");
            assert_eq!(d["mediaType"], p["mediaType"], "{name}");
            assert_eq!(
                fs::read(blob(&dec, d["digest"].as_str().unwrap())).unwrap(),
                fs::read(blob(&plain, p["digest"].as_str().unwrap())).unwrap()
            );
        }
        fs::remove_dir_all(&dec).unwrap();
    }

    // gpusnap extracts its own encrypted image: the checkpoint, byte for byte.
    let out = w.join("out");
    fs::create_dir(&out).unwrap();
    let dest = out.join("mine");
    let ex = extract(&enc, &dest, std::slice::from_ref(&rsa_key)).unwrap();
    assert_eq!(ex.gpusnap_manifest, fx.manifest);
    fs::remove_file(dest.join("gpusnap-origin.json")).unwrap();
    assert_same_tree(&dest, &fx.archive_root);
    gpusnap_checkpoint::validate_for_restore(&ex.checkpoint_dir).unwrap();
    fs::remove_dir_all(&dest).unwrap();

    // skopeo → gpusnap: an image skopeo encrypted extracts with the node's key.
    let sko = w.join("sko");
    skopeo(&[
        "copy",
        "--encryption-key",
        &format!("jwe:{}", ec_pub.display()),
        &format!("oci:{}", plain.display()),
        &format!("oci:{}:enc", sko.display()),
    ]);
    let sko_layers = manifest_of(&sko)["layers"].as_array().unwrap().clone();
    assert!(sko_layers
        .iter()
        .all(|l| l["mediaType"].as_str().unwrap().ends_with("+encrypted")));
    let dest = out.join("theirs");
    let ex = extract(&sko, &dest, std::slice::from_ref(&ec_key)).unwrap();
    assert_eq!(ex.gpusnap_manifest, fx.manifest);
    fs::remove_file(dest.join("gpusnap-origin.json")).unwrap();
    assert_same_tree(&dest, &fx.archive_root);
    fs::remove_dir_all(&dest).unwrap();

    // Refusals, each leaving nothing: the wrong key, no key.
    let dest = out.join("refused");
    let err = extract(&sko, &dest, std::slice::from_ref(&other_key))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ECDH-ES+A256KW") && err.contains("none of the configured keys"),
        "{err}"
    );
    assert!(err.contains(&other_key.display().to_string()), "{err}");
    let err = extract(&enc, &dest, &[]).unwrap_err().to_string();
    assert!(err.contains("no decryption key is configured"), "{err}");
    // gpusnap names its recipients by key fingerprint.
    assert!(err.contains("kid") || err.contains("sha256:"), "{err}");

    // Ciphertext tampered with, digests recomputed up the chain: the HMAC refuses it.
    let tampered = w.join("tampered");
    copy_dir(&enc, &tampered);
    tamper_manifest(&tampered, |m| {
        let layer = &mut m["layers"][1];
        let path = blob(&tampered, layer["digest"].as_str().unwrap());
        let mut bytes = fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x20;
        let d = Digest::of(&bytes);
        fs::write(blob(&tampered, d.as_str()), &bytes).unwrap();
        layer["digest"] = d.as_str().into();
    });
    let err = extract(&tampered, &dest, std::slice::from_ref(&ec_key))
        .unwrap_err()
        .to_string();
    assert!(err.contains("HMAC"), "{err}");

    // Layer 0's wrapped key on layer 1: it opens, but the HMAC does not match.
    let swapped = w.join("swapped");
    copy_dir(&enc, &swapped);
    tamper_manifest(&swapped, |m| {
        let k = "org.opencontainers.image.enc.keys.jwe";
        m["layers"][1]["annotations"][k] = m["layers"][0]["annotations"][k].clone();
    });
    let err = extract(&swapped, &dest, std::slice::from_ref(&ec_key))
        .unwrap_err()
        .to_string();
    assert!(err.contains("HMAC") || err.contains("digest"), "{err}");

    assert!(!dest.exists());
    assert_eq!(
        fs::read_dir(&out).unwrap().count(),
        0,
        "a refusal left something behind"
    );
}
