//! Helpers shared by this crate's integration tests (each test binary uses some of them).
#![allow(dead_code)]

use std::fs;
use std::path::Path;

use gpusnap_oci_image::{self as image, BuildOptions, BuiltImage, Digest, ImageError, LayerRole};
use gpusnap_testkit::registry::Registry;

/// A private plain-HTTP registry on loopback.
pub fn registry() -> Registry {
    Registry::start().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The sorted entries of `dir` (to show that a failed pull left nothing beside its destination).
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Builds `source` without chunking (one layer a file) into an OCI layout at `layout`.
pub fn build_layout(source: &Path, layout: &Path) -> BuiltImage {
    build_unchunked(source, Some(layout), None)
}

/// Builds `source` without chunking into an OCI layout and/or an OCI archive.
pub fn build_unchunked(source: &Path, layout: Option<&Path>, archive: Option<&Path>) -> BuiltImage {
    image::build(
        source,
        &BuildOptions {
            layout_dir: layout.map(Path::to_path_buf),
            archive_path: archive.map(Path::to_path_buf),
            chunking: None,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The digest of GPU extent layer `n` (from 0) of `built`, for tests that tamper with it.
pub fn gpu_extent(built: &BuiltImage, n: usize) -> Digest {
    built
        .layers
        .iter()
        .filter(|l| l.role == LayerRole::GpuExtent)
        .nth(n)
        .unwrap()
        .descriptor
        .digest
        .clone()
}

/// `err` is the digest check refusing the blob `digest`.
pub fn assert_digest_mismatch(err: &ImageError, digest: &Digest) {
    assert!(
        matches!(err, ImageError::DigestMismatch { expected, .. } if expected == digest),
        "{err}"
    );
}

/// `err` is the size check refusing the blob `digest`.
pub fn assert_size_mismatch(err: &ImageError, digest: &Digest) {
    assert!(
        matches!(err, ImageError::SizeMismatch { digest: d, .. } if d == digest),
        "{err}"
    );
}
