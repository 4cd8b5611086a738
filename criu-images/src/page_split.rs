//! The pages of large private anonymous memory taken out of CRIU's images, for gpusnap to
//! write into the restored tasks itself.
//!
//! CRIU restores a task's memory in one restorer, page by page. For the device memory the
//! driver-managed engine stages in the process (gigabytes), that is most of a restore (see
//! `docs/measurements/deferred-fill-2026-12-05.md`). [`plan`] picks the present pages of a
//! task's large private anonymous VMAs out of its `pagemap-<pid>.img` and says where they are
//! in `pages-<id>.img`; CRIU is then given the rewritten page map and a pages file without
//! them ([`write_kept`]), restores those VMAs empty with the tasks left stopped, and the
//! caller writes the deferred pages in from several threads before the tasks run.
//!
//! Everything here reads images that were verified first; a layout this does not understand
//! (pages in a parent checkpoint, overlapping or unordered entries) leaves the task to CRIU.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use prost::Message;

use crate::image::{frame, split_entries, ImageDir, ImageError, Kind};
use crate::proto::{CoreEntry, MmEntry, PagemapEntry, PagemapHead, PstreeEntry, VmaEntry};

/// CRIU's page size on the architectures gpusnap restores (x86-64, arm64 with 4 KiB pages).
pub const PAGE: u64 = 4096;

/// `pagemap_entry.flags` (`criu/include/pagemap.h`).
const PE_PARENT: u32 = 1 << 0;
const PE_PRESENT: u32 = 1 << 2;

/// `vma_entry.status` (`criu/include/image.h`): a plain private anonymous mapping is
/// `VMA_AREA_REGULAR | VMA_ANON_PRIVATE`, the brk heap adds `VMA_AREA_HEAP`; anything else
/// (stack, vDSO, guard page, file, shared memory, what CRIU marks unsupported) stays CRIU's.
const VMA_AREA_REGULAR: u32 = 1 << 0;
const VMA_AREA_HEAP: u32 = 1 << 5;
const VMA_ANON_PRIVATE: u32 = 1 << 9;

const MAP_GROWSDOWN: u32 = 0x0100;
const MAP_HUGETLB: u32 = 0x4_0000;
const PROT_READ: u32 = 0x1;
const PROT_WRITE: u32 = 0x2;

/// Deferred pages of one task: `len` bytes at `vaddr`, found at `offset` of its pages file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deferred {
    pub vaddr: u64,
    pub len: u64,
    pub offset: u64,
}

/// One task's part of the split.
#[derive(Debug, Clone)]
pub struct TaskSplit {
    /// The task's pid as the checkpoint recorded it (`pstree.img`).
    pub pid: u32,
    /// Its pages file is `pages-<pages_id>.img`.
    pub pages_id: u32,
    /// The pages the caller writes, in address order.
    pub deferred: Vec<Deferred>,
    /// The byte ranges (offset, length) of the pages file CRIU still reads, in order: the
    /// reduced pages file is their concatenation.
    pub kept: Vec<(u64, u64)>,
    /// The rewritten `pagemap-<pid>.img`.
    pub pagemap: Vec<u8>,
}

impl TaskSplit {
    pub fn deferred_bytes(&self) -> u64 {
        self.deferred.iter().map(|d| d.len).sum()
    }

    pub fn pagemap_name(&self) -> String {
        format!("pagemap-{}.img", self.pid)
    }

    pub fn pages_name(&self) -> String {
        format!("pages-{}.img", self.pages_id)
    }
}

/// Why a checkpoint's memory could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("{name} has no pagemap_head entry")]
    NoHead { name: String },
}

/// What [`plan`] found: the tasks whose pages are split, and every task CRIU restores alive
/// (whom CRIU leaves stopped and the caller continues).
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub tasks: Vec<TaskSplit>,
    /// The pid of every task in `pstree.img` but the zombies, as the checkpoint recorded it.
    pub pids: Vec<u32>,
}

