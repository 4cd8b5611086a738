//! Building, inspecting and extracting combined checkpoint images from a synthetic CRI
//! checkpoint archive and from a bare checkpoint directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::Command;

use gpusnap_checkpoint::validate_for_restore;
use gpusnap_oci_image::{self as image, keys, BuildOptions, ImageError, LayerRole, SourceLayout};
use gpusnap_testkit::cmd::run_ok;
use gpusnap_testkit::fixtures::*;
use gpusnap_testkit::paths::require_tool;
use serde_json::Value;

mod common;
use common::{build_layout, build_unchunked, gpu_extent};

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

fn host_goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Reads a blob by descriptor, checking size and digest independently of the crate.
fn blob(layout: &Path, desc: &Value) -> Vec<u8> {
    let digest = desc["digest"].as_str().unwrap();
    let bytes = fs::read(oci_blob_path(layout, digest)).unwrap();
    assert_eq!(sha256_bytes(&bytes), digest, "blob content vs its digest");
    assert_eq!(
        bytes.len() as u64,
        desc["size"].as_u64().unwrap(),
        "{digest} size"
    );
    bytes
}

fn ann<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v["annotations"][key].as_str()
}

#[test]
fn build_from_cri_archive_writes_a_valid_annotated_layout_and_archive() {
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    let archive = fx.work.path().join("image.oci.tar");
    let built = build_unchunked(&fx.archive, Some(&layout), Some(&archive));
    assert_eq!(built.container_name, CONTAINER_NAME);
    assert_eq!(
        built.image_name,
        "localhost/gpusnap-checkpoint/trainer:latest"
    );
    assert_eq!(built.source_layout, SourceLayout::CriArchive);

    // oci-layout and index.json.
    assert_eq!(
        read_json(&layout.join("oci-layout")),
        serde_json::json!({"imageLayoutVersion": "1.0.0"})
    );
    let index_json = read_json(&layout.join("index.json"));
    assert_eq!(index_json["schemaVersion"], 2);
    assert_eq!(index_json["mediaType"], OCI_INDEX);
    let entries = index_json["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    let top = &entries[0];
    assert_eq!(top["mediaType"], OCI_INDEX);
    assert_eq!(top["digest"], built.index_digest.as_str());
    assert_eq!(
        ann(top, keys::OCI_REF_NAME),
        Some(built.image_name.as_str())
    );
    assert_eq!(
        ann(top, keys::CONTAINERD_IMAGE_NAME),
        Some(built.image_name.as_str())
    );
    assert_eq!(ann(top, keys::CRIU_CONTAINER_NAME), Some(CONTAINER_NAME));

    // Image index → manifest → config and layers; every blob checked by hand.
    let index: Value = serde_json::from_slice(&blob(&layout, top)).unwrap();
    assert_eq!(index["mediaType"], OCI_INDEX);
    let mdesc = &index["manifests"][0];
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
    assert_eq!(mdesc["mediaType"], OCI_MANIFEST);
    assert_eq!(mdesc["platform"]["os"], "linux");
    assert_eq!(mdesc["platform"]["architecture"], host_goarch());
    assert_eq!(mdesc["digest"], built.manifest_digest.as_str());
    let manifest: Value = serde_json::from_slice(&blob(&layout, mdesc)).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], OCI_MANIFEST);
    assert_eq!(manifest["config"]["mediaType"], OCI_CONFIG);
    let config: Value = serde_json::from_slice(&blob(&layout, &manifest["config"])).unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], host_goarch());
    assert_eq!(config["rootfs"]["type"], "layers");
    let layers = manifest["layers"].as_array().unwrap();
    let diff_ids: Vec<&str> = config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(diff_ids.len(), layers.len());

    // Annotations both engines recognise, on the index and on the manifest, with values from
    // spec.dump, config.dump and the gpusnap manifest.
    let manifest_file = fs::read(fx.checkpoint_dir.join("gpusnap-manifest.json")).unwrap();
    let expected: BTreeMap<&str, String> = [
        (keys::CRIU_CONTAINER_NAME, CONTAINER_NAME.to_owned()),
        (keys::CRIO_CHECKPOINT_NAME, CONTAINER_NAME.to_owned()),
        (keys::PODMAN_CHECKPOINT_NAME, CONTAINER_NAME.to_owned()),
        (keys::CRIU_ENGINE_NAME, "containerd".to_owned()),
        (keys::CRIU_POD_NAME, "train-pod".to_owned()),
        (keys::CRIU_POD_NAMESPACE, "ml".to_owned()),
        (
            keys::CRIU_POD_ID,
            "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b".to_owned(),
        ),
        (keys::CRIU_ROOTFS_IMAGE_NAME, ROOTFS_IMAGE.to_owned()),
        (
            keys::CRIU_ROOTFS_IMAGE_USER_REQUESTED,
            ROOTFS_IMAGE.to_owned(),
        ),
        (keys::CRIU_ROOTFS_IMAGE_ID, ROOTFS_IMAGE_REF.to_owned()),
        (
            keys::CRIU_RUNTIME_NAME,
            "io.containerd.gpusnap.v2".to_owned(),
        ),
        (keys::CRIU_RUNTIME_VERSION, "1.1.12".to_owned()),
        (keys::CRIU_CRIU_VERSION, "4.1".to_owned()),
        (keys::CRIU_HOST_ARCH, host_goarch().to_owned()),
        (
            keys::CRIU_HOST_KERNEL,
            fx.manifest.host.kernel_release.clone(),
        ),
        (keys::OCI_CREATED, fx.manifest.created_at.clone()),
        (keys::GPUSNAP_MANIFEST_DIGEST, sha256_bytes(&manifest_file)),
        (keys::GPUSNAP_CONTAINER_ID, CONTAINER_ID.to_owned()),
        (keys::GPUSNAP_GPU_ENGINE, "driver-managed".to_owned()),
        (keys::GPUSNAP_GPU_EXTENTS, "2".to_owned()),
        (keys::GPUSNAP_SOURCE_LAYOUT, "cri-archive".to_owned()),
    ]
    .into_iter()
    .collect();
    for doc in [&index, &manifest] {
        for (k, v) in &expected {
            assert_eq!(ann(doc, k), Some(v.as_str()), "annotation {k}");
        }
    }
    assert_eq!(
        built.gpusnap_manifest_digest.as_str(),
        sha256_bytes(&manifest_file)
    );

    // Layers: plain OCI tar layers (so both engines unpack all of them), roles in order,
    // blob digest == diff_id, and together exactly the archive.
    let roles: Vec<&str> = layers
        .iter()
        .map(|l| ann(l, keys::GPUSNAP_LAYER_ROLE).unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "metadata",
            "criu-images",
            "rootfs-diff",
            "gpu-extent",
            "gpu-extent",
            "gpusnap-manifest"
        ]
    );
    let mut union: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    for (i, l) in layers.iter().enumerate() {
        assert_eq!(l["mediaType"], OCI_LAYER);
        assert_eq!(
            l["digest"], diff_ids[i],
            "uncompressed: digest is the diff_id"
        );
        let members = tar_members(&blob(&layout, l));
        for (p, t, data) in &members {
            if t.is_dir() {
                dirs.insert(p.clone());
            } else {
                assert!(
                    union.insert(p.clone(), data.clone()).is_none(),
                    "{p} in two layers"
                );
            }
        }
        let files: Vec<&str> = members
            .iter()
            .filter(|m| !m.1.is_dir())
            .map(|m| m.0.as_str())
            .collect();
        match roles[i] {
            "metadata" => assert_eq!(
                files,
                [
                    "config.dump",
                    "container.log",
                    "dump.log",
                    "spec.dump",
                    "stats-dump",
                    "status",
                    "status.dump"
                ]
            ),
            "rootfs-diff" => assert_eq!(files, ["rootfs-diff.tar"]),
            "criu-images" => {
                assert!(files.contains(&"checkpoint/pages-1.img"), "{files:?}");
                assert!(files.iter().all(|f| f.starts_with("checkpoint/")));
                assert!(
                    !files.iter().any(|f| f.starts_with("checkpoint/gpusnap-")),
                    "{files:?}"
                );
                // All directories live here, so extents never need parents of their own.
                let dir_names: Vec<&str> = members
                    .iter()
                    .filter(|m| m.1.is_dir())
                    .map(|m| m.0.as_str())
                    .collect();
                // The checkpoint directory is flat: checkpoint/ is the only directory.
                assert_eq!(dir_names, ["checkpoint"]);
            }
            "gpu-extent" => {
                let rel = ann(l, keys::GPUSNAP_GPU_EXTENT_PATH).unwrap();
                assert!(GPU_EXTENTS.contains(&rel), "{rel}");
                assert_eq!(files, [format!("checkpoint/{rel}").as_str()]);
                let src = fs::read(fx.checkpoint_dir.join(rel)).unwrap();
                assert_eq!(members[0].2, src, "extent bytes");
                assert_eq!(
                    ann(l, keys::GPUSNAP_GPU_EXTENT_SIZE),
                    Some(src.len().to_string().as_str())
                );
            }
            "gpusnap-manifest" => {
                assert_eq!(files, ["checkpoint/gpusnap-manifest.json"]);
                assert_eq!(members[0].2, manifest_file);
                assert_eq!(
                    ann(l, keys::GPUSNAP_MANIFEST_DIGEST),
                    Some(sha256_bytes(&manifest_file).as_str())
                );
            }
            r => panic!("unexpected role {r}"),
        }
    }
    // The union of the layers is the archive: same files, same bytes.
    let mut want = BTreeMap::new();
    for (p, n) in tree(&fx.archive_root) {
        match n {
            Node::File { .. } => {
                want.insert(p.clone(), fs::read(fx.archive_root.join(&p)).unwrap());
            }
            Node::Dir { .. } => assert!(dirs.contains(&p), "directory {p} missing"),
            Node::Symlink { .. } => unreachable!(),
        }
    }
    assert_eq!(
        union.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    assert!(union == want, "layer contents differ from the archive");

    // No stray blobs: exactly index + manifest + config + layers.
    let mut referenced: BTreeSet<String> = layers
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_owned())
        .collect();
    for d in [
        &top["digest"],
        &mdesc["digest"],
        &manifest["config"]["digest"],
    ] {
        referenced.insert(d.as_str().unwrap().to_owned());
    }
    let on_disk: BTreeSet<String> = fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert_eq!(on_disk, referenced);
    let top_level: BTreeSet<String> = fs::read_dir(&layout)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        top_level,
        ["blobs", "index.json", "oci-layout"]
            .map(String::from)
            .into()
    );

    // The oci-archive holds the same files, byte for byte.
    let members = tar_members(&fs::read(&archive).unwrap());
    assert_eq!(members[0].0, "oci-layout");
    assert_eq!(members[1].0, "index.json");
    for (p, t, data) in &members {
        if !t.is_dir() {
            assert_eq!(&fs::read(layout.join(p)).unwrap(), data, "{p}");
        }
    }
    assert_eq!(
        members
            .iter()
            .filter(|m| m.0.starts_with("blobs/sha256/"))
            .count(),
        on_disk.len()
    );

    // inspect agrees, from either form.
    for src in [&layout, &archive] {
        let info = image::inspect(src).unwrap();
        assert_eq!(info.image_name.as_deref(), Some(built.image_name.as_str()));
        assert_eq!(info.index_digest.as_ref(), Some(&built.index_digest));
        assert_eq!(info.manifest_digest, built.manifest_digest);
        assert_eq!(info.checkpoint_name.as_deref(), Some(CONTAINER_NAME));
        assert_eq!(info.source_layout, Some(SourceLayout::CriArchive));
        assert_eq!(info.manifest_annotations, built.annotations);
        assert_eq!(info.index_annotations, built.annotations);
        assert_eq!(info.layers, built.layers);
        assert_eq!(info.gpusnap_manifest.as_ref(), Some(&fx.manifest));
        assert_eq!(
            info.layers
                .iter()
                .filter(|l| l.role == LayerRole::GpuExtent)
                .count(),
            2
        );
    }
}

