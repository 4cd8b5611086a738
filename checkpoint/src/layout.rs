//! Where gpusnap's files live inside a checkpoint directory, and which files are whose.
//!
//! The checkpoint directory is the one containerd hands the shim. CRIU writes `*.img`,
//! `stats-dump`, `irmap-cache` and its logs there, runc adds `descriptors.json`, and CRI later
//! copies its own `*.dump`, `status` and `container.log` next to the archive's `checkpoint/`
//! (containerd `internal/cri/server/container_checkpoint_linux.go`). Only this directory survives into the checkpoint image, so gpusnap's
//! files must sit inside it under names none of those tools uses: every one starts with
//! [`GPUSNAP_PREFIX`] (`gpusnap-`).
//!
//! ```text
//! <checkpoint dir>/
//!   *.img, stats-dump, descriptors.json   CRIU / runc
//!   dump.log, restore.log                 CRIU logs (when no separate work dir)
//!   gpusnap-gpu-<name>                    GPU state files (cuda crate), e.g. gpusnap-gpu-device-0000.bin
//!   gpusnap-writable-layer.jsonl          the container's writable layer at the dump (its digest
//!                                         is in the manifest)
//!   gpusnap-manifest.json                 completeness marker, written last
//!   .gpusnap-manifest.json.tmp.<pid>.<n>  the manifest while it is written (never survives)
//!   gpusnap-manifest.json.sig             the directory's signature of the manifest
//!   gpusnap-origin.json                   where a pulled checkpoint came from (written by a
//!                                         pull after sealing; not checkpoint data)
//! ```
//!
//! Every file gpusnap reads back from here may come from elsewhere (copied, unpacked, pulled),
//! so each has a size cap (`*_MAX_BYTES`) and is read through [`read_capped`] or
//! [`read_json_capped`]: beneath the directory, through no symlink, never past its cap.
//!
//! # The checkpoint root
//!
//! Checkpoints a pod can restore by name (`gpusnap.io/restore-from`) are directories directly
//! under `restore.checkpoint_root`. Names starting with [`ROOT_RESERVED_PREFIX`] are gpusnap's
//! own bookkeeping there (`.gpusnap-node`, the node's records; `.gpusnap-volumes`, the volume
//! copies), never a checkpoint: [`is_checkpoint_name`] is the one rule every door applies.
//!
//! # Why the directory is flat
//!
//! The directory must not contain subdirectories. containerd's daemon tars it for the CRI
//! `CheckpointContainer` path (`archive.Diff("", dir)`: every entry below the root, directories
//! included, named relative to it), and CRI unpacks that tar into the archive's `checkpoint/`
//! with `writeCriuCheckpointData` (`internal/cri/server/container_checkpoint_linux.go`), which
//! for every entry does `os.Create(filepath.Join(checkpointDirectory, header.Name))` and copies
//! `header.Size` bytes. It never creates directories — a directory entry or a file below one
//! fails the whole checkpoint — and it refuses any name containing `..`. So every gpusnap file
//! is a plain file directly in the checkpoint directory, and no name gpusnap chooses contains
//! `..` (see [`is_valid_gpu_name`]).

use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Component, Path, PathBuf};

use serde::de::DeserializeOwned;

/// Prefix of every file gpusnap writes into a checkpoint directory. No other tool writing there
/// (CRIU, runc, containerd's CRI) uses it.
pub const GPUSNAP_PREFIX: &str = "gpusnap-";
/// The manifest, directly in the checkpoint directory.
pub const MANIFEST_FILE: &str = "gpusnap-manifest.json";
/// Prefix of the manifest's temporary file (`.gpusnap-manifest.json.tmp.<pid>.<n>`); dot-prefixed
/// so it is never mistaken for the real one.
pub const MANIFEST_TMP_PREFIX: &str = ".gpusnap-manifest.json.tmp";
/// Prefix of GPU state files: `gpusnap-gpu-<name>` (see [`CheckpointLayout::gpu_file`]).
pub const GPU_FILE_PREFIX: &str = "gpusnap-gpu-";
/// Longest `<name>` of a GPU state file: the file name must stay within `NAME_MAX` (255).
pub const MAX_GPU_NAME_LEN: usize = 255 - GPU_FILE_PREFIX.len();
/// The directory's own cosign-format signature of the manifest, beside it.
pub const SIGNATURE_FILE: &str = "gpusnap-manifest.json.sig";
/// The record of the writable layer, beside the manifest (outside the inventory: its digest is
/// in the manifest).
pub const LISTING_FILE: &str = "gpusnap-writable-layer.jsonl";
/// Prefix of the listing's temporary name while it is written.
pub const LISTING_TMP_PREFIX: &str = ".gpusnap-writable-layer.jsonl.tmp";
/// Where a pulled or extracted checkpoint came from, at the root of the checkpoint directory.
pub const ORIGIN_FILE: &str = "gpusnap-origin.json";

