//! Reading a build source entry by entry: a CRI checkpoint archive (tar, possibly gzip), an
//! extracted CRI archive directory, or a bare checkpoint directory.
//!
//! Every source is presented in *archive shape*: paths relative to the archive root, the CRIU
//! images under `checkpoint/`. A bare checkpoint directory is therefore presented as if it were
//! the `checkpoint/` of an archive without metadata files.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;

use super::error::ImageError;
use super::layer::EntryMeta;
use gpusnap_checkpoint::beneath;
use gpusnap_checkpoint::layout::MANIFEST_FILE;

/// Name of the CRIU image directory inside a CRI checkpoint archive (checkpointctl
/// `CheckpointDirectory`).
pub const CHECKPOINT_DIR: &str = "checkpoint";
/// The rw-layer diff inside a CRI checkpoint archive (checkpointctl `RootFsDiffTar`).
pub const ROOTFS_DIFF_TAR: &str = "rootfs-diff.tar";
pub const CONFIG_DUMP: &str = "config.dump";
pub const SPEC_DUMP: &str = "spec.dump";

/// What was given to [`crate::build`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BuildSource {
    /// A CRI checkpoint archive file.
    ArchiveTar(PathBuf),
    /// A directory holding an extracted CRI checkpoint archive.
    ArchiveDir(PathBuf),
    /// A checkpoint directory: CRIU images plus gpusnap's `gpusnap-*` files, all flat.
    CheckpointDir(PathBuf),
}

impl BuildSource {
    pub(crate) fn detect(path: &Path) -> Result<BuildSource, ImageError> {
        use rustix::fs::FileType;
        use std::os::fd::AsFd;
        let meta = fs::metadata(path).map_err(ImageError::io("opening", path))?;
        if meta.is_file() {
            return Ok(BuildSource::ArchiveTar(path.to_path_buf()));
        }
        // What the directory holds, looked at beneath it: a symlink named like a manifest or
        // like `checkpoint/` is not one.
        let root = beneath::open_root(path).map_err(ImageError::io("opening", path))?;
        let is = |name: &str, kind: FileType| {
            beneath::stat_at(root.as_fd(), std::ffi::OsStr::new(name))
                .ok()
                .flatten()
                .is_some_and(|st| FileType::from_raw_mode(st.st_mode) == kind)
        };
        if is(MANIFEST_FILE, FileType::RegularFile) || is("inventory.img", FileType::RegularFile) {
            return Ok(BuildSource::CheckpointDir(path.to_path_buf()));
        }
        if is(CHECKPOINT_DIR, FileType::Directory) {
            return Ok(BuildSource::ArchiveDir(path.to_path_buf()));
        }
        Err(ImageError::UnknownSource {
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        match self {
            BuildSource::ArchiveTar(p)
            | BuildSource::ArchiveDir(p)
            | BuildSource::CheckpointDir(p) => p,
        }
    }
}

/// The payload of one entry.
pub(crate) enum Body<'a> {
    Dir,
    Symlink(String),
    File {
        size: u64,
        data: &'a mut dyn Read,
        /// Where the same bytes can be read again by offset (a chunked image writes its
        /// chunks after it has seen them all); `None` for a compressed archive.
        reread: Option<Reread>,
    },
}

/// A file's bytes, readable again at `base..base + size` of `file`.
pub(crate) struct Reread {
    pub file: File,
    pub base: u64,
}

/// One entry, in archive shape.
pub(crate) struct SourceEntry<'a> {
    /// `/`-separated, relative, no `.`/`..`; never empty.
    pub path: String,
    pub meta: EntryMeta,
    pub body: Body<'a>,
}

/// Calls `f` for every entry of `source`, parents before children. The origin record a pull
/// wrote (`gpusnap-origin.json`) is node-local state, not part of the checkpoint: it is left
/// out, so an image rebuilt from an extracted checkpoint is the image it was extracted from.
pub(crate) fn for_each_entry(
    source: &BuildSource,
    f: &mut dyn FnMut(SourceEntry<'_>) -> Result<(), ImageError>,
) -> Result<(), ImageError> {
    use gpusnap_checkpoint::layout::ORIGIN_FILE;
    let skipped = [
        ORIGIN_FILE.to_owned(),
        format!("{CHECKPOINT_DIR}/{ORIGIN_FILE}"),
    ];
    let f = &mut |e: SourceEntry<'_>| {
        if skipped.contains(&e.path) {
            Ok(())
        } else {
            f(e)
        }
    };
    match source {
        BuildSource::ArchiveTar(p) => walk_tar(p, f),
        BuildSource::ArchiveDir(p) => walk_dir(p, "", f),
        BuildSource::CheckpointDir(p) => {
            let meta = fs::symlink_metadata(p).map_err(ImageError::io("reading", p))?;
            f(SourceEntry {
                path: CHECKPOINT_DIR.to_owned(),
                meta: meta_of(&meta),
                body: Body::Dir,
            })?;
            walk_dir(p, CHECKPOINT_DIR, f)
        }
    }
}

