//! Checkpoints as hostile input, through the real restore paths.
//!
//! Each case crafts a checkpoint — a damaged or lying manifest, image files that are symlinks
//! into the host, a rootfs diff that tries to reach outside the container's rootfs, an origin
//! record that does not match — and hands it to a front door: `gpusnap-runc restore` (as
//! CRI-O and Podman call it), a pod annotation `gpusnap.io/restore-from` through containerd's
//! CRI, and `ctr containers restore` through containerd's content store. Every case asserts:
//! - the restore is refused with a message that names the problem,
//! - runc never created the container (so CRIU never ran),
//! - nothing outside the target changed: a sentinel host tree the crafted inputs point at has
//!   the same checksum before and after.
//!
//! The checkpoints are sealed by gpusnap's own code and then altered, the way an attacker with
//! write access to an image, an archive or a registry would.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use anyhow::{ensure, Result};
use gpusnap_checkpoint::{
    origin::{FileDigest, Origin, SignatureCheck, ORIGIN_FORMAT},
    seal_checkpoint, Manifest, ProcessRecord,
};
use gpusnap_criu_bridge::CriuFlags;
use gpusnap_testkit::{
    bundle::BusyboxContainer, cri::ContainerSpec, rig::BUSYBOX_IMAGE, CriNode, CriNodeOptions,
};

/// A host tree outside every container and checkpoint, which crafted inputs point at.
struct Sentinel {
    dir: tempfile::TempDir,
}

