//! The pages [`gpusnap_criu_images::page_split`] took out of CRIU's images, written into the
//! restored tasks from every core while CRIU's `leave-stopped` keeps them stopped, before
//! they run.
//!
//! CRIU writes a task's memory from one restorer, 4 KiB fault by 4 KiB fault; the faults of
//! several writers into one address space proceed in parallel (per-VMA locks), so the same
//! pages go in several times faster from several threads
//! (`docs/measurements/deferred-fill-2026-12-05.md`).
//!
//! [`prepare`] (in the bound phase, when `restore.page_fill_min_bytes` is set): the plan from
//! the verified images, a directory of CRIU images inside CRIU's work directory (the
//! checkpoint's images by symlink, the split tasks' page maps and pages files reduced), and a
//! CRIU config file saying `leave-stopped`, handed to CRIU through runc's environment
//! (`CRIU_CONFIG_FILE`, one of CRIU's default config files, read before runc's request) so
//! that nothing of the container's spec changes. [`Prepared::finish`] (before the GPU state):
//! the restored tasks found by their pid in the checkpoint, their pages written, and every
//! task of the container continued.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpusnap_checkpoint::chunks::{ChunkError, InPlaceFile, StreamError};
use gpusnap_criu_images::page_split::{self, Deferred, TaskSplit};
use gpusnap_criu_images::{ImageDir, Limits};
use gpusnap_cuda::discovery::container_pid;
use nix::sys::signal::{kill, Signal};
use nix::sys::uio::{process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

/// The environment variable naming one of CRIU's default config files.
pub const CRIU_CONFIG_ENV: &str = "CRIU_CONFIG_FILE";
// The images CRIU reads, and the CRIU config file that leaves the restored tasks stopped, in
// CRIU's work directory (named in `leftovers.rs`, which removes them after a killed restore).
use crate::leftovers::{LEAVE_STOPPED_CONFIG as CONFIG_FILE, SPLIT_IMAGES_DIR as IMAGES_DIR};

/// How much one write moves: large enough that a syscall is cheap beside its copy, small
/// enough that the threads share a range evenly.
const PIECE: u64 = 4 << 20;

/// Where a task's deferred pages are read from.
pub enum PagesSource {
    /// Its pages file in the checkpoint directory (verified whole before the restore began),
    /// read at each range's offset.
    File(File),
    /// Its pages file where the image's chunks lie (an image volume), read a manifest piece at
    /// a time, each checked as it is read: a piece that does not match fails the fill, and
    /// the tasks, still stopped, are killed.
    InPlace(Arc<InPlaceFile>),
}

/// The deferred pages of one restored task.
pub struct TaskFill {
    /// The task as this host sees it.
    pub pid: Pid,
    pub pages: PagesSource,
    /// In address order, which is their order in the pages file.
    pub ranges: Vec<Deferred>,
}

/// Why the pages could not all be written; the task is left with some of its memory empty.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    #[error("cannot read {len} bytes at offset {offset} of the pages file of pid {pid}: {source}")]
    Read {
        pid: i32,
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {len} bytes at {vaddr:#x} into pid {pid}: {source}")]
    Write {
        pid: i32,
        vaddr: u64,
        len: u64,
        #[source]
        source: nix::Error,
    },
    #[error("wrote {written} of {len} bytes at {vaddr:#x} into pid {pid}")]
    Short {
        pid: i32,
        vaddr: u64,
        len: u64,
        written: usize,
    },
    #[error("the pages of pid {pid}: {source}")]
    Verify {
        pid: i32,
        #[source]
        source: Box<ChunkError>,
    },
    #[error("no restored task has the checkpoint's pid {recorded}")]
    NoTask { recorded: u32 },
    #[error("two restored processes have the checkpoint's pid {recorded}")]
    SamePid { recorded: u32 },
    #[error("cannot continue restored pid {pid}: {source}")]
    Continue {
        pid: i32,
        #[source]
        source: nix::Error,
    },
}

/// Why the split images could not be prepared (nothing has run yet).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cannot plan which pages gpusnap writes itself: {0}")]
    Plan(#[from] page_split::SplitError),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the page map puts {len} bytes at offset {offset} of {name}, which has {size}: the \
         checkpoint's images disagree"
    )]
    PastEnd {
        name: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("cannot write {} out of the image's chunks: {source}", path.display())]
    InPlace {
        path: PathBuf,
        #[source]
        source: Box<ChunkError>,
    },
}

