//! A container's writable layer, described so that two honest copies of it agree and a replaced
//! one does not.
//!
//! Every runtime keeps a container's root filesystem as an overlay: the image's layers below,
//! one writable directory (the *upper* layer) on top. What the container wrote is in that upper
//! layer, and that is what travels with a checkpoint — as containerd's rw layer
//! (`ctr containers checkpoint --rw`), as a CRI or Podman archive's `rootfs-diff.tar`, applied
//! again on the restoring node by containerd, CRI-O, Podman or gpusnap itself. Under
//! `restore.signature_policy = require` the seal records it ([`describe`]: this module) and the
//! restore compares the restored container's upper layer with the record, after whatever the
//! runtime applied and before CRIU runs ([`compare`]).
//!
//! # What is recorded
//!
//! The raw upper directory differs between honest copies: a directory copied up only because
//! something below it changed is in the dumped layer but absent from a diff that did not need
//! it; a directory removed and made again is one *opaque* directory in the dumped layer and a
//! directory plus one whiteout per old entry once a tar diff is applied; a file merely opened
//! for writing is copied up unchanged. So the record describes the layer by its effect on the
//! image below it (the *lower* view, the overlay's lower layers merged as the kernel merges
//! them):
//!
//! - every entry of the upper layer that is not a whiteout, with what the container sees there
//!   (read through the merged mount): type, mode (with setuid/setgid/sticky), owner, size,
//!   BLAKE3 of the content, symlink target, device numbers, `security.capability` — unless it
//!   is a directory with the lower view's mode and owner, or a file identical to the lower
//!   view's (type, mode, owner, size, target, capabilities and content);
//! - every name the lower view has in a directory of the upper layer that the merged directory
//!   no longer shows (whiteouts and opaque directories alike): deleted.
//!
//! Times are not recorded (every copy has its own), nor overlay-internal attributes.
//!
//! # What the runtime makes
//!
//! runc creates, at a container's first start, the mount points the spec names when the image
//! lacks them (and their parent directories), and its working directory; Podman and CRI-O leave
//! those out of the rootfs diff they export, and a restore checks the layer before runc runs
//! again. Unix sockets bound in the layer are left out of every diff, and CRIU binds them again.
//! So the seal marks such entries *runtime-made*: a directory the lower view lacks that is a
//! mount point of the container (from its own mount table) or the working directory, or a parent
//! of one; an empty regular file the lower view lacks that is a mount point; a socket. A
//! runtime-made entry may be absent at restore; when present it must be exactly as recorded.
//!
//! # Where the layer is
//!
//! The root filesystem's mount is found by its mount id (`statx`), not by its name, in
//! `/proc/self/mountinfo`; it must be an overlay whose root is the container's root, with
//! absolute `upperdir` and `lowerdir` paths. Redirected directories (`redirect_dir=on`) are
//! refused: their content comes from elsewhere in the lower layers.
//!
//! The record is a file beside the manifest, [`LISTING_FILE`] (one JSON object per line, sorted
//! by path), whose size and BLAKE3 the manifest holds ([`WritableLayerRecord`]), so a signature
//! of the manifest covers it.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, StatxFlags};
use serde::{Deserialize, Serialize};

use crate::beneath;
// Re-exported where they used to be defined, for callers not yet moved to `layout`
// (transaction/src/volume.rs); new code imports them from `layout`.
use crate::layout::{LISTING_FILE, LISTING_MAX_BYTES};

/// At most this many entries are described; a larger layer is not recorded (and not restored
/// under `require`).
pub const MAX_ENTRIES: usize = 4 << 20;
/// Deepest directory nesting described.
pub const MAX_DEPTH: usize = 256;

/// What the manifest holds about the writable layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum WritableLayerRecord {
    /// The overlay's upper layer at the dump, described by [`LISTING_FILE`].
    Overlay {
        /// Size of [`LISTING_FILE`].
        listing_bytes: u64,
        /// BLAKE3 (hex) of [`LISTING_FILE`].
        listing_blake3: String,
        entries: u64,
        /// Bytes of regular file content described.
        content_bytes: u64,
    },
    /// It could not be recorded (why); a restore under `require` is refused.
    Unavailable { reason: String },
}

/// One entry of the description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the container's root, escaped ([`escape`]); `.` is the root itself.
    pub path: String,
    #[serde(flatten)]
    pub kind: Kind,
    /// Made by the runtime at start (see the module docs): may be absent at restore.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runtime_made: bool,
}

/// What an entry is, as the container sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Kind {
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    File {
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        blake3: String,
        /// `security.capability`, hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caps: Option<String>,
    },
    Symlink {
        uid: u32,
        gid: u32,
        /// Escaped ([`escape`]).
        target: String,
    },
    Char {
        mode: u32,
        uid: u32,
        gid: u32,
        major: u32,
        minor: u32,
    },
    Block {
        mode: u32,
        uid: u32,
        gid: u32,
        major: u32,
        minor: u32,
    },
    Fifo {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Socket {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// The lower view has it; the container no longer does.
    Deleted,
}

impl Kind {
    /// A few words for a refusal.
    pub fn summary(&self) -> String {
        match self {
            Kind::Dir { mode, uid, gid } => format!("directory {mode:04o} {uid}:{gid}"),
            Kind::File {
                mode,
                uid,
                gid,
                size,
                blake3,
                caps,
            } => format!(
                "file {mode:04o} {uid}:{gid}, {size} bytes, BLAKE3 {}{}",
                &blake3[..blake3.len().min(16)],
                if caps.is_some() {
                    ", with file capabilities"
                } else {
                    ""
                }
            ),
            Kind::Symlink { target, .. } => format!("symlink to {target}"),
            Kind::Char { major, minor, .. } => format!("character device {major}:{minor}"),
            Kind::Block { major, minor, .. } => format!("block device {major}:{minor}"),
            Kind::Fifo { .. } => "FIFO".into(),
            Kind::Socket { .. } => "socket".into(),
            Kind::Deleted => "deleted".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error(
        "{}: {why}; the writable layer can be verified only on an overlay root filesystem",
        rootfs.display()
    )]
    NotOverlay { rootfs: PathBuf, why: String },
    #[error("{}: {why}", rootfs.display())]
    Unsupported { rootfs: PathBuf, why: String },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the writable layer has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    #[error("{} is nested more than {MAX_DEPTH} directories deep", path.display())]
    TooDeep { path: PathBuf },
    #[error("{LISTING_FILE}: {0}")]
    Listing(String),
    /// The deadline given to [`describe_until`] passed: the walk stopped there.
    #[error(
        "the deadline passed while the writable layer was read ({looked_at} names looked at \
         so far)"
    )]
    Deadline { looked_at: usize },
    /// The deadline given to [`read_listing`] passed while the signed listing was read or
    /// parsed.
    #[error(
        "the deadline passed while the signed listing ({LISTING_FILE}) was read ({bytes} bytes \
         read, {lines} lines parsed so far)"
    )]
    ListingDeadline { bytes: u64, lines: usize },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LayerError + 'a {
    move |source| LayerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A name or symlink target as the record writes it: UTF-8 as it is, a backslash doubled,
