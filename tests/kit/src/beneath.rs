//! Proof that a file outside an untrusted tree was never read (issue 20, "one way to touch an
//! untrusted tree"): a symlink inside a hostile layout or checkpoint points at an [`Unread`]
//! file, and the test asserts gpusnap neither read nor changed it.
//!
//! Reading a file updates its access time on `relatime` mounts when the old one is more than a
//! day in the past, so the file's atime is set to 2001 and must still be 2001 afterwards.
//! [`Unread::new`] first proves the file system records reads that way (a control file is read
//! and its atime must move); on a `noatime` mount it fails instead of passing vacuously.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

/// 2001-01-01T00:00:00Z: long before any read this test could make.
const OLD_ATIME: i64 = 978_307_200;

/// A file that must stay unread and unchanged.
pub struct Unread {
    path: PathBuf,
    content: Vec<u8>,
}

fn set_old_atime(path: &Path) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let times = [
        libc::timespec {
            tv_sec: OLD_ATIME as libc::time_t,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: a valid NUL-terminated path and two timespecs, as utimensat(2) takes.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    ensure!(
        rc == 0,
        "utimensat {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    Ok(())
}

impl Unread {
    /// Writes `content` at `path` (outside every tree a test hands gpusnap) with an old atime.
    pub fn new(path: &Path, content: &[u8]) -> Result<Unread> {
        let dir = path.parent().context("a file in a directory")?;
        let control = dir.join(".atime-control");
        fs::write(&control, b"control")?;
        set_old_atime(&control)?;
        fs::read(&control)?;
        let moved = fs::metadata(&control)?.atime() != OLD_ATIME;
        fs::remove_file(&control)?;
        if !moved {
            bail!(
                "{} does not record reads in the access time (noatime?): an unread check \
                 there could not fail",
                dir.display()
            );
        }
        fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
        set_old_atime(path)?;
        Ok(Unread {
            path: path.to_path_buf(),
            content: content.to_vec(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fails unless the file is exactly as written and its access time never moved.
    pub fn check(&self) -> Result<()> {
        let meta = fs::symlink_metadata(&self.path)?;
        // Checked before reading it back, which moves the atime itself.
        let atime = meta.atime();
        ensure!(
            atime == OLD_ATIME,
            "{} was read (atime {atime})",
            self.path.display()
        );
        let now = fs::read(&self.path)?;
        set_old_atime(&self.path)?;
        ensure!(now == self.content, "{} was changed", self.path.display());
        Ok(())
    }
}
