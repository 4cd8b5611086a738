//! The pending CUDA resume kept between calls, and brought back before the next checkpoint.
//!
//! A checkpoint of a container its caller froze leaves the container's CUDA processes
//! checkpointed ([`PendingCudaResume`]) until the caller thaws it. A door whose process lives
//! until then (the shim) keeps the value; one that exits in between (gpusnap-runc) saves it in
//! its record directory ([`PendingCudaResume::save`]) and its resume loads it back
//! ([`PendingCudaResume::load`]), removing it ([`PendingCudaResume::clear`]) once the processes
//! were resumed. A new checkpoint of the still-frozen container brings the
//! processes back first, on every door ([`crate::checkpoint::checkpoint_resuming`], once its
//! in-flight record is written): the driver
//! cannot lock a process that is checkpointed already, and a second record would replace the
//! first, leaving its processes checkpointed for good. gpusnap-runc holds one lock on runc's
//! state directory of the container around its checkpoint and its `resume` (a resume waits for
//! a running checkpoint, [`crate::lock::DirLock::exclusive_waiting`]), so the two never both
//! bring the same processes back; the shim's operations on a container are serialized anyway.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::{beneath, layout};
use gpusnap_config::Config;
use gpusnap_cuda::orchestrate::ProcessRecord;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::gpu::{PendingCudaResume, ResumeError};
use crate::host::Runc;

/// The record's name in a door's record directory (gpusnap-runc: runc's state directory of the
/// container, which `runc delete` removes with the container).
pub const PENDING_CUDA_FILE: &str = "gpusnap-pending-cuda.json";
/// A record lists a few CUDA processes: kilobytes.
const PENDING_MAX_BYTES: u64 = 16 << 20;

/// Why a pending resume could not be kept or taken back.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("cannot record the CUDA processes left checkpointed in {}: {source}", path.display())]
    Save {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the CUDA processes left checkpointed from {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: layout::CappedReadError,
    },
    /// The driver, needed to resume the recorded processes, cannot be loaded.
    #[error("{0}")]
    Driver(#[source] Error),
}

/// What is saved: enough to load the driver again and resume the same processes.
#[derive(Serialize, Deserialize)]
struct Saved {
    memory_restored: bool,
    records: Vec<ProcessRecord>,
}

impl PendingCudaResume {
    /// Saves the processes in `dir` (created new beneath it, 0600, then renamed over any old
    /// record), for a later [`Self::take`] by another process.
    pub fn save(&self, dir: &Path) -> Result<(), PendingError> {
        let failed = |source| PendingError::Save {
            path: dir.join(PENDING_CUDA_FILE),
            source,
        };
        let json = serde_json::to_vec(&Saved {
            memory_restored: self.memory_restored(),
            records: self.records().to_vec(),
        })
        .map_err(|e| failed(io::Error::other(e)))?;
        let root = beneath::open_root(dir).map_err(failed)?;
        beneath::write_atomically(root.as_fd(), OsStr::new(PENDING_CUDA_FILE), &json, 0o600)
            .map_err(failed)
    }

    /// Whether `dir` holds a saved record.
    pub fn saved_in(dir: &Path) -> bool {
        beneath::open_root(dir).is_ok_and(|root| {
            matches!(
                beneath::stat_at(root.as_fd(), OsStr::new(PENDING_CUDA_FILE)),
                Ok(Some(_))
            )
        })
    }

    /// The record saved in `dir`, with the driver loaded again; `None` when there is none. The
    /// record stays until [`Self::clear`]: a resume that fails (a thaw refused, a driver that
    /// cannot load) leaves it for the next try rather than losing the processes it names.
    pub fn load(config: &Config, dir: &Path) -> Result<Option<Self>, PendingError> {
        let path = dir.join(PENDING_CUDA_FILE);
        let Ok(root) = beneath::open_root(dir) else {
            return Ok(None);
        };
        let saved = match layout::read_json_capped::<Saved>(
            root.as_fd(),
            PENDING_CUDA_FILE,
            PENDING_MAX_BYTES,
        ) {
            Err(layout::CappedReadError::Missing) => return Ok(None),
            other => other.map_err(|source| PendingError::Read { path, source })?,
        };
        Self::from_records(config, saved.records, saved.memory_restored)
            .map(Some)
            .map_err(PendingError::Driver)
    }

    /// Removes the record saved in `dir` (beneath it), once its processes were resumed.
    pub fn clear(dir: &Path) {
        if let Ok(root) = beneath::open_root(dir) {
            let _ = beneath::unlink_at(root.as_fd(), OsStr::new(PENDING_CUDA_FILE));
        }
    }

    /// Before a new checkpoint of the container, still frozen since the checkpoint that left
    /// these processes checkpointed: thaws it (the driver needs them running), restores and
    /// unlocks them, and freezes it again, as the new checkpoint's caller handed it over.
    pub fn resume_frozen(self, runc: &Runc<'_>) -> Result<(), ResumeError> {
        thawed(runc, || self.resume())
    }
}

/// Runs `work` on the frozen container's processes with the container thawed (the driver works
/// inside them), freezing it again whether or not `work` succeeded.
pub(crate) fn thawed<T>(
    runc: &Runc<'_>,
    work: impl FnOnce() -> Result<T, ResumeError>,
) -> Result<T, ResumeError> {
    runc.resume().map_err(ResumeError::Thaw)?;
    let done = work();
    let refrozen = runc.pause().map_err(ResumeError::Refreeze);
    let value = done?;
    refrozen?;
    Ok(value)
}
