//! Hostile checkpoint images, built by hand, against `extract`: every one is refused with an
//! error that says why, leaves nothing at the destination or beside it, and changes nothing in
//! a sentinel directory on the host (compared by a full tree checksum before and after).

use std::fs;
use std::path::{Path, PathBuf};

use gpusnap_oci_image::{self as image, ExtractOptions, ImageError, OriginSeed};
use gpusnap_testkit::fixtures::{tree, Node};
use gpusnap_testkit::hand_layout::write_layout;

/// One tar entry, its name written verbatim into the header (the `tar` crate's builder refuses
/// the names these tests need).
enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    CharDev(&'a str),
    Fifo(&'a str),
}

fn header(name: &str, kind: tar::EntryType, size: u64, link: Option<&str>) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o6777); // setuid, setgid, world-writable: extract must not keep any of it
    h.set_mtime(1_700_000_000);
    h.set_uid(1234);
    h.set_gid(1234);
    let raw = h.as_old_mut();
    raw.name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        raw.linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    if kind == tar::EntryType::Char {
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
    }
    h.set_cksum();
    h
}

fn layer_tar(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (h, data): (tar::Header, &[u8]) = match e {
            E::Dir(n) => (header(n, tar::EntryType::Directory, 0, None), &[]),
            E::File(n, d) => (header(n, tar::EntryType::Regular, d.len() as u64, None), d),
            E::Symlink(n, t) => (header(n, tar::EntryType::Symlink, 0, Some(t)), &[]),
            E::HardLink(n, t) => (header(n, tar::EntryType::Link, 0, Some(t)), &[]),
            E::CharDev(n) => (header(n, tar::EntryType::Char, 0, None), &[]),
            E::Fifo(n) => (header(n, tar::EntryType::Fifo, 0, None), &[]),
        };
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

struct Case {
    name: &'static str,
    layers: Vec<(Vec<u8>, bool)>,
    /// A word the error must contain.
    expect: &'static str,
}

impl Case {
    /// A case of one uncompressed layer of these entries.
    fn one_layer(name: &'static str, entries: &[E<'_>], expect: &'static str) -> Case {
        Case {
            name,
            layers: vec![(layer_tar(entries), false)],
            expect,
        }
    }
}

/// A host directory an escaping entry would reach, with its tree (modes, sizes, digests).
fn sentinel(top: &Path) -> (PathBuf, std::collections::BTreeMap<String, Node>) {
    let s = top.join("sentinel");
    fs::create_dir_all(s.join("sub")).unwrap();
    fs::write(s.join("passwd"), b"root:x:0:0::/root:/bin/sh\n").unwrap();
    fs::write(s.join("sub/keep"), b"host data").unwrap();
    let t = tree(&s);
    (s, t)
}

#[test]
fn hostile_layers_are_refused_and_touch_nothing_outside() {
    let top = tempfile::tempdir().unwrap();
    let (sentinel_dir, before) = sentinel(top.path());
    let sentinel_abs = sentinel_dir.to_str().unwrap().to_owned();
    let passwd_abs = format!("{sentinel_abs}/passwd");
    let bomb = {
        // 64 MiB of zeros in one file: a gzip layer of about 64 KiB.
        let big = vec![0u8; 64 << 20];
        layer_tar(&[
            E::Dir("checkpoint"),
            E::File("checkpoint/pages-1.img", &big),
        ])
    };
    let cases = vec![
        Case::one_layer(
            "absolute symlink",
            &[
                E::Dir("checkpoint"),
                E::Symlink("checkpoint/evil", &sentinel_abs),
            ],
            "absolute symlink",
        ),
        Case::one_layer(
            "checkpoint is a symlink",
            &[
                E::Dir("real"),
                E::Symlink("checkpoint", "real"),
                E::File("checkpoint/x", b"x"),
            ],
            "symlink where the checkpoint has its own files",
        ),
        Case::one_layer(
            "relative symlink out of the root",
            &[
                E::Dir("checkpoint"),
                E::Symlink("checkpoint/up", "../../sentinel"),
            ],
            "leads outside",
        ),
        Case::one_layer("dot-dot entry", &[E::File("../sentinel/pwned", b"x")], ".."),
        Case::one_layer(
            "dot-dot inside a path",
            &[
                E::Dir("checkpoint"),
                E::File("checkpoint/../../sentinel/pwned", b"x"),
            ],
            "..",
        ),
        Case::one_layer(
            "absolute entry name",
            &[E::File(&format!("{sentinel_abs}/pwned"), b"x")],
            "absolute",
        ),
        Case::one_layer(
            "whiteout",
            &[
                E::Dir("checkpoint"),
                E::File("checkpoint/.wh.pages-1.img", b""),
            ],
            "whiteout",
        ),
        Case::one_layer(
            "opaque whiteout",
            &[
                E::Dir("checkpoint"),
                E::File("checkpoint/.wh..wh..opq", b""),
            ],
            "whiteout",
        ),
        Case::one_layer(
            "character device",
            &[E::Dir("checkpoint"), E::CharDev("checkpoint/null")],
            "character device",
        ),
        Case::one_layer(
            "fifo",
            &[E::Dir("checkpoint"), E::Fifo("checkpoint/fifo")],
            "FIFO",
        ),
        Case::one_layer(
            "hard link out (absolute)",
            &[
                E::Dir("checkpoint"),
                E::HardLink("checkpoint/hl", &passwd_abs),
            ],
            "hard link",
        ),
        Case::one_layer(
            "hard link out (relative)",
            &[
                E::Dir("checkpoint"),
                E::HardLink("checkpoint/hl", "../../sentinel/passwd"),
            ],
            "hard link",
        ),
        Case {
            name: "gzip bomb",
            layers: vec![(bomb, true)],
            expect: "over the limit",
        },
        Case {
            name: "path through a symlink an earlier layer made",
            layers: vec![
                (
                    layer_tar(&[
                        E::Dir("checkpoint"),
                        E::Dir("checkpoint/d"),
                        E::Symlink("checkpoint/link", "d"),
                    ]),
                    false,
                ),
                (layer_tar(&[E::File("checkpoint/link/pwned", b"x")]), false),
            ],
            expect: "passes through a symlink",
        },
        Case::one_layer(
            "path through a symlink to the parent, same layer",
            &[
                E::Dir("checkpoint"),
                E::Symlink("checkpoint/up", ".."),
                E::File("checkpoint/up/config.dump", b"x"),
            ],
            "passes through a symlink",
        ),
        Case {
            name: "file over a symlink an earlier layer made",
            layers: vec![
                (
                    layer_tar(&[E::Dir("checkpoint"), E::Symlink("checkpoint/f", "g")]),
                    false,
                ),
                (layer_tar(&[E::File("checkpoint/f", b"x")]), false),
            ],
            expect: "appears twice",
        },
    ];
    assert!(cases.len() >= 8);
    for (i, case) in cases.into_iter().enumerate() {
        let layout = top.path().join(format!("image-{i}"));
        write_layout(&layout, &case.layers, None);
        let out = top.path().join(format!("out-{i}"));
        fs::create_dir_all(&out).unwrap();
        let dest = out.join("ck");
        let seed = OriginSeed {
            source: case.name.into(),
            pinned: false,
            signature: gpusnap_checkpoint::origin::SignatureCheck::NotChecked,
        };
        let limits = ExtractOptions {
            max_layer_bytes: 8 << 20,
            ..Default::default()
        };
        let err = image::extract_with(&layout, None, &dest, &seed, &limits)
            .err()
            .unwrap_or_else(|| panic!("{}: extracted", case.name));
        let msg = err.to_string();
        assert!(msg.contains(case.expect), "{}: {msg}", case.name);
        assert!(
            !matches!(err, ImageError::Io { .. }),
            "{}: a bare I/O error: {msg}",
            case.name
        );
        assert!(!dest.exists(), "{}: left {}", case.name, dest.display());
        assert_eq!(
            fs::read_dir(&out).unwrap().count(),
            0,
            "{}: left a staging directory",
            case.name
        );
        assert_eq!(
            tree(&sentinel_dir),
            before,
            "{}: the sentinel changed",
            case.name
        );
        eprintln!("{:<48} refused: {msg}", case.name);
    }
}

