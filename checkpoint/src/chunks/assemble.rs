//! Assembling chunked files into the flat checkpoint directory, beneath it.
//!
//! ```text
//! chunk list read (capped) and checked against itself and the sealed manifest
//! → free space → one hidden temporary file per chunked file (O_EXCL, 0600, sparse)
//! → chunks read on all cores, each SHA-256-checked, written at its offset (zeros: a hole)
//! → every temporary file hashed against the manifest's BLAKE3 pieces (all cores)
//! → its mode (0600) and the list's modification time set through its descriptor
//! → renamed to its name (which must not exist) → chunk list and chunk directory removed
//! → the checkpoint directory's own times put back as they were before assembly
//! ```
//! Any failure removes the temporary and already renamed files: nothing assembled is left.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

use super::{ChunkDigest, ChunkError, ChunkList, ChunkRef, CHUNK_DIR, CHUNK_LIST_FILE};
use super::{MAX_CHUNK_BYTES, MAX_CHUNK_LIST_BYTES};
use crate::beneath;

/// Where chunks come from, by digest: the checkpoint's own `.gpusnap-chunks/` ([`DirSource`]),
/// or a node's content-addressed store. Nothing a source returns is trusted: every chunk is
/// length- and SHA-256-checked, and every assembled file checked against the sealed manifest.
pub trait ChunkSource: Sync {
    /// The chunk `digest`, which the list says is `len` bytes long.
    fn open(&self, digest: &ChunkDigest, len: u64) -> Result<Box<dyn Read + Send + '_>, OpenError>;
    /// How to name this source in messages.
    fn name(&self) -> String;
}

/// Why [`ChunkSource::open`] gave no chunk.
#[derive(Debug)]
pub enum OpenError {
    Missing,
    /// Not a regular file with one link (what it is instead).
    NotPlain(String),
    /// Present with another length.
    Length(u64),
    Io(io::Error),
}

/// The chunk files of a checkpoint directory: `<dir>/.gpusnap-chunks/<hex>`.
pub struct DirSource {
    dir: OwnedFd,
    shown: PathBuf,
}

