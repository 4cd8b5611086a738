//! Regression test: a sealed gpusnap checkpoint directory must survive containerd's CRI
//! `CheckpointContainer` path byte for byte, and still pass `validate_for_restore` afterwards.
//!
//! That path is (containerd 2.x):
//!
//! 1. The daemon's task service (`plugins/services/tasks/local.go`, `Checkpoint`) has the shim
//!    checkpoint into a fresh `ctrd-checkpoint` temp dir, then tars it with
//!    `archive.Diff(ctx, "", image)`: continuity's single walk (`addDirChanges`, i.e.
//!    `filepath.Walk` in lexical order, root skipped) feeding `ChangeWriter.HandleChange`, which
//!    writes one entry per path *including directories* (named `sub/`), symlinks (size 0) and
//!    regular files, every name relative to the directory without a leading `/` or `./`.
//! 2. CRI (`internal/cri/server/container_checkpoint_linux.go`, `writeCriuCheckpointData`)
//!    unpacks that tar into `<cpPath>/checkpoint` with, for every entry: refuse a name
//!    containing `..`; `os.Create(filepath.Join(checkpointDirectory, header.Name))`;
//!    `io.CopyN(destFile, tr, header.Size)`. No `MkdirAll` per entry, no entry-type switch.
//!
//! Both steps are reproduced here exactly, so a layout with any subdirectory fails just as it
//! does in containerd (the control case below proves the reproduction is strict enough).

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::layout::{CheckpointLayout, MANIFEST_FILE};
use gpusnap_checkpoint::{begin_checkpoint, validate_for_restore};
use gpusnap_oci_image::{self as image, BuildOptions, LayerRole};
use gpusnap_testkit::fixtures::{make_checkpoint_dir, GPU_EXTENTS};

/// containerd's `archive.Diff(ctx, "", dir)` as a tar stream.
fn containerd_task_checkpoint_tar(dir: &Path) -> Vec<u8> {
    fn walk(b: &mut tar::Builder<Vec<u8>>, root: &Path, dir: &Path) {
        // filepath.Walk visits entries in lexical order, a directory before its contents.
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_owned();
            let m = fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let mut h = tar::Header::new_ustar();
            h.set_mode(m.mode() & 0o7777);
            h.set_mtime(m.mtime() as u64);
            h.set_uid(u64::from(m.uid()));
            h.set_gid(u64::from(m.gid()));
            if ft.is_dir() {
                // HandleChange: "suffix with '/' for directories".
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, format!("{rel}/"), io::empty())
                    .unwrap();
                walk(b, root, &p);
            } else if ft.is_symlink() {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, &rel, fs::read_link(&p).unwrap())
                    .unwrap();
            } else if ft.is_file() {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(m.len());
                b.append_data(&mut h, &rel, File::open(&p).unwrap())
                    .unwrap();
            }
            // Sockets are ignored by HandleChange; nothing else occurs here.
        }
    }
    let mut b = tar::Builder::new(Vec::new());
    walk(&mut b, dir, dir);
    b.into_inner().unwrap()
}

/// Go's `filepath.Join(dir, name)` for a name without `..` (CRI refused those already): the
/// result is cleaned, so `sub/` and `./x` lose their trailing slash and dot.
fn go_join(dir: &Path, name: &[u8]) -> PathBuf {
    let mut out = dir.to_path_buf();
    for part in name.split(|&c| c == b'/') {
        if !part.is_empty() && part != b"." {
            out.push(OsStr::from_bytes(part));
        }
    }
    out
}

/// CRI's `writeCriuCheckpointData`: unpacks `tar` into `<cp_path>/checkpoint` with flat
/// create-and-copy semantics. Returns the checkpoint directory, or the first error as
/// containerd would report it.
fn cri_write_criu_checkpoint_data(tar: &[u8], cp_path: &Path) -> Result<PathBuf, String> {
    let checkpoint_directory = cp_path.join("checkpoint");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&checkpoint_directory)
        .map_err(|e| e.to_string())?;
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let name = entry.path_bytes().into_owned();
        if name.windows(2).any(|w| w == b"..") {
            return Err("found illegal string '..' in checkpoint archive".into());
        }
        let dest = go_join(&checkpoint_directory, &name);
        let mut dest_file = File::create(&dest).map_err(|e| {
            format!(
                "open {}: {e} (entry {:?})",
                dest.display(),
                String::from_utf8_lossy(&name)
            )
        })?;
        let size = entry.header().size().map_err(|e| e.to_string())?;
        let copied =
            io::copy(&mut (&mut entry).take(size), &mut dest_file).map_err(|e| e.to_string())?;
        if copied != size {
            return Err(format!(
                "{}: EOF after {copied} of {size} bytes",
                String::from_utf8_lossy(&name)
            ));
        }
    }
    Ok(checkpoint_directory)
}