/// A restore whose large private memory gpusnap writes itself.
pub struct Prepared {
    /// The directory CRIU reads instead of the checkpoint.
    pub images: PathBuf,
    /// The CRIU config file for runc's environment ([`CRIU_CONFIG_ENV`]), when tasks are
    /// left stopped for their pages.
    pub config: Option<PathBuf>,
    tasks: Vec<(TaskSplit, PagesSource)>,
    /// Every task CRIU restores alive, by the pid it recorded: CRIU leaves each one stopped.
    pids: Vec<u32>,
}

/// The page size the split assumes (CRIU counts pages in the host's size).
const PAGE_SIZE: i64 = page_split::PAGE as i64;

/// Whether the running kernel's pages are the 4 KiB the split is written for; elsewhere
/// (64 KiB arm64 kernels) CRIU restores every page.
pub fn four_k_pages() -> bool {
    // SAFETY: sysconf reads a constant of the running kernel; it takes no pointers.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    size as i64 == PAGE_SIZE
}

/// The split for the verified checkpoint `checkpoint_dir`, written into CRIU's `work_dir`;
/// `None` when no task has a private anonymous VMA of `min_vma_bytes` (0: none is split) with
/// pages in it, or the host's pages are not 4 KiB, and no page image is read from the image's
/// chunks (`in_place`: those CRIU needs written out in any case, of verified pieces only).
/// `base_config`: the CRIU config file runc's environment names already (gpusnap's private
/// plugin directory's, which carries the node's own), whose options the split's file keeps.
pub fn prepare(
    checkpoint_dir: &Path,
    work_dir: &Path,
    min_vma_bytes: u64,
    base_config: Option<&Path>,
    in_place: &[Arc<InPlaceFile>],
) -> Result<Option<Prepared>, PrepareError> {
    let write = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PrepareError::Write { path, source }
    };
    let mut dir =
        ImageDir::open(checkpoint_dir, Limits::default()).map_err(write(checkpoint_dir))?;
    let plan = match min_vma_bytes {
        0 => page_split::Plan::default(),
        _ if !four_k_pages() => page_split::Plan::default(),
        min => page_split::plan(&mut dir, min)?,
    };
    if plan.tasks.is_empty() && in_place.is_empty() {
        return Ok(None);
    }
    let images = work_dir.join(IMAGES_DIR);
    match std::fs::remove_dir_all(&images) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(write(&images)(e)),
    }
    // The container's memory: root's alone, as the checkpoint is.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&images)
        .map_err(write(&images))?;
    // From here on, whatever fails removes what was written (`Drop`).
    let leave_stopped = !plan.tasks.is_empty();
    let mut prepared = Prepared {
        images,
        config: leave_stopped.then(|| work_dir.join(CONFIG_FILE)),
        tasks: Vec::with_capacity(plan.tasks.len()),
        pids: plan.pids,
    };
    let images = prepared.images.clone();
    let replaced: Vec<String> = plan
        .tasks
        .iter()
        .flat_map(|t| [t.pagemap_name(), t.pages_name()])
        .collect();
    // Relative links: CRIU's restored tasks open images after they entered the container's
    // mount namespace and root, where the checkpoint's absolute path means nothing; `..` from
    // a directory outside that root still climbs the host's tree.
    let real_images = images.canonicalize().map_err(write(&images))?;
    let real_checkpoint = checkpoint_dir
        .canonicalize()
        .map_err(write(checkpoint_dir))?;
    let up = relative(&real_checkpoint, &real_images);
    for name in dir.names().map_err(write(checkpoint_dir))? {
        // Only the checkpoint's own files: a link to a symlink of the (untrusted) tree would
        // hand CRIU wherever that points.
        let plain = std::fs::symlink_metadata(checkpoint_dir.join(&name))
            .is_ok_and(|m| m.file_type().is_file());
        if replaced.contains(&name) || !plain {
            continue;
        }
        let link = images.join(&name);
        std::os::unix::fs::symlink(up.join(&name), &link).map_err(write(&link))?;
    }
    let from_chunks = |name: &str| in_place.iter().find(|f| f.name() == name).cloned();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_THREADS);
    let kept_from_chunks = |file: &InPlaceFile, ranges: &[(u64, u64)], out: &Path| {
        let dst = private_file(out).map_err(write(out))?;
        file.write_ranges(ranges, &dst, threads)
            .map_err(|source| PrepareError::InPlace {
                path: out.to_path_buf(),
                source: Box::new(source),
            })
    };
    for t in plan.tasks {
        // Its pages file, opened once: read where the chunks lie, or beneath the checkpoint
        // directory as the checks read it.
        let source = match from_chunks(&t.pages_name()) {
            Some(file) => PagesSource::InPlace(file),
            None => PagesSource::File(
                dir.open_file(&t.pages_name())
                    .map_err(write(&checkpoint_dir.join(t.pages_name())))?,
            ),
        };
        // Every range within that file: the page map says where the pages are, the file
        // (verified, its size capped) bounds what that may be, and so the fill's work list.
        let size = match &source {
            PagesSource::InPlace(file) => file.size(),
            PagesSource::File(f) => f
                .metadata()
                .map_err(write(&checkpoint_dir.join(t.pages_name())))?
                .len(),
        };
        let mut ranges = t
            .deferred
            .iter()
            .map(|d| (d.offset, d.len))
            .chain(t.kept.iter().copied());
        if let Some((offset, len)) =
            ranges.find(|&(o, l)| o.checked_add(l).is_none_or(|end| end > size))
        {
            return Err(PrepareError::PastEnd {
                name: t.pages_name(),
                offset,
                len,
                size,
            });
        }
        let pagemap = images.join(t.pagemap_name());
        private_file(&pagemap)
            .and_then(|mut f| f.write_all(&t.pagemap))
            .map_err(write(&pagemap))?;
        let pages_path = images.join(t.pages_name());
        match &source {
            PagesSource::InPlace(file) => {
                kept_from_chunks(file, &t.kept, &pages_path)?;
            }
            PagesSource::File(pages) => {
                let reduced = private_file(&pages_path).map_err(write(&pages_path))?;
                page_split::write_kept(pages, &t.kept, &reduced).map_err(write(&pages_path))?;
            }
        }
        prepared.tasks.push((t, source));
    }
    // The page images read from chunks whose task is not split: CRIU reads them whole.
    for file in in_place {
        let out = images.join(file.name());
        if !out.exists() {
            kept_from_chunks(file, &[(0, file.size())], &out)?;
        }
    }
    if let Some(config) = prepared.config.clone() {
        let mut conf = match base_config {
            Some(base) => std::fs::read_to_string(base).map_err(write(base))?,
            None => String::new(),
        };
        if !conf.is_empty() && !conf.ends_with('\n') {
            conf.push('\n');
        }
        conf.push_str(
            "# written by gpusnap: the restored tasks wait for their memory\nleave-stopped\n",
        );
        private_file(&config)
            .and_then(|mut f| f.write_all(conf.as_bytes()))
            .map_err(write(&config))?;
    }
    Ok(Some(prepared))
}