/// The largest manifest read: one for a terabyte of images, digested in 64 MiB chunks, is
/// about 2 MiB.
pub const MANIFEST_MAX_BYTES: u64 = 16 << 20;
/// A base64 signature is at most a few hundred bytes (RSA-4096: 684); anything larger is not one.
pub const SIGNATURE_MAX_BYTES: u64 = 4 << 10;
/// The largest writable-layer listing read back (4 Mi entries of a few hundred bytes).
pub const LISTING_MAX_BYTES: u64 = 2 << 30;
/// An origin record is a few hundred bytes; one larger than this is not a record.
pub const ORIGIN_MAX_BYTES: u64 = 64 << 10;
/// A node record (under [`NODE_RECORDS_DIR`]) is a few hundred bytes.
pub const NODE_RECORD_MAX_BYTES: u64 = 64 << 10;

/// Prefix of the names gpusnap keeps for itself directly under the checkpoint root; no
/// checkpoint has one.
pub const ROOT_RESERVED_PREFIX: &str = ".gpusnap-";
/// The node's records of the checkpoints it sealed or adopted, under the checkpoint root
/// ([`crate::node_origin`]).
pub const NODE_RECORDS_DIR: &str = ".gpusnap-node";
/// Longest checkpoint name: one directory entry (`NAME_MAX`).
pub const MAX_CHECKPOINT_NAME_LEN: usize = 255;

/// Whether `name` can be a checkpoint directly under the checkpoint root, as a pod annotation
/// (`gpusnap.io/restore-from`) or `gpusnap image pull --extract NAME` names it: 1 to
/// [`MAX_CHECKPOINT_NAME_LEN`] ASCII letters, digits, `.`, `_` or `-`; not `.`, nothing with
/// `..` (so never a way out of the root, and no `/`), and nothing starting with
/// [`ROOT_RESERVED_PREFIX`] (gpusnap's own directories there).
pub fn is_checkpoint_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_CHECKPOINT_NAME_LEN
        && name != "."
        && !name.contains("..")
        && !name.starts_with(ROOT_RESERVED_PREFIX)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `name` may be the `<name>` of a GPU state file `gpusnap-gpu-<name>`: 1 to
/// [`MAX_GPU_NAME_LEN`] ASCII letters, digits, `.`, `_` or `-`, and no `..` (containerd's CRI
/// refuses a checkpoint with any name containing `..`). So a valid name never has a `/`, a NUL
/// or a non-UTF-8 byte, and the file stays directly in the checkpoint directory.
pub fn is_valid_gpu_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_GPU_NAME_LEN
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The `<name>` of a GPU state file name (`gpusnap-gpu-<name>` → `<name>`), if it is one.
pub fn gpu_name(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix(GPU_FILE_PREFIX)
        .filter(|n| is_valid_gpu_name(n))
}

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

    /// `<dir>/gpusnap-manifest.json`.
    pub fn manifest_path(&self) -> PathBuf {
        self.root.join(MANIFEST_FILE)
    }

    /// `<dir>/gpusnap-gpu-<name>`, where the cuda crate writes one piece of GPU state.
    ///
    /// # Panics
    ///
    /// If `name` is not [valid](is_valid_gpu_name). Names are chosen by gpusnap's own code
    /// (`device-0000.bin`, ...), so an invalid one is a bug, not an input error; check names
    /// derived from anything else with [`is_valid_gpu_name`] or use [`Self::try_gpu_file`].
    pub fn gpu_file(&self, name: &str) -> PathBuf {
        self.try_gpu_file(name).unwrap_or_else(|| {
            panic!(
                "invalid GPU state file name {name:?}: use 1 to {MAX_GPU_NAME_LEN} ASCII \
                 letters, digits, '.', '_' or '-', without '..'"
            )
        })
    }

    /// Like [`Self::gpu_file`], `None` for an invalid name.
    pub fn try_gpu_file(&self, name: &str) -> Option<PathBuf> {
        is_valid_gpu_name(name).then(|| self.root.join(format!("{GPU_FILE_PREFIX}{name}")))
    }

    /// The GPU state files present, sorted by name: regular files (symlinks are not followed)
    /// directly in the directory whose name is `gpusnap-gpu-<valid name>`, listed and looked at
    /// through a descriptor of the directory. A missing directory has none.
    pub fn gpu_files(&self) -> io::Result<Vec<PathBuf>> {
        use rustix::fs::FileType;
        use std::os::fd::AsFd;
        let root = match crate::beneath::open_root(&self.root) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for name in crate::beneath::names(root.as_fd())? {
            if name.to_str().and_then(gpu_name).is_none() {
                continue;
            }
            let regular = crate::beneath::stat_at(root.as_fd(), &name)?
                .is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
            if regular {
                out.push(self.root.join(name));
            }
        }
        Ok(out)
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
    /// `gpusnap-manifest.json`, its temporary files `.gpusnap-manifest.json.tmp.*`, its
    /// signature `gpusnap-manifest.json.sig` (written after the seal) or the writable layer's
    /// listing `gpusnap-writable-layer.jsonl` (whose digest the manifest holds): outside the
    /// inventory, and gone when the manifest goes.
    Manifest,
    /// Any other `gpusnap-*` file: GPU state (`gpusnap-gpu-*`).
    GpusnapData,
    /// Not ours, not CRIU's: left alone by scrubbing. Includes everything below a
    /// subdirectory, since neither gpusnap nor CRIU writes one.
    Other,
}

