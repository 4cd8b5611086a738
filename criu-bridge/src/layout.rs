//! Where gpusnap's files live inside a checkpoint directory, and which files are whose.
//!
//! The checkpoint directory is the one containerd hands the shim. CRIU writes `*.img`,
//! `stats-dump` and its logs there, runc adds `descriptors.json`, and CRI later copies its own
//! `*.dump` files next to the archive's `checkpoint/` (reference §10, §11). Only this directory
//! survives into the checkpoint image, so gpusnap's files must sit inside it under a name none of
//! those tools uses: a `gpusnap/` subdirectory (CRIU image names are flat files).
//!
//! ```text
//! <checkpoint dir>/
//!   *.img, stats-dump, descriptors.json   CRIU / runc
//!   dump.log, restore.log                 CRIU logs (when no separate work dir)
//!   gpusnap/manifest.json                 completeness marker, written last
//!   gpusnap/gpu/...                       GPU state (cuda crate)
//! ```

use std::path::{Path, PathBuf};

/// Subdirectory owned by gpusnap.
pub const GPUSNAP_DIR: &str = "gpusnap";
/// Manifest file name inside [`GPUSNAP_DIR`].
pub const MANIFEST_FILE: &str = "manifest.json";
/// GPU state directory inside [`GPUSNAP_DIR`].
pub const GPU_DIR: &str = "gpu";
/// Prefix of the manifest's temporary file; dot-prefixed so it is never mistaken for the real one.
pub const MANIFEST_TMP_PREFIX: &str = ".manifest.json.tmp";

/// Paths inside one checkpoint directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointLayout {
    root: PathBuf,
}

impl CheckpointLayout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CheckpointLayout { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn gpusnap_dir(&self) -> PathBuf {
        self.root.join(GPUSNAP_DIR)
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.gpusnap_dir().join(MANIFEST_FILE)
    }

    /// Directory for GPU state; the cuda crate creates and fills it.
    pub fn gpu_dir(&self) -> PathBuf {
        self.gpusnap_dir().join(GPU_DIR)
    }

    pub(crate) fn manifest_tmp_path(&self) -> PathBuf {
        self.gpusnap_dir()
            .join(format!("{MANIFEST_TMP_PREFIX}.{}", std::process::id()))
    }
}

/// Who wrote a file in the checkpoint directory, by name (relative path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A CRIU image: `*.img`.
    CriuImage,
    /// Other restore inputs CRIU or runc write into the image dir: `descriptors.json` (runc
    /// needs it to reconnect stdio), `stats-dump`, `irmap-cache`.
    CriuMetadata,
    /// `dump.log`, `restore.log`, `stats-restore` and other `*.log`: written by a dump *or a
    /// restore*, so they may change after the manifest is sealed.
    Log,
    /// `gpusnap/manifest.json` or its temporary file.
    Manifest,
    /// Anything else under `gpusnap/` (GPU state).
    GpusnapData,
    /// Not ours, not CRIU's: left alone by scrubbing.
    Other,
}

/// Classifies a path relative to the checkpoint directory.
pub fn classify(rel: &Path) -> EntryKind {
    let mut components = rel.components();
    let first = components
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    let rest: PathBuf = components.collect();
    if first == GPUSNAP_DIR {
        let name = rest.to_string_lossy();
        return if name == MANIFEST_FILE || name.starts_with(MANIFEST_TMP_PREFIX) {
            EntryKind::Manifest
        } else {
            EntryKind::GpusnapData
        };
    }
    if !rest.as_os_str().is_empty() {
        // CRIU image dirs are flat; a nested path outside gpusnap/ belongs to someone else.
        return EntryKind::Other;
    }
    match first.as_str() {
        "descriptors.json" | "stats-dump" | "irmap-cache" => EntryKind::CriuMetadata,
        "stats-restore" => EntryKind::Log,
        n if n.ends_with(".img") => EntryKind::CriuImage,
        n if n.ends_with(".log") => EntryKind::Log,
        _ => EntryKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let l = CheckpointLayout::new("/cp");
        assert_eq!(l.manifest_path(), Path::new("/cp/gpusnap/manifest.json"));
        assert_eq!(l.gpu_dir(), Path::new("/cp/gpusnap/gpu"));
        // Path::starts_with compares whole components, so compare text.
        assert!(l
            .manifest_tmp_path()
            .to_string_lossy()
            .starts_with("/cp/gpusnap/.manifest.json.tmp."));
    }

    #[test]
    fn classification() {
        let c = |p: &str| classify(Path::new(p));
        assert_eq!(c("pages-1.img"), EntryKind::CriuImage);
        assert_eq!(c("inventory.img"), EntryKind::CriuImage);
        assert_eq!(c("descriptors.json"), EntryKind::CriuMetadata);
        assert_eq!(c("stats-dump"), EntryKind::CriuMetadata);
        assert_eq!(c("dump.log"), EntryKind::Log);
        assert_eq!(c("restore.log"), EntryKind::Log);
        assert_eq!(c("stats-restore"), EntryKind::Log);
        assert_eq!(c("gpusnap/manifest.json"), EntryKind::Manifest);
        assert_eq!(c("gpusnap/.manifest.json.tmp.42"), EntryKind::Manifest);
        assert_eq!(c("gpusnap/gpu/ctx-1.bin"), EntryKind::GpusnapData);
        assert_eq!(c("config.dump"), EntryKind::Other);
        assert_eq!(c("sub/pages-1.img"), EntryKind::Other);
    }
}
