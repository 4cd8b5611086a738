//! Cleaning a checkpoint directory after a failed checkpoint, and before a new one.
//!
//! # The rule
//!
//! The directory itself is never removed: containerd (or CRI, or the user via `--image-path`)
//! created it and owns it. Inside it we remove, in this order:
//!
//! 1. `gpusnap-manifest.json` (and its temporary files `.gpusnap-manifest.json.tmp.*`), then the
//!    directory is fsynced. This is what makes the checkpoint "not complete", so it goes first:
//!    if scrubbing is interrupted later, nothing left behind can pass
//!    [`crate::validate_for_restore`].
//! 2. the other `gpusnap-*` files (GPU state, `gpusnap-gpu-*`);
//! 3. what CRIU and runc write: `*.img`, `descriptors.json`, `stats-dump`, `irmap-cache`.
//!
//! Only entries directly in the directory are looked at: gpusnap's layout is flat (see
//! [`crate::layout`]) and so is CRIU's; which entry is whose is [`crate::layout::classify`].
//!
//! We keep logs (`dump.log`, `restore.log`, `stats-restore`) because they are how the operator
//! learns why the checkpoint failed, and everything we do not recognise, because the directory
//! may be a user-chosen path holding their own files. Nothing kept can make the directory look
//! complete, since completeness is defined by the manifest alone.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crate::beneath;
use crate::layout::{classify, EntryKind};

/// What scrubbing did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Removed entries.
    pub removed: Vec<PathBuf>,
    /// Entries left in place: logs and files that are not gpusnap's or CRIU's.
    pub kept: Vec<PathBuf>,
}

/// Errors while scrubbing; the path says which entry could not be removed.
#[derive(Debug, thiserror::Error)]
#[error("scrubbing {}: {source}", path.display())]
pub struct ScrubError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn err(path: &Path) -> impl FnOnce(io::Error) -> ScrubError {
    let path = path.to_path_buf();
    move |source| ScrubError { path, source }
}

