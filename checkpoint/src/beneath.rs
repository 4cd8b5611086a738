//! Paths from untrusted names, resolved beneath a root directory and never through a symlink.
//!
//! Everything a checkpoint brings — entry names of a rootfs diff or an image layer, a
//! checkpoint name in a pod annotation — is resolved with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, one component at a time from
//! a directory descriptor: the kernel refuses any step that would leave the root or pass
//! through a symlink, including a symlink an earlier entry of the same archive created. Names
//! are checked lexically first (only plain components), so a refusal can say what was wrong.
//! Every change is then made with an `*at` call on one name inside a trusted parent
//! descriptor, which never follows a final symlink.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// No symlink, no magic link, nothing outside the starting directory.
pub const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Why an untrusted name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty name")]
    Empty,
    #[error("{0:?} is absolute")]
    Absolute(String),
    #[error("{0:?} has a `..` component")]
    Parent(String),
    #[error("{0:?} has a NUL byte")]
    Nul(String),
}

/// The plain components of an untrusted relative name: refuses empty, absolute, `..` and NUL;
/// `.` and repeated slashes are ignored.
pub fn components(rel: &Path) -> Result<Vec<&OsStr>, NameError> {
    let shown = || rel.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) if n.as_bytes().contains(&0) => {
                return Err(NameError::Nul(shown()))
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(NameError::Parent(shown())),
            Component::RootDir | Component::Prefix(_) => return Err(NameError::Absolute(shown())),
        }
    }
    if out.is_empty() {
        return Err(NameError::Empty);
    }
    Ok(out)
}

/// `openat2` beneath `dir`, retrying the `EAGAIN` the kernel returns when a rename elsewhere
/// raced the lookup.
pub fn openat2(dir: BorrowedFd<'_>, path: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let mut last = Errno::AGAIN;
    for _ in 0..16 {
        match rfs::openat2(dir, path, flags | OFlags::CLOEXEC, mode, RESOLVE) {
            Err(Errno::AGAIN) | Err(Errno::INTR) => last = Errno::AGAIN,
            other => return other.map_err(Into::into),
        }
    }
    Err(last.into())
}

/// Opens the directory `root` itself (which the caller trusts).
pub fn open_root(root: &Path) -> io::Result<OwnedFd> {
    rfs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

/// Opens the existing directory `rel` beneath `root`: no component may be a symlink.
pub fn open_dir(root: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    components(rel).map_err(io::Error::other)?;
    openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        Mode::empty(),
    )
}

/// Opens the existing regular file `rel` beneath `root` for reading: no component may be a
/// symlink (`ELOOP`, as for a symlink on the way), and the file must be a regular file.
///
/// The name is opened `O_PATH` first, which runs no driver's open: a device node planted
/// under the name (an image layer unpacked as root can hold one: a watchdog, a tape) or a
/// FIFO is refused by its type before anything opens it. Only a regular file is then opened
/// for reading, through that descriptor ([`reopen_regular`]).
pub fn open_file(root: BorrowedFd<'_>, rel: &Path) -> io::Result<std::fs::File> {
    components(rel).map_err(io::Error::other)?;
    let fd = openat2(root, rel, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
    reopen_regular(fd, rel)
}

/// Opens for reading the file an `O_PATH` descriptor `fd` names, when it is a regular file:
/// its type is read from the descriptor, and the file is reopened through `/proc/self/fd`,
/// so what is read is what was checked. A symlink (what `O_PATH | O_NOFOLLOW` opens when the
/// name is one) is `ELOOP`; anything else not a regular file is refused naming `shown`.
pub fn reopen_regular(fd: OwnedFd, shown: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let st = rfs::fstat(&fd)?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Symlink => return Err(io::Error::from_raw_os_error(Errno::LOOP.raw_os_error())),
        other => {
            return Err(io::Error::other(format!(
                "{} is not a regular file ({})",
                shown.display(),
                kind_of(other)
            )))
        }
    }
    let file = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let opened = file.metadata()?;
    if opened.dev() != st.st_dev as u64 || opened.ino() != st.st_ino as u64 {
        return Err(io::Error::other(format!(
            "{} changed while it was opened",
            shown.display()
        )));
    }
    Ok(file)
}

/// A file type, for messages.
fn kind_of(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown type",
    }
}