fn meta_of(m: &fs::Metadata) -> EntryMeta {
    EntryMeta {
        mode: m.mode() & 0o7777,
        uid: u64::from(m.uid()),
        gid: u64::from(m.gid()),
        mtime: u64::try_from(m.mtime()).unwrap_or(0),
    }
}

fn unsupported(source: &Path, entry: &str, reason: impl Into<String>) -> ImageError {
    ImageError::UnsupportedEntry {
        source_path: source.to_path_buf(),
        entry: entry.to_owned(),
        reason: reason.into(),
    }
}

/// What a restore refuses in a checkpoint tree, refused at build and push too (with the same
/// words, [`gpusnap_checkpoint::validate::entry_refusal`]): a hard link could be a host file's
/// other name (and would go to the registry), a symlink or special file is nothing a restore
/// accepts. `rel` is the entry's path in archive shape; the checkpoint directory is
/// `checkpoint_dir` on disk, where CRIU's pre-dump link `checkpoint/parent` stays allowed as it
/// is at restore.
fn refused_entry(
    source: &Path,
    checkpoint_dir: &Path,
    parent: std::os::fd::BorrowedFd<'_>,
    rel: &str,
    st: &rustix::fs::Stat,
) -> Result<(), ImageError> {
    let (within, dir) = match rel.strip_prefix("checkpoint/") {
        Some(inner) => (inner, Some(checkpoint_dir)),
        None => (rel, None),
    };
    match gpusnap_checkpoint::validate::entry_refusal(parent, Path::new(within), st, dir) {
        None => Ok(()),
        Some(what) => Err(refusal(source, rel, &what)),
    }
}

fn refusal(source: &Path, entry: &str, what: &str) -> ImageError {
    unsupported(
        source,
        entry,
        format!(
            "{what}; a restore refuses it, so no image may carry it: put a plain copy of the \
             file there (or remove it) and build again"
        ),
    )
}

/// Refuses, before anything is written, a directory source holding what a restore refuses
/// ([`refused_entry`]): the tree is walked through directory descriptors, nothing followed,
/// no file opened. An archive file is checked entry by entry as it is read.
pub(crate) fn check_tree(source: &BuildSource) -> Result<(), ImageError> {
    use std::os::fd::AsFd;
    let (root, prefix) = match source {
        BuildSource::ArchiveTar(_) => return Ok(()),
        BuildSource::ArchiveDir(p) => (p, ""),
        BuildSource::CheckpointDir(p) => (p, CHECKPOINT_DIR),
    };
    let checkpoint_dir = if prefix.is_empty() {
        root.join(CHECKPOINT_DIR)
    } else {
        root.clone()
    };
    let root_fd = beneath::open_root(root).map_err(ImageError::io("opening", root))?;
    let mut visit = |parent: std::os::fd::BorrowedFd<'_>,
                     rel: &Path,
                     st: &rustix::fs::Stat|
     -> Result<(), WalkError> {
        let rel = archive_path(prefix, rel);
        Ok(refused_entry(root, &checkpoint_dir, parent, &rel, st)?)
    };
    beneath::walk(root_fd.as_fd(), &mut visit).map_err(|e| match e {
        WalkError::Image(e) => e,
        WalkError::Io(e) => ImageError::io("reading", root)(e),
    })
}

/// `rel` (beneath the source directory) in archive shape.
fn archive_path(prefix: &str, rel: &Path) -> String {
    let rel = rel.to_string_lossy();
    if prefix.is_empty() {
        rel.into_owned()
    } else {
        format!("{prefix}/{rel}")
    }
}

