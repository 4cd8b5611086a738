//! Symlinks inside untrusted trees given to the `gpusnap` CLI are data, never followed: an OCI
//! layout for `gpusnap image push` / `gpusnap inspect` whose `blobs/sha256/<digest>` or
//! `index.json` is a symlink, and a directory for `gpusnap inspect` whose `checkpoint/` is one.
//! Before, push read (and uploaded) whatever the blob's symlink pointed at, and inspect read
//! and hashed the checkpoint outside. Each case points at an [`Unread`] file outside the tree
//! that must stay unread and unchanged, and the refusal names the entry. Also: an archived
//! manifest larger than any manifest is refused unread, naming its size and the cap.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

use gpusnap_checkpoint::layout::MANIFEST_MAX_BYTES;
use gpusnap_oci_image::Digest;
use gpusnap_testkit::beneath::Unread;
use gpusnap_testkit::{describe, paths, Registry};
use serde_json::json;

fn gpusnap(args: &[&str]) -> Output {
    Command::new(paths::binary("gpusnap"))
        .args(args)
        .env("COLUMNS", "200")
        .env_remove("GPUSNAP_LOG")
        .output()
        .unwrap()
}

fn put_blob(layout: &Path, bytes: &[u8]) -> Digest {
    let d = Digest::of(bytes);
    fs::write(layout.join("blobs/sha256").join(d.hex()), bytes).unwrap();
    d
}

/// A one-layer OCI layout; returns the layer's bytes and digest.
fn layout(dir: &Path) -> (Vec<u8>, Digest) {
    fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "hello", &b"hello"[..]).unwrap();
    let layer = b.into_inner().unwrap();
    let ld = put_blob(dir, &layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [ld.to_string()]}
    }))
    .unwrap();
    let cd = put_blob(dir, &config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": cd.to_string(), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": ld.to_string(), "size": layer.len()}],
    }))
    .unwrap();
    let md = put_blob(dir, &manifest);
    fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": md.to_string(), "size": manifest.len()}],
        }))
        .unwrap(),
    )
    .unwrap();
    (layer, ld)
}

fn refused(out: &Output, says: &[&str]) {
    let err =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "succeeded: {}", describe(out));
    for s in says {
        assert!(err.contains(s), "want {s:?}: {}", describe(out));
    }
}

/// The layer blob of a layout is a symlink to a host file holding exactly the layer's bytes:
/// the push used to read it (the digest even matched) and upload it.
#[test]
fn push_never_reads_a_symlinked_blob() {
    gpusnap_testkit::require_root();
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("layout");
    let (layer, ld) = layout(&img);
    let host = Unread::new(&t.path().join("host-file"), &layer).unwrap();
    let blob = img.join("blobs/sha256").join(ld.hex());
    fs::remove_file(&blob).unwrap();
    std::os::unix::fs::symlink(host.path(), &blob).unwrap();
    let reg = Registry::start().unwrap();
    let push = || {
        gpusnap(&[
            "image",
            "push",
            img.to_str().unwrap(),
            &reg.image("hostile/blob:v1"),
            "--plain-http",
        ])
    };
    let out = push();
    refused(&out, &[&format!("blobs/sha256/{}", ld.hex()), "symlink"]);
    host.check().unwrap();
    // The same push, plain: the layout itself is fine.
    fs::remove_file(&blob).unwrap();
    fs::write(&blob, &layer).unwrap();
    let out = push();
    assert!(out.status.success(), "{}", describe(&out));
}

/// `index.json` of a layout is a symlink to another layout's index elsewhere: inspect used to
/// describe that image.
#[test]
fn inspect_never_reads_a_symlinked_index() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("layout");
    layout(&img);
    let index = fs::read(img.join("index.json")).unwrap();
    let host = Unread::new(&t.path().join("host-index.json"), &index).unwrap();
    fs::remove_file(img.join("index.json")).unwrap();
    std::os::unix::fs::symlink(host.path(), img.join("index.json")).unwrap();
    let out = gpusnap(&["inspect", img.to_str().unwrap()]);
    refused(&out, &["index.json", "symlink"]);
    host.check().unwrap();
}

/// A directory whose `checkpoint/` is a symlink to a checkpoint elsewhere: inspect used to
/// read that checkpoint's manifest (container, processes) and hash every image of it.
#[test]
fn inspect_never_follows_a_symlinked_checkpoint_dir() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("pages-1.img"), b"pages").unwrap();
    let mut m = gpusnap_checkpoint::Manifest::new(
        "someone-elses-container",
        gpusnap_criu_bridge::CriuFlags::default(),
    );
    m.gpu = None;
    gpusnap_checkpoint::seal_checkpoint(&outside, m).unwrap();
    let manifest = fs::read(outside.join("gpusnap-manifest.json")).unwrap();
    fs::remove_file(outside.join("gpusnap-manifest.json")).unwrap();
    let host = Unread::new(&outside.join("gpusnap-manifest.json"), &manifest).unwrap();
    let pages = Unread::new(&outside.join("pages-1.img"), b"pages").unwrap();
    let given = t.path().join("given");
    fs::create_dir(&given).unwrap();
    std::os::unix::fs::symlink(&outside, given.join("checkpoint")).unwrap();
    let out = gpusnap(&["inspect", given.to_str().unwrap()]);
    refused(&out, &["checkpoint is a symlink"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("someone-elses-container"), "{text}");
    host.check().unwrap();
    pages.check().unwrap();
}

/// A CRI archive whose `checkpoint/gpusnap-manifest.json` is one byte over the cap: refused
/// unread with its size and the cap (it used to be cut at 64 MiB and parsed).
#[test]
fn inspect_refuses_an_oversized_archived_manifest() {
    let t = tempfile::tempdir().unwrap();
    let size = MANIFEST_MAX_BYTES + 1;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    {
        let mut b = tar::Builder::new(&mut gz);
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o600);
        h.set_cksum();
        b.append_data(
            &mut h,
            "checkpoint/gpusnap-manifest.json",
            std::io::Read::take(std::io::repeat(b' '), size),
        )
        .unwrap();
        b.finish().unwrap();
    }
    let archive = t.path().join("big.tar.gz");
    fs::File::create(&archive)
        .unwrap()
        .write_all(&gz.finish().unwrap())
        .unwrap();
    let out = gpusnap(&["inspect", "--no-verify", archive.to_str().unwrap()]);
    refused(
        &out,
        &[
            "checkpoint/gpusnap-manifest.json",
            &format!("{size} bytes"),
            &format!("{MANIFEST_MAX_BYTES} bytes"),
        ],
    );
}
