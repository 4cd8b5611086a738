use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use gpusnap_checkpoint::beneath;
use rustix::fs::{AtFlags, Mode, OFlags};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::error::StoreError;
use crate::id::BlobId;
use crate::lock;
use crate::refs::{RefRecord, MAX_REF_BYTES};

const BLOBS: &str = "blobs";
const TMP: &str = "tmp";
const LOCKS: &str = "locks";
const REFS: &str = "refs";
const GC_LOCK: &str = "gc.lock";

/// References (with their file names) and the file names of unreadable ones.
type RefFiles = (Vec<(String, RefRecord)>, Vec<String>);

/// The node's blob store (see the crate docs). Cheap to share between threads: every operation
/// goes through the directory descriptors opened once here.
pub struct Store {
    root: PathBuf,
    dir: OwnedFd,
    blobs: OwnedFd,
    tmp: OwnedFd,
    locks: OwnedFd,
    refs: OwnedFd,
}

/// Held by a pull (or push) for as long as it uses the store: a shared lock on `gc.lock`, so
/// collection (which takes it exclusively) never runs meanwhile.
pub struct Lease {
    _file: File,
}

/// What [`Store::begin`] found.
pub enum Slot {
    /// The blob is in the store: its file (read-only) and size.
    Present(File, u64),
    /// It is not: write it through this writer (which holds the blob's lock).
    Absent(BlobWriter),
}

/// One blob being written. Bytes past the declared size are refused as they come; the blob
/// becomes visible only through [`BlobWriter::commit`], once its size and sha256 match. Dropped
/// without a commit, its temporary file is removed.
pub struct BlobWriter {
    id: BlobId,
    size: u64,
    written: u64,
    hasher: Sha256,
    file: Option<File>,
    tmp_name: String,
    tmp: OwnedFd,
    blobs: OwnedFd,
    _lock: File,
}

/// What [`Store::copy_to`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyOut {
    /// The blob's bytes, this many, are in the destination, hashed as they got there.
    Copied(u64),
    /// The store does not hold it.
    Missing,
    /// What was copied is not the blob (it hashes to `actual`): the stored blob was damaged,
    /// and has been dropped from the store.
    Corrupt { actual: BlobId },
}

/// What [`Store::verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Its bytes, this many, are the blob.
    Sound(u64),
    /// They are not (they hash to `actual`): the blob was dropped.
    Dropped { actual: BlobId },
    /// Not in the store (removed meanwhile).
    Missing,
}

/// A damaged blob [`Store::verify_all`] dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dropped {
    pub id: BlobId,
    /// What its bytes hashed to.
    pub actual: BlobId,
}

/// What [`Store::verify_all`] found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub sound_blobs: usize,
    pub sound_bytes: u64,
    pub dropped: Vec<Dropped>,
}

/// One blob, for `gpusnap store ls`.
#[derive(Debug, Clone, Serialize)]
pub struct BlobInfo {
    pub id: BlobId,
    pub size: u64,
    /// When a pull last wrote or used it (collection removes the least recently used first).
    #[serde(with = "unix_seconds")]
    pub last_used: SystemTime,
    /// Live references naming it.
    pub references: usize,
}

/// What the store holds, for `gpusnap store du`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub blobs: usize,
    pub bytes: u64,
    pub referenced_blobs: usize,
    pub referenced_bytes: u64,
    pub references: usize,
    /// References whose holder is gone (collection removes them).
    pub stale_references: usize,
    /// Leftovers of interrupted writes (collection removes them).
    pub temporary_files: usize,
    pub temporary_bytes: u64,
}

/// What [`Store::gc`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub removed_blobs: usize,
    pub freed_bytes: u64,
    pub removed_temporary_files: usize,
    pub removed_references: usize,
    /// What is left, and of it what live references keep.
    pub kept_blobs: usize,
    pub kept_bytes: u64,
    pub referenced_bytes: u64,
    pub max_bytes: u64,
}

