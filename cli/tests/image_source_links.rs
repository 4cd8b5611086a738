//! `gpusnap image build` and `gpusnap image push` refuse what a restore refuses (issue 28,
//! finding 7): a hard link (a host file's other name: before, a host file hard-linked as
//! `config.dump` of a CRI tree went to the registry), a symlink or a FIFO in the source —
//! a checkpoint directory, a CRI archive's unpacked tree, a CRI archive, or an OCI layout
//! given to push. Each refusal names the entry and what it is, and nothing is written
//! (no layout, no scratch) or uploaded (the registry never sees the repository).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use gpusnap_testkit::describe;
use gpusnap_testkit::fixtures::{fixture, Fixture};

mod common;
use common::{gpusnap, ok, registry, s};

/// What to put where.
#[derive(Debug, Clone, Copy)]
enum Plant {
    /// `rel` becomes another name of a file outside the tree with the same bytes (so the
    /// checkpoint still matches its sealed manifest).
    HardLink,
    /// `rel` becomes a symlink to a copy outside the tree.
    Symlink,
    /// A FIFO at `rel`.
    Fifo,
}

impl Plant {
    /// How the refusal names it.
    fn says(self) -> &'static str {
        match self {
            Plant::HardLink => "a regular file with 2 links",
            Plant::Symlink => "a symlink",
            Plant::Fifo => "a FIFO",
        }
    }
}

/// Plants `what` at `root/rel`, the "host" file in `host_dir`.
fn plant(root: &Path, rel: &str, what: Plant, host_dir: &Path) {
    let at = root.join(rel);
    let host = host_dir.join(rel.replace('/', "_"));
    fs::create_dir_all(host_dir).unwrap();
    match what {
        Plant::HardLink => {
            fs::copy(&at, &host).unwrap();
            fs::remove_file(&at).unwrap();
            fs::hard_link(&host, &at).unwrap();
        }
        Plant::Symlink => {
            fs::copy(&at, &host).unwrap();
            fs::remove_file(&at).unwrap();
            std::os::unix::fs::symlink(&host, &at).unwrap();
        }
        Plant::Fifo => {
            nix::unistd::mkfifo(&at, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
        }
    }
}

fn refused(out: &Output, what: &str, says: &[&str]) {
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "{what}: succeeded: {}",
        describe(out)
    );
    for s in says {
        assert!(text.contains(s), "{what}: the refusal lacks {s:?}: {text}");
    }
}

/// Nothing of a build or push is left in `dir` (scratch, staging, outputs beside the source).
fn leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".gpusnap-") || n.contains(".layout-") || n == "out")
        .collect()
}

/// `gpusnap image build SOURCE --layout OUT` and `gpusnap image push SOURCE REF` are both
/// refused, naming `entry` and `says`; nothing is written beside the source or uploaded.
fn both_refused(fx: &Fixture, source: &Path, what: &str, entry: &str, says: &str) {
    let reg = registry();
    let out_dir = fx.work.path().join("out");
    let build = gpusnap(
        None,
        &[
            "image",
            "build",
            s(source),
            "-t",
            "localhost/refused:v1",
            "--layout",
            s(&out_dir),
        ],
    );
    refused(&build, &format!("build: {what}"), &[entry, says]);
    assert!(!out_dir.exists(), "build: {what}: a layout was written");

    let reference = reg.image("refused/ckpt:v1");
    let push = gpusnap(
        None,
        &["image", "push", s(source), &reference, "--plain-http"],
    );
    refused(&push, &format!("push: {what}"), &[entry, says]);
    let repo = reg
        .storage_dir()
        .join("docker/registry/v2/repositories/refused");
    assert!(
        !repo.exists(),
        "push: {what}: the registry received the repository"
    );
    let parent = source.parent().unwrap();
    assert!(
        leftovers(parent).is_empty(),
        "{what}: left {:?}",
        leftovers(parent)
    );
}