/// any byte that is not UTF-8 as `\xNN` — one spelling per byte string.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

fn shown(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        escape(rel.as_os_str().as_bytes())
    }
}

// ----- locating the layers -----------------------------------------------------------------

/// The overlay mounted as a container's root filesystem: its merged root and its layers.
#[derive(Debug)]
pub struct Overlay {
    rootfs: PathBuf,
    merged: OwnedFd,
    /// `None`: a read-only overlay, which has no writable layer.
    upper: Option<(PathBuf, OwnedFd)>,
    /// Topmost first.
    lowers: Vec<(PathBuf, OwnedFd)>,
    /// `trusted.overlay.` or, with `userxattr`, `user.overlay.`.
    xattr_prefix: &'static str,
}

/// Undoes the octal escapes of `/proc/self/mountinfo` (`\040` for a space, ...).
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// One line of a mountinfo table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountLine {
    pub id: u64,
    /// The mount's root within its filesystem.
    pub root: Vec<u8>,
    /// Where it is mounted, as the reading process sees it.
    pub mount_point: Vec<u8>,
    pub fs_type: String,
    pub super_options: String,
}

/// Parses a mountinfo table (`proc_pid_mountinfo(5)`).
pub fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(MountLine {
                id: f.first()?.parse().ok()?,
                root: unescape_mountinfo(f.get(3)?),
                mount_point: unescape_mountinfo(f.get(4)?),
                fs_type: (*r.first()?).to_owned(),
                super_options: r.get(2).copied().unwrap_or("").to_owned(),
            })
        })
        .collect()
}

/// The layers of an overlay's super options: (upper, lowers topmost first, userxattr).
/// Data-only lower layers (after `::`, or `datadir+=`) are not part of the merged tree.
fn overlay_layers(opts: &str) -> (Option<Vec<u8>>, Vec<Vec<u8>>, bool) {
    let mut upper = None;
    let mut lowers = Vec::new();
    let mut userxattr = false;
    for o in opts.split(',') {
        if let Some(v) = o.strip_prefix("upperdir=") {
            upper = Some(unescape_mountinfo(v));
        } else if let Some(v) = o.strip_prefix("lowerdir+=") {
            lowers.push(unescape_mountinfo(v));
        } else if let Some(v) = o.strip_prefix("lowerdir=") {
            for part in v.split(':') {
                if part.is_empty() {
                    break; // `::`: data-only layers follow
                }
                lowers.push(unescape_mountinfo(part));
            }
        } else if o == "userxattr" {
            userxattr = true;
        }
    }
    (upper, lowers, userxattr)
}

fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

impl Overlay {
    /// Finds the overlay mounted at `rootfs` (the container's root filesystem, a path the
    /// runtime made) by its mount id in `/proc/self/mountinfo`.
    pub fn locate(rootfs: &Path) -> Result<Overlay, LayerError> {
        let not = |why: String| LayerError::NotOverlay {
            rootfs: rootfs.to_path_buf(),
            why,
        };
        let merged = open_dir_path(rootfs).map_err(io_err("opening", rootfs))?;
        let st = rfs::statx(&merged, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
            .map_err(|e| io_err("reading", rootfs)(e.into()))?;
        let up = rfs::statx(&merged, "..", AtFlags::empty(), StatxFlags::MNT_ID)
            .map_err(|e| io_err("reading", rootfs)(e.into()))?;
        if st.stx_mnt_id == up.stx_mnt_id {
            return Err(not("not the root of a mount".into()));
        }
        let table = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(io_err("reading", Path::new("/proc/self/mountinfo")))?;
        let line = parse_mountinfo(&table)
            .into_iter()
            .find(|l| l.id == st.stx_mnt_id)
            .ok_or_else(|| not(format!("mount {} is not in the mount table", st.stx_mnt_id)))?;
        if line.fs_type != "overlay" {
            return Err(not(format!("a {} mount, not an overlay", line.fs_type)));
        }
        if line.root != b"/" {
            return Err(not("a bind of part of an overlay".into()));
        }
        let (upper, lowers, userxattr) = overlay_layers(&line.super_options);
        let unsupported = |why: String| LayerError::Unsupported {
            rootfs: rootfs.to_path_buf(),
            why,
        };
        let open_layer = |raw: Vec<u8>| -> Result<(PathBuf, OwnedFd), LayerError> {
            let p = PathBuf::from(OsString::from_vec(raw));
            if !p.is_absolute() {
                return Err(unsupported(format!(
                    "its overlay names layer {} relative to a directory the mount table does \
                     not record",
                    p.display()
                )));
            }
            let fd = open_dir_path(&p).map_err(io_err("opening the overlay layer", &p))?;
            Ok((p, fd))
        };
        let upper = upper.map(open_layer).transpose()?;
        let lowers = lowers
            .into_iter()
            .map(open_layer)
            .collect::<Result<Vec<_>, _>>()?;
        if lowers.is_empty() {
            return Err(not("an overlay without lower layers".into()));
        }
        Ok(Overlay {
            rootfs: rootfs.to_path_buf(),
            merged,
            upper,
            lowers,
            xattr_prefix: if userxattr {
                "user.overlay."
            } else {
                "trusted.overlay."
            },
        })
    }

    /// What `path` (absolute in the container) names beneath the container's root, symlinks
    /// followed as the container would follow them (`RESOLVE_IN_ROOT`), relative to the root.
    pub fn resolve_in_root(&self, path: &Path) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        let rel = path.strip_prefix("/").unwrap_or(path);
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let fd = rfs::openat2(
            &self.merged,
            rel,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            rfs::ResolveFlags::IN_ROOT | rfs::ResolveFlags::NO_MAGICLINKS,
        )
        .ok()?;
        let link = |fd: i32| rfs::readlink(format!("/proc/self/fd/{fd}"), Vec::new()).ok();
        let real = PathBuf::from(OsString::from_vec(link(fd.as_raw_fd())?.into_bytes()));
        let root = PathBuf::from(OsString::from_vec(
            link(self.merged.as_raw_fd())?.into_bytes(),
        ));
        real.strip_prefix(root).ok().map(Path::to_path_buf)
    }

    /// The upper layer's directory, for messages.
    pub fn upper_dir(&self) -> Option<&Path> {
        self.upper.as_ref().map(|(p, _)| p.as_path())
    }

    fn xattr(&self, fd: BorrowedFd<'_>, name: &str) -> Option<Vec<u8>> {
        get_xattr(fd, &format!("{}{name}", self.xattr_prefix))
    }
}