#[test]
fn benign_layers_get_private_modes_and_inside_symlinks_are_data() {
    let top = tempfile::tempdir().unwrap();
    let layout = top.path().join("image");
    let layers = vec![(
        layer_tar(&[
            E::Dir("checkpoint"),
            E::File("checkpoint/pages-1.img", b"pages"),
            E::Dir("checkpoint/sub"),
            E::Symlink("checkpoint/sub/alias", "../pages-1.img"),
            E::File("spec.dump", b"{}"),
        ]),
        false,
    )];
    write_layout(&layout, &layers, None);
    let dest = top.path().join("ck");
    let seed = OriginSeed {
        source: "benign".into(),
        pinned: false,
        signature: gpusnap_checkpoint::origin::SignatureCheck::NotChecked,
    };
    // No gpusnap manifest in it, so extract refuses at the end — after every layer applied
    // cleanly; the staging directory is gone all the same.
    let err =
        image::extract_with(&layout, None, &dest, &seed, &ExtractOptions::default()).unwrap_err();
    assert!(matches!(err, ImageError::ManifestMissing { .. }), "{err}");
    assert!(!dest.exists());

    // The modes extract gives: 0600 files, 0700 directories, whatever the tar said (the
    // fixture's CRI archive, and the root itself).
    let fx = gpusnap_testkit::fixtures::fixture();
    let real = top.path().join("real");
    image::build(
        &fx.archive,
        &image::BuildOptions {
            layout_dir: Some(real.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let dest = top.path().join("real-ck");
    image::extract_with(&real, None, &dest, &seed, &ExtractOptions::default()).unwrap();
    for (path, node) in tree(&dest) {
        match node {
            Node::Dir { mode, .. } => assert_eq!(mode, 0o700, "{path}"),
            Node::File { mode, .. } => assert_eq!(mode, 0o600, "{path}"),
            Node::Symlink { .. } => {}
        }
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

/// An mtime past what the system clock type holds (a GNU header's base-256 field can carry
/// one) must not crash extraction: times are clamped. The image has no gpusnap manifest, so
/// extract ends with that refusal after every entry was applied.
#[test]
fn absurd_entry_times_are_clamped_not_a_crash() {
    let top = tempfile::tempdir().unwrap();
    let layout = top.path().join("image");
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data) in [
        ("checkpoint", tar::EntryType::Directory, &b""[..]),
        (
            "checkpoint/pages-1.img",
            tar::EntryType::Regular,
            &b"pages"[..],
        ),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).unwrap();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(u64::MAX);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    write_layout(&layout, &[(b.into_inner().unwrap(), false)], None);
    let dest = top.path().join("ck");
    let seed = OriginSeed {
        source: "absurd-times".into(),
        pinned: false,
        signature: gpusnap_checkpoint::origin::SignatureCheck::NotChecked,
    };
    let err =
        image::extract_with(&layout, None, &dest, &seed, &ExtractOptions::default()).unwrap_err();
    assert!(matches!(err, ImageError::ManifestMissing { .. }), "{err}");
    assert!(!dest.exists());
}