/// The parent directory of `rel` beneath `root` (an `O_PATH` descriptor) and the final name.
/// Missing parents are created with `mkdir_mode` when given; an existing parent that is not a
/// directory (a symlink above all) is refused with `ENOTDIR`/`ELOOP`.
pub fn parent_of(
    root: BorrowedFd<'_>,
    rel: &Path,
    mkdir_mode: Option<u32>,
) -> io::Result<(OwnedFd, OsString)> {
    let comps = components(rel).map_err(io::Error::other)?;
    let (last, parents) = comps.split_last().expect("components is never empty");
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
    let mut cur = openat2(root, Path::new("."), flags, Mode::empty())?;
    for c in parents {
        let next = match openat2(cur.as_fd(), Path::new(c), flags, Mode::empty()) {
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                let Some(mode) = mkdir_mode else {
                    return Err(e);
                };
                match rfs::mkdirat(&cur, *c, Mode::from_raw_mode(mode)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                openat2(cur.as_fd(), Path::new(c), flags, Mode::empty())?
            }
            other => other?,
        };
        cur = next;
    }
    Ok((cur, last.to_os_string()))
}

/// The type of `name` in `parent` without following it; `None` when it does not exist.
pub fn file_type_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<FileType>> {
    match rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Removes `name` in `parent` (a directory with everything in it) without following symlinks.
pub fn remove_all_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    match file_type_at(parent, name)? {
        None => Ok(()),
        Some(FileType::Directory) => {
            let dir = openat2(
                parent,
                Path::new(name),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                Mode::empty(),
            )?;
            empty_dir(dir.as_fd(), &|_| false)?;
            rfs::unlinkat(parent, name, AtFlags::REMOVEDIR).map_err(Into::into)
        }
        Some(_) => rfs::unlinkat(parent, name, AtFlags::empty()).map_err(Into::into),
    }
}

/// The names in the directory `dir` (not `.` and `..`), sorted: read through the descriptor,
/// so the directory listed is the one opened, whatever its path now leads to.
pub fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    let mut entries = rfs::Dir::read_from(dir)?;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(OsStr::from_bytes(n).to_os_string());
        }
    }
    names.sort();
    Ok(names)
}

/// `fsync` of the directory `dir`: makes the names created or renamed in it durable.
pub fn sync_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    rfs::fsync(dir).map_err(Into::into)
}

/// Removes the one name `name` in `dir` (a file or symlink, never followed; not a directory).
/// A name that is already gone is not an error.
pub fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    match rfs::unlinkat(dir, single(name)?, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes every entry of the directory `dir` for which `keep` says no.
pub fn empty_dir(dir: BorrowedFd<'_>, keep: &dyn Fn(&OsStr) -> bool) -> io::Result<()> {
    let names = names(dir)?;
    for n in names.iter().filter(|n| !keep(n)) {
        remove_all_at(dir, n)?;
    }
    Ok(())
}

/// `chmod` of `name` in `parent` that never follows a symlink (symlinks have no mode).
pub fn chmod_at(parent: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let fd = rfs::openat(
        parent,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if FileType::from_raw_mode(rfs::fstat(&fd)?.st_mode) == FileType::Symlink {
        return Ok(());
    }
    // The magic link names the very inode `fd` holds; rustix has no fchmodat2.
    rfs::chmodat(
        rfs::CWD,
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        Mode::from_raw_mode(mode & 0o7777),
        AtFlags::empty(),
    )
    .map_err(Into::into)
}

/// The path of `name` inside the trusted directory `parent`, for calls that only take a path
/// and do not follow the final component (`lsetxattr`).
pub fn proc_path(parent: BorrowedFd<'_>, name: &OsStr) -> std::path::PathBuf {
    let mut p = OsString::from(format!("/proc/self/fd/{}/", parent.as_raw_fd()));
    p.push(name);
    p.into()
}

/// Creates `dir` (and missing parents) 0700, and makes an existing one 0700: it holds process
/// memory. The directory itself must not be a symlink.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    if meta.permissions().mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// A file that is larger than its reader's cap: refused before it is read whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} is {size} bytes, more than the {cap} bytes any such file may have; refused unread")]
pub struct TooLarge {
    pub name: String,
    pub size: u64,
    pub cap: u64,
}

/// Whether `e` is a [`TooLarge`] refusal of [`read_capped`].
pub fn too_large(e: &io::Error) -> Option<&TooLarge> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<TooLarge>())
}

/// Reads the regular file `rel` beneath `root` (no symlink followed anywhere), refusing it
/// when it holds more than `cap` bytes: its size is checked before a byte is read, and the
/// read stops one byte past the cap whatever the size said (a file that grows). Every JSON
/// document gpusnap reads from an image, layer, archive or checkpoint goes through here.
pub fn read_capped(root: BorrowedFd<'_>, rel: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let file = open_file(root, rel)?;
    read_file_capped(file, &rel.to_string_lossy(), cap)
}

/// [`read_capped`] of a file already opened beneath its root.
pub fn read_file_capped(file: std::fs::File, name: &str, cap: u64) -> io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    read_file_capped_from(file, name, size, cap)
}

