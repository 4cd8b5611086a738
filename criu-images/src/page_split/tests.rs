use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::forge;

const PE_LAZY: u32 = 1 << 1;
use crate::image::Limits;

const MIB: u64 = 1 << 20;

fn vma(start: u64, end: u64, status: u32, prot: u32) -> VmaEntry {
    VmaEntry {
        start,
        end,
        status,
        prot,
        flags: 0x22, // MAP_PRIVATE | MAP_ANONYMOUS
        fd: -1,
        ..Default::default()
    }
}

fn anon(start: u64, end: u64) -> VmaEntry {
    vma(
        start,
        end,
        VMA_AREA_REGULAR | VMA_ANON_PRIVATE,
        PROT_READ | PROT_WRITE,
    )
}

fn pe(vaddr: u64, pages: u64, flags: u32) -> PagemapEntry {
    PagemapEntry {
        vaddr,
        compat_nr_pages: pages as u32,
        nr_pages: Some(pages),
        flags: Some(flags),
        in_parent: None,
    }
}

/// A thread's core image: alive, its stack pointer at `sp`, nothing queued.
/// A task of session and group 7 with `threads`.
fn task(pid: u32, ppid: u32, threads: Vec<u32>) -> PstreeEntry {
    PstreeEntry {
        pid,
        ppid,
        pgid: 7,
        sid: 7,
        threads,
    }
}

fn core(sp: u64) -> CoreEntry {
    CoreEntry {
        mtype: 1, // X86_64
        thread_info: Some(crate::proto::ThreadInfoX86 {
            gpregs: crate::proto::UserX86RegsEntry {
                sp,
                ..Default::default()
            },
            ..Default::default()
        }),
        tc: Some(crate::proto::TaskCoreEntry {
            task_state: 1,
            ..Default::default()
        }),
        ..Default::default()
    }
}

const STACK: u64 = 0x7ffd_0000_0000;

/// The content CRIU would give the page at `vaddr`: its address, repeated.
fn page(vaddr: u64) -> Vec<u8> {
    vaddr.to_le_bytes().repeat((PAGE / 8) as usize)
}

/// A checkpoint of one task (pid 7, pages id 3) with these VMAs and page map, whose pages
/// file holds each present page's [`page`].
fn checkpoint(dir: &Path, vmas: Vec<VmaEntry>, entries: &[PagemapEntry]) {
    let w = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    w(
        "pstree.img",
        forge::image_of(
            Kind::Pstree,
            &[PstreeEntry {
                pid: 7,
                pgid: 7,
                sid: 7,
                threads: vec![7],
                ..Default::default()
            }],
        ),
    );
    w("core-7.img", forge::image_of(Kind::Core, &[core(STACK)]));
    w(
        "mm-7.img",
        forge::image_of(
            Kind::Mm,
            &[MmEntry {
                vmas,
                ..Default::default()
            }],
        ),
    );
    let mut images = vec![PagemapHead { pages_id: 3 }.encode_to_vec()];
    images.extend(entries.iter().map(Message::encode_to_vec));
    w("pagemap-7.img", frame(Kind::Pagemap, &images));
    let mut pages = Vec::new();
    for e in entries
        .iter()
        .filter(|e| e.flags.unwrap_or(0) & PE_PRESENT != 0)
    {
        for i in 0..nr_pages(e) {
            pages.extend(page(e.vaddr + i * PAGE));
        }
    }
    w("pages-3.img", pages);
}

/// Address → content of every present page, as CRIU restores `pagemap` with `pages`.
fn restored(pagemap: &[u8], pages: &[u8]) -> BTreeMap<u64, Vec<u8>> {
    let raw = split_entries("pagemap", pagemap, Kind::Pagemap, &Limits::default()).unwrap();
    let mut out = BTreeMap::new();
    let mut at = 0usize;
    for e in &raw[1..] {
        let e = PagemapEntry::decode(*e).unwrap();
        if e.flags.unwrap_or(0) & PE_PRESENT == 0 {
            continue;
        }
        for i in 0..nr_pages(&e) {
            let p = pages[at..at + PAGE as usize].to_vec();
            out.insert(e.vaddr + i * PAGE, p);
            at += PAGE as usize;
        }
    }
    assert_eq!(at, pages.len(), "every page of the pages file is read");
    out
}