/// Walks the directory `root` through directory descriptors ([`beneath::walk`]): nothing in
/// it is followed, what a restore refuses is refused ([`refused_entry`]; CRIU's pre-dump link
/// is carried as data), and every file is opened beneath `root`.
fn walk_dir(
    root: &Path,
    prefix: &str,
    f: &mut dyn FnMut(SourceEntry<'_>) -> Result<(), ImageError>,
) -> Result<(), ImageError> {
    let checkpoint_dir = &if prefix.is_empty() {
        root.join(CHECKPOINT_DIR)
    } else {
        root.to_path_buf()
    };
    use rustix::fs::FileType;
    use std::os::fd::AsFd;
    let root_fd = beneath::open_root(root).map_err(ImageError::io("opening", root))?;
    let mut visit = |parent: std::os::fd::BorrowedFd<'_>,
                     rel: &Path,
                     st: &rustix::fs::Stat|
     -> Result<(), WalkError> {
        let Some(rel_str) = rel.to_str() else {
            return Err(unsupported(root, &rel.display().to_string(), "name is not UTF-8").into());
        };
        let name = rel.file_name().unwrap_or_default();
        let path = archive_path(prefix, Path::new(rel_str));
        let meta = EntryMeta {
            mode: st.st_mode & 0o7777,
            uid: u64::from(st.st_uid),
            gid: u64::from(st.st_gid),
            mtime: u64::try_from(st.st_mtime).unwrap_or(0),
        };
        let full = root.join(rel);
        refused_entry(root, checkpoint_dir, parent, &path, st)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => f(SourceEntry {
                path,
                meta,
                body: Body::Dir,
            })?,
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(parent, name, Vec::new())
                    .map_err(|e| ImageError::io("reading link", &full)(e.into()))?;
                let Ok(target) = target.into_string() else {
                    return Err(unsupported(root, &path, "symlink target is not UTF-8").into());
                };
                f(SourceEntry {
                    path,
                    meta,
                    body: Body::Symlink(target),
                })?;
            }
            FileType::RegularFile => {
                let mut file = beneath::open_file(parent, Path::new(name))
                    .map_err(ImageError::io("opening", &full))?;
                let opened = file.metadata().map_err(ImageError::io("reading", &full))?;
                // The file opened, not the name looked at: linked meanwhile, it is refused.
                if opened.nlink() > 1 {
                    return Err(refusal(
                        root,
                        &path,
                        &gpusnap_checkpoint::validate::hard_linked(opened.nlink()),
                    )
                    .into());
                }
                let size = opened.len();
                let reread = file.try_clone().ok().map(|file| Reread { file, base: 0 });
                let mut r = BufReader::with_capacity(1 << 20, &mut file);
                f(SourceEntry {
                    path,
                    meta,
                    body: Body::File {
                        size,
                        data: &mut r,
                        reread,
                    },
                })?;
            }
            _ => {
                return Err(unsupported(
                    root,
                    &path,
                    "only regular files, directories and CRIU's pre-dump link can go into a \
                     checkpoint image",
                )
                .into())
            }
        }
        Ok(())
    };
    beneath::walk(root_fd.as_fd(), &mut visit).map_err(|e| match e {
        WalkError::Image(e) => e,
        WalkError::Io(e) => ImageError::io("reading", root)(e),
    })
}

/// [`walk_dir`]'s errors: the walk's own, or the entry's.
enum WalkError {
    Image(ImageError),
    Io(io::Error),
}

impl From<io::Error> for WalkError {
    fn from(e: io::Error) -> Self {
        WalkError::Io(e)
    }
}

impl From<ImageError> for WalkError {
    fn from(e: ImageError) -> Self {
        WalkError::Image(e)
    }
}

/// CRIU's pre-dump link target: one step up, then one name (`../NAME`).
fn is_pre_dump_target(target: &str) -> bool {
    let mut parts = Path::new(target).components();
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(Component::ParentDir), Some(Component::Normal(_)), None)
    )
}

