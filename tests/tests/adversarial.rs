//! The hostile-input corpus: checkpoints, node-local checkpoint trees, rootfs diffs and
//! checkpoint images crafted the way an attacker with write access to an image, an archive,
//! a registry or a node's checkpoint directory would, sent through every door that takes them.
//!
//! Each case of the tables below is a builder of one hostile input, the doors it is sent
//! through, the place in a sentinel host tree it aims at, and the words the refusal must
//! contain. The doors:
//! - `gpusnap-runc restore` (as CRI-O and Podman call it),
//! - a pod annotation `gpusnap.io/restore-from` through containerd's CRI (node-local checkpoints,
//!   the only path where gpusnap applies a rootfs diff itself),
//! - `ctr containers restore` of a real `ctr containers checkpoint` image whose CRIU tar is
//!   altered, through containerd's content store,
//! - CRI `CreateContainer` from a real CRI checkpoint archive whose `checkpoint/` is altered,
//! - `gpusnap image pull --extract` of a hand-made image from a registry.
//!
//! Every case asserts: the input is refused with a message that names the problem; nothing of
//! it runs (runc never created the container); and the sentinel — a per-test host tree outside
//! every destination, holding files an escape would reach — is unchanged (content, mode, owner,
//! size, inode, mtime, ctime, no entry created or removed), with the exact path the case aims at
//! checked on its own as well. Escapes aim at the sentinel wherever the destination lies: by
//! its absolute path, or by climbing to `/` first (`Sentinel::climb_to`).
//!
//! The checkpoints are sealed by gpusnap's own code and then altered. Cases made from real
//! checkpoints with a changed restore spec (privilege, signature) and a hard-linked image are
//! in their own section at the end.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use anyhow::{ensure, Context, Result};
use gpusnap_checkpoint::{
    origin::{FileDigest, Origin, SignatureCheck, ORIGIN_FORMAT},
    seal_checkpoint, Manifest, ProcessRecord,
};
use gpusnap_criu_bridge::CriuFlags;
use gpusnap_testkit::can_fail::Sentinel;
use gpusnap_testkit::refused_restore::gpusnap_runc_refuses;
use gpusnap_testkit::{
    bundle::BusyboxContainer, cri::ContainerSpec, rig::BUSYBOX_IMAGE, CriNode, CriNodeOptions,
};
use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};

// ----- the doors and the cases ------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Door {
    /// `gpusnap-runc restore --image-path DIR`.
    Runc,
    /// `gpusnap.io/restore-from: NAME` through containerd's CRI.
    RestoreFrom,
    /// `ctr containers restore` of an altered `ctr containers checkpoint` image.
    Ctr,
    /// CRI `CreateContainer` + `StartContainer` from an altered CRI checkpoint archive.
    Cri,
    /// `gpusnap image pull --extract`.
    Pull,
}

use Door::{Cri, Ctr, Pull, RestoreFrom, Runc};

/// Every door that takes a checkpoint directory.
const CHECKPOINT_DOORS: &[Door] = &[Runc, RestoreFrom, Ctr, Cri];
/// The doors where the directory reaches gpusnap as files of their own (containerd unpacks a
/// CRI archive itself first and keeps regular files only: symlink cases do not apply there).
const FILE_DOORS: &[Door] = &[Runc, RestoreFrom, Ctr];
/// The doors where gpusnap receives a chunked checkpoint directory as it is (CRI's archive
/// import makes no subdirectories; chunked images reach CRI through image restore instead).
const CHUNK_DOORS: &[Door] = &[Runc, RestoreFrom];

/// An image's layers: tar bytes, gzip-compressed when true.
type Layers = Vec<(Vec<u8>, bool)>;

/// One hostile input.
enum Hostile {
    /// A sealed checkpoint directory, altered.
    Dir(fn(&Path, &Sentinel)),
    /// A node-local checkpoint (`NAME/checkpoint/`, `NAME/gpusnap-origin.json`), altered.
    Node(fn(&Path, &Sentinel)),
    /// A node-local checkpoint with this rootfs diff, listed in its origin record.
    Diff(fn(&Sentinel) -> Vec<u8>),
    /// An entry of the checkpoint root made by the builder (given the root); the annotation
    /// value it returns names it.
    Name(fn(&Path, &Sentinel) -> String),
    /// A checkpoint image: its layers (tar, gzip-compressed when true) and how many bytes of
    /// padding its image config carries.
    Image(fn(&Sentinel) -> (Layers, usize)),
}

struct Case {
    name: &'static str,
    hostile: Hostile,
    doors: &'static [Door],
    /// The path in the sentinel the case aims at (or, for damage that aims nowhere, a file it
    /// must leave alone).
    target: &'static str,
    /// Words the refusal must contain.
    says: &'static str,
}

fn case(
    name: &'static str,
    hostile: Hostile,
    doors: &'static [Door],
    target: &'static str,
    says: &'static str,
) -> Case {
    Case {
        name,
        hostile,
        doors,
        target,
        says,
    }
}

fn cases_for(door: Door) -> Vec<Case> {
    corpus()
        .into_iter()
        .filter(|c| c.doors.contains(&door))
        .collect()
}

// ----- builders ---------------------------------------------------------------------------

/// A sealed CPU-only checkpoint directory (what a good gpusnap checkpoint looks like to the
/// restore's checks).
fn sealed_checkpoint(dir: &Path) -> Manifest {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("pages-1.img"), vec![7u8; 64 << 10]).unwrap();
    // Images the privilege check accepts, so that each case reaches the check it is about.
    gpusnap_testkit::privilege::minimal_images(dir).unwrap();
    let mut m = Manifest::new("victim", CriuFlags::default());
    m.processes.push(ProcessRecord {
        container_pid: Some(1),
        command: Some(vec!["sh".into()]),
    });
    seal_checkpoint(dir, m).unwrap()
}

/// Turns the sealed checkpoint's `pages-1.img` into chunks (the layout a chunked image puts in
/// the directory a runtime hands gpusnap), with `edit` applied to the chunk list.
fn chunkify(dir: &Path, edit: impl FnOnce(&Path, &mut gpusnap_checkpoint::chunks::ChunkList)) {
    use gpusnap_checkpoint::chunks::*;
    let bytes = fs::read(dir.join("pages-1.img")).unwrap();
    fs::create_dir_all(dir.join(CHUNK_DIR)).unwrap();
    let mut chunks = Vec::new();
    let p = ChunkParams {
        min: 4096,
        avg: 8192,
        max: 16384,
    };
    split(&mut bytes.as_slice(), p, &mut |c| {
        let d = ChunkDigest::of(c);
        fs::write(dir.join(CHUNK_DIR).join(d.hex()), c)?;
        chunks.push(ChunkRef(d, c.len() as u64));
        Ok(())
    })
    .unwrap();
    fs::remove_file(dir.join("pages-1.img")).unwrap();
    let mut list = ChunkList::new(vec![ChunkedFile {
        path: "pages-1.img".into(),
        size: bytes.len() as u64,
        mtime: Some(1_772_359_200),
        chunks,
    }]);
    edit(dir, &mut list);
    fs::write(dir.join(CHUNK_LIST_FILE), list.to_bytes()).unwrap();
}

