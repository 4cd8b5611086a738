//! Measures checkpoint sealing (inventory hashing) and restore validation throughput.
//!
//! `cargo run --release -p gpusnap-checkpoint --example digest_bench -- [DIR] [MIB] [FILES]`
//!
//! Writes FILES files totalling MIB MiB into DIR (default: a temp dir) shaped like a CRIU dump:
//! one large `pages-1.img` holding most of the bytes plus small images, then times
//! `seal_checkpoint` and `validate_for_restore` with the files hot in the page cache, which is
//! the state right after CRIU wrote them.

use std::path::PathBuf;
use std::time::Instant;

use gpusnap_checkpoint::{
    seal_checkpoint, validate_for_restore, validate_for_restore_with, Manifest, ValidateOptions,
};
use gpusnap_criu_bridge::CriuFlags;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let tmp;
    let dir = match args.next() {
        Some(d) => PathBuf::from(d),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let mib: u64 = args.next().map_or(Ok(512), |s| s.parse())?;
    let files: u64 = args.next().map_or(Ok(200), |s| s.parse())?;
    std::fs::create_dir_all(&dir)?;

    // 90% in one page image (the single-process worst case), the rest spread out.
    let total = mib << 20;
    let big = total / 10 * 9;
    let small = (total - big) / (files - 1).max(1);
    let mut block = vec![0u8; 1 << 20];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    let write = |name: String, size: u64| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.join(name))?;
        let mut left = size;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            f.write_all(&block[..n])?;
            left -= n as u64;
        }
        Ok(())
    };
    write("pages-1.img".into(), big)?;
    for i in 1..files {
        write(format!("core-{i}.img"), small)?;
    }

    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let t = Instant::now();
    let m = seal_checkpoint(&dir, Manifest::new("bench", CriuFlags::default()))?;
    let seal = t.elapsed().as_secs_f64();
    let t = Instant::now();
    validate_for_restore(&dir)?;
    let full = t.elapsed().as_secs_f64();
    let t = Instant::now();
    validate_for_restore_with(
        &dir,
        ValidateOptions {
            verify_digests: false,
        },
    )?;
    let sizes = t.elapsed().as_secs_f64();
    let mb = m.images.total_bytes as f64 / (1 << 20) as f64;
    println!(
        "{} files, {mb:.0} MiB, {threads} threads: seal {seal:.3}s ({:.0} MiB/s), \
         validate {full:.3}s ({:.0} MiB/s), sizes-only validate {:.1} ms",
        m.images.files.len(),
        mb / seal,
        mb / full,
        sizes * 1e3
    );
    Ok(())
}
