//! Applying a checkpoint's rootfs diff (`rootfs-diff.tar` of a CRI checkpoint archive: the
//! container's writable-layer changes, often gzip-compressed despite the name) onto a fresh
//! rootfs before CRIU restores processes that expect those files — with OCI layer semantics and
//! as untrusted input.
//!
//! - **Checked whole before anything changes**: every name is plain and relative (and at most
//!   [`MAX_NAME_BYTES`]), every type is one a container's writable layer has (directory, file,
//!   symlink, hard link, fifo; no device nodes), whiteout names are refused when empty, `.`,
//!   `..` or a path, a directory has at most one opaque marker, ownership is a real uid/gid, no
//!   entry leads through a symlink (one in the rootfs, or one an earlier entry makes), hard
//!   links name an existing non-directory, and the stream stays under [`Limits`] — entries,
//!   file content, and the decompressed size counted as it is read (headers, extension records
//!   and padding too), so a gzip bomb is refused at the cap, not inflated whole.
//! - **Linear**: the check keeps what the entries so far make of the rootfs in a trie of path
//!   components (`tree`), one step per component of each name; the application opens each
//!   entry's parent once per run of entries in the same directory. 200,000 entries take
//!   seconds (`cargo run --release -p gpusnap-checkpoint --example rootfs_diff_scale`).
//! - **Bounded in time**: [`Limits::deadline`] is looked at on every read of the stream and
//!   every entry, in the check and in the application ([`DiffError::Deadline`] names which).
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

mod stream;
mod tree;

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};
use rustix::io::Errno;

use crate::beneath;
use tree::{Made, Tree};

