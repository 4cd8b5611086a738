//! Assembling chunked files while their chunks arrive (a pull's download), instead of from
//! chunk files after the fact ([`super::assemble`]).
//!
//! ```text
//! begin:  chunk list + sealed manifest checked exactly as assemble does (load_list)
//!         → one hidden temporary file per chunked file (O_EXCL, 0600, sparse, full size)
//! put:    a chunk of a pack, as it streams past: listed? its listed length? not seen before?
//!         → read into memory → handed to a worker (all cores): SHA-256 against its name
//!         → written at every offset the list uses it (zeros: left a hole)
//!         → each 64 MiB piece of a file, once its last byte is in, BLAKE3-checked against the
//!           sealed manifest
//! finish: every listed chunk arrived? every piece checked? → renamed into place (no-replace)
//!         → chunk list removed
//! ```
//! No chunk file is ever written, and the bytes are read back once, from the page cache,
//! while the download still runs. Dropped without [`StreamAssembly::finish`] (any failure, an
//! interruption), the temporary files are removed: nothing assembled is left.
//!
//! Nothing that arrives is trusted, as in [`super::assemble`]: a chunk not in the list, a
//! chunk twice, a chunk of another length or other bytes than its name says are refused as they
//! arrive, a missing chunk at the end, and a list in the wrong order (each chunk right, the file
//! wrong) by the sealed manifest's piece digests.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::assemble::{load_list, verify_failure, Work};
use super::{Assembled, ChunkDigest, ChunkError, ChunkList, CHUNK_LIST_FILE};
use crate::beneath;
use crate::inventory::{chunk_count, hash_file_range, hash_open_files};

/// Upper bound on worker threads (memory bandwidth, not cores, limits beyond it).
const MAX_THREADS: usize = 16;
/// Read buffer of a worker hashing a finished piece.
const PIECE_BUF: usize = 1 << 20;

/// A chunked checkpoint directory being assembled from chunks as they arrive. Shared by the
/// threads that feed it ([`StreamAssembly::put`] takes `&self`).
pub struct StreamAssembly {
    shared: Arc<Shared>,
    jobs: Option<SyncSender<Job>>,
    workers: Vec<JoinHandle<()>>,
    /// The temporary files, until they are renamed into place.
    temps: Vec<OsString>,
}

struct Shared {
    dir: OwnedFd,
    shown: PathBuf,
    list: ChunkList,
    outputs: Vec<File>,
    /// Shown paths and sizes of the chunked files (for errors and hashing).
    specs: Vec<(PathBuf, u64)>,
    /// Per file, the sealed manifest's BLAKE3 of each piece.
    expected: Vec<Vec<String>>,
    piece: u64,
    /// Per file, per piece: bytes not yet in place. A piece is checked when it reaches 0.
    left: Vec<Vec<AtomicU64>>,
    checked_pieces: AtomicUsize,
    chunks: HashMap<ChunkDigest, Listed>,
    source_name: String,
    failed: AtomicBool,
    error: Mutex<Option<ChunkError>>,
}

/// One distinct chunk of the list: its length, every place it goes (file, offset), and
/// whether it has arrived.
struct Listed {
    len: u64,
    uses: Vec<(usize, u64)>,
    arrived: AtomicBool,
}

struct Job {
    digest: ChunkDigest,
    bytes: Vec<u8>,
}

