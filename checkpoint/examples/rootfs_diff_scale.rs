//! Measures the rootfs-diff check and application as the entry count grows (issue 28, finding
//! 5: the check was quadratic).
//!
//! `cargo run --release -p gpusnap-checkpoint --example rootfs_diff_scale -- [ENTRIES...]`
//!
//! For each count (default 5000 40000 200000) writes a gzip'd diff of that many empty files,
//! 1,000 per directory (the shape of a writable layer holding a package cache or a dataset
//! unpacked by the workload), into a temporary directory, then prints how long
//! [`rootfs_diff::check`] takes on its own and how long [`rootfs_diff::apply`] (check, then
//! apply) takes into a fresh rootfs beside it. Figures only: nothing is asserted.

use std::io::Write;
use std::os::fd::AsFd;
use std::time::Instant;

use gpusnap_checkpoint::{beneath, rootfs_diff};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let counts: Vec<u64> = match std::env::args().skip(1).map(|a| a.parse()).collect() {
        Ok(v) if !Vec::<u64>::is_empty(&v) => v,
        Ok(_) => vec![5_000, 40_000, 200_000],
        Err(e) => return Err(format!("ENTRIES must be numbers: {e}").into()),
    };
    println!("entries  diff_bytes  inflated_bytes  check_s  apply_s (check + apply)");
    for n in counts {
        let work = tempfile::tempdir()?;
        let diff = work.path().join("rootfs-diff.tar");
        let inflated = write_diff(&diff, n)?;
        let rootfs = work.path().join("rootfs");
        std::fs::create_dir(&rootfs)?;
        let limits = rootfs_diff::Limits {
            max_entries: n + 1_000,
            ..Default::default()
        };
        let root = beneath::open_root(&rootfs)?;
        let t = Instant::now();
        rootfs_diff::check(&diff, root.as_fd(), limits)?;
        let check = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let applied = rootfs_diff::apply(&diff, &rootfs, limits)?;
        let apply = t.elapsed().as_secs_f64();
        assert_eq!(applied.entries, n + n.div_ceil(1000), "every entry applied");
        println!(
            "{n:>7}  {:>10}  {inflated:>14}  {check:>7.2}  {apply:>7.2}",
            std::fs::metadata(&diff)?.len()
        );
    }
    Ok(())
}

/// A gzip'd tar of `n` empty files, 1,000 per directory, each directory's entry first.
/// Returns the tar's size before compression.
fn write_diff(path: &std::path::Path, n: u64) -> std::io::Result<u64> {
    let gz =
        flate2::write::GzEncoder::new(std::fs::File::create(path)?, flate2::Compression::fast());
    let mut b = tar::Builder::new(Counted { inner: gz, n: 0 });
    let header = |kind: tar::EntryType, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_000_000_000);
        h
    };
    for i in 0..n {
        if i % 1000 == 0 {
            let mut h = header(tar::EntryType::Directory, 0o755);
            b.append_data(&mut h, format!("data/d{}/", i / 1000), std::io::empty())?;
        }
        let mut h = header(tar::EntryType::Regular, 0o644);
        b.append_data(&mut h, format!("data/d{}/f{i}", i / 1000), std::io::empty())?;
    }
    let mut counted = b.into_inner()?;
    counted.flush()?;
    counted.inner.finish()?;
    Ok(counted.n)
}

/// A writer that counts what passes.
struct Counted<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
