//! The files a checkpoint's processes hold open in the container's root filesystem, compared
//! with the root filesystem they are about to be restored onto.
//!
//! CRIU reopens every open (or mapped) regular file by its path and refuses one that is
//! missing or whose size or mode changed since the dump (and, by default, an ELF whose
//! build-id changed), after it has started restoring: runc then reports only "criu failed:
//! type NOTIFY errno 0". This check compares what CRIU compares whatever its configuration
//! (existence, type, size, setuid/setgid/sticky bits); the rwx bits and build-ids, which
//! CRIU's configuration may waive, are left to it. The common cause is a checkpoint
//! taken without the container's writable layer (`ctr containers checkpoint` without `--rw`)
//! of a process that held a file of that layer open, so this check names the files before
//! CRIU runs. Only files reached through the root mount of the container's mount namespace
//! (the root task's) are compared: CRIU recreates tmpfs mounts from the checkpoint, bind
//! mounts come from the spec, and a namespace the workload made has a root of its own.
//! Files CRIU brings back from the checkpoint itself (unlinked or remapped ones) and
//! external files handed in by the caller are skipped.
//!
//! Every name comes from the checkpoint and is resolved with `openat2(2)` and
//! `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` beneath the root filesystem, as the container
//! would see it: symlinks are followed inside the rootfs and never out of it (a symlink the
//! process opened itself, `O_PATH | O_NOFOLLOW`, is looked at, not followed), and the file is
//! opened with `O_PATH` (no device or FIFO is opened). At most [`MAX_COMPARED`] distinct names
//! are resolved, so a hostile `files.img` cannot make the check run long.

use std::collections::BTreeSet;
use std::fmt;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{self as rfs, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::image::{ImageDir, ImageError, Kind, Limits};
use crate::proto::{
    FdTypes, FileEntry, MntEntry, PstreeEntry, RegFileEntry, RemapFilePathEntry, TaskKobjIdsEntry,
};

/// The most distinct names resolved; a real dump has a few hundred (libraries, logs).
pub const MAX_COMPARED: usize = 1 << 16;

/// How an open file of the checkpoint differs in the root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Missing,
    Size {
        now: u64,
        dumped: u64,
    },
    Type {
        now: &'static str,
        dumped: &'static str,
    },
    /// The setuid, setgid or sticky bit differs (shown with the permission bits,
    /// `st_mode & 0o7777`).
    Mode {
        now: u32,
        dumped: u32,
    },
}

/// One open file the root filesystem cannot give back as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmatched {
    /// The path inside the container.
    pub path: String,
    pub problem: Problem,
}

impl fmt::Display for Unmatched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The name comes from the checkpoint: escaped, so that it cannot forge log lines.
        let path = self.path.escape_debug();
        match &self.problem {
            Problem::Missing => write!(f, "{path} (missing)"),
            Problem::Size { now, dumped } => {
                write!(f, "{path} ({now} bytes, {dumped} at the checkpoint)")
            }
            Problem::Type { now, dumped } => {
                write!(f, "{path} (a {now}, a {dumped} at the checkpoint)")
            }
            Problem::Mode { now, dumped } => {
                write!(f, "{path} (mode {now:04o}, {dumped:04o} at the checkpoint)")
            }
        }
    }
}

/// What [`open_files_in_rootfs`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenFiles {
    /// The root mount's id in the images (`None`: the images name none, nothing compared).
    pub root_mount: Option<u32>,
    /// Regular-file entries in `files.img`, through any mount.
    pub regular_files: usize,
    /// Distinct names compared with the root filesystem.
    pub compared: usize,
    /// Distinct names left uncompared past [`MAX_COMPARED`].
    pub uncompared: usize,
    /// Those it cannot give back as they were, in the images' order.
    pub unmatched: Vec<Unmatched>,
}