impl DirSource {
    /// Opens `.gpusnap-chunks` beneath the checkpoint directory `checkpoint` (never through a
    /// symlink); `None` when there is none.
    pub fn open_in(checkpoint: BorrowedFd<'_>, shown: &Path) -> io::Result<Option<DirSource>> {
        match beneath::openat2(
            checkpoint,
            Path::new(CHUNK_DIR),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(dir) => Ok(Some(DirSource {
                dir,
                shown: shown.join(CHUNK_DIR),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl ChunkSource for DirSource {
    fn open(&self, digest: &ChunkDigest, len: u64) -> Result<Box<dyn Read + Send + '_>, OpenError> {
        Ok(Box::new(self.open_file(digest, len)?))
    }

    fn name(&self) -> String {
        self.shown.display().to_string()
    }
}

impl DirSource {
    /// The chunk `digest` (which the list says is `len` bytes long) as a file, for positional
    /// reads: beneath the chunk directory, a regular file with one link and that length.
    pub fn open_file(&self, digest: &ChunkDigest, len: u64) -> Result<File, OpenError> {
        let name = digest.hex();
        // O_PATH: a device node or FIFO planted under a chunk's name is refused by its type
        // below, never opened (a device's open runs its driver; a FIFO's blocks).
        let fd = match beneath::openat2(
            self.dir.as_fd(),
            Path::new(&name),
            OFlags::PATH | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(OpenError::Missing),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                return Err(OpenError::NotPlain("a symlink".into()))
            }
            Err(e) => return Err(OpenError::Io(e)),
        };
        let st = rfs::fstat(&fd).map_err(|e| OpenError::Io(e.into()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            // What O_PATH | O_NOFOLLOW opens when the name itself is a symlink.
            FileType::Symlink => return Err(OpenError::NotPlain("a symlink".into())),
            _ => return Err(OpenError::NotPlain("not a regular file".into())),
        }
        if st.st_nlink > 1 {
            return Err(OpenError::NotPlain(format!(
                "a hard link ({} links)",
                st.st_nlink
            )));
        }
        if st.st_size as u64 != len {
            return Err(OpenError::Length(st.st_size as u64));
        }
        beneath::reopen_regular(fd, Path::new(&name)).map_err(OpenError::Io)
    }
}

/// What [`assemble`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Assembled {
    pub files: usize,
    /// Bytes of the assembled files.
    pub bytes: u64,
    pub chunks: usize,
    pub distinct_chunks: usize,
}

/// Assembles the chunked checkpoint directory `dir` in place from its own chunk directory,
/// then removes the chunk list and chunk directory. `Ok(None)`: not chunked (neither exists).
pub fn assemble(dir: &Path) -> Result<Option<Assembled>, ChunkError> {
    let root = beneath::open_root(dir).map_err(|source| ChunkError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    assemble_opened(root.as_fd(), dir)
}

/// Whether `dir` holds a chunk list or chunk directory (then [`assemble`] has work to do).
pub fn is_chunked(dir: &Path) -> std::io::Result<bool> {
    let root = beneath::open_root(dir)?;
    Ok(
        beneath::stat_at(root.as_fd(), OsStr::new(CHUNK_LIST_FILE))?.is_some()
            || beneath::stat_at(root.as_fd(), OsStr::new(CHUNK_DIR))?.is_some(),
    )
}

/// [`assemble`] of the opened checkpoint directory `root` (shown as `dir`).
pub fn assemble_opened(root: BorrowedFd<'_>, dir: &Path) -> Result<Option<Assembled>, ChunkError> {
    let io_err = |source| ChunkError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let source = DirSource::open_in(root, dir).map_err(io_err)?;
    let has_list = beneath::stat_at(root, OsStr::new(CHUNK_LIST_FILE))
        .map_err(io_err)?
        .is_some();
    match (has_list, source) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(ChunkError::DirWithoutList {
            dir: dir.to_path_buf(),
        }),
        (true, source) => {
            let empty;
            let src: &dyn ChunkSource = match &source {
                Some(s) => s,
                None => {
                    empty = NoChunks;
                    &empty
                }
            };
            assemble_at(root, dir, src).map(Some)
        }
    }
}

/// The source of a list without a chunk directory: every chunk is missing.
struct NoChunks;

impl ChunkSource for NoChunks {
    fn open(&self, _: &ChunkDigest, _: u64) -> Result<Box<dyn Read + Send + '_>, OpenError> {
        Err(OpenError::Missing)
    }
    fn name(&self) -> String {
        format!("{CHUNK_DIR} (absent)")
    }
}

/// Assembles the files the chunk list of the opened checkpoint directory `dir` (shown as
/// `shown`) names from `source`, verifies them against the sealed manifest, renames them into
/// place and removes the chunk list and any `.gpusnap-chunks/`.
pub fn assemble_at(
    dir: BorrowedFd<'_>,
    shown: &Path,
    source: &dyn ChunkSource,
) -> Result<Assembled, ChunkError> {
    let started = std::time::Instant::now();
    let (list, manifest) = load_list(dir, shown)?;
    let kept = KeptDirTimes::read(dir, shown)?;
    let mut work = Work {
        dir,
        shown,
        temps: Vec::new(),
        placed: Vec::new(),
    };
    let result = work.run(&list, &manifest, source);
    match result {
        Ok(mut done) => {
            // The inputs go last, once every file is in place.
            let removed = work.remove_inputs();
            kept.put_back();
            removed?;
            done.distinct_chunks = list.distinct().len();
            tracing::info!(
                dir = %shown.display(),
                files = done.files,
                bytes = done.bytes,
                chunks = done.chunks,
                distinct_chunks = done.distinct_chunks,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "chunked checkpoint files assembled"
            );
            Ok(done)
        }
        Err(e) => {
            work.undo();
            kept.put_back();
            Err(e)
        }
    }
}

/// The checkpoint directory's times as assembly found it, put back once assembly is done (or
/// undone): creating, renaming and removing entries in it is gpusnap's business, not a change
/// of the checkpoint. These times, not one in the chunk list, are the ones to keep: the image
/// already carries the directory's time in its own tar entry, and each door has applied it (or
/// not) before assembly runs — extract (oci-image's `extract`, `gpusnap image pull --extract`)
/// restores the recorded directory times and then assembles; the restore transaction gets the
/// directory a runtime unpacked (containerd's applier, CRI-O's or Podman's import), with the
/// times that runtime kept, and must not make them differ from a classic image's. A second
/// copy in the list could only disagree with the first.
pub(super) struct KeptDirTimes<'a> {
    dir: BorrowedFd<'a>,
    shown: &'a Path,
    times: rfs::Timestamps,
}

impl<'a> KeptDirTimes<'a> {
    pub(super) fn read(dir: BorrowedFd<'a>, shown: &'a Path) -> Result<Self, ChunkError> {
        let st = rfs::fstat(dir).map_err(|e| ChunkError::Io {
            path: shown.to_path_buf(),
            source: e.into(),
        })?;
        Ok(KeptDirTimes {
            dir,
            shown,
            times: rfs::Timestamps {
                last_access: rfs::Timespec {
                    tv_sec: st.st_atime as _,
                    tv_nsec: st.st_atime_nsec as _,
                },
                last_modification: rfs::Timespec {
                    tv_sec: st.st_mtime as _,
                    tv_nsec: st.st_mtime_nsec as _,
                },
            },
        })
    }

    pub(super) fn put_back(&self) {
        if let Err(e) = rfs::futimens(self.dir, &self.times) {
            // The assembled files are complete and verified, and the chunks may be gone: a
            // time not put back is no reason to lose the checkpoint.
            tracing::warn!(
                dir = %self.shown.display(),
                error = %e,
                "could not put back the checkpoint directory's times after assembly"
            );
        }
    }
}

/// The chunk list of the opened checkpoint directory `dir` (shown as `shown`), read capped and
/// checked against itself and the sealed manifest, with that manifest; refused when the
/// assembled files would not fit. Every assembly starts here, whether its chunks are read from a
/// directory or arrive in a download ([`super::stream`]).
pub(super) fn load_list(
    dir: BorrowedFd<'_>,
    shown: &Path,
) -> Result<(ChunkList, crate::Manifest), ChunkError> {
    let list_path = shown.join(CHUNK_LIST_FILE);
    let invalid = |reason: String| ChunkError::ListInvalid {
        list: list_path.clone(),
        reason,
    };
    let bytes = beneath::read_capped(dir, Path::new(CHUNK_LIST_FILE), MAX_CHUNK_LIST_BYTES)
        .map_err(|e| match beneath::too_large(&e) {
            Some(_) => invalid(format!("larger than {MAX_CHUNK_LIST_BYTES} bytes")),
            None if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                invalid("it is a symlink".into())
            }
            None => ChunkError::Io {
                path: list_path.clone(),
                source: e,
            },
        })?;
    let list = ChunkList::parse(&bytes).map_err(|e| invalid(e.to_string()))?;
    let manifest =
        crate::validate::read_manifest_at(dir, shown).map_err(|e| ChunkError::Manifest {
            dir: shown.to_path_buf(),
            reason: e.to_string(),
        })?;
    list.check_against(&manifest)
        .map_err(|e| invalid(e.to_string()))?;

    let needed: u64 = list.files.iter().map(|f| f.size).sum();
    let free = beneath::available_bytes(dir).map_err(|source| ChunkError::Io {
        path: shown.to_path_buf(),
        source,
    })?;
    if needed > free {
        return Err(ChunkError::NoSpace {
            dir: shown.to_path_buf(),
            needed,
            free,
        });
    }
    Ok((list, manifest))
}

/// What [`assemble_at`] created, so a failure removes exactly that.
pub(super) struct Work<'a> {
    pub(super) dir: BorrowedFd<'a>,
    pub(super) shown: &'a Path,
    pub(super) temps: Vec<OsString>,
    pub(super) placed: Vec<OsString>,
}

