//! The files a checkpoint's processes hold open in the container's root filesystem, compared
//! with the root filesystem they are about to be restored onto.
//!
//! CRIU reopens every open (or mapped) regular file by its path and refuses one that is
//! missing or whose size or type changed since the dump, after it has started restoring: runc
//! then reports only "criu failed: type NOTIFY errno 0". The common cause is a checkpoint
//! taken without the container's writable layer (`ctr containers checkpoint` without `--rw`)
//! of a process that held a file of that layer open, so this check names the files before
//! CRIU runs. Only files reached through the root mount of a mount namespace are compared:
//! CRIU recreates tmpfs mounts from the checkpoint, and bind mounts come from the spec.
//! Files CRIU brings back from the checkpoint itself (unlinked or remapped ones) and
//! external files handed in by the caller are skipped.
//!
//! Every name comes from the checkpoint and is resolved with `openat2(2)` and
//! `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` beneath the root filesystem, as the container
//! would see it: symlinks are followed inside the rootfs and never out of it, and the file is
//! opened with `O_PATH` (no device or FIFO is opened).

use std::collections::BTreeSet;
use std::fmt;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{self as rfs, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::image::{ImageDir, ImageError, Kind, Limits};
use crate::proto::{FileEntry, MntEntry, RemapFilePathEntry, FD_TYPE_REG};

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
        match &self.problem {
            Problem::Missing => write!(f, "{} (missing)", self.path),
            Problem::Size { now, dumped } => {
                write!(f, "{} ({now} bytes, {dumped} at the checkpoint)", self.path)
            }
            Problem::Type { now, dumped } => {
                write!(f, "{} (a {now}, a {dumped} at the checkpoint)", self.path)
            }
        }
    }
}

/// What [`open_files_in_rootfs`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenFiles {
    /// Files compared with the root filesystem.
    pub compared: usize,
    /// Those it cannot give back as they were, in the images' order.
    pub unmatched: Vec<Unmatched>,
}

