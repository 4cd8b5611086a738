//! Hostile checkpoint images through the front door, `gpusnap image pull --extract`, from a real
//! registry (Debian's `docker-registry`, plain HTTP on loopback): symlink chains that each stay
//! inside the image lexically but together reach `/`, looping symlinks, gzip bombs (a layer, a
//! rootfs diff) and an oversized JSON document. Every one is refused with a message that names
//! it, leaves nothing at the destination or beside it, and changes no host file.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use gpusnap_testkit::fixtures::fixture;
use gpusnap_testkit::hand_layout::{gzip, put_blob, write_index, write_layout};
use gpusnap_testkit::{describe, paths, Registry};
use serde_json::json;

fn gpusnap(args: &[&str]) -> Output {
    Command::new(paths::binary("gpusnap"))
        .args(args)
        .env("COLUMNS", "100")
        .env_remove("GPUSNAP_LOG")
        .output()
        .unwrap()
}

/// One tar entry, its name and link written verbatim into the header.
enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
    Symlink(&'a str, &'a str),
}

fn layer_tar(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, kind, data, link): (&str, _, &[u8], Option<&str>) = match e {
            E::Dir(n) => (n, tar::EntryType::Directory, &[], None),
            E::File(n, d) => (n, tar::EntryType::Regular, d, None),
            E::Symlink(n, t) => (n, tar::EntryType::Symlink, &[], Some(t)),
        };
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_mtime(1_700_000_000);
        match link {
            Some(l) => b.append_link(&mut h, name, l).unwrap(),
            None => b.append_data(&mut h, name, data).unwrap(),
        }
    }
    b.into_inner().unwrap()
}

/// Pushes `layout` as `repo:tag`, which must succeed; returns the image reference.
fn push(reg: &Registry, layout: &Path, repo_tag: &str) -> String {
    let reference = reg.image(repo_tag);
    let out = gpusnap(&[
        "image",
        "push",
        layout.to_str().unwrap(),
        &reference,
        "--plain-http",
    ]);
    assert!(out.status.success(), "push: {}", describe(&out));
    reference
}

/// Pushes `layout` as `repo:tag` and pulls it with `--extract DEST`; returns the pull's output.
fn push_then_pull_extract(reg: &Registry, layout: &Path, repo_tag: &str, dest: &Path) -> Output {
    let reference = push(reg, layout, repo_tag);
    gpusnap(&[
        "image",
        "pull",
        &reference,
        "--plain-http",
        "--extract",
        dest.to_str().unwrap(),
    ])
}

/// Asserts a refused pull: non-zero exit, `says` in its stderr, nothing at or beside `dest`.
fn assert_refused(out: &Output, says: &str, dest: &Path) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "pulled: {}", describe(out));
    assert!(err.contains(says), "want {says:?}: {}", describe(out));
    assert!(!dest.exists(), "left {}", dest.display());
    let parent = dest.parent().unwrap();
    let left: Vec<_> = fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left beside it: {left:?}");
}

/// A real gpusnap manifest for the hand-made images (the fixture's sealed checkpoint).
fn gpusnap_manifest() -> Vec<u8> {
    let fx = fixture();
    fs::read(fx.checkpoint_dir.join("gpusnap-manifest.json")).unwrap()
}

