//! The runtime spec of a container's bundle (`<bundle>/config.json`): the one capped reader for
//! every rule of the transaction that reads it — the privilege bound, the container record,
//! the container's configuration, CRIU's config annotation, the cgroup path. Each parses what
//! it needs of the bytes; none reads the file another way.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The largest `config.json` read. Real specs are a few KiB (a CRI spec with many mounts
/// and a seccomp profile stays under 100 KiB).
pub const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Why a bundle's spec could not be read; the callers name the path in their own words.
#[derive(Debug, thiserror::Error)]
pub enum SpecReadError {
    #[error("{0}")]
    Unreadable(#[source] io::Error),
    #[error("larger than {MAX_SPEC_BYTES} bytes")]
    TooLarge,
}

/// `<bundle>/config.json`.
pub fn path(bundle: &Path) -> PathBuf {
    bundle.join("config.json")
}

/// The bytes of `<bundle>/config.json`, at most [`MAX_SPEC_BYTES`] of them.
pub fn read_bytes(bundle: &Path) -> Result<Vec<u8>, SpecReadError> {
    let file = std::fs::File::open(path(bundle)).map_err(SpecReadError::Unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(SpecReadError::Unreadable)?;
    if bytes.len() as u64 > MAX_SPEC_BYTES {
        return Err(SpecReadError::TooLarge);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_read_whole_up_to_the_cap_and_refused_past_it() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_bytes(d.path()),
            Err(SpecReadError::Unreadable(_))
        ));
        std::fs::write(path(d.path()), b"{\"ociVersion\":\"1.0.2\"}").unwrap();
        assert_eq!(read_bytes(d.path()).unwrap(), b"{\"ociVersion\":\"1.0.2\"}");
        let f = std::fs::File::create(path(d.path())).unwrap();
        f.set_len(MAX_SPEC_BYTES + 1).unwrap();
        assert!(matches!(read_bytes(d.path()), Err(SpecReadError::TooLarge)));
    }
}