fn get_xattr(fd: BorrowedFd<'_>, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    match rfs::fgetxattr(fd, name, &mut buf[..]) {
        Ok(n) => {
            buf.truncate(n);
            Some(buf)
        }
        Err(rustix::io::Errno::RANGE) => {
            let n = rfs::fgetxattr_query(fd, name).ok()?;
            let mut buf = vec![0u8; n];
            let n = rfs::fgetxattr(fd, name, &mut buf[..]).ok()?;
            buf.truncate(n);
            Some(buf)
        }
        Err(_) => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ----- the lower view ----------------------------------------------------------------------

/// A directory of the lower view: the layers that contribute to it, topmost first, cut after an
/// opaque one.
struct LowerDir {
    layers: Vec<(usize, OwnedFd)>,
}

/// What the lower view has at a name: the topmost layer's entry.
struct LowerEntry {
    layer: usize,
    stat: rfs::Stat,
}

fn is_whiteout(st: &rfs::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice && st.st_rdev == 0
}

fn open_sub(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    beneath::openat2(
        dir,
        Path::new(name),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        Mode::empty(),
    )
}

impl Overlay {
    fn lower_root(&self) -> io::Result<LowerDir> {
        let mut layers = Vec::new();
        for (i, (_, fd)) in self.lowers.iter().enumerate() {
            let dup = open_sub(fd.as_fd(), OsStr::new("."))?;
            let opaque = self.is_opaque(dup.as_fd());
            layers.push((i, dup));
            if opaque {
                break;
            }
        }
        Ok(LowerDir { layers })
    }

    fn is_opaque(&self, dir: BorrowedFd<'_>) -> bool {
        self.xattr(dir, "opaque")
            .is_some_and(|v| v == b"y" || v == b"x")
    }

    /// The lower view at `name` in `parent`: its topmost entry, and (when that is a directory)
    /// the directory's layers.
    fn lower_child(
        &self,
        parent: &LowerDir,
        name: &OsStr,
    ) -> io::Result<(Option<LowerEntry>, LowerDir)> {
        let mut first = None;
        let mut dirs = Vec::new();
        for (layer, fd) in &parent.layers {
            let Some(st) = beneath::stat_at(fd.as_fd(), name)? else {
                continue;
            };
            if is_whiteout(&st) {
                break;
            }
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                let sub = open_sub(fd.as_fd(), name)?;
                let opaque = self.is_opaque(sub.as_fd());
                if first.is_none() {
                    first = Some(LowerEntry {
                        layer: *layer,
                        stat: st,
                    });
                }
                dirs.push((*layer, sub));
                if opaque {
                    break;
                }
            } else {
                if first.is_none() {
                    first = Some(LowerEntry {
                        layer: *layer,
                        stat: st,
                    });
                }
                break;
            }
        }
        Ok((first, LowerDir { layers: dirs }))
    }

    /// The names the lower view shows in `dir`.
    fn lower_names(&self, dir: &LowerDir) -> io::Result<BTreeSet<OsString>> {
        let mut seen: BTreeMap<OsString, bool> = BTreeMap::new();
        for (_, fd) in &dir.layers {
            for (name, ft) in typed_names(fd.as_fd())? {
                if seen.contains_key(&name) {
                    continue;
                }
                let visible = match ft {
                    FileType::CharacterDevice | FileType::Unknown => {
                        beneath::stat_at(fd.as_fd(), &name)?.is_some_and(|st| !is_whiteout(&st))
                    }
                    _ => true,
                };
                seen.insert(name, visible);
            }
        }
        Ok(seen
            .into_iter()
            .filter_map(|(n, visible)| visible.then_some(n))
            .collect())
    }
}

/// The entries of a directory with the type readdir reports (`Unknown` where it reports none).
fn typed_names(dir: BorrowedFd<'_>) -> io::Result<Vec<(OsString, FileType)>> {
    let mut out = Vec::new();
    for e in rfs::Dir::read_from(dir)? {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push((OsString::from_vec(name.to_vec()), e.file_type()));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

// ----- describing ---------------------------------------------------------------------------

/// A regular file whose content is hashed once the walk is done.
struct FileJob {
    entry: usize,
    rel: PathBuf,
    /// The lower view's file of the same type, mode, owner and size (layer): unchanged if the
    /// content and capabilities are the same too.
    lower_same_meta: Option<usize>,
}

struct Walk<'a> {
    ov: &'a Overlay,
    entries: Vec<Entry>,
    files: Vec<FileJob>,
    deadline: Option<Instant>,
    /// Names of the upper layer and the lower view looked at, for the deadline's error.
    looked_at: usize,
}

fn attrs(st: &rfs::Stat) -> (u32, u32, u32) {
    (st.st_mode & 0o7777, st.st_uid, st.st_gid)
}

/// The description of the overlay's writable layer (see the module docs), sorted by path,
/// without runtime-made marks ([`mark_runtime_made`]).
pub fn describe(ov: &Overlay) -> Result<Vec<Entry>, LayerError> {
    describe_until(ov, None)
}

/// [`describe`], stopped with [`LayerError::Deadline`] once `deadline` passes: looked at for
/// every name the walk reads and every 256 KiB hashed, so a layer of many entries or large
/// files cannot hold a restore past its deadline.
pub fn describe_until(ov: &Overlay, deadline: Option<Instant>) -> Result<Vec<Entry>, LayerError> {
    let started = Instant::now();
    let Some((upper_path, upper)) = &ov.upper else {
        return Ok(Vec::new());
    };
    let mut w = Walk {
        ov,
        entries: Vec::new(),
        files: Vec::new(),
        deadline,
        looked_at: 0,
    };
    w.on_time()?;
    let lower = ov
        .lower_root()
        .map_err(io_err("reading the lower layers of", &ov.rootfs))?;
    let merged_root =
        open_sub(ov.merged.as_fd(), OsStr::new(".")).map_err(io_err("opening", &ov.rootfs))?;
    // The root directory itself: compared as any directory.
    let root_st = rfs::fstat(&merged_root).map_err(|e| io_err("reading", &ov.rootfs)(e.into()))?;
    let lower_root_st =
        rfs::fstat(&ov.lowers[0].1).map_err(|e| io_err("reading", &ov.lowers[0].0)(e.into()))?;
    if attrs(&root_st) != attrs(&lower_root_st) {
        let (mode, uid, gid) = attrs(&root_st);
        w.push(Path::new(""), Kind::Dir { mode, uid, gid })?;
    }
    w.deletions(Path::new(""), &lower, merged_root.as_fd())?;
    w.dir(Path::new(""), upper.as_fd(), merged_root.as_fd(), &lower, 0)
        .map_err(|e| match e {
            LayerError::TooManyEntries => e,
            other => {
                tracing::debug!(upper = %upper_path.display(), error = %other, "describing the writable layer failed");
                other
            }
        })?;
    let Walk {
        mut entries,
        files,
        looked_at,
        ..
    } = w;
    let unchanged = hash_files(ov, &mut entries, &files, deadline, looked_at)?;
    let mut out: Vec<Entry> = entries
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !unchanged.contains(i))
        .map(|(_, e)| e)
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    tracing::debug!(
        rootfs = %ov.rootfs.display(),
        entries = out.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "writable layer described"
    );
    Ok(out)
}