/// A new file at `path` only root can read (it holds container memory).
fn private_file(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// `target` as a path relative to the directory `from` (both absolute, without symlinks).
fn relative(target: &Path, from: &Path) -> PathBuf {
    let t: Vec<_> = target.components().collect();
    let f: Vec<_> = from.components().collect();
    let common = t.iter().zip(&f).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

impl Prepared {
    /// The environment runc gets for CRIU, when tasks are left stopped for their pages.
    pub fn env(&self) -> Option<(OsString, OsString)> {
        let config = self.config.clone()?;
        Some((CRIU_CONFIG_ENV.into(), config.into_os_string()))
    }

    /// What gpusnap writes, in bytes.
    pub fn bytes(&self) -> u64 {
        self.tasks.iter().map(|(t, _)| t.deferred_bytes()).sum()
    }

    /// The split images and the config file removed (CRIU has read them once runc returned).
    pub fn remove_files(&self) {
        let _ = std::fs::remove_dir_all(&self.images);
        if let Some(config) = &self.config {
            let _ = std::fs::remove_file(config);
        }
    }

    /// Writes the deferred pages into the tasks CRIU left stopped (`restored`: the container's
    /// host pids, `init`: its init's), then continues every task of the checkpoint.
    pub fn finish(
        mut self,
        restored: &[u32],
        init: u32,
        threads: usize,
    ) -> Result<Filled, FillError> {
        if self.config.is_none() {
            // No task was split: CRIU restored every page and left nothing stopped.
            return Ok(Filled {
                bytes: 0,
                skipped_zero_bytes: 0,
                threads: 0,
            });
        }
        let by_recorded = recorded_pids(restored, init)?;
        let host = |recorded: u32| {
            by_recorded
                .get(&recorded)
                .copied()
                .ok_or(FillError::NoTask { recorded })
        };
        // Every task CRIU stopped must be found before anything is written.
        let every: Vec<u32> = self
            .pids
            .iter()
            .map(|&p| host(p))
            .collect::<Result<_, _>>()?;
        let mut fills = Vec::with_capacity(self.tasks.len());
        for (t, pages) in std::mem::take(&mut self.tasks) {
            fills.push(TaskFill {
                pid: Pid::from_raw(host(t.pid)? as i32),
                pages,
                ranges: t.deferred,
            });
        }
        let filled = fill(&fills, threads.min(MAX_THREADS))?;
        for pid in every {
            match kill(Pid::from_raw(pid as i32), Signal::SIGCONT) {
                // Gone already (killed meanwhile): nothing to continue.
                Ok(()) | Err(nix::Error::ESRCH) => {}
                Err(source) => {
                    return Err(FillError::Continue {
                        pid: pid as i32,
                        source,
                    })
                }
            }
        }
        Ok(filled)
    }
}

/// The writes stop scaling well before this many threads; each holds a [`PIECE`] buffer.
const MAX_THREADS: usize = 16;

impl Drop for Prepared {
    /// Whatever way the restore ends, the split images and the config file go with it.
    fn drop(&mut self) {
        self.remove_files();
    }
}

/// The host pids of `restored` by the pid CRIU restored them with: the innermost of their
/// `NSpid` (the container's pid namespace, or the host's when it has none of its own). Only
/// processes in `init`'s pid namespace count; two with one pid there are refused.
fn recorded_pids(restored: &[u32], init: u32) -> Result<HashMap<u32, u32>, FillError> {
    let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let init_ns = ns(init);
    let mut out = HashMap::new();
    for &pid in restored {
        if init_ns.is_none() || ns(pid) != init_ns {
            continue;
        }
        let Ok(Some(recorded)) = container_pid(Path::new("/proc"), pid as i32) else {
            continue;
        };
        let recorded = recorded as u32;
        if out.insert(recorded, pid).is_some() {
            return Err(FillError::SamePid { recorded });
        }
    }
    Ok(out)
}

/// What [`fill`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    /// The deferred bytes, written or (zeros) left as they are.
    pub bytes: u64,
    /// Of those, the zeros not written: CRIU maps a deferred range as fresh anonymous memory,
    /// which reads as zeros already.
    pub skipped_zero_bytes: u64,
    pub threads: usize,
}

/// One unit of the fill's work.
enum Unit {
    /// `len` bytes of a task's file source from `offset`, to `vaddr`.
    Range {
        task: usize,
        vaddr: u64,
        offset: u64,
        len: u64,
    },
    /// Piece `index` of a task's pages read where the chunks lie: streamed, written where
    /// the task's ranges take it, then checked.
    Piece { task: usize, index: usize },
}

/// Writes every range of `tasks` from up to `threads` threads; the first failure stops the
/// others at their next unit.
pub fn fill(tasks: &[TaskFill], threads: usize) -> Result<Filled, FillError> {
    let mut units = Vec::new();
    for (t, task) in tasks.iter().enumerate() {
        match &task.pages {
            PagesSource::File(_) => {
                for r in &task.ranges {
                    for i in 0..r.len.div_ceil(PIECE) {
                        let at = i * PIECE;
                        units.push(Unit::Range {
                            task: t,
                            vaddr: r.vaddr + at,
                            offset: r.offset + at,
                            len: PIECE.min(r.len - at),
                        });
                    }
                }
            }
            PagesSource::InPlace(file) => {
                let mut pieces: Vec<usize> = task
                    .ranges
                    .iter()
                    .filter(|r| r.len > 0)
                    .flat_map(|r| file.piece_of(r.offset)..=file.piece_of(r.offset + r.len - 1))
                    .collect();
                pieces.dedup();
                units.extend(
                    pieces
                        .into_iter()
                        .map(|index| Unit::Piece { task: t, index }),
                );
            }
        }
    }
    let bytes = tasks.iter().flat_map(|t| &t.ranges).map(|r| r.len).sum();
    let threads = threads.clamp(1, units.len().max(1));
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let skipped = AtomicU64::new(0);
    let first: Mutex<Option<FillError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0u8; PIECE as usize];
                while !stop.load(Ordering::Relaxed) {
                    let Some(unit) = units.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        break;
                    };
                    let done = match *unit {
                        Unit::Range {
                            task,
                            vaddr,
                            offset,
                            len,
                        } => write_range(&tasks[task], &mut buf, vaddr, offset, len),
                        Unit::Piece { task, index } => write_piece(&tasks[task], &mut buf, index),
                    };
                    match done {
                        Ok(zeros) => {
                            skipped.fetch_add(zeros, Ordering::Relaxed);
                        }
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            first
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    match first.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(Filled {
            bytes,
            skipped_zero_bytes: skipped.into_inner(),
            threads,
        }),
    }
}