/// Removes what a checkpoint wrote into `dir` (see the module docs for the rule).
/// A missing `dir` is not an error: there is nothing to scrub.
pub fn scrub_incomplete(dir: &Path) -> Result<ScrubReport, ScrubError> {
    match beneath::open_root(dir) {
        Ok(root) => scrub_at(root.as_fd(), dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(ScrubReport::default()),
        Err(e) => Err(err(dir)(e)),
    }
}

/// [`scrub_incomplete`] of the opened directory `root` (shown as `dir`): every entry is listed
/// and removed through the descriptor, and none is followed (a symlink goes, not its target; a
/// directory of ours would go with what is in it, never through a symlink inside).
fn scrub_at(root: BorrowedFd<'_>, dir: &Path) -> Result<ScrubReport, ScrubError> {
    let mut report = ScrubReport::default();
    let entries: Vec<(EntryKind, OsString)> = beneath::names(root)
        .map_err(err(dir))?
        .into_iter()
        .map(|n| (classify(Path::new(&n)), n))
        .collect();
    let remove = |name: &OsString| {
        beneath::remove_all_at(root, name).map_err(err(&dir.join(name)))?;
        Ok::<_, ScrubError>(dir.join(name))
    };

    // 1. The completeness marker first, durably.
    for (_, name) in entries.iter().filter(|e| e.0 == EntryKind::Manifest) {
        report.removed.push(remove(name)?);
    }
    beneath::sync_dir(root).map_err(err(dir))?;
    // 2. The rest of gpusnap's files (GPU state), 3. CRIU's and runc's.
    for wanted in [
        &[EntryKind::GpusnapData][..],
        &[EntryKind::CriuImage, EntryKind::CriuMetadata],
    ] {
        for (_, name) in entries.iter().filter(|e| wanted.contains(&e.0)) {
            report.removed.push(remove(name)?);
        }
    }
    report.kept.extend(
        entries
            .into_iter()
            .filter(|e| matches!(e.0, EntryKind::Log | EntryKind::Other))
            .map(|e| dir.join(e.1)),
    );
    report.removed.sort();
    report.kept.sort();
    tracing::info!(
        dir = %dir.display(),
        removed = report.removed.len(),
        kept = ?report.kept,
        "scrubbed incomplete checkpoint"
    );
    Ok(report)
}

/// Prepares `dir` for a new checkpoint: creates it (mode 0700, like CRI's `ctrd-checkpoint`) if
/// missing, and scrubs leftovers of an earlier checkpoint so a stale manifest can never seal
/// the new images.
pub fn begin_checkpoint(dir: &Path) -> Result<ScrubReport, ScrubError> {
    match beneath::open_root(dir) {
        Ok(root) => scrub_at(root.as_fd(), dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(err(dir))?;
            Ok(ScrubReport::default())
        }
        Err(e) => Err(err(dir)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{seal_checkpoint, Manifest};
    use crate::validate::{validate_for_restore, RestoreRefusal};
    use gpusnap_criu_bridge::CriuFlags;
    use std::fs;

    #[test]
    fn scrub_removes_ours_and_criu_keeps_logs_and_foreign() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for f in [
            "inventory.img",
            "pages-1.img",
            "descriptors.json",
            "stats-dump",
            "irmap-cache",
        ] {
            fs::write(p.join(f), b"x").unwrap();
        }
        fs::write(p.join("dump.log"), b"Error (criu): boom").unwrap();
        fs::write(p.join("user-notes.txt"), b"mine").unwrap();
        fs::create_dir(p.join("user-dir")).unwrap();
        fs::write(p.join("user-dir/pages-9.img"), b"mine too").unwrap();
        let layout = crate::layout::CheckpointLayout::new(p);
        fs::write(layout.gpu_file("device-0000.bin"), b"x").unwrap();
        fs::write(layout.gpu_file("device-0001.bin"), b"x").unwrap();
        seal_checkpoint(p, Manifest::new("c", CriuFlags::default())).unwrap();
        // A temporary manifest left by an interrupted write.
        fs::write(p.join(".gpusnap-manifest.json.tmp.1"), b"{").unwrap();

        let report = scrub_incomplete(p).unwrap();
        assert!(p.exists(), "the directory itself stays");
        let mut left: Vec<String> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["dump.log", "user-dir", "user-notes.txt"]);
        assert!(p.join("user-dir/pages-9.img").exists());
        assert_eq!(
            report.kept,
            [
                p.join("dump.log"),
                p.join("user-dir"),
                p.join("user-notes.txt")
            ]
        );
        let mut removed = report.removed.clone();
        removed.sort();
        assert_eq!(
            removed,
            [
                ".gpusnap-manifest.json.tmp.1",
                "descriptors.json",
                "gpusnap-gpu-device-0000.bin",
                "gpusnap-gpu-device-0001.bin",
                "gpusnap-manifest.json",
                "inventory.img",
                "irmap-cache",
                "pages-1.img",
                "stats-dump",
            ]
            .map(|n| p.join(n))
        );
        assert!(matches!(
            validate_for_restore(p),
            Err(RestoreRefusal::ManifestMissing { .. })
        ));
    }

    /// A symlink named like a checkpoint file goes, its target stays; a directory named like
    /// one is emptied through descriptors, never through a symlink inside it.
    #[test]
    fn scrub_removes_links_not_their_targets() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("ck");
        let outside = top.path().join("outside");
        fs::create_dir_all(dir.join("pages-2.img")).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"host").unwrap();
        std::os::unix::fs::symlink(outside.join("keep"), dir.join("pages-1.img")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("gpusnap-manifest.json")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("pages-2.img/inner")).unwrap();
        scrub_incomplete(&dir).unwrap();
        assert_eq!(fs::read(outside.join("keep")).unwrap(), b"host");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[test]
    fn scrub_missing_dir_is_noop() {
        let dir = tempfile::tempdir().unwrap();
        let report = scrub_incomplete(&dir.path().join("nope")).unwrap();
        assert_eq!(report, ScrubReport::default());
    }

    #[test]
    fn begin_creates_private_dir_or_clears_stale_manifest() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ctrd-checkpoint");
        begin_checkpoint(&dir).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        fs::write(dir.join("pages-1.img"), b"old").unwrap();
        seal_checkpoint(&dir, Manifest::new("c", CriuFlags::default())).unwrap();
        let report = begin_checkpoint(&dir).unwrap();
        assert!(report.removed.contains(&dir.join("gpusnap-manifest.json")));
        assert!(!dir.join("pages-1.img").exists());
    }
}