/// [`read_capped`] of any reader (an archive member, say) whose size is declared as `size`:
/// refused before a byte is read when `size` is over `cap`, and when the reader gives more than
/// `cap` bytes whatever `size` said.
pub fn read_file_capped_from(
    r: impl io::Read,
    name: &str,
    size: u64,
    cap: u64,
) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let too_large = |size| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            TooLarge {
                name: name.to_owned(),
                size,
                cap,
            },
        )
    };
    if size > cap {
        return Err(too_large(size));
    }
    let mut out = Vec::with_capacity(size as usize);
    r.take(cap + 1).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(too_large(out.len() as u64));
    }
    Ok(out)
}

/// What one entry of a tree is, never following it.
pub fn stat_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<rfs::Stat>> {
    match rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A single plain name (no `/`, not `.` or `..`), for the calls that work on one name in a
/// directory descriptor.
fn single(name: &OsStr) -> io::Result<&OsStr> {
    let comps = components(Path::new(name)).map_err(io::Error::other)?;
    if comps.len() != 1 || comps[0] != name {
        return Err(io::Error::other(format!(
            "{:?} is not a single plain name",
            name.to_string_lossy()
        )));
    }
    Ok(name)
}

/// Creates the new regular file `name` in `dir` with `O_CREAT | O_EXCL | O_NOFOLLOW`: whatever
/// is already there (a planted file or symlink) makes it fail with `EEXIST`, never written
/// through.
pub fn create_new(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<std::fs::File> {
    let fd = openat2(
        dir,
        Path::new(single(name)?),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
        Mode::from_raw_mode(mode),
    )?;
    Ok(std::fs::File::from(fd))
}

/// `renameat(2)` of one name to another inside the same directory descriptor: a symlink at
/// `to` is replaced, never followed.
pub fn rename_at(dir: BorrowedFd<'_>, from: &OsStr, to: &OsStr) -> io::Result<()> {
    rfs::renameat(dir, single(from)?, dir, single(to)?).map_err(Into::into)
}

/// Writes `bytes` as `name` in `dir`, atomically: into a new temporary file created with
/// `O_CREAT | O_EXCL | O_NOFOLLOW` through the descriptor, synced, then renamed over `name`
/// inside the same directory. Nothing planted in `dir` (a symlink at either name) is followed.
pub fn write_atomically(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    bytes: &[u8],
    mode: u32,
) -> io::Result<()> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = single(name)?;
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    // A leftover of that name goes first (unlinkat removes a symlink, not its target).
    match rfs::unlinkat(dir, &tmp, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let written = (|| {
        let mut f = create_new(dir, &tmp, mode)?;
        f.write_all(bytes)?;
        rfs::fchmod(&f, Mode::from_raw_mode(mode))?;
        f.sync_all()?;
        rename_at(dir, &tmp, name)?;
        rfs::fsync(dir).map_err(io::Error::from)
    })();
    if written.is_err() {
        let _ = rfs::unlinkat(dir, &tmp, AtFlags::empty());
    }
    written
}

/// Bytes an unprivileged writer may still put on the file system holding `fd` (`statvfs`
/// `f_bavail * f_frsize`).
pub fn available_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let st = rfs::fstatvfs(fd)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// How deep [`walk`] descends before it refuses a tree.
pub const WALK_MAX_DEPTH: usize = 32;

/// Visits every entry beneath the directory `dir` (depth first, names sorted), each with its
/// parent's descriptor, its path relative to `dir` and its `statat(AT_SYMLINK_NOFOLLOW)`: nothing is followed, and
/// subdirectories are opened with `openat2` beneath their parent. `visit` returning an error
/// stops the walk; a tree deeper than [`WALK_MAX_DEPTH`] is refused.
pub fn walk<E: From<io::Error>>(
    dir: BorrowedFd<'_>,
    visit: &mut dyn FnMut(BorrowedFd<'_>, &Path, &rfs::Stat) -> Result<(), E>,
) -> Result<(), E> {
    walk_in(dir, Path::new(""), 0, visit)
}

fn walk_in<E: From<io::Error>>(
    dir: BorrowedFd<'_>,
    at: &Path,
    depth: usize,
    visit: &mut dyn FnMut(BorrowedFd<'_>, &Path, &rfs::Stat) -> Result<(), E>,
) -> Result<(), E> {
    if depth > WALK_MAX_DEPTH {
        return Err(io::Error::other(format!(
            "{} is nested more than {WALK_MAX_DEPTH} directories deep",
            at.display()
        ))
        .into());
    }
    for name in names(dir)? {
        let Some(st) = stat_at(dir, &name)? else {
            continue; // removed meanwhile
        };
        let rel = at.join(&name);
        visit(dir, &rel, &st)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let sub = openat2(
                dir,
                Path::new(&name),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                Mode::empty(),
            )?;
            walk_in(sub.as_fd(), &rel, depth + 1, visit)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fs;

    /// A FIFO under a file's name is refused by its type without being opened: a writer
    /// waiting on it stays blocked (an open for reading, even non-blocking, would release
    /// it, as a device's open would run its driver).
    #[test]
    fn a_fifo_or_symlink_under_a_files_name_is_refused_unopened() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("gpusnap-manifest.json");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, Mode::from_raw_mode(0o600)).unwrap();
        let opened = Arc::new(AtomicBool::new(false));
        let writer = {
            let (fifo, opened) = (fifo.clone(), opened.clone());
            std::thread::spawn(move || {
                let w = fs::OpenOptions::new().write(true).open(&fifo).unwrap();
                opened.store(true, Ordering::SeqCst);
                drop(w);
            })
        };
        let root = open_root(dir.path()).unwrap();
        let err = open_file(root.as_fd(), Path::new("gpusnap-manifest.json")).unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !opened.load(Ordering::SeqCst),
            "the FIFO was opened: its writer went on"
        );
        // Release the writer.
        drop(fs::File::open(&fifo).unwrap());
        writer.join().unwrap();

        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link")).unwrap();
        let err = open_file(root.as_fd(), Path::new("link")).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(Errno::LOOP.raw_os_error()),
            "{err}"
        );
        fs::write(dir.path().join("plain"), b"ok").unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut open_file(root.as_fd(), Path::new("plain")).unwrap(),
            &mut text,
        )
        .unwrap();
        assert_eq!(text, "ok");
    }

    fn demo() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        let outside = top.path().join("outside");
        fs::create_dir_all(root.join("sub/ck1/checkpoint")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("keep"), b"host file").unwrap();
        std::os::unix::fs::symlink("../outside", root.join("evil")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("inroot")).unwrap();
        (top, root, outside)
    }

    #[test]
    fn names_are_checked_lexically() {
        assert!(components(Path::new("a/./b//c")).is_ok());
        for bad in ["", ".", "/etc", "../x", "a/../b"] {
            assert!(components(Path::new(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn no_symlink_is_followed_in_or_out_of_the_root() {
        let (_top, root, _outside) = demo();
        let r = open_root(&root).unwrap();
        assert!(open_dir(r.as_fd(), Path::new("sub/ck1/checkpoint")).is_ok());
        for bad in ["evil", "abs", "inroot/ck1", "evil/x", "../outside"] {
            assert!(open_dir(r.as_fd(), Path::new(bad)).is_err(), "{bad}");
            assert!(parent_of(r.as_fd(), Path::new(&format!("{bad}/x")), Some(0o755)).is_err());
        }
        assert!(open_file(r.as_fd(), Path::new("evil/keep")).is_err());
    }

    #[test]
    fn removal_never_reaches_through_a_symlink() {
        let (_top, root, outside) = demo();
        let r = open_root(&root).unwrap();
        remove_all_at(r.as_fd(), OsStr::new("evil")).unwrap();
        assert!(
            outside.join("keep").exists(),
            "the link went, not its target"
        );
        let sub = open_dir(r.as_fd(), Path::new("sub")).unwrap();
        empty_dir(sub.as_fd(), &|_| false).unwrap();
        assert_eq!(fs::read_dir(root.join("sub")).unwrap().count(), 0);
    }

    #[test]
    fn private_dirs_are_0700_whatever_they_were() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let d = top.path().join("ck");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&d).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::os::unix::fs::symlink(&d, top.path().join("link")).unwrap();
        assert!(create_private_dir(&top.path().join("link")).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Random names built of `..`, `.`, plain names, symlinks to outside, inside, absolute
        /// and chains of links: whatever resolves is beneath the root.
        #[test]
        fn resolution_stays_beneath_the_root(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(".."), Just("."), Just("sub"), Just("ck1"), Just("checkpoint"),
                    Just("evil"), Just("abs"), Just("inroot"), Just("chain"), Just("x")
                ],
                1..7,
            ),
            absolute in any::<bool>(),
        ) {
            let (top, root, _outside) = demo();
            std::os::unix::fs::symlink("inroot/ck1", root.join("chain")).unwrap();
            let r = open_root(&root).unwrap();
            let mut name = parts.join("/");
            if absolute {
                name.insert(0, '/');
            }
            let canonical_root = root.canonicalize().unwrap();
            let check = |fd: &OwnedFd| {
                let real = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
                assert!(real.starts_with(&canonical_root), "{name:?} resolved to {real:?}");
            };
            if let Ok(fd) = open_dir(r.as_fd(), Path::new(&name)) {
                check(&fd);
                prop_assert!(!parts.iter().any(|p| ["..", "evil", "abs", "inroot", "chain"].contains(p)));
            }
            if let Ok((fd, _)) = parent_of(r.as_fd(), Path::new(&name), Some(0o755)) {
                check(&fd);
            }
            drop(top);
        }
    }
}