/// Classifies a path relative to the checkpoint directory.
pub fn classify(rel: &Path) -> EntryKind {
    let mut components = rel.components();
    let (Some(Component::Normal(first)), None) = (components.next(), components.next()) else {
        // The layout is flat (module docs): a nested path belongs to someone else.
        return EntryKind::Other;
    };
    let name = first.to_string_lossy();
    match name.as_ref() {
        MANIFEST_FILE | SIGNATURE_FILE | LISTING_FILE => EntryKind::Manifest,
        n if n.starts_with(MANIFEST_TMP_PREFIX) => EntryKind::Manifest,
        // The listing while it is written (`beneath::write_atomically`'s temporary name):
        // hashed with the rest it would be listed and then missing.
        n if n.starts_with(LISTING_TMP_PREFIX) => EntryKind::Manifest,
        // Written by a pull beside what it extracted (inside the checkpoint directory for an
        // image built from one), after sealing: not checkpoint data.
        ORIGIN_FILE => EntryKind::Other,
        n if n.starts_with(GPUSNAP_PREFIX) => EntryKind::GpusnapData,
        "descriptors.json" | "stats-dump" | "irmap-cache" => EntryKind::CriuMetadata,
        "stats-restore" => EntryKind::Log,
        n if n.ends_with(".img") => EntryKind::CriuImage,
        n if n.ends_with(".log") => EntryKind::Log,
        _ => EntryKind::Other,
    }
}

/// Whether `rel` (relative to the checkpoint directory) is a GPU state file `gpusnap-gpu-<name>`.
pub fn is_gpu_file(rel: &Path) -> bool {
    classify(rel) == EntryKind::GpusnapData && rel.to_str().and_then(gpu_name).is_some()
}

/// Why a capped read of a file gpusnap reads back failed. The callers turn it into their own
/// refusal, naming the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CappedReadError {
    #[error("it does not exist")]
    Missing,
    #[error("it is a symlink")]
    Symlink,
    #[error("larger than {cap} bytes")]
    TooLarge { cap: u64 },
    #[error("invalid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error(transparent)]
    Io(io::Error),
}

impl From<io::Error> for CappedReadError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::NotFound {
            CappedReadError::Missing
        } else if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
            // openat2 refuses a symlink at the last component with ELOOP.
            CappedReadError::Symlink
        } else if let Some(t) = crate::beneath::too_large(&e) {
            CappedReadError::TooLarge { cap: t.cap }
        } else {
            CappedReadError::Io(e)
        }
    }
}

/// The bytes of the regular file `name` in the opened directory `dir` (beneath it, no symlink
/// followed), refused unread when over `cap` bytes ([`crate::beneath::read_capped`]).
pub fn read_capped(dir: BorrowedFd<'_>, name: &str, cap: u64) -> Result<Vec<u8>, CappedReadError> {
    Ok(crate::beneath::read_capped(dir, Path::new(name), cap)?)
}