/// Compares the regular files the processes in `checkpoint_dir` hold open through the root
/// mount with what `rootfs` (the root filesystem of the container being restored) holds.
pub fn open_files_in_rootfs(
    checkpoint_dir: &Path,
    rootfs: &Path,
    limits: Limits,
) -> Result<OpenFiles, ImageError> {
    let mut dir = ImageDir::open(checkpoint_dir, limits).map_err(|source| ImageError::Open {
        name: checkpoint_dir.display().to_string(),
        source,
    })?;
    let roots = root_mounts(&mut dir)?;
    let Some(files) = dir.read::<FileEntry>("files.img", Kind::Files)? else {
        return Ok(OpenFiles::default());
    };
    let remapped: BTreeSet<u32> = dir
        .read::<RemapFilePathEntry>("remap-fpath.img", Kind::RemapFpath)?
        .unwrap_or_default()
        .iter()
        .map(|r| r.orig_id)
        .collect();
    let root = rfs::open(
        rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ImageError::Open {
        name: rootfs.display().to_string(),
        source: e.into(),
    })?;
    let mut out = OpenFiles::default();
    for reg in files
        .into_iter()
        .filter(|f| f.r#type == FD_TYPE_REG)
        .filter_map(|f| f.reg)
    {
        let through_root = reg
            .mnt_id
            .is_some_and(|m| u32::try_from(m).is_ok_and(|m| roots.contains(&m)));
        if !through_root || reg.ext.unwrap_or(false) || remapped.contains(&reg.id) {
            continue;
        }
        let Some(rel) = plain_relative(&reg.name) else {
            continue;
        };
        out.compared += 1;
        let problem = match stat_in_root(root.as_fd(), &rel) {
            Ok(st) => compare(&st, &reg),
            Err(Errno::NOENT | Errno::NOTDIR) => Some(Problem::Missing),
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

/// The mount ids of every mount namespace's root mount (what CRIU mounts the container's
/// root filesystem at).
fn root_mounts(dir: &mut ImageDir) -> Result<BTreeSet<u32>, ImageError> {
    let names = dir.names().map_err(|source| ImageError::Read {
        name: dir.path().display().to_string(),
        source,
    })?;
    let mut roots = BTreeSet::new();
    for name in names
        .iter()
        .filter(|n| n.starts_with("mountpoints-") && n.ends_with(".img"))
    {
        let entries: Vec<MntEntry> = dir.read(name, Kind::Mountpoints)?.unwrap_or_default();
        let ids: BTreeSet<u32> = entries.iter().map(|e| e.mnt_id).collect();
        roots.extend(
            entries
                .iter()
                .filter(|e| !ids.contains(&e.parent_mnt_id) && e.mountpoint == b"/")
                .map(|e| e.mnt_id),
        );
    }
    Ok(roots)
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

fn stat_in_root(root: std::os::fd::BorrowedFd<'_>, rel: &str) -> Result<rfs::Stat, Errno> {
    let fd = rfs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )?;
    rfs::fstat(&fd)
}

fn compare(st: &rfs::Stat, reg: &crate::proto::RegFileEntry) -> Option<Problem> {
    let now = FileType::from_raw_mode(st.st_mode);
    if let Some(mode) = reg.mode {
        let dumped = FileType::from_raw_mode(mode as _);
        if now != dumped {
            return Some(Problem::Type {
                now: type_name(now),
                dumped: type_name(dumped),
            });
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

    #[test]
    fn missing_resized_and_retyped_files_are_named_and_the_rest_pass() {
        let ck = tempfile::tempdir().unwrap();
        let rootfs = tempfile::tempdir().unwrap();
        let r = rootfs.path();
        std::fs::create_dir_all(r.join("tmp")).unwrap();
        std::fs::write(r.join("tmp/same"), b"12345").unwrap();
        std::fs::write(r.join("tmp/grown"), b"123456").unwrap();
        std::fs::create_dir(r.join("tmp/now-a-dir")).unwrap();
        // A symlink is followed inside the rootfs, never out of it: /etc/passwd of the host is
        // not the container's.
        std::os::unix::fs::symlink("/etc/passwd", r.join("tmp/escape")).unwrap();
        const ROOT: u32 = 10;
        const TMPFS: u32 = 11;
        let mount = |mnt_id, parent_mnt_id, mountpoint: &str| MntEntry {
            fstype: 5,
            mnt_id,
            parent_mnt_id,
            flags: 0,
            root: b"/".to_vec(),
            mountpoint: mountpoint.as_bytes().to_vec(),
            source: b"none".to_vec(),
            options: Vec::new(),
            ext_mount: None,
            fsname: None,
            sb_flags: None,
            ext_key: None,
        };
        let mounts = [mount(ROOT, 1, "/"), mount(TMPFS, ROOT, "/dev/shm")];
        std::fs::write(
            ck.path().join("mountpoints-12.img"),
            forge::image_of(Kind::Mountpoints, &mounts),
        )
        .unwrap();
        let reg = |id: u32, name: &str, mnt: u32| FileEntry {
            r#type: FD_TYPE_REG,
            id,
            reg: Some(crate::proto::RegFileEntry {
                id,
                name: name.as_bytes().to_vec(),
                mnt_id: Some(mnt as i32),
                size: Some(5),
                ext: None,
                mode: Some(0o100644),
            }),
        };
        let files = [
            reg(1, "/tmp/same", ROOT),
            reg(2, "/tmp/grown", ROOT),
            reg(3, "/tmp/gone", ROOT),
            reg(4, "/tmp/now-a-dir", ROOT),
            reg(5, "/tmp/escape", ROOT),
            // Through another mount, remapped by CRIU, or not a plain name: not compared.
            reg(6, "/dev/shm/x", TMPFS),
            reg(7, "/tmp/unlinked", ROOT),
            reg(8, "/tmp/../etc/passwd", ROOT),
        ];
        std::fs::write(
            ck.path().join("files.img"),
            forge::image_of(Kind::Files, &files),
        )
        .unwrap();
        let remap = RemapFilePathEntry {
            orig_id: 7,
            remap_id: 70,
        };
        std::fs::write(
            ck.path().join("remap-fpath.img"),
            forge::image_of(Kind::RemapFpath, &[remap]),
        )
        .unwrap();
        let found = open_files_in_rootfs(ck.path(), r, Limits::default()).unwrap();
        assert_eq!(found.compared, 5, "{found:?}");
        let shown: Vec<String> = found.unmatched.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "/tmp/grown (6 bytes, 5 at the checkpoint)",
                "/tmp/gone (missing)",
                "/tmp/now-a-dir (a directory, a regular file at the checkpoint)",
                "/tmp/escape (missing)",
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