/// Upper bound on assembling threads (memory bandwidth, not cores, limits beyond it).
const MAX_THREADS: usize = 16;

impl Work<'_> {
    pub(super) fn undo(&mut self) {
        for n in self.temps.drain(..).chain(self.placed.drain(..)) {
            let _ = rfs::unlinkat(self.dir, &n, AtFlags::empty());
        }
    }

    fn io(&self, name: &OsStr) -> impl Fn(io::Error) -> ChunkError + '_ {
        let path = self.shown.join(name);
        move |source| ChunkError::Io {
            path: path.clone(),
            source,
        }
    }

    fn run(
        &mut self,
        list: &ChunkList,
        manifest: &crate::Manifest,
        source: &dyn ChunkSource,
    ) -> Result<Assembled, ChunkError> {
        let outputs = self.prepare(list)?;
        let jobs: Vec<(usize, u64, ChunkRef)> = list
            .files
            .iter()
            .enumerate()
            .flat_map(|(fi, f)| {
                let mut off = 0u64;
                f.chunks.iter().map(move |c| {
                    let at = off;
                    off += c.1;
                    (fi, at, *c)
                })
            })
            .collect();
        self.copy_chunks(list, &jobs, &outputs, source)?;
        self.verify(list, manifest, &outputs)?;
        self.place(list, &outputs)
    }

    /// One hidden temporary file per listed file (sparse, its full size), after checking that
    /// none of the files is there already.
    pub(super) fn prepare(&mut self, list: &ChunkList) -> Result<Vec<File>, ChunkError> {
        // A file the image also carries whole: which one would be restored is ambiguous.
        for f in &list.files {
            let st = beneath::stat_at(self.dir, OsStr::new(&f.path))
                .map_err(self.io(OsStr::new(&f.path)))?;
            if st.is_some() {
                return Err(ChunkError::AlsoWhole {
                    file: self.shown.join(&f.path),
                });
            }
        }
        let mut outputs = Vec::with_capacity(list.files.len());
        for f in &list.files {
            let tmp = OsString::from(format!(".gpusnap-assemble.{}", f.path));
            // A leftover of that name goes first (unlinkat removes a symlink, not its target).
            match rfs::unlinkat(self.dir, &tmp, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(self.io(&tmp)(e.into())),
            }
            // Read and write: the assembled file is hashed back before it is renamed.
            let file = beneath::openat2(
                self.dir,
                Path::new(&tmp),
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o600),
            )
            .map(File::from)
            .map_err(self.io(&tmp))?;
            self.temps.push(tmp.clone());
            // Sparse: zero chunks are left as holes.
            file.set_len(f.size).map_err(self.io(&tmp))?;
            outputs.push(file);
        }
        Ok(outputs)
    }

    /// Every file in `outputs` against the sealed manifest: order, placement and every byte.
    fn verify(
        &self,
        list: &ChunkList,
        manifest: &crate::Manifest,
        outputs: &[File],
    ) -> Result<(), ChunkError> {
        let specs: Vec<(PathBuf, u64)> = list
            .files
            .iter()
            .map(|f| (self.shown.join(&f.path), f.size))
            .collect();
        let expected: Vec<&[String]> = list
            .files
            .iter()
            .map(|f| {
                manifest
                    .images
                    .get(&f.path)
                    .map_or(&[][..], |r| r.blake3_chunks.as_slice())
            })
            .collect();
        let piece = manifest.images.chunk_bytes;
        crate::inventory::hash_open_files(&specs, outputs, piece, Some(&expected))
            .map(drop)
            .map_err(|e| verify_failure(e, &specs, piece))
    }

    /// The verified `outputs` renamed to their names (which must not exist yet).
    pub(super) fn place(
        &mut self,
        list: &ChunkList,
        outputs: &[File],
    ) -> Result<Assembled, ChunkError> {
        for (f, out) in list.files.iter().zip(outputs) {
            rfs::fchmod(out, Mode::from_raw_mode(0o600))
                .map_err(|e| self.io(OsStr::new(&f.path))(e.into()))?;
            // The time the image carries for the file, set after its last write, through the
            // descriptor (the name is a temporary one beneath the directory until the rename,
            // which keeps it). The access time is left alone, as extract leaves it.
            if let Some(mtime) = f.mtime {
                let times = rfs::Timestamps {
                    last_access: rfs::Timespec {
                        tv_sec: 0,
                        tv_nsec: rfs::UTIME_OMIT,
                    },
                    last_modification: rfs::Timespec {
                        // Checked against MAX_MTIME when the list was parsed.
                        tv_sec: mtime as _,
                        tv_nsec: 0,
                    },
                };
                rfs::futimens(out, &times).map_err(|e| self.io(OsStr::new(&f.path))(e.into()))?;
            }
        }
        for f in &list.files {
            let tmp = self.temps.remove(0);
            let name = OsString::from(&f.path);
            // No-replace: something that appeared there meanwhile is not overwritten.
            rfs::renameat_with(self.dir, &tmp, self.dir, &name, rfs::RenameFlags::NOREPLACE)
                .map_err(|e| {
                    let _ = rfs::unlinkat(self.dir, &tmp, AtFlags::empty());
                    if e == rustix::io::Errno::EXIST {
                        ChunkError::AlsoWhole {
                            file: self.shown.join(&f.path),
                        }
                    } else {
                        self.io(&name)(e.into())
                    }
                })?;
            self.placed.push(name);
        }
        Ok(Assembled {
            files: list.files.len(),
            bytes: list.files.iter().map(|f| f.size).sum(),
            chunks: list.files.iter().map(|f| f.chunks.len()).sum(),
            distinct_chunks: 0,
        })
    }

    /// The chunk list and any chunk directory, once every file is in place; on failure the
    /// placed files go too.
    pub(super) fn remove_inputs(&mut self) -> Result<(), ChunkError> {
        let dir = self.dir;
        let removed = beneath::remove_all_at(dir, OsStr::new(CHUNK_DIR)).and_then(|()| {
            match rfs::unlinkat(dir, CHUNK_LIST_FILE, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                Err(e) => Err(e.into()),
            }
        });
        removed.map_err(|source| {
            self.undo();
            ChunkError::Io {
                path: self.shown.join(CHUNK_DIR),
                source,
            }
        })
    }

    /// Every chunk read from `source`, checked and written at its offset, on all cores.
    fn copy_chunks(
        &self,
        list: &ChunkList,
        jobs: &[(usize, u64, ChunkRef)],
        outputs: &[File],
        source: &dyn ChunkSource,
    ) -> Result<(), ChunkError> {
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_THREADS)
            .min(jobs.len())
            .max(1);
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let first_error: Mutex<Option<ChunkError>> = Mutex::new(None);
        // digest → all zeros: a digest checked once is not hashed again, and a zero chunk is
        // not written (the file is sparse).
        let checked: Mutex<HashMap<ChunkDigest, bool>> = Mutex::new(HashMap::new());
        let source_name = source.name();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut buf = Vec::with_capacity(MAX_CHUNK_BYTES as usize + 1);
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(fi, at, ChunkRef(digest, len))) = jobs.get(i) else {
                            break;
                        };
                        let file = &list.files[fi].path;
                        let r = copy_one(
                            source,
                            &source_name,
                            &checked,
                            &mut buf,
                            (digest, len, file),
                            |bytes| outputs[fi].write_all_at(bytes, at),
                        );
                        if let Err(e) = r {
                            stop.store(true, Ordering::Relaxed);
                            let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                            slot.get_or_insert(e);
                        }
                    }
                });
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A failure of [`crate::inventory`]'s hashing of `files` (path, size) in `piece`-byte pieces
/// as a chunk error.
pub(super) fn verify_failure(
    e: crate::inventory::VerifyFailure,
    files: &[(PathBuf, u64)],
    piece: u64,
) -> ChunkError {
    match e {
        crate::inventory::VerifyFailure::Digest { file, chunk } => {
            let offset = chunk as u64 * piece;
            ChunkError::Mismatch {
                file: files[file].0.clone(),
                offset,
                end: (offset + piece).min(files[file].1),
            }
        }
        crate::inventory::VerifyFailure::ShortRead { path } => ChunkError::Io {
            path,
            source: io::Error::new(io::ErrorKind::UnexpectedEof, "short read"),
        },
        crate::inventory::VerifyFailure::Io { path, source } => ChunkError::Io { path, source },
    }
}