/// What the split restores: CRIU's part from the rewritten page map and the reduced pages
/// file, plus the deferred pages written from the original pages file.
fn restored_split(dir: &Path, split: &TaskSplit) -> BTreeMap<u64, Vec<u8>> {
    let original = File::open(dir.join(split.pages_name())).unwrap();
    let reduced_path = dir.join("reduced.img");
    let reduced = File::create(&reduced_path).unwrap();
    write_kept(&original, &split.kept, &reduced).unwrap();
    let reduced = std::fs::read(&reduced_path).unwrap();
    let mut out = restored(&split.pagemap, &reduced);
    let all = std::fs::read(dir.join(split.pages_name())).unwrap();
    for d in &split.deferred {
        assert_eq!(d.len % PAGE, 0);
        for i in 0..d.len / PAGE {
            let at = (d.offset + i * PAGE) as usize;
            let prev = out.insert(d.vaddr + i * PAGE, all[at..at + PAGE as usize].to_vec());
            assert!(prev.is_none(), "a page both kept and deferred");
        }
    }
    out
}

fn plan_of(dir: &Path, min: u64) -> Vec<TaskSplit> {
    let mut d = ImageDir::open(dir, Limits::default()).unwrap();
    plan(&mut d, min).unwrap().tasks
}

#[test]
fn the_large_private_anonymous_vma_is_deferred_and_every_other_page_stays_with_criu() {
    let t = tempfile::tempdir().unwrap();
    let big = (0x7f00_0000_0000, 0x7f00_0000_0000 + 4 * MIB);
    let small = (0x5500_0000_0000, 0x5500_0000_0000 + 64 * 1024);
    let file = (0x6000_0000_0000, 0x6000_0000_0000 + 8 * MIB);
    let entries = [
        pe(small.0, 4, PE_PRESENT),
        pe(file.0, 16, PE_PRESENT),
        pe(big.0, 100, PE_PRESENT),
        pe(big.0 + 200 * PAGE, 50, PE_PRESENT | PE_LAZY),
    ];
    let vmas = vec![
        anon(small.0, small.1),
        vma(
            file.0,
            file.1,
            VMA_AREA_REGULAR | VMA_FILE_PRIVATE_FOR_TEST,
            3,
        ),
        anon(big.0, big.1),
    ];
    checkpoint(t.path(), vmas, &entries);
    let plan = plan_of(t.path(), MIB);
    assert_eq!(plan.len(), 1);
    let s = &plan[0];
    assert_eq!((s.pid, s.pages_id), (7, 3));
    // The two present runs of the big VMA, at their offsets (after 4 + 16 pages).
    assert_eq!(
        s.deferred,
        vec![
            Deferred {
                vaddr: big.0,
                len: 100 * PAGE,
                offset: 20 * PAGE
            },
            Deferred {
                vaddr: big.0 + 200 * PAGE,
                len: 50 * PAGE,
                offset: 120 * PAGE
            },
        ]
    );
    assert_eq!(s.kept, vec![(0, 20 * PAGE)]);
    assert_eq!(s.deferred_bytes(), 150 * PAGE);
    let before = restored(
        &std::fs::read(t.path().join("pagemap-7.img")).unwrap(),
        &std::fs::read(t.path().join("pages-3.img")).unwrap(),
    );
    assert_eq!(restored_split(t.path(), s), before);
}