/// `task_core_entry.task_state` of a stopped task (`compel/include/uapi/task-state.h`).
const TASK_STOPPED: u32 = 0x3;
/// `task_core_entry.task_state` of a zombie: CRIU restores it dead, so nothing is left to
/// find or continue.
const TASK_DEAD: u32 = 0x2;

/// The tasks of the checkpoint in `dir` whose private anonymous VMAs of at least
/// `min_vma_bytes` hold present pages, with what to take out of CRIU's images. Tasks with
/// none are not listed; a task whose images this does not understand is left to CRIU; a
/// checkpoint with a stopped task, or with two page maps naming one pages file, is left to
/// CRIU whole (no task listed).
pub fn plan(dir: &mut ImageDir, min_vma_bytes: u64) -> Result<Plan, SplitError> {
    let tasks = dir
        .read::<PstreeEntry>("pstree.img", Kind::Pstree)?
        .unwrap_or_default();
    let mut vmas: HashMap<u32, Vec<VmaEntry>> = HashMap::new();
    let mut cores: HashMap<u32, Vec<CoreEntry>> = HashMap::new();
    for task in &tasks {
        if let Some(mm) = dir.read_one::<MmEntry>(&format!("mm-{}.img", task.pid), Kind::Mm)? {
            vmas.insert(task.pid, mm.vmas);
        }
        let mut threads = Vec::with_capacity(task.threads.len());
        for tid in &task.threads {
            match dir.read_one::<CoreEntry>(&format!("core-{tid}.img"), Kind::Core)? {
                Some(core) => threads.push(core),
                None => break,
            }
        }
        if threads.len() == task.threads.len() {
            cores.insert(task.pid, threads);
        }
    }
    // The tasks the fill finds and continues: every one CRIU restores alive. A zombie
    // (restored dead, in no cgroup) would never be found; CRIU lists no threads for it, so its
    // state is read from its own core image.
    let mut pids = Vec::with_capacity(tasks.len());
    for t in &tasks {
        let core = dir.read_one::<CoreEntry>(&format!("core-{}.img", t.pid), Kind::Core)?;
        if core.and_then(|c| c.tc).map(|tc| tc.task_state) != Some(TASK_DEAD) {
            pids.push(t.pid);
        }
    }
    let none = || Plan {
        tasks: Vec::new(),
        pids: pids.clone(),
    };
    // CRIU restores a stopped task stopped; continuing every task afterwards would not.
    let stopped = cores.values().flatten().any(|c| {
        c.tc.as_ref()
            .is_some_and(|tc| tc.task_state == TASK_STOPPED)
    });
    if stopped || shared_pages_files(dir)? {
        return Ok(none());
    }
    let mut out = Vec::new();
    for task in &tasks {
        let pid = task.pid;
        let (Some(own), Some(threads)) = (vmas.get(&pid), cores.get(&pid)) else {
            continue;
        };
        // A signal queued for the task is delivered before its stop: the kernel writes the
        // frame into a stack the fill would then overwrite.
        if threads.iter().any(has_pending_signals) {
            continue;
        }
        let Some(stacks) = stacks_of(threads) else {
            continue;
        };
        let mut ranges = eligible(own, min_vma_bytes);
        ranges.retain(|&(start, end)| !stacks.iter().any(|&(s, e)| s < end && start < e));
        // An area with the same bounds in the parent or a child may share its pages copy on
        // write since the fork; CRIU restores that sharing, pages written into each task from
        // outside would not share.
        let family: Vec<u32> = tasks
            .iter()
            .filter(|t| t.ppid == pid && t.pid != pid)
            .map(|t| t.pid)
            .chain((task.ppid != pid).then_some(task.ppid))
            .collect();
        ranges.retain(|r| {
            !family
                .iter()
                .filter_map(|p| vmas.get(p))
                .flatten()
                .any(|v| (v.start, v.end) == *r)
        });
        if ranges.is_empty() {
            continue;
        }
        let name = format!("pagemap-{pid}.img");
        let Some((head, entries)) = read_pagemap(dir, &name)? else {
            continue;
        };
        if let Some(split) = split_task(pid, &head, &entries, &ranges) {
            out.push(split);
        }
    }
    Ok(Plan { tasks: out, pids })
}