/// The chained-symlink attack on the origin record: `l1 -> ..`, `l2 -> l1/..`, … `l8 ->
/// l7/..` each stay inside the image when read lexically, but together climb to `/`; a planted
/// `.gpusnap-origin.json.tmp -> l8/<host path>` is where the origin record was written
/// (create + truncate, following symlinks), so the pull overwrote that host file as root and
/// reported success.
#[test]
fn chained_symlinks_never_reach_a_host_file() {
    gpusnap_testkit::require_root();
    let reg = Registry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    let sentinel = host.path().join("sentinel");
    fs::write(&sentinel, b"host file: must not change\n").unwrap();
    let sentinel_rel = sentinel
        .to_str()
        .unwrap()
        .trim_start_matches('/')
        .to_owned();
    let manifest = gpusnap_manifest();

    let links: Vec<(String, String)> = (1..=8)
        .map(|i| {
            let target = if i == 1 {
                "..".to_owned()
            } else {
                format!("l{}/..", i - 1)
            };
            (format!("checkpoint/l{i}"), target)
        })
        .collect();
    let planted_target = format!("l8/{sentinel_rel}");
    for (case, planted_name) in [
        ("tmp", "checkpoint/.gpusnap-origin.json.tmp"),
        ("record", "checkpoint/gpusnap-origin.json"),
    ] {
        let mut entries = vec![E::Dir("checkpoint")];
        for (n, t) in &links {
            entries.push(E::Symlink(n, t));
        }
        entries.push(E::Symlink(planted_name, &planted_target));
        entries.push(E::File("checkpoint/gpusnap-manifest.json", &manifest));
        let layout = work.path().join(format!("layout-{case}"));
        // A checkpoint-directory image: the origin record goes into `checkpoint/`.
        write_layout(
            &layout,
            &[(layer_tar(&entries), false)],
            Some(json!({"io.gpusnap.source.layout": "checkpoint-dir"})),
        );
        let out_dir = work.path().join(format!("out-{case}"));
        fs::create_dir_all(&out_dir).unwrap();
        let dest = out_dir.join("ck");
        let out = push_then_pull_extract(&reg, &layout, &format!("hostile/chain-{case}:1"), &dest);
        assert_refused(&out, "only gpusnap writes", &dest);
        assert_eq!(
            fs::read(&sentinel).unwrap(),
            b"host file: must not change\n",
            "{case}: the host file was written through the chain"
        );
    }

    // The chain alone is data: the pull keeps it, nothing follows it, and the restore
    // validation refuses the checkpoint naming the first symlink.
    let mut entries = vec![E::Dir("checkpoint")];
    for (n, t) in &links {
        entries.push(E::Symlink(n, t));
    }
    entries.push(E::Symlink("checkpoint/descriptors.json", &planted_target));
    entries.push(E::File("checkpoint/gpusnap-manifest.json", &manifest));
    let layout = work.path().join("layout-chain-only");
    write_layout(
        &layout,
        &[(layer_tar(&entries), false)],
        Some(json!({"io.gpusnap.source.layout": "checkpoint-dir"})),
    );
    let out_dir = work.path().join("out-chain-only");
    fs::create_dir_all(&out_dir).unwrap();
    let dest = out_dir.join("ck");
    let out = push_then_pull_extract(&reg, &layout, "hostile/chain-only:1", &dest);
    assert!(out.status.success(), "{}", describe(&out));
    let origin = fs::symlink_metadata(dest.join("gpusnap-origin.json")).unwrap();
    assert!(
        origin.is_file(),
        "the origin record is a file gpusnap wrote"
    );
    let refusal = gpusnap_checkpoint::validate_for_restore(&dest)
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains("descriptors.json is a symlink"),
        "{refusal}"
    );
    assert_eq!(
        fs::read(&sentinel).unwrap(),
        b"host file: must not change\n"
    );
}

/// A looping symlink (`loop -> loop`, `a -> b -> a`) is never followed: an entry through it
/// is refused, not resolved until the kernel gives up somewhere else.
#[test]
fn looping_symlinks_are_refused() {
    gpusnap_testkit::require_root();
    let reg = Registry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().unwrap();
    for (case, entries) in [
        (
            "self",
            vec![
                E::Dir("checkpoint"),
                E::Symlink("checkpoint/loop", "loop"),
                E::File("checkpoint/loop/pages-1.img", b"x"),
            ],
        ),
        (
            "pair",
            vec![
                E::Dir("checkpoint"),
                E::Symlink("checkpoint/a", "b"),
                E::Symlink("checkpoint/b", "a"),
                E::File("checkpoint/a/pages-1.img", b"x"),
            ],
        ),
    ] {
        let layout = work.path().join(format!("layout-{case}"));
        write_layout(&layout, &[(layer_tar(&entries), false)], Some(json!({})));
        let out_dir = work.path().join(format!("out-{case}"));
        fs::create_dir_all(&out_dir).unwrap();
        let dest = out_dir.join("ck");
        let out = push_then_pull_extract(&reg, &layout, &format!("hostile/loop-{case}:1"), &dest);
        assert_refused(&out, "passes through a symlink", &dest);
    }
}

