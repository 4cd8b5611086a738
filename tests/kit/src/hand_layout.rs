//! OCI image layouts written by hand, for tests that feed hostile images to `extract` and
//! `pull --extract`: the layers hold whatever bytes the test made (names written verbatim,
//! gzip bombs), while every digest and size is correct, so only the content is hostile.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::fixtures::sha256_bytes;

/// Media type of an uncompressed layer.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Media type of a gzip-compressed layer.
pub const LAYER_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// `data`, gzip-compressed at the best ratio (what makes a small bomb).
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Stores `bytes` as a blob of `layout`; returns its digest (`sha256:…`) and size.
pub fn put_blob(layout: &Path, bytes: &[u8]) -> (String, u64) {
    let d = sha256_bytes(bytes);
    let hex = d.strip_prefix("sha256:").expect("sha256 digest");
    fs::write(layout.join("blobs/sha256").join(hex), bytes).unwrap();
    (d, bytes.len() as u64)
}

/// Points `layout`'s `index.json` at the one manifest `digest` of `size` bytes.
pub fn write_index(layout: &Path, digest: &str, size: u64) {
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": MANIFEST, "digest": digest, "size": size}],
        }))
        .unwrap(),
    )
    .unwrap();
}

/// An OCI layout at `layout` with these layers (tar bytes, gzip-compressed when the flag is
/// set; the config's diff IDs are over the tar) and, when given, these manifest annotations.
pub fn write_layout(layout: &Path, layers: &[(Vec<u8>, bool)], annotations: Option<Value>) {
    fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for (tar, gz) in layers {
        diff_ids.push(sha256_bytes(tar));
        let (blob, mt) = if *gz {
            (gzip(tar), LAYER_TAR_GZIP)
        } else {
            (tar.clone(), LAYER_TAR)
        };
        let (d, size) = put_blob(layout, &blob);
        descs.push(json!({"mediaType": mt, "digest": d, "size": size}));
    }
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids}
    }))
    .unwrap();
    let (cd, cs) = put_blob(layout, &config);
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": cd, "size": cs},
        "layers": descs,
    });
    if let Some(a) = annotations {
        manifest["annotations"] = a;
    }
    let (md, ms) = put_blob(layout, &serde_json::to_vec(&manifest).unwrap());
    write_index(layout, &md, ms);
}