fn copy_one(
    source: &dyn ChunkSource,
    source_name: &str,
    checked: &Mutex<HashMap<ChunkDigest, bool>>,
    buf: &mut Vec<u8>,
    (digest, len, file): (ChunkDigest, u64, &str),
    write: impl FnOnce(&[u8]) -> io::Result<()>,
) -> Result<(), ChunkError> {
    let damaged = |problem: String| ChunkError::ChunkDamaged {
        digest,
        file: file.to_owned(),
        source_name: source_name.to_owned(),
        problem,
    };
    let known = checked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&digest)
        .copied();
    if known == Some(true) {
        return Ok(()); // zeros: the hole is already there
    }
    let mut r = source.open(&digest, len).map_err(|e| match e {
        OpenError::Missing => ChunkError::ChunkMissing {
            digest,
            file: file.to_owned(),
            source_name: source_name.to_owned(),
        },
        OpenError::NotPlain(what) => ChunkError::ChunkNotPlain {
            digest,
            source_name: source_name.to_owned(),
            what,
        },
        OpenError::Length(n) => damaged(format!("is {n} bytes, the list says {len}")),
        OpenError::Io(e) => damaged(format!("cannot be read ({e})")),
    })?;
    buf.clear();
    // One byte more than listed tells a longer chunk apart.
    (&mut r)
        .take(len + 1)
        .read_to_end(buf)
        .map_err(|e| damaged(format!("cannot be read ({e})")))?;
    if buf.len() as u64 != len {
        return Err(damaged(format!(
            "yields {}{} bytes, the list says {len}",
            buf.len(),
            if buf.len() as u64 > len { "+" } else { "" }
        )));
    }
    let zeros = match known {
        Some(z) => z,
        None => {
            let actual = ChunkDigest::of(buf);
            if actual != digest {
                return Err(damaged(format!("hashes to {actual}")));
            }
            let z = buf.iter().all(|b| *b == 0);
            checked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(digest, z);
            z
        }
    };
    if !zeros {
        write(buf).map_err(|e| ChunkError::Io {
            path: PathBuf::from(file),
            source: e,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{noise, split, ChunkParams, ChunkedFile};
    use super::*;
    use crate::manifest::{seal_checkpoint, Manifest};
    use gpusnap_criu_bridge::CriuFlags;
    use std::fs;

    const P: ChunkParams = ChunkParams {
        min: 1024,
        avg: 4096,
        max: 16384,
    };

    /// The checkpoint's files' modification times (whole seconds, as images carry them).
    const FILE_MTIMES: [(&str, u64); 2] = [
        ("pages-1.img", 1_700_000_001),
        ("gpusnap-gpu-device-0000.bin", 1_700_000_002),
    ];
    /// The checkpoint directory's times, with nanoseconds (a runtime's copy may have them).
    const DIR_ATIME: (i64, i64) = (1_600_000_000, 111_111_111);
    const DIR_MTIME: (i64, i64) = (1_650_000_000, 123_456_789);

    fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) {
        let f = File::open(path).unwrap();
        let ts = |(tv_sec, tv_nsec)| rfs::Timespec { tv_sec, tv_nsec };
        let times = rfs::Timestamps {
            last_access: ts(atime),
            last_modification: ts(mtime),
        };
        rfs::futimens(&f, &times).unwrap();
    }

    /// (atime, mtime) with nanoseconds.
    fn times_of(path: &Path) -> ((i64, i64), (i64, i64)) {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).unwrap();
        ((m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec()))
    }

    /// A sealed checkpoint whose page image and GPU file are then turned into chunks; the
    /// files' times are [`FILE_MTIMES`] and the directory's [`DIR_ATIME`] and [`DIR_MTIME`].
    fn chunked() -> (tempfile::TempDir, ChunkList) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        fs::write(p.join("inventory.img"), b"inventory").unwrap();
        let mut pages = noise(100_000, 3);
        pages.extend(vec![0u8; 80_000]);
        pages.extend(noise(30_000, 4));
        fs::write(p.join("pages-1.img"), &pages).unwrap();
        fs::write(p.join("gpusnap-gpu-device-0000.bin"), noise(50_000, 3)).unwrap();
        seal_checkpoint(p, Manifest::new("ctr1", CriuFlags::default())).unwrap();
        fs::create_dir(p.join(CHUNK_DIR)).unwrap();
        let mut files = Vec::new();
        for (name, mtime) in FILE_MTIMES {
            set_times(&p.join(name), (mtime as i64, 0), (mtime as i64, 0));
            let bytes = fs::read(p.join(name)).unwrap();
            let mut chunks = Vec::new();
            split(&mut bytes.as_slice(), P, &mut |c| {
                let d = ChunkDigest::of(c);
                fs::write(p.join(CHUNK_DIR).join(d.hex()), c)?;
                chunks.push(ChunkRef(d, c.len() as u64));
                Ok(())
            })
            .unwrap();
            fs::remove_file(p.join(name)).unwrap();
            files.push(ChunkedFile {
                path: name.into(),
                size: bytes.len() as u64,
                mtime: Some(mtime),
                chunks,
            });
        }
        let list = ChunkList::new(files);
        fs::write(p.join(CHUNK_LIST_FILE), list.to_bytes()).unwrap();
        set_times(p, DIR_ATIME, DIR_MTIME);
        (dir, list)
    }

    fn write_list(dir: &Path, list: &ChunkList) {
        fs::write(dir.join(CHUNK_LIST_FILE), list.to_bytes()).unwrap();
    }

    /// Nothing assembled is left: no temporary and no chunked file, inputs untouched.
    fn nothing_left(dir: &Path) {
        for e in fs::read_dir(dir).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(
                !n.starts_with(".gpusnap-assemble") && n != "pages-1.img",
                "{n} left behind"
            );
        }
        assert!(dir.join(CHUNK_LIST_FILE).is_file());
    }

    #[test]
    fn assembles_what_validates_and_removes_the_chunks() {
        let (dir, list) = chunked();
        let zero = list.files[1]
            .chunks
            .iter()
            .filter(|c| c.0 == ChunkDigest::of(&vec![0u8; c.1 as usize]));
        assert!(zero.count() >= 2, "the zero region repeats one chunk");
        assert!(is_chunked(dir.path()).unwrap());
        let done = assemble(dir.path()).unwrap().unwrap();
        assert_eq!(done.files, 2);
        assert!(done.distinct_chunks < done.chunks);
        assert!(!dir.path().join(CHUNK_DIR).exists());
        assert!(!dir.path().join(CHUNK_LIST_FILE).exists());
        crate::validate_for_restore(dir.path()).unwrap();
        // Not chunked any more: nothing to do.
        assert!(!is_chunked(dir.path()).unwrap());
        assert_eq!(assemble(dir.path()).unwrap(), None);
    }

    #[test]
    fn assembled_files_and_the_directory_keep_their_times() {
        let (dir, _) = chunked();
        assemble(dir.path()).unwrap().unwrap();
        for (name, mtime) in FILE_MTIMES {
            assert_eq!(
                times_of(&dir.path().join(name)).1,
                (mtime as i64, 0),
                "{name}: the modification time the chunk list carries"
            );
        }
        assert_eq!(
            times_of(dir.path()),
            (DIR_ATIME, DIR_MTIME),
            "the directory's times as assembly found them"
        );
    }

    #[test]
    fn format_1_lists_assemble_with_the_time_of_assembly() {
        let (dir, mut list) = chunked();
        list.format_version = 1;
        for f in &mut list.files {
            f.mtime = None;
        }
        write_list(dir.path(), &list);
        set_times(dir.path(), DIR_ATIME, DIR_MTIME);
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assemble(dir.path()).unwrap().unwrap();
        for (name, _) in FILE_MTIMES {
            assert!(times_of(&dir.path().join(name)).1 .0 >= before, "{name}");
        }
        assert_eq!(times_of(dir.path()), (DIR_ATIME, DIR_MTIME));
        crate::validate_for_restore(dir.path()).unwrap();
    }

    #[test]
    fn hostile_chunk_lists_and_chunk_files_are_refused_with_nothing_left() {
        type Tamper = fn(&Path, &mut ChunkList);
        let cases: &[(&str, Tamper, &str)] = &[
            (
                "wrong order",
                |_, l| l.files[1].chunks.swap(0, 1),
                "differs from the sealed gpusnap manifest",
            ),
            (
                "a chunk of another file (hashes right, belongs elsewhere)",
                |_, l| {
                    let other = l.files[0].chunks[0];
                    let c = &mut l.files[1].chunks;
                    let n = c.len();
                    // Same total length: replace the tail with the other file's chunk, padded.
                    let tail: u64 = c[n - 1].1;
                    if other.1 == tail {
                        c[n - 1] = other;
                    } else {
                        c[n - 1] = other;
                        l.files[1].size = l.files[1].size - tail + other.1;
                    }
                },
                "",
            ),
            (
                "missing chunk",
                |d, l| {
                    fs::remove_file(d.join(CHUNK_DIR).join(l.files[1].chunks[0].0.hex())).unwrap()
                },
                "is missing",
            ),
            (
                "symlinked chunk",
                |d, l| {
                    let p = d.join(CHUNK_DIR).join(l.files[1].chunks[0].0.hex());
                    fs::rename(&p, d.join("elsewhere")).unwrap();
                    std::os::unix::fs::symlink(d.join("elsewhere"), &p).unwrap();
                },
                "a symlink",
            ),
            (
                "hard-linked chunk",
                |d, l| {
                    let p = d.join(CHUNK_DIR).join(l.files[1].chunks[0].0.hex());
                    fs::hard_link(&p, d.join("second-name")).unwrap();
                },
                "hard link",
            ),
            (
                "chunk with other bytes",
                |d, l| {
                    let p = d.join(CHUNK_DIR).join(l.files[1].chunks[0].0.hex());
                    let mut b = fs::read(&p).unwrap();
                    b[0] ^= 1;
                    fs::write(&p, b).unwrap();
                },
                "hashes to",
            ),
            (
                "size not the manifest's",
                |_, l| {
                    let c = l.files[1].chunks.pop().unwrap();
                    l.files[1].size -= c.1;
                },
                "in the gpusnap manifest",
            ),
            (
                "file not chunkable",
                |_, l| l.files[0].path = "inventory.img".into(),
                "not a CRIU page image",
            ),
            (
                "also present whole",
                |d, _| fs::write(d.join("pages-1.img"), b"whole").unwrap(),
                "also present whole",
            ),
        ];
        for (what, tamper, want) in cases {
            let (dir, mut list) = chunked();
            tamper(dir.path(), &mut list);
            write_list(dir.path(), &list);
            set_times(dir.path(), DIR_ATIME, DIR_MTIME);
            let err = assemble(dir.path()).expect_err(what).to_string();
            assert!(err.contains(want), "{what}: {err}");
            assert_eq!(
                times_of(dir.path()),
                (DIR_ATIME, DIR_MTIME),
                "{what}: the directory's times after a refusal"
            );
            if *what != "also present whole" {
                nothing_left(dir.path());
            }
            assert!(crate::validate_for_restore(dir.path()).is_err(), "{what}");
        }
        // Chunks without a list.
        let (dir, _) = chunked();
        fs::remove_file(dir.path().join(CHUNK_LIST_FILE)).unwrap();
        let err = assemble(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no chunk list"), "{err}");
    }
}
