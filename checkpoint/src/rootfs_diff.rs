//! Applying a checkpoint's rootfs diff (`rootfs-diff.tar` of a CRI checkpoint archive: the
//! container's writable-layer changes, often gzip-compressed despite the name) onto a fresh
//! rootfs before CRIU restores processes that expect those files — with OCI layer semantics and
//! as untrusted input.
//!
//! - **Checked whole before anything changes**: every name is plain and relative, every type
//!   is one a container's writable layer has (directory, file, symlink, hard link, fifo; no
//!   device nodes), whiteout names are refused when empty, `.`, `..` or a path, ownership is a
//!   real uid/gid, and entry count and bytes stay under [`Limits`].
//! - **Applied beneath the rootfs** ([`crate::beneath`]): each entry's parent is opened
//!   component by component with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so a symlink —
//!   planted before, or created by an earlier entry — is never followed; symlinks are created
//!   as data; whiteouts and opaque markers remove only beneath the rootfs.
//! - **OCI layer semantics** (as containerd's applier): `.wh.NAME` removes NAME; an opaque
//!   marker `.wh..wh..opq` removes what the directory held before this layer, keeping what
//!   this layer put there.
//! - **Ownership, mode and times from the tar**: owner first, then mode (changing the owner
//!   clears setuid/setgid), then times (directories last). Setuid/setgid bits and file
//!   capabilities (`security.capability`) exist only with the owner the tar records: when that
//!   owner cannot be set they are dropped, never left on a file owned by someone else. Other
//!   `security.*` and `trusted.*` attributes are not applied; `user.*` are.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};
use rustix::io::Errno;

use crate::beneath;

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// Bounds on what a diff may make a restore write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file content, after decompression.
    pub max_bytes: u64,
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 64 << 30,
            max_entries: 1 << 20,
        }
    }
}

/// What an application did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub entries: u64,
    pub bytes: u64,
    /// Files whose setuid/setgid bits or capabilities were dropped because their owner could
    /// not be set.
    pub privileges_dropped: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{diff}: entry {entry:?} refused: {reason}; nothing was applied")]
    Refused {
        diff: PathBuf,
        entry: String,
        reason: String,
    },
    #[error("{diff}: {reason}; nothing was applied")]
    TooLarge { diff: PathBuf, reason: String },
    #[error("{diff}: unreadable ({source}); nothing was applied")]
    Unreadable {
        diff: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{diff}: applying entry {entry:?} into {rootfs}: {source}")]
    Apply {
        diff: PathBuf,
        rootfs: PathBuf,
        entry: String,
        #[source]
        source: io::Error,
    },
}

/// Checks the whole of `diff` against `rootfs`, then applies it.
pub fn apply(diff: &Path, rootfs: &Path, limits: Limits) -> Result<Applied, DiffError> {
    let root = beneath::open_root(rootfs).map_err(|source| DiffError::Apply {
        diff: diff.to_path_buf(),
        rootfs: rootfs.to_path_buf(),
        entry: String::new(),
        source,
    })?;
    let content = check(diff, root.as_fd(), limits)?;
    // The rootfs's file system must hold it: a diff that fills the disk is refused unwritten.
    let free = beneath::available_bytes(root.as_fd()).map_err(|source| DiffError::Apply {
        diff: diff.to_path_buf(),
        rootfs: rootfs.to_path_buf(),
        entry: String::new(),
        source,
    })?;
    if content > free {
        return Err(DiffError::TooLarge {
            diff: diff.to_path_buf(),
            reason: format!(
                "{content} bytes of file content, but the file system of {} has {free} bytes \
                 free",
                rootfs.display()
            ),
        });
    }
    let mut applier = Applier {
        root: root.as_fd(),
        unpacked: HashSet::new(),
        dir_times: Vec::new(),
        applied: Applied::default(),
    };
    let mut archive = tar::Archive::new(open(diff).map_err(|source| DiffError::Unreadable {
        diff: diff.to_path_buf(),
        source,
    })?);
    let entries = archive.entries().map_err(|source| DiffError::Unreadable {
        diff: diff.to_path_buf(),
        source,
    })?;
    for entry in entries {
        let mut entry = entry.map_err(|source| DiffError::Unreadable {
            diff: diff.to_path_buf(),
            source,
        })?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        applier
            .entry(&mut entry)
            .map_err(|source| DiffError::Apply {
                diff: diff.to_path_buf(),
                rootfs: rootfs.to_path_buf(),
                entry: name,
                source,
            })?;
    }
    applier.finish().map_err(|source| DiffError::Apply {
        diff: diff.to_path_buf(),
        rootfs: rootfs.to_path_buf(),
        entry: String::new(),
        source,
    })?;
    Ok(applier.applied)
}