/// A tmpfs of `mib` MiB mounted on a new directory, unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(mib: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Gzip bombs: a layer, and a rootfs diff inside a layer, each a few hundred KiB that inflate
/// to 256 MiB, pulled onto a 64 MiB file system. Refused as they pass its free space, with
/// nothing left; the disk is not filled.
#[test]
fn gzip_bombs_are_refused_before_they_fill_the_disk() {
    gpusnap_testkit::require_root();
    let reg = Registry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().unwrap();
    let manifest = gpusnap_manifest();
    let zeros = vec![0u8; 256 << 20];

    // A gzip layer.
    let layer = layer_tar(&[
        E::Dir("checkpoint"),
        E::File("checkpoint/gpusnap-manifest.json", &manifest),
        E::File("checkpoint/pages-1.img", &zeros),
    ]);
    let layout = work.path().join("layout-layer");
    write_layout(&layout, &[(layer, true)], Some(json!({})));
    let disk = SmallDisk::new(64);
    let dest = disk.path().join("ck");
    let out = push_then_pull_extract(&reg, &layout, "hostile/bomb-layer:1", &dest);
    assert_refused(&out, "bytes free", &dest);

    // A layer that declares its uncompressed size is held to it, whatever the free space.
    let layer = layer_tar(&[
        E::Dir("checkpoint"),
        E::File("checkpoint/gpusnap-manifest.json", &manifest),
        E::File("checkpoint/pages-1.img", &zeros[..4 << 20]),
    ]);
    let layout = work.path().join("layout-declared");
    write_layout(&layout, &[(layer, true)], Some(json!({})));
    declare_uncompressed(&layout, 1 << 20);
    let out_dir = work.path().join("out-declared");
    fs::create_dir_all(&out_dir).unwrap();
    let dest = out_dir.join("ck");
    let out = push_then_pull_extract(&reg, &layout, "hostile/bomb-declared:1", &dest);
    assert_refused(&out, "over the limit", &dest);

    // A rootfs diff: a small file in an honest layer, 256 MiB once decompressed.
    let inner = gzip(&layer_tar(&[E::File("data/zeros", &zeros)]));
    let layer = layer_tar(&[
        E::Dir("checkpoint"),
        E::File("checkpoint/gpusnap-manifest.json", &manifest),
        E::File("rootfs-diff.tar", &inner),
    ]);
    let layout = work.path().join("layout-diff");
    write_layout(&layout, &[(layer, false)], Some(json!({})));
    let dest = disk.path().join("ck-diff");
    let out = push_then_pull_extract(&reg, &layout, "hostile/bomb-diff:1", &dest);
    assert_refused(&out, "rootfs-diff.tar, once decompressed,", &dest);
}

/// Sets `io.gpusnap.layer.uncompressed-size` on the only layer of the layout's image (and
/// rewrites the manifest and index digests).
fn declare_uncompressed(layout: &Path, bytes: u64) {
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let md = index["manifests"][0]["digest"].as_str().unwrap();
    let blob = |d: &str| {
        layout
            .join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let mut m: serde_json::Value = serde_json::from_slice(&fs::read(blob(md)).unwrap()).unwrap();
    m["layers"][0]["annotations"] =
        json!({"io.gpusnap.layer.uncompressed-size": bytes.to_string()});
    let bytes = serde_json::to_vec(&m).unwrap();
    let (d, size) = put_blob(layout, &bytes);
    write_index(layout, &d, size);
}

/// A 300 MiB gpusnap manifest in a layer (300 KiB compressed) is refused by its size, not
/// read whole: the pull's peak memory stays far below the document.
#[test]
fn an_oversized_json_in_a_layer_is_refused_unread() {
    gpusnap_testkit::require_root();
    let reg = Registry::start().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().unwrap();
    let mut big = gpusnap_manifest();
    big.resize(300 << 20, b' ');
    let layer = layer_tar(&[
        E::Dir("checkpoint"),
        E::File("checkpoint/gpusnap-manifest.json", &big),
    ]);
    drop(big);
    let layout = work.path().join("layout");
    write_layout(&layout, &[(layer, true)], Some(json!({})));
    let out_dir = work.path().join("out");
    fs::create_dir_all(&out_dir).unwrap();
    let dest = out_dir.join("ck");
    let reference = push(&reg, &layout, "hostile/big-json:1");
    // The pull's own peak resident set, from GNU time (which forks it from a small process:
    // a child spawned straight from this test would inherit the test's own high-water mark).
    let out = Command::new("/usr/bin/time")
        .args(["-f", "maxrss_kib=%M"])
        .arg(paths::binary("gpusnap"))
        .args(["image", "pull", &reference, "--plain-http", "--extract"])
        .arg(&dest)
        .env_remove("GPUSNAP_LOG")
        .output()
        .expect("GNU time (/usr/bin/time, package `time`)");
    assert_refused(&out, "refused unread", &dest);
    let err = String::from_utf8_lossy(&out.stderr);
    let peak_mib = err
        .lines()
        .find_map(|l| l.strip_prefix("maxrss_kib="))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no maxrss in {err}"))
        / 1024;
    assert!(
        peak_mib < 150,
        "the pull peaked at {peak_mib} MiB: the document was read whole"
    );
}
