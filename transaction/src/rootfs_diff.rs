//! Applying a checkpoint's rootfs diff (`rootfs-diff.tar` of a CRI checkpoint archive: the
//! container's writable-layer changes, gzip-compressed despite the name) onto a fresh rootfs
//! before CRIU restores processes that expect those files.
//!
//! The diff is an overlay-style layer: a `.wh.NAME` entry deletes `NAME`, and a
//! `.wh..wh..opq` entry empties its directory before the layer's own entries land there.

use std::{
    fs::File,
    io::{BufReader, Read, Seek, SeekFrom},
    path::{Component, Path, PathBuf},
};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Unpacks `diff` into `rootfs`. Returns how many entries were applied.
pub fn apply(diff: &Path, rootfs: &Path) -> Result<usize, String> {
    let mut file = File::open(diff).map_err(|e| format!("open {}: {e}", diff.display()))?;
    let mut magic = [0u8; 2];
    let gzip = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    file.seek(SeekFrom::Start(0))
        .map_err(|e| format!("read {}: {e}", diff.display()))?;
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(true);
    archive.set_overwrite(true);
    let mut applied = 0;
    let entries = archive
        .entries()
        .map_err(|e| format!("read {}: {e}", diff.display()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("read {}: {e}", diff.display()))?;
        let rel = entry
            .path()
            .map_err(|e| format!("bad path in {}: {e}", diff.display()))?
            .into_owned();
        let rel = safe_relative(&rel).ok_or_else(|| {
            format!(
                "{} has an entry outside the rootfs: {}",
                diff.display(),
                rel.display()
            )
        })?;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = rootfs.join(rel.parent().unwrap_or(Path::new("")));
        if name == OPAQUE {
            if let Ok(children) = std::fs::read_dir(&parent) {
                for child in children.flatten() {
                    remove(&child.path());
                }
            }
        } else if let Some(target) = name.strip_prefix(WHITEOUT_PREFIX) {
            remove(&parent.join(target));
        } else {
            entry
                .unpack_in(rootfs)
                .map_err(|e| format!("unpack {} into {}: {e}", rel.display(), rootfs.display()))?;
        }
        applied += 1;
    }
    Ok(applied)
}

fn remove(path: &Path) {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    };
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "whiteout could not remove a file");
    }
}

/// The path without leading `/` or `./`, or `None` if it climbs out with `..`.
fn safe_relative(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(entries: &[(&str, Option<&[u8]>)], gzip: bool) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let out: Box<dyn std::io::Write> = if gzip {
            Box::new(flate2::write::GzEncoder::new(
                file.reopen().unwrap(),
                flate2::Compression::fast(),
            ))
        } else {
            Box::new(file.reopen().unwrap())
        };
        let mut b = tar::Builder::new(out);
        for (path, data) in entries {
            let mut h = tar::Header::new_gnu();
            match data {
                Some(d) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(d.len() as u64);
                    h.set_mode(0o644);
                    b.append_data(&mut h, path, *d).unwrap();
                }
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    h.set_mode(0o755);
                    b.append_data(&mut h, path, std::io::empty()).unwrap();
                }
            }
        }
        b.into_inner().unwrap().flush().unwrap();
        file
    }

    #[test]
    fn files_whiteouts_and_opaque_dirs_are_applied() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("etc/old")).unwrap();
        std::fs::write(r.join("etc/old/a"), b"a").unwrap();
        std::fs::write(r.join("etc/gone"), b"x").unwrap();
        std::fs::write(r.join("etc/kept"), b"k").unwrap();
        let diff = layer(
            &[
                ("etc/", None),
                ("etc/.wh.gone", Some(b"")),
                ("etc/old/", None),
                ("etc/old/.wh..wh..opq", Some(b"")),
                ("etc/old/b", Some(b"new")),
                ("data/", None),
                ("data/count", Some(b"42\n")),
            ],
            true,
        );
        assert_eq!(apply(diff.path(), r).unwrap(), 7);
        assert!(!r.join("etc/gone").exists(), "whiteout removed the file");
        assert_eq!(std::fs::read(r.join("etc/kept")).unwrap(), b"k");
        assert!(!r.join("etc/old/a").exists(), "opaque dir emptied");
        assert_eq!(std::fs::read(r.join("etc/old/b")).unwrap(), b"new");
        assert_eq!(std::fs::read(r.join("data/count")).unwrap(), b"42\n");
    }

    #[test]
    fn plain_tar_is_accepted_and_escapes_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let ok = layer(&[("f", Some(b"1"))], false);
        assert_eq!(apply(ok.path(), root.path()).unwrap(), 1);
        assert!(safe_relative(Path::new("../etc/passwd")).is_none());
        assert_eq!(
            safe_relative(Path::new("./a/b")).unwrap(),
            PathBuf::from("a/b")
        );
    }
}
