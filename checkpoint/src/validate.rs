//! Deciding, before any CRIU work, whether a checkpoint directory may be restored.
//!
//! Order matters: the manifest is read first (cheap, and its absence is the most common
//! problem), then host compatibility, then file presence and sizes for *all* files (a stat each,
//! so a truncated copy is refused without hashing gigabytes), and only then the digests.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::FileType;

use crate::inventory::{hash_open_files, VerifyFailure};
use crate::layout::{classify, CappedReadError, CheckpointLayout, EntryKind, MANIFEST_FILE};
// Re-exported where they used to be defined, for callers not yet moved to `layout`
// (transaction/src/volume.rs); new code imports them from `layout`.
use crate::layout::MANIFEST_MAX_BYTES;
use crate::manifest::{Manifest, MANIFEST_FORMAT_VERSION, MANIFEST_KIND};

/// Why a checkpoint directory is not restored. Every message names the file involved and what
/// the operator can do about it.
#[derive(Debug, thiserror::Error)]
pub enum RestoreRefusal {
    #[error(
        "not a complete gpusnap checkpoint: {} is missing — the checkpoint was interrupted or \
         made by another runtime; take a new checkpoint with gpusnap",
        manifest.display()
    )]
    ManifestMissing { manifest: PathBuf },
    #[error(
        "cannot use {}: {reason}; the checkpoint is damaged — copy it again from its source or \
         take a new one",
        manifest.display()
    )]
    ManifestUnreadable { manifest: PathBuf, reason: String },
    #[error(
        "{} has kind {kind:?}, not {MANIFEST_KIND:?}: this directory was not made by gpusnap",
        manifest.display()
    )]
    NotGpusnap { manifest: PathBuf, kind: String },
    #[error(
        "{} has format_version {found}, but this gpusnap reads only format_version {supported}: \
         restore it with a gpusnap release that reads format_version {found}{}, or checkpoint \
         the workload again with this one",
        manifest.display(),
        made_by.as_ref().map(|v| format!(" (it was made by {v})")).unwrap_or_default()
    )]
    UnsupportedFormat {
        manifest: PathBuf,
        found: u64,
        supported: u32,
        made_by: Option<String>,
    },
    #[error(
        "checkpoint in {} was taken on {checkpoint_arch}, but this host is {host_arch}: restore \
         it on a {checkpoint_arch} node",
        dir.display()
    )]
    ArchMismatch {
        dir: PathBuf,
        checkpoint_arch: String,
        host_arch: String,
    },
    #[error(
        "manifest lists {entry:?}, which is not a plain file name in the (flat) checkpoint directory; the \
         manifest was tampered with — do not restore this checkpoint"
    )]
    UnsafePath { entry: String },
    #[error(
        "{} is missing ({expected} bytes expected): the checkpoint was copied incompletely — copy \
         it again from its source",
        file.display()
    )]
    FileMissing { file: PathBuf, expected: u64 },
    #[error(
        "{} is read from the image's chunks, but the checkpoint directory also holds it: the \
         copy was altered — remove it and restore again",
        file.display()
    )]
    InPlaceAlsoPresent { file: PathBuf },
    #[error(
        "{entry} is not a file that can be read from the image's chunks (only CRIU page \
         images can)"
    )]
    InPlaceNotPages { entry: String },
    #[error(
        "{} is not a regular file: the checkpoint was altered after it was taken — copy it again \
         from its source",
        file.display()
    )]
    NotRegular { file: PathBuf },
    #[error(
        "{} is {found} bytes but the manifest says {expected}: the file was {} — copy the \
         checkpoint again from its source",
        file.display(),
        if found < expected { "truncated" } else { "modified" }
    )]
    SizeMismatch {
        file: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error(
        "{} is corrupted: the BLAKE3 digest of bytes {offset}..{end} differs from the manifest — copy the \
         checkpoint again from its source or take a new one",
        file.display()
    )]
    DigestMismatch {
        file: PathBuf,
        offset: u64,
        end: u64,
    },
    #[error(
        "{} is not listed in the manifest: the directory mixes files of two checkpoints — \
         restore from a clean copy",
        file.display()
    )]
    UnexpectedImage { file: PathBuf },
    #[error(
        "{} is {what} — not a regular file with one link, nor a directory: runc and CRIU open \
         the files of a checkpoint directory by name, following symlinks — remove it if it \
         does not belong there, else copy the checkpoint again from its source (`gpusnap image \
         pull --extract`, `ctr`/`podman` import)",
        entry.display()
    )]
    NotPlain { entry: PathBuf, what: String },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How thoroughly to verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidateOptions {
    /// Re-hash every file. Without it only presence and sizes are checked, which catches
    /// interrupted copies but not bit flips.
    pub verify_digests: bool,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions {
            verify_digests: true,
        }
    }
}