#[test]
fn extract_round_trips_the_archive_byte_for_byte_from_layout_and_archive() {
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    let archive = fx.work.path().join("image.oci.tar");
    build_unchunked(&fx.archive, Some(&layout), Some(&archive));
    for (src, name) in [(&layout, "from-layout"), (&archive, "from-archive")] {
        let dest = fx.work.path().join(name);
        let out = image::extract(src, &dest).unwrap();
        assert_eq!(out.source_layout, SourceLayout::CriArchive);
        assert_eq!(out.checkpoint_dir, dest.join("checkpoint"));
        assert_eq!(out.gpusnap_manifest, fx.manifest);
        assert_eq!(out.layers, 6);
        assert_same_tree_with_origin(&dest, &fx.archive_root);
        // What a node restores from passes gpusnap's own pre-restore validation.
        validate_for_restore(&out.checkpoint_dir).unwrap();
        // No staging directory left beside it.
        let leftovers: Vec<_> = fs::read_dir(fx.work.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".extract-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
    // An existing non-empty destination is refused before any work.
    let err = image::extract(&layout, &fx.archive_root).unwrap_err();
    assert!(matches!(err, ImageError::DestinationExists { .. }), "{err}");
}

#[test]
fn rebuilding_from_the_extracted_tree_reproduces_the_same_image() {
    let fx = fixture();
    let a = build_layout(&fx.archive, &fx.work.path().join("a"));
    let dest = fx.work.path().join("extracted");
    image::extract(&fx.work.path().join("a"), &dest).unwrap();
    // From the extracted directory (an "archive directory" source): same layers, same digests.
    let b = build_layout(&dest, &fx.work.path().join("b"));
    assert_eq!(a.layers, b.layers);
    assert_eq!(a.manifest_digest, b.manifest_digest);
    assert_eq!(a.index_digest, b.index_digest);
}

#[test]
fn build_from_checkpoint_dir_round_trips_and_names_by_container_id() {
    let work = tempfile::tempdir().unwrap();
    let cp = work.path().join("cp");
    let manifest = make_checkpoint_dir(&cp);
    // A pre-dump chain link (CRIU's `parent` symlink; outside the inventory, kept as-is).
    std::os::unix::fs::symlink("../pre-dump-1", cp.join("parent")).unwrap();
    let archive = work.path().join("cp.oci.tar");
    let built = build_unchunked(&cp, None, Some(&archive));
    assert_eq!(built.layout_dir, None);
    assert_eq!(built.source_layout, SourceLayout::CheckpointDir);
    // No CRI metadata: the container is named by the manifest's container id.
    assert_eq!(built.container_name, CONTAINER_ID);
    assert_eq!(
        built
            .annotations
            .get(keys::GPUSNAP_SOURCE_LAYOUT)
            .map(String::as_str),
        Some("checkpoint-dir")
    );
    assert!(!built.annotations.contains_key(keys::CRIU_ENGINE_NAME));
    let roles: Vec<LayerRole> = built.layers.iter().map(|l| l.role).collect();
    assert_eq!(
        roles,
        [
            LayerRole::CriuImages,
            LayerRole::GpuExtent,
            LayerRole::GpuExtent,
            LayerRole::GpusnapManifest
        ]
    );
    // The staging layout beside the archive is gone.
    let names: BTreeSet<String> = fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["cp", "cp.oci.tar"].map(String::from).into());

    let dest = work.path().join("restored-cp");
    let out = image::extract(&archive, &dest).unwrap();
    assert_eq!(out.checkpoint_dir, dest);
    assert_eq!(out.gpusnap_manifest, manifest);
    assert_same_tree_with_origin(&dest, &cp);
    validate_for_restore(&dest).unwrap();
}

#[test]
fn tampered_or_truncated_blobs_are_refused_and_leave_nothing_behind() {
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    let built = build_layout(&fx.archive, &layout);
    let extent = gpu_extent(&built, 0);

    // One flipped byte in a GPU extent layer.
    let bad = fx.work.path().join("bad");
    copy_dir(&layout, &bad);
    flip_byte(&oci_blob_path(&bad, extent.as_str()));
    // inspect does not read extent layers, so it still works...
    image::inspect(&bad).unwrap();
    // ...but extract verifies every layer.
    let dest = fx.work.path().join("dest");
    let err = image::extract(&bad, &dest).unwrap_err();
    match &err {
        ImageError::DigestMismatch { expected, .. } => assert_eq!(expected, &extent),
        other => panic!("expected a digest mismatch, got {other}"),
    }
    assert!(err.is_integrity_failure());
    assert!(err.to_string().contains(extent.as_str()), "{err}");
    assert!(!dest.exists(), "a refused image leaves no destination");
    assert!(
        fs::read_dir(fx.work.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".extract-")),
        "staging removed"
    );

    // A truncated layer.
    let short = fx.work.path().join("short");
    copy_dir(&layout, &short);
    let p = oci_blob_path(&short, extent.as_str());
    let data = fs::read(&p).unwrap();
    fs::write(&p, &data[..data.len() - 1024]).unwrap();
    let err = image::extract(&short, &dest).unwrap_err();
    assert!(err.is_integrity_failure(), "{err}");
    assert!(!dest.exists());

    // A tampered gpusnap manifest layer: inspect reads it, so inspect refuses too.
    let badm = fx.work.path().join("badm");
    copy_dir(&layout, &badm);
    let mlayer = &built.layers.last().unwrap().descriptor.digest;
    flip_byte(&oci_blob_path(&badm, mlayer.as_str()));
    let err = image::inspect(&badm).unwrap_err();
    assert!(err.is_integrity_failure(), "{err}");

    // A tampered manifest document.
    let badj = fx.work.path().join("badj");
    copy_dir(&layout, &badj);
    let mpath = oci_blob_path(&badj, built.manifest_digest.as_str());
    let text = fs::read_to_string(&mpath)
        .unwrap()
        .replace("train-pod", "evil-pod");
    fs::write(&mpath, text).unwrap();
    let err = image::extract(&badj, &dest).unwrap_err();
    assert!(err.is_integrity_failure(), "{err}");
}

