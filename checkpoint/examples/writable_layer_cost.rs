//! What recording and checking a container's writable layer costs (`writable_layer`): the
//! seal's record (describe the overlay's upper layer against the image below, write the
//! listing) and the restore's check (read the listing back, describe the restored layer,
//! compare), on an overlay shaped like a container that wrote `FILES` files of `MIB` MiB in all
//! over an image of `IMAGE_FILES` files.
//!
//! ```text
//! sudo cargo run -p gpusnap-checkpoint --release --example writable_layer_cost [FILES MIB IMAGE_FILES ROUNDS]
//! ```
//!
//! Defaults: 10000 files, 100 MiB, 20000 image files, 7 rounds. Root is needed (it mounts an
//! overlay under $TMPDIR). The rounds alternate seal and restore on a warm page cache, as a
//! node that just wrote the layer (seal) or just applied it (restore) has it; the medians are
//! printed, not asserted.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use gpusnap_checkpoint::writable_layer::{self as layer, Overlay};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn fill(dir: &Path, files: usize, bytes_each: usize, seed: u8) {
    for i in 0..files {
        let d = dir.join(format!("d{:03}", i % 100));
        fs::create_dir_all(&d).unwrap();
        let mut data = vec![seed; bytes_each];
        data[..8].copy_from_slice(&(i as u64).to_le_bytes());
        fs::write(d.join(format!("f{i:06}")), data).unwrap();
    }
}

fn main() {
    let files = arg(1, 10_000);
    let mib = arg(2, 100);
    let image_files = arg(3, 20_000);
    let rounds = arg(4, 7).max(1);
    let top = tempfile::tempdir().unwrap();
    let p = top.path();
    for d in ["lower", "upper", "work", "merged", "ck"] {
        fs::create_dir(p.join(d)).unwrap();
    }
    // The image: small files (a distribution's /usr), in the same directories the container
    // writes to, so copy-ups and the lower view's listings are exercised.
    fill(&p.join("lower/usr"), image_files, 2048, 1);
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        p.join("lower").display(),
        p.join("upper").display(),
        p.join("work").display()
    );
    let merged = p.join("merged");
    rustix::mount::mount(
        "overlay",
        &merged,
        "overlay",
        rustix::mount::MountFlags::empty(),
        Some(std::ffi::CString::new(opts).unwrap().as_c_str()),
    )
    .expect("mounting an overlay (run as root)");
    // The container's writes: new files, some image files rewritten, some removed.
    fill(
        &merged.join("data"),
        files,
        mib * (1 << 20) / files.max(1),
        2,
    );
    for i in (0..image_files).step_by(50) {
        let f = merged.join(format!("usr/d{:03}/f{i:06}", i % 100));
        if i % 100 == 0 {
            fs::remove_file(f).unwrap();
        } else {
            fs::write(f, b"rewritten").unwrap();
        }
    }

    let ov = Overlay::locate(&merged).unwrap();
    let mut seal = Vec::new();
    let mut restore = Vec::new();
    let mut entries = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let recorded = layer::describe_for_seal(&ov, &[], None).unwrap();
        let record = layer::write_listing(&p.join("ck"), &recorded).unwrap();
        seal.push(t.elapsed());
        entries = recorded.len();

        let t = Instant::now();
        let dir = gpusnap_checkpoint::beneath::open_root(&p.join("ck")).unwrap();
        let signed =
            layer::read_listing(std::os::fd::AsFd::as_fd(&dir), &p.join("ck"), &record, None)
                .unwrap();
        let found = layer::describe(&ov).unwrap();
        layer::compare(&signed, &found).unwrap();
        restore.push(t.elapsed());
    }
    let listing = fs::metadata(p.join("ck").join(gpusnap_checkpoint::layout::LISTING_FILE))
        .unwrap()
        .len();
    let _ = rustix::mount::unmount(&merged, rustix::mount::UnmountFlags::DETACH);
    println!(
        "writable layer: {files} files, {mib} MiB written over {image_files} image files; \
         {entries} entries recorded, listing {listing} bytes"
    );
    println!(
        "seal (describe + listing), median of {rounds}: {:.0} ms  (all: {:?})",
        median(seal.clone()).as_secs_f64() * 1e3,
        seal.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
    );
    println!(
        "restore (listing + describe + compare), median of {rounds}: {:.0} ms  (all: {:?})",
        median(restore.clone()).as_secs_f64() * 1e3,
        restore.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
    );
}
