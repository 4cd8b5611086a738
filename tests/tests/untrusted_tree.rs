//! A checkpoint directory whose tree holds something other than regular files and directories,
//! through the real restore doors: `gpusnap-runc restore` (as CRI-O and Podman call it) and
//! `ctr containers restore` (containerd's content store, unpacked by containerd itself).
//!
//! runc and CRIU open the files of a checkpoint directory by name and follow symlinks:
//! `descriptors.json` replaced by a chain of relative symlinks (`l1 -> ..`, `l2 -> l1/..`, …,
//! each harmless when read lexically) made runc read a file of the host at restore. The restore
//! validation walks the tree through directory descriptors and refuses every symlink, FIFO,
//! socket, device and hard-linked file, naming it, before runc runs. Every case asserts the
//! refusal names the entry, runc never created the container, and a sentinel host tree is
//! unchanged.

use std::fs;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use anyhow::{ensure, Result};
use gpusnap_checkpoint::{seal_checkpoint, Manifest, ProcessRecord};
use gpusnap_criu_bridge::CriuFlags;
use gpusnap_testkit::bundle::BusyboxContainer;
use gpusnap_testkit::refused_restore::gpusnap_runc_refuses;

/// A host tree the crafted entries point at, with a checksum of its files.
struct Sentinel {
    dir: tempfile::TempDir,
}

impl Sentinel {
    fn new() -> Sentinel {
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-sentinel-")
            .tempdir()
            .unwrap();
        fs::write(dir.path().join("descriptors.json"), b"[\"/etc/shadow\"]").unwrap();
        fs::write(dir.path().join("secret"), b"host secret").unwrap();
        Sentinel { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn checksum(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        let mut names: Vec<_> = fs::read_dir(self.path()).unwrap().flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let m = fs::symlink_metadata(e.path()).unwrap();
            // Not the link count: the hard-link case adds one itself.
            out.push(format!(
                "{:?} {:o} {}",
                e.file_name(),
                m.mode(),
                gpusnap_testkit::fixtures::sha256_file(&e.path())
            ));
        }
        out.join("\n")
    }
}

/// A sealed CPU-only checkpoint with runc's `descriptors.json`.
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
    fs::write(dir.join("descriptors.json"), b"[\"/dev/null\"]").unwrap();
    let mut m = Manifest::new("victim", CriuFlags::default());
    m.processes.push(ProcessRecord {
        container_pid: Some(1),
        command: Some(vec!["sh".into()]),
    });
    seal_checkpoint(dir, m).unwrap()
}

/// `descriptors.json` replaced by a symlink through a chain that climbs to `/`.
fn chain_descriptors(d: &Path, s: &Sentinel) {
    for i in 1..=8 {
        let target = if i == 1 {
            "..".to_owned()
        } else {
            format!("l{}/..", i - 1)
        };
        std::os::unix::fs::symlink(target, d.join(format!("l{i}"))).unwrap();
    }
    let host = s.path().join("descriptors.json");
    let rel = host.to_str().unwrap().trim_start_matches('/');
    fs::remove_file(d.join("descriptors.json")).unwrap();
    std::os::unix::fs::symlink(format!("l8/{rel}"), d.join("descriptors.json")).unwrap();
}

struct Mutation {
    name: &'static str,
    apply: fn(&Path, &Sentinel),
    says: &'static str,
    /// Survives containerd's packing of the checkpoint (a flat tar of files and symlinks).
    through_ctr: bool,
}