/// Compares the regular files the processes in `checkpoint_dir` hold open through the
/// container's root mount with what `rootfs` (the root filesystem of the container being
/// restored) holds.
pub fn open_files_in_rootfs(
    checkpoint_dir: &Path,
    rootfs: &Path,
    limits: Limits,
) -> Result<OpenFiles, ImageError> {
    let mut dir = ImageDir::open(checkpoint_dir, limits).map_err(|source| ImageError::Open {
        name: checkpoint_dir.display().to_string(),
        source,
    })?;
    let Some(root_mnt) = root_mount(&mut dir)? else {
        return Ok(OpenFiles::default());
    };
    let mut out = OpenFiles {
        root_mount: Some(root_mnt),
        ..OpenFiles::default()
    };
    let Some(files) = dir.read::<FileEntry>("files.img", Kind::Files)? else {
        return Ok(out);
    };
    let remapped: BTreeSet<u32> = dir
        .read::<RemapFilePathEntry>("remap-fpath.img", Kind::RemapFpath)?
        .unwrap_or_default()
        .iter()
        .map(|r| r.orig_id)
        .collect();
    let unopenable = |source: std::io::Error| ImageError::Open {
        name: rootfs.display().to_string(),
        source,
    };
    let root = rfs::open(
        rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| unopenable(e.into()))?;
    // A file open many times (each mapping of a library) is resolved once per distinct name,
    // dumped size and mode.
    let mut seen = BTreeSet::new();
    for reg in files
        .into_iter()
        .filter(|f| f.r#type == FdTypes::Reg as i32)
        .filter_map(|f| f.reg)
    {
        out.regular_files += 1;
        let through_root = reg.mnt_id.is_some_and(|m| m >= 0 && m as u32 == root_mnt);
        if !through_root || reg.ext.unwrap_or(false) || remapped.contains(&reg.id) {
            continue;
        }
        let Some(rel) = plain_relative(&reg.name) else {
            continue;
        };
        if !seen.insert((rel.clone(), reg.size, reg.mode)) {
            continue;
        }
        if out.compared == MAX_COMPARED {
            out.uncompared += 1;
            continue;
        }
        out.compared += 1;
        // A symlink the process opened itself (`O_PATH | O_NOFOLLOW`) is looked at, not
        // followed, as CRIU reopens it.
        let link = reg
            .mode
            .is_some_and(|m| FileType::from_raw_mode(m as _) == FileType::Symlink);
        let problem = match stat_in_root(root.as_fd(), &rel, link) {
            Ok(st) => compare(&st, &reg),
            Err(Errno::NOENT | Errno::NOTDIR) => Some(Problem::Missing),
            Err(Errno::NOSYS) => {
                return Err(unopenable(std::io::Error::other(
                    "this kernel has no openat2(2) to resolve names beneath it",
                )))
            }
            // Anything else (a symlink loop, a permission) is CRIU's to report.
            Err(_) => None,
        };
        if let Some(problem) = problem {
            out.unmatched.push(Unmatched {
                path: format!("/{rel}"),
                problem,
            });
        }
    }
    Ok(out)
}

/// The mount id of the root mount of the root task's mount namespace: where CRIU mounts the
/// container's root filesystem. `None` when the images do not say (the privilege check, which
/// runs first, refuses a checkpoint without them).
fn root_mount(dir: &mut ImageDir) -> Result<Option<u32>, ImageError> {
    let Some(root_task) = dir
        .read::<PstreeEntry>("pstree.img", Kind::Pstree)?
        .and_then(|p| p.into_iter().next())
    else {
        return Ok(None);
    };
    let ids: Option<TaskKobjIdsEntry> =
        dir.read_one(&format!("ids-{}.img", root_task.pid), Kind::Ids)?;
    let Some(ns) = ids.and_then(|i| i.mnt_ns_id) else {
        return Ok(None);
    };
    let entries: Vec<MntEntry> = dir
        .read(&format!("mountpoints-{ns}.img"), Kind::Mountpoints)?
        .unwrap_or_default();
    let ids: BTreeSet<u32> = entries.iter().map(|e| e.mnt_id).collect();
    Ok(entries
        .iter()
        .find(|e| !ids.contains(&e.parent_mnt_id) && e.mountpoint == b"/")
        .map(|e| e.mnt_id))
}

/// `/a/b` as `a/b` when it is absolute and has only plain components; `None` otherwise (CRIU
/// reports what it cannot open).
fn plain_relative(name: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(name).ok()?;
    let rest = s.strip_prefix('/')?;
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty()
        || parts
            .iter()
            .any(|p| *p == "." || *p == ".." || p.contains('\0'))
    {
        return None;
    }
    Some(parts.join("/"))
}

/// `rel` resolved in `root` as the container sees it; the final symlink itself when `link`.
fn stat_in_root(
    root: std::os::fd::BorrowedFd<'_>,
    rel: &str,
    link: bool,
) -> Result<rfs::Stat, Errno> {
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if link {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rfs::openat2(
        root,
        rel,
        flags,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )?;
    rfs::fstat(&fd)
}

/// What CRIU's reopen would refuse whatever its configuration: another file type, setuid,
/// setgid or sticky bit, or another size where the dump recorded one (it records none for
/// files opened `O_WRONLY | O_APPEND`).
fn compare(st: &rfs::Stat, reg: &RegFileEntry) -> Option<Problem> {
    let now = FileType::from_raw_mode(st.st_mode);
    if let Some(mode) = reg.mode {
        let dumped = FileType::from_raw_mode(mode as _);
        if now != dumped {
            return Some(Problem::Type {
                now: type_name(now),
                dumped: type_name(dumped),
            });
        }
        // CRIU compares the rwx bits too, unless its configuration says
        // `skip-file-rwx-check` (a file this check cannot see): those are left to CRIU, whose
        // message names them. The setuid, setgid and sticky bits it always compares.
        let (now, dumped) = (st.st_mode & 0o7777, mode & 0o7777);
        if now & 0o7000 != dumped & 0o7000 {
            return Some(Problem::Mode { now, dumped });
        }
    }
    match reg.size {
        Some(dumped) if now == FileType::RegularFile && st.st_size as u64 != dumped => {
            Some(Problem::Size {
                now: st.st_size as u64,
                dumped,
            })
        }
        _ => None,
    }
}

fn type_name(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        _ => "file of unknown type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge;

    #[test]
    fn only_plain_absolute_names_are_resolved() {
        assert_eq!(plain_relative(b"/tmp/count").as_deref(), Some("tmp/count"));
        assert_eq!(
            plain_relative(b"//tmp//count/").as_deref(),
            Some("tmp/count")
        );
        for bad in [
            &b"tmp/count"[..],
            b"/",
            b"/tmp/../etc/shadow",
            b"/./x",
            b"/\xff",
        ] {
            assert_eq!(plain_relative(bad), None, "{bad:?}");
        }
    }

    fn write<M: prost::Message>(dir: &Path, name: &str, kind: Kind, messages: &[M]) {
        std::fs::write(dir.join(name), forge::image_of(kind, messages)).unwrap();
    }

    fn mount(mnt_id: u32, parent_mnt_id: u32, mountpoint: &str) -> MntEntry {
        MntEntry {
            fstype: 5,
            mnt_id,
            parent_mnt_id,
            flags: 0,
            root: b"/".to_vec(),
            mountpoint: mountpoint.as_bytes().to_vec(),
            source: b"none".to_vec(),
            options: Vec::new(),
            ..Default::default()
        }
    }

    fn reg(id: u32, name: &str, mnt: u32, mode: u32) -> FileEntry {
        FileEntry {
            r#type: FdTypes::Reg as i32,
            id,
            reg: Some(RegFileEntry {
                id,
                name: name.as_bytes().to_vec(),
                mnt_id: Some(mnt as i32),
                size: Some(5),
                ext: None,
                mode: Some(mode),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn missing_resized_and_retyped_files_are_named_and_the_rest_pass() {
        use std::os::unix::fs::PermissionsExt;
        let ck = tempfile::tempdir().unwrap();
        let rootfs = tempfile::tempdir().unwrap();
        let (c, r) = (ck.path(), rootfs.path());
        std::fs::create_dir_all(r.join("tmp")).unwrap();
        for (name, content, mode) in [
            ("tmp/same", &b"12345"[..], 0o644),
            ("tmp/grown", b"123456", 0o644),
            // rwx bits are left to CRIU (`skip-file-rwx-check` may be configured for it).
            ("tmp/private", b"12345", 0o600),
            ("tmp/setuid", b"12345", 0o4644),
        ] {
            std::fs::write(r.join(name), content).unwrap();
            std::fs::set_permissions(r.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::create_dir(r.join("tmp/now-a-dir")).unwrap();
        // A symlink is followed inside the rootfs, never out of it: /etc/passwd of the host is
        // not the container's.
        std::os::unix::fs::symlink("/etc/passwd", r.join("tmp/escape")).unwrap();
        // A symlink the process opened itself is compared as a symlink, dangling or not.
        std::os::unix::fs::symlink("nowhere", r.join("tmp/link")).unwrap();

        // The root task (pid 1) is in mount namespace 12; a process made namespace 13.
        const ROOT: u32 = 10;
        const TMPFS: u32 = 11;
        const OTHER_NS_ROOT: u32 = 20;
        let task = PstreeEntry {
            pid: 1,
            ppid: 0,
            pgid: 1,
            sid: 1,
            threads: vec![1],
        };
        write(c, "pstree.img", Kind::Pstree, &[task]);
        let ids = TaskKobjIdsEntry {
            mnt_ns_id: Some(12),
            ..Default::default()
        };
        write(c, "ids-1.img", Kind::Ids, &[ids]);
        let mounts = [mount(ROOT, 1, "/"), mount(TMPFS, ROOT, "/dev/shm")];
        write(c, "mountpoints-12.img", Kind::Mountpoints, &mounts);
        write(
            c,
            "mountpoints-13.img",
            Kind::Mountpoints,
            &[mount(OTHER_NS_ROOT, 2, "/")],
        );
        let file = 0o100644;
        let files = [
            reg(1, "/tmp/same", ROOT, file),
            reg(2, "/tmp/grown", ROOT, file),
            reg(3, "/tmp/gone", ROOT, file),
            reg(4, "/tmp/now-a-dir", ROOT, file),
            reg(5, "/tmp/escape", ROOT, file),
            reg(6, "/tmp/private", ROOT, file),
            reg(14, "/tmp/setuid", ROOT, file),
            reg(7, "/tmp/link", ROOT, 0o120777),
            reg(8, "/tmp/new\nline", ROOT, file),
            // The same file mapped again: resolved once.
            reg(9, "/tmp/same", ROOT, file),
            // Through another mount or another namespace's root, remapped by CRIU, or not a
            // plain name: not compared.
            reg(10, "/dev/shm/x", TMPFS, file),
            reg(11, "/tmp/other-ns", OTHER_NS_ROOT, file),
            reg(12, "/tmp/unlinked", ROOT, file),
            reg(13, "/tmp/../etc/passwd", ROOT, file),
        ];
        write(c, "files.img", Kind::Files, &files);
        let remap = RemapFilePathEntry {
            orig_id: 12,
            remap_id: 70,
            ..Default::default()
        };
        write(c, "remap-fpath.img", Kind::RemapFpath, &[remap]);

        let found = open_files_in_rootfs(c, r, Limits::default()).unwrap();
        assert_eq!(found.root_mount, Some(ROOT), "{found:?}");
        assert_eq!(
            (found.regular_files, found.compared, found.uncompared),
            (14, 9, 0),
            "{found:?}"
        );
        let shown: Vec<String> = found.unmatched.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "/tmp/grown (6 bytes, 5 at the checkpoint)",
                "/tmp/gone (missing)",
                "/tmp/now-a-dir (a directory, a regular file at the checkpoint)",
                "/tmp/escape (missing)",
                "/tmp/setuid (mode 4644, 0644 at the checkpoint)",
                "/tmp/new\\nline (missing)",
            ],
            "{found:?}"
        );
    }

    #[test]
    fn no_files_image_means_nothing_to_compare() {
        let ck = tempfile::tempdir().unwrap();
        let rootfs = tempfile::tempdir().unwrap();
        let found = open_files_in_rootfs(ck.path(), rootfs.path(), Limits::default()).unwrap();
        assert_eq!(found, OpenFiles::default());
    }
}