/// The diff as a tar stream (gzip detected by its magic bytes).
fn open(diff: &Path) -> io::Result<Box<dyn Read>> {
    reader_of(open_diff(diff)?)
}

fn reader_of(mut file: File) -> io::Result<Box<dyn Read>> {
    // A descriptor may have been read already (or share its offset with a clone that was).
    file.seek(SeekFrom::Start(0))?;
    let mut magic = [0u8; 2];
    let gzip = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    file.seek(SeekFrom::Start(0))?;
    Ok(if gzip {
        Box::new(flate2::read::GzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(BufReader::new(file))
    })
}

/// Every entry of `diff` is acceptable for the rootfs `root`; nothing is written. Besides each
/// entry on its own, no entry may lead through a symlink — one already in the rootfs, or one an
/// earlier entry creates — so the application cannot stop half-way on one. Returns the bytes of
/// file content it would write.
pub fn check(diff: &Path, root: BorrowedFd<'_>, limits: Limits) -> Result<u64, DiffError> {
    let unreadable = |source| DiffError::Unreadable {
        diff: diff.to_path_buf(),
        source,
    };
    let mut archive = tar::Archive::new(open(diff).map_err(unreadable)?);
    let (mut entries, mut bytes) = (0u64, 0u64);
    // What the entries so far make of each path: a directory or something else.
    let mut made: std::collections::HashMap<PathBuf, bool> = std::collections::HashMap::new();
    for entry in archive.entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        entries += 1;
        if entries > limits.max_entries {
            return Err(DiffError::TooLarge {
                diff: diff.to_path_buf(),
                reason: format!("more than {} entries", limits.max_entries),
            });
        }
        bytes = bytes.saturating_add(entry.header().size().unwrap_or(u64::MAX));
        if bytes > limits.max_bytes {
            return Err(DiffError::TooLarge {
                diff: diff.to_path_buf(),
                reason: format!("more than {} bytes of file content", limits.max_bytes),
            });
        }
        let name = entry.path_bytes().into_owned();
        let refused = |reason: String| DiffError::Refused {
            diff: diff.to_path_buf(),
            entry: String::from_utf8_lossy(&name).into_owned(),
            reason,
        };
        check_entry(&mut entry).map_err(refused)?;
        let rel: PathBuf = beneath::components(Path::new(OsStr::from_bytes(&name)))
            .expect("checked above")
            .into_iter()
            .collect();
        let mut ancestor = PathBuf::new();
        for c in rel.parent().into_iter().flat_map(Path::components) {
            ancestor.push(c);
            let is_dir = match made.get(&ancestor) {
                Some(dir) => *dir,
                None => match beneath::parent_of(root, &ancestor, None)
                    .and_then(|(p, n)| beneath::file_type_at(p.as_fd(), &n))
                {
                    Ok(Some(t)) => t == FileType::Directory,
                    // Missing: the application creates it as a directory.
                    Ok(None) => true,
                    Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => true,
                    Err(_) => false,
                },
            };
            if !is_dir {
                return Err(refused(format!(
                    "{} is not a directory (a symlink?); an entry may not lead through it",
                    ancestor.display()
                )));
            }
            made.insert(ancestor.clone(), true);
        }
        let name_bytes = rel.file_name().map(OsStr::as_bytes).unwrap_or_default();
        if name_bytes.starts_with(WHITEOUT_PREFIX) {
            if name_bytes != OPAQUE {
                let victim =
                    rel.with_file_name(OsStr::from_bytes(&name_bytes[WHITEOUT_PREFIX.len()..]));
                made.retain(|p, _| !p.starts_with(&victim));
            }
        } else {
            made.retain(|p, _| !p.starts_with(&rel) || *p == rel);
            made.insert(
                rel,
                entry.header().entry_type() == tar::EntryType::Directory,
            );
        }
    }
    Ok(bytes)
}