/// A file source's `len` bytes from `offset`, written at `vaddr`; returns the zeros skipped.
fn write_range(
    task: &TaskFill,
    buf: &mut [u8],
    vaddr: u64,
    offset: u64,
    len: u64,
) -> Result<u64, FillError> {
    let PagesSource::File(pages) = &task.pages else {
        unreachable!("ranges are made for file sources only");
    };
    let pid = task.pid.as_raw();
    let data = &mut buf[..len as usize];
    pages
        .read_exact_at(data, offset)
        .map_err(|source| FillError::Read {
            pid,
            offset,
            len,
            source,
        })?;
    write_nonzero(task.pid, vaddr, data)
}

/// Piece `index` of an in-place source: checked against the manifest first (read through
/// once, nothing written), then read again with each block's part in the task's ranges
/// written at its address, and checked again. The first pass keeps the image's bytes out of
/// the tasks until they are known good (a task of a pod sharing its pid namespace could be
/// continued by a neighbour meanwhile); the second read comes from the page cache the first
/// filled, and only a change of the volume under the restore fails it. Returns the zeros
/// skipped.
fn write_piece(task: &TaskFill, buf: &mut [u8], index: usize) -> Result<u64, FillError> {
    let PagesSource::InPlace(file) = &task.pages else {
        unreachable!("pieces are made for in-place sources only");
    };
    let verify = |source| FillError::Verify {
        pid: task.pid.as_raw(),
        source: Box::new(source),
    };
    file.stream_piece(index, buf, &mut |_, _| {
        Ok::<(), std::convert::Infallible>(())
    })
    .map_err(|e| match e {
        StreamError::Chunk(source) => verify(source),
        StreamError::Sink(never) => match never {},
    })?;
    let ranges = &task.ranges;
    let mut zeros = 0u64;
    let mut sink = |at: u64, block: &[u8]| -> Result<(), FillError> {
        let end = at + block.len() as u64;
        // The first range ending after `at`; ranges are in file order.
        let from = ranges.partition_point(|r| r.offset + r.len <= at);
        for r in ranges[from..].iter().take_while(|r| r.offset < end) {
            let lo = r.offset.max(at);
            let hi = (r.offset + r.len).min(end);
            let part = &block[(lo - at) as usize..(hi - at) as usize];
            zeros += write_nonzero(task.pid, r.vaddr + (lo - r.offset), part)?;
        }
        Ok(())
    };
    file.stream_piece(index, buf, &mut sink)
        .map_err(|e| match e {
            StreamError::Sink(e) => e,
            StreamError::Chunk(source) => verify(source),
        })?;
    Ok(zeros)
}