fn manifest_path(dir: &Path) -> PathBuf {
    dir.join("gpusnap-manifest.json")
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = manifest_path(dir);
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    let link = link.as_ref();
    let _ = fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).unwrap();
}

fn oversized_json(len: usize) -> Vec<u8> {
    let mut v = b"{\"kind\": \"gpusnap-checkpoint\"".to_vec();
    v.resize(len - 1, b' ');
    v.push(b'}');
    v
}

/// A tar of raw entries (name, kind, data, link target), names and link targets written
/// byte for byte (GNU long-name records for long ones), so hostile names can be built.
fn raw_tar(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    fn long(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, value: &str) {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(kind);
        h.set_size(value.len() as u64 + 1);
        h.set_mode(0o644);
        h.set_cksum();
        let mut data = value.as_bytes().to_vec();
        data.push(0);
        b.append(&h, &data[..]).unwrap();
    }
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data, link) in entries {
        if name.len() > 100 {
            long(&mut b, tar::EntryType::GNULongName, name);
        }
        if let Some(l) = link.filter(|l| l.len() > 100) {
            long(&mut b, tar::EntryType::GNULongLink, l);
        }
        let mut h = tar::Header::new_gnu();
        let n = name.len().min(100);
        h.as_old_mut().name[..n].copy_from_slice(&name.as_bytes()[..n]);
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(if *kind == Directory { 0o755 } else { 0o644 });
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_000_000_000);
        if let Some(l) = link {
            let n = l.len().min(100);
            h.as_old_mut().linkname[..n].copy_from_slice(&l.as_bytes()[..n]);
        }
        if matches!(*kind, Char | Block) {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn abs(s: &Sentinel, rel: &str) -> String {
    s.target(rel).display().to_string()
}

/// A layer of a CRI-archive-shaped checkpoint image holding `entries` after a harmless start.
fn layer(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut all: Vec<(&str, tar::EntryType, &[u8], Option<&str>)> = vec![
        ("checkpoint", Directory, b"", None),
        ("checkpoint/inventory.img", Regular, b"inventory", None),
    ];
    all.extend_from_slice(entries);
    raw_tar(&all)
}

// ----- the corpus -------------------------------------------------------------------------

fn corpus() -> Vec<Case> {
    use Hostile::{Diff, Dir, Image, Name, Node};
    vec![
        // --- a chunked checkpoint directory ---
        case(
            "chunk-file-symlinked-to-the-sentinel",
            Dir(|d, s| {
                let target = abs(s, "etc/shadow");
                chunkify(d, |d, l| {
                    let hex = l.files[0].chunks[0].0.hex();
                    symlink(&target, d.join(".gpusnap-chunks").join(hex));
                })
            }),
            CHUNK_DOORS,
            "etc/shadow",
            "a symlink",
        ),
        case(
            "chunk-list-names-a-path-climbing-to-the-sentinel",
            Dir(|d, s| {
                let climb = s.climb_to("etc/passwd");
                chunkify(d, |_, l| l.files[0].path = climb)
            }),
            CHUNK_DOORS,
            "etc/passwd",
            "not a CRIU page image",
        ),
        case(
            "chunk-missing",
            Dir(|d, _| {
                chunkify(d, |d, l| {
                    let hex = l.files[0].chunks[0].0.hex();
                    fs::remove_file(d.join(".gpusnap-chunks").join(hex)).unwrap();
                })
            }),
            CHUNK_DOORS,
            "secret",
            "is missing from",
        ),
        // --- the checkpoint directory: manifest ---
        case(
            "manifest-missing",
            Dir(|d, _| fs::remove_file(manifest_path(d)).unwrap()),
            CHECKPOINT_DOORS,
            "secret",
            "gpusnap-manifest.json is missing",
        ),
        case(
            "manifest-oversized",
            Dir(|d, _| {
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .open(manifest_path(d))
                    .unwrap();
                f.write_all(&vec![b' '; 17 << 20]).unwrap();
            }),
            CHECKPOINT_DOORS,
            "secret",
            "larger than",
        ),
        case(
            "manifest-not-json",
            Dir(|d, _| fs::write(manifest_path(d), b"{\"kind\": ").unwrap()),
            CHECKPOINT_DOORS,
            "secret",
            "invalid JSON",
        ),
        case(
            "manifest-foreign-kind",
            Dir(|d, _| edit_manifest(d, |v| v["kind"] = "someone-else".into())),
            CHECKPOINT_DOORS,
            "secret",
            "not made by gpusnap",
        ),
        case(
            "manifest-future-format",
            Dir(|d, _| edit_manifest(d, |v| v["format_version"] = 99.into())),
            CHECKPOINT_DOORS,
            "secret",
            "format_version 99",
        ),
        case(
            "manifest-lists-a-path-climbing-to-the-sentinel",
            Dir(|d, s| {
                let climb = s.climb_to("etc/passwd");
                edit_manifest(d, |v| v["images"]["files"][0]["path"] = climb.into())
            }),
            CHECKPOINT_DOORS,
            "etc/passwd",
            "not a plain file name",
        ),
        case(
            "manifest-lists-the-sentinel-by-absolute-path",
            Dir(|d, s| {
                let p = abs(s, "etc/shadow");
                edit_manifest(d, |v| v["images"]["files"][0]["path"] = p.into())
            }),
            CHECKPOINT_DOORS,
            "etc/shadow",
            "not a plain file name",
        ),
        case(
            "manifest-is-a-symlink-into-the-sentinel",
            Dir(|d, s| symlink(s.target("etc/conf.d/keep"), manifest_path(d))),
            FILE_DOORS,
            "etc/conf.d/keep",
            "symlink",
        ),
        case(
            "manifest-is-a-chain-of-symlinks-into-the-sentinel",
            Dir(|d, s| {
                symlink(s.target("etc/conf.d/keep"), d.join("m2"));
                symlink("m2", d.join("m1"));
                symlink("m1", manifest_path(d));
            }),
            FILE_DOORS,
            "etc/conf.d/keep",
            "symlink",
        ),
        case(
            "manifest-only-as-a-planted-temp-file",
            Dir(|d, _| {
                fs::rename(manifest_path(d), d.join(".gpusnap-manifest.json.tmp.1")).unwrap()
            }),
            CHECKPOINT_DOORS,
            "secret",
            "gpusnap-manifest.json is missing",
        ),
        case(
            "manifest-temp-file-planted-as-a-symlink-into-the-sentinel",
            Dir(|d, s| {
                fs::remove_file(manifest_path(d)).unwrap();
                symlink(s.target("secret"), d.join(".gpusnap-manifest.json.tmp.1"));
            }),
            FILE_DOORS,
            "secret",
            "gpusnap-manifest.json is missing",
        ),
        case(
            "unlisted-gpusnap-manifest-tmp-planted",
            Dir(|d, _| fs::write(d.join("gpusnap-manifest.json.tmp"), b"{}").unwrap()),
            CHECKPOINT_DOORS,
            "secret",
            "gpusnap-manifest.json.tmp",
        ),
        // --- the checkpoint directory: image files ---
        case(
            "image-is-a-symlink-into-the-sentinel",
            Dir(|d, s| symlink(s.target("secret"), d.join("core-1.img"))),
            FILE_DOORS,
            "secret",
            "is a symlink",
        ),
        case(
            "image-is-a-chain-of-symlinks-into-the-sentinel",
            Dir(|d, s| {
                symlink(s.target("secret"), d.join("core-1.b"));
                symlink("core-1.b", d.join("core-1.a"));
                symlink("core-1.a", d.join("core-1.img"));
            }),
            FILE_DOORS,
            "secret",
            "is a symlink",
        ),
        case(
            "image-is-a-symlink-loop",
            Dir(|d, _| {
                symlink("loop-b", d.join("loop-a"));
                symlink("loop-a", d.join("loop-b"));
                symlink("loop-a", d.join("core-1.img"));
            }),
            FILE_DOORS,
            "secret",
            "is a symlink",
        ),
        case(
            "image-unlisted",
            Dir(|d, _| fs::write(d.join("pages-2.img"), b"smuggled").unwrap()),
            CHECKPOINT_DOORS,
            "secret",
            "not listed in the manifest",
        ),
        case(
            "image-corrupted",
            Dir(|d, _| gpusnap_testkit::fixtures::flip_byte(&d.join("pages-1.img"))),
            CHECKPOINT_DOORS,
            "secret",
            "is corrupted",
        ),
        case(
            "image-truncated",
            Dir(|d, _| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("pages-1.img"))
                    .unwrap()
                    .set_len(100)
                    .unwrap()
            }),
            CHECKPOINT_DOORS,
            "secret",
            "truncated",
        ),
        case(
            "other-architecture",
            Dir(|d, _| edit_manifest(d, |v| v["host"]["arch"] = "aarch64".into())),
            CHECKPOINT_DOORS,
            "secret",
            "aarch64",
        ),
        case(
            "unknown-storage-engine",
            Dir(|d, _| {
                edit_manifest(
                    d,
                    |v| v["gpu"] = serde_json::json!({"engine": "pagebroker", "processes": [{"host_pid": 1, "devices": []}]}),
                )
            }),
            CHECKPOINT_DOORS,
            "secret",
            "pagebroker",
        ),
        case(
            "gpu-record-damaged",
            Dir(|d, _| {
                edit_manifest(
                    d,
                    |v| v["gpu"] = serde_json::json!({"engine": "driver-managed", "processes": [{"host_pid": 7, "devices": []}]}),
                )
            }),
            CHECKPOINT_DOORS,
            "secret",
            "the manifest is damaged",
        ),
        // --- node-local checkpoints: the origin record and the name ---
        case(
            "rootfs-diff-changed-after-pull",
            Node(|d, _| {
                let changed = raw_tar(&[("tmp/note", Regular, b"changed", None)]);
                fs::write(d.join("rootfs-diff.tar"), changed).unwrap();
            }),
            &[RestoreFrom],
            "secret",
            "was changed since",
        ),
        case(
            "rootfs-diff-not-in-origin",
            Node(|d, _| {
                let origin = d.join("gpusnap-origin.json");
                let mut v: serde_json::Value =
                    serde_json::from_slice(&fs::read(&origin).unwrap()).unwrap();
                v.as_object_mut().unwrap().remove("rootfs_diff");
                fs::write(&origin, serde_json::to_vec(&v).unwrap()).unwrap();
            }),
            &[RestoreFrom],
            "secret",
            "does not list it",
        ),
        case(
            "no-origin",
            Node(|d, _| fs::remove_file(d.join("gpusnap-origin.json")).unwrap()),
            &[RestoreFrom],
            "secret",
            "gpusnap-origin.json is missing",
        ),
        case(
            "origin-oversized",
            Node(|d, _| fs::write(d.join("gpusnap-origin.json"), oversized_json(1 << 20)).unwrap()),
            &[RestoreFrom],
            "secret",
            "not a valid origin record",
        ),
        case(
            "origin-only-as-a-planted-temp-file",
            Node(|d, _| {
                fs::rename(
                    d.join("gpusnap-origin.json"),
                    d.join(".gpusnap-origin.json.tmp"),
                )
                .unwrap()
            }),
            &[RestoreFrom],
            "secret",
            "gpusnap-origin.json is missing",
        ),
        case(
            "origin-temp-file-planted-as-a-symlink-into-the-sentinel",
            Node(|d, s| {
                fs::remove_file(d.join("gpusnap-origin.json")).unwrap();
                symlink(s.target("secret"), d.join(".gpusnap-origin.json.tmp"));
            }),
            &[RestoreFrom],
            "secret",
            "gpusnap-origin.json is missing",
        ),
        case(
            "origin-is-a-symlink-into-the-sentinel",
            Node(|d, s| symlink(s.target("secret"), d.join("gpusnap-origin.json"))),
            &[RestoreFrom],
            "secret",
            "gpusnap-origin.json",
        ),
        case(
            "checkpoint-dir-is-a-symlink-into-the-sentinel",
            Node(|d, s| {
                fs::rename(d.join("checkpoint"), d.join("real")).unwrap();
                symlink(s.path(), d.join("checkpoint"));
            }),
            &[RestoreFrom],
            "secret",
            "checkpoint",
        ),
        case(
            "name-is-a-symlink-to-the-sentinel",
            Name(|root, s| {
                symlink(s.path(), root.join("name-is-a-symlink"));
                "name-is-a-symlink".into()
            }),
            &[RestoreFrom],
            "secret",
            "not a symlink",
        ),
        case(
            "name-is-a-chain-of-symlinks-to-the-sentinel",
            Name(|root, s| {
                symlink(s.path(), root.join("chain-2"));
                symlink("chain-2", root.join("chain-1"));
                "chain-1".into()
            }),
            &[RestoreFrom],
            "secret",
            "not a symlink",
        ),
        case(
            "name-climbs-out-of-the-root",
            Name(|_, s| s.climb_to("")),
            &[RestoreFrom],
            "secret",
            "letters, digits",
        ),
        // --- rootfs diffs (applied by gpusnap only on the annotation path) ---
        case(
            "diff-symlink-then-write-through",
            Diff(|s| {
                let host = abs(s, "");
                raw_tar(&[
                    ("escape", Symlink, b"", Some(&host)),
                    ("escape/secret", Regular, b"pwned", None),
                ])
            }),
            &[RestoreFrom],
            "secret",
            "not a directory",
        ),
        case(
            "diff-chain-of-symlinks-then-write-through",
            Diff(|s| {
                let host = abs(s, "etc");
                raw_tar(&[
                    ("c", Symlink, b"", Some(&host)),
                    ("b", Symlink, b"", Some("c")),
                    ("a", Symlink, b"", Some("b")),
                    ("a/passwd", Regular, b"pwned", None),
                ])
            }),
            &[RestoreFrom],
            "etc/passwd",
            "not a directory",
        ),
        case(
            "diff-symlink-loop-then-write-through",
            Diff(|_| {
                raw_tar(&[
                    ("l1", Symlink, b"", Some("l2")),
                    ("l2", Symlink, b"", Some("l1")),
                    ("l1/x", Regular, b"pwned", None),
                ])
            }),
            &[RestoreFrom],
            "secret",
            "not a directory",
        ),
        case(
            "diff-symlink-then-whiteout-through",
            Diff(|s| {
                let host = abs(s, "");
                raw_tar(&[
                    ("escape", Symlink, b"", Some(&host)),
                    ("escape/.wh.secret", Regular, b"", None),
                ])
            }),
            &[RestoreFrom],
            "secret",
            "not a directory",
        ),
        case(
            "diff-symlink-then-opaque-through",
            Diff(|s| {
                let host = abs(s, "");
                raw_tar(&[
                    ("escape", Symlink, b"", Some(&host)),
                    ("escape/etc/.wh..wh..opq", Regular, b"", None),
                ])
            }),
            &[RestoreFrom],
            "etc/passwd",
            "not a directory",
        ),
        case(
            "diff-relative-symlink-up-then-write",
            Diff(|s| {
                let up = "../".repeat(32);
                let through = format!("up/{}", s.climb_to("tmp/pwned").trim_start_matches(&*up));
                raw_tar(&[
                    ("up", Symlink, b"", Some(up.trim_end_matches('/'))),
                    (&through, Regular, b"pwned", None),
                ])
            }),
            &[RestoreFrom],
            "tmp/pwned",
            "not a directory",
        ),
        case(
            "diff-through-an-image-symlink",
            // busybox's /bin/sh is a link in the image's own rootfs.
            Diff(|_| raw_tar(&[("bin/sh/x", Regular, b"pwned", None)])),
            &[RestoreFrom],
            "secret",
            "not a directory",
        ),
        case(
            "diff-whiteout-dotdot",
            Diff(|_| raw_tar(&[("etc/.wh...", Regular, b"", None)])),
            &[RestoreFrom],
            "secret",
            "a whiteout must name one entry",
        ),
        case(
            "diff-whiteout-dot",
            Diff(|_| raw_tar(&[("etc/.wh..", Regular, b"", None)])),
            &[RestoreFrom],
            "secret",
            "a whiteout must name one entry",
        ),
        case(
            "diff-whiteout-empty",
            Diff(|_| raw_tar(&[("etc/.wh.", Regular, b"", None)])),
            &[RestoreFrom],
            "secret",
            "a whiteout must name one entry",
        ),
        case(
            "diff-parent-path-to-the-sentinel",
            Diff(|s| raw_tar(&[(&s.climb_to("tmp/pwned"), Regular, b"pwned", None)])),
            &[RestoreFrom],
            "tmp/pwned",
            "`..`",
        ),
        case(
            "diff-absolute-path-to-the-sentinel",
            Diff(|s| raw_tar(&[(&abs(s, "tmp/pwned"), Regular, b"pwned", None)])),
            &[RestoreFrom],
            "tmp/pwned",
            "is absolute",
        ),
        case(
            "diff-hard-link-out-to-the-sentinel",
            Diff(|s| raw_tar(&[("link", Link, b"", Some(&s.climb_to("etc/shadow")))])),
            &[RestoreFrom],
            "etc/shadow",
            "hard link target",
        ),
        case(
            "diff-hard-link-to-the-sentinel-by-absolute-path",
            Diff(|s| raw_tar(&[("link", Link, b"", Some(&abs(s, "etc/shadow")))])),
            &[RestoreFrom],
            "etc/shadow",
            "hard link target",
        ),
        case(
            "diff-character-device",
            Diff(|_| {
                raw_tar(&[
                    ("dev/", Directory, b"", None),
                    ("dev/kmem", Char, b"", None),
                ])
            }),
            &[RestoreFrom],
            "secret",
            "device nodes",
        ),
        case(
            "diff-block-device",
            Diff(|_| raw_tar(&[("sda", Block, b"", None)])),
            &[RestoreFrom],
            "secret",
            "device nodes",
        ),
        case(
            "diff-gzip-bomb",
            Diff(|_| gzip(&raw_tar(&[("big", Regular, &vec![0u8; 2 << 20], None)]))),
            &[RestoreFrom],
            "secret",
            "bytes of file content",
        ),
        // --- checkpoint images (gpusnap image pull --extract) ---
        case(
            "layer-absolute-symlink-to-the-sentinel",
            Image(|s| {
                let t = abs(s, "secret");
                (
                    vec![(layer(&[("checkpoint/evil", Symlink, b"", Some(&t))]), false)],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "absolute symlink",
        ),
        case(
            "layer-relative-symlink-climbing-to-the-sentinel",
            Image(|s| {
                let t = s.climb_to("secret");
                (
                    vec![(layer(&[("checkpoint/up", Symlink, b"", Some(&t))]), false)],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "leads outside",
        ),
        case(
            "layer-chain-of-symlinks-out-then-write",
            Image(|s| {
                let t = s.climb_to("tmp");
                (
                    vec![(
                        layer(&[
                            ("checkpoint/c", Symlink, b"", Some(&t)),
                            ("checkpoint/b", Symlink, b"", Some("c")),
                            ("checkpoint/a", Symlink, b"", Some("b")),
                            ("checkpoint/a/pwned", Regular, b"pwned", None),
                        ]),
                        false,
                    )],
                    0,
                )
            }),
            &[Pull],
            "tmp/pwned",
            "leads outside",
        ),
        case(
            "layer-symlink-loop-then-write",
            Image(|_| {
                (
                    vec![(
                        layer(&[
                            ("checkpoint/l1", Symlink, b"", Some("l2")),
                            ("checkpoint/l2", Symlink, b"", Some("l1")),
                            ("checkpoint/l1/x", Regular, b"pwned", None),
                        ]),
                        false,
                    )],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "passes through a symlink",
        ),
        case(
            "layer-dot-dot-entry-to-the-sentinel",
            Image(|s| {
                let n = s.climb_to("tmp/pwned");
                (vec![(layer(&[(&n, Regular, b"pwned", None)]), false)], 0)
            }),
            &[Pull],
            "tmp/pwned",
            "..",
        ),
        case(
            "layer-absolute-entry-in-the-sentinel",
            Image(|s| {
                let n = abs(s, "tmp/pwned");
                (vec![(layer(&[(&n, Regular, b"pwned", None)]), false)], 0)
            }),
            &[Pull],
            "tmp/pwned",
            "absolute",
        ),
        case(
            "layer-hard-link-to-the-sentinel",
            Image(|s| {
                let t = abs(s, "etc/shadow");
                (
                    vec![(layer(&[("checkpoint/hl", Link, b"", Some(&t))]), false)],
                    0,
                )
            }),
            &[Pull],
            "etc/shadow",
            "hard link",
        ),
        case(
            "layer-hard-link-climbing-to-the-sentinel",
            Image(|s| {
                let t = s.climb_to("etc/shadow");
                (
                    vec![(layer(&[("checkpoint/hl", Link, b"", Some(&t))]), false)],
                    0,
                )
            }),
            &[Pull],
            "etc/shadow",
            "hard link",
        ),
        case(
            "layer-origin-temp-file-planted-as-a-symlink",
            Image(|s| {
                let t = s.climb_to("secret");
                (
                    vec![(
                        layer(&[(".gpusnap-origin.json.tmp", Symlink, b"", Some(&t))]),
                        false,
                    )],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "a name only gpusnap writes",
        ),
        case(
            "layer-manifest-temp-file-planted-as-a-symlink",
            Image(|s| {
                let t = s.climb_to("secret");
                (
                    vec![(
                        layer(&[(
                            "checkpoint/.gpusnap-manifest.json.tmp.1",
                            Symlink,
                            b"",
                            Some(&t),
                        )]),
                        false,
                    )],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "a name only gpusnap writes",
        ),
        case(
            "layer-character-device",
            Image(|_| {
                (
                    vec![(layer(&[("checkpoint/null", Char, b"", None)]), false)],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "character device",
        ),
        case(
            "layer-fifo",
            Image(|_| {
                (
                    vec![(layer(&[("checkpoint/fifo", Fifo, b"", None)]), false)],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "FIFO",
        ),
        case(
            "layer-gzip-bomb",
            // 64 MiB of zeros: a gzip layer of about 64 KiB, over the pull's 8 MiB cap.
            Image(|_| {
                let big = vec![0u8; 64 << 20];
                (
                    vec![(
                        layer(&[("checkpoint/pages-1.img", Regular, &big, None)]),
                        true,
                    )],
                    0,
                )
            }),
            &[Pull],
            "secret",
            "--max-blob-bytes",
        ),
        case(
            "image-config-oversized-json",
            Image(|_| (vec![(layer(&[]), false)], 256 << 10)),
            &[Pull],
            "secret",
            "--max-manifest-bytes",
        ),
    ]
}

// ----- checks -----------------------------------------------------------------------------

/// The sentinel's state, and the check that a door left it (and each case's target) alone.
struct Watch<'a> {
    sentinel: &'a Sentinel,
    before: BTreeMap<String, String>,
}

impl<'a> Watch<'a> {
    fn new(sentinel: &'a Sentinel) -> Self {
        Watch {
            sentinel,
            before: sentinel.snapshot(),
        }
    }

    /// The case's target is as it was (absent if it was), and so is the whole tree.
    fn check(&self, cases: &[&Case]) -> Result<()> {
        let after = self.sentinel.snapshot();
        let mut problems = Vec::new();
        for c in cases {
            let key = self.sentinel.target(c.target).display().to_string();
            if self.before.get(&key) != after.get(&key) {
                problems.push(format!(
                    "{}: its target {key} changed: {:?} -> {:?}",
                    c.name,
                    self.before.get(&key),
                    after.get(&key)
                ));
            }
        }
        let diff = Sentinel::diff(&self.before, &after);
        ensure!(
            problems.is_empty() && diff.is_empty(),
            "the sentinel host tree changed:\n{}\n{diff}",
            problems.join("\n")
        );
        Ok(())
    }
}

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn report(door: Door, n: usize, failures: Vec<String>) -> Result<()> {
    ensure!(n > 0, "{door:?}: no case");
    ensure!(
        failures.is_empty(),
        "{door:?}: {} of {n} cases not refused as they must be:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

// ----- door: gpusnap-runc -----------------------------------------------------------------

/// gpusnap-runc, as CRI-O and Podman call it: every case is refused before runc runs.
#[test]
fn corpus_through_gpusnap_runc() -> Result<()> {
    gpusnap_testkit::require_root();
    let cases = cases_for(Runc);
    let sentinel = Sentinel::new()?;
    let watch = Watch::new(&sentinel);
    let work = tempfile::tempdir()?;
    let mut failures = Vec::new();
    for c in &cases {
        let Hostile::Dir(apply) = c.hostile else {
            unreachable!("{}: not a checkpoint directory", c.name)
        };
        let id = format!("adv-runc-{}", c.name);
        let ck = work.path().join(&id);
        sealed_checkpoint(&ck);
        apply(&ck, &sentinel);
        let ctr = BusyboxContainer::create(work.path(), &id, "sleep 100");
        if let Err(e) = gpusnap_runc_refuses(&ctr, &ck, c.says, work.path()) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    watch.check(&cases.iter().collect::<Vec<_>>())?;
    report(Runc, cases.len(), failures)
}

// ----- door: gpusnap.io/restore-from ------------------------------------------------------

/// A node whose pods restore node-local checkpoints by annotation, with the busybox image
/// present locally.
fn restore_from_node() -> Result<CriNode> {
    // The node's config starts with its own [restore] table; this line joins it.
    let node = CriNode::start(CriNodeOptions {
        gpusnap_config: "max_rootfs_diff_bytes = \"1MiB\"\n".into(),
        ..Default::default()
    })?;
    node.import_image(&gpusnap_testkit::paths::busybox_archive(), BUSYBOX_IMAGE)?;
    Ok(node)
}

/// Puts a checkpoint under the node's checkpoint root as `gpusnap image pull --extract` would:
/// `NAME/checkpoint/`, `NAME/rootfs-diff.tar` (when given) and the origin record listing it.
fn place(node: &CriNode, name: &str, diff: Option<&[u8]>) -> PathBuf {
    let dir = node.checkpoint_root().join(name);
    sealed_checkpoint(&dir.join("checkpoint"));
    let rootfs_diff = diff.map(|bytes| {
        fs::write(dir.join("rootfs-diff.tar"), bytes).unwrap();
        FileDigest {
            size: bytes.len() as u64,
            sha256: gpusnap_testkit::fixtures::sha256_bytes(bytes)
                .trim_start_matches("sha256:")
                .to_string(),
            content_bytes: None,
        }
    });
    Origin {
        format: ORIGIN_FORMAT,
        source: "test".into(),
        manifest_digest: "sha256:00".into(),
        pinned: true,
        signature: SignatureCheck::NotChecked,
        rootfs_diff,
    }
    .write(&dir)
    .unwrap();
    dir
}

/// One pod whose containers each restore one of `names` (per-container annotations
/// `gpusnap.io/restore-from.<container>`); returns, per name, the error CRI reported for its
/// create or start, after checking that runc never created the container.
fn refused_restores_from(node: &CriNode, names: &[String]) -> Result<Vec<String>> {
    let container = |i: usize| format!("c{i}");
    let keys: Vec<String> = (0..names.len())
        .map(|i| format!("gpusnap.io/restore-from.{}", container(i)))
        .collect();
    let annotations: Vec<(&str, &str)> = keys
        .iter()
        .map(String::as_str)
        .zip(names.iter().map(String::as_str))
        .collect();
    let pod = node.run_pod(
        &format!("adv-{}", std::process::id()),
        &annotations,
        gpusnap_testkit::cri::gpusnap_handler(),
    )?;
    let mut errors = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let spec = ContainerSpec {
            name: container(i),
            image: BUSYBOX_IMAGE.into(),
            command: vec!["sleep".into(), "100".into()],
            env: vec![],
        };
        errors.push(refused_create_and_start(node, &pod, &spec, name)?);
    }
    node.remove_pod(&pod.id)?;
    Ok(errors)
}

/// CreateContainer then StartContainer, one of which must fail before runc created anything;
/// the CRI error.
fn refused_create_and_start(
    node: &CriNode,
    pod: &gpusnap_testkit::cri::Pod,
    spec: &ContainerSpec,
    what: &str,
) -> Result<String> {
    Ok(match node.create_container(pod, spec) {
        Err(e) => e.to_string(),
        Ok(id) => {
            let started = node.cri.start_container(&id);
            ensure!(started.is_err(), "{what}: the restore started");
            ensure!(
                node.runc_state(&id).is_none(),
                "{what}: runc created the container"
            );
            started.unwrap_err().to_string()
        }
    })
}

/// Checkpoint directories, node-local trees, names and rootfs diffs through a pod annotation
/// (containerd's CRI → the shim).
#[test]
fn corpus_through_restore_from() -> Result<()> {
    let _serial = serial();
    let cases = cases_for(RestoreFrom);
    let sentinel = Sentinel::new()?;
    let watch = Watch::new(&sentinel);
    let node = restore_from_node()?;
    let good_diff = raw_tar(&[("tmp/note", Regular, b"fine", None)]);
    let mut names = Vec::new();
    for c in &cases {
        let name = match c.hostile {
            Hostile::Dir(apply) => {
                let dir = place(&node, c.name, None);
                apply(&dir.join("checkpoint"), &sentinel);
                c.name.to_string()
            }
            Hostile::Node(apply) => {
                let dir = place(&node, c.name, Some(&good_diff));
                apply(&dir, &sentinel);
                c.name.to_string()
            }
            Hostile::Diff(build) => {
                place(&node, c.name, Some(&build(&sentinel)));
                c.name.to_string()
            }
            Hostile::Name(make) => make(&node.checkpoint_root(), &sentinel),
            Hostile::Image(_) => unreachable!("{}: an image", c.name),
        };
        names.push(name);
    }
    let errors = refused_restores_from(&node, &names)?;
    let failures: Vec<String> = cases
        .iter()
        .zip(&errors)
        .filter(|(c, err)| !err.contains(c.says))
        .map(|(c, err)| format!("{}: {err}", c.name))
        .collect();
    watch.check(&cases.iter().collect::<Vec<_>>())?;
    report(RestoreFrom, cases.len(), failures)
}

// ----- door: ctr --------------------------------------------------------------------------

/// Through containerd's content store: a real `ctr containers checkpoint` image whose CRIU tar
/// is altered, restored with `ctr containers restore`.
#[test]
fn corpus_through_ctr() -> Result<()> {
    use gpusnap_testkit::checkpoint::CkRig;
    use gpusnap_testkit::refused_restore::CriuTar;
    use gpusnap_testkit::Runtime;
    let cases = cases_for(Ctr);
    let sentinel = Sentinel::new()?;
    let watch = Watch::new(&sentinel);
    let rig = CkRig::start_for(Runtime::Gpusnap)?;
    rig.run_detached(Runtime::Gpusnap, "src", &["sleep", "1000"])?;
    let image = "ck/adv:1";
    gpusnap_testkit::checkpoint::container_checkpoint_ok(&rig, "src", image, false)?;
    let criu_tar = CriuTar::of(&rig, image)?;
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let Hostile::Dir(apply) = c.hostile else {
            unreachable!("{}: not a checkpoint directory", c.name)
        };
        let restore = criu_tar.restore_altered(&format!("adv{i}"), |d| {
            apply(d, &sentinel);
            Ok(())
        })?;
        if let Err(e) = restore.refused_saying(c.says) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    criu_tar.put_back()?;
    watch.check(&cases.iter().collect::<Vec<_>>())?;
    report(Ctr, cases.len(), failures)
}

// ----- door: CRI, from a checkpoint archive -----------------------------------------------

/// `dir` (a CRI checkpoint archive's tree) as a tar: directories, files and symlinks.
fn tar_tree(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}

/// Through containerd's CRI: a real CRI checkpoint archive (CheckpointContainer of a gpusnap
/// container) whose `checkpoint/` is altered, restored by CreateContainer + StartContainer.
#[test]
fn corpus_through_cri_archives() -> Result<()> {
    let _serial = serial();
    let cases = cases_for(Cri);
    let sentinel = Sentinel::new()?;
    let watch = Watch::new(&sentinel);
    // CRI restores an archive onto its base image, pulled by name: the image comes from a
    // registry.
    let reg = gpusnap_testkit::Registry::start()?;
    gpusnap_oci_image::push(
        &gpusnap_testkit::paths::busybox_archive(),
        &reg.url("gpusnap/busybox:test"),
        &gpusnap_oci_image::RegistryOptions::default(),
    )
    .context("pushing busybox to the test registry")?;
    let node = CriNode::start(CriNodeOptions {
        registry_host: Some(reg.host()),
        ..Default::default()
    })?;
    let image = reg.image("gpusnap/busybox:test");
    node.cri
        .pull_image(&image)
        .map_err(anyhow::Error::from)
        .context("CRI PullImage of busybox")?;
    let handler = gpusnap_testkit::cri::gpusnap_handler();
    let pod = node.run_pod("adv-cri-src", &[], handler)?;
    let spec = ContainerSpec {
        name: "src".into(),
        image,
        command: vec!["sleep".into(), "1000".into()],
        env: vec![],
    };
    let id = node.run_container(&pod, &spec)?;
    let pristine = node.scratch().join("pristine.tar");
    node.cri
        .checkpoint_container(&id, &pristine, 60)
        .map_err(anyhow::Error::from)
        .context("CRI CheckpointContainer")?;
    node.remove_pod(&pod.id)?;
    let pod = node.run_pod("adv-cri", &[], handler)?;
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let Hostile::Dir(apply) = c.hostile else {
            unreachable!("{}: not a checkpoint directory", c.name)
        };
        let tree = tempfile::tempdir()?;
        tar::Archive::new(fs::File::open(&pristine)?).unpack(tree.path())?;
        apply(&tree.path().join("checkpoint"), &sentinel);
        let archive = node.scratch().join(format!("adv-{i}.tar"));
        fs::write(&archive, tar_tree(tree.path()))?;
        let spec = ContainerSpec {
            name: format!("c{i}"),
            image: archive.display().to_string(),
            ..spec.clone()
        };
        match refused_create_and_start(&node, &pod, &spec, c.name) {
            Ok(err) if err.contains(c.says) => {}
            Ok(err) => failures.push(format!("{}: {err}", c.name)),
            Err(e) => failures.push(format!("{}: {e:#}", c.name)),
        }
    }
    node.remove_pod(&pod.id)?;
    watch.check(&cases.iter().collect::<Vec<_>>())?;
    report(Cri, cases.len(), failures)
}

// ----- door: gpusnap image pull --extract -------------------------------------------------

/// An OCI layout at `layout` with these layers and an image config padded by `pad` bytes.
fn image_layout(layout: &Path, layers: &[(Vec<u8>, bool)], pad: usize) -> Result<()> {
    use gpusnap_oci_image::Digest;
    fs::create_dir_all(layout.join("blobs/sha256"))?;
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let put = |bytes: &[u8]| -> Result<(String, usize)> {
        let d = Digest::of(bytes);
        fs::write(layout.join("blobs/sha256").join(d.hex()), bytes)?;
        Ok((d.to_string(), bytes.len()))
    };
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for (tar, gz) in layers {
        diff_ids.push(Digest::of(tar).to_string());
        let (blob, mt) = if *gz {
            (gzip(tar), "application/vnd.oci.image.layer.v1.tar+gzip")
        } else {
            (tar.clone(), "application/vnd.oci.image.layer.v1.tar")
        };
        let (d, size) = put(&blob)?;
        descs.push(serde_json::json!({"mediaType": mt, "digest": d, "size": size}));
    }
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "comment": " ".repeat(pad),
    }))?;
    let (cd, cs) = put(&config)?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
        "layers": descs,
    }))?;
    let (md, ms) = put(&manifest)?;
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms}],
        }))?,
    )?;
    Ok(())
}

/// Hand-made checkpoint images pushed to a registry and pulled with `gpusnap image pull
/// --extract` (8 MiB blob cap, 64 KiB manifest cap): refused, nothing at the destination or
/// beside it.
#[test]
fn corpus_through_pull_extract() -> Result<()> {
    let cases = cases_for(Pull);
    let sentinel = Sentinel::new()?;
    let watch = Watch::new(&sentinel);
    let reg = gpusnap_testkit::Registry::start()?;
    let work = tempfile::tempdir()?;
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let Hostile::Image(build) = c.hostile else {
            unreachable!("{}: not an image", c.name)
        };
        let (layers, pad) = build(&sentinel);
        let layout = work.path().join(format!("layout-{i}"));
        image_layout(&layout, &layers, pad)?;
        let reference = reg.url(&format!("hostile/{}:1", c.name));
        gpusnap_oci_image::push(
            &layout,
            &reference,
            &gpusnap_oci_image::RegistryOptions::default(),
        )
        .with_context(|| format!("{}: pushing the hostile image", c.name))?;
        let out = work.path().join(format!("out-{i}"));
        fs::create_dir(&out)?;
        let dest = out.join("ck");
        let pulled = gpusnap_testkit::gpusnap([
            "image",
            "pull",
            &reference,
            "--extract",
            dest.to_str().unwrap(),
            "--max-blob-bytes",
            "8388608",
            "--max-manifest-bytes",
            "65536",
        ]);
        let err = String::from_utf8_lossy(&pulled.stderr).into_owned();
        let left: Vec<String> = fs::read_dir(&out)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if pulled.status.success() || !err.contains(c.says) || !left.is_empty() {
            failures.push(format!(
                "{}: success={}, left {left:?} beside the destination, stderr {err:?}",
                c.name,
                pulled.status.success()
            ));
        }
    }
    watch.check(&cases.iter().collect::<Vec<_>>())?;
    report(Pull, cases.len(), failures)
}

/// The corpus is as large as issue 20 asks (at least 40 case-door pairs) and every case names
/// a target inside the sentinel.
#[test]
fn corpus_covers_every_door() {
    let cases = corpus();
    let pairs: usize = cases.iter().map(|c| c.doors.len()).sum();
    assert!(pairs >= 40, "{pairs} case-door pairs");
    for door in [Runc, RestoreFrom, Ctr, Cri, Pull] {
        assert!(
            cases.iter().any(|c| c.doors.contains(&door)),
            "no case for {door:?}"
        );
    }
    for c in &cases {
        assert!(
            !c.target.is_empty() && !c.target.starts_with('/') && !c.target.contains(".."),
            "{}: target {:?} is not a path inside the sentinel",
            c.name,
            c.target
        );
        let file_only = matches!(c.hostile, Hostile::Dir(_));
        assert!(
            file_only || !c.doors.iter().any(|d| [Runc, Ctr, Cri].contains(d)),
            "{}: only checkpoint directories go through gpusnap-runc, ctr and CRI archives",
            c.name
        );
    }
}

// ===== real checkpoints restored into another spec, under another policy, or linked =======
//
// - privilege: a checkpoint whose tasks had more privilege (capabilities, uid 0) than the
//   restore target's OCI spec grants is refused before CRIU;
// - signature: under `restore.signature_policy = "require"`, an unsigned checkpoint directory
//   is refused by gpusnap-runc too, not only by the pod annotation;
// - untrusted tree: an image file hard-linked to a host file (sealed with the link in place, so
//   every digest matches) is refused, never read.

/// A checkpoint of a busybox container run by gpusnap-runc with `edit` applied to its spec
/// (the privileges it runs with), sealed by gpusnap; returns the image directory.
fn checkpoint_with_spec(
    dir: &Path,
    id: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<PathBuf> {
    let c = BusyboxContainer::create(dir, id, "sleep 1000");
    c.edit_spec(edit);
    c.start();
    let images = dir.join(format!("{id}-images"));
    let (code, _, err) = c.wrapper(
        &["checkpoint", "--image-path", images.to_str().unwrap(), id],
        &[("PATH", &rig_path())],
        dir,
    );
    ensure!(code == 0, "checkpoint of {id} (exit {code}):\n{err}");
    Ok(images)
}

fn rig_path() -> String {
    format!(
        "{}:{}",
        gpusnap_testkit::paths::rig_bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `gpusnap-runc restore` of `images` into a fresh bundle with the default (narrow) runc spec
/// Plus `edit`: refused with one line naming `says`, runc never created it, the sentinel
/// Untouched.
fn refused_by_gpusnap_runc(
    dir: &Path,
    images: &Path,
    id: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    envs: &[(&str, &str)],
    says: &str,
) -> Result<()> {
    let target = BusyboxContainer::create(dir, id, "sleep 1000");
    target.edit_spec(edit);
    let mut env = vec![("PATH", rig_path())];
    env.extend(envs.iter().map(|(k, v)| (*k, v.to_string())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, _, err) = target.wrapper_restore(images, &env, dir);
    gpusnap_testkit::refused_restore::one_refusal_line(code, &err, says)?;
    ensure!(
        target.status().is_none(),
        "runc created the refused container: {:?}",
        target.state()
    );
    Ok(())
}

/// A checkpoint taken with CAP_SYS_ADMIN restored into a spec without it.
#[test]
fn privilege_capabilities_beyond_the_target_spec_are_refused() -> Result<()> {
    gpusnap_testkit::require_root();
    let sentinel = Sentinel::new()?;
    let watch = Watch::new(&sentinel);
    let work = tempfile::tempdir()?;
    let images = checkpoint_with_spec(work.path(), "priv-caps", |spec| {
        for set in ["bounding", "effective", "permitted"] {
            spec["process"]["capabilities"][set]
                .as_array_mut()
                .unwrap()
                .push("CAP_SYS_ADMIN".into());
        }
    })?;
    refused_by_gpusnap_runc(
        work.path(),
        &images,
        "priv-caps-r",
        |_| {},
        &[],
        "CAP_SYS_ADMIN",
    )?;
    watch.check(&[])
}

/// A checkpoint of a task running as uid 0 restored into a spec that runs uid
/// 1000.
#[test]
fn privilege_uid_0_into_a_non_root_spec_is_refused() -> Result<()> {
    gpusnap_testkit::require_root();
    let sentinel = Sentinel::new()?;
    let watch = Watch::new(&sentinel);
    let work = tempfile::tempdir()?;
    let images = checkpoint_with_spec(work.path(), "priv-uid", |_| {})?;
    refused_by_gpusnap_runc(
        work.path(),
        &images,
        "priv-uid-r",
        |spec| {
            spec["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
        },
        &[],
        "uid is 0",
    )?;
    watch.check(&[])
}

/// `restore.signature_policy = "require"` applies to gpusnap-runc: an unsigned
/// (sealed, otherwise valid) checkpoint directory is refused.
#[test]
fn signature_required_policy_refuses_unsigned_directories_in_gpusnap_runc() -> Result<()> {
    gpusnap_testkit::require_root();
    let work = tempfile::tempdir()?;
    let key = work.path().join("cosign.pub");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl ecparam -name prime256v1 -genkey -noout | openssl ec -pubout -out {}",
            key.display()
        ))
        .output()?;
    ensure!(out.status.success(), "openssl: {out:?}");
    let config = work.path().join("gpusnap.toml");
    fs::write(
        &config,
        format!(
            "[restore]\nsignature_policy = \"require\"\nsignature_keys = [\"{}\"]\n\n[criu]\nbinary_dir = \"{}\"\n",
            key.display(),
            gpusnap_testkit::paths::rig_bin_dir().display()
        ),
    )?;
    let images = checkpoint_with_spec(work.path(), "sig", |_| {})?;
    refused_by_gpusnap_runc(
        work.path(),
        &images,
        "sig-r",
        |_| {},
        &[("GPUSNAP_CONFIG", config.to_str().unwrap())],
        "signature",
    )
}

/// An image file that is a hard link to a host file — sealed with the link in
/// Place, so its size and digest match — is refused, and the host file is not read into a
/// Restore.
#[test]
fn untrusted_tree_hard_linked_image_file_is_refused() -> Result<()> {
    gpusnap_testkit::require_root();
    let sentinel = Sentinel::new()?;
    let work = tempfile::Builder::new()
        .prefix("gpusnap-adv-hl-")
        .tempdir_in("/tmp")?;
    let ck = work.path().join("ck");
    fs::create_dir_all(&ck)?;
    for (name, len) in [
        ("inventory.img", 64),
        ("core-1.img", 3000),
        ("pstree.img", 40),
    ] {
        fs::write(ck.join(name), vec![7u8; len])?;
    }
    // Same file system (/tmp): the link shares the sentinel file's inode.
    fs::hard_link(sentinel.target("secret"), ck.join("pages-1.img"))?;
    seal_checkpoint(&ck, Manifest::new("victim", CriuFlags::default()))?;
    // From here on (the link and the seal's chmod changed the sentinel file's ctime and mode).
    let watch = Watch::new(&sentinel);
    let c = BusyboxContainer::create(work.path(), "hl", "sleep 100");
    let (code, _, err) = c.wrapper(
        &[
            "restore",
            "-d",
            "--image-path",
            ck.to_str().unwrap(),
            "--bundle",
            c.bundle.to_str().unwrap(),
            "hl",
        ],
        &[],
        work.path(),
    );
    ensure!(
        code == 1 && err.contains("hard link") && c.status().is_none(),
        "a hard-linked image file must be refused naming it; exit {code}, stderr {err:?}"
    );
    watch.check(&[])
}
