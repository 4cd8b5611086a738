//! Small filesystem helpers of install and doctor: the node's own configuration files and
//! binaries, which no image names.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The file's text, `None` when it does not exist. Non-UTF-8 content is an error: every file
/// gpusnap edits is TOML or CRIU's text config.
pub fn read_optional(path: &Path) -> io::Result<Option<String>> {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not UTF-8 text", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Permission bits of an existing file.
pub fn mode_of(path: &Path) -> io::Result<Option<u32>> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m.permissions().mode() & 0o7777)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces `path` with `bytes` so that readers (containerd restarting, CRI-O reloading) see
/// either the old or the new file, never half of one: a new temporary file created with
/// `O_EXCL | O_NOFOLLOW` through a descriptor of the directory, fsync, rename inside that
/// descriptor, fsync of the directory ([`gpusnap_checkpoint::beneath::write_atomically`]), so
/// nothing planted in the directory is written through.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::os::fd::AsFd;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let root = gpusnap_checkpoint::beneath::open_root(dir)?;
    gpusnap_checkpoint::beneath::write_atomically(root.as_fd(), name, bytes, mode)
}

/// Creates `dir` and any missing parents; returns the directories that did not exist before,
/// outermost first, so they can be removed again in reverse.
pub fn create_dirs(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.as_os_str().is_empty() || d.exists() {
            break;
        }
        missing.push(d.to_path_buf());
        cur = d.parent();
    }
    missing.reverse();
    for d in &missing {
        fs::create_dir(d)?;
    }
    Ok(missing)
}

/// An executable regular file named `name` on `$PATH`, or `name` itself when it is a path.
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    gpusnap_criu_bridge::find_in_path(name, &std::env::var_os("PATH").unwrap_or_default())
}

pub fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        write_atomically(&p, b"one", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        assert_eq!(mode_of(&p).unwrap(), Some(0o600));
        write_atomically(&p, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(mode_of(&p).unwrap(), Some(0o644));
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "temporary file left behind");
    }

    #[test]
    fn create_dirs_reports_only_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        let made = create_dirs(&deep).unwrap();
        assert_eq!(
            made,
            [dir.path().join("a"), dir.path().join("a/b"), deep.clone()]
        );
        assert!(create_dirs(&deep).unwrap().is_empty());
    }

    #[test]
    fn sha256_matches_known_vector() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn read_optional_distinguishes_missing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_optional(&dir.path().join("nope")).unwrap(), None);
        fs::write(dir.path().join("bin"), [0xff, 0xfe]).unwrap();
        assert!(read_optional(&dir.path().join("bin")).is_err());
    }
}
