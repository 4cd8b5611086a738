//! Rootfs diffs of a chosen size for the scale test and the benchmark of the door that applies
//! them (`gpusnap.io/restore-from` of a CRI-archive-layout checkpoint).

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::Result;

/// Writes a gzip'd diff of `files` empty files under `data/`, `per_dir` to a directory, each
/// directory's entry first (the shape of a writable layer that unpacked a dataset): entries
/// `data/d<i / per_dir>/` and `data/d<i / per_dir>/f<i>`. Returns the number of tar entries
/// (files and directories).
pub fn write_empty_files(path: &Path, files: u64, per_dir: u64) -> Result<u64> {
    let per_dir = per_dir.max(1);
    let gz = flate2::write::GzEncoder::new(fs::File::create(path)?, flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    let header = |kind: tar::EntryType, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_772_359_300);
        h
    };
    let mut entries = 0;
    for i in 0..files {
        if i % per_dir == 0 {
            let mut h = header(tar::EntryType::Directory, 0o755);
            b.append_data(&mut h, format!("data/d{}/", i / per_dir), std::io::empty())?;
            entries += 1;
        }
        let mut h = header(tar::EntryType::Regular, 0o644);
        b.append_data(
            &mut h,
            format!("data/d{}/f{i}", i / per_dir),
            std::io::empty(),
        )?;
        entries += 1;
    }
    b.into_inner()?.finish()?.flush()?;
    Ok(entries)
}