/// `VMA_FILE_PRIVATE` (`criu/include/image.h`), only for building a file mapping here.
const VMA_FILE_PRIVATE_FOR_TEST: u32 = 1 << 6;

#[test]
fn an_entry_across_the_edge_of_the_vma_is_cut_there() {
    let t = tempfile::tempdir().unwrap();
    let big = (0x7f00_0000_0000u64, 0x7f00_0000_0000 + 2 * MIB);
    // A run starting 10 pages before the VMA and ending 10 pages after it (CRIU's own dumps
    // do not do this; the cut must still be right).
    let start = big.0 - 10 * PAGE;
    let pages = (big.1 - big.0) / PAGE + 20;
    checkpoint(
        t.path(),
        vec![anon(big.0, big.1)],
        &[pe(start, pages, PE_PRESENT)],
    );
    let plan = plan_of(t.path(), MIB);
    let s = &plan[0];
    assert_eq!(
        s.deferred,
        vec![Deferred {
            vaddr: big.0,
            len: big.1 - big.0,
            offset: 10 * PAGE
        }]
    );
    assert_eq!(
        s.kept,
        vec![(0, 10 * PAGE), (10 * PAGE + (big.1 - big.0), 10 * PAGE)]
    );
    let before = restored(
        &std::fs::read(t.path().join("pagemap-7.img")).unwrap(),
        &std::fs::read(t.path().join("pages-3.img")).unwrap(),
    );
    assert_eq!(restored_split(t.path(), s), before);
}

#[test]
fn small_read_only_stack_and_parent_backed_memory_stays_with_criu_the_heap_does_not() {
    let t = tempfile::tempdir().unwrap();
    let a = 0x7f00_0000_0000u64;
    // Below the threshold.
    checkpoint(
        t.path(),
        vec![anon(a, a + MIB / 2)],
        &[pe(a, 10, PE_PRESENT)],
    );
    assert!(plan_of(t.path(), MIB).is_empty());
    // Read-only: process_vm_writev could not write it.
    let ro = vma(
        a,
        a + 2 * MIB,
        VMA_AREA_REGULAR | VMA_ANON_PRIVATE,
        PROT_READ,
    );
    checkpoint(t.path(), vec![ro], &[pe(a, 10, PE_PRESENT)]);
    assert!(plan_of(t.path(), MIB).is_empty());
    // The brk heap is private anonymous memory like any other.
    let heap = vma(
        a,
        a + 2 * MIB,
        VMA_AREA_REGULAR | VMA_ANON_PRIVATE | VMA_AREA_HEAP,
        PROT_READ | PROT_WRITE,
    );
    checkpoint(t.path(), vec![heap], &[pe(a, 10, PE_PRESENT)]);
    assert_eq!(plan_of(t.path(), MIB).len(), 1);
    // A stack.
    let stack = vma(
        a,
        a + 2 * MIB,
        VMA_AREA_REGULAR | VMA_ANON_PRIVATE | (1 << 1),
        PROT_READ | PROT_WRITE,
    );
    checkpoint(t.path(), vec![stack], &[pe(a, 10, PE_PRESENT)]);
    assert!(plan_of(t.path(), MIB).is_empty());
    // Pages in a parent checkpoint anywhere in the map: the offsets are not this file's.
    checkpoint(
        t.path(),
        vec![anon(a, a + 2 * MIB)],
        &[pe(a, 10, PE_PRESENT), pe(a + 20 * PAGE, 5, PE_PARENT)],
    );
    assert!(plan_of(t.path(), MIB).is_empty());
    // An entry neither present nor in a parent: CRIU 4.2.1 reads those differently by
    // restore path, so the task is left to it.
    checkpoint(
        t.path(),
        vec![anon(a, a + 2 * MIB)],
        &[pe(a, 10, PE_PRESENT), pe(a + 20 * PAGE, 5, 0)],
    );
    assert!(plan_of(t.path(), MIB).is_empty());
    // An area holding a thread's stack pointer.
    checkpoint(
        t.path(),
        vec![anon(STACK - MIB, STACK + MIB)],
        &[pe(STACK - MIB, 10, PE_PRESENT)],
    );
    assert!(plan_of(t.path(), MIB).is_empty());
    // Entries out of order.
    checkpoint(
        t.path(),
        vec![anon(a, a + 2 * MIB)],
        &[pe(a + 20 * PAGE, 5, PE_PRESENT), pe(a, 10, PE_PRESENT)],
    );
    assert!(plan_of(t.path(), MIB).is_empty());
}

