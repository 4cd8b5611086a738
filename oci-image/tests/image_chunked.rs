//! Chunked checkpoint images: two replicas of the fleet shape (seeded weights shared, a zero
//! region, a changing state) share their pack layers; a chunked image extracts — from a
//! layout and through a registry with `pull --extract` — into the same checkpoint directory
//! the classic layout gives, which validates for restore.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use gpusnap_checkpoint::chunks::ChunkParams;
use gpusnap_checkpoint::{seal_checkpoint, Manifest};
use gpusnap_criu_bridge::CriuFlags;
use gpusnap_oci_image::{self as image, BuildOptions, Chunking, LayerRole, RegistryOptions};
use gpusnap_testkit::fixtures::noise;
use gpusnap_testkit::registry::Registry;

/// Small chunks so that a few MiB make many chunks and several packs.
const SMALL: Chunking = Chunking {
    chunk: ChunkParams {
        min: 16 << 10,
        avg: 64 << 10,
        max: 256 << 10,
    },
    pack_bytes: 512 << 10,
    max_packs: 64,
};

/// A replica's checkpoint directory: GPU memory = 3 MiB weights (seed 1) + 2 MiB zeros +
/// 512 KiB state (seed per replica); pages = 1 MiB of its own.
fn replica(dir: &Path, state_seed: u64) {
    fs::create_dir_all(dir).unwrap();
    let mut gpu = noise(3 << 20, 1);
    gpu.resize(gpu.len() + (2 << 20), 0);
    gpu.extend(noise(512 << 10, state_seed));
    fs::write(dir.join("gpusnap-gpu-device-0000.bin"), &gpu).unwrap();
    fs::write(dir.join("pages-1.img"), noise(1 << 20, state_seed + 1)).unwrap();
    fs::write(dir.join("inventory.img"), b"inventory").unwrap();
    fs::write(dir.join("core-1.img"), noise(3000, state_seed + 2)).unwrap();
    seal_checkpoint(dir, Manifest::new("replica", CriuFlags::default())).unwrap();
}

fn build(dir: &Path, layout: &Path) -> image::BuiltImage {
    image::build(
        dir,
        &BuildOptions {
            layout_dir: Some(layout.to_path_buf()),
            chunking: Some(SMALL),
            ..Default::default()
        },
    )
    .unwrap()
}

fn packs(b: &image::BuiltImage) -> Vec<(String, u64)> {
    b.layers
        .iter()
        .filter(|l| l.role == LayerRole::ChunkPack)
        .map(|l| (l.descriptor.digest.to_string(), l.descriptor.size))
        .collect()
}

fn same_files(got: &Path, want: &Path) {
    for name in [
        "gpusnap-gpu-device-0000.bin",
        "pages-1.img",
        "core-1.img",
        "inventory.img",
        "gpusnap-manifest.json",
    ] {
        assert_eq!(
            fs::read(got.join(name)).unwrap(),
            fs::read(want.join(name)).unwrap(),
            "{name}"
        );
    }
    let leftovers: Vec<String> = fs::read_dir(got)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("chunk") || n.starts_with(".gpusnap"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn replicas_share_pack_layers_and_extract_to_the_checkpoint() {
    let w = tempfile::tempdir().unwrap();
    let (a, b) = (w.path().join("a"), w.path().join("b"));
    replica(&a, 100);
    replica(&b, 200);
    let ia = build(&a, &w.path().join("ia"));
    let ib = build(&b, &w.path().join("ib"));

    let ca = ia.chunks.clone().expect("chunked by default options");
    // The zero region is one chunk, stored once.
    assert!(ca.distinct_chunks < ca.chunks, "{ca:?}");
    assert!(ca.stored_bytes + (1 << 20) < ca.logical_bytes, "{ca:?}");
    assert!(ca.packs > 1 && ia.layers.len() <= 100, "{ca:?}");
    assert_eq!(
        ia.annotations
            .get(image::keys::GPUSNAP_CHUNKED)
            .map(String::as_str),
        Some("true")
    );
    assert!(!ia.layers.iter().any(|l| l.role == LayerRole::GpuExtent));
    assert_eq!(
        ia.layers.last().map(|l| l.role),
        Some(LayerRole::GpusnapManifest)
    );

    // The weights travel in packs both images share, byte for byte.
    let pa: HashSet<_> = packs(&ia).into_iter().collect();
    let shared: u64 = packs(&ib)
        .into_iter()
        .filter(|p| pa.contains(p))
        .map(|p| p.1)
        .sum();
    let total_b: u64 = packs(&ib).iter().map(|p| p.1).sum();
    println!(
        "replica B: {shared} of {total_b} pack bytes shared with replica A ({} packs, {} chunks)",
        packs(&ib).len(),
        ib.chunks.as_ref().unwrap().chunks
    );
    assert!(shared >= 2 << 20, "only {shared} bytes of packs shared");
    // B's own bytes are 1.5 MiB (state and pages); a pack that mixes them with shared chunks
    // costs about a pack more. Without chunks B would add all 5 MiB again.
    assert!(
        total_b - shared < (3 << 20),
        "B adds {} bytes",
        total_b - shared
    );

    // Extract: the same checkpoint directory, chunks gone, valid for restore.
    let out = w.path().join("out-a");
    let ex = image::extract(&w.path().join("ia"), &out).unwrap();
    assert_eq!(ex.checkpoint_dir, out);
    same_files(&out, &a);
    gpusnap_checkpoint::validate_for_restore(&out).unwrap();
}

#[test]
fn chunked_image_pull_extracts_through_a_registry() {
    let reg = Registry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let w = tempfile::tempdir().unwrap();
    let a = w.path().join("a");
    replica(&a, 7);
    let layout = w.path().join("layout");
    let built = build(&a, &layout);
    let reference = reg.url("gpusnap/chunked:v1");
    image::push(&layout, &reference, &RegistryOptions::default()).unwrap();
    let dest = w.path().join("pulled");
    let (report, ex) = image::pull_extract(&reference, &dest, &RegistryOptions::default()).unwrap();
    assert_eq!(report.digest, built.index_digest);
    assert_eq!(ex.layers, built.layers.len());
    fs::remove_file(dest.join("gpusnap-origin.json")).unwrap();
    same_files(&dest, &a);
    gpusnap_checkpoint::validate_for_restore(&dest).unwrap();
}
