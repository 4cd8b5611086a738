//! `gpusnap image pull --extract` of chunked images, which assembles the chunked files while
//! the packs download (no chunk file on disk, each piece checked against the sealed manifest
//! as soon as it is complete), through a real `docker-registry` on loopback: a chunked image
//! extracts to the checkpoint it was built from, with and without the node store (a second
//! pull reading the packs from the store), and hostile packs and chunk lists — a chunk not in
//! the list, a chunk whose bytes are not its name, a chunk twice, a missing chunk, a file
//! listed twice, a list in the wrong order — are each refused with a message naming the
//! problem, nothing at the destination or beside it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpusnap_checkpoint::chunks::{ChunkDigest, ChunkList, CHUNK_DIR};
use gpusnap_oci_image::Digest;
use gpusnap_testkit::fixtures::{fixture, GPU_EXTENTS};
use gpusnap_testkit::{describe, Registry};
use serde_json::Value;

mod common;
use common::{gpusnap, pull_extract, s};

/// A chunked (default) layout of the fixture's checkpoint directory.
fn build(cp: &Path, layout: &Path) {
    let out = gpusnap(
        None,
        &[
            "image",
            "build",
            s(cp),
            "--tag",
            "localhost/ckpt/stream:v1",
            "--layout",
            s(layout),
            "--container-name",
            "stream",
        ],
    );
    assert!(out.status.success(), "build: {}", describe(&out));
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// Writes `bytes` as a blob; its descriptor digest and size.
fn put_blob(layout: &Path, bytes: &[u8]) -> (String, u64) {
    let d = Digest::of(bytes).to_string();
    fs::write(blob_path(layout, &d), bytes).unwrap();
    (d, bytes.len() as u64)
}

/// Replaces the layer with role `role` by `edit(its bytes)`, and every document above it
/// (config diff_ids, manifest, image index, index.json), so the image is consistent: only
/// what gpusnap checks beyond digests can refuse it.
fn rewrite_layer(layout: &Path, role: &str, edit: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let mut top = read_json(&layout.join("index.json"));
    let index_desc = &mut top["manifests"][0];
    let mut index = read_json(&blob_path(layout, index_desc["digest"].as_str().unwrap()));
    let manifest_desc = &mut index["manifests"][0];
    let mut manifest = read_json(&blob_path(
        layout,
        manifest_desc["digest"].as_str().unwrap(),
    ));
    let mut config = read_json(&blob_path(
        layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    let layers = manifest["layers"].as_array_mut().unwrap();
    let i = layers
        .iter()
        .position(|l| l["annotations"]["io.gpusnap.layer.role"] == role)
        .unwrap_or_else(|| panic!("no {role} layer"));
    let old = fs::read(blob_path(layout, layers[i]["digest"].as_str().unwrap())).unwrap();
    let (d, n) = put_blob(layout, &edit(old));
    layers[i]["digest"] = d.clone().into();
    layers[i]["size"] = n.into();
    // Uncompressed layers: the diff_id is the blob's digest.
    config["rootfs"]["diff_ids"][i] = d.into();
    let (d, n) = put_blob(layout, &serde_json::to_vec(&config).unwrap());
    manifest["config"]["digest"] = d.into();
    manifest["config"]["size"] = n.into();
    let (d, n) = put_blob(layout, &serde_json::to_vec(&manifest).unwrap());
    manifest_desc["digest"] = d.into();
    manifest_desc["size"] = n.into();
    let (d, n) = put_blob(layout, &serde_json::to_vec(&index).unwrap());
    index_desc["digest"] = d.into();
    index_desc["size"] = n.into();
    fs::write(layout.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
}

/// The entries of a layer tar, in order.
fn entries(tar_bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut a = tar::Archive::new(tar_bytes);
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            (name, data)
        })
        .collect()
}

/// A layer tar of regular files (as gpusnap writes pack entries).
fn tar_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(0);
        b.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap()
}

/// Edits the entries of the (first) chunk pack.
fn edit_pack(layout: &Path, edit: impl FnOnce(&mut Vec<(String, Vec<u8>)>)) {
    rewrite_layer(layout, "chunk-pack", |bytes| {
        let mut e = entries(&bytes);
        assert!(e.len() >= 2, "the pack holds {} chunks", e.len());
        edit(&mut e);
        tar_of(&e)
    });
}

/// Edits the chunk list.
fn edit_list(layout: &Path, edit: impl FnOnce(&mut ChunkList)) {
    rewrite_layer(layout, "chunk-list", |bytes| {
        let mut e = entries(&bytes);
        let mut list = ChunkList::parse(&e[0].1).unwrap();
        edit(&mut list);
        e[0].1 = list.to_bytes();
        tar_of(&e)
    });
}

fn push(reg: &Registry, layout: &Path, repo_tag: &str) -> String {
    let reference = reg.image(repo_tag);
    let out = gpusnap(
        None,
        &["image", "push", s(layout), &reference, "--plain-http"],
    );
    assert!(out.status.success(), "push: {}", describe(&out));
    reference
}

/// Asserts a refused pull: non-zero exit, `says` in its stderr, nothing at or beside `dest`.
fn assert_refused(what: &str, out: &Output, says: &str, dest: &Path) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: pulled: {}", describe(out));
    assert!(
        err.contains(says),
        "{what}: want {says:?}: {}",
        describe(out)
    );
    assert!(!dest.exists(), "{what}: left {}", dest.display());
    let left: Vec<_> = fs::read_dir(dest.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{what}: left beside it: {left:?}");
}

/// The chunked files (page image and GPU extents) came out byte for byte, and no chunk
/// directory or list is left.
fn assert_assembled(got: &Path, want: &Path) {
    for name in ["pages-1.img", GPU_EXTENTS[0], GPU_EXTENTS[1]] {
        assert_eq!(
            fs::read(got.join(name)).unwrap(),
            fs::read(want.join(name)).unwrap(),
            "{name}"
        );
    }
    assert!(!got.join(CHUNK_DIR).exists());
    assert!(!got.join("gpusnap-chunks.json").exists());
    gpusnap_checkpoint::validate_for_restore(got).unwrap();
}

#[test]
fn chunked_pulls_assemble_while_downloading_with_and_without_the_store() {
    let reg = Registry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let fx = fixture();
    let w = fx.work.path();
    let layout = w.join("layout");
    build(&fx.checkpoint_dir, &layout);
    let reference = push(&reg, &layout, "ckpt/stream:v1");

    let dest = w.join("plain/dest");
    let out = pull_extract(None, &reference, &dest, &[]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_assembled(&dest, &fx.checkpoint_dir);

    // Through the node store: the first pull downloads the packs into it, the second reads
    // them from it, on the same streaming path.
    let cfg = w.join("gpusnap.toml");
    fs::write(
        &cfg,
        format!("[store]\nroot = \"{}\"\n", w.join("store").display()),
    )
    .unwrap();
    for n in ["first", "second"] {
        let dest = w.join(n).join("dest");
        let out = pull_extract(Some(&cfg), &reference, &dest, &[]);
        assert!(out.status.success(), "{n}: {}", describe(&out));
        assert_assembled(&dest, &fx.checkpoint_dir);
    }
    let stored = fs::read_dir(w.join("store/blobs")).unwrap().count();
    assert!(stored >= 3, "{stored} blobs in the store");
}

#[test]
fn hostile_packs_and_chunk_lists_are_refused_with_nothing_left() {
    let reg = Registry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let fx = fixture();
    let w = fx.work.path();
    let pristine = w.join("pristine");
    build(&fx.checkpoint_dir, &pristine);
    let chunk_name = |d: &ChunkDigest| format!("checkpoint/{CHUNK_DIR}/{}", d.hex());

    type Tamper = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Tamper, &str)> = vec![
        (
            "a chunk the list does not name",
            Box::new(move |l: &Path| {
                edit_pack(l, |e| {
                    let stray = b"a chunk of some other checkpoint".to_vec();
                    e.insert(1, (chunk_name(&ChunkDigest::of(&stray)), stray));
                })
            }),
            "is not in the chunk list",
        ),
        (
            "a chunk whose bytes are not its name",
            Box::new(|l: &Path| edit_pack(l, |e| e[1].1[0] ^= 1)),
            "hashes to",
        ),
        (
            "a chunk twice",
            Box::new(|l: &Path| {
                edit_pack(l, |e| {
                    let again = e[0].clone();
                    e.push(again);
                })
            }),
            "arrived twice",
        ),
        (
            "a missing chunk",
            Box::new(|l: &Path| edit_pack(l, |e| drop(e.remove(1)))),
            "is missing",
        ),
        (
            "a file listed twice",
            Box::new(|l: &Path| {
                edit_list(l, |list| {
                    let f = list.files[0].clone();
                    list.files.push(f);
                })
            }),
            "listed twice",
        ),
        (
            "a list in the wrong order",
            Box::new(|l: &Path| {
                edit_list(l, |list| {
                    let f = list
                        .files
                        .iter_mut()
                        .find(|f| f.chunks.len() >= 2 && f.chunks[0] != f.chunks[1])
                        .expect("a file of two different chunks");
                    f.chunks.swap(0, 1);
                })
            }),
            "differs from the sealed gpusnap manifest",
        ),
    ];
    for (i, (what, tamper, says)) in cases.iter().enumerate() {
        let layout = w.join(format!("layout-{i}"));
        let copied = Command::new("cp")
            .args(["-a", s(&pristine), s(&layout)])
            .status()
            .unwrap();
        assert!(copied.success());
        tamper(&layout);
        let reference = push(&reg, &layout, &format!("ckpt/hostile-{i}:v1"));
        let dest = w.join(format!("case-{i}/dest"));
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let out = pull_extract(None, &reference, &dest, &[]);
        assert_refused(what, &out, says, &dest);
        fs::remove_dir_all(&layout).unwrap();
    }
}