/// How finely zeros are looked for: a run of zeros this long is not written.
const ZERO_RUN: usize = 64 << 10;

/// Writes `data` at `vaddr` of `pid`, leaving out the [`ZERO_RUN`]s that are all zeros (the
/// fresh mapping holds zeros there already); returns the bytes left out.
fn write_nonzero(pid: Pid, vaddr: u64, data: &[u8]) -> Result<u64, FillError> {
    let mut local: Vec<IoSlice<'_>> = Vec::new();
    let mut remote: Vec<RemoteIoVec> = Vec::new();
    let mut skipped = 0u64;
    let mut at = 0usize;
    while at < data.len() {
        let end = (at + ZERO_RUN).min(data.len());
        let part = &data[at..end];
        if part.iter().all(|&b| b == 0) {
            skipped += part.len() as u64;
        } else {
            match remote.last_mut() {
                // Extends the run before it.
                Some(last) if last.base + last.len == vaddr as usize + at => {
                    last.len += part.len();
                    let run = local.pop().expect("one local slice per remote one");
                    let start = run.as_ptr() as usize - data.as_ptr() as usize;
                    local.push(IoSlice::new(&data[start..end]));
                }
                _ => {
                    local.push(IoSlice::new(part));
                    remote.push(RemoteIoVec {
                        base: vaddr as usize + at,
                        len: part.len(),
                    });
                }
            }
        }
        at = end;
    }
    if remote.is_empty() {
        return Ok(skipped);
    }
    let len: usize = remote.iter().map(|r| r.len).sum();
    let first = remote[0].base as u64;
    let written = process_vm_writev(pid, &local, &remote).map_err(|source| FillError::Write {
        pid: pid.as_raw(),
        vaddr: first,
        len: len as u64,
        source,
    })?;
    if written != len {
        return Err(FillError::Short {
            pid: pid.as_raw(),
            vaddr: first,
            len: len as u64,
            written,
        });
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pages file whose byte `i` is a function of `i`.
    fn pages_file(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &bytes).unwrap();
        (f, bytes)
    }

    #[test]
    fn a_relative_path_climbs_to_the_common_ancestor() {
        assert_eq!(
            relative(Path::new("/tmp/ck/dir"), Path::new("/run/c/work/imgs")),
            PathBuf::from("../../../../tmp/ck/dir")
        );
        assert_eq!(
            relative(Path::new("/a/b/c"), Path::new("/a/x")),
            PathBuf::from("../b/c")
        );
    }

    #[test]
    fn every_range_lands_at_its_address_from_its_offset() {
        // This process stands in for the restored task: it may write its own memory.
        let (f, bytes) = pages_file(24 << 20);
        let mut target = vec![0u8; 20 << 20];
        let base = target.as_mut_ptr() as u64;
        let ranges = vec![
            // Crosses several pieces, from an offset that is not piece-aligned.
            Deferred {
                vaddr: base,
                len: 9 << 20,
                offset: 4096,
            },
            Deferred {
                vaddr: base + (12 << 20),
                len: 8 << 20,
                offset: 16 << 20,
            },
        ];
        let task = TaskFill {
            pid: Pid::this(),
            pages: PagesSource::File(File::open(f.path()).unwrap()),
            ranges: ranges.clone(),
        };
        let filled = fill(&[task], 3).unwrap();
        // Written behind the compiler's back: read it as memory, not as what was last stored.
        let target = std::hint::black_box(target);
        assert_eq!(filled.bytes, 17 << 20);
        assert_eq!(filled.threads, 3);
        for r in &ranges {
            let at = (r.vaddr - base) as usize;
            let from = r.offset as usize;
            assert!(target[at..at + r.len as usize] == bytes[from..from + r.len as usize]);
        }
        // What no range covers is untouched.
        assert!(target[9 << 20..12 << 20].iter().all(|&b| b == 0));
    }

    #[test]
    fn leftovers_of_a_killed_restore_are_removed_and_nothing_else() {
        let work = tempfile::tempdir().unwrap();
        let images = work.path().join(IMAGES_DIR);
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("pages-1.img"), b"memory").unwrap();
        // A link in the split images goes, never what it points at.
        let outside = work.path().join("restore.log");
        std::fs::write(&outside, b"log").unwrap();
        std::os::unix::fs::symlink(&outside, images.join("core-1.img")).unwrap();
        std::fs::write(work.path().join(CONFIG_FILE), b"leave-stopped\n").unwrap();
        assert!(crate::leftovers::remove_split_images(work.path()));
        assert!(!images.exists() && !work.path().join(CONFIG_FILE).exists());
        assert!(outside.is_file());
        assert!(!crate::leftovers::remove_split_images(work.path()));
    }

    #[test]
    fn runs_of_zeros_are_left_to_the_fresh_mapping() {
        // Zeros in two runs of 64 KiB and more (one aligned, one not), data around them.
        let mut bytes: Vec<u8> = (0..1usize << 20).map(|i| (i % 251 + 1) as u8).collect();
        bytes[128 << 10..320 << 10].fill(0);
        bytes[600_000..800_000].fill(0);
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &bytes).unwrap();
        // Not zero: what was left out keeps what the target held.
        let mut target = vec![0xeeu8; 1 << 20];
        let base = target.as_mut_ptr() as u64;
        let task = TaskFill {
            pid: Pid::this(),
            pages: PagesSource::File(File::open(f.path()).unwrap()),
            ranges: vec![Deferred {
                vaddr: base,
                len: 1 << 20,
                offset: 0,
            }],
        };
        let filled = fill(&[task], 2).unwrap();
        let target = std::hint::black_box(target);
        // 64 KiB runs wholly inside the zeros: 3 in the first, 2 in the second.
        assert_eq!(filled.skipped_zero_bytes, 5 * (64 << 10));
        for (r, (t, b)) in target
            .chunks(64 << 10)
            .zip(bytes.chunks(64 << 10))
            .enumerate()
        {
            let skipped = b.iter().all(|&x| x == 0);
            assert!(
                if skipped {
                    t.iter().all(|&x| x == 0xee)
                } else {
                    t == b
                },
                "run {r}"
            );
        }
    }

    #[test]
    fn an_address_the_task_does_not_map_fails_naming_the_task_and_address() {
        let (f, _) = pages_file(1 << 20);
        let task = TaskFill {
            pid: Pid::this(),
            pages: PagesSource::File(File::open(f.path()).unwrap()),
            ranges: vec![Deferred {
                vaddr: 0x1000,
                len: 1 << 20,
                offset: 0,
            }],
        };
        let e = fill(&[task], 2).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, FillError::Write { .. }), "{msg}");
        assert!(msg.contains("at 0x1000 into pid"), "{msg}");
    }

    #[test]
    fn a_pages_file_shorter_than_its_ranges_fails_before_writing_that_piece() {
        let (f, _) = pages_file(1 << 20);
        let mut target = vec![0u8; 2 << 20];
        let task = TaskFill {
            pid: Pid::this(),
            pages: PagesSource::File(File::open(f.path()).unwrap()),
            ranges: vec![Deferred {
                vaddr: target.as_mut_ptr() as u64,
                len: 2 << 20,
                offset: 0,
            }],
        };
        let e = fill(&[task], 1).unwrap_err();
        assert!(matches!(e, FillError::Read { .. }), "{e}");
        let target = std::hint::black_box(target);
        assert!(target.iter().all(|&b| b == 0));
    }
}
