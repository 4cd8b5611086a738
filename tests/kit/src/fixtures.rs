//! Checkpoint fixtures shared by the image, checkpoint and CLI tests: a sealed gpusnap
//! checkpoint with fake CRIU images and GPU extents (sealed with the real `seal_checkpoint`), a
//! CRI checkpoint archive around it (as containerd's `CheckpointContainer` writes it), tree
//! snapshots for byte-for-byte comparisons, and helpers to read OCI layouts and tars
//! independently of the code under test.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::{seal_checkpoint, GpuProcessRecord, GpuSection, Manifest, ProcessRecord};
use gpusnap_criu_bridge::CriuFlags;
use sha2::{Digest as _, Sha256};

pub const CONTAINER_NAME: &str = "trainer";
pub const CONTAINER_ID: &str = "4f1e0c2d9b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";
pub const ROOTFS_IMAGE: &str = "docker.io/library/busybox:latest";
pub const ROOTFS_IMAGE_REF: &str =
    "sha256:3f57d9401f8d42f986df300f0c69192fc41da28ccc8d797829467780db3dd741";
/// GPU state files, flat in the checkpoint directory like everything gpusnap writes.
pub const GPU_EXTENTS: [&str; 2] = [
    "gpusnap-gpu-ctx-4242-dev0.bin",
    "gpusnap-gpu-mem-4242-dev0-000.bin",
];

/// Deterministic pseudo-random bytes (xorshift), so page and GPU images do not compress and
/// differ from each other.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn write_mode(path: &Path, data: &[u8], mode: u32) {
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A checkpoint directory as the shim leaves it: CRIU images, runc's descriptors.json, CRIU's
/// log, two GPU extents, sealed with the real `seal_checkpoint`.
pub fn make_checkpoint_dir(dir: &Path) -> Manifest {
    fs::create_dir_all(dir).unwrap();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).unwrap();
    let files: [(&str, Vec<u8>); 10] = [
        ("inventory.img", noise(64, 1)),
        ("core-1.img", noise(3_000, 2)),
        ("mm-1.img", noise(1_200, 3)),
        ("pagemap-1.img", noise(900, 4)),
        ("pages-1.img", noise(2 << 20, 5)),
        ("files.img", noise(700, 6)),
        ("fdinfo-2.img", noise(128, 7)),
        (
            "descriptors.json",
            br#"["/dev/null","pipe:[81234]","pipe:[81235]"]"#.to_vec(),
        ),
        ("stats-dump", noise(40, 8)),
        (
            "dump.log",
            b"(00.000001) Version: 4.1 (gitid 0)\n(00.120000) Dumping finished successfully\n"
                .to_vec(),
        ),
    ];
    for (name, data) in &files {
        write_mode(&dir.join(name), data, 0o600);
    }
    write_mode(&dir.join(GPU_EXTENTS[0]), &noise(1_500_000, 9), 0o600);
    write_mode(&dir.join(GPU_EXTENTS[1]), &noise(3 << 20, 10), 0o600);

    let mut m = Manifest::new(
        CONTAINER_ID,
        CriuFlags {
            tcp_established: true,
            ..Default::default()
        },
    );
    m.processes.push(ProcessRecord {
        container_pid: Some(1),
        command: Some(vec!["python".into(), "train.py".into()]),
    });
    m.criu_version = Some("4.1".into());
    m.runc_version = Some("1.1.12".into());
    m.gpu = Some(GpuSection {
        engine: "driver-managed".into(),
        processes: vec![GpuProcessRecord {
            host_pid: 4242,
            devices: vec!["GPU-8f3c2a1e-0000-1111-2222-333344445555".into()],
            extra: serde_json::Map::new(),
        }],
        extra: serde_json::Map::new(),
    });
    let sealed = seal_checkpoint(dir, m).unwrap();
    fs::set_permissions(
        dir.join("gpusnap-manifest.json"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    sealed
}

fn spec_dump() -> serde_json::Value {
    serde_json::json!({
        "ociVersion": "1.2.0",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": ["python", "train.py"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "NVIDIA_VISIBLE_DEVICES=all"],
            "cwd": "/"
        },
        "root": {"path": "rootfs"},
        "hostname": "train-pod",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}
        ],
        "annotations": {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": CONTAINER_NAME,
            "io.kubernetes.cri.image-name": ROOTFS_IMAGE,
            "io.kubernetes.cri.sandbox-id": "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b",
            "io.kubernetes.cri.sandbox-name": "train-pod",
            "io.kubernetes.cri.sandbox-namespace": "ml",
            "io.kubernetes.cri.sandbox-uid": "0b5c1f0e-8d0a-4c1e-9a51-6f0d2c3b4a59"
        },
        "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}]}
    })
}

fn config_dump() -> serde_json::Value {
    serde_json::json!({
        "id": CONTAINER_ID,
        "name": format!("{CONTAINER_NAME}_train-pod_ml_0b5c1f0e_0"),
        "rootfsImage": ROOTFS_IMAGE,
        "rootfsImageRef": ROOTFS_IMAGE_REF,
        "rootfsImageName": ROOTFS_IMAGE,
        "runtime": "io.containerd.gpusnap.v2",
        "createdTime": "2026-03-01T10:00:00.123456789Z",
        "checkpointedTime": "2026-03-01T10:42:00.987654321Z",
        "restoredTime": "0001-01-01T00:00:00Z",
        "restored": false
    })
}