#[test]
fn build_refuses_damaged_foreign_or_incomplete_checkpoints() {
    // Modified after sealing (same size): refused, and nothing is left behind.
    let fx = fixture();
    flip_byte(&fx.checkpoint_dir.join("pages-1.img"));
    let bad_archive = fx.work.path().join("bad.tar");
    tar_tree(&fx.archive_root, &bad_archive);
    let layout = fx.work.path().join("layout");
    let archive = fx.work.path().join("out.tar");
    let opts = BuildOptions {
        layout_dir: Some(layout.clone()),
        archive_path: Some(archive.clone()),
        chunking: None,
        ..Default::default()
    };
    let err = image::build(&bad_archive, &opts).unwrap_err();
    match &err {
        ImageError::CheckpointMismatch { file, .. } => assert_eq!(file, "pages-1.img"),
        other => panic!("{other}"),
    }
    assert!(!layout.exists() && !archive.exists());
    // The explicit escape hatch builds it anyway.
    image::build(
        &bad_archive,
        &BuildOptions {
            verify_checkpoint: false,
            ..opts.clone()
        },
    )
    .unwrap();

    // An unlisted CRIU image (two checkpoints mixed).
    let fx = fixture();
    fs::write(fx.checkpoint_dir.join("pages-2.img"), b"stale").unwrap();
    let err = image::build(
        &fx.checkpoint_dir,
        &BuildOptions {
            layout_dir: Some(fx.work.path().join("l2")),
            chunking: None,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, ImageError::CheckpointMismatch { file, .. } if file == "pages-2.img"),
        "{err}"
    );

    // No gpusnap manifest: not a gpusnap checkpoint.
    let fx = fixture();
    fs::remove_file(fx.checkpoint_dir.join("gpusnap-manifest.json")).unwrap();
    let err = image::build(
        &fx.archive_root,
        &BuildOptions {
            layout_dir: Some(fx.work.path().join("l3")),
            chunking: None,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, ImageError::ManifestMissing { .. }), "{err}");
    assert!(err.to_string().contains("gpusnap"), "{err}");

    // No output requested; output directory not empty.
    assert!(matches!(
        image::build(&fx.archive_root, &BuildOptions::default()),
        Err(ImageError::NoOutput)
    ));
    let err = image::build(
        &fx.checkpoint_dir,
        &BuildOptions {
            layout_dir: Some(fx.archive_root.clone()),
            chunking: None,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, ImageError::DestinationExists { .. }), "{err}");
}

