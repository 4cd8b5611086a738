//! Prints what the page fill would do with a checkpoint: each task's memory areas of 1 MiB or
//! more (as CRIU recorded them) and the split `page_split::plan` makes of them.
//!
//! `cargo run -p gpusnap-criu-images --example split_plan -- DIR [MIN_BYTES]`, where DIR holds
//! the checkpoint's `pstree.img`, `core-*.img`, `mm-*.img` and `pagemap-*.img` (the page images
//! themselves are not needed; the GPU harness keeps these as `va-criu-images.tar.gz`) and
//! MIN_BYTES is `restore.page_fill_min_bytes` (default 16 MiB).

use std::error::Error;
use std::path::PathBuf;

use gpusnap_criu_images::page_split;
use gpusnap_criu_images::proto::{MmEntry, PstreeEntry};
use gpusnap_criu_images::{ImageDir, Kind, Limits};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: split_plan DIR [MIN_BYTES]")?);
    let min: u64 = match args.next() {
        Some(n) => n.parse()?,
        None => 16 << 20,
    };
    let mut images = ImageDir::open(&dir, Limits::default())?;
    let tasks = images
        .read::<PstreeEntry>("pstree.img", Kind::Pstree)?
        .unwrap_or_default();
    for t in &tasks {
        println!("task {} (parent {}, threads {:?})", t.pid, t.ppid, t.threads);
        let mm = images.read_one::<MmEntry>(&format!("mm-{}.img", t.pid), Kind::Mm)?;
        for v in mm.iter().flat_map(|m| &m.vmas) {
            if v.end.saturating_sub(v.start) >= 1 << 20 {
                println!(
                    "  {:#x}-{:#x} {:>9} KiB status {:#x} prot {:#x} flags {:#x}",
                    v.start,
                    v.end,
                    (v.end - v.start) >> 10,
                    v.status,
                    v.prot,
                    v.flags
                );
            }
        }
    }
    let plan = page_split::plan(&mut images, min)?;
    for t in &plan.tasks {
        println!(
            "split: task {} writes {} bytes itself; CRIU keeps {} range(s) of pages-{}.img",
            t.pid,
            t.deferred_bytes(),
            t.kept.len(),
            t.pages_id
        );
    }
    println!(
        "{} task(s) split; {} task(s) to continue",
        plan.tasks.len(),
        plan.pids.len()
    );
    Ok(())
}