/// Regular files directly in `dir`, name → bytes.
fn flat_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            assert!(
                e.file_type().unwrap().is_file(),
                "{} is not a regular file",
                e.path().display()
            );
            (
                e.file_name().into_string().unwrap(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn sealed_checkpoint_survives_containerd_cri_unpacking() {
    let work = tempfile::tempdir().unwrap();
    // What the daemon hands the shim, prepared and sealed the way the shim does it.
    let shim_dir = work.path().join("ctrd-checkpoint");
    begin_checkpoint(&shim_dir).unwrap();
    let manifest = make_checkpoint_dir(&shim_dir);
    assert!(
        CheckpointLayout::new(&shim_dir).gpu_files().unwrap().len() == GPU_EXTENTS.len(),
        "the fixture carries GPU state files"
    );

    let tar = containerd_task_checkpoint_tar(&shim_dir);
    // The flat layout gives containerd's tar nothing but regular files.
    let mut names = Vec::new();
    for e in tar::Archive::new(tar.as_slice()).entries().unwrap() {
        let e = e.unwrap();
        assert_eq!(
            e.header().entry_type(),
            tar::EntryType::Regular,
            "{:?}",
            e.path()
        );
        let name = String::from_utf8(e.path_bytes().into_owned()).unwrap();
        assert!(!name.contains('/') && !name.contains(".."), "{name}");
        names.push(name);
    }
    assert!(names.iter().any(|n| n == MANIFEST_FILE), "{names:?}");
    for extent in GPU_EXTENTS {
        assert!(
            names.iter().any(|n| n == extent),
            "{extent} not in {names:?}"
        );
    }

    let cp_path = work.path().join("cri-cp");
    let unpacked = cri_write_criu_checkpoint_data(&tar, &cp_path).unwrap();
    assert_eq!(flat_files(&unpacked), flat_files(&shim_dir));
    let validated = validate_for_restore(&unpacked).unwrap();
    assert_eq!(validated, manifest);

    // CRI then adds its metadata next to checkpoint/ and tars the whole cpPath the same way;
    // that archive builds into a checkpoint image with the GPU state as extent layers.
    fs::write(cp_path.join("spec.dump"), b"{}").unwrap();
    fs::write(cp_path.join("config.dump"), b"{}").unwrap();
    let archive = work.path().join("checkpoint.tar");
    fs::write(&archive, containerd_task_checkpoint_tar(&cp_path)).unwrap();
    let built = image::build(
        &archive,
        &BuildOptions {
            layout_dir: Some(work.path().join("layout")),
            chunking: None,
            ..Default::default()
        },
    )
    .unwrap();
    let extents: Vec<&str> = built
        .layers
        .iter()
        .filter(|l| l.role == LayerRole::GpuExtent)
        .map(|l| l.gpu_extent.as_deref().unwrap())
        .collect();
    assert_eq!(extents, GPU_EXTENTS);
    assert_eq!(
        built.layers.last().map(|l| l.role),
        Some(LayerRole::GpusnapManifest)
    );
}

#[test]
fn control_a_subdirectory_breaks_containerd_cri_unpacking() {
    // The pre-flat layout (`gpusnap/manifest.json`, `gpusnap/gpu/...`) must fail the
    // reproduction exactly as it failed in containerd; otherwise the test above proves nothing.
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ctrd-checkpoint");
    make_checkpoint_dir(&dir);
    fs::create_dir_all(dir.join("gpusnap/gpu")).unwrap();
    fs::rename(dir.join(MANIFEST_FILE), dir.join("gpusnap/manifest.json")).unwrap();
    fs::rename(dir.join(GPU_EXTENTS[0]), dir.join("gpusnap/gpu/ctx.bin")).unwrap();
    let tar = containerd_task_checkpoint_tar(&dir);
    let err = cri_write_criu_checkpoint_data(&tar, &work.path().join("cri-cp")).unwrap_err();
    // `gpusnap/` became an empty regular file, so creating anything below it fails.
    assert!(err.contains("gpusnap/gpu"), "{err}");
    assert!(fs::metadata(work.path().join("cri-cp/checkpoint/gpusnap"))
        .unwrap()
        .is_file());

    // And a name with `..` anywhere is refused outright.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(0);
    h.set_mode(0o600);
    b.append_data(&mut h, "gpusnap-gpu-a..b", io::empty())
        .unwrap();
    let err = cri_write_criu_checkpoint_data(&b.into_inner().unwrap(), &work.path().join("x"))
        .unwrap_err();
    assert!(err.contains("illegal string '..'"), "{err}");
}