impl Walk<'_> {
    /// One more name looked at; an error once the deadline has passed.
    fn on_time(&mut self) -> Result<(), LayerError> {
        self.looked_at += 1;
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(LayerError::Deadline {
                looked_at: self.looked_at,
            }),
            _ => Ok(()),
        }
    }

    fn push(&mut self, rel: &Path, kind: Kind) -> Result<usize, LayerError> {
        if self.entries.len() >= MAX_ENTRIES {
            return Err(LayerError::TooManyEntries);
        }
        self.entries.push(Entry {
            path: shown(rel),
            kind,
            runtime_made: false,
        });
        Ok(self.entries.len() - 1)
    }

    /// Names the lower view has in `rel` that the merged directory does not show.
    fn deletions(
        &mut self,
        rel: &Path,
        lower: &LowerDir,
        merged: BorrowedFd<'_>,
    ) -> Result<(), LayerError> {
        if lower.layers.is_empty() {
            return Ok(());
        }
        let shown_rel = self.ov.rootfs.join(rel);
        let lower_names = self
            .ov
            .lower_names(lower)
            .map_err(io_err("reading the lower layers at", &shown_rel))?;
        let merged_names: BTreeSet<OsString> = beneath::names(merged)
            .map_err(io_err("reading", &shown_rel))?
            .into_iter()
            .collect();
        for gone in lower_names.difference(&merged_names) {
            self.on_time()?;
            self.push(&rel.join(gone), Kind::Deleted)?;
        }
        Ok(())
    }

    fn dir(
        &mut self,
        rel: &Path,
        upper: BorrowedFd<'_>,
        merged: BorrowedFd<'_>,
        lower: &LowerDir,
        depth: usize,
    ) -> Result<(), LayerError> {
        if depth > MAX_DEPTH {
            return Err(LayerError::TooDeep {
                path: self.ov.rootfs.join(rel),
            });
        }
        let base = self.ov.rootfs.join(rel);
        let at = |name: &OsStr| base.join(name);
        for (name, _) in typed_names(upper).map_err(io_err("reading", &base))? {
            self.on_time()?;
            let Some(ust) =
                beneath::stat_at(upper, &name).map_err(io_err("reading", &at(&name)))?
            else {
                continue;
            };
            if is_whiteout(&ust) {
                continue;
            }
            let child = rel.join(&name);
            let mst = beneath::stat_at(merged, &name)
                .map_err(io_err("reading", &at(&name)))?
                .ok_or_else(|| LayerError::Io {
                    what: "reading",
                    path: at(&name),
                    source: io::Error::other(
                        "in the upper layer but not in the merged root filesystem: the layer \
                         changed while it was read",
                    ),
                })?;
            let (lentry, ldir) = self
                .ov
                .lower_child(lower, &name)
                .map_err(io_err("reading the lower layers at", &at(&name)))?;
            let (mode, uid, gid) = attrs(&mst);
            let ft = FileType::from_raw_mode(mst.st_mode);
            if ft == FileType::Directory {
                let usub = open_sub(upper, &name).map_err(io_err("opening", &at(&name)))?;
                if self.ov.xattr(usub.as_fd(), "redirect").is_some() {
                    return Err(LayerError::Unsupported {
                        rootfs: self.ov.rootfs.clone(),
                        why: format!(
                            "{} is a redirected directory (overlay redirect_dir=on), whose \
                             content is elsewhere in the lower layers",
                            at(&name).display()
                        ),
                    });
                }
                let msub = open_sub(merged, &name).map_err(io_err("opening", &at(&name)))?;
                let lower_is_dir = lentry.as_ref().is_some_and(|l| {
                    FileType::from_raw_mode(l.stat.st_mode) == FileType::Directory
                });
                let same = lentry
                    .as_ref()
                    .is_some_and(|l| lower_is_dir && attrs(&l.stat) == (mode, uid, gid));
                if !same {
                    self.push(&child, Kind::Dir { mode, uid, gid })?;
                }
                if lower_is_dir {
                    self.deletions(&child, &ldir, msub.as_fd())?;
                }
                self.dir(&child, usub.as_fd(), msub.as_fd(), &ldir, depth + 1)?;
                continue;
            }
            let kind = match ft {
                FileType::RegularFile => Kind::File {
                    mode,
                    uid,
                    gid,
                    size: mst.st_size as u64,
                    blake3: String::new(),
                    caps: None,
                },
                FileType::Symlink => {
                    let target = rfs::readlinkat(merged, name.as_os_str(), Vec::new())
                        .map_err(|e| io_err("reading", &at(&name))(e.into()))?;
                    Kind::Symlink {
                        uid,
                        gid,
                        target: escape(target.as_bytes()),
                    }
                }
                FileType::CharacterDevice => Kind::Char {
                    mode,
                    uid,
                    gid,
                    major: rfs::major(mst.st_rdev),
                    minor: rfs::minor(mst.st_rdev),
                },
                FileType::BlockDevice => Kind::Block {
                    mode,
                    uid,
                    gid,
                    major: rfs::major(mst.st_rdev),
                    minor: rfs::minor(mst.st_rdev),
                },
                FileType::Fifo => Kind::Fifo { mode, uid, gid },
                FileType::Socket => Kind::Socket { mode, uid, gid },
                _ => {
                    return Err(LayerError::Unsupported {
                        rootfs: self.ov.rootfs.clone(),
                        why: format!("{} has an unknown file type", at(&name).display()),
                    })
                }
            };
            // Unchanged from the lower view: not part of what the layer changes.
            let lower_same_meta = lentry.as_ref().and_then(|l| {
                let lft = FileType::from_raw_mode(l.stat.st_mode);
                let same_meta = lft == ft
                    && attrs(&l.stat) == (mode, uid, gid)
                    && l.stat.st_size == mst.st_size
                    && l.stat.st_rdev == mst.st_rdev;
                same_meta.then_some(l.layer)
            });
            match (&kind, lower_same_meta) {
                (Kind::File { .. }, _) => {
                    let entry = self.push(&child, kind)?;
                    self.files.push(FileJob {
                        entry,
                        rel: child,
                        lower_same_meta,
                    });
                }
                (Kind::Symlink { target, .. }, Some(layer)) => {
                    let (_, lfd) = &self.ov.lowers[layer];
                    let lower_target = rfs::readlinkat(lfd, child.as_os_str(), Vec::new())
                        .ok()
                        .map(|t| escape(t.as_bytes()));
                    if lower_target.as_deref() != Some(target.as_str()) {
                        self.push(&child, kind)?;
                    }
                }
                (Kind::Char { .. } | Kind::Block { .. } | Kind::Fifo { .. }, Some(_)) => {}
                _ => {
                    self.push(&child, kind)?;
                }
            }
        }
        Ok(())
    }
}

/// A file's BLAKE3 (hex), its `security.capability` (hex), and whether both equal the lower
/// view's file.
type Hashed = (String, Option<String>, bool);