impl Sentinel {
    fn new() -> Sentinel {
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-sentinel-")
            .tempdir()
            .unwrap();
        fs::create_dir_all(dir.path().join("etc/conf.d")).unwrap();
        fs::write(
            dir.path().join("etc/passwd"),
            b"root:x:0:0::/root:/bin/sh\n",
        )
        .unwrap();
        fs::write(dir.path().join("etc/conf.d/keep"), b"keep me").unwrap();
        fs::write(dir.path().join("secret"), b"host secret").unwrap();
        Sentinel { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Names, types, modes, owners and contents of the whole tree.
    fn checksum(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let mut out = BTreeMap::new();
        let mut stack = vec![self.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let m = fs::symlink_metadata(e.path()).unwrap();
                let content = if m.is_file() {
                    gpusnap_testkit::fixtures::sha256_file(&e.path())
                } else if m.is_dir() {
                    stack.push(e.path());
                    String::new()
                } else {
                    fs::read_link(e.path())
                        .map(|l| l.display().to_string())
                        .unwrap_or_default()
                };
                out.insert(
                    e.path().display().to_string(),
                    format!("{:o} {} {} {content}", m.mode(), m.uid(), m.gid()),
                );
            }
        }
        format!("{out:?}")
    }
}

/// A sealed CPU-only checkpoint directory (what a good gpusnap checkpoint looks like to the
/// restore's checks).
fn sealed_checkpoint(dir: &Path) -> Manifest {
    fs::create_dir_all(dir).unwrap();
    for (name, len) in [
        ("inventory.img", 64),
        ("core-1.img", 3000),
        ("pages-1.img", 64 << 10),
        ("pstree.img", 40),
    ] {
        fs::write(dir.join(name), vec![7u8; len]).unwrap();
    }
    let mut m = Manifest::new("victim", CriuFlags::default());
    m.processes.push(ProcessRecord {
        container_pid: Some(1),
        command: Some(vec!["sh".into()]),
    });
    seal_checkpoint(dir, m).unwrap()
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

/// One way to damage a checkpoint directory, and what the refusal must say.
struct Mutation {
    name: &'static str,
    apply: fn(&Path, &Sentinel),
    says: &'static str,
}

fn mutations() -> Vec<Mutation> {
    vec![
        Mutation {
            name: "manifest-missing",
            apply: |d, _| fs::remove_file(manifest_path(d)).unwrap(),
            says: "gpusnap-manifest.json is missing",
        },
        Mutation {
            name: "manifest-oversized",
            apply: |d, _| {
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .open(manifest_path(d))
                    .unwrap();
                f.write_all(&vec![b' '; 17 << 20]).unwrap();
            },
            says: "larger than",
        },
        Mutation {
            name: "manifest-not-json",
            apply: |d, _| fs::write(manifest_path(d), b"{\"kind\": ").unwrap(),
            says: "invalid JSON",
        },
        Mutation {
            name: "manifest-foreign-kind",
            apply: |d, _| edit_manifest(d, |v| v["kind"] = "someone-else".into()),
            says: "not made by gpusnap",
        },
        Mutation {
            name: "manifest-future-format",
            apply: |d, _| edit_manifest(d, |v| v["format_version"] = 99.into()),
            says: "format_version 99",
        },
        Mutation {
            name: "manifest-lists-parent-path",
            apply: |d, _| {
                edit_manifest(d, |v| {
                    v["images"]["files"][0]["path"] = "../../etc/passwd".into()
                })
            },
            says: "not a plain file name",
        },
        Mutation {
            name: "manifest-lists-absolute-path",
            apply: |d, _| {
                edit_manifest(d, |v| {
                    v["images"]["files"][0]["path"] = "/etc/passwd".into()
                })
            },
            says: "not a plain file name",
        },
        Mutation {
            name: "manifest-is-a-symlink",
            apply: |d, s| {
                let host = s.path().join("etc/conf.d/keep");
                fs::remove_file(manifest_path(d)).unwrap();
                std::os::unix::fs::symlink(host, manifest_path(d)).unwrap();
            },
            says: "symlink",
        },
        Mutation {
            name: "image-is-a-symlink-into-the-host",
            apply: |d, s| {
                fs::remove_file(d.join("core-1.img")).unwrap();
                std::os::unix::fs::symlink(s.path().join("secret"), d.join("core-1.img")).unwrap();
            },
            says: "not a regular file",
        },
        Mutation {
            name: "image-unlisted",
            apply: |d, _| fs::write(d.join("pages-2.img"), b"smuggled").unwrap(),
            says: "not listed in the manifest",
        },
        Mutation {
            name: "image-corrupted",
            apply: |d, _| gpusnap_testkit::fixtures::flip_byte(&d.join("pages-1.img")),
            says: "is corrupted",
        },
        Mutation {
            name: "image-truncated",
            apply: |d, _| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("pages-1.img"))
                    .unwrap()
                    .set_len(100)
                    .unwrap()
            },
            says: "truncated",
        },
        Mutation {
            name: "other-architecture",
            apply: |d, _| edit_manifest(d, |v| v["host"]["arch"] = "aarch64".into()),
            says: "aarch64",
        },
        Mutation {
            name: "unknown-storage-engine",
            apply: |d, _| {
                edit_manifest(
                    d,
                    |v| v["gpu"] = serde_json::json!({"engine": "pagebroker", "processes": [{"host_pid": 1, "devices": []}]}),
                )
            },
            says: "pagebroker",
        },
        Mutation {
            name: "gpu-record-damaged",
            apply: |d, _| {
                edit_manifest(
                    d,
                    |v| v["gpu"] = serde_json::json!({"engine": "driver-managed", "processes": [{"host_pid": 7, "devices": []}]}),
                )
            },
            says: "the manifest is damaged",
        },
    ]
}

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// gpusnap-runc, as CRI-O and Podman call it: every mutation is refused before runc runs.
#[test]
fn gpusnap_runc_refuses_every_damaged_checkpoint_before_runc() {
    gpusnap_testkit::require_root();
    let sentinel = Sentinel::new();
    let before = sentinel.checksum();
    let work = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for m in mutations() {
        let id = format!("adv-runc-{}", m.name);
        let ck = work.path().join(&id);
        sealed_checkpoint(&ck);
        (m.apply)(&ck, &sentinel);
        let ctr = BusyboxContainer::create(work.path(), &id, "sleep 100");
        let (code, _out, err) = ctr.wrapper(
            &[
                "restore",
                "-d",
                "--image-path",
                ck.to_str().unwrap(),
                "--bundle",
                ctr.bundle.to_str().unwrap(),
                &id,
            ],
            &[],
            work.path(),
        );
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("gpusnap-runc:"))
            .collect();
        let ok = code == 1
            && lines.len() == 1
            && lines[0].contains(m.says)
            && lines[0].contains(&format!("cannot restore {id}"))
            && ctr.status().is_none()
            && !ck.join("restore.log").exists();
        if !ok {
            failures.push(format!(
                "{}: exit {code}, runc state {:?}, stderr {err:?}",
                m.name,
                ctr.status()
            ));
        }
    }
    assert_eq!(sentinel.checksum(), before, "the host tree changed");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

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
fn refused_restores_from(node: &CriNode, names: &[&str]) -> Result<Vec<String>> {
    let container = |i: usize| format!("c{i}");
    let keys: Vec<String> = (0..names.len())
        .map(|i| format!("gpusnap.io/restore-from.{}", container(i)))
        .collect();
    let annotations: Vec<(&str, &str)> = keys
        .iter()
        .map(String::as_str)
        .zip(names.iter().copied())
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
        let err = match node.create_container(&pod, &spec) {
            Err(e) => e.to_string(),
            Ok(id) => {
                let started = node.cri.start_container(&id);
                ensure!(started.is_err(), "{name}: the restore started");
                ensure!(
                    node.runc_state(&id).is_none(),
                    "{name}: runc created the container"
                );
                started.unwrap_err().to_string()
            }
        };
        errors.push(err);
    }
    node.remove_pod(&pod.id)?;
    Ok(errors)
}

