//! `pull_extract`: a checkpoint image pulled from a real registry (Debian's `docker-registry`)
//! and unpacked while it downloads, several layers at once. The result must equal what `pull`
//! then `extract` produce; every failure (a tampered, longer, shorter or oversized blob, a
//! hostile layer racing another layer) must leave nothing at the destination or beside it.

use std::fs;

use gpusnap_oci_image::{self as image, ImageError};
use gpusnap_oci_image::{RegistryOptions, SourceLayout};
use gpusnap_testkit::fixtures::*;
use gpusnap_testkit::hand_layout::write_layout;

mod common;
use common::{
    assert_digest_mismatch, assert_size_mismatch, build_layout, entries, gpu_extent, registry,
};

#[test]
fn pull_extract_equals_pull_then_extract_at_any_parallelism() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let layout = w.join("layout");
    let built = build_layout(&fx.archive, &layout);
    let reference = reg.url("gpusnap/trainer:v1");
    image::push(&layout, &reference, &RegistryOptions::default()).unwrap();

    let out = w.join("out");
    fs::create_dir_all(&out).unwrap();
    for parallel in [1, 4] {
        let dest = out.join(format!("p{parallel}"));
        let opts = RegistryOptions {
            parallel_blobs: parallel,
            ..Default::default()
        };
        let (report, ex) = image::pull_extract(&reference, &dest, &opts).unwrap();
        assert_eq!(report.digest, built.index_digest);
        assert!(!report.pinned);
        // index + manifest + config + 6 layers.
        assert_eq!(report.blobs, 9, "{report:?}");
        assert_eq!(ex.source_layout, SourceLayout::CriArchive);
        assert_eq!(ex.manifest_digest, built.manifest_digest);
        assert_eq!(ex.layers, 6);
        assert_eq!(ex.layer_bytes, built.total_layer_bytes);
        assert_eq!(ex.gpusnap_manifest, fx.manifest);
        assert_eq!(ex.checkpoint_dir, dest.join("checkpoint"));
        let origin: serde_json::Value =
            serde_json::from_slice(&fs::read(dest.join("gpusnap-origin.json")).unwrap()).unwrap();
        assert_eq!(origin["manifest_digest"], built.manifest_digest.as_str());
        assert_eq!(origin["source"], reference.as_str());
        fs::remove_file(dest.join("gpusnap-origin.json")).unwrap();
        assert_same_tree(&dest, &fx.archive_root);
        gpusnap_checkpoint::validate_for_restore(&ex.checkpoint_dir).unwrap();
    }
    // Nothing but the results beside them: no staging directory, no scratch layout.
    assert_eq!(entries(&out), vec!["p1".to_owned(), "p4".to_owned()]);

    // An image of the bare checkpoint directory extracts to the checkpoint itself.
    let cp_layout = w.join("cp-layout");
    build_layout(&fx.checkpoint_dir, &cp_layout);
    let cp_ref = reg.url("gpusnap/trainer:cp");
    image::push(&cp_layout, &cp_ref, &RegistryOptions::default()).unwrap();
    let dest = out.join("cp");
    let (_, ex) = image::pull_extract(&cp_ref, &dest, &RegistryOptions::default()).unwrap();
    assert_eq!(ex.source_layout, SourceLayout::CheckpointDir);
    assert_eq!(ex.checkpoint_dir, dest);
    gpusnap_checkpoint::validate_for_restore(&dest).unwrap();
    assert_eq!(entries(&out), vec!["cp", "p1", "p4"]);
}