/// A directory laid out like an extracted CRI checkpoint archive around a sealed checkpoint.
pub struct Fixture {
    pub work: tempfile::TempDir,
    /// The archive's tree (what the tar holds).
    pub archive_root: PathBuf,
    /// `archive_root/checkpoint`.
    pub checkpoint_dir: PathBuf,
    /// The CRI checkpoint archive (uncompressed tar, mode 0600 files, like containerd's).
    pub archive: PathBuf,
    pub manifest: Manifest,
}

pub fn fixture() -> Fixture {
    let work = tempfile::Builder::new()
        .prefix("gpusnap-image-")
        .tempdir()
        .unwrap();
    let root = work.path().join("archive-root");
    let cp = root.join("checkpoint");
    fs::create_dir_all(&cp).unwrap();
    let manifest = make_checkpoint_dir(&cp);
    let json = |v: serde_json::Value| serde_json::to_vec(&v).unwrap();
    write_mode(&root.join("spec.dump"), &json(spec_dump()), 0o600);
    write_mode(&root.join("config.dump"), &json(config_dump()), 0o600);
    write_mode(
        &root.join("status.dump"),
        &json(serde_json::json!({
            "id": CONTAINER_ID, "metadata": {"name": CONTAINER_NAME, "attempt": 0},
            "state": "CONTAINER_RUNNING", "image": {"image": ROOTFS_IMAGE},
            "imageRef": ROOTFS_IMAGE_REF, "labels": {}, "annotations": {}
        })),
        0o600,
    );
    write_mode(
        &root.join("status"),
        &json(
            serde_json::json!({"Pid": 4242, "CreatedAt": 1772359200123456789u64, "StartedAt": 1772359200223456789u64}),
        ),
        0o600,
    );
    write_mode(
        &root.join("container.log"),
        b"2026-03-01T10:00:01.000000000Z stdout F epoch 1 loss 2.31\n",
        0o600,
    );
    write_mode(
        &root.join("dump.log"),
        b"(00.000001) Version: 4.1\n(00.120000) Dumping finished successfully\n",
        0o600,
    );
    write_mode(&root.join("stats-dump"), &noise(40, 8), 0o600);
    write_mode(&root.join("rootfs-diff.tar"), &rootfs_diff_gz(), 0o600);
    let archive = work.path().join("checkpoint-trainer.tar");
    tar_tree(&root, &archive);
    Fixture {
        work,
        archive_root: root,
        checkpoint_dir: cp,
        archive,
        manifest,
    }
}

/// The container's rw layer: a gzip'd tar (despite the `.tar` name, as containerd writes it).
fn rootfs_diff_gz() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let data = b"written by the workload after start\n";
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(1_772_359_300);
    b.append_data(&mut h, "tmp/progress.txt", &data[..])
        .unwrap();
    let raw = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

/// Tars `root` (contents, sorted, parents first, names without `./`) into `out`.
pub fn tar_tree(root: &Path, out: &Path) {
    fn walk(b: &mut tar::Builder<File>, root: &Path, dir: &Path) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            let rel = p.strip_prefix(root).unwrap();
            b.append_path_with_name(&p, rel).unwrap();
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                walk(b, root, &p);
            }
        }
    }
    let mut b = tar::Builder::new(File::create(out).unwrap());
    b.follow_symlinks(false);
    walk(&mut b, root, root);
    b.finish().unwrap();
}

/// One node of a directory tree, with everything extract must reproduce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
        mtime: i64,
    },
    File {
        mode: u32,
        uid: u32,
        gid: u32,
        mtime: i64,
        size: u64,
        sha256: String,
    },
    Symlink {
        target: PathBuf,
    },
}

/// Every entry under `root` (relative path → node), root itself excluded.
pub fn tree(root: &Path) -> BTreeMap<String, Node> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let node = if m.is_dir() {
                walk(root, &p, out);
                Node::Dir {
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                    mtime: m.mtime(),
                }
            } else if m.file_type().is_symlink() {
                Node::Symlink {
                    target: fs::read_link(&p).unwrap(),
                }
            } else {
                Node::File {
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                    mtime: m.mtime(),
                    size: m.len(),
                    sha256: sha256_file(&p),
                }
            };
            out.insert(rel, node);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Asserts two trees are identical, naming the first difference.
pub fn assert_same_tree(got: &Path, want: &Path) {
    let (g, w) = (tree(got), tree(want));
    for (k, v) in &w {
        assert_eq!(
            g.get(k),
            Some(v),
            "{k}: {} vs {}",
            got.display(),
            want.display()
        );
    }
    for k in g.keys() {
        assert!(w.contains_key(k), "{k} is extra in {}", got.display());
    }
}

pub fn sha256_file(p: &Path) -> String {
    let mut f = File::open(p).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    format!("sha256:{}", hex(&h.finalize()))
}

pub fn sha256_bytes(b: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(b)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Path of a blob in an OCI layout directory, from a `sha256:` digest string.
pub fn oci_blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").expect("sha256 digest"))
}

/// (path, entry type, content) of every member of a tar blob.
pub fn tar_members(bytes: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>)> {
    let mut a = tar::Archive::new(bytes);
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let p = e
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches('/')
                .to_owned();
            let t = e.header().entry_type();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (p, t, data)
        })
        .collect()
}

/// Flips one byte in the middle of `path` (same size: only the digest can notice).
pub fn flip_byte(path: &Path) {
    let mut data = fs::read(path).unwrap();
    let i = data.len() / 2;
    data[i] ^= 0xff;
    fs::write(path, data).unwrap();
}

/// Every regular file under `dir` with its content, sorted, for "nothing changed" assertions.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}