/// The same mutations through a pod annotation (containerd's CRI → the shim).
#[test]
fn restore_from_refuses_every_damaged_checkpoint_before_runc() -> Result<()> {
    let _serial = serial();
    let sentinel = Sentinel::new();
    let before = sentinel.checksum();
    let node = restore_from_node()?;
    let mutations = mutations();
    for m in &mutations {
        let dir = place(&node, m.name, None);
        (m.apply)(&dir.join("checkpoint"), &sentinel);
    }
    let names: Vec<&str> = mutations.iter().map(|m| m.name).collect();
    let errors = refused_restores_from(&node, &names)?;
    let failures: Vec<String> = mutations
        .iter()
        .zip(&errors)
        .filter(|(m, err)| !err.contains(m.says))
        .map(|(m, err)| format!("{}: {err}", m.name))
        .collect();
    ensure!(sentinel.checksum() == before, "the host tree changed");
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// Raw tar entries, written byte for byte so hostile names can be built.
fn diff_tar(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_000_000_000);
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
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

/// Rootfs diffs that try to reach outside the container's rootfs, or carry what a writable
/// layer never does: refused whole before anything is written, through the pod annotation
/// (the only path where gpusnap applies the diff; containerd applies it itself elsewhere).
#[test]
fn hostile_rootfs_diffs_and_origins_are_refused_and_touch_nothing() -> Result<()> {
    use tar::EntryType::{Block, Char, Directory, Link, Regular, Symlink};
    let _serial = serial();
    let sentinel = Sentinel::new();
    let before = sentinel.checksum();
    let host = sentinel.path().display().to_string();
    let node = restore_from_node()?;
    let bomb = gzip(&diff_tar(&[("big", Regular, &vec![0u8; 2 << 20], None)]));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "symlink-then-write-through",
            diff_tar(&[
                ("escape", Symlink, b"", Some(&host)),
                ("escape/secret", Regular, b"pwned", None),
            ]),
            "not a directory",
        ),
        (
            "symlink-then-whiteout-through",
            diff_tar(&[
                ("escape", Symlink, b"", Some(&host)),
                ("escape/.wh.secret", Regular, b"", None),
            ]),
            "not a directory",
        ),
        (
            "symlink-then-opaque-through",
            diff_tar(&[
                ("escape", Symlink, b"", Some(&host)),
                ("escape/etc/.wh..wh..opq", Regular, b"", None),
            ]),
            "not a directory",
        ),
        (
            "relative-symlink-up-then-write",
            diff_tar(&[
                ("up", Symlink, b"", Some("../../../../../../../../..")),
                ("up/tmp/pwned", Regular, b"pwned", None),
            ]),
            "not a directory",
        ),
        (
            "through-an-image-symlink",
            // busybox's /bin/sh is a link in the image's own rootfs.
            diff_tar(&[("bin/sh/x", Regular, b"pwned", None)]),
            "not a directory",
        ),
        (
            "whiteout-dotdot",
            diff_tar(&[("etc/.wh...", Regular, b"", None)]),
            "a whiteout must name one entry",
        ),
        (
            "whiteout-dot",
            diff_tar(&[("etc/.wh..", Regular, b"", None)]),
            "a whiteout must name one entry",
        ),
        (
            "whiteout-empty",
            diff_tar(&[("etc/.wh.", Regular, b"", None)]),
            "a whiteout must name one entry",
        ),
        (
            "parent-path",
            diff_tar(&[("../../../../../tmp/pwned", Regular, b"pwned", None)]),
            "`..`",
        ),
        (
            "absolute-path",
            diff_tar(&[("/tmp/pwned", Regular, b"pwned", None)]),
            "is absolute",
        ),
        (
            "hard-link-out",
            diff_tar(&[("link", Link, b"", Some("../../../../etc/shadow"))]),
            "hard link target",
        ),
        (
            "character-device",
            diff_tar(&[
                ("dev/", Directory, b"", None),
                ("dev/kmem", Char, b"", None),
            ]),
            "device nodes",
        ),
        (
            "block-device",
            diff_tar(&[("sda", Block, b"", None)]),
            "device nodes",
        ),
        ("gzip-bomb", bomb, "bytes of file content"),
    ];
    let mut expected: Vec<(&str, &str)> = Vec::new();
    for (name, tar, says) in &cases {
        place(&node, name, Some(tar));
        expected.push((name, says));
    }

    // What the origin record vouches for.
    let good = diff_tar(&[("tmp/note", Regular, b"fine", None)]);
    let dir = place(&node, "diff-changed-after-pull", Some(&good));
    fs::write(
        dir.join("rootfs-diff.tar"),
        diff_tar(&[("tmp/note", Regular, b"changed", None)]),
    )?;
    let origin_cases: Vec<(&str, &str)> = vec![("diff-changed-after-pull", "was changed since")];
    let dir = place(&node, "diff-not-in-origin", None);
    fs::write(dir.join("rootfs-diff.tar"), &good)?;
    let dir = place(&node, "no-origin", None);
    fs::remove_file(dir.join("gpusnap-origin.json"))?;
    let dir = place(&node, "origin-oversized", None);
    fs::write(dir.join("gpusnap-origin.json"), vec![b' '; 1 << 20])?;
    std::os::unix::fs::symlink(
        sentinel.path(),
        node.checkpoint_root().join("name-is-a-symlink"),
    )?;
    expected.extend(origin_cases.into_iter().chain([
        ("diff-not-in-origin", "does not list it"),
        ("no-origin", "gpusnap-origin.json is missing"),
        ("origin-oversized", "not a valid origin record"),
        ("name-is-a-symlink", "not a symlink"),
    ]));
    let names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    let errors = refused_restores_from(&node, &names)?;
    let failures: Vec<String> = expected
        .iter()
        .zip(&errors)
        .filter(|((_, says), err)| !err.contains(says))
        .map(|((name, _), err)| format!("{name}: {err}"))
        .collect();
    ensure!(sentinel.checksum() == before, "the host tree changed");
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// The directory as a tar (files and symlinks, flat), as containerd's criu.tar holds it.
fn tar_dir(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for n in names {
        b.append_path_with_name(dir.join(&n), &n).unwrap();
    }
    b.into_inner().unwrap()
}