#[test]
fn build_and_push_refuse_links_and_special_files_in_every_source_kind() {
    for plant_what in [Plant::HardLink, Plant::Symlink, Plant::Fifo] {
        // A checkpoint directory: an image file that is a link (its bytes are the sealed
        // ones), or a FIFO beside them.
        let fx = fixture();
        let host = fx.work.path().join("host");
        let rel = match plant_what {
            Plant::Fifo => "pipe",
            _ => "inventory.img",
        };
        plant(&fx.checkpoint_dir, rel, plant_what, &host);
        both_refused(
            &fx,
            &fx.checkpoint_dir,
            &format!("checkpoint directory, {plant_what:?}"),
            &format!("checkpoint/{rel}"),
            plant_what.says(),
        );

        // A CRI archive's unpacked tree: `config.dump` a host file's other name (the issue's
        // case), or a symlink, or a FIFO at the top.
        let fx = fixture();
        let rel = match plant_what {
            Plant::Fifo => "pipe",
            _ => "config.dump",
        };
        plant(&fx.archive_root, rel, plant_what, &host_of(&fx));
        both_refused(
            &fx,
            &fx.archive_root,
            &format!("archive tree, {plant_what:?}"),
            rel,
            plant_what.says(),
        );
    }
}

fn host_of(fx: &Fixture) -> PathBuf {
    fx.work.path().join("host")
}

/// A CRI archive (tar) carrying a symlink, a hard link or a FIFO entry.
#[test]
fn build_and_push_refuse_links_and_special_entries_of_an_archive() {
    for (plant_what, says) in [
        (Plant::Symlink, "a symlink"),
        (Plant::HardLink, "a hard link"),
        (Plant::Fifo, "a FIFO"),
    ] {
        let fx = fixture();
        let hostile = fx.work.path().join("hostile.tar");
        let mut b = tar::Builder::new(fs::File::create(&hostile).unwrap());
        b.follow_symlinks(false);
        // Everything of the honest archive, then the planted entry.
        let honest = fs::read(&fx.archive).unwrap();
        let mut a = tar::Archive::new(&honest[..]);
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let mut h = e.header().clone();
            let name = e.path().unwrap().into_owned();
            if name == Path::new("spec.dump") {
                continue;
            }
            b.append_data(&mut h, &name, &mut e).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o600);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_772_359_300);
        match plant_what {
            Plant::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, "spec.dump", "/etc/shadow").unwrap();
            }
            Plant::HardLink => {
                h.set_entry_type(tar::EntryType::Link);
                b.append_link(&mut h, "spec.dump", "config.dump").unwrap();
            }
            Plant::Fifo => {
                h.set_entry_type(tar::EntryType::Fifo);
                b.append_data(&mut h, "spec.dump", std::io::empty())
                    .unwrap();
            }
        }
        b.finish().unwrap();
        drop(b);
        both_refused(
            &fx,
            &hostile,
            &format!("archive, {plant_what:?}"),
            "spec.dump",
            says,
        );
    }
}

/// An OCI layout whose layer blob is another name of a file outside it (the same bytes, so
/// its digest matches): push refuses it before anything is uploaded.
#[test]
fn push_refuses_a_layout_with_a_hard_linked_blob() {
    let fx = fixture();
    let reg = registry();
    let layout = fx.work.path().join("layout");
    let built = common::json(&ok(
        None,
        &[
            "image",
            "build",
            s(&fx.archive),
            "-t",
            "localhost/linked:v1",
            "--layout",
            s(&layout),
            "--json",
        ],
    ));
    let layer = built["layers"][0]["descriptor"]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_owned();
    let blob = layout.join("blobs/sha256").join(&layer);
    let host = fx.work.path().join("host-copy");
    fs::copy(&blob, &host).unwrap();
    fs::remove_file(&blob).unwrap();
    fs::hard_link(&host, &blob).unwrap();

    let reference = reg.image("refused/layout:v1");
    let push = gpusnap(
        None,
        &["image", "push", s(&layout), &reference, "--plain-http"],
    );
    refused(
        &push,
        "layout push",
        &[
            &format!("blobs/sha256/{layer}"),
            "a regular file with 2 links",
        ],
    );
    assert!(
        !reg.storage_dir()
            .join("docker/registry/v2/repositories/refused")
            .exists(),
        "the registry received the repository"
    );
    // With the link gone (a plain copy in its place), the same layout pushes.
    fs::remove_file(&blob).unwrap();
    fs::copy(&host, &blob).unwrap();
    ok(
        None,
        &["image", "push", s(&layout), &reference, "--plain-http"],
    );
}