fn check_entry<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<(), String> {
    let raw = entry.path_bytes().into_owned();
    let path = PathBuf::from(OsStr::from_bytes(&raw));
    beneath::components(&path).map_err(|e| format!("not a path beneath the rootfs: {e}"))?;
    let name = path.file_name().map(OsStr::as_bytes).unwrap_or_default();
    if name != OPAQUE {
        if let Some(victim) = name.strip_prefix(WHITEOUT_PREFIX) {
            if victim.is_empty() || victim == b"." || victim == b".." || victim.contains(&b'/') {
                return Err("a whiteout must name one entry of its directory".into());
            }
        }
    }
    let header = entry.header();
    let kind = header.entry_type();
    match kind {
        tar::EntryType::Directory
        | tar::EntryType::Regular
        | tar::EntryType::Continuous
        | tar::EntryType::Symlink
        | tar::EntryType::Fifo => {}
        tar::EntryType::Link => {
            let target = entry
                .link_name_bytes()
                .ok_or("a hard link without a target")?;
            beneath::components(Path::new(OsStr::from_bytes(&target)))
                .map_err(|e| format!("hard link target is not beneath the rootfs: {e}"))?;
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            return Err("a rootfs diff may not create device nodes".into())
        }
        other => {
            return Err(format!(
                "entry type {other:?} is not allowed in a rootfs diff"
            ))
        }
    }
    if kind == tar::EntryType::Symlink && entry.link_name_bytes().is_none() {
        return Err("a symlink without a target".into());
    }
    for id in [header.uid(), header.gid()] {
        match id {
            Ok(v) if v < u64::from(u32::MAX) => {}
            _ => return Err("owner is not a valid uid/gid".into()),
        }
    }
    header.mode().map_err(|e| format!("mode: {e}"))?;
    header.mtime().map_err(|e| format!("mtime: {e}"))?;
    if let Some(pax) = entry.pax_extensions().map_err(|e| e.to_string())? {
        for ext in pax {
            ext.map_err(|e| format!("PAX header: {e}"))?;
        }
    }
    Ok(())
}

struct Applier<'a> {
    root: BorrowedFd<'a>,
    /// Paths this diff created, which an opaque marker keeps.
    unpacked: HashSet<PathBuf>,
    /// Directory times, set at the end (their content changes them).
    dir_times: Vec<(PathBuf, i64)>,
    applied: Applied,
}