impl StreamAssembly {
    /// Starts assembling the chunked checkpoint directory `dir` (opened, shown as `shown`),
    /// whose chunk list and sealed manifest are already there; chunks will come from
    /// `source_name` (for messages). `Ok(None)`: no chunk list, nothing to assemble.
    pub fn begin(
        dir: OwnedFd,
        shown: &Path,
        source_name: String,
    ) -> Result<Option<StreamAssembly>, ChunkError> {
        let io_err = |source| ChunkError::Io {
            path: shown.to_path_buf(),
            source,
        };
        if beneath::stat_at(dir.as_fd(), std::ffi::OsStr::new(CHUNK_LIST_FILE))
            .map_err(io_err)?
            .is_none()
        {
            return Ok(None);
        }
        let (list, manifest) = load_list(dir.as_fd(), shown)?;
        let piece = manifest.images.chunk_bytes;
        let mut chunks: HashMap<ChunkDigest, Listed> = HashMap::new();
        for (fi, f) in list.files.iter().enumerate() {
            let mut at = 0u64;
            for c in &f.chunks {
                let listed = chunks.entry(c.0).or_insert_with(|| Listed {
                    len: c.1,
                    uses: Vec::new(),
                    arrived: AtomicBool::new(false),
                });
                // One digest, one length: a list that gives a digest two lengths cannot be
                // right (SHA-256 names the bytes, and so their length).
                if listed.len != c.1 {
                    return Err(ChunkError::ListInvalid {
                        list: shown.join(CHUNK_LIST_FILE),
                        reason: format!(
                            "chunk {} is listed as {} bytes and as {} bytes",
                            c.0, listed.len, c.1
                        ),
                    });
                }
                listed.uses.push((fi, at));
                at += c.1;
            }
        }
        let mut work = Work {
            dir: dir.as_fd(),
            shown,
            temps: Vec::new(),
            placed: Vec::new(),
        };
        let outputs = match work.prepare(&list) {
            Ok(o) => o,
            Err(e) => {
                work.undo();
                return Err(e);
            }
        };
        let temps = std::mem::take(&mut work.temps);
        let specs: Vec<(PathBuf, u64)> = list
            .files
            .iter()
            .map(|f| (shown.join(&f.path), f.size))
            .collect();
        let expected = list
            .files
            .iter()
            .map(|f| {
                manifest
                    .images
                    .get(&f.path)
                    .map_or_else(Vec::new, |r| r.blake3_chunks.clone())
            })
            .collect();
        let left = list
            .files
            .iter()
            .map(|f| {
                (0..chunk_count(f.size, piece))
                    .map(|ci| AtomicU64::new(piece_len(f.size, piece, ci)))
                    .collect()
            })
            .collect();
        let shared = Arc::new(Shared {
            shown: shown.to_path_buf(),
            dir,
            list,
            outputs,
            specs,
            expected,
            piece,
            left,
            checked_pieces: AtomicUsize::new(0),
            chunks,
            source_name,
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_THREADS);
        // Bounded: a fast download waits for the workers rather than filling memory.
        let (tx, rx) = sync_channel::<Job>(threads * 2);
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (mine, rx) = (Arc::clone(&shared), Arc::clone(&rx));
            let spawned = std::thread::Builder::new()
                .name(format!("chunk-assemble-{i}"))
                .spawn(move || worker(&mine, &rx));
            match spawned {
                Ok(h) => workers.push(h),
                // Fewer workers still assemble; none at all cannot.
                Err(e) if workers.is_empty() => {
                    let mut me = StreamAssembly {
                        shared,
                        jobs: Some(tx),
                        workers,
                        temps,
                    };
                    me.stop();
                    return Err(ChunkError::Io {
                        path: me.shared.shown.clone(),
                        source: e,
                    });
                }
                Err(_) => break,
            }
        }
        tracing::debug!(
            dir = %shown.display(),
            files = shared.list.files.len(),
            distinct_chunks = shared.chunks.len(),
            threads = workers.len(),
            "assembling chunked files as they arrive"
        );
        Ok(Some(StreamAssembly {
            shared,
            jobs: Some(tx),
            workers,
            temps,
        }))
    }

    /// Bytes of the files being assembled (what they take on disk at most).
    pub fn bytes(&self) -> u64 {
        self.shared.specs.iter().map(|f| f.1).sum()
    }

    /// The length the list gives chunk `digest`, if it lists it.
    pub fn listed_len(&self, digest: &ChunkDigest) -> Option<u64> {
        self.shared.chunks.get(digest).map(|l| l.len)
    }