#[test]
fn options_override_names_and_add_annotations() {
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    let built = image::build(
        &fx.archive,
        &BuildOptions {
            layout_dir: Some(layout.clone()),
            image_name: Some("registry.example:5000/ml/trainer-ckpt:epoch-7".into()),
            container_name: Some("trainer-v2".into()),
            annotations: [("io.example.run".to_owned(), "42".to_owned())].into(),
            chunking: None,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(built.annotations[keys::CRIU_CONTAINER_NAME], "trainer-v2");
    assert_eq!(built.annotations[keys::CRIO_CHECKPOINT_NAME], "trainer-v2");
    assert_eq!(built.annotations["io.example.run"], "42");
    let info = image::inspect(&layout).unwrap();
    assert_eq!(
        info.image_name.as_deref(),
        Some("registry.example:5000/ml/trainer-ckpt:epoch-7")
    );
    let err = image::build(
        &fx.archive,
        &BuildOptions {
            layout_dir: Some(fx.work.path().join("l2")),
            image_name: Some("Not A Name".into()),
            chunking: None,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, ImageError::Invalid { .. }), "{err}");
}

/// Third-party validation: skopeo parses the layout and the archive and sees our manifest,
/// layers and annotations.
#[test]
fn skopeo_reads_the_layout_and_the_oci_archive() {
    let skopeo = require_tool("skopeo", "skopeo");
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    let archive = fx.work.path().join("image.oci.tar");
    let built = build_unchunked(&fx.archive, Some(&layout), Some(&archive));
    for transport in [
        format!("oci-archive:{}", archive.display()),
        format!("oci:{}:{}", layout.display(), built.image_name),
    ] {
        let out = run_ok(Command::new(&skopeo).args(["inspect", &transport]));
        let v: Value = serde_json::from_str(&out).unwrap();
        // skopeo reports the digest of the document the name points at: our image index.
        assert_eq!(v["Digest"], built.index_digest.as_str(), "{transport}");
        assert_eq!(v["Os"], "linux");
        assert_eq!(v["Architecture"], host_goarch());
        let layers: Vec<&str> = v["Layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap())
            .collect();
        let ours: Vec<&str> = built
            .layers
            .iter()
            .map(|l| l.descriptor.digest.as_str())
            .collect();
        assert_eq!(layers, ours, "{transport}");
        let config = run_ok(Command::new(&skopeo).args(["inspect", "--config", &transport]));
        let config: Value = serde_json::from_str(&config).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"].as_array().unwrap().len(),
            built.layers.len()
        );
        // The raw document skopeo resolves to is our index, annotations intact.
        let raw = run_ok(Command::new(&skopeo).args(["inspect", "--raw", &transport]));
        let raw: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(ann(&raw, keys::CRIU_CONTAINER_NAME), Some(CONTAINER_NAME));
        assert_eq!(ann(&raw, keys::CRIO_CHECKPOINT_NAME), Some(CONTAINER_NAME));
    }

    // skopeo copy reads every blob (verifying digests) and writes its own layout; our extract
    // reads that back to the original archive tree.
    let copy = fx.work.path().join("skopeo-copy");
    run_ok(Command::new(&skopeo).args([
        "copy",
        "--quiet",
        &format!("oci-archive:{}", archive.display()),
        &format!("oci:{}:copied", copy.display()),
    ]));
    let dest = fx.work.path().join("from-skopeo");
    let out = image::extract(&copy, &dest).unwrap();
    assert_eq!(out.gpusnap_manifest, fx.manifest);
    assert_same_tree_with_origin(&dest, &fx.archive_root);
    // skopeo gzips layers on the way into an oci: layout, so this also exercises extract's gzip
    // path: the compressed blobs differ, the diff_ids (uncompressed content) are ours.
    let info = image::inspect(&copy).unwrap();
    let diff_ids: Vec<String> = info.layers.iter().map(|l| l.diff_id.to_string()).collect();
    let ours: Vec<String> = built.layers.iter().map(|l| l.diff_id.to_string()).collect();
    assert_eq!(diff_ids, ours);
    assert!(info
        .layers
        .iter()
        .all(|l| l.descriptor.media_type == "application/vnd.oci.image.layer.v1.tar+gzip"));
    assert_eq!(info.checkpoint_name.as_deref(), Some(CONTAINER_NAME));
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &t);
        } else {
            fs::copy(e.path(), t).unwrap();
        }
    }
}

/// `got` holds what `want` holds, plus the origin record extract writes beside it.
fn assert_same_tree_with_origin(got: &Path, want: &Path) {
    let mut g = gpusnap_testkit::fixtures::tree(got);
    assert!(
        g.remove("gpusnap-origin.json").is_some(),
        "no origin record in {}",
        got.display()
    );
    assert_eq!(
        g,
        gpusnap_testkit::fixtures::tree(want),
        "{} vs {}",
        got.display(),
        want.display()
    );
}
