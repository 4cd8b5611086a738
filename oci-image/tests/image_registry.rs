//! Push / pull round trips against a real OCI distribution registry (Debian's
//! `docker-registry`, i.e. distribution 2.8) on loopback, plain HTTP.

use std::fs;
use std::path::Path;
use std::process::Command;

use gpusnap_oci_image::{self as image, BuildOptions, ImageError, LayerRole, RegistryOptions};
use gpusnap_testkit::cmd::run_ok;
use gpusnap_testkit::fixtures::*;
use gpusnap_testkit::paths::find_tool;
use gpusnap_testkit::registry::{free_tcp_port, Registry};
use serde_json::Value;

fn registry() -> Registry {
    Registry::start().unwrap_or_else(|e| panic!("{e:#}"))
}

fn opts() -> RegistryOptions {
    RegistryOptions::default()
}

/// Checks every blob file of a layout against its name, independently of the crate.
fn assert_layout_blobs_verified(layout: &Path) -> usize {
    let mut n = 0;
    for e in fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert_eq!(sha256_file(&e.path()), format!("sha256:{name}"));
        n += 1;
    }
    n
}

#[test]
fn push_then_pull_round_trips_and_skips_blobs_the_registry_has() {
    let reg = registry();
    let fx = fixture();
    let archive = fx.work.path().join("image.oci.tar");
    let built = image::build(
        &fx.archive,
        &BuildOptions {
            archive_path: Some(archive.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let reference = reg.url("gpusnap/trainer:v1");

    let first = image::push(&archive, &reference, &opts()).unwrap();
    assert_eq!(first.digest, built.index_digest);
    // config + 6 layers, all new.
    assert_eq!(first.uploaded.len(), 7, "{first:?}");
    assert!(first.skipped.is_empty());
    assert!(first.uploaded.contains(&built.config_digest));
    for l in &built.layers {
        assert!(first.uploaded.contains(&l.descriptor.digest));
    }
    // Layers plus the (small) config.
    assert!(
        first.bytes_uploaded > built.total_layer_bytes
            && first.bytes_uploaded < built.total_layer_bytes + 64 * 1024,
        "{first:?}"
    );
    // Again: every blob answered by HEAD, nothing uploaded.
    let again = image::push(&archive, &reference, &opts()).unwrap();
    assert!(again.uploaded.is_empty(), "{again:?}");
    assert_eq!(again.skipped.len(), 7);

    // Pull into a fresh layout: every blob verified, same target digest, same annotations.
    let pulled = fx.work.path().join("pulled");
    let report = image::pull(&reference, &pulled, &opts()).unwrap();
    assert_eq!(report.digest, built.index_digest);
    assert_eq!(report.media_type, "application/vnd.oci.image.index.v1+json");
    // index + manifest + config + 6 layers.
    assert_eq!(report.blobs, 9);
    assert_eq!(assert_layout_blobs_verified(&pulled), 9);
    let index_json = read_json(&pulled.join("index.json"));
    assert_eq!(
        index_json["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("127.0.0.1:{}/gpusnap/trainer:v1", reg.port())
    );
    let info = image::inspect(&pulled).unwrap();
    assert_eq!(info.manifest_digest, built.manifest_digest);
    assert_eq!(info.manifest_annotations, built.annotations);
    assert_eq!(info.layers, built.layers);
    assert_eq!(info.gpusnap_manifest.as_ref(), Some(&fx.manifest));

    // Extract equals the original archive tree, byte for byte.
    let dest = fx.work.path().join("restored");
    let out = image::extract(&pulled, &dest).unwrap();
    // The origin record extract adds names the image manifest every layer was checked against.
    let origin = read_json(&dest.join("gpusnap-origin.json"));
    assert_eq!(origin["manifest_digest"], built.manifest_digest.as_str());
    assert_eq!(origin["signature"]["status"], "not-checked");
    fs::remove_file(dest.join("gpusnap-origin.json")).unwrap();
    assert_same_tree(&dest, &fx.archive_root);
    gpusnap_checkpoint::validate_for_restore(&out.checkpoint_dir).unwrap();

    // A second image of the same checkpoint (built from the bare directory) shares its GPU
    // extent layers with the first: the registry already has them, so they are not re-sent.
    let cp_image = fx.work.path().join("cp.oci.tar");
    image::build(
        &fx.checkpoint_dir,
        &BuildOptions {
            archive_path: Some(cp_image.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let second = image::push(&cp_image, &reg.url("gpusnap/trainer:cp-only"), &opts()).unwrap();
    for l in built
        .layers
        .iter()
        .filter(|l| l.role == LayerRole::GpuExtent)
    {
        assert!(
            second.skipped.contains(&l.descriptor.digest),
            "GPU extent {} re-uploaded: {second:?}",
            l.descriptor.digest
        );
    }

    // skopeo, an independent client, reads what we pushed.
    if let Some(skopeo) = find_tool("skopeo") {
        let out = run_ok(Command::new(skopeo).args([
            "inspect",
            "--tls-verify=false",
            &format!("docker://127.0.0.1:{}/gpusnap/trainer:v1", reg.port()),
        ]));
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["Digest"], built.index_digest.as_str());
        assert_eq!(v["Layers"].as_array().unwrap().len(), 6);
    } else {
        panic!("skopeo not found: run scripts/setup-env.sh (needs skopeo)");
    }
}

#[test]
fn pulling_a_tampered_blob_fails_with_a_digest_mismatch() {
    let reg = registry();
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    let built = image::build(
        &fx.archive,
        &BuildOptions {
            layout_dir: Some(layout.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let reference = reg.url("gpusnap/trainer:tampered");
    image::push(&layout, &reference, &opts()).unwrap();

    // Corrupt the second GPU extent in the registry's own storage (same size).
    let extent = built
        .layers
        .iter()
        .filter(|l| l.role == LayerRole::GpuExtent)
        .nth(1)
        .unwrap()
        .descriptor
        .digest
        .clone();
    let data = reg.blob_data(extent.as_str());
    assert!(
        data.is_file(),
        "registry layout changed? {}",
        data.display()
    );
    flip_byte(&data);

    let dest = fx.work.path().join("pulled");
    let err = image::pull(&reference, &dest, &opts()).unwrap_err();
    match &err {
        ImageError::DigestMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &extent);
            assert_ne!(actual, &extent);
        }
        other => panic!("expected a digest mismatch, got: {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(extent.as_str()), "{msg}");
    assert!(msg.contains("corrupt") && msg.contains("tampered"), "{msg}");
    assert!(!dest.exists(), "a failed pull leaves no layout behind");

    // A truncated blob in the registry is refused too.
    let config = reg.blob_data(built.config_digest.as_str());
    let bytes = fs::read(&config).unwrap();
    fs::write(&config, &bytes[..bytes.len() / 2]).unwrap();
    let err = image::pull(&reference, &dest, &opts()).unwrap_err();
    assert!(
        matches!(&err, ImageError::SizeMismatch { digest, .. } if *digest == built.config_digest),
        "{err}"
    );
    assert!(!dest.exists());
}

#[test]
fn plain_http_is_explicit_and_registry_errors_are_reported() {
    let reg = registry();
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    image::build(
        &fx.checkpoint_dir,
        &BuildOptions {
            layout_dir: Some(layout.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    // Without http:// (and without plain_http) the client speaks TLS, which a plain-HTTP
    // registry does not: the handshake fails, nothing falls back to plain HTTP.
    let bare = format!("127.0.0.1:{}/gpusnap/x:y", reg.port());
    let err = image::push(&layout, &bare, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::Transport { .. }), "{err}");
    // ...and allowed when asked for.
    image::push(
        &layout,
        &bare,
        &RegistryOptions {
            plain_http: true,
            ..opts()
        },
    )
    .unwrap();
    // A missing tag: the registry's own error code comes through.
    let err = image::pull(
        &reg.url("gpusnap/x:missing"),
        &fx.work.path().join("p"),
        &opts(),
    )
    .unwrap_err();
    match &err {
        ImageError::Registry { status, code, .. } => {
            assert_eq!(*status, 404);
            assert_eq!(code.as_deref(), Some("MANIFEST_UNKNOWN"), "{err}");
        }
        other => panic!("{other}"),
    }
    // Nothing listening.
    let dead = format!("http://127.0.0.1:{}/gpusnap/x:y", free_tcp_port().unwrap());
    let err = image::pull(&dead, &fx.work.path().join("q"), &opts()).unwrap_err();
    assert!(matches!(err, ImageError::Transport { .. }), "{err}");
    assert!(!fx.work.path().join("q").exists());
}