/// Why one entry of a rootfs diff is refused before anything is applied (the `reason` of
/// [`DiffError::Refused`]).
#[derive(Debug, thiserror::Error)]
enum EntryRefusal {
    #[error("a name of {len} bytes; at most {max} (PATH_MAX)", max = MAX_NAME_BYTES)]
    NameTooLong { len: usize },
    #[error("not a path beneath the rootfs: {0}")]
    NotBeneath(#[source] beneath::NameError),
    #[error("a whiteout must name one entry of its directory")]
    Whiteout,
    #[error("a hard link without a target")]
    LinkWithoutTarget,
    #[error("hard link target is not beneath the rootfs: {0}")]
    LinkNotBeneath(#[source] beneath::NameError),
    #[error("a rootfs diff may not create device nodes")]
    DeviceNode,
    #[error("entry type {0:?} is not allowed in a rootfs diff")]
    EntryType(tar::EntryType),
    #[error("a symlink without a target")]
    SymlinkWithoutTarget,
    #[error("owner is not a valid uid/gid")]
    Owner,
    #[error("mode: {0}")]
    Mode(#[source] io::Error),
    #[error("mtime: {0}")]
    Mtime(#[source] io::Error),
    #[error("{0}")]
    Pax(#[source] io::Error),
    #[error("PAX header: {0}")]
    PaxHeader(#[source] io::Error),
    /// The rootfs could not be looked at where the entry leads.
    #[error("looking up {} in the rootfs: {source}", at.display())]
    Lookup {
        at: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not a directory (a symlink?); an entry may not lead through it", at.display())]
    NotADirectory { at: PathBuf },
    #[error("hard link target {} is a directory or does not exist", at.display())]
    LinkTarget { at: PathBuf },
}

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// The longest entry name accepted (Linux's `PATH_MAX`): the name of a file a container wrote.
pub const MAX_NAME_BYTES: usize = 4096;

/// The default of [`Limits::max_entries`] (and of `restore.max_rootfs_diff_entries`).
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;
/// The most entries [`content_bytes`] counts (adopt, pull): well above any restore's cap, so
/// that only an endless stream of entries stops the count.
pub const COUNT_MAX_ENTRIES: u64 = 1 << 20;

/// Bounds on what a diff may make a restore write, and when it must be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file content, after decompression (what an origin record counted).
    pub max_bytes: u64,
    /// Bytes of the decompressed tar stream: headers, extension records, padding and content
    /// (`restore.max_rootfs_diff_bytes`). Counted as the stream is read, in the check, so a
    /// diff that inflates past it is refused there, before anything is written.
    pub max_inflated_bytes: u64,
    /// Tar entries (files, directories, links, whiteouts), counted in the check
    /// (`restore.max_rootfs_diff_entries`): what a diff costs to apply grows with its entries
    /// as much as with its bytes (a file system creates a few thousand to a few ten thousand
    /// files a second), so a diff of many empty files is refused here, before anything is
    /// written, instead of holding the restore until its deadline.
    pub max_entries: u64,
    /// When the check and the application must have ended: passed, either stops with
    /// [`DiffError::Deadline`] (the restore's deadline; `None`: no deadline).
    pub deadline: Option<Instant>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 64 << 30,
            max_inflated_bytes: 64 << 30,
            max_entries: DEFAULT_MAX_ENTRIES,
            deadline: None,
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

/// Which pass over a diff an error stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The check of every entry, before anything is written.
    Check,
    /// The application, after the check passed.
    Apply,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Check => "checking the rootfs diff (nothing was applied)",
            Phase::Apply => {
                "applying the rootfs diff (the rootfs holds the entries applied so far)"
            }
        })
    }
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
    /// More entries than [`Limits::max_entries`].
    #[error("{diff}: more than {max} entries; nothing was applied")]
    TooManyEntries { diff: PathBuf, max: u64 },
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
    #[error("{diff}: the restore's deadline passed while {phase}, after {entries} entries")]
    Deadline {
        diff: PathBuf,
        phase: Phase,
        entries: u64,
    },
}

impl DiffError {
    /// Whether the rootfs is as it was: the error came before the application wrote anything.
    pub fn nothing_applied(&self) -> bool {
        match self {
            DiffError::Refused { .. }
            | DiffError::TooLarge { .. }
            | DiffError::TooManyEntries { .. }
            | DiffError::Unreadable { .. } => true,
            DiffError::Deadline { phase, .. } => *phase == Phase::Check,
            DiffError::Apply { .. } => false,
        }
    }
}

/// Checks the whole of `diff` against `rootfs`, then applies it. The diff is opened once, so
/// what is applied is what was checked.
pub fn apply(diff: &Path, rootfs: &Path, limits: Limits) -> Result<Applied, DiffError> {
    let failed = |source| DiffError::Apply {
        diff: diff.to_path_buf(),
        rootfs: rootfs.to_path_buf(),
        entry: String::new(),
        source,
    };
    let unreadable = |source| DiffError::Unreadable {
        diff: diff.to_path_buf(),
        source,
    };
    let root = beneath::open_root(rootfs).map_err(failed)?;
    let mut file = open_diff(diff).map_err(unreadable)?;
    let started = Instant::now();
    let checked = check_stream(
        file.try_clone().map_err(unreadable)?,
        diff,
        root.as_fd(),
        &limits,
    )?;
    let checked_in = started.elapsed();
    // The rootfs's file system must hold it: a diff that fills the disk is refused unwritten.
    let free = beneath::available_bytes(root.as_fd()).map_err(failed)?;
    if checked.content > free {
        return Err(DiffError::TooLarge {
            diff: diff.to_path_buf(),
            reason: format!(
                "{} bytes of file content, but the file system of {} has {free} bytes free",
                checked.content,
                rootfs.display()
            ),
        });
    }
    file.seek(SeekFrom::Start(0)).map_err(unreadable)?;
    let mut applier = Applier {
        root: root.as_fd(),
        parent: None,
        unpacked: HashSet::new(),
        dir_times: Vec::new(),
        applied: Applied::default(),
        deadline: limits.deadline,
    };
    stream::each_entry(file, diff, &limits, Phase::Apply, &mut |entry| {
        applier.entry(entry).map_err(|source| DiffError::Apply {
            diff: diff.to_path_buf(),
            rootfs: rootfs.to_path_buf(),
            entry: String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
            source,
        })
    })?;
    applier.finish().map_err(|source| match source.kind() {
        io::ErrorKind::TimedOut => DiffError::Deadline {
            diff: diff.to_path_buf(),
            phase: Phase::Apply,
            entries: checked.entries,
        },
        _ => failed(source),
    })?;
    tracing::debug!(
        diff = %diff.display(),
        entries = checked.entries,
        content_bytes = checked.content,
        inflated_bytes = checked.inflated,
        check_ms = checked_in.as_millis() as u64,
        apply_ms = (started.elapsed() - checked_in).as_millis() as u64,
        "rootfs diff checked and applied"
    );
    Ok(applier.applied)
}

/// Every entry of `diff` is acceptable for the rootfs `root`; nothing is written. Besides each
/// entry on its own, no entry may lead through a symlink — one already in the rootfs, or one an
/// earlier entry creates — so the application cannot stop half-way on one. Returns the bytes of
/// file content it would write.
pub fn check(diff: &Path, root: BorrowedFd<'_>, limits: Limits) -> Result<u64, DiffError> {
    let file = open_diff(diff).map_err(|source| DiffError::Unreadable {
        diff: diff.to_path_buf(),
        source,
    })?;
    Ok(check_stream(file, diff, root, &limits)?.content)
}

fn check_stream(
    mut file: File,
    diff: &Path,
    root: BorrowedFd<'_>,
    limits: &Limits,
) -> Result<stream::Pass, DiffError> {
    // A descriptor may have been read already (or share its offset with a clone that was).
    file.seek(SeekFrom::Start(0))
        .map_err(|source| DiffError::Unreadable {
            diff: diff.to_path_buf(),
            source,
        })?;
    let mut tree = Tree::new(root);
    // Directories given an opaque marker: a second one would list the directory again.
    let mut opaque: HashSet<PathBuf> = HashSet::new();
    stream::each_entry(file, diff, limits, Phase::Check, &mut |entry| {
        let name = entry.path_bytes().into_owned();
        let refused = |reason: String| DiffError::Refused {
            diff: diff.to_path_buf(),
            entry: String::from_utf8_lossy(&name).into_owned(),
            reason,
        };
        check_entry(entry).map_err(|e| refused(e.to_string()))?;
        let comps = beneath::components(Path::new(OsStr::from_bytes(&name)))
            .map_err(|e| refused(format!("not a path beneath the rootfs: {e}")))?;
        let comps: Vec<&[u8]> = comps.iter().map(|c| c.as_bytes()).collect();
        let (last, dirs) = comps.split_last().expect("components is never empty");
        let parent = tree.dir(dirs).map_err(|e| refused(e.to_string()))?;
        let rel: PathBuf = comps.iter().map(|c| OsStr::from_bytes(c)).collect();
        if *last == OPAQUE {
            if !opaque.insert(rel) {
                return Err(refused(
                    "a second opaque marker for the same directory".into(),
                ));
            }
            return Ok(());
        }
        if let Some(victim) = last.strip_prefix(WHITEOUT_PREFIX) {
            tree.remove(parent, victim);
            return Ok(());
        }
        let made = match entry.header().entry_type() {
            tar::EntryType::Directory => Made::Dir,
            tar::EntryType::Link => {
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                let target = beneath::components(Path::new(OsStr::from_bytes(&target)))
                    .map_err(|e| refused(format!("hard link target: {e}")))?;
                let target: Vec<&[u8]> = target.iter().map(|c| c.as_bytes()).collect();
                if target == comps {
                    return Err(refused("a hard link to itself".into()));
                }
                tree.link_target(&target)
                    .map_err(|e| refused(e.to_string()))?;
                Made::Other
            }
            _ => Made::Other,
        };
        tree.make(parent, last, &rel, made);
        Ok(())
    })
}

fn check_entry<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<(), EntryRefusal> {
    let raw = entry.path_bytes().into_owned();
    if raw.len() > MAX_NAME_BYTES {
        return Err(EntryRefusal::NameTooLong { len: raw.len() });
    }
    let path = PathBuf::from(OsStr::from_bytes(&raw));
    beneath::components(&path).map_err(EntryRefusal::NotBeneath)?;
    let name = path.file_name().map(OsStr::as_bytes).unwrap_or_default();
    if name != OPAQUE {
        if let Some(victim) = name.strip_prefix(WHITEOUT_PREFIX) {
            if victim.is_empty() || victim == b"." || victim == b".." || victim.contains(&b'/') {
                return Err(EntryRefusal::Whiteout);
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
                .ok_or(EntryRefusal::LinkWithoutTarget)?;
            beneath::components(Path::new(OsStr::from_bytes(&target)))
                .map_err(EntryRefusal::LinkNotBeneath)?;
        }
        tar::EntryType::Char | tar::EntryType::Block => return Err(EntryRefusal::DeviceNode),
        other => return Err(EntryRefusal::EntryType(other)),
    }
    if kind == tar::EntryType::Symlink && entry.link_name_bytes().is_none() {
        return Err(EntryRefusal::SymlinkWithoutTarget);
    }
    for id in [header.uid(), header.gid()] {
        match id {
            Ok(v) if v < u64::from(u32::MAX) => {}
            _ => return Err(EntryRefusal::Owner),
        }
    }
    header.mode().map_err(EntryRefusal::Mode)?;
    header.mtime().map_err(EntryRefusal::Mtime)?;
    if let Some(pax) = entry.pax_extensions().map_err(EntryRefusal::Pax)? {
        for ext in pax {
            ext.map_err(EntryRefusal::PaxHeader)?;
        }
    }
    Ok(())
}

struct Applier<'a> {
    root: BorrowedFd<'a>,
    /// The last entry's directory and its descriptor: the next entry in the same directory
    /// (a tar lists a directory's entries together) is made there without resolving the path
    /// again. An entry changes only its own name and what lies beneath it, never its parent,
    /// so the descriptor stays the directory it was.
    parent: Option<(PathBuf, OwnedFd)>,
    /// Paths this diff created, which an opaque marker keeps.
    unpacked: HashSet<PathBuf>,
    /// Directory times, set at the end (their content changes them).
    dir_times: Vec<(PathBuf, i64)>,
    applied: Applied,
    deadline: Option<Instant>,
}

impl Applier<'_> {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> io::Result<()> {
        let raw = entry.path_bytes().into_owned();
        let rel: PathBuf = beneath::components(Path::new(OsStr::from_bytes(&raw)))
            .map_err(io::Error::other)?
            .into_iter()
            .collect();
        let dir = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let (parent, name) = match self.parent.take() {
            Some((at, fd)) if at == dir => {
                let name = rel.file_name().expect("a name has a last component");
                (fd, name.to_os_string())
            }
            _ => beneath::parent_of(self.root, &rel, Some(0o755))?,
        };
        let made = self.entry_in(parent.as_fd(), &rel, &name, entry);
        self.parent = Some((dir, parent));
        made
    }

    fn entry_in<R: Read>(
        &mut self,
        p: BorrowedFd<'_>,
        rel: &Path,
        name: &OsStr,
        entry: &mut tar::Entry<'_, R>,
    ) -> io::Result<()> {
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
            tar::EntryType::Directory => match beneath::file_type_at(p, name)? {
                Some(FileType::Directory) => {}
                Some(_) => {
                    beneath::remove_all_at(p, name)?;
                    rfs::mkdirat(p, name, Mode::from_raw_mode(0o700))?;
                }
                None => rfs::mkdirat(p, name, Mode::from_raw_mode(0o700))?,
            },
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let create = || {
                    beneath::openat2(
                        p,
                        Path::new(name),
                        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                        Mode::from_raw_mode(0o600),
                    )
                };
                // Most names are new: whatever is there is removed only when there is one.
                let fd = match create() {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        beneath::remove_all_at(p, name)?;
                        create()?
                    }
                    other => other?,
                };
                let mut out = File::from(fd);
                // The entry reads exactly the size its header gives.
                self.applied.bytes += io::copy(entry, &mut out)?;
                file = Some(out.into());
            }
            tar::EntryType::Symlink => {
                beneath::remove_all_at(p, name)?;
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                // Stored as data: the target is never resolved.
                rfs::symlinkat(OsStr::from_bytes(&target), p, name)?;
            }
            tar::EntryType::Link => {
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                let (tparent, tname) =
                    beneath::parent_of(self.root, Path::new(OsStr::from_bytes(&target)), None)?;
                if beneath::file_type_at(tparent.as_fd(), &tname)? == Some(FileType::Directory) {
                    return Err(io::Error::other("a hard link to a directory"));
                }
                beneath::remove_all_at(p, name)?;
                // Flags 0: linkat never dereferences a symlink target.
                rfs::linkat(&tparent, &tname, p, name, AtFlags::empty())?;
                // The link shares its target's inode and metadata.
                self.unpacked.insert(rel.to_path_buf());
                return Ok(());
            }
            tar::EntryType::Fifo => {
                beneath::remove_all_at(p, name)?;
                rfs::mknodat(p, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)?;
            }
            other => {
                return Err(io::Error::other(format!("entry type {other:?}")));
            }
        }
        self.set_metadata(p, name, file.as_ref(), kind, uid, gid, mode, &xattrs)?;
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
        match (kind, &file) {
            (tar::EntryType::Directory, _) => self.dir_times.push((rel.to_path_buf(), mtime)),
            (_, Some(fd)) => rfs::futimens(fd, &times)?,
            (_, None) => rfs::utimensat(p, name, &times, AtFlags::SYMLINK_NOFOLLOW)?,
        }
        self.unpacked.insert(rel.to_path_buf());
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

    /// Directory times, deepest first, once their content is in place. A directory a later
    /// entry removed has none to set. Past the deadline: `TimedOut`.
    fn finish(&mut self) -> io::Result<()> {
        self.dir_times
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
        for (rel, mtime) in &self.dir_times {
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::Error::from(io::ErrorKind::TimedOut));
            }
            let t = Timespec {
                tv_sec: *mtime,
                tv_nsec: 0,
            };
            let set = beneath::parent_of(self.root, rel, None).and_then(|(parent, name)| {
                rfs::utimensat(
                    parent.as_fd(),
                    &name,
                    &Timestamps {
                        last_access: t,
                        last_modification: t,
                    },
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(io::Error::from)
            });
            match set {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
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
/// counted from its tar entries and refused as soon as they pass `cap` (or the entries pass
/// [`COUNT_MAX_ENTRIES`]): what a restore would write, known before it writes anything.
/// Reading it inflates the stream (CPU only; nothing is written). The restore's own entry cap
/// (`restore.max_rootfs_diff_entries`) is the node's to apply when it restores, not here: root
/// may adopt or pull a diff before raising it.
pub fn content_bytes(mut file: File, shown: &Path, cap: u64) -> Result<u64, DiffError> {
    file.seek(SeekFrom::Start(0))
        .map_err(|source| DiffError::Unreadable {
            diff: shown.to_path_buf(),
            source,
        })?;
    content_bytes_in(file, shown, cap)
}

/// [`content_bytes`] of a diff read as a stream (gzip or plain tar, told by its first bytes),
/// e.g. the `rootfs-diff.tar` member of an image layer.
pub fn content_bytes_in(stream: impl Read, shown: &Path, cap: u64) -> Result<u64, DiffError> {
    let limits = Limits {
        max_bytes: cap,
        max_inflated_bytes: u64::MAX,
        max_entries: COUNT_MAX_ENTRIES,
        deadline: None,
    };
    Ok(stream::each_entry(stream, shown, &limits, Phase::Check, &mut |_| Ok(()))?.content)
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
            ..Limits::default()
        };
        let err = apply(diff.path(), &s.rootfs, small).unwrap_err();
        assert!(err.to_string().contains("6000 bytes"), "{err}");
        assert!(!s.rootfs.join("a").exists());
        let few = Limits {
            max_bytes: 1 << 20,
            max_entries: 1,
            ..Limits::default()
        };
        let err = apply(diff.path(), &s.rootfs, few).unwrap_err();
        assert!(
            matches!(err, DiffError::TooManyEntries { max: 1, .. }) && err.nothing_applied(),
            "{err:?}"
        );
        assert!(err.to_string().contains("more than 1 entries"), "{err}");
        assert!(!s.rootfs.join("a").exists());
    }

    /// A gzip stream of `entries` empty files: a few KiB that inflate to 512 bytes per entry
    /// and more (headers, the end-of-archive blocks).
    fn empty_files(entries: usize) -> tempfile::NamedTempFile {
        let names: Vec<String> = (0..entries).map(|i| format!("f{i}")).collect();
        let list: Vec<E<'_>> = names.iter().map(|n| file(n, b"")).collect();
        tar_of(&list, true)
    }

    #[test]
    fn the_decompressed_size_is_capped_while_it_is_read() {
        let s = scene();
        // 20,000 headers: 10 MiB once inflated, no file content at all (the content count
        // alone never refused this).
        let bomb = empty_files(20_000);
        assert!(fs::metadata(bomb.path()).unwrap().len() < 1 << 20);
        let limits = Limits {
            max_inflated_bytes: 1 << 20,
            ..Limits::default()
        };
        let err = apply(bomb.path(), &s.rootfs, limits).unwrap_err();
        assert!(
            matches!(err, DiffError::TooLarge { .. }) && err.nothing_applied(),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("inflates to more than 1048576 bytes")
                && text.contains("restore.max_rootfs_diff_bytes"),
            "{text}"
        );
        assert!(!s.rootfs.join("f0").exists(), "nothing written");
        // Under the cap it applies.
        let ok = Limits {
            max_inflated_bytes: 16 << 20,
            ..Limits::default()
        };
        assert_eq!(apply(bomb.path(), &s.rootfs, ok).unwrap().entries, 20_000);
    }

    /// A header every field of which a diff may hold (owner root, mode 0644, empty).
    fn plain_header(kind: tar::EntryType) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_000_000_000);
        h
    }

    #[test]
    fn a_pax_size_counts_as_content() {
        // The header says 0 bytes, a PAX record 8,192: the entry holds 8,192.
        let out = tempfile::NamedTempFile::new().unwrap();
        let mut b = tar::Builder::new(out.reopen().unwrap());
        b.append_pax_extensions([("size", &b"8192"[..])]).unwrap();
        let mut h = plain_header(tar::EntryType::Regular);
        h.as_old_mut().name[..3].copy_from_slice(b"big");
        h.set_cksum();
        b.append(&h, &[7u8; 8192][..]).unwrap();
        b.into_inner().unwrap().flush().unwrap();
        let s = scene();
        let limits = Limits {
            max_bytes: 4096,
            ..Limits::default()
        };
        let err = apply(out.path(), &s.rootfs, limits).unwrap_err();
        assert!(
            err.to_string().contains("4096 bytes of file content"),
            "{err}"
        );
        assert!(!s.rootfs.join("big").exists());
    }

    #[test]
    fn long_name_records_are_bounded() {
        // A GNU long name of 2 MiB (the tar reader would hold it in memory whole).
        let out = tempfile::NamedTempFile::new().unwrap();
        let mut b = tar::Builder::new(out.reopen().unwrap());
        let mut h = plain_header(tar::EntryType::GNULongName);
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_size(2 << 20);
        h.set_cksum();
        b.append(&h, &vec![b'a'; 2 << 20][..]).unwrap();
        let mut h = plain_header(tar::EntryType::Regular);
        h.as_old_mut().name[..1].copy_from_slice(b"x");
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
        b.into_inner().unwrap().flush().unwrap();
        let s = scene();
        let err = apply(out.path(), &s.rootfs, Limits::default()).unwrap_err();
        assert!(
            err.to_string().contains("long-name or PAX records") && err.nothing_applied(),
            "{err}"
        );
        // One of 5,000 bytes is read, and refused as longer than PATH_MAX.
        let long = "d/".repeat(2500);
        let err = apply(
            tar_of(&[file("first", b"")], false).path(),
            &s.rootfs,
            Limits::default(),
        );
        assert!(err.is_ok());
        let out = tempfile::NamedTempFile::new().unwrap();
        let mut b = tar::Builder::new(out.reopen().unwrap());
        let mut h = plain_header(tar::EntryType::Regular);
        b.append_data(&mut h, format!("{long}f"), &[][..]).unwrap();
        b.into_inner().unwrap().flush().unwrap();
        let err = apply(out.path(), &s.rootfs, Limits::default()).unwrap_err();
        assert!(err.to_string().contains("PATH_MAX"), "{err}");
    }

    #[test]
    fn a_deadline_stops_the_check_and_says_so() {
        let s = scene();
        let diff = empty_files(100);
        let limits = Limits {
            deadline: Some(Instant::now()),
            ..Limits::default()
        };
        let err = apply(diff.path(), &s.rootfs, limits).unwrap_err();
        assert!(
            matches!(
                err,
                DiffError::Deadline {
                    phase: Phase::Check,
                    ..
                }
            ) && err.nothing_applied(),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("deadline passed while checking the rootfs diff (nothing was applied)"),
            "{err}"
        );
        assert!(!s.rootfs.join("f0").exists());
    }

    /// What the application would stop on half-way is refused by the check, before anything
    /// is written.
    #[test]
    fn the_check_sees_what_earlier_entries_made() {
        for (what, entries, says) in [
            (
                // The second `d/` keeps the directory and what it holds: the symlink too.
                "a symlink kept by a directory entry over its directory",
                vec![
                    e("d/", tar::EntryType::Directory),
                    link("d/s", "../../host"),
                    e("d/", tar::EntryType::Directory),
                    file("d/s/x", b"pwned"),
                ],
                "not a directory",
            ),
            (
                "a hard link to a directory",
                vec![
                    e("d/", tar::EntryType::Directory),
                    E {
                        link: Some("d"),
                        ..e("h", tar::EntryType::Link)
                    },
                ],
                "is a directory or does not exist",
            ),
            (
                "a hard link to a name a whiteout removed",
                vec![
                    file("t", b"1"),
                    file(".wh.t", b""),
                    E {
                        link: Some("t"),
                        ..e("h", tar::EntryType::Link)
                    },
                ],
                "is a directory or does not exist",
            ),
            (
                "two opaque markers in one directory",
                vec![
                    file("etc/.wh..wh..opq", b""),
                    file("etc/x", b""),
                    file("etc/.wh..wh..opq", b""),
                ],
                "a second opaque marker",
            ),
        ] {
            let s = scene();
            let diff = tar_of(
                &[&[file("first", b"written?")][..], &entries[..]].concat(),
                false,
            );
            let err = apply(diff.path(), &s.rootfs, Limits::default()).expect_err(what);
            assert!(
                matches!(err, DiffError::Refused { .. }) && err.to_string().contains(says),
                "{what}: {err}"
            );
            assert!(!s.rootfs.join("first").exists(), "{what}: written");
            host_intact(&s);
        }
        // A directory replaced by a file and then made again holds nothing of the old one; a
        // name removed and made again is new; a hard link to a file made earlier is fine.
        let s = scene();
        let diff = tar_of(
            &[
                e("d/", tar::EntryType::Directory),
                link("d/s", "/"),
                file("d", b"now a file"),
                e("d/", tar::EntryType::Directory),
                file("d/s/x", b"fine"),
                file("etc/.wh.old", b""),
                file("etc/old/new", b"n"),
                file("t", b"t"),
                E {
                    link: Some("t"),
                    ..e("h", tar::EntryType::Link)
                },
            ],
            false,
        );
        apply(diff.path(), &s.rootfs, Limits::default()).unwrap();
        assert_eq!(fs::read(s.rootfs.join("d/s/x")).unwrap(), b"fine");
        assert_eq!(fs::read(s.rootfs.join("etc/old/new")).unwrap(), b"n");
        assert!(!s.rootfs.join("etc/old/a").exists());
        assert_eq!(fs::read(s.rootfs.join("h")).unwrap(), b"t");
    }
}