/// Hashes every regular file described (through the merged root, on all cores) and returns the
/// entries found identical to the lower view's file.
fn hash_files(
    ov: &Overlay,
    entries: &mut [Entry],
    files: &[FileJob],
    deadline: Option<Instant>,
    looked_at: usize,
) -> Result<BTreeSet<usize>, LayerError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    if files.is_empty() {
        return Ok(BTreeSet::new());
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Result<Hashed, LayerError>)>> =
        Mutex::new(Vec::with_capacity(files.len()));
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8)
        .min(files.len());
    let one = |job: &FileJob| -> Result<Hashed, LayerError> {
        let shown = ov.rootfs.join(&job.rel);
        let file =
            beneath::open_file(ov.merged.as_fd(), &job.rel).map_err(io_err("opening", &shown))?;
        let caps = get_xattr(file.as_fd(), "security.capability");
        let digest = hash(&file, deadline).map_err(io_err("reading", &shown))?;
        let unchanged = match job.lower_same_meta {
            Some(layer) => {
                let (lp, lfd) = &ov.lowers[layer];
                let lower = beneath::open_file(lfd.as_fd(), &job.rel)
                    .map_err(io_err("opening", &lp.join(&job.rel)))?;
                get_xattr(lower.as_fd(), "security.capability") == caps
                    && hash(&lower, deadline).map_err(io_err("reading", &lp.join(&job.rel)))?
                        == digest
            }
            None => false,
        };
        Ok((digest, caps.map(|c| hex(&c)), unchanged))
    };
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = files.get(i) else {
                    break;
                };
                let r = one(job);
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    // The deadline's error before any other: a worker stopped by it may have left the files
    // after it unread, and another worker's error is then not why the description stopped.
    if results.iter().any(|(_, r)| {
        matches!(r, Err(LayerError::Io { source, .. }) if source.kind() == io::ErrorKind::TimedOut)
    }) {
        return Err(LayerError::Deadline { looked_at });
    }
    results.sort_by_key(|(i, _)| *i);
    let mut unchanged = BTreeSet::new();
    for (i, r) in results {
        let (digest, caps, same) = r?;
        let job = &files[i];
        if same {
            unchanged.insert(job.entry);
        }
        if let Kind::File {
            blake3, caps: c, ..
        } = &mut entries[job.entry].kind
        {
            *blake3 = digest;
            *c = caps;
        }
    }
    Ok(unchanged)
}

/// BLAKE3 of `file`'s content; `TimedOut` once `deadline` passes (looked at before every
/// read).
fn hash(mut file: &std::fs::File, deadline: Option<Instant>) -> io::Result<String> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().to_hex().to_string())
}

// ----- what the runtime makes ---------------------------------------------------------------

/// Marks the entries the runtime makes at start (see the module docs): `mount_points` are the
/// container's mount points as it sees them (its mount table) and `cwd` its working directory,
/// both relative to its root. Returns how many were marked.
pub fn mark_runtime_made(
    entries: &mut [Entry],
    in_lower: &dyn Fn(&Entry) -> bool,
    mount_points: &[PathBuf],
    cwd: Option<&Path>,
) -> usize {
    let exact: BTreeSet<String> = mount_points.iter().map(|p| shown(p)).collect();
    let mut parents: BTreeSet<String> = BTreeSet::new();
    for p in mount_points.iter().map(PathBuf::as_path).chain(cwd) {
        let mut cur = Some(p);
        while let Some(c) = cur.filter(|c| !c.as_os_str().is_empty()) {
            parents.insert(shown(c));
            cur = c.parent();
        }
    }
    let mut n = 0;
    for e in entries.iter_mut() {
        let made = match &e.kind {
            Kind::Socket { .. } => true,
            Kind::Dir { .. } => parents.contains(&e.path) && !in_lower(e),
            Kind::File { size: 0, .. } => exact.contains(&e.path) && !in_lower(e),
            _ => false,
        };
        if made {
            e.runtime_made = true;
            n += 1;
        }
    }
    n
}

/// Describes the overlay's writable layer and marks what the runtime made: the seal's record.
/// `mount_points` and `cwd` as for [`mark_runtime_made`].
pub fn describe_for_seal(
    ov: &Overlay,
    mount_points: &[PathBuf],
    cwd: Option<&Path>,
) -> Result<Vec<Entry>, LayerError> {
    let mut entries = describe(ov)?;
    let lower_root = ov
        .lower_root()
        .map_err(io_err("reading the lower layers of", &ov.rootfs))?;
    // Whether the lower view has an entry's path: looked up again for the few candidates.
    let in_lower = |e: &Entry| -> bool {
        let Some(rel) = unshown(&e.path) else {
            return true;
        };
        lower_has(ov, &lower_root, &rel).unwrap_or(true)
    };
    let marked = mark_runtime_made(&mut entries, &in_lower, mount_points, cwd);
    tracing::debug!(marked, "runtime-made entries of the writable layer");
    Ok(entries)
}

/// The relative path an escaped record path names (`None` for the root).
fn unshown(path: &str) -> Option<PathBuf> {
    if path == "." {
        return None;
    }
    let mut out = Vec::new();
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && i + 4 <= b.len() {
            let v = u8::from_str_radix(&path[i + 2..i + 4], 16).ok()?;
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(OsString::from_vec(out)))
}

fn lower_has(ov: &Overlay, root: &LowerDir, rel: &Path) -> io::Result<bool> {
    let comps: Vec<&OsStr> = rel.iter().collect();
    let Some((last, parents)) = comps.split_last() else {
        return Ok(true);
    };
    let mut cur = LowerDir {
        layers: root
            .layers
            .iter()
            .map(|(i, fd)| open_sub(fd.as_fd(), OsStr::new(".")).map(|d| (*i, d)))
            .collect::<io::Result<_>>()?,
    };
    for c in parents {
        let (_, next) = ov.lower_child(&cur, c)?;
        cur = next;
    }
    Ok(ov.lower_child(&cur, last)?.0.is_some())
}

/// The mount points of a mount table (`/proc/<pid>/mountinfo` of a process of the container),
/// relative to the container's root; the root itself left out.
pub fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    parse_mountinfo(mountinfo)
        .into_iter()
        .filter_map(|l| {
            let p = PathBuf::from(OsString::from_vec(l.mount_point));
            let rel = p.strip_prefix("/").ok()?.to_path_buf();
            (!rel.as_os_str().is_empty()).then_some(rel)
        })
        .collect()
}

// ----- the listing --------------------------------------------------------------------------