/// Full validation: manifest, architecture, presence, sizes and digests.
pub fn validate_for_restore(dir: &Path) -> Result<Manifest, RestoreRefusal> {
    validate_for_restore_with(dir, ValidateOptions::default())
}

/// Validation with explicit [`ValidateOptions`].
pub fn validate_for_restore_with(
    dir: &Path,
    opts: ValidateOptions,
) -> Result<Manifest, RestoreRefusal> {
    let root = crate::beneath::open_root(dir).map_err(|source| RestoreRefusal::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    validate_for_restore_at(root.as_fd(), dir, opts)
}

/// [`validate_for_restore_with`] of the checkpoint directory already opened as `root` (shown
/// as `dir`), for a caller that reached it beneath another untrusted directory.
pub fn validate_for_restore_at(
    root: BorrowedFd<'_>,
    dir: &Path,
    opts: ValidateOptions,
) -> Result<Manifest, RestoreRefusal> {
    validate_deferring(root, dir, opts, &[])
}

/// [`validate_for_restore`] of a checkpoint directory that lacks the CRIU page images named
/// `in_place`: the restore reads those from the image's chunks where they lie, each piece
/// checked against this manifest as it is read (`chunks::InPlaceFile`). They must be listed
/// in the manifest, be page images, and be absent from the directory (else which one is
/// restored would be ambiguous); every other file is verified as always.
pub fn validate_for_restore_in_place(
    dir: &Path,
    in_place: &[String],
) -> Result<Manifest, RestoreRefusal> {
    let root = crate::beneath::open_root(dir).map_err(|source| RestoreRefusal::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    validate_deferring(root.as_fd(), dir, ValidateOptions::default(), in_place)
}

fn validate_deferring(
    root: BorrowedFd<'_>,
    dir: &Path,
    opts: ValidateOptions,
    in_place: &[String],
) -> Result<Manifest, RestoreRefusal> {
    let started = std::time::Instant::now();
    let manifest = read_manifest_at(root, dir)?;
    let host_arch = gpusnap_criu_bridge::versions::host_arch();
    if manifest.host.arch != host_arch {
        return Err(RestoreRefusal::ArchMismatch {
            dir: dir.to_path_buf(),
            checkpoint_arch: manifest.host.arch.clone(),
            host_arch: host_arch.to_owned(),
        });
    }
    if let Ok(kernel) = gpusnap_criu_bridge::versions::kernel_release() {
        if kernel != manifest.host.kernel_release {
            // CRIU restores across kernel versions as long as features match; note it only.
            tracing::info!(
                checkpoint_kernel = %manifest.host.kernel_release,
                host_kernel = %kernel,
                "restoring on a different kernel release"
            );
        }
    }
    check_tree(root, dir)?;
    for name in in_place {
        let pages = !name.contains('/')
            && name.starts_with("pages-")
            && name.ends_with(".img")
            && crate::layout::classify(Path::new(name)) == crate::layout::EntryKind::CriuImage;
        if !pages {
            return Err(RestoreRefusal::InPlaceNotPages {
                entry: name.clone(),
            });
        }
        if manifest.images.get(name).is_none() {
            return Err(RestoreRefusal::UnexpectedImage {
                file: dir.join(name),
            });
        }
    }
    let files = check_files(root, dir, &manifest, in_place)?;
    check_no_foreign_images(root, dir, &manifest)?;
    if opts.verify_digests {
        verify_digests(&manifest, &files)?;
    }
    tracing::info!(
        dir = %dir.display(),
        container_id = %manifest.container_id,
        files = files.len(),
        total_bytes = manifest.images.total_bytes,
        verify_digests = opts.verify_digests,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint validated for restore"
    );
    Ok(manifest)
}

/// Reads and parses the manifest, checking `kind` and `format_version` before the rest so a
/// future format yields "unsupported version" rather than a confusing field error.
pub fn read_manifest(dir: &Path) -> Result<Manifest, RestoreRefusal> {
    let fd = crate::beneath::open_root(dir).map_err(|source| RestoreRefusal::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    read_manifest_at(fd.as_fd(), dir)
}

/// [`read_manifest`] from the opened checkpoint directory `dir` (shown as `shown`): the
/// manifest is opened beneath it, never through a symlink, and never read past
/// [`MANIFEST_MAX_BYTES`].
pub fn read_manifest_at(dir: BorrowedFd<'_>, shown: &Path) -> Result<Manifest, RestoreRefusal> {
    let path = CheckpointLayout::new(shown).manifest_path();
    let unreadable = |reason: String| RestoreRefusal::ManifestUnreadable {
        manifest: path.clone(),
        reason,
    };
    let bytes = match crate::layout::read_capped(dir, MANIFEST_FILE, MANIFEST_MAX_BYTES) {
        Ok(b) => b,
        Err(CappedReadError::Missing) => {
            return Err(RestoreRefusal::ManifestMissing { manifest: path })
        }
        Err(e @ CappedReadError::Symlink) => return Err(unreadable(e.to_string())),
        Err(e @ CappedReadError::TooLarge { .. }) => {
            return Err(unreadable(format!("{e}, which no gpusnap manifest is")))
        }
        Err(CappedReadError::Io(source)) => return Err(RestoreRefusal::Io { path, source }),
        Err(e @ CappedReadError::Json(_)) => return Err(unreadable(e.to_string())),
    };
    parse_manifest(&bytes, &path)
}

/// Parses manifest bytes read from `path` (see [`read_manifest`]).
pub fn parse_manifest(bytes: &[u8], path: &Path) -> Result<Manifest, RestoreRefusal> {
    let path = path.to_path_buf();
    let unreadable = |reason: String| RestoreRefusal::ManifestUnreadable {
        manifest: path.clone(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| unreadable(format!("invalid JSON: {e}")))?;
    let kind = value.get("kind").and_then(|k| k.as_str());
    if kind != Some(MANIFEST_KIND) {
        return Err(RestoreRefusal::NotGpusnap {
            manifest: path.clone(),
            kind: kind.unwrap_or("<none>").to_owned(),
        });
    }
    let version = value
        .get("format_version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| unreadable("format_version is missing or not a number".into()))?;
    if version != u64::from(MANIFEST_FORMAT_VERSION) {
        return Err(RestoreRefusal::UnsupportedFormat {
            manifest: path.clone(),
            found: version,
            supported: MANIFEST_FORMAT_VERSION,
            made_by: value
                .get("gpusnap_version")
                .and_then(|v| v.as_str())
                .map(|v| format!("gpusnap {v}")),
        });
    }
    let manifest: Manifest =
        serde_json::from_value(value).map_err(|e| unreadable(e.to_string()))?;
    if manifest.images.chunk_bytes == 0 {
        return Err(unreadable("images.chunk_bytes is 0".into()));
    }
    Ok(manifest)
}

/// Everything beneath the checkpoint directory is a directory or a regular file with one
/// link: runc and CRIU open `descriptors.json`, the CRIU images, `config.dump`, `spec.dump`
/// and the rest by path, following symlinks, so a symlink anywhere in the tree (a chain of
/// relative ones included) could make them read host files; a device, FIFO or socket could
/// block or talk to something else; a hard link could be a host file's other name. Walked
/// through directory descriptors ([`crate::beneath::walk`]), nothing followed.
pub fn check_tree(root: BorrowedFd<'_>, dir: &Path) -> Result<(), RestoreRefusal> {
    crate::beneath::walk(
        root,
        &mut |parent, rel: &Path, st: &rustix::fs::Stat| match entry_refusal(
            parent,
            rel,
            st,
            Some(dir),
        ) {
            None => Ok(()),
            Some(what) => Err(WalkError::Refused(RestoreRefusal::NotPlain {
                entry: dir.join(rel),
                what,
            })),
        },
    )
    .map_err(|e| match e {
        WalkError::Refused(r) => r,
        WalkError::Io(source) => RestoreRefusal::Io {
            path: dir.to_path_buf(),
            source,
        },
    })
}

/// What [`check_tree`] refuses of one entry (`rel` beneath the walked directory, in the
/// directory `parent`, `st` its `lstat`), said in words — `None` for a directory or a regular
/// file with one link. `checkpoint_dir`, when the walked directory is a checkpoint directory
/// at that path, allows CRIU's pre-dump link `parent -> ../NAME` directly in it, as a restore
/// does. Image build and push refuse what this refuses, so no image carries what no restore
/// would accept (a hard link to a host file included).
pub fn entry_refusal(
    parent: BorrowedFd<'_>,
    rel: &Path,
    st: &rustix::fs::Stat,
    checkpoint_dir: Option<&Path>,
) -> Option<String> {
    Some(match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => return None,
        FileType::RegularFile if st.st_nlink <= 1 => return None,
        FileType::RegularFile => hard_linked(st.st_nlink),
        FileType::Symlink
            if rel == Path::new("parent")
                && checkpoint_dir.is_some_and(|dir| is_pre_dump_link(parent, dir)) =>
        {
            return None
        }
        FileType::Symlink => {
            let name = rel.file_name().unwrap_or_default();
            let target = rustix::fs::readlinkat(parent, name, Vec::new())
                .map(|t| String::from_utf8_lossy(t.as_bytes()).into_owned())
                .unwrap_or_else(|_| "?".into());
            format!("a symlink (to {target:?})")
        }
        FileType::Fifo => "a FIFO".into(),
        FileType::Socket => "a socket".into(),
        FileType::CharacterDevice => "a character device".into(),
        FileType::BlockDevice => "a block device".into(),
        FileType::Unknown => "of an unknown type".into(),
    })
}

/// [`entry_refusal`]'s words for a regular file with `links` names.
pub fn hard_linked(links: impl Into<u64>) -> String {
    let links: u64 = links.into();
    format!(
        "a regular file with {links} links (a hard link: another name of a file that may be \
         outside the checkpoint)"
    )
}

/// CRIU's link from an incremental dump to its pre-dump (`parent -> ../NAME`, written by
/// `runc checkpoint --parent-path`): allowed only as exactly that — one relative step to a
/// sibling that is a real directory (not a symlink), or is absent.
fn is_pre_dump_link(root: BorrowedFd<'_>, dir: &Path) -> bool {
    let Ok(target) = rustix::fs::readlinkat(root, "parent", Vec::new()) else {
        return false;
    };
    let target = std::ffi::OsStr::from_bytes(target.as_bytes());
    let mut parts = Path::new(target).components();
    let (Some(Component::ParentDir), Some(Component::Normal(name)), None) =
        (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some(up) = dir.parent() else {
        return false;
    };
    crate::beneath::open_root(up)
        .and_then(|fd| crate::beneath::stat_at(fd.as_fd(), name))
        .is_ok_and(|st| {
            // Missing (an image carries no pre-dump) leads nowhere; present, it must be a
            // real directory.
            st.is_none_or(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
        })
}

/// [`check_tree`]'s walk: a refusal, or the walk itself failed.
enum WalkError {
    Refused(RestoreRefusal),
    Io(io::Error),
}

impl From<io::Error> for WalkError {
    fn from(e: io::Error) -> Self {
        WalkError::Io(e)
    }
}

impl From<RestoreRefusal> for WalkError {
    fn from(r: RestoreRefusal) -> Self {
        WalkError::Refused(r)
    }
}

/// Presence, type and size of every listed file, each opened beneath the checkpoint
/// directory (no symlink followed). Returns the opened files with their shown paths, in
/// manifest order.
/// A file of the manifest, opened: its path, the file, its size and piece digests there.
type Opened<'m> = (PathBuf, File, u64, &'m [String]);

fn check_files<'m>(
    root: BorrowedFd<'_>,
    dir: &Path,
    manifest: &'m Manifest,
    in_place: &[String],
) -> Result<Vec<Opened<'m>>, RestoreRefusal> {
    let chunk = manifest.images.chunk_bytes;
    let mut out = Vec::with_capacity(manifest.images.files.len());
    for rec in &manifest.images.files {
        let rel = Path::new(&rec.path);
        // One plain name: a checkpoint directory is flat, and a name with a parent component
        // could make us read through a symlinked directory outside `dir`.
        let mut parts = rel.components();
        if rec.path.is_empty()
            || !matches!(parts.next(), Some(Component::Normal(_)))
            || parts.next().is_some()
        {
            return Err(RestoreRefusal::UnsafePath {
                entry: rec.path.clone(),
            });
        }
        if rec.blake3_chunks.len() != rec.size.div_ceil(chunk).max(1) as usize {
            return Err(RestoreRefusal::ManifestUnreadable {
                manifest: CheckpointLayout::new(dir).manifest_path(),
                reason: format!(
                    "{} has {} digests for {} bytes",
                    rec.path,
                    rec.blake3_chunks.len(),
                    rec.size
                ),
            });
        }
        let file = dir.join(rel);
        if in_place.contains(&rec.path) {
            match crate::beneath::stat_at(root, rel.as_os_str()) {
                Ok(None) => continue,
                Ok(Some(_)) => return Err(RestoreRefusal::InPlaceAlsoPresent { file }),
                Err(source) => return Err(RestoreRefusal::Io { path: file, source }),
            }
        }
        match crate::beneath::stat_at(root, rel.as_os_str()) {
            Ok(None) => {
                return Err(RestoreRefusal::FileMissing {
                    file,
                    expected: rec.size,
                })
            }
            Ok(Some(st)) if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile => {
                return Err(RestoreRefusal::NotRegular { file })
            }
            Ok(Some(_)) => {}
            Err(source) => return Err(RestoreRefusal::Io { path: file, source }),
        }
        let opened = crate::beneath::open_file(root, rel).map_err(|source| RestoreRefusal::Io {
            path: file.clone(),
            source,
        })?;
        let len = opened
            .metadata()
            .map_err(|source| RestoreRefusal::Io {
                path: file.clone(),
                source,
            })?
            .len();
        if len != rec.size {
            return Err(RestoreRefusal::SizeMismatch {
                file,
                expected: rec.size,
                found: len,
            });
        }
        out.push((file, opened, rec.size, rec.blake3_chunks.as_slice()));
    }
    Ok(out)
}

/// CRIU picks images up by name, and gpusnap's GPU restore lists the `gpusnap-gpu-*` files, so an
/// unlisted `*.img` or GPU state file could change what is restored.
fn check_no_foreign_images(
    root: BorrowedFd<'_>,
    dir: &Path,
    manifest: &Manifest,
) -> Result<(), RestoreRefusal> {
    let io_err = |source: io::Error| RestoreRefusal::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = rustix::fs::Dir::read_from(root).map_err(|e| io_err(e.into()))?;
    while let Some(entry) = entries.read() {
        let entry = entry.map_err(|e| io_err(e.into()))?;
        let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes());
        let rel = Path::new(name);
        if matches!(classify(rel), EntryKind::CriuImage | EntryKind::GpusnapData) {
            let listed = name
                .to_str()
                .is_some_and(|n| manifest.images.files.iter().any(|f| f.path == n));
            if !listed {
                return Err(RestoreRefusal::UnexpectedImage {
                    file: dir.join(rel),
                });
            }
        }
    }
    Ok(())
}

/// The files `check_files` opened (each with its size and piece digests in the manifest),
/// hashed against the manifest.
fn verify_digests(manifest: &Manifest, files: &[Opened<'_>]) -> Result<(), RestoreRefusal> {
    let specs: Vec<(PathBuf, u64)> = files
        .iter()
        .map(|(p, _, size, _)| (p.clone(), *size))
        .collect();
    let opened: Vec<File> = files
        .iter()
        .map(|(p, f, ..)| {
            f.try_clone().map_err(|source| RestoreRefusal::Io {
                path: p.clone(),
                source,
            })
        })
        .collect::<Result<_, _>>()?;
    let expected: Vec<&[String]> = files.iter().map(|f| f.3).collect();
    let chunk = manifest.images.chunk_bytes;
    match hash_open_files(&specs, &opened, chunk, Some(&expected)) {
        Ok(_) => Ok(()),
        Err(VerifyFailure::Digest { file, chunk: ci }) => {
            let size = specs[file].1;
            let offset = ci as u64 * chunk;
            Err(RestoreRefusal::DigestMismatch {
                file: specs[file].0.clone(),
                offset,
                end: (offset + chunk).min(size),
            })
        }
        Err(VerifyFailure::ShortRead { path }) => {
            // The file shrank between the size check and hashing.
            let (expected, found) = specs
                .iter()
                .zip(&opened)
                .find(|(s, _)| s.0 == path)
                .map(|(s, f)| (s.1, f.metadata().map_or(0, |m| m.len())))
                .unwrap_or_default();
            Err(RestoreRefusal::SizeMismatch {
                file: path,
                expected,
                found,
            })
        }
        Err(VerifyFailure::Io { path, source }) => Err(RestoreRefusal::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{seal_checkpoint, write_manifest_atomically};
    use gpusnap_criu_bridge::CriuFlags;
    use std::fs;
    use std::fs::OpenOptions;
    use std::io::{Seek, SeekFrom, Write};

    /// A sealed fake checkpoint: a few CRIU-like images, runc's descriptors, a GPU blob.
    fn sealed() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        fs::write(p.join("inventory.img"), b"inventory").unwrap();
        fs::write(p.join("pages-1.img"), vec![0xabu8; 300_000]).unwrap();
        fs::write(p.join("descriptors.json"), b"[\"/dev/null\"]").unwrap();
        let layout = CheckpointLayout::new(p);
        fs::write(layout.gpu_file("device-0000.bin"), vec![1u8; 5000]).unwrap();
        let m = Manifest::new("ctr1", CriuFlags::default());
        seal_checkpoint(p, m).unwrap();
        dir
    }

    #[test]
    fn page_images_read_in_place_must_be_listed_pages_and_absent() {
        let dir = sealed();
        let names = vec!["pages-1.img".to_string()];
        // Present as well as read in place: which one would be restored is ambiguous.
        let e = validate_for_restore_in_place(dir.path(), &names).unwrap_err();
        assert!(
            matches!(e, RestoreRefusal::InPlaceAlsoPresent { .. }),
            "{e}"
        );
        fs::remove_file(dir.path().join("pages-1.img")).unwrap();
        let m = validate_for_restore_in_place(dir.path(), &names).unwrap();
        assert!(m.images.get("pages-1.img").is_some());
        // Only page images, and only those the manifest lists.
        for other in [
            "inventory.img",
            "gpusnap-gpu-device-0000.bin",
            "pages-9.img",
        ] {
            let e = validate_for_restore_in_place(dir.path(), &[other.to_string()]).unwrap_err();
            assert!(
                matches!(
                    e,
                    RestoreRefusal::InPlaceNotPages { .. } | RestoreRefusal::UnexpectedImage { .. }
                ),
                "{other}: {e}"
            );
        }
        // Every other file is still verified.
        fs::write(dir.path().join("inventory.img"), b"inventorz").unwrap();
        let e = validate_for_restore_in_place(dir.path(), &names).unwrap_err();
        assert!(matches!(e, RestoreRefusal::DigestMismatch { .. }), "{e}");
    }

    fn manifest_value(dir: &Path) -> serde_json::Value {
        serde_json::from_slice(&fs::read(dir.join("gpusnap-manifest.json")).unwrap()).unwrap()
    }

    fn rewrite_manifest(dir: &Path, v: &serde_json::Value) {
        fs::write(
            dir.join("gpusnap-manifest.json"),
            serde_json::to_vec(v).unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn intact_checkpoint_validates() {
        let dir = sealed();
        // Logs written by a restore attempt and foreign non-image files are fine.
        fs::write(dir.path().join("restore.log"), b"previous attempt").unwrap();
        fs::write(dir.path().join("config.dump"), b"{}").unwrap();
        let m = validate_for_restore(dir.path()).unwrap();
        assert_eq!(m.container_id, "ctr1");
        assert_eq!(m.images.files.len(), 4);
    }

    #[test]
    fn missing_manifest() {
        let dir = sealed();
        fs::remove_file(dir.path().join("gpusnap-manifest.json")).unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err();
        assert!(matches!(err, RestoreRefusal::ManifestMissing { .. }));
        let msg = err.to_string();
        assert!(
            msg.starts_with("not a complete gpusnap checkpoint: ")
                && msg.contains("gpusnap-manifest.json is missing")
                && msg.contains("interrupted or made by another runtime"),
            "{msg}"
        );
    }

    #[test]
    fn garbage_manifest() {
        let dir = sealed();
        fs::write(dir.path().join("gpusnap-manifest.json"), b"{\"kind\": ").unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err();
        assert!(
            matches!(err, RestoreRefusal::ManifestUnreadable { .. }),
            "{err}"
        );
    }

    #[test]
    fn oversized_and_symlinked_manifests_are_refused_unread() {
        let dir = sealed();
        let path = dir.path().join("gpusnap-manifest.json");
        let mut big = fs::read(&path).unwrap();
        big.resize(MANIFEST_MAX_BYTES as usize + 10, b' ');
        fs::write(&path, &big).unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
        fs::remove_file(&path).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        fs::write(elsewhere.path().join("m.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("m.json"), &path).unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err().to_string();
        assert!(err.contains("symlink"), "{err}");
    }

    #[test]
    fn wrong_kind() {
        let dir = sealed();
        let mut v = manifest_value(dir.path());
        v["kind"] = "something-else".into();
        rewrite_manifest(dir.path(), &v);
        let err = validate_for_restore(dir.path()).unwrap_err();
        assert!(matches!(err, RestoreRefusal::NotGpusnap { .. }), "{err}");
    }

    #[test]
    fn unknown_format_version() {
        let dir = sealed();
        let mut v = manifest_value(dir.path());
        let next = u64::from(MANIFEST_FORMAT_VERSION) + 1;
        v["format_version"] = next.into();
        // A later format may have a different shape; the version check comes first.
        v["images"] = "reshaped".into();
        rewrite_manifest(dir.path(), &v);
        let err = validate_for_restore(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, RestoreRefusal::UnsupportedFormat { found, .. } if found == next),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("format_version {next}"))
                && msg.contains(&format!(
                    "reads only format_version {MANIFEST_FORMAT_VERSION}"
                )),
            "{msg}"
        );
        assert!(msg.contains("(it was made by gpusnap "), "{msg}");
    }

    #[test]
    fn wrong_arch() {
        let dir = sealed();
        let mut v = manifest_value(dir.path());
        v["host"]["arch"] = "riscv64".into();
        rewrite_manifest(dir.path(), &v);
        let err = validate_for_restore(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, RestoreRefusal::ArchMismatch { .. }), "{msg}");
        assert!(msg.contains("riscv64") && msg.contains(std::env::consts::ARCH));
    }

    #[test]
    fn deleted_file() {
        let dir = sealed();
        fs::remove_file(dir.path().join("pages-1.img")).unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                RestoreRefusal::FileMissing {
                    expected: 300_000,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains("pages-1.img is missing"), "{msg}");
    }

    #[test]
    fn truncated_file() {
        let dir = sealed();
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join("pages-1.img"))
            .unwrap();
        f.set_len(4096).unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                RestoreRefusal::SizeMismatch {
                    expected: 300_000,
                    found: 4096,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("truncated") && msg.contains("pages-1.img"),
            "{msg}"
        );
        // Sizes-only validation catches it too.
        let err = validate_for_restore_with(
            dir.path(),
            ValidateOptions {
                verify_digests: false,
            },
        )
        .unwrap_err();
        assert!(matches!(err, RestoreRefusal::SizeMismatch { .. }));
    }

    #[test]
    fn tampered_file() {
        let dir = sealed();
        let mut f = OpenOptions::new()
            .write(true)
            .open(dir.path().join("gpusnap-gpu-device-0000.bin"))
            .unwrap();
        f.seek(SeekFrom::Start(100)).unwrap();
        f.write_all(b"X").unwrap();
        drop(f);
        let err = validate_for_restore(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                RestoreRefusal::DigestMismatch {
                    offset: 0,
                    end: 5000,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("gpusnap-gpu-device-0000.bin is corrupted"),
            "{msg}"
        );
        // Sizes-only validation does not see a same-size corruption; that is its documented limit.
        validate_for_restore_with(
            dir.path(),
            ValidateOptions {
                verify_digests: false,
            },
        )
        .unwrap();
    }

    #[test]
    fn foreign_image() {
        let dir = sealed();
        fs::write(dir.path().join("pages-2.img"), b"from another dump").unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err();
        assert!(
            matches!(err, RestoreRefusal::UnexpectedImage { .. }),
            "{err}"
        );
    }

    #[test]
    fn foreign_gpu_file() {
        let dir = sealed();
        fs::write(
            CheckpointLayout::new(dir.path()).gpu_file("device-0001.bin"),
            b"from another checkpoint",
        )
        .unwrap();
        let err = validate_for_restore(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, RestoreRefusal::UnexpectedImage { .. }),
            "{msg}"
        );
        assert!(
            msg.contains("gpusnap-gpu-device-0001.bin is not listed in the manifest"),
            "{msg}"
        );
    }

    #[test]
    fn pre_flat_layout_is_not_a_checkpoint() {
        // A manifest in the old `gpusnap/` subdirectory is not where restore looks.
        let dir = sealed();
        let p = dir.path();
        fs::create_dir(p.join("gpusnap")).unwrap();
        fs::rename(
            p.join("gpusnap-manifest.json"),
            p.join("gpusnap/manifest.json"),
        )
        .unwrap();
        let msg = validate_for_restore(p).unwrap_err().to_string();
        assert!(msg.contains("gpusnap-manifest.json is missing"), "{msg}");
    }

    #[test]
    fn path_traversal_in_manifest() {
        let dir = sealed();
        let mut v = manifest_value(dir.path());
        v["images"]["files"][0]["path"] = "../../etc/passwd".into();
        rewrite_manifest(dir.path(), &v);
        let err = validate_for_restore(dir.path()).unwrap_err();
        assert!(matches!(err, RestoreRefusal::UnsafePath { .. }), "{err}");
    }

    #[test]
    fn nested_name_in_manifest_is_refused_even_when_the_file_exists() {
        // `sub` is a symlink to a directory outside the checkpoint holding a file of the right
        // size: only a flat name may be read.
        let dir = sealed();
        let outside = tempfile::tempdir().unwrap();
        let mut v = manifest_value(dir.path());
        let name = v["images"]["files"][0]["path"]
            .as_str()
            .unwrap()
            .to_string();
        fs::copy(dir.path().join(&name), outside.path().join(&name)).unwrap();
        // A real directory (a symlinked one is refused by the tree walk before this check).
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::copy(
            outside.path().join(&name),
            dir.path().join("sub").join(&name),
        )
        .unwrap();
        v["images"]["files"][0]["path"] = format!("sub/{name}").into();
        rewrite_manifest(dir.path(), &v);
        let err = validate_for_restore(dir.path()).unwrap_err();
        assert!(matches!(err, RestoreRefusal::UnsafePath { .. }), "{err}");
    }

    #[test]
    fn digest_count_mismatch_is_damage() {
        let dir = sealed();
        let mut v = manifest_value(dir.path());
        v["images"]["files"][0]["blake3_chunks"] = serde_json::json!([]);
        rewrite_manifest(dir.path(), &v);
        let err = validate_for_restore(dir.path()).unwrap_err();
        assert!(
            matches!(err, RestoreRefusal::ManifestUnreadable { .. }),
            "{err}"
        );
    }

    #[test]
    fn manifest_written_directly_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let m = Manifest::new("c", CriuFlags::default());
        write_manifest_atomically(dir.path(), &m).unwrap();
        assert_eq!(validate_for_restore(dir.path()).unwrap(), m);
    }

    #[test]
    fn the_tree_holds_only_regular_files_and_directories() {
        let host = tempfile::tempdir().unwrap();
        fs::write(host.path().join("secret"), b"host").unwrap();
        type Plant = Box<dyn Fn(&Path)>;
        let cases: Vec<(&str, Plant, &str)> = vec![
            (
                "chained descriptors.json",
                Box::new(|d: &Path| {
                    for i in 1..=8 {
                        let t = if i == 1 {
                            "..".to_owned()
                        } else {
                            format!("l{}/..", i - 1)
                        };
                        std::os::unix::fs::symlink(t, d.join(format!("l{i}"))).unwrap();
                    }
                    fs::remove_file(d.join("descriptors.json")).unwrap();
                    std::os::unix::fs::symlink("l8/etc/hostname", d.join("descriptors.json"))
                        .unwrap();
                }),
                "descriptors.json is a symlink (to \"l8/etc/hostname\")",
            ),
            (
                "looping symlink",
                Box::new(|d: &Path| std::os::unix::fs::symlink("loop", d.join("loop")).unwrap()),
                "loop is a symlink",
            ),
            (
                "hard link",
                Box::new({
                    let secret = host.path().join("secret");
                    move |d: &Path| fs::hard_link(&secret, d.join("config.dump")).unwrap()
                }),
                "config.dump is a regular file with 2 links",
            ),
            (
                "fifo",
                Box::new(|d: &Path| {
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        d.join("stats-restore"),
                        FileType::Fifo,
                        rustix::fs::Mode::from_raw_mode(0o600),
                        0,
                    )
                    .unwrap()
                }),
                "stats-restore is a FIFO",
            ),
            (
                "symlink in a subdirectory",
                Box::new(|d: &Path| {
                    fs::create_dir(d.join("sub")).unwrap();
                    std::os::unix::fs::symlink("/", d.join("sub/root")).unwrap();
                }),
                "sub/root is a symlink",
            ),
        ];
        for (name, plant, says) in cases {
            let dir = sealed();
            plant(dir.path());
            let err = validate_for_restore(dir.path()).unwrap_err();
            assert!(
                matches!(err, RestoreRefusal::NotPlain { .. }),
                "{name}: {err}"
            );
            assert!(err.to_string().contains(says), "{name}: {err}");
        }
        // A plain subdirectory of regular files is fine.
        let dir = sealed();
        fs::create_dir(dir.path().join("criu.work")).unwrap();
        fs::write(dir.path().join("criu.work/restore.log"), b"log").unwrap();
        validate_for_restore(dir.path()).unwrap();
    }
}