/// Normalises a tar member name: `./checkpoint/x` → `checkpoint/x`; `None` for the root entry.
pub(crate) fn normalize_member(source: &Path, raw: &Path) -> Result<Option<String>, ImageError> {
    let mut parts = Vec::new();
    for c in raw.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(p) => match p.to_str() {
                Some(s) => parts.push(s),
                None => {
                    return Err(unsupported(
                        source,
                        &raw.display().to_string(),
                        "name is not UTF-8",
                    ))
                }
            },
            _ => {
                return Err(unsupported(
                    source,
                    &raw.display().to_string(),
                    "absolute paths and `..` are not allowed",
                ))
            }
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

fn walk_tar(
    path: &Path,
    f: &mut dyn FnMut(SourceEntry<'_>) -> Result<(), ImageError>,
) -> Result<(), ImageError> {
    let mut file = File::open(path).map_err(ImageError::io("opening", path))?;
    let mut magic = [0u8; 2];
    let gz = match file.read_exact(&mut magic) {
        Ok(()) => magic == [0x1f, 0x8b],
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(ImageError::io("reading", path)(e)),
    };
    file.seek(SeekFrom::Start(0))
        .map_err(ImageError::io("reading", path))?;
    // An uncompressed archive holds each member's bytes contiguously: they can be read again
    // by offset.
    let raw_archive = if gz {
        None
    } else {
        Some(file.try_clone().map_err(ImageError::io("reading", path))?)
    };
    let buffered = BufReader::with_capacity(1 << 20, file);
    // CRI writes the archive uncompressed; Podman can gzip it. Accept both.
    let reader: Box<dyn Read> = if gz {
        Box::new(GzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let mut archive = tar::Archive::new(reader);
    let rd = ImageError::io("reading archive", path);
    let entries = archive.entries().map_err(rd)?;
    let mut seen = 0usize;
    for entry in entries {
        let mut entry = entry.map_err(ImageError::io("reading archive", path))?;
        let raw = entry
            .path()
            .map_err(ImageError::io("reading archive", path))?
            .into_owned();
        let Some(name) = normalize_member(path, &raw)? else {
            continue;
        };
        seen += 1;
        let h = entry.header();
        let hdr_err = |e| ImageError::io("reading archive header", path)(e);
        let meta = EntryMeta {
            mode: h.mode().map_err(hdr_err)? & 0o7777,
            uid: h.uid().map_err(hdr_err)?,
            gid: h.gid().map_err(hdr_err)?,
            mtime: h.mtime().map_err(hdr_err)?,
        };
        let kind = h.entry_type();
        match kind {
            tar::EntryType::Directory => f(SourceEntry {
                path: name,
                meta,
                body: Body::Dir,
            })?,
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(ImageError::io("reading archive", path))?
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !(name == format!("{CHECKPOINT_DIR}/parent") && is_pre_dump_target(&target)) {
                    return Err(refusal(path, &name, &format!("a symlink (to {target:?})")));
                }
                f(SourceEntry {
                    path: name,
                    meta,
                    body: Body::Symlink(target),
                })?
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.size();
                let reread = match &raw_archive {
                    Some(file) => Some(Reread {
                        file: file.try_clone().map_err(ImageError::io("reading", path))?,
                        base: entry.raw_file_position(),
                    }),
                    None => None,
                };
                f(SourceEntry {
                    path: name,
                    meta,
                    body: Body::File {
                        size,
                        data: &mut entry,
                        reread,
                    },
                })?
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                return Err(refusal(
                    path,
                    &name,
                    &format!("a hard link (to {target:?})"),
                ));
            }
            tar::EntryType::Fifo => return Err(refusal(path, &name, "a FIFO")),
            tar::EntryType::Char => return Err(refusal(path, &name, "a character device")),
            tar::EntryType::Block => return Err(refusal(path, &name, "a block device")),
            other => {
                return Err(unsupported(
                    path,
                    &name,
                    format!("tar entry type {other:?} is not supported"),
                ))
            }
        }
    }
    if seen == 0 {
        return Err(ImageError::UnknownSource {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusnap_checkpoint::layout::CheckpointLayout;

    #[test]
    fn member_names() {
        let s = Path::new("/a.tar");
        assert_eq!(
            normalize_member(s, Path::new("./checkpoint/x.img")).unwrap(),
            Some("checkpoint/x.img".into())
        );
        assert_eq!(
            normalize_member(s, Path::new("checkpoint/")).unwrap(),
            Some("checkpoint".into())
        );
        assert_eq!(normalize_member(s, Path::new("./")).unwrap(), None);
        assert!(normalize_member(s, Path::new("../etc/passwd")).is_err());
        assert!(normalize_member(s, Path::new("/etc/passwd")).is_err());
    }

    #[test]
    fn detect_kinds() {
        let d = tempfile::tempdir().unwrap();
        let cp = d.path().join("cp");
        fs::create_dir_all(&cp).unwrap();
        fs::write(CheckpointLayout::new(&cp).manifest_path(), b"{}").unwrap();
        assert_eq!(
            BuildSource::detect(&cp).unwrap(),
            BuildSource::CheckpointDir(cp.clone())
        );
        let ar = d.path().join("ar");
        fs::create_dir_all(ar.join("checkpoint")).unwrap();
        assert_eq!(
            BuildSource::detect(&ar).unwrap(),
            BuildSource::ArchiveDir(ar.clone())
        );
        let empty = d.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert!(matches!(
            BuildSource::detect(&empty),
            Err(ImageError::UnknownSource { .. })
        ));
        // A file that is not a tar at all.
        let junk = d.path().join("junk");
        fs::write(&junk, b"not a tar").unwrap();
        let mut n = 0;
        let err = for_each_entry(&BuildSource::detect(&junk).unwrap(), &mut |_| {
            n += 1;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(n, 0);
        assert!(
            matches!(
                err,
                ImageError::UnknownSource { .. } | ImageError::Io { .. }
            ),
            "{err}"
        );
    }
}
