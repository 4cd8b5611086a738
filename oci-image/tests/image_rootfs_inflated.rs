//! `image build` records the rootfs diff's inflated size in the manifest
//! (`io.gpusnap.rootfs-diff.inflated-size`), and extraction holds the diff to that claim: a diff
//! that inflates past what the image declares is refused, a claim that is no number is refused,
//! and an honest claim extracts with the origin record's `content_bytes` equal to it.

use std::io::Read;
use std::path::Path;

use gpusnap_checkpoint::layout::ORIGIN_FILE;
use gpusnap_checkpoint::origin::Origin;
use gpusnap_oci_image::{self as image, keys, BuildOptions, ImageError};
use gpusnap_testkit::fixtures::fixture;

/// The bytes of file content in the fixture's gzip'd rootfs diff, counted independently.
fn inflated(diff: &Path) -> u64 {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(diff).unwrap());
    let mut archive = tar::Archive::new(gz);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let mut n = 0u64;
            let mut buf = [0u8; 4096];
            loop {
                let k = e.read(&mut buf).unwrap();
                if k == 0 {
                    break n;
                }
                n += k as u64;
            }
        })
        .sum()
}

fn build(
    fx: &gpusnap_testkit::fixtures::Fixture,
    name: &str,
    claim: Option<&str>,
) -> std::path::PathBuf {
    let layout = fx.work.path().join(name);
    let annotations = claim
        .map(|c| {
            (
                keys::GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE.to_owned(),
                c.to_owned(),
            )
        })
        .into_iter()
        .collect();
    image::build(
        &fx.archive,
        &BuildOptions {
            layout_dir: Some(layout.clone()),
            annotations,
            ..Default::default()
        },
    )
    .unwrap();
    layout
}

#[test]
fn build_records_the_inflated_size_and_extract_holds_the_diff_to_it() {
    let fx = fixture();
    let want = inflated(&fx.archive_root.join("rootfs-diff.tar"));
    assert!(want > 0);

    let layout = build(&fx, "honest", None);
    let info = image::inspect(&layout).unwrap();
    assert_eq!(
        info.manifest_annotations
            .get(keys::GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE)
            .map(String::as_str),
        Some(want.to_string().as_str()),
        "the manifest's claim"
    );
    let dest = fx.work.path().join("honest-out");
    image::extract(&layout, &dest).unwrap();
    let origin: Origin =
        serde_json::from_slice(&std::fs::read(dest.join(ORIGIN_FILE)).unwrap()).unwrap();
    assert_eq!(
        origin.rootfs_diff.unwrap().content_bytes,
        Some(want),
        "the origin record's count"
    );

    // A diff that inflates past the claim (the claim forged one byte short) is refused, and
    // nothing is left at the destination.
    let short = (want - 1).to_string();
    let layout = build(&fx, "short", Some(&short));
    let dest = fx.work.path().join("short-out");
    let err = image::extract(&layout, &dest).unwrap_err().to_string();
    assert!(
        err.contains(keys::GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE) && err.contains(&short),
        "{err}"
    );
    assert!(!dest.exists() || std::fs::read_dir(&dest).unwrap().next().is_none());

    // A claim that is no byte count is refused before any layer is read.
    let layout = build(&fx, "junk", Some("lots"));
    let err = image::extract(&layout, &fx.work.path().join("junk-out")).unwrap_err();
    assert!(matches!(err, ImageError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("not a byte count"), "{err}");

    // A claim larger than the destination's free space is refused before any layer is read.
    let layout = build(&fx, "huge", Some(&u64::MAX.to_string()));
    let err = image::extract(&layout, &fx.work.path().join("huge-out")).unwrap_err();
    assert!(matches!(err, ImageError::NoSpace { .. }), "{err}");
}