/// The JSON document `name` in the opened directory `dir`, read as [`read_capped`] reads it.
/// Every JSON file gpusnap reads back from a checkpoint directory, the checkpoint root or an
/// archive member goes through here or [`read_json_capped_from`].
pub fn read_json_capped<T: DeserializeOwned>(
    dir: BorrowedFd<'_>,
    name: &str,
    cap: u64,
) -> Result<T, CappedReadError> {
    serde_json::from_slice(&read_capped(dir, name, cap)?).map_err(CappedReadError::Json)
}

/// [`read_capped`] of a reader already open (an opened file, an archive member) that declares
/// `size` bytes: refused unread when `size` is over `cap`, and when it gives more whatever
/// `size` said.
pub fn read_capped_from(
    r: impl io::Read,
    name: &str,
    size: u64,
    cap: u64,
) -> Result<Vec<u8>, CappedReadError> {
    Ok(crate::beneath::read_file_capped_from(r, name, size, cap)?)
}

/// [`read_json_capped`] of a reader already open ([`read_capped_from`]).
pub fn read_json_capped_from<T: DeserializeOwned>(
    r: impl io::Read,
    name: &str,
    size: u64,
    cap: u64,
) -> Result<T, CappedReadError> {
    serde_json::from_slice(&read_capped_from(r, name, size, cap)?).map_err(CappedReadError::Json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn paths() {
        let l = CheckpointLayout::new("/cp");
        assert_eq!(l.manifest_path(), Path::new("/cp/gpusnap-manifest.json"));
        assert_eq!(
            l.gpu_file("device-0000.bin"),
            Path::new("/cp/gpusnap-gpu-device-0000.bin")
        );
        // Everything gpusnap writes is directly in the directory.
        for p in [l.manifest_path(), l.gpu_file("x")] {
            assert_eq!(p.parent(), Some(Path::new("/cp")), "{}", p.display());
        }
    }

    #[test]
    fn gpu_names() {
        for ok in [
            "device-0000.bin",
            "ctx_1.2",
            "a",
            "A-b_c.d",
            &"x".repeat(243),
        ] {
            assert!(is_valid_gpu_name(ok), "{ok}");
        }
        for bad in [
            "",
            "..",
            "a..b",
            "../x",
            "sub/x",
            "/abs",
            "sp ace",
            "nul\0",
            "é",
            &"x".repeat(244),
        ] {
            assert!(!is_valid_gpu_name(bad), "{bad:?}");
            assert!(CheckpointLayout::new("/cp").try_gpu_file(bad).is_none());
        }
        assert_eq!(
            gpu_name("gpusnap-gpu-device-0000.bin"),
            Some("device-0000.bin")
        );
        assert_eq!(gpu_name("gpusnap-gpu-"), None);
        assert_eq!(gpu_name("gpusnap-manifest.json"), None);
        assert_eq!(gpu_name("pages-1.img"), None);
    }

    #[test]
    #[should_panic(expected = "invalid GPU state file name")]
    fn gpu_file_refuses_dot_dot() {
        CheckpointLayout::new("/cp").gpu_file("a..b");
    }

    #[test]
    fn lists_gpu_files() {
        let dir = tempfile::tempdir().unwrap();
        let l = CheckpointLayout::new(dir.path());
        assert!(l.gpu_files().unwrap().is_empty());
        for n in ["device-0001.bin", "device-0000.bin"] {
            fs::write(l.gpu_file(n), b"x").unwrap();
        }
        fs::write(dir.path().join("gpusnap-manifest.json"), b"{}").unwrap();
        fs::write(dir.path().join("pages-1.img"), b"x").unwrap();
        fs::write(dir.path().join("gpusnap-gpu-"), b"x").unwrap();
        fs::create_dir(dir.path().join("gpusnap-gpu-adir")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("gpusnap-gpu-link")).unwrap();
        assert_eq!(
            l.gpu_files().unwrap(),
            [
                dir.path().join("gpusnap-gpu-device-0000.bin"),
                dir.path().join("gpusnap-gpu-device-0001.bin")
            ]
        );
        assert!(CheckpointLayout::new(dir.path().join("missing"))
            .gpu_files()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn checkpoint_names() {
        for ok in [
            "a",
            "job-1",
            "job_1.v2",
            ".hidden",
            "a.b",
            "A-Z_0.9",
            ".gpusnap",
            "gpusnap-node",
            &"x".repeat(MAX_CHECKPOINT_NAME_LEN),
        ] {
            assert!(is_checkpoint_name(ok), "{ok:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a..b",
            "../x",
            "x/..",
            "a/b",
            "/abs",
            "a/",
            // gpusnap's own directories under the root, and anything it may add there.
            NODE_RECORDS_DIR,
            ".gpusnap-node",
            ".gpusnap-volumes",
            ".gpusnap-node-x",
            ".gpusnap-",
            "sp ace",
            "tab\t",
            "nul\0",
            "new\nline",
            "é",
            "a:b",
            "*",
            &"x".repeat(MAX_CHECKPOINT_NAME_LEN + 1),
        ] {
            assert!(!is_checkpoint_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn capped_reads() {
        use std::os::fd::AsFd;
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Doc {
            a: u32,
        }
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("ok.json"), br#"{"a":1}"#).unwrap();
        fs::write(dir.path().join("bad.json"), b"{").unwrap();
        fs::write(dir.path().join("big.json"), vec![b' '; 65]).unwrap();
        std::os::unix::fs::symlink("ok.json", dir.path().join("link.json")).unwrap();
        let root = crate::beneath::open_root(dir.path()).unwrap();
        let read = |name| read_json_capped::<Doc>(root.as_fd(), name, 64);
        assert_eq!(read("ok.json").unwrap(), Doc { a: 1 });
        assert!(matches!(read("bad.json"), Err(CappedReadError::Json(_))));
        assert!(matches!(
            read("big.json"),
            Err(CappedReadError::TooLarge { cap: 64 })
        ));
        assert!(matches!(read("gone.json"), Err(CappedReadError::Missing)));
        assert!(matches!(read("link.json"), Err(CappedReadError::Symlink)));
        assert!(read("../ok.json").is_err());
        // A reader that gives more than it declared is cut at the cap.
        let r = read_json_capped_from::<Doc>(&br#"{"a":1}    "#[..], "m", 3, 8);
        assert!(matches!(r, Err(CappedReadError::TooLarge { cap: 8 })));
        let r = read_json_capped_from::<Doc>(&br#"{"a":2}"#[..], "m", 7, 8);
        assert_eq!(r.unwrap(), Doc { a: 2 });
    }

    #[test]
    fn classification() {
        let c = |p: &str| classify(Path::new(p));
        assert_eq!(c("pages-1.img"), EntryKind::CriuImage);
        assert_eq!(c("inventory.img"), EntryKind::CriuImage);
        assert_eq!(c("descriptors.json"), EntryKind::CriuMetadata);
        assert_eq!(c("stats-dump"), EntryKind::CriuMetadata);
        assert_eq!(c("irmap-cache"), EntryKind::CriuMetadata);
        assert_eq!(c("dump.log"), EntryKind::Log);
        assert_eq!(c("restore.log"), EntryKind::Log);
        assert_eq!(c("stats-restore"), EntryKind::Log);
        assert_eq!(c("gpusnap-manifest.json"), EntryKind::Manifest);
        assert_eq!(c(".gpusnap-manifest.json.tmp.42"), EntryKind::Manifest);
        assert_eq!(c("gpusnap-manifest.json.sig"), EntryKind::Manifest);
        assert_eq!(c("gpusnap-writable-layer.jsonl"), EntryKind::Manifest);
        assert_eq!(
            c(".gpusnap-writable-layer.jsonl.tmp.42.0"),
            EntryKind::Manifest
        );
        assert_eq!(c("gpusnap-gpu-ctx-1.bin"), EntryKind::GpusnapData);
        assert_eq!(c("gpusnap-gpu-device-0000.bin"), EntryKind::GpusnapData);
        // Ours by prefix even if a later release adds it: never CRIU's, never the user's.
        assert_eq!(c("gpusnap-something.img"), EntryKind::GpusnapData);
        assert_eq!(c("config.dump"), EntryKind::Other);
        assert_eq!(c("sub/pages-1.img"), EntryKind::Other);
        // The pre-flat layout's paths are nobody's now.
        assert_eq!(c("gpusnap/manifest.json"), EntryKind::Other);
        assert_eq!(c("gpusnap/gpu/ctx-1.bin"), EntryKind::Other);
        assert_eq!(c("gpusnap"), EntryKind::Other);
        assert_eq!(c("../pages-1.img"), EntryKind::Other);
        assert_eq!(c(""), EntryKind::Other);

        assert!(is_gpu_file(Path::new("gpusnap-gpu-device-0000.bin")));
        assert!(!is_gpu_file(Path::new("gpusnap-manifest.json")));
        assert!(!is_gpu_file(Path::new("gpusnap-other")));
        assert!(!is_gpu_file(Path::new("x/gpusnap-gpu-a")));
    }
}