mod unix_seconds {
    use std::time::{SystemTime, UNIX_EPOCH};
    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
    }
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn mkdir_beneath(dir: &OwnedFd, sub: &str) -> io::Result<OwnedFd> {
    match rustix::fs::mkdirat(dir, sub, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    beneath::open_dir(dir.as_fd(), Path::new(sub))
}

fn list(dir: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(n.to_vec());
        }
    }
    Ok(out)
}

impl Store {
    /// Opens the store at `root`, creating it (mode 0700) when missing. Refused when `root` is
    /// a symlink, not a directory, or not owned by this user.
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        let io = |op| StoreError::io(op, root);
        beneath::create_private_dir(root).map_err(io("creating"))?;
        let dir = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io("opening")(e.into()))?;
        // Checked on the descriptor itself: what is open is what was checked.
        let st = rustix::fs::fstat(&dir).map_err(|e| io("stat")(e.into()))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if st.st_uid != euid {
            return Err(StoreError::NotPrivate {
                path: root.to_path_buf(),
                reason: format!("owned by uid {}, not {euid}", st.st_uid),
            });
        }
        if st.st_mode & 0o077 != 0 {
            return Err(StoreError::NotPrivate {
                path: root.to_path_buf(),
                reason: format!("mode {:o}", st.st_mode & 0o7777),
            });
        }
        let sub =
            |s: &str| mkdir_beneath(&dir, s).map_err(StoreError::io("creating", root.join(s)));
        Ok(Store {
            blobs: sub(BLOBS)?,
            tmp: sub(TMP)?,
            locks: sub(LOCKS)?,
            refs: sub(REFS)?,
            root: root.to_path_buf(),
            dir,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Bytes a writer may still put on the file system holding the store.
    pub fn available_bytes(&self) -> Result<u64, StoreError> {
        beneath::available_bytes(self.dir.as_fd()).map_err(StoreError::io("statvfs", &self.root))
    }

    fn gc_lock_file(&self) -> Result<File, StoreError> {
        let path = self.root.join(GC_LOCK);
        let fd = beneath::openat2(
            self.dir.as_fd(),
            Path::new(GC_LOCK),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map_err(StoreError::io("opening", &path))?;
        Ok(File::from(fd))
    }

    /// Takes a lease for a pull or push: collection waits until it is dropped.
    pub fn lease(&self) -> Result<Lease, StoreError> {
        let file = self.gc_lock_file()?;
        lock::lock(&file, false).map_err(StoreError::io("locking", self.root.join(GC_LOCK)))?;
        Ok(Lease { _file: file })
    }

    fn blob_path(&self, id: &BlobId) -> PathBuf {
        self.root.join(BLOBS).join(id.hex())
    }

    /// The blob's size, when it is in the store.
    pub fn len(&self, id: &BlobId) -> Result<Option<u64>, StoreError> {
        match beneath::stat_at(self.blobs.as_fd(), name(id.hex())) {
            Ok(Some(st)) if (st.st_mode & libc::S_IFMT) == libc::S_IFREG => {
                Ok(Some(st.st_size as u64))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(StoreError::io("stat", self.blob_path(id))(e)),
        }
    }

    pub fn has(&self, id: &BlobId) -> Result<bool, StoreError> {
        Ok(self.len(id)?.is_some())
    }

    /// Opens the blob for reading, and marks it used now (collection removes the least recently
    /// used first).
    pub fn open_blob(&self, id: &BlobId) -> Result<Option<File>, StoreError> {
        let path = self.blob_path(id);
        match beneath::open_file(self.blobs.as_fd(), Path::new(id.hex())) {
            Ok(f) => {
                // Best effort: a failed touch only makes the blob look older.
                let _ = f.set_modified(SystemTime::now());
                Ok(Some(f))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("opening", path)(e)),
        }
    }

    /// Opens the blob for reading without marking it used.
    fn open_blob_untouched(&self, id: &BlobId) -> Result<Option<File>, StoreError> {
        match beneath::open_file(self.blobs.as_fd(), Path::new(id.hex())) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("opening", self.blob_path(id))(e)),
        }
    }

    /// The blob if it is here, else a writer for it. A concurrent writer of the same blob makes
    /// this wait until it has committed (then the blob is [`Slot::Present`]) or given up (then
    /// this one writes it).
    pub fn begin(&self, _lease: &Lease, id: &BlobId, size: u64) -> Result<Slot, StoreError> {
        if let Some(f) = self.open_blob(id)? {
            let len = f
                .metadata()
                .map_err(StoreError::io("stat", self.blob_path(id)))?
                .len();
            return Ok(Slot::Present(f, len));
        }
        let lock_path = self.root.join(LOCKS).join(id.hex());
        let lock_file = beneath::openat2(
            self.locks.as_fd(),
            Path::new(id.hex()),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map(File::from)
        .map_err(StoreError::io("opening", &lock_path))?;
        lock::lock(&lock_file, true).map_err(StoreError::io("locking", &lock_path))?;
        if let Some(f) = self.open_blob(id)? {
            let len = f
                .metadata()
                .map_err(StoreError::io("stat", self.blob_path(id)))?
                .len();
            return Ok(Slot::Present(f, len));
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp_name = format!(
            "{}.{}.{}",
            id.hex(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let tmp_path = self.root.join(TMP).join(&tmp_name);
        let file = beneath::create_new(self.tmp.as_fd(), name(&tmp_name), 0o600)
            .map_err(StoreError::io("creating", &tmp_path))?;
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(StoreError::io("dup", &self.root));
        Ok(Slot::Absent(BlobWriter {
            id: id.clone(),
            size,
            written: 0,
            hasher: Sha256::new(),
            file: Some(file),
            tmp_name,
            tmp: dup(&self.tmp)?,
            blobs: dup(&self.blobs)?,
            _lock: lock_file,
        }))
    }

    /// Stores `reader`'s bytes as blob `id` unless it is already here; `Ok(true)` when this call
    /// wrote it. The bytes must be exactly `size` long and hash to `id`.
    pub fn put(
        &self,
        lease: &Lease,
        id: &BlobId,
        size: u64,
        mut reader: impl Read,
    ) -> Result<bool, StoreError> {
        match self.begin(lease, id, size)? {
            Slot::Present(..) => Ok(false),
            Slot::Absent(mut w) => {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = match reader.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(StoreError::io("reading", w.tmp_path_hint())(e)),
                    };
                    w.write_all(&buf[..n]).map_err(|e| w.write_error(e))?;
                }
                w.commit()?;
                Ok(true)
            }
        }
    }

    /// Copies blob `id` into `dest` (at its current offset 0, which must be empty): a reflink
    /// where the file system shares extents, else an in-kernel copy — and hashes what the copy
    /// holds (a reflink's too, read back from `dest`), so that no copy out of the store is
    /// unchecked. A copy that is not the blob it is named for means the stored blob is
    /// damaged: it is dropped ([`Store::discard`]) and [`CopyOut::Corrupt`] says so, with
    /// `dest` holding the damaged bytes (the caller truncates or removes it).
    pub fn copy_to(&self, id: &BlobId, dest: &File) -> Result<CopyOut, StoreError> {
        let Some(src) = self.open_blob(id)? else {
            return Ok(CopyOut::Missing);
        };
        let path = self.blob_path(id);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut bytes = 0u64;
        if rustix::fs::ioctl_ficlone(dest, &src).is_ok() {
            use std::os::unix::fs::FileExt;
            loop {
                let n = dest
                    .read_at(&mut buf, bytes)
                    .map_err(StoreError::io("reading the copy of", &path))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                bytes += n as u64;
            }
        } else {
            let (mut s, mut d) = (&src, dest);
            loop {
                let n = match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(StoreError::io("reading", &path)(e)),
                };
                hasher.update(&buf[..n]);
                d.write_all(&buf[..n])
                    .map_err(StoreError::io("copying", &path))?;
                bytes += n as u64;
            }
        }
        let actual = BlobId::from_hash(&hasher.finalize());
        if actual == *id {
            return Ok(CopyOut::Copied(bytes));
        }
        self.discard(id, &src, &actual)?;
        Ok(CopyOut::Corrupt { actual })
    }

    /// Hashes blob `id` as stored: [`Health::Dropped`] (and the blob removed, [`Store::discard`])
    /// when its bytes are not the blob its name says.
    pub fn verify(&self, id: &BlobId) -> Result<Health, StoreError> {
        let Some(mut file) = self.open_blob_untouched(id)? else {
            return Ok(Health::Missing);
        };
        let path = self.blob_path(id);
        let mut hasher = Sha256::new();
        let bytes = io::copy(&mut file, &mut hasher).map_err(StoreError::io("reading", &path))?;
        let actual = BlobId::from_hash(&hasher.finalize());
        if actual == *id {
            return Ok(Health::Sound(bytes));
        }
        self.discard(id, &file, &actual)?;
        Ok(Health::Dropped { actual })
    }

    /// Hashes every blob ([`Store::verify`]), on every core, and drops the damaged ones. Runs
    /// beside pulls (under a lease): a pull reading a blob this drops keeps reading the file it
    /// opened and checks its digest itself.
    pub fn verify_all(&self, _lease: &Lease) -> Result<VerifyReport, StoreError> {
        let blobs = self.blob_files()?;
        let next = AtomicU64::new(0);
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let results: Vec<Result<Vec<(BlobId, Health)>, StoreError>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads.min(blobs.len()).max(1))
                .map(|_| {
                    s.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                            let Some((id, ..)) = blobs.get(i) else {
                                return Ok(out);
                            };
                            out.push((id.clone(), self.verify(id)?));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        let mut report = VerifyReport::default();
        for r in results {
            for (id, health) in r? {
                match health {
                    Health::Sound(bytes) => {
                        report.sound_blobs += 1;
                        report.sound_bytes += bytes;
                    }
                    Health::Dropped { actual } => report.dropped.push(Dropped { id, actual }),
                    Health::Missing => {}
                }
            }
        }
        report.dropped.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(report)
    }

    /// Removes blob `id`, found damaged by a reader that opened it as `file` (its bytes hash
    /// to `actual`): atomically, under the blob's own lock (so no writer of the blob runs
    /// meanwhile), and only if the name still holds that file — a sound copy another pull
    /// wrote meanwhile stays. The next pull wanting it downloads it again. Returns whether it
    /// removed the name.
    pub fn discard(&self, id: &BlobId, file: &File, actual: &BlobId) -> Result<bool, StoreError> {
        let lock_path = self.root.join(LOCKS).join(id.hex());
        let lock_file = beneath::openat2(
            self.locks.as_fd(),
            Path::new(id.hex()),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map(File::from)
        .map_err(StoreError::io("opening", &lock_path))?;
        lock::lock(&lock_file, true).map_err(StoreError::io("locking", &lock_path))?;
        let path = self.blob_path(id);
        let held = rustix::fs::fstat(file).map_err(|e| StoreError::io("stat", &path)(e.into()))?;
        let same = matches!(
            beneath::stat_at(self.blobs.as_fd(), name(id.hex())),
            Ok(Some(st)) if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
        );
        if !same {
            return Ok(false);
        }
        rustix::fs::unlinkat(&self.blobs, id.hex(), AtFlags::empty())
            .map_err(|e| StoreError::io("removing", &path)(e.into()))?;
        rustix::fs::fsync(&self.blobs).map_err(|e| StoreError::io("syncing", &path)(e.into()))?;
        tracing::warn!(
            blob = %id,
            actual = %actual,
            store = %self.root.display(),
            "store: a blob's bytes are not the blob its name says (damaged on disk); removed, \
             to be downloaded again"
        );
        Ok(true)
    }

    /// Records (or replaces) a reference. It may name blobs the store does not hold (a push's,
    /// recorded for the repository they went to).
    pub fn record(&self, _lease: &Lease, rec: &RefRecord) -> Result<(), StoreError> {
        let file = RefRecord::file_name(&rec.name);
        let bytes = serde_json::to_vec(rec).map_err(|e| StoreError::BadRef {
            name: rec.name.clone(),
            reason: e.to_string(),
        })?;
        beneath::write_atomically(self.refs.as_fd(), name(&file), &bytes, 0o600)
            .map_err(StoreError::io("writing", self.root.join(REFS).join(&file)))
    }

    /// Removes the reference `name`; `Ok(false)` when there was none.
    pub fn remove_ref(&self, ref_name: &str) -> Result<bool, StoreError> {
        let file = RefRecord::file_name(ref_name);
        match rustix::fs::unlinkat(&self.refs, file.as_str(), AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(StoreError::io("removing", self.root.join(REFS).join(file))(
                e.into(),
            )),
        }
    }

    /// Every reference, live or not, with the file names of unreadable ones.
    fn read_refs(&self) -> Result<RefFiles, StoreError> {
        let refs_path = self.root.join(REFS);
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for n in list(&self.refs).map_err(StoreError::io("listing", &refs_path))? {
            let Ok(n) = String::from_utf8(n) else {
                continue;
            };
            let read = beneath::read_capped(self.refs.as_fd(), Path::new(&n), MAX_REF_BYTES);
            match read.map(|b| serde_json::from_slice::<RefRecord>(&b)) {
                Ok(Ok(r)) if RefRecord::file_name(&r.name) == n => good.push((n, r)),
                _ => bad.push(n),
            }
        }
        Ok((good, bad))
    }

    /// Every readable reference.
    pub fn refs(&self) -> Result<Vec<RefRecord>, StoreError> {
        Ok(self.read_refs()?.0.into_iter().map(|(_, r)| r).collect())
    }

    /// Repositories (`host[:port]/repo`) on `registry` that a live reference says hold blob
    /// `id`: candidates for a cross-repository mount.
    pub fn sources_of(&self, id: &BlobId, registry: &str) -> Result<Vec<String>, StoreError> {
        let mut out = BTreeSet::new();
        for r in self.refs()? {
            if let Some(src) = &r.source {
                let on_registry = src
                    .strip_prefix(registry)
                    .is_some_and(|rest| rest.starts_with('/'));
                if on_registry && r.live() && r.blobs.contains(id) {
                    out.insert(src.clone());
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    fn blob_files(&self) -> Result<Vec<(BlobId, u64, SystemTime)>, StoreError> {
        let path = self.root.join(BLOBS);
        let mut out = Vec::new();
        for n in list(&self.blobs).map_err(StoreError::io("listing", &path))? {
            let Some(id) = BlobId::from_file_name(&n) else {
                continue;
            };
            if let Ok(Some(st)) = beneath::stat_at(self.blobs.as_fd(), name(id.hex())) {
                if (st.st_mode & libc::S_IFMT) != libc::S_IFREG {
                    continue;
                }
                let t = SystemTime::UNIX_EPOCH
                    + std::time::Duration::new(st.st_mtime as u64, st.st_mtime_nsec as u32);
                out.push((id, st.st_size as u64, t));
            }
        }
        Ok(out)
    }

    /// Every blob, with its size, last use and how many live references name it.
    pub fn blobs(&self) -> Result<Vec<BlobInfo>, StoreError> {
        let mut counts: BTreeMap<BlobId, usize> = BTreeMap::new();
        for r in self.refs()?.iter().filter(|r| r.live()) {
            for b in r.blobs.iter().collect::<BTreeSet<_>>() {
                *counts.entry(b.clone()).or_default() += 1;
            }
        }
        let mut out: Vec<BlobInfo> = self
            .blob_files()?
            .into_iter()
            .map(|(id, size, last_used)| BlobInfo {
                references: counts.get(&id).copied().unwrap_or(0),
                id,
                size,
                last_used,
            })
            .collect();
        out.sort_by(|a, b| b.last_used.cmp(&a.last_used).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    pub fn usage(&self) -> Result<Usage, StoreError> {
        let refs = self.refs()?;
        let mut u = Usage {
            references: refs.iter().filter(|r| r.live()).count(),
            stale_references: refs.iter().filter(|r| !r.live()).count(),
            ..Usage::default()
        };
        for b in self.blobs()? {
            u.blobs += 1;
            u.bytes += b.size;
            if b.references > 0 {
                u.referenced_blobs += 1;
                u.referenced_bytes += b.size;
            }
        }
        let tmp_path = self.root.join(TMP);
        for n in list(&self.tmp).map_err(StoreError::io("listing", &tmp_path))? {
            u.temporary_files += 1;
            if let Ok(Some(st)) = beneath::stat_at(self.tmp.as_fd(), OsStr::from_bytes(&n)) {
                u.temporary_bytes += st.st_size as u64;
            }
        }
        Ok(u)
    }

    /// Collects garbage: leftovers of interrupted writes, references whose holder is gone, and
    /// then unreferenced blobs, least recently used first, until the store holds at most
    /// `max_bytes`. Referenced blobs stay even above the cap. Waits for running pulls when
    /// `wait`, else returns [`StoreError::Busy`] while one holds a [`Lease`].
    pub fn gc(&self, max_bytes: u64, wait: bool) -> Result<GcReport, StoreError> {
        let lock_path = self.root.join(GC_LOCK);
        let file = self.gc_lock_file()?;
        if wait {
            lock::lock(&file, true).map_err(StoreError::io("locking", &lock_path))?;
        } else if !lock::try_lock_exclusive(&file).map_err(StoreError::io("locking", &lock_path))? {
            return Err(StoreError::Busy {
                path: self.root.clone(),
                what: "a pull or push",
            });
        }
        let mut report = GcReport {
            max_bytes,
            ..GcReport::default()
        };
        // Nobody holds a lease: every temporary file and blob lock is a leftover.
        for (dir, sub) in [(&self.tmp, TMP), (&self.locks, LOCKS)] {
            let path = self.root.join(sub);
            for n in list(dir).map_err(StoreError::io("listing", &path))? {
                let n = OsStr::from_bytes(&n);
                beneath::remove_all_at(dir.as_fd(), n)
                    .map_err(StoreError::io("removing", path.join(n)))?;
                if sub == TMP {
                    report.removed_temporary_files += 1;
                }
            }
        }
        let (refs, bad) = self.read_refs()?;
        let mut referenced = BTreeSet::new();
        let refs_path = self.root.join(REFS);
        for (file, r) in &refs {
            if r.live() {
                referenced.extend(r.blobs.iter().cloned());
                continue;
            }
            tracing::info!(reference = %r.name, "store: reference's holder is gone; removed");
            rustix::fs::unlinkat(&self.refs, file.as_str(), AtFlags::empty())
                .map_err(|e| StoreError::io("removing", refs_path.join(file))(e.into()))?;
            report.removed_references += 1;
        }
        for file in &bad {
            tracing::warn!(file = %refs_path.join(file).display(), "store: unreadable reference removed");
            let _ = rustix::fs::unlinkat(&self.refs, file.as_str(), AtFlags::empty());
            report.removed_references += 1;
        }
        let mut blobs = self.blob_files()?;
        let mut total: u64 = blobs.iter().map(|b| b.1).sum();
        // Least recently used first.
        blobs.sort_by(|a, b| a.2.cmp(&b.2).then(a.0.cmp(&b.0)));
        let blobs_path = self.root.join(BLOBS);
        for (id, size, _) in &blobs {
            if referenced.contains(id) {
                report.referenced_bytes += size;
                report.kept_blobs += 1;
                continue;
            }
            if total <= max_bytes {
                report.kept_blobs += 1;
                continue;
            }
            rustix::fs::unlinkat(&self.blobs, id.hex(), AtFlags::empty())
                .map_err(|e| StoreError::io("removing", blobs_path.join(id.hex()))(e.into()))?;
            total -= size;
            report.removed_blobs += 1;
            report.freed_bytes += size;
        }
        report.kept_bytes = total;
        tracing::info!(
            store = %self.root.display(),
            removed_blobs = report.removed_blobs,
            freed_bytes = report.freed_bytes,
            kept_bytes = report.kept_bytes,
            max_bytes,
            "store: garbage collected"
        );
        Ok(report)
    }
}

impl BlobWriter {
    pub fn id(&self) -> &BlobId {
        &self.id
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    fn tmp_path_hint(&self) -> String {
        format!("store temporary file {}", self.tmp_name)
    }

    /// A write error as a store error (a size overrun keeps its own message).
    pub fn write_error(&self, e: io::Error) -> StoreError {
        if e.kind() == io::ErrorKind::InvalidData {
            return StoreError::SizeMismatch {
                digest: self.id.to_string(),
                expected: self.size,
                actual: self.written + 1,
            };
        }
        StoreError::Io {
            op: "writing",
            path: PathBuf::from(self.tmp_path_hint()),
            source: e,
        }
    }

    /// Checks size and sha256, syncs, and makes the blob visible under its digest. Returns the
    /// stored blob, open for reading.
    pub fn commit(mut self) -> Result<File, StoreError> {
        let actual = BlobId::from_hash(&std::mem::take(&mut self.hasher).finalize());
        self.finalize(&actual)
    }

    /// For a caller that hashes the very bytes it writes here itself (a pull reads a blob
    /// through a verifying reader that tees it into the store): the bytes are hashed once, by
    /// the caller, and [`PrehashedWriter::commit`] takes its digest.
    pub fn prehashed(self) -> PrehashedWriter {
        PrehashedWriter { inner: self }
    }

    /// Appends without hashing: the size cap and the count still hold.
    fn write_unhashed(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written + buf.len() as u64 > self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "blob {} is longer than its declared {} bytes",
                    self.id, self.size
                ),
            ));
        }
        let file = self.file.as_mut().expect("not committed");
        let n = file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    /// The written bytes, whose sha256 is `actual`, become the blob if size and digest are its
    /// own: synced, then renamed under `blobs/` (a crash leaves a temporary file at most).
    fn finalize(mut self, actual: &BlobId) -> Result<File, StoreError> {
        if self.written != self.size {
            return Err(StoreError::SizeMismatch {
                digest: self.id.to_string(),
                expected: self.size,
                actual: self.written,
            });
        }
        if *actual != self.id {
            return Err(StoreError::DigestMismatch {
                expected: self.id.to_string(),
                actual: actual.to_string(),
            });
        }
        let file = self.file.take().expect("committed once");
        let hint = self.tmp_path_hint();
        let io = |op| StoreError::io(op, hint.clone());
        rustix::fs::fchmod(&file, Mode::from_raw_mode(0o400)).map_err(|e| io("chmod")(e.into()))?;
        file.sync_all().map_err(io("syncing"))?;
        drop(file);
        rustix::fs::renameat(
            &self.tmp,
            self.tmp_name.as_str(),
            &self.blobs,
            self.id.hex(),
        )
        .map_err(|e| io("renaming")(e.into()))?;
        rustix::fs::fsync(&self.blobs).map_err(|e| io("syncing")(e.into()))?;
        // Renamed: nothing left for Drop to remove.
        self.tmp_name.clear();
        beneath::open_file(self.blobs.as_fd(), Path::new(self.id.hex())).map_err(io("opening"))
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.write_unhashed(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A [`BlobWriter`] whose bytes its caller hashes ([`BlobWriter::prehashed`]). It keeps the
/// writer's guarantees but one: the digest checked at commit is the caller's, so the caller
/// must have computed it over exactly the bytes written here, in order (a reader that tees every
/// byte it returns here does).
pub struct PrehashedWriter {
    inner: BlobWriter,
}

impl PrehashedWriter {
    /// A write error as a store error (a size overrun keeps its own message).
    pub fn write_error(&self, e: io::Error) -> StoreError {
        self.inner.write_error(e)
    }

    /// [`BlobWriter::commit`], with `digest` the caller's sha256 of the bytes written: it must
    /// be the blob's own, and the size the declared one.
    pub fn commit(self, digest: &BlobId) -> Result<File, StoreError> {
        self.inner.finalize(digest)
    }
}

impl Write for PrehashedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write_unhashed(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if !self.tmp_name.is_empty() {
            let _ = rustix::fs::unlinkat(&self.tmp, self.tmp_name.as_str(), AtFlags::empty());
        }
    }
}

const _: () = {
    const fn is<T: Send + Sync>() {}
    is::<Store>();
    is::<BlobWriter>();
};

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.root).finish()
    }
}