/// The listing file's bytes: one JSON object per entry and line, in the entries' order.
pub fn to_listing(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        // Serialising these plain types cannot fail.
        if serde_json::to_writer(&mut out, e).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// The record of a description, its listing file's bytes given.
pub fn record_of(entries: &[Entry], listing: &[u8]) -> WritableLayerRecord {
    WritableLayerRecord::Overlay {
        listing_bytes: listing.len() as u64,
        listing_blake3: blake3::hash(listing).to_hex().to_string(),
        entries: entries.len() as u64,
        content_bytes: entries
            .iter()
            .map(|e| match e.kind {
                Kind::File { size, .. } => size,
                _ => 0,
            })
            .sum(),
    }
}

/// Writes the listing beside the manifest in the checkpoint directory `dir` (atomically,
/// beneath it) and returns its record.
pub fn write_listing(dir: &Path, entries: &[Entry]) -> Result<WritableLayerRecord, LayerError> {
    let listing = to_listing(entries);
    let root = beneath::open_root(dir).map_err(io_err("opening", dir))?;
    beneath::write_atomically(root.as_fd(), OsStr::new(LISTING_FILE), &listing, 0o600)
        .map_err(io_err("writing", &dir.join(LISTING_FILE)))?;
    Ok(record_of(entries, &listing))
}

/// Reads the listing of the checkpoint directory `dir` (beneath it, no symlink), refusing it
/// unless its size and BLAKE3 are the record's. A listing may be up to [`LISTING_MAX_BYTES`]:
/// it is read [`LISTING_READ_CHUNK`] at a time and parsed a line at a time, and stops with
/// [`LayerError::ListingDeadline`] once `deadline` passes (the restore's, so that a large
/// listing cannot hold a restore past it).
pub fn read_listing(
    dir: BorrowedFd<'_>,
    shown_dir: &Path,
    record: &WritableLayerRecord,
    deadline: Option<Instant>,
) -> Result<Vec<Entry>, LayerError> {
    let WritableLayerRecord::Overlay {
        listing_bytes,
        listing_blake3,
        ..
    } = record
    else {
        return Err(LayerError::Listing("the record has no listing".into()));
    };
    let path = shown_dir.join(LISTING_FILE);
    let cap = (*listing_bytes).min(LISTING_MAX_BYTES);
    let unreadable = |e: &dyn std::fmt::Display| {
        LayerError::Listing(format!("{} cannot be read ({e})", path.display()))
    };
    let passed = || deadline.is_some_and(|d| Instant::now() >= d);
    let file = beneath::open_file(dir, Path::new(LISTING_FILE)).map_err(|e| unreadable(&e))?;
    let size = rfs::fstat(&file).map_err(|e| unreadable(&e))?.st_size as u64;
    if size > cap {
        return Err(LayerError::Listing(format!(
            "{} is {size} bytes, more than the {cap} the manifest records",
            path.display()
        )));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    let mut hasher = blake3::Hasher::new();
    let mut chunk = vec![0u8; LISTING_READ_CHUNK];
    let mut limited = (&file).take(cap + 1);
    loop {
        if passed() {
            return Err(LayerError::ListingDeadline {
                bytes: bytes.len() as u64,
                lines: 0,
            });
        }
        let n = match limited.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(unreadable(&e)),
        };
        hasher.update(&chunk[..n]);
        bytes.extend_from_slice(&chunk[..n]);
    }
    if bytes.len() as u64 != *listing_bytes || hasher.finalize().to_hex().as_str() != listing_blake3
    {
        return Err(LayerError::Listing(format!(
            "{} is not the one the manifest records (size or BLAKE3 differ)",
            path.display()
        )));
    }
    let mut out = Vec::new();
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if i % LISTING_LINES_PER_LOOK == 0 && passed() {
            return Err(LayerError::ListingDeadline {
                bytes: bytes.len() as u64,
                lines: i,
            });
        }
        if line.is_empty() {
            continue;
        }
        out.push(
            serde_json::from_slice(line).map_err(|e| {
                LayerError::Listing(format!("{} line {}: {e}", path.display(), i + 1))
            })?,
        );
    }
    Ok(out)
}

/// How much of a listing one read takes: the deadline is looked at between reads.
pub const LISTING_READ_CHUNK: usize = 8 << 20;
/// How many listing lines are parsed between looks at the deadline (a few milliseconds).
const LISTING_LINES_PER_LOOK: usize = 4096;

// ----- comparing ----------------------------------------------------------------------------

/// The first way a restored layer differs from the recorded one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// `/`-rooted, escaped.
    pub path: String,
    /// What the record has there (`None`: nothing).
    pub recorded: Option<Kind>,
    /// What the restored layer has there (`None`: nothing).
    pub found: Option<Kind>,
    /// How many paths differ in all.
    pub count: usize,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = |k: &Option<Kind>| k.as_ref().map_or("nothing".to_owned(), Kind::summary);
        write!(
            f,
            "{}: the signed layer has {}, the container's has {}",
            self.path,
            what(&self.recorded),
            what(&self.found)
        )?;
        if self.count > 1 {
            write!(f, " ({} paths differ in all)", self.count)?;
        }
        Ok(())
    }
}