impl Applier<'_> {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> io::Result<()> {
        let raw = entry.path_bytes().into_owned();
        let rel: PathBuf = beneath::components(Path::new(OsStr::from_bytes(&raw)))
            .map_err(io::Error::other)?
            .into_iter()
            .collect();
        let (parent, name) = beneath::parent_of(self.root, &rel, Some(0o755))?;
        let p = parent.as_fd();
        let nb = name.as_bytes();
        self.applied.entries += 1;

        if nb == OPAQUE {
            let dir = beneath::openat2(
                p,
                Path::new("."),
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            )?;
            let base = rel.parent().unwrap_or(Path::new("")).to_path_buf();
            let unpacked = &self.unpacked;
            return beneath::empty_dir(dir.as_fd(), &|n| unpacked.contains(&base.join(n)));
        }
        if let Some(victim) = nb.strip_prefix(WHITEOUT_PREFIX) {
            return beneath::remove_all_at(p, OsStr::from_bytes(victim));
        }

        let header = entry.header().clone();
        let kind = header.entry_type();
        let (uid, gid) = (header.uid()? as u32, header.gid()? as u32);
        let mode = header.mode()?;
        let mtime = header.mtime()? as i64;
        let xattrs = xattrs(entry)?;
        let mut file: Option<OwnedFd> = None;
        match kind {
            tar::EntryType::Directory => match beneath::file_type_at(p, &name)? {
                Some(FileType::Directory) => {}
                Some(_) => {
                    beneath::remove_all_at(p, &name)?;
                    rfs::mkdirat(p, &name, Mode::from_raw_mode(0o700))?;
                }
                None => rfs::mkdirat(p, &name, Mode::from_raw_mode(0o700))?,
            },
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                beneath::remove_all_at(p, &name)?;
                let fd = beneath::openat2(
                    p,
                    Path::new(&name),
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                    Mode::from_raw_mode(0o600),
                )?;
                let mut out = File::from(fd);
                // The entry reads exactly the size its header gives.
                self.applied.bytes += io::copy(entry, &mut out)?;
                file = Some(out.into());
            }
            tar::EntryType::Symlink => {
                beneath::remove_all_at(p, &name)?;
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                // Stored as data: the target is never resolved.
                rfs::symlinkat(OsStr::from_bytes(&target), p, &name)?;
            }
            tar::EntryType::Link => {
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                let (tparent, tname) =
                    beneath::parent_of(self.root, Path::new(OsStr::from_bytes(&target)), None)?;
                if beneath::file_type_at(tparent.as_fd(), &tname)? == Some(FileType::Directory) {
                    return Err(io::Error::other("a hard link to a directory"));
                }
                beneath::remove_all_at(p, &name)?;
                // Flags 0: linkat never dereferences a symlink target.
                rfs::linkat(&tparent, &tname, p, &name, AtFlags::empty())?;
                // The link shares its target's inode and metadata.
                self.unpacked.insert(rel);
                return Ok(());
            }
            tar::EntryType::Fifo => {
                beneath::remove_all_at(p, &name)?;
                rfs::mknodat(p, &name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)?;
            }
            other => {
                return Err(io::Error::other(format!("entry type {other:?}")));
            }
        }
        self.set_metadata(p, &name, file.as_ref(), kind, uid, gid, mode, &xattrs)?;
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: mtime,
                tv_nsec: 0,
            },
            last_modification: Timespec {
                tv_sec: mtime,
                tv_nsec: 0,
            },
        };
        if kind == tar::EntryType::Directory {
            self.dir_times.push((rel.clone(), mtime));
        } else {
            rfs::utimensat(p, &name, &times, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        self.unpacked.insert(rel);
        Ok(())
    }

    /// Owner, then mode (a change of owner clears setuid/setgid), then attributes. Privileged
    /// bits and capabilities only go with the owner the tar records.
    #[allow(clippy::too_many_arguments)]
    fn set_metadata(
        &mut self,
        p: BorrowedFd<'_>,
        name: &OsStr,
        file: Option<&OwnedFd>,
        kind: tar::EntryType,
        uid: u32,
        gid: u32,
        mode: u32,
        xattrs: &[(String, Vec<u8>)],
    ) -> io::Result<()> {
        let owner = (Some(rfs::Uid::from_raw(uid)), Some(rfs::Gid::from_raw(gid)));
        let owned = match file {
            Some(fd) => rfs::fchown(fd, owner.0, owner.1),
            None => rfs::chownat(p, name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW),
        }
        .is_ok();
        let mut mode = mode & 0o7777;
        if !owned && mode & 0o6000 != 0 {
            mode &= !0o6000;
            self.applied.privileges_dropped += 1;
        }
        if kind != tar::EntryType::Symlink {
            match file {
                Some(fd) => rfs::fchmod(fd, Mode::from_raw_mode(mode))?,
                None => beneath::chmod_at(p, name, mode)?,
            }
        }
        for (key, value) in xattrs {
            let allowed = key.starts_with("user.") || (key == "security.capability" && owned);
            if !allowed {
                if key == "security.capability" {
                    self.applied.privileges_dropped += 1;
                }
                tracing::debug!(key, "extended attribute of a rootfs diff entry not applied");
                continue;
            }
            let set = match file {
                Some(fd) => rfs::fsetxattr(fd, key.as_str(), value, XattrFlags::empty()),
                None => rfs::lsetxattr(
                    beneath::proc_path(p, name),
                    key.as_str(),
                    value,
                    XattrFlags::empty(),
                ),
            };
            match set {
                // A filesystem without user xattrs (tmpfs before 6.6) loses nothing that grants
                // anything.
                Ok(()) | Err(Errno::NOTSUP) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Directory times, deepest first, once their content is in place.
    fn finish(&mut self) -> io::Result<()> {
        self.dir_times
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
        for (rel, mtime) in &self.dir_times {
            let (parent, name) = beneath::parent_of(self.root, rel, None)?;
            let t = Timespec {
                tv_sec: *mtime,
                tv_nsec: 0,
            };
            rfs::utimensat(
                parent.as_fd(),
                &name,
                &Timestamps {
                    last_access: t,
                    last_modification: t,
                },
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        Ok(())
    }
}

/// The entry's extended attributes (PAX `SCHILY.xattr.*`).
fn xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    if let Some(pax) = entry.pax_extensions()? {
        for ext in pax {
            let ext = ext?;
            if let Some(key) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") {
                out.push((
                    String::from_utf8_lossy(key).into_owned(),
                    ext.value_bytes().to_vec(),
                ));
            }
        }
    }
    Ok(out)
}

/// SHA-256 of a diff file, hex (opened as [`open_diff`] does: never through a symlink).
pub fn sha256_file(path: &Path) -> io::Result<String> {
    sha256_of(open_diff(path)?)
}

/// SHA-256 of an opened file, hex.
pub fn sha256_of(mut f: File) -> io::Result<String> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    io::copy(&mut f, &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Opens the diff `path`: its directory is trusted (the checkpoint's, resolved by the caller),
/// its last component is opened beneath it and must be a regular file, not a symlink.
pub fn open_diff(path: &Path) -> io::Result<File> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
    let dir = beneath::open_root(parent)?;
    beneath::open_file(dir.as_fd(), Path::new(name))
}

/// The bytes of file content the diff in `file` (`shown` in errors) holds once decompressed,
/// counted from its tar headers and refused as soon as they pass `cap`: what a restore would
/// write, known before it writes anything. Reading it inflates the whole stream (CPU only;
/// nothing is written).
pub fn content_bytes(file: File, shown: &Path, cap: u64) -> Result<u64, DiffError> {
    let reader = reader_of(file).map_err(|source| DiffError::Unreadable {
        diff: shown.to_path_buf(),
        source,
    })?;
    count_content(reader, shown, cap)
}

/// [`content_bytes`] of a diff read as a stream (gzip or plain tar, told by its first bytes),
/// e.g. the `rootfs-diff.tar` member of an image layer.
pub fn content_bytes_in(stream: impl Read, shown: &Path, cap: u64) -> Result<u64, DiffError> {
    let mut stream = BufReader::new(stream);
    let gzip = stream
        .fill_buf()
        .map_err(|source| DiffError::Unreadable {
            diff: shown.to_path_buf(),
            source,
        })?
        .starts_with(&[0x1f, 0x8b]);
    if gzip {
        count_content(flate2::read::GzDecoder::new(stream), shown, cap)
    } else {
        count_content(stream, shown, cap)
    }
}

fn count_content(reader: impl Read, shown: &Path, cap: u64) -> Result<u64, DiffError> {
    let unreadable = |source| DiffError::Unreadable {
        diff: shown.to_path_buf(),
        source,
    };
    let mut archive = tar::Archive::new(reader);
    let mut bytes = 0u64;
    for entry in archive.entries().map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        bytes = bytes.saturating_add(entry.header().size().unwrap_or(u64::MAX));
        if bytes > cap {
            return Err(DiffError::TooLarge {
                diff: shown.to_path_buf(),
                reason: format!("more than {cap} bytes of file content once decompressed"),
            });
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// One raw tar entry: name and link target written byte for byte, so hostile names can be
    /// built (`tar::Builder` refuses them).
    #[derive(Clone)]
    struct E<'a> {
        name: &'a str,
        kind: tar::EntryType,
        data: &'a [u8],
        link: Option<&'a str>,
        uid: u64,
        mode: u32,
        xattrs: &'a [(&'a str, &'a [u8])],
    }

    fn e<'a>(name: &'a str, kind: tar::EntryType) -> E<'a> {
        E {
            name,
            kind,
            data: b"",
            link: None,
            uid: 0,
            mode: if kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            },
            xattrs: &[],
        }
    }

    fn file<'a>(name: &'a str, data: &'a [u8]) -> E<'a> {
        E {
            data,
            ..e(name, tar::EntryType::Regular)
        }
    }

    fn link<'a>(name: &'a str, target: &'a str) -> E<'a> {
        E {
            link: Some(target),
            ..e(name, tar::EntryType::Symlink)
        }
    }

    fn tar_of(entries: &[E<'_>], gzip: bool) -> tempfile::NamedTempFile {
        let out = tempfile::NamedTempFile::new().unwrap();
        let w: Box<dyn Write> = if gzip {
            Box::new(flate2::write::GzEncoder::new(
                out.reopen().unwrap(),
                flate2::Compression::fast(),
            ))
        } else {
            Box::new(out.reopen().unwrap())
        };
        let mut b = tar::Builder::new(w);
        for en in entries {
            if !en.xattrs.is_empty() {
                let exts: Vec<(String, &[u8])> = en
                    .xattrs
                    .iter()
                    .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
                    .collect();
                b.append_pax_extensions(exts.iter().map(|(k, v)| (k.as_str(), *v)))
                    .unwrap();
            }
            let mut h = tar::Header::new_gnu();
            h.as_old_mut().name[..en.name.len()].copy_from_slice(en.name.as_bytes());
            h.set_entry_type(en.kind);
            h.set_size(en.data.len() as u64);
            h.set_mode(en.mode);
            h.set_uid(en.uid);
            h.set_gid(en.uid);
            h.set_mtime(1_000_000_000);
            if let Some(l) = en.link {
                h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_cksum();
            b.append(&h, en.data).unwrap();
        }
        b.into_inner().unwrap().flush().unwrap();
        out
    }

    /// A rootfs beside a host tree the diff must never touch.
    struct Scene {
        _top: tempfile::TempDir,
        rootfs: PathBuf,
        host: PathBuf,
    }

    fn scene() -> Scene {
        let top = tempfile::tempdir().unwrap();
        let rootfs = top.path().join("rootfs");
        let host = top.path().join("host");
        fs::create_dir_all(rootfs.join("etc/old")).unwrap();
        fs::write(rootfs.join("etc/old/a"), b"a").unwrap();
        fs::write(rootfs.join("etc/gone"), b"x").unwrap();
        fs::write(rootfs.join("etc/kept"), b"k").unwrap();
        fs::create_dir_all(host.join("dir")).unwrap();
        fs::write(host.join("secret"), b"host").unwrap();
        fs::write(host.join("dir/file"), b"host").unwrap();
        Scene {
            _top: top,
            rootfs,
            host,
        }
    }

    fn host_intact(s: &Scene) {
        assert_eq!(fs::read(s.host.join("secret")).unwrap(), b"host");
        assert_eq!(fs::read(s.host.join("dir/file")).unwrap(), b"host");
    }

    #[test]
    fn files_whiteouts_and_opaque_dirs_follow_oci_semantics() {
        let s = scene();
        let diff = tar_of(
            &[
                e("etc/", tar::EntryType::Directory),
                file("etc/.wh.gone", b""),
                e("etc/old/", tar::EntryType::Directory),
                file("etc/old/b", b"new"),
                // The marker after this layer's own file: it keeps it, hides the rest.
                file("etc/old/.wh..wh..opq", b""),
                file("data/count", b"42\n"),
                link("data/abs", "/etc/kept"),
            ],
            true,
        );
        let applied = apply(diff.path(), &s.rootfs, Limits::default()).unwrap();
        assert_eq!(applied.entries, 7);
        let r = &s.rootfs;
        assert!(!r.join("etc/gone").exists(), "whiteout removed the file");
        assert_eq!(fs::read(r.join("etc/kept")).unwrap(), b"k");
        assert!(
            !r.join("etc/old/a").exists(),
            "opaque: lower content hidden"
        );
        assert_eq!(
            fs::read(r.join("etc/old/b")).unwrap(),
            b"new",
            "own content kept"
        );
        assert_eq!(fs::read(r.join("data/count")).unwrap(), b"42\n");
        assert_eq!(
            fs::read_link(r.join("data/abs")).unwrap(),
            Path::new("/etc/kept"),
            "symlinks are data"
        );
    }

    #[test]
    fn hostile_names_are_refused_before_anything_is_applied() {
        for (what, entries) in [
            ("dotdot", vec![file("../host/secret", b"pwned")]),
            ("absolute", vec![file("/etc/passwd", b"pwned")]),
            ("whiteout dotdot", vec![file("etc/.wh...", b"")]),
            ("whiteout dot", vec![file("etc/.wh..", b"")]),
            ("whiteout empty", vec![file("etc/.wh.", b"")]),
            ("device", vec![e("dev/sda", tar::EntryType::Block)]),
            ("char device", vec![e("dev/mem", tar::EntryType::Char)]),
            (
                "hard link out",
                vec![E {
                    link: Some("../host/secret"),
                    ..e("x", tar::EntryType::Link)
                }],
            ),
            (
                "symlink then through it",
                vec![link("evil", "../host"), file("evil/secret", b"pwned")],
            ),
            (
                "symlink then whiteout through it",
                vec![link("evil", "../host"), file("evil/.wh.secret", b"")],
            ),
            (
                "symlink then opaque through it",
                vec![link("evil", "/"), file("evil/.wh..wh..opq", b"")],
            ),
        ] {
            let s = scene();
            let diff = tar_of(
                &[&[file("first", b"written?")][..], &entries[..]].concat(),
                false,
            );
            let err = apply(diff.path(), &s.rootfs, Limits::default())
                .expect_err(what)
                .to_string();
            assert!(
                err.contains("refused") && err.contains("nothing was applied"),
                "{what}: {err}"
            );
            assert!(
                !s.rootfs.join("first").exists(),
                "{what}: checked before applying"
            );
            host_intact(&s);
        }
    }

    #[test]
    fn a_symlink_already_in_the_rootfs_is_never_followed() {
        let s = scene();
        std::os::unix::fs::symlink(&s.host, s.rootfs.join("planted")).unwrap();
        for entries in [
            vec![file("planted/secret", b"pwned")],
            vec![file("planted/.wh.secret", b"")],
            vec![file("planted/dir/.wh..wh..opq", b"")],
        ] {
            let diff = tar_of(&entries, false);
            let err = apply(diff.path(), &s.rootfs, Limits::default()).unwrap_err();
            assert!(err.to_string().contains("not a directory"), "{err}");
            host_intact(&s);
        }
        // Replacing the symlink itself is fine: it is removed, not followed.
        let diff = tar_of(&[file("planted", b"now a file")], false);
        apply(diff.path(), &s.rootfs, Limits::default()).unwrap();
        assert_eq!(fs::read(s.rootfs.join("planted")).unwrap(), b"now a file");
        host_intact(&s);
    }

    #[test]
    fn ownership_mode_and_privileges_follow_the_tar() {
        let s = scene();
        let diff = tar_of(
            &[
                E {
                    uid: 1000,
                    mode: 0o4755,
                    ..file("bin/tool", b"#!/bin/sh\n")
                },
                E {
                    uid: 1000,
                    mode: 0o600,
                    ..file("home/user/key", b"secret")
                },
                E {
                    xattrs: &[("trusted.overlay.opaque", b"y"), ("user.note", b"1")],
                    ..file("x", b"")
                },
            ],
            false,
        );
        let applied = apply(diff.path(), &s.rootfs, Limits::default()).unwrap();
        let tool = fs::metadata(s.rootfs.join("bin/tool")).unwrap();
        assert_eq!((tool.uid(), tool.gid()), (1000, 1000), "owner from the tar");
        assert_eq!(
            tool.permissions().mode() & 0o7777,
            0o4755,
            "setuid stays with its owner"
        );
        let key = fs::metadata(s.rootfs.join("home/user/key")).unwrap();
        assert_eq!((key.uid(), key.permissions().mode() & 0o777), (1000, 0o600));
        assert_eq!(applied.privileges_dropped, 0);
        assert_eq!(tool.mtime(), 1_000_000_000);
    }

    #[test]
    fn size_and_entry_limits_are_enforced_before_writing() {
        let s = scene();
        let diff = tar_of(&[file("a", &[1u8; 4096]), file("b", &[2u8; 4096])], true);
        let small = Limits {
            max_bytes: 6000,
            max_entries: 10,
        };
        let err = apply(diff.path(), &s.rootfs, small).unwrap_err();
        assert!(err.to_string().contains("6000 bytes"), "{err}");
        assert!(!s.rootfs.join("a").exists());
        let few = Limits {
            max_bytes: 1 << 20,
            max_entries: 1,
        };
        assert!(apply(diff.path(), &s.rootfs, few).is_err());
    }
}