#[test]
fn failed_pull_extracts_leave_nothing() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let layout = w.join("layout");
    let built = build_layout(&fx.archive, &layout);
    let reference = reg.url("gpusnap/bad:v1");
    let o = RegistryOptions::default();
    image::push(&layout, &reference, &o).unwrap();
    let out = w.join("out");
    fs::create_dir_all(&out).unwrap();
    let dest = out.join("ck");
    let nothing_left = |what: &str| {
        assert!(!dest.exists(), "{what}: {} exists", dest.display());
        assert!(entries(&out).is_empty(), "{what}: left {:?}", entries(&out));
    };
    let extent = gpu_extent(&built, 1);
    let data = reg.blob_data(extent.as_str());
    let original = fs::read(&data).unwrap();

    // Same size, one byte changed in the middle of the GPU memory: the digest over the bytes
    // that were unpacked refuses it.
    let mut flipped = original.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0xff;
    fs::write(&data, &flipped).unwrap();
    let err = image::pull_extract(&reference, &dest, &o).unwrap_err();
    assert_digest_mismatch(&err, &extent);
    assert!(err.to_string().contains(extent.as_str()), "{err}");
    nothing_left("tampered extent");

    // A damaged tar header: the blob's own digest is the error, not the tar's.
    let mut header = original.clone();
    header[10] ^= 0xff;
    fs::write(&data, &header).unwrap();
    let err = image::pull_extract(&reference, &dest, &o).unwrap_err();
    assert_digest_mismatch(&err, &extent);
    nothing_left("damaged tar header");

    // Longer and shorter than its descriptor.
    let mut longer = original.clone();
    longer.extend_from_slice(&[0u8; 4096]);
    fs::write(&data, &longer).unwrap();
    let err = image::pull_extract(&reference, &dest, &o).unwrap_err();
    assert_size_mismatch(&err, &extent);
    nothing_left("longer blob");
    fs::write(&data, &original[..original.len() - 512]).unwrap();
    let err = image::pull_extract(&reference, &dest, &o).unwrap_err();
    assert_size_mismatch(&err, &extent);
    nothing_left("shorter blob");
    fs::write(&data, &original).unwrap();

    // A layer over the cap: refused from its descriptor, before any layer is fetched.
    let err = image::pull_extract(
        &reference,
        &dest,
        &RegistryOptions {
            max_blob_bytes: 1 << 20,
            ..o.clone()
        },
    )
    .unwrap_err();
    assert!(matches!(&err, ImageError::TooLarge { .. }), "{err}");
    nothing_left("layer over the cap");

    // A destination that is not empty is refused before anything is fetched.
    fs::create_dir_all(dest.join("x")).unwrap();
    let err = image::pull_extract(&reference, &dest, &o).unwrap_err();
    assert!(
        matches!(&err, ImageError::DestinationExists { .. }),
        "{err}"
    );
    fs::remove_dir_all(&dest).unwrap();

    // And then the same pull works.
    image::pull_extract(&reference, &dest, &o).unwrap();
    assert_eq!(entries(&out), vec!["ck".to_owned()]);
}

/// An uncompressed layer of these entries (name, kind, link target, data), each header's name
/// and link written verbatim (the `tar` builder refuses hostile names).
fn layer(entries: &[(&str, tar::EntryType, &str, &[u8])]) -> (Vec<u8>, bool) {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link, data) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        let raw = h.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    (b.into_inner().unwrap(), false)
}

#[test]
fn hostile_layers_racing_each_other_are_refused() {
    let reg = registry();
    let w = tempfile::tempdir().unwrap();
    let out = w.path().join("out");
    fs::create_dir_all(&out).unwrap();
    // Beside the destination, where `../` from the staging directory's children would land.
    let sentinel = w.path().join("sentinel");
    fs::create_dir_all(&sentinel).unwrap();
    fs::write(sentinel.join("keep"), b"host data").unwrap();
    let before = tree(&sentinel);

    let big = vec![7u8; 8 << 20];
    use tar::EntryType::{Directory, Regular, Symlink};
    let cases = vec![
        // Layer 0 plants a symlink inside the root; layer 1, unpacked at the same time, writes
        // through it. Whichever runs first, one of them is refused.
        (
            "symlink-then-write",
            vec![
                layer(&[
                    ("checkpoint/", Directory, "", &[]),
                    ("checkpoint/pages-9.img", Regular, "", &big),
                    ("checkpoint/d/up", Symlink, "../..", &[]),
                ]),
                layer(&[("checkpoint/d/up/escaped", Regular, "", b"x")]),
            ],
            "refused",
        ),
        (
            "dot-dot",
            vec![
                layer(&[("checkpoint/pages-9.img", Regular, "", &big)]),
                layer(&[("../../sentinel/keep", Regular, "", b"owned")]),
            ],
            "",
        ),
        (
            "same-file-in-two-layers",
            vec![
                layer(&[("checkpoint/pages-1.img", Regular, "", &big)]),
                layer(&[("checkpoint/pages-1.img", Regular, "", b"other")]),
            ],
            "twice",
        ),
    ];
    for (name, layers, expect) in cases {
        let layout = w.path().join(format!("layout-{name}"));
        write_layout(&layout, &layers, None);
        let reference = reg.url(&format!("gpusnap/hostile:{name}"));
        image::push(&layout, &reference, &RegistryOptions::default()).unwrap();
        let dest = out.join("ck");
        let err =
            image::pull_extract(&reference, &dest, &RegistryOptions::default()).expect_err(name);
        assert!(
            matches!(
                err,
                ImageError::Malformed { .. } | ImageError::UnsupportedEntry { .. }
            ),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(expect), "{name}: {err}");
        assert!(entries(&out).is_empty(), "{name}: left {:?}", entries(&out));
        assert_eq!(tree(&sentinel), before, "{name} changed the sentinel");
    }
}