/// Compares a restored layer's description (no runtime-made marks) with the record: equal but
/// for runtime-made entries the restored layer lacks. Both sorted by path.
pub fn compare(recorded: &[Entry], found: &[Entry]) -> Result<(), Box<Difference>> {
    let mut first: Option<Difference> = None;
    let mut count = 0;
    let mut note = |path: &str, recorded: Option<&Kind>, found: Option<&Kind>| {
        count += 1;
        if first.is_none() {
            first = Some(Difference {
                path: if path == "." {
                    "/".into()
                } else {
                    format!("/{path}")
                },
                recorded: recorded.cloned(),
                found: found.cloned(),
                count: 0,
            });
        }
    };
    let (mut i, mut j) = (0, 0);
    while i < recorded.len() || j < found.len() {
        match (recorded.get(i), found.get(j)) {
            (Some(r), Some(f)) if r.path == f.path => {
                if r.kind != f.kind {
                    note(&r.path, Some(&r.kind), Some(&f.kind));
                }
                i += 1;
                j += 1;
            }
            (Some(r), f) if f.is_none_or(|f| r.path < f.path) => {
                if !r.runtime_made {
                    note(&r.path, Some(&r.kind), None);
                }
                i += 1;
            }
            (_, Some(f)) => {
                note(&f.path, None, Some(&f.kind));
                j += 1;
            }
            (None, None) => break,
            (Some(_), None) => unreachable!("handled above"),
        }
    }
    match first {
        None => Ok(()),
        Some(mut d) => {
            d.count = count;
            Err(Box::new(d))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn escaping_is_one_to_one() {
        assert_eq!(escape(b"etc/hosts"), "etc/hosts");
        assert_eq!(escape(b"a\\x41"), "a\\\\x41");
        assert_eq!(escape(b"a\xffb"), "a\\xffb");
        assert_ne!(escape(b"a\\xff"), escape(b"a\xff"));
        for raw in [&b"a\\xffb"[..], b"a\xffb", b"tmp/caf\xc3\xa9", b"x\\\\y"] {
            assert_eq!(
                unshown(&escape(raw)).unwrap().as_os_str().as_bytes(),
                raw,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn mountinfo_lines_and_overlay_options() {
        let t = "148 27 0:43 / /run/k8s\\040x/rootfs rw,relatime - overlay overlay rw,lowerdir=/l/1:/l/2::/d/1,upperdir=/u/fs,workdir=/u/work,uuid=on\n\
                 30 1 8:1 / / rw - ext4 /dev/vda rw\n";
        let lines = parse_mountinfo(t);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].id, 148);
        assert_eq!(lines[0].mount_point, b"/run/k8s x/rootfs");
        let (upper, lowers, userxattr) = overlay_layers(&lines[0].super_options);
        assert_eq!(upper.unwrap(), b"/u/fs");
        assert_eq!(lowers, vec![b"/l/1".to_vec(), b"/l/2".to_vec()]);
        assert!(!userxattr);
        let (_, lowers, _) = overlay_layers("lowerdir+=/a,lowerdir+=/b,datadir+=/c,upperdir=/u");
        assert_eq!(lowers, vec![b"/a".to_vec(), b"/b".to_vec()]);
        assert_eq!(
            mount_points("1 0 0:1 / / rw - overlay o rw\n2 1 0:2 / /proc rw - proc proc rw\n3 1 0:3 / /etc/hosts rw - ext4 /dev/x rw\n"),
            vec![PathBuf::from("proc"), PathBuf::from("etc/hosts")]
        );
    }

    fn entry(path: &str, kind: Kind, runtime_made: bool) -> Entry {
        Entry {
            path: path.into(),
            kind,
            runtime_made,
        }
    }

    /// The signed listing reads back as written, is refused when a byte changed, and stops at
    /// a deadline that has passed instead of reading on.
    #[test]
    fn the_signed_listing_is_verified_and_its_read_stops_at_the_deadline() {
        let d = tempfile::tempdir().unwrap();
        let entries: Vec<Entry> = (0..10_000)
            .map(|i| {
                let dir = Kind::Dir {
                    mode: 0o755,
                    uid: 0,
                    gid: 0,
                };
                entry(&format!("d/{i:05}"), dir, false)
            })
            .collect();
        let record = write_listing(d.path(), &entries).unwrap();
        let root = beneath::open_root(d.path()).unwrap();
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        assert_eq!(
            read_listing(root.as_fd(), d.path(), &record, Some(far)).unwrap(),
            entries
        );
        let err = read_listing(root.as_fd(), d.path(), &record, Some(Instant::now())).unwrap_err();
        assert!(
            matches!(err, LayerError::ListingDeadline { bytes: 0, lines: 0 }),
            "{err:?}"
        );
        assert!(err.to_string().contains("deadline passed"), "{err}");
        let listing = d.path().join(LISTING_FILE);
        let mut bytes = fs::read(&listing).unwrap();
        bytes[10] ^= 1;
        fs::write(&listing, &bytes).unwrap();
        let err = read_listing(root.as_fd(), d.path(), &record, None).unwrap_err();
        assert!(err.to_string().contains("BLAKE3 differ"), "{err}");
        bytes.push(b'\n');
        fs::write(&listing, &bytes).unwrap();
        let err = read_listing(root.as_fd(), d.path(), &record, None).unwrap_err();
        assert!(err.to_string().contains("more than the"), "{err}");
    }

    #[test]
    fn comparison_names_the_first_difference_and_lets_runtime_made_entries_be_absent() {
        let dir = |mode| Kind::Dir {
            mode,
            uid: 0,
            gid: 0,
        };
        let file = |h: &str| Kind::File {
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: 1,
            blake3: h.into(),
            caps: None,
        };
        let recorded = vec![
            entry("etc/hostname", file("e3"), true),
            entry("run/secrets", dir(0o755), true),
            entry("tmp/count", file("aa"), false),
            entry("usr/bin/old", Kind::Deleted, false),
        ];
        assert_eq!(compare(&recorded, &recorded), Ok(()));
        // The runtime-made entries absent: as after a Podman or CRI-O diff.
        assert_eq!(compare(&recorded, &recorded[2..]), Ok(()));
        // One made with other attributes: refused.
        let mut f = recorded.clone();
        f[1].kind = dir(0o777);
        assert_eq!(compare(&recorded, &f).unwrap_err().path, "/run/secrets");
        // Content replaced, an entry added, a deletion undone.
        let mut f = recorded.clone();
        f[2].kind = file("bb");
        let d = compare(&recorded, &f).unwrap_err();
        assert_eq!(d.path, "/tmp/count");
        assert!(d.to_string().contains("BLAKE3 aa"), "{d}");
        let mut f = recorded.clone();
        f.insert(2, entry("bin/evil", file("cc"), false));
        f.sort_by(|a, b| a.path.cmp(&b.path));
        assert_eq!(compare(&recorded, &f).unwrap_err().path, "/bin/evil");
        let f = recorded[..3].to_vec();
        let d = compare(&recorded, &f).unwrap_err();
        assert_eq!((d.path.as_str(), d.count), ("/usr/bin/old", 1));
        // A listing round trip.
        let listing = to_listing(&recorded);
        let back: Vec<Entry> = listing
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(back, recorded);
    }

    /// A real overlay (the tests run as root, as the project's do): lower layers with a
    /// whiteout and an opaque directory of their own, changes made through the merged mount.
    struct Mounted {
        top: tempfile::TempDir,
    }

    impl Mounted {
        fn new(prepare: impl FnOnce(&Path, &Path)) -> Mounted {
            let top = tempfile::tempdir().unwrap();
            let p = top.path();
            for d in ["l1", "l2", "u", "w", "m"] {
                fs::create_dir(p.join(d)).unwrap();
            }
            prepare(&p.join("l1"), &p.join("l2"));
            let opts = format!(
                "lowerdir={}:{},upperdir={},workdir={}",
                p.join("l1").display(),
                p.join("l2").display(),
                p.join("u").display(),
                p.join("w").display()
            );
            rustix::mount::mount(
                "overlay",
                p.join("m"),
                "overlay",
                rustix::mount::MountFlags::empty(),
                Some(std::ffi::CString::new(opts).unwrap().as_c_str()),
            )
            .expect("mounting an overlay (the tests run as root)");
            Mounted { top }
        }

        fn merged(&self) -> PathBuf {
            self.top.path().join("m")
        }
    }

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(self.merged(), rustix::mount::UnmountFlags::DETACH);
        }
    }

    fn image(l1: &Path, l2: &Path) {
        // l2 (bottom): /etc/{passwd,group}, /usr/lib/{a,b}, /opt/x/{1,2}, /bin/sh, /srv/gone
        for d in ["etc", "usr/lib", "opt/x", "bin", "srv"] {
            fs::create_dir_all(l2.join(d)).unwrap();
        }
        for (f, c) in [
            ("etc/passwd", "root:x:0:0"),
            ("etc/group", "root:x:0:"),
            ("usr/lib/a", "a"),
            ("usr/lib/b", "b"),
            ("opt/x/1", "1"),
            ("opt/x/2", "2"),
            ("bin/sh", "#!sh"),
            ("srv/gone", "g"),
        ] {
            fs::write(l2.join(f), c).unwrap();
        }
        // l1 (top): removes /srv/gone (whiteout), replaces /opt/x opaquely with /opt/x/3.
        fs::create_dir_all(l1.join("srv")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            l1.join("srv/gone"),
            FileType::CharacterDevice,
            Mode::from_raw_mode(0),
            0,
        )
        .unwrap();
        fs::create_dir_all(l1.join("opt/x")).unwrap();
        rustix::fs::setxattr(
            l1.join("opt/x"),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        fs::write(l1.join("opt/x/3"), "3").unwrap();
    }

    fn kinds(entries: &[Entry]) -> Vec<(String, &'static str)> {
        entries
            .iter()
            .map(|e| {
                let k = match e.kind {
                    Kind::Dir { .. } => "dir",
                    Kind::File { .. } => "file",
                    Kind::Symlink { .. } => "symlink",
                    Kind::Deleted => "deleted",
                    Kind::Socket { .. } => "socket",
                    _ => "other",
                };
                (e.path.clone(), k)
            })
            .collect()
    }

    #[test]
    fn an_untouched_overlay_has_an_empty_layer_and_is_found_by_its_mount() {
        let m = Mounted::new(image);
        let ov = Overlay::locate(&m.merged()).unwrap();
        assert!(describe(&ov).unwrap().is_empty());
        // Not the root of the mount, and not an overlay at all.
        let err = Overlay::locate(&m.merged().join("etc")).unwrap_err();
        assert!(err.to_string().contains("not the root of a mount"), "{err}");
        let plain = tempfile::tempdir().unwrap();
        assert!(matches!(
            Overlay::locate(plain.path()),
            Err(LayerError::NotOverlay { .. })
        ));
    }

    #[test]
    fn changes_are_described_by_their_effect_on_the_image() {
        let m = Mounted::new(image);
        let r = m.merged();
        fs::write(r.join("tmp-new"), "new").unwrap();
        fs::write(r.join("etc/passwd"), "root:x:0:0\nevil:x:0:0").unwrap();
        fs::remove_file(r.join("usr/lib/a")).unwrap();
        // Removed and made again: an opaque directory in the upper layer.
        fs::remove_dir_all(r.join("usr/lib")).unwrap();
        fs::create_dir(r.join("usr/lib")).unwrap();
        fs::write(r.join("usr/lib/b"), "b").unwrap();
        symlink("/bin/sh", r.join("bin/link")).unwrap();
        fs::set_permissions(r.join("bin/sh"), fs::Permissions::from_mode(0o4755)).unwrap();
        // Opened for writing and left as it was: copied up, unchanged.
        fs::OpenOptions::new()
            .write(true)
            .open(r.join("etc/group"))
            .unwrap();
        let ov = Overlay::locate(&r).unwrap();
        let entries = describe(&ov).unwrap();
        assert_eq!(
            kinds(&entries),
            vec![
                ("bin/link".into(), "symlink"),
                ("bin/sh".into(), "file"),
                ("etc/passwd".into(), "file"),
                ("tmp-new".into(), "file"),
                ("usr/lib/a".into(), "deleted"),
            ],
            "{entries:#?}"
        );
        let Kind::File { mode, .. } = entries[1].kind else {
            panic!()
        };
        assert_eq!(mode, 0o4755);
    }

    /// A restore's deadline stops the description: one already passed stops it at the first
    /// name, before the walk reads the layer; one far off changes nothing.
    #[test]
    fn a_passed_deadline_stops_the_description() {
        let m = Mounted::new(image);
        let r = m.merged();
        for i in 0..50 {
            fs::write(r.join(format!("tmp-{i}")), "new").unwrap();
        }
        let ov = Overlay::locate(&r).unwrap();
        let past = Instant::now();
        let err = describe_until(&ov, Some(past)).unwrap_err();
        assert!(
            matches!(err, LayerError::Deadline { looked_at: 1 }),
            "{err:?}"
        );
        assert!(err.to_string().contains("deadline passed"), "{err}");
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        let whole = describe(&ov).unwrap();
        assert_eq!(whole.len(), 50);
        assert_eq!(describe_until(&ov, Some(far)).unwrap(), whole);
        // Hashing stops too, before its first read.
        let file = fs::File::open(r.join("tmp-0")).unwrap();
        let e = hash(&file, Some(past)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(hash(&file, Some(far)).unwrap().len(), 64);
    }

    /// The same change made two ways — removing and re-making a directory (opaque) and
    /// removing its entries one by one (whiteouts), as a tar diff applied through the merged
    /// mount does — is described the same.
    #[test]
    fn opaque_directories_and_whiteouts_describe_the_same_change() {
        let a = Mounted::new(image);
        fs::remove_dir_all(a.merged().join("usr/lib")).unwrap();
        fs::create_dir(a.merged().join("usr/lib")).unwrap();
        fs::write(a.merged().join("usr/lib/c"), "c").unwrap();
        let b = Mounted::new(image);
        fs::remove_file(b.merged().join("usr/lib/a")).unwrap();
        fs::remove_file(b.merged().join("usr/lib/b")).unwrap();
        fs::write(b.merged().join("usr/lib/c"), "c").unwrap();
        let da = describe(&Overlay::locate(&a.merged()).unwrap()).unwrap();
        let db = describe(&Overlay::locate(&b.merged()).unwrap()).unwrap();
        assert_eq!(da, db);
        assert_eq!(
            kinds(&da),
            vec![
                ("usr/lib/a".into(), "deleted"),
                ("usr/lib/b".into(), "deleted"),
                ("usr/lib/c".into(), "file"),
            ]
        );
        assert_eq!(compare(&da, &db), Ok(()));
        // Written to b only: a difference named by path.
        fs::write(b.merged().join("usr/lib/c"), "C").unwrap();
        let db = describe(&Overlay::locate(&b.merged()).unwrap()).unwrap();
        assert_eq!(compare(&da, &db).unwrap_err().path, "/usr/lib/c");
    }

    #[test]
    fn runtime_made_mount_points_may_be_absent() {
        let m = Mounted::new(image);
        let r = m.merged();
        fs::create_dir_all(r.join("run/secrets/kube")).unwrap();
        fs::write(r.join("etc/hostname"), "").unwrap();
        fs::write(r.join("etc/resolv.conf"), "nameserver 1.1.1.1").unwrap();
        fs::create_dir(r.join("work")).unwrap();
        fs::write(r.join("work/data"), "d").unwrap();
        let ov = Overlay::locate(&r).unwrap();
        let recorded = describe_for_seal(
            &ov,
            &[
                PathBuf::from("run/secrets/kube"),
                PathBuf::from("etc/hostname"),
                PathBuf::from("etc/resolv.conf"),
            ],
            Some(Path::new("work")),
        )
        .unwrap();
        let made: Vec<&str> = recorded
            .iter()
            .filter(|e| e.runtime_made)
            .map(|e| e.path.as_str())
            .collect();
        // resolv.conf has content: not what a runtime makes. work/ is the working directory.
        assert_eq!(
            made,
            [
                "etc/hostname",
                "run",
                "run/secrets",
                "run/secrets/kube",
                "work"
            ]
        );
        // A restore target without them (Podman's diff leaves mount points out).
        let t = Mounted::new(image);
        fs::write(t.merged().join("etc/resolv.conf"), "nameserver 1.1.1.1").unwrap();
        fs::create_dir(t.merged().join("work")).unwrap();
        fs::write(t.merged().join("work/data"), "d").unwrap();
        let found = describe(&Overlay::locate(&t.merged()).unwrap()).unwrap();
        assert_eq!(compare(&recorded, &found), Ok(()));
    }
}