/// xorshift, so that the layouts below are the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

#[test]
fn any_layout_restores_the_same_pages_split_or_not() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..200 {
        let t = tempfile::tempdir().unwrap();
        // Up to 6 VMAs of 1–40 pages with gaps, some eligible.
        let mut vmas = Vec::new();
        let mut at = 0x7f00_0000_0000u64;
        for _ in 0..1 + rng.next(6) {
            at += rng.next(4) * PAGE;
            let len = (1 + rng.next(40)) * PAGE;
            vmas.push(if rng.next(3) == 0 {
                vma(at, at + len, VMA_AREA_REGULAR | VMA_ANON_PRIVATE, PROT_READ)
            } else {
                anon(at, at + len)
            });
            at += len;
        }
        // Page-map runs over the whole span, present or holes, cut anywhere.
        let (lo, hi) = (vmas[0].start, at);
        let mut entries = Vec::new();
        let mut p = lo;
        while p < hi {
            let n = (1 + rng.next(12)).min((hi - p) / PAGE);
            let flags = if rng.next(4) == 0 {
                PE_PRESENT | PE_LAZY
            } else {
                PE_PRESENT
            };
            entries.push(pe(p, n, flags));
            p += n * PAGE + rng.next(3) * PAGE;
        }
        checkpoint(t.path(), vmas, &entries);
        let before = restored(
            &std::fs::read(t.path().join("pagemap-7.img")).unwrap(),
            &std::fs::read(t.path().join("pages-3.img")).unwrap(),
        );
        let min = (1 + rng.next(8)) * PAGE;
        for s in plan_of(t.path(), min) {
            assert_eq!(restored_split(t.path(), &s), before, "round {round}");
        }
    }
}

#[test]
fn an_area_a_parent_and_child_both_map_stays_with_criu_for_copy_on_write() {
    let t = tempfile::tempdir().unwrap();
    let a = 0x7f00_0000_0000u64;
    let b = 0x7e00_0000_0000u64;
    let c = 0x7d00_0000_0000u64;
    let w = |name: &str, bytes: Vec<u8>| std::fs::write(t.path().join(name), bytes).unwrap();
    w(
        "pstree.img",
        forge::image_of(Kind::Pstree, &[task(7, 0, vec![7]), task(8, 7, vec![8])]),
    );
    w("core-7.img", forge::image_of(Kind::Core, &[core(STACK)]));
    w("core-8.img", forge::image_of(Kind::Core, &[core(STACK)]));
    // The parent maps `c` (its own) and `a`; the child maps `b` (its own) and `a` (inherited).
    let mm = |vmas| {
        forge::image_of(
            Kind::Mm,
            &[MmEntry {
                vmas,
                ..Default::default()
            }],
        )
    };
    w(
        "mm-7.img",
        mm(vec![anon(c, c + 2 * MIB), anon(a, a + 2 * MIB)]),
    );
    w(
        "mm-8.img",
        mm(vec![anon(b, b + 2 * MIB), anon(a, a + 2 * MIB)]),
    );
    for (pid, id, entries) in [
        (
            7u32,
            3u32,
            vec![pe(c, 4, PE_PRESENT), pe(a, 10, PE_PRESENT)],
        ),
        (8, 4, vec![pe(b, 5, PE_PRESENT), pe(a, 10, PE_PRESENT)]),
    ] {
        let mut images = vec![PagemapHead { pages_id: id }.encode_to_vec()];
        images.extend(entries.iter().map(Message::encode_to_vec));
        w(&format!("pagemap-{pid}.img"), frame(Kind::Pagemap, &images));
        let mut pages = Vec::new();
        for e in &entries {
            for i in 0..nr_pages(e) {
                pages.extend(page(e.vaddr + i * PAGE));
            }
        }
        w(&format!("pages-{id}.img"), pages);
    }
    let plan = plan_of(t.path(), MIB);
    let by_pid: Vec<(u32, Vec<Deferred>)> =
        plan.iter().map(|s| (s.pid, s.deferred.clone())).collect();
    let only = |vaddr: u64, pages: u64| {
        vec![Deferred {
            vaddr,
            len: pages * PAGE,
            offset: 0,
        }]
    };
    // `a` stays with CRIU in both; each one's own area is split.
    assert_eq!(by_pid, vec![(7, only(c, 4)), (8, only(b, 5))]);
}