/// `name` as its head and entries; `None` when it does not exist.
fn read_pagemap(
    dir: &mut ImageDir,
    name: &str,
) -> Result<Option<(PagemapHead, Vec<PagemapEntry>)>, SplitError> {
    let limits = dir.limits();
    let Some(bytes) = dir.read_bytes(name, Kind::Pagemap.what())? else {
        return Ok(None);
    };
    let raw = split_entries(name, &bytes, Kind::Pagemap, &limits)?;
    let decode_err = |index: usize| {
        let name = name.to_owned();
        move |source| ImageError::Decode {
            name,
            index,
            what: Kind::Pagemap.what(),
            source,
        }
    };
    let (head, rest) = raw.split_first().ok_or(SplitError::NoHead {
        name: name.to_owned(),
    })?;
    let head = PagemapHead::decode(*head).map_err(decode_err(0))?;
    let mut entries = Vec::with_capacity(rest.len());
    for (i, e) in rest.iter().enumerate() {
        entries.push(PagemapEntry::decode(*e).map_err(decode_err(i + 1))?);
    }
    Ok(Some((head, entries)))
}

/// Whether two page maps (the tasks' or shared memory's) name one pages file: a reader of
/// the other would then read the reduced file.
fn shared_pages_files(dir: &mut ImageDir) -> Result<bool, SplitError> {
    let names = dir.names().map_err(|source| ImageError::Read {
        name: dir.path().display().to_string(),
        source,
    })?;
    let mut seen = std::collections::HashSet::new();
    for name in names
        .iter()
        .filter(|n| n.starts_with("pagemap-") && n.ends_with(".img"))
    {
        if let Some((head, _)) = read_pagemap(dir, name)? {
            if !seen.insert(head.pages_id) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn has_pending_signals(core: &CoreEntry) -> bool {
    let queued = |q: &Option<crate::proto::SignalQueueEntry>| {
        q.as_ref().is_some_and(|q| !q.signals.is_empty())
    };
    core.tc.as_ref().is_some_and(|tc| queued(&tc.signals_s))
        || core
            .thread_core
            .as_ref()
            .is_some_and(|t| queued(&t.signals_p))
}

/// Every thread's stack pointer (as a one-page range) and alternate signal stack, where a
/// signal frame may be written before the fill; `None` for an architecture this does not read.
fn stacks_of(threads: &[CoreEntry]) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for c in threads {
        let sp = match (&c.thread_info, &c.ti_aarch64) {
            (Some(x86), _) => x86.gpregs.sp,
            (None, Some(arm)) => arm.gpregs.sp,
            (None, None) => return None,
        };
        // A frame is written below the stack pointer (past the red zone on x86-64).
        out.push((sp.saturating_sub(1 << 20), sp.saturating_add(PAGE)));
        if let Some(sas) = c.thread_core.as_ref().and_then(|t| t.sas.as_ref()) {
            if sas.ss_size > 0 {
                out.push((sas.ss_sp, sas.ss_sp.saturating_add(sas.ss_size)));
            }
        }
    }
    Some(out)
}

/// The address ranges of `vmas` whose pages may be written from outside: plain private
/// anonymous or the heap, readable and writable (`process_vm_writev` does not force a write), at least
/// `min` bytes; sorted and not overlapping.
fn eligible(vmas: &[VmaEntry], min: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = vmas
        .iter()
        .filter(|v| v.status & !VMA_AREA_HEAP == VMA_AREA_REGULAR | VMA_ANON_PRIVATE)
        .filter(|v| v.prot & (PROT_READ | PROT_WRITE) == PROT_READ | PROT_WRITE)
        .filter(|v| v.end > v.start && v.end - v.start >= min.max(PAGE))
        .filter(|v| v.start % PAGE == 0 && v.end % PAGE == 0)
        // CRIU maps these specially.
        .filter(|v| v.flags & (MAP_GROWSDOWN | MAP_HUGETLB) == 0)
        .map(|v| (v.start, v.end))
        .collect();
    ranges.sort_unstable();
    // VMAs never overlap in a real dump; if these do, trust none of them.
    if ranges.windows(2).any(|w| w[0].1 > w[1].0) {
        return Vec::new();
    }
    ranges
}

fn nr_pages(e: &PagemapEntry) -> u64 {
    e.nr_pages.unwrap_or(e.compat_nr_pages as u64)
}

fn entry(like: &PagemapEntry, vaddr: u64, pages: u64) -> PagemapEntry {
    PagemapEntry {
        vaddr,
        compat_nr_pages: u32::try_from(pages).unwrap_or(u32::MAX),
        nr_pages: Some(pages),
        ..*like
    }
}

/// One task's split, `None` when it defers nothing or its page map is not one this
/// understands.
fn split_task(
    pid: u32,
    head: &PagemapHead,
    entries: &[PagemapEntry],
    ranges: &[(u64, u64)],
) -> Option<TaskSplit> {
    let mut new_entries: Vec<PagemapEntry> = Vec::with_capacity(entries.len());
    let mut deferred: Vec<Deferred> = Vec::new();
    let mut kept: Vec<(u64, u64)> = Vec::new();
    let mut offset = 0u64;
    let mut last_end = 0u64;
    for e in entries {
        let pages = nr_pages(e);
        let len = pages.checked_mul(PAGE)?;
        let end = e.vaddr.checked_add(len)?;
        // Entries come in address order, without overlap, in CRIU's dumps.
        if e.vaddr % PAGE != 0 || e.vaddr < last_end {
            return None;
        }
        last_end = end;
        // CRIU's own dumps write every entry present (lazily restorable ones too) or in a
        // parent checkpoint; how CRIU 4.2.1 reads any other kind differs by restore path, so
        // only a page map of present entries is split.
        if e.flags
            .is_none_or(|f| f & PE_PRESENT == 0 || f & PE_PARENT != 0)
            || e.in_parent == Some(true)
        {
            return None;
        }
        // Cut [vaddr, end) at the eligible ranges' edges.
        let mut at = e.vaddr;
        while at < end {
            let inside = ranges.iter().find(|r| r.0 <= at && at < r.1);
            let next = match inside {
                Some(r) => r.1.min(end),
                None => ranges
                    .iter()
                    .map(|r| r.0)
                    .filter(|&s| s > at)
                    .min()
                    .unwrap_or(end)
                    .min(end),
            };
            let piece = next - at;
            let piece_offset = offset + (at - e.vaddr);
            if inside.is_some() {
                match deferred.last_mut() {
                    Some(d) if d.vaddr + d.len == at && d.offset + d.len == piece_offset => {
                        d.len += piece
                    }
                    _ => deferred.push(Deferred {
                        vaddr: at,
                        len: piece,
                        offset: piece_offset,
                    }),
                }
            } else {
                new_entries.push(entry(e, at, piece / PAGE));
                match kept.last_mut() {
                    Some(k) if k.0 + k.1 == piece_offset => k.1 += piece,
                    _ => kept.push((piece_offset, piece)),
                }
            }
            at = next;
        }
        offset += len;
    }
    if deferred.is_empty() {
        return None;
    }
    let mut images: Vec<Vec<u8>> = vec![head.encode_to_vec()];
    images.extend(new_entries.iter().map(Message::encode_to_vec));
    Some(TaskSplit {
        pid,
        pages_id: head.pages_id,
        deferred,
        kept,
        pagemap: frame(Kind::Pagemap, &images),
    })
}

/// Writes the reduced pages file into `dst`: the `kept` ranges of `src`, in order. Returns
/// the bytes written.
pub fn write_kept(src: &File, kept: &[(u64, u64)], dst: &File) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    for &(offset, len) in kept {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            src.read_exact_at(&mut buf[..n], offset + done)?;
            dst.write_all_at(&buf[..n], written)?;
            done += n as u64;
            written += n as u64;
        }
    }
    dst.set_len(written)?;
    Ok(written)
}

#[cfg(test)]
mod tests;