/// The same mutations through containerd's content store: a real `ctr containers
/// checkpoint` image whose CRIU tar is altered, restored with `ctr containers restore`.
#[test]
fn ctr_restore_refuses_every_damaged_checkpoint_before_runc() -> Result<()> {
    use gpusnap_testkit::checkpoint::{container_restore, criu_tar_blob, write_blob, CkRig};
    use gpusnap_testkit::{OutputExt, Runtime};
    let sentinel = Sentinel::new();
    let before = sentinel.checksum();
    let rig = CkRig::start_for(Runtime::Gpusnap)?;
    rig.run_detached(Runtime::Gpusnap, "src", &["sleep", "1000"])?;
    let image = "ck/adv:1";
    gpusnap_testkit::checkpoint::container_checkpoint_ok(&rig, "src", image, false)?;
    let blob = criu_tar_blob(&rig, image)?;
    let pristine = fs::read(&blob)?;
    let mut failures = Vec::new();
    for (i, m) in mutations().iter().enumerate() {
        let dir = tempfile::tempdir()?;
        tar::Archive::new(&pristine[..]).unpack(dir.path())?;
        (m.apply)(dir.path(), &sentinel);
        write_blob(&blob, &tar_dir(dir.path()))?;
        let id = format!("adv{i}");
        let out = container_restore(&rig, &id, image, false, true)?;
        let err = out.stderr_str();
        let running = rig.task(&id)?.is_some_and(|t| t.pid != 0);
        if out.status.success() || !err.contains(m.says) || running {
            failures.push(format!(
                "{}: success={} running={running} stderr={err:?}",
                m.name,
                out.status.success()
            ));
        }
        let _ = rig.ctr(&["tasks", "delete", "--force", &id]);
        let _ = rig.ctr(&["containers", "delete", &id]);
    }
    write_blob(&blob, &pristine)?;
    ensure!(sentinel.checksum() == before, "the host tree changed");
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
