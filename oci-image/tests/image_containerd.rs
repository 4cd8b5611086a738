//! `ctr images import` of a built checkpoint oci-archive into a private containerd 2.1 (CRI
//! plugins off): the image appears under its name with the checkpoint annotation on its target,
//! and — what containerd's CRI restore-from-image actually relies on — a snapshotter view of the
//! image's ChainID shows the CRI archive at its root.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use gpusnap_checkpoint::chunks::CHUNK_LIST_FILE;
use gpusnap_oci_image::{self as image, keys, BuildOptions, Chunking, CHECKPOINT_DIR};
use gpusnap_testkit::cmd::{require_root, run_ok};
use gpusnap_testkit::fixtures::*;
use gpusnap_testkit::{Rig, RigOptions};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// A rig's private containerd with nothing imported: the checkpoint image is the only one.
fn containerd() -> Rig {
    require_root();
    Rig::start_with(RigOptions {
        import_images: false,
        ..RigOptions::default()
    })
    .unwrap_or_else(|e| panic!("{e:#}"))
}

/// `ctr <args>` in the rig's namespace, which must succeed; returns stdout.
fn ctr(rig: &Rig, args: &[&str]) -> String {
    rig.ctr_ok(args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Unmounts on drop, so a failing assertion does not leave a mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// identity.ChainID: chain(L0) = diff0; chain(Ln) = sha256(chain(Ln-1) + " " + diffn).
fn chain_id(diff_ids: &[String]) -> String {
    let mut chain = diff_ids[0].clone();
    for d in &diff_ids[1..] {
        chain = format!(
            "sha256:{}",
            Sha256::digest(format!("{chain} {d}").as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
    }
    chain
}

#[test]
fn ctr_import_names_the_image_and_unpacks_the_archive_at_the_snapshot_root() {
    let fx = fixture();
    let cd = containerd();
    // The default chunked layout, then the classic one (`chunking: None`), into one containerd
    // under two names.
    for (chunking, name) in [
        (Some(Chunking::default()), "localhost/ckpt/chunked:v1"),
        (None, "localhost/ckpt/classic:v1"),
    ] {
        import_and_view(&cd, &fx, chunking, name);
    }
}

fn import_and_view(cd: &Rig, fx: &Fixture, chunking: Option<Chunking>, name: &str) {
    let tag = if chunking.is_some() {
        "chunked"
    } else {
        "classic"
    };
    let archive = fx.work.path().join(format!("{tag}.oci.tar"));
    let built = image::build(
        &fx.archive,
        &BuildOptions {
            archive_path: Some(archive.clone()),
            image_name: Some(name.to_owned()),
            chunking,
            ..Default::default()
        },
    )
    .unwrap();

    // Import (unpacking into the default snapshotter, as a CRI pull would).
    ctr(cd, &["images", "import", archive.to_str().unwrap()]);

    // `ctr images ls`: our name, an OCI index as target type, the index digest.
    let ls = ctr(cd, &["images", "ls"]);
    let row = ls
        .lines()
        .find(|l| l.split_whitespace().next() == Some(built.image_name.as_str()))
        .unwrap_or_else(|| panic!("{} not in `ctr images ls`:\n{ls}", built.image_name));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "application/vnd.oci.image.index.v1+json", "{row}");
    assert_eq!(cols[2], built.index_digest.as_str(), "{row}");

    // containerd's checkIfCheckpointOCIImage reads the target blob and looks for the
    // annotation; do the same through `ctr content get`.
    let target: Value =
        serde_json::from_str(&ctr(cd, &["content", "get", built.index_digest.as_str()])).unwrap();
    assert_eq!(
        target["annotations"][keys::CRIU_CONTAINER_NAME],
        CONTAINER_NAME,
        "{target}"
    );
    let manifest: Value = serde_json::from_str(&ctr(
        cd,
        &["content", "get", built.manifest_digest.as_str()],
    ))
    .unwrap();
    assert_eq!(
        manifest["annotations"][keys::CRIU_CONTAINER_NAME],
        CONTAINER_NAME
    );
    assert_eq!(
        manifest["annotations"][keys::CRIO_CHECKPOINT_NAME],
        CONTAINER_NAME
    );
    // Every layer reached the content store.
    let content = ctr(cd, &["content", "ls", "-q"]);
    for l in &built.layers {
        assert!(
            content.lines().any(|d| d == l.descriptor.digest.as_str()),
            "layer {} ({:?}) not in the content store",
            l.descriptor.digest,
            l.role
        );
    }

    // CRImportCheckpoint: View(ChainID(diff_ids)) and mount it; spec.dump etc. must be at the
    // root and the whole archive must be there, GPU extents included.
    let diff_ids: Vec<String> = built.layers.iter().map(|l| l.diff_id.to_string()).collect();
    let chain = chain_id(&diff_ids);
    let snaps = ctr(cd, &["snapshots", "ls"]);
    assert!(
        snaps
            .lines()
            .any(|l| l.split_whitespace().next() == Some(chain.as_str())),
        "image not unpacked: chain {chain} missing from\n{snaps}"
    );
    let mounts: Value = serde_json::from_str(&ctr(
        cd,
        &[
            "snapshots",
            "view",
            "--mounts",
            &format!("gpusnap-{tag}-view"),
            &chain,
        ],
    ))
    .unwrap();
    let m = &mounts[0];
    // Go field names (`Type`, `Source`, `Options`) in ctr's JSON.
    let field = |k: &str| {
        m.get(k)
            .or_else(|| m.get(k.to_lowercase()))
            .unwrap_or_else(|| panic!("no {k} in {mounts}"))
    };
    let target_dir = fx.work.path().join(format!("{tag}-view"));
    fs::create_dir(&target_dir).unwrap();
    let opts: Vec<&str> = field("Options")
        .as_array()
        .map(|o| o.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    run_ok(
        Command::new("mount")
            .args(["-t", field("Type").as_str().unwrap()])
            .args(["-o", &opts.join(",")])
            .arg(field("Source").as_str().unwrap())
            .arg(&target_dir),
    );
    let _mounted = Mounted(target_dir.clone());
    for f in ["spec.dump", "config.dump", "status.dump"] {
        assert!(target_dir.join(f).is_file(), "{f} not at the snapshot root");
    }
    // Same files, same bytes, same modes (containerd's applier does not keep directory mtimes
    // exactly, so compare everything but those).
    let strip_dir_mtime = |t: std::collections::BTreeMap<String, Node>| {
        t.into_iter()
            .map(|(k, v)| match v {
                Node::Dir { mode, uid, gid, .. } => (
                    k,
                    Node::Dir {
                        mode,
                        uid,
                        gid,
                        mtime: 0,
                    },
                ),
                other => (k, other),
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    if chunking.is_none() {
        assert_eq!(
            strip_dir_mtime(tree(&target_dir)),
            strip_dir_mtime(tree(&fx.archive_root))
        );
        return;
    }
    // A chunked image's union holds the chunks and their list in place of the large files.
    // Assembled the way the restore transaction does it (in the runtime's copy of the
    // checkpoint directory, copied here with times kept), it is the archive: same files, bytes,
    // modes and file times, and the directories' times as the snapshot had them.
    let cp = CHECKPOINT_DIR;
    assert!(target_dir.join(cp).join(CHUNK_LIST_FILE).is_file());
    assert!(!target_dir.join(cp).join(GPU_EXTENTS[1]).exists());
    let copy = fx.work.path().join(format!("{tag}-copy"));
    run_ok(Command::new("cp").arg("-a").arg(&target_dir).arg(&copy));
    let before = tree(&copy);
    let done = gpusnap_checkpoint::chunks::assemble(&copy.join(cp))
        .unwrap()
        .expect("a chunked checkpoint");
    assert!(done.files >= 3, "{done:?}");
    assert_eq!(
        tree(&copy)[cp],
        before[cp],
        "assembly changed the checkpoint directory's times"
    );
    assert_eq!(
        strip_dir_mtime(tree(&copy)),
        strip_dir_mtime(tree(&fx.archive_root))
    );
    fs::remove_dir_all(&copy).unwrap();
}