fn mutations() -> Vec<Mutation> {
    vec![
        Mutation {
            name: "descriptors-chained-symlink",
            apply: chain_descriptors,
            says: "descriptors.json is a symlink",
            through_ctr: true,
        },
        Mutation {
            name: "looping-symlink",
            apply: |d, _| std::os::unix::fs::symlink("loop", d.join("loop")).unwrap(),
            says: "loop is a symlink",
            through_ctr: true,
        },
        Mutation {
            name: "spec-dump-symlink",
            apply: |d, s| {
                std::os::unix::fs::symlink(s.path().join("secret"), d.join("spec.dump")).unwrap()
            },
            says: "spec.dump is a symlink",
            through_ctr: true,
        },
        Mutation {
            name: "fifo",
            apply: |d, _| {
                use std::os::unix::ffi::OsStrExt;
                let path =
                    std::ffi::CString::new(d.join("stats-restore").as_os_str().as_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
            },
            says: "stats-restore is a FIFO",
            through_ctr: false,
        },
        Mutation {
            name: "hard-link-to-a-host-file",
            apply: |d, s| fs::hard_link(s.path().join("secret"), d.join("config.dump")).unwrap(),
            says: "a hard link",
            through_ctr: false,
        },
        Mutation {
            name: "symlink-in-a-subdirectory",
            apply: |d, _| {
                fs::create_dir(d.join("sub")).unwrap();
                std::os::unix::fs::symlink("/", d.join("sub/root")).unwrap();
            },
            says: "sub/root is a symlink",
            through_ctr: false,
        },
    ]
}

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// gpusnap-runc, as CRI-O and Podman call it.
#[test]
fn gpusnap_runc_refuses_a_tree_with_links_before_runc() {
    gpusnap_testkit::require_root();
    let _serial = serial();
    let sentinel = Sentinel::new();
    let before = sentinel.checksum();
    let work = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for m in mutations() {
        let id = format!("tree-runc-{}", m.name);
        let ck = work.path().join(&id);
        sealed_checkpoint(&ck);
        (m.apply)(&ck, &sentinel);
        let ctr = BusyboxContainer::create(work.path(), &id, "sleep 100");
        if let Err(e) = gpusnap_runc_refuses(&ctr, &ck, m.says, work.path()) {
            failures.push(format!("{}: {e}", m.name));
        }
    }
    assert_eq!(sentinel.checksum(), before, "the host tree changed");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `ctr containers restore` of a real `ctr containers checkpoint` image whose CRIU tar was
/// altered: containerd unpacks it and hands the directory to the shim, whose restore refuses.
#[test]
fn ctr_restore_refuses_a_tree_with_links_before_runc() -> Result<()> {
    use gpusnap_testkit::checkpoint::{container_restore, CkRig};
    use gpusnap_testkit::refused_restore::CriuTar;
    use gpusnap_testkit::{OutputExt, Runtime};
    let _serial = serial();
    let sentinel = Sentinel::new();
    let before = sentinel.checksum();
    let rig = CkRig::start_for(Runtime::Gpusnap)?;
    rig.run_detached(Runtime::Gpusnap, "src", &["sleep", "1000"])?;
    let image = "ck/tree:1";
    gpusnap_testkit::checkpoint::container_checkpoint_ok(&rig, "src", image, false)?;
    let criu_tar = CriuTar::of(&rig, image)?;

    // The honest checkpoint restores (the walk passes what containerd unpacks).
    let out = container_restore(&rig, "honest", image, false, true)?;
    ensure!(
        out.status.success(),
        "the honest checkpoint was refused: {}",
        out.stderr_str()
    );
    let _ = rig.ctr(&["tasks", "kill", "-s", "KILL", "honest"]);
    let _ = rig.ctr(&["tasks", "delete", "--force", "honest"]);
    let _ = rig.ctr(&["containers", "delete", "honest"]);

    let mut failures = Vec::new();
    for (i, m) in mutations().iter().filter(|m| m.through_ctr).enumerate() {
        let restore = criu_tar.restore_altered(&format!("tree{i}"), |d| {
            (m.apply)(d, &sentinel);
            Ok(())
        })?;
        if let Err(e) = restore.refused_saying(m.says) {
            failures.push(format!("{}: {e}", m.name));
        }
    }
    criu_tar.put_back()?;
    ensure!(sentinel.checksum() == before, "the host tree changed");
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