#[test]
fn a_stopped_task_queued_signals_or_a_shared_pages_file_leave_the_restore_to_criu() {
    let t = tempfile::tempdir().unwrap();
    let a = 0x7f00_0000_0000u64;
    let setup = |c: CoreEntry| {
        checkpoint(
            t.path(),
            vec![anon(a, a + 2 * MIB)],
            &[pe(a, 10, PE_PRESENT)],
        );
        std::fs::write(
            t.path().join("core-7.img"),
            forge::image_of(Kind::Core, &[c]),
        )
        .unwrap();
    };
    setup(core(STACK));
    assert_eq!(plan_of(t.path(), MIB).len(), 1);
    let mut stopped = core(STACK);
    stopped.tc.as_mut().unwrap().task_state = TASK_STOPPED;
    setup(stopped);
    assert!(plan_of(t.path(), MIB).is_empty());
    let mut queued = core(STACK);
    queued.tc.as_mut().unwrap().signals_s = Some(crate::proto::SignalQueueEntry {
        signals: vec![crate::proto::SiginfoEntry {
            siginfo: vec![0; 128],
        }],
    });
    setup(queued);
    assert!(plan_of(t.path(), MIB).is_empty());
    // A shared-memory page map naming the task's pages file.
    setup(core(STACK));
    let head = PagemapHead { pages_id: 3 }.encode_to_vec();
    std::fs::write(
        t.path().join("pagemap-shmem-9.img"),
        frame(Kind::Pagemap, &[head]),
    )
    .unwrap();
    assert!(plan_of(t.path(), MIB).is_empty());
}

#[test]
fn a_zombie_is_not_among_the_tasks_to_find_and_continue() {
    let t = tempfile::tempdir().unwrap();
    let a = 0x7f00_0000_0000u64;
    checkpoint(
        t.path(),
        vec![anon(a, a + 2 * MIB)],
        &[pe(a, 10, PE_PRESENT)],
    );
    std::fs::write(
        t.path().join("pstree.img"),
        forge::image_of(Kind::Pstree, &[task(7, 0, vec![7]), task(8, 7, vec![])]),
    )
    .unwrap();
    // CRIU dumps a zombie with no threads listed, a core (its exit code) and no memory.
    let mut zombie = core(STACK);
    zombie.tc.as_mut().unwrap().task_state = TASK_DEAD;
    std::fs::write(
        t.path().join("core-8.img"),
        forge::image_of(Kind::Core, &[zombie]),
    )
    .unwrap();
    let mut dir = ImageDir::open(t.path(), Limits::default()).unwrap();
    let plan = plan(&mut dir, MIB).unwrap();
    assert_eq!(plan.pids, vec![7]);
    assert_eq!(
        plan.tasks.iter().map(|s| s.pid).collect::<Vec<_>>(),
        vec![7]
    );
}