    /// Takes chunk `digest`, `len` bytes read from `from` (a pack's tar entry that says it is
    /// `len` bytes), into the files. Refused: a chunk the list does not name, one that arrived
    /// before, one of another length; a chunk whose bytes are not its name is refused by the
    /// worker that checks it, reported here (on a later chunk) or by [`Self::finish`].
    pub fn put(
        &self,
        digest: ChunkDigest,
        len: u64,
        from: &mut dyn Read,
    ) -> Result<(), ChunkError> {
        let s = &self.shared;
        if s.failed.load(Ordering::Acquire) {
            return Err(s.take_error());
        }
        let Some(listed) = s.chunks.get(&digest) else {
            return Err(ChunkError::ChunkUnlisted {
                digest,
                source_name: s.source_name.clone(),
            });
        };
        let damaged = |problem: String| ChunkError::ChunkDamaged {
            digest,
            file: s.first_file(listed),
            source_name: s.source_name.clone(),
            problem,
        };
        if len != listed.len {
            return Err(damaged(format!(
                "is {len} bytes, the list says {}",
                listed.len
            )));
        }
        if listed.arrived.swap(true, Ordering::AcqRel) {
            return Err(ChunkError::ChunkTwice {
                digest,
                source_name: s.source_name.clone(),
            });
        }
        let mut bytes = Vec::with_capacity(len as usize);
        // One byte more than listed tells a longer stream apart.
        from.take(len + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| damaged(format!("cannot be read ({e})")))?;
        if bytes.len() as u64 != len {
            return Err(damaged(format!(
                "yields {}{} bytes, the list says {len}",
                bytes.len(),
                if bytes.len() as u64 > len { "+" } else { "" }
            )));
        }
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|tx| tx.send(Job { digest, bytes }).is_ok());
        if !sent || s.failed.load(Ordering::Acquire) {
            return Err(s.take_error());
        }
        Ok(())
    }

    /// After the last pack: waits for the workers; every listed chunk must have arrived and
    /// every piece of every file matched the sealed manifest; then the files are renamed into
    /// place and the chunk list removed.
    pub fn finish(mut self) -> Result<Assembled, ChunkError> {
        self.stop();
        let s = &self.shared;
        if s.failed.load(Ordering::Acquire) {
            return Err(s.take_error());
        }
        for f in &s.list.files {
            for c in &f.chunks {
                if !s.chunks[&c.0].arrived.load(Ordering::Acquire) {
                    return Err(ChunkError::ChunkMissing {
                        digest: c.0,
                        file: f.path.clone(),
                        source_name: s.source_name.clone(),
                    });
                }
            }
        }
        // Every piece with bytes was checked by the worker that completed it; what is left are
        // empty files (one piece of nothing), checked here.
        let total: usize = s.left.iter().map(Vec::len).sum();
        if s.checked_pieces.load(Ordering::Acquire) != total {
            let unchecked: Vec<usize> = (0..s.list.files.len())
                .filter(|&fi| {
                    s.specs[fi].1 == 0 || s.left[fi].iter().any(|l| l.load(Ordering::Acquire) != 0)
                })
                .collect();
            let specs: Vec<(PathBuf, u64)> =
                unchecked.iter().map(|&fi| s.specs[fi].clone()).collect();
            let files = unchecked
                .iter()
                .map(|&fi| s.outputs[fi].try_clone())
                .collect::<io::Result<Vec<File>>>()
                .map_err(|source| ChunkError::Io {
                    path: s.shown.clone(),
                    source,
                })?;
            let expected: Vec<&[String]> = unchecked
                .iter()
                .map(|&fi| s.expected[fi].as_slice())
                .collect();
            hash_open_files(&specs, &files, s.piece, Some(&expected))
                .map_err(|e| verify_failure(e, &specs, s.piece))?;
        }
        let mut work = Work {
            dir: s.dir.as_fd(),
            shown: &s.shown,
            temps: std::mem::take(&mut self.temps),
            placed: Vec::new(),
        };
        let placed = work.place(&s.list, &s.outputs).and_then(|mut done| {
            work.remove_inputs()?;
            done.distinct_chunks = s.chunks.len();
            Ok(done)
        });
        if placed.is_err() {
            work.undo();
        }
        // Times: the after-the-fact assembly sets none of its own yet; when it does, the same
        // call goes here, on `work.placed` in `dir`.
        placed
    }

    /// Closes the queue and waits for the workers.
    fn stop(&mut self) {
        self.jobs = None;
        for h in self.workers.drain(..) {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl Drop for StreamAssembly {
    fn drop(&mut self) {
        self.stop();
        if !self.temps.is_empty() {
            Work {
                dir: self.shared.dir.as_fd(),
                shown: &self.shared.shown,
                temps: std::mem::take(&mut self.temps),
                placed: Vec::new(),
            }
            .undo();
        }
    }
}

fn piece_len(size: u64, piece: u64, ci: usize) -> u64 {
    let start = ci as u64 * piece;
    piece.min(size.saturating_sub(start))
}

fn worker(s: &Shared, rx: &Mutex<Receiver<Job>>) {
    let mut buf = vec![0u8; PIECE_BUF];
    loop {
        // The lock is held only to take one job.
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        if s.failed.load(Ordering::Acquire) {
            continue; // drain: the producers see the failure on their next put
        }
        if let Err(e) = s.place_chunk(&job, &mut buf) {
            s.fail(e);
        }
    }
}

impl Shared {
    fn first_file(&self, listed: &Listed) -> String {
        listed
            .uses
            .first()
            .map_or_else(String::new, |&(fi, _)| self.list.files[fi].path.clone())
    }

    fn fail(&self, e: ChunkError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
        self.failed.store(true, Ordering::Release);
    }

    /// The first failure (once; later callers get a pointer to it).
    fn take_error(&self) -> ChunkError {
        let taken = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        taken.unwrap_or_else(|| ChunkError::Io {
            path: self.shown.clone(),
            source: io::Error::other("chunk assembly stopped after an earlier failure"),
        })
    }

    /// Checks one chunk against its name and writes it everywhere the list puts it, then
    /// checks every piece it completed.
    fn place_chunk(&self, job: &Job, buf: &mut [u8]) -> Result<(), ChunkError> {
        let listed = &self.chunks[&job.digest];
        let actual = ChunkDigest::of(&job.bytes);
        if actual != job.digest {
            return Err(ChunkError::ChunkDamaged {
                digest: job.digest,
                file: self.first_file(listed),
                source_name: self.source_name.clone(),
                problem: format!("hashes to {actual}"),
            });
        }
        // Zeros: the sparse file already holds them.
        let zeros = job.bytes.iter().all(|b| *b == 0);
        for &(fi, at) in &listed.uses {
            if !zeros {
                self.outputs[fi]
                    .write_all_at(&job.bytes, at)
                    .map_err(|source| ChunkError::Io {
                        path: self.specs[fi].0.clone(),
                        source,
                    })?;
            }
            self.account(fi, at, listed.len, buf)?;
        }
        Ok(())
    }

    /// Counts `len` bytes at `at` of file `fi` as in place; a piece whose last bytes these
    /// were is hashed (its bytes are still in the page cache) and checked.
    fn account(&self, fi: usize, at: u64, len: u64, buf: &mut [u8]) -> Result<(), ChunkError> {
        let (piece, size) = (self.piece, self.specs[fi].1);
        let end = at + len;
        let mut ci = (at / piece) as usize;
        while (ci as u64) * piece < end {
            let start = ci as u64 * piece;
            let overlap = end.min(start + piece) - at.max(start);
            let before = self.left[fi][ci].fetch_sub(overlap, Ordering::AcqRel);
            if before == overlap {
                let plen = piece_len(size, piece, ci);
                let got = hash_file_range(&self.outputs[fi], &self.specs[fi].0, start, plen, buf)
                    .map_err(|e| verify_failure(e, &self.specs, piece))?;
                if self.expected[fi].get(ci) != Some(&got) {
                    return Err(ChunkError::Mismatch {
                        file: self.specs[fi].0.clone(),
                        offset: start,
                        end: start + plen,
                    });
                }
                self.checked_pieces.fetch_add(1, Ordering::AcqRel);
            }
            ci += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{noise, split, ChunkParams, ChunkRef, ChunkedFile, CHUNK_DIR};
    use super::*;
    use crate::manifest::{seal_checkpoint, Manifest};
    use gpusnap_criu_bridge::CriuFlags;
    use std::fs;

    const P: ChunkParams = ChunkParams {
        min: 1024,
        avg: 4096,
        max: 16384,
    };

    /// A sealed checkpoint whose chunked files are removed, with their list, and the chunks
    /// (in memory) a pull would receive.
    fn chunked() -> (tempfile::TempDir, ChunkList, Vec<(ChunkDigest, Vec<u8>)>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        fs::write(p.join("inventory.img"), b"inventory").unwrap();
        let mut pages = noise(100_000, 3);
        pages.extend(vec![0u8; 80_000]);
        pages.extend(noise(30_000, 4));
        fs::write(p.join("pages-1.img"), &pages).unwrap();
        fs::write(p.join("gpusnap-gpu-device-0000.bin"), noise(50_000, 3)).unwrap();
        fs::write(p.join("pages-2.img"), b"").unwrap();
        seal_checkpoint(p, Manifest::new("ctr1", CriuFlags::default())).unwrap();
        let mut files = Vec::new();
        let mut arrive = Vec::new();
        for (i, name) in ["pages-1.img", "gpusnap-gpu-device-0000.bin", "pages-2.img"]
            .into_iter()
            .enumerate()
        {
            let bytes = fs::read(p.join(name)).unwrap();
            let mut chunks = Vec::new();
            split(&mut bytes.as_slice(), P, &mut |c| {
                let d = ChunkDigest::of(c);
                if !arrive.iter().any(|(a, _)| *a == d) {
                    arrive.push((d, c.to_vec()));
                }
                chunks.push(ChunkRef(d, c.len() as u64));
                Ok(())
            })
            .unwrap();
            fs::remove_file(p.join(name)).unwrap();
            files.push(ChunkedFile {
                path: name.into(),
                size: bytes.len() as u64,
                chunks,
                mtime: Some(MTIME + i as u64),
            });
        }
        let list = ChunkList::new(files);
        fs::write(p.join(CHUNK_LIST_FILE), list.to_bytes()).unwrap();
        (dir, list, arrive)
    }

    /// The time the list gives the first file (the others a second later each).
    const MTIME: u64 = 1_700_000_000;

    fn begin(dir: &Path) -> Result<StreamAssembly, ChunkError> {
        let fd = beneath::open_root(dir).unwrap();
        StreamAssembly::begin(fd, dir, "test packs".into()).map(|s| s.expect("chunked"))
    }

    fn feed(s: &StreamAssembly, chunks: &[(ChunkDigest, Vec<u8>)]) -> Result<(), ChunkError> {
        for (d, b) in chunks {
            s.put(*d, b.len() as u64, &mut b.as_slice())?;
        }
        Ok(())
    }

    fn nothing_left(dir: &Path) {
        for e in fs::read_dir(dir).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(
                !n.starts_with(".gpusnap-assemble")
                    && !n.starts_with("pages-")
                    && !n.starts_with("gpusnap-gpu"),
                "{n} left behind"
            );
        }
    }

    #[test]
    fn assembles_as_chunks_arrive_in_any_order() {
        let (dir, _, mut arrive) = chunked();
        arrive.reverse();
        let s = begin(dir.path()).unwrap();
        feed(&s, &arrive).unwrap();
        let done = s.finish().unwrap();
        assert_eq!(done.files, 3);
        assert!(!dir.path().join(CHUNK_LIST_FILE).exists());
        assert!(!dir.path().join(CHUNK_DIR).exists());
        crate::validate_for_restore(dir.path()).unwrap();
        // The streaming path keeps the list's file times as the after-the-fact one does.
        use std::os::unix::fs::MetadataExt;
        for (i, name) in ["pages-1.img", "gpusnap-gpu-device-0000.bin", "pages-2.img"]
            .into_iter()
            .enumerate()
        {
            let m = fs::metadata(dir.path().join(name)).unwrap();
            assert_eq!(m.mtime() as u64, MTIME + i as u64, "{name}");
        }
    }

    #[test]
    fn hostile_arrivals_are_refused_with_nothing_left() {
        let other = b"not in the list".to_vec();
        type Case = fn(&mut Vec<(ChunkDigest, Vec<u8>)>, &mut ChunkList, &[u8]);
        let cases: &[(&str, Case, &str)] = &[
            (
                "a chunk the list does not name",
                |a, _, other| a.insert(1, (ChunkDigest::of(other), other.to_vec())),
                "not in the chunk list",
            ),
            (
                "a chunk twice",
                |a, _, _| {
                    let again = a[2].clone();
                    a.push(again);
                },
                "arrived twice",
            ),
            (
                "a chunk whose bytes are not its name",
                |a, _, _| a[3].1[0] ^= 1,
                "hashes to",
            ),
            ("a missing chunk", |a, _, _| drop(a.remove(4)), "is missing"),
            (
                "the list in the wrong order",
                |_, l, _| l.files[0].chunks.swap(0, 1),
                "differs from the sealed gpusnap manifest",
            ),
            (
                "a file listed twice",
                |_, l, _| {
                    let f = l.files[0].clone();
                    l.files.push(f);
                },
                "listed twice",
            ),
        ];
        for (what, tamper, want) in cases {
            let (dir, mut list, mut arrive) = chunked();
            tamper(&mut arrive, &mut list, &other);
            fs::write(dir.path().join(CHUNK_LIST_FILE), list.to_bytes()).unwrap();
            let err = match begin(dir.path()) {
                Err(e) => e,
                Ok(s) => match feed(&s, &arrive) {
                    Err(e) => {
                        drop(s);
                        e
                    }
                    Ok(()) => s.finish().expect_err(what),
                },
            }
            .to_string();
            assert!(err.contains(want), "{what}: {err}");
            nothing_left(dir.path());
        }
    }
}
