//! A durable record of a checkpoint or restore in progress, so that whoever comes after a
//! runtime killed in the middle (containerd's `shim delete`, the next `gpusnap-runc` call for
//! the container) can put things back: after a checkpoint, the unsealed images removed and the
//! cgroup thawed or frozen as the caller had it; after a restore, the orphaned `runc restore`,
//! its CRIU and what they restored killed, and runc's state of the id removed.
//!
//! The front end writes it (in its own directory for the container: the shim's bundle, runc's
//! state directory for gpusnap-runc) before the transaction and removes it after, whatever the
//! result. A record whose writer is still alive belongs to a checkpoint in progress and is left
//! alone.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint as dir;
use serde::{Deserialize, Serialize};

use crate::runc::Runc;

/// The record's file name in the front end's directory for the container.
pub const INFLIGHT_FILE: &str = "gpusnap-checkpoint-inflight.json";
/// The most a record may hold (it is a few hundred bytes).
const MAX_BYTES: u64 = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    pub container_id: String,
    pub image_dir: PathBuf,
    /// The checkpoint created `image_dir`: an unsealed one is removed whole.
    pub created_dir: bool,
    /// The caller had frozen the container: it stays frozen.
    pub frozen_by_caller: bool,
    pub init_pid: u32,
    /// The process running the checkpoint, and its start time (pid reuse).
    pub writer_pid: u32,
    pub writer_start: Option<u64>,
}

/// What [`InFlight::repair`] did.
#[derive(Debug, Default)]
pub struct Repaired {
    /// The images were unsealed and removed (scrubbed, or the directory removed whole).
    pub removed_images: bool,
    /// The container's cgroup was put back as the caller had it.
    pub freezer_settled: bool,
}

/// Removes the record when dropped.
#[derive(Debug)]
pub struct InFlightGuard {
    path: PathBuf,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl InFlight {
    /// A record of a checkpoint of `container_id` into `image_dir`, written by this process.
    pub fn new(
        container_id: &str,
        image_dir: &Path,
        frozen_by_caller: bool,
        init_pid: u32,
    ) -> Self {
        let me = std::process::id();
        InFlight {
            container_id: container_id.to_owned(),
            image_dir: image_dir.to_path_buf(),
            created_dir: std::fs::symlink_metadata(image_dir).is_err(),
            frozen_by_caller,
            init_pid,
            writer_pid: me,
            writer_start: crate::watchdog::start_time(me),
        }
    }

    /// Writes the record durably to `<dir>/`[`INFLIGHT_FILE`]; it is removed when the guard
    /// drops.
    pub fn write(&self, dir: &Path) -> io::Result<InFlightGuard> {
        write_record(self, &dir.join(INFLIGHT_FILE))
    }

    /// The record in `dir`, if there is a readable one.
    pub fn read(dir: &Path) -> Option<InFlight> {
        read_record(&dir.join(INFLIGHT_FILE))
    }

    /// Whether the process that wrote the record still runs (its checkpoint is in progress).
    pub fn writer_alive(&self) -> bool {
        alive(self.writer_pid, self.writer_start)
    }

    /// Puts back what the interrupted checkpoint left: removes its images unless they were
    /// sealed, and, while the container's init lives, freezes or thaws its cgroup as the caller
    /// had it. Removes the record from `dir`.
    pub fn repair(&self, dir: &Path, runc: Option<&Runc<'_>>) -> Repaired {
        let mut repaired = Repaired::default();
        // The dump of a killed runtime's runc may still be running: it must not write after
        // the images are removed.
        crate::leftovers::kill_criu_writing(&self.image_dir);
        let sealed = self.image_dir.join(dir::layout::MANIFEST_FILE).is_file();
        if !sealed && self.image_dir.is_dir() {
            let removed = if self.created_dir {
                std::fs::remove_dir_all(&self.image_dir).map_err(|e| e.to_string())
            } else {
                dir::scrub_incomplete(&self.image_dir)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            };
            match removed {
                Ok(()) => repaired.removed_images = true,
                Err(e) => {
                    tracing::error!(dir = %self.image_dir.display(), error = %e, "cannot remove an interrupted checkpoint's images")
                }
            }
        }
        if let Some(runc) = runc {
            if crate::cgroup::frozen(self.init_pid).is_some_and(|f| f != self.frozen_by_caller) {
                crate::checkpoint::settle_freezer(runc, self.init_pid, self.frozen_by_caller);
                repaired.freezer_settled = true;
            }
        }
        let _ = std::fs::remove_file(dir.join(INFLIGHT_FILE));
        tracing::warn!(
            id = %self.container_id,
            dir = %self.image_dir.display(),
            sealed,
            removed_images = repaired.removed_images,
            freezer_settled = repaired.freezer_settled,
            "repaired after a checkpoint whose runtime was killed"
        );
        repaired
    }
}

/// Writes `record` to `path` durably (temp file, fsync, rename, directory fsync).
fn write_record<T: Serialize>(record: &T, path: &Path) -> io::Result<InFlightGuard> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(record).map_err(io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(InFlightGuard {
        path: path.to_path_buf(),
    })
}

/// The record at `path`, when it is a regular file of at most [`MAX_BYTES`] that parses.
fn read_record<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_BYTES {
        return None;
    }
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Whether process `pid` still runs and is the one that started at `start` (pid reuse).
fn alive(pid: u32, start: Option<u64>) -> bool {
    !crate::watchdog::is_zombie(pid)
        && crate::watchdog::start_time(pid).is_some_and(|t| start.is_none_or(|s| s == t))
}

/// The file name of the record of a restore of `container_id` (several containers' restores
/// may share a front end's scratch directory).
pub fn restore_record_name(container_id: &str) -> String {
    format!("gpusnap-restore-inflight.{container_id}.json")
}

/// A restore in progress: `runc restore` has been started by `writer`. A runtime killed
/// before `runc restore` returned leaves runc and CRIU orphaned (a stalled CRIU then holds the
/// half-restored tree, with CRIU's capabilities, for good: the deadline's watch died with the
/// runtime), or a container that runs while its caller was told the restore failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreInFlight {
    pub container_id: String,
    /// The bundle of the container being restored (its spec names the cgroup).
    pub bundle: PathBuf,
    pub writer_pid: u32,
    pub writer_start: Option<u64>,
    /// The `runc restore` process, and its start time.
    pub runc_pid: u32,
    pub runc_start: Option<u64>,
}

impl RestoreInFlight {
    /// A record of the `runc restore` running as `runc_pid` for this process.
    pub fn new(container_id: &str, bundle: &Path, runc_pid: u32) -> Self {
        let me = std::process::id();
        RestoreInFlight {
            container_id: container_id.to_owned(),
            bundle: bundle.to_path_buf(),
            writer_pid: me,
            writer_start: crate::watchdog::start_time(me),
            runc_pid,
            runc_start: crate::watchdog::start_time(runc_pid),
        }
    }

    /// Writes the record durably into `dir` (the front end's scratch directory); it is removed
    /// when the guard drops.
    pub fn write(&self, dir: &Path) -> io::Result<InFlightGuard> {
        write_record(self, &dir.join(restore_record_name(&self.container_id)))
    }

    /// The record of a restore of `container_id` in `dir`, if there is a readable one.
    pub fn read(dir: &Path, container_id: &str) -> Option<RestoreInFlight> {
        read_record(&dir.join(restore_record_name(container_id)))
            .filter(|r: &RestoreInFlight| r.container_id == container_id)
    }

    /// Whether the process that wrote the record still runs (its restore is in progress).
    pub fn writer_alive(&self) -> bool {
        alive(self.writer_pid, self.writer_start)
    }

    /// Ends what the interrupted restore left: the orphaned `runc restore` and everything below
    /// it (CRIU, the tree CRIU forked), then, as after any failed restore, every process in the
    /// container's cgroup, the cgroup and runc's state of the id (a container CRIU finished
    /// restoring after its runtime died was never reported to the caller). Removes the record
    /// from `dir`.
    pub fn repair(&self, dir: &Path, runc: &Runc<'_>) -> crate::leftovers::Cleared {
        let orphans = if alive(self.runc_pid, self.runc_start) {
            crate::watchdog::kill_tree(self.runc_pid)
        } else {
            0
        };
        let cleared = crate::leftovers::clear_failed_restore(runc, &self.bundle, None);
        let _ = std::fs::remove_file(dir.join(restore_record_name(&self.container_id)));
        tracing::warn!(
            id = %self.container_id,
            runc_and_criu_killed = orphans,
            restored_killed = cleared.killed,
            left = cleared.remaining.len(),
            "repaired after a restore whose runtime was killed"
        );
        cleared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_checkpoint_is_removed_and_a_sealed_one_kept() {
        let work = tempfile::tempdir().unwrap();
        let images = work.path().join("cp");
        let rec = InFlight::new("c1", &images, false, 0);
        assert!(rec.created_dir);
        let guard = rec.write(work.path()).unwrap();
        assert_eq!(InFlight::read(work.path()).unwrap(), rec);
        assert!(rec.writer_alive(), "this process wrote it");
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("pages-1.img"), b"x").unwrap();
        let dead = InFlight {
            writer_pid: u32::MAX,
            ..rec.clone()
        };
        assert!(!dead.writer_alive());
        assert!(dead.repair(work.path(), None).removed_images);
        assert!(!images.exists());
        assert!(InFlight::read(work.path()).is_none());
        drop(guard);

        // A directory the caller made is scrubbed, not removed; a sealed one is left.
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("pages-1.img"), b"x").unwrap();
        std::fs::write(images.join("dump.log"), b"log").unwrap();
        let rec = InFlight::new("c1", &images, false, 0);
        assert!(!rec.created_dir);
        rec.repair(work.path(), None);
        assert!(!images.join("pages-1.img").exists());
        assert!(images.join("dump.log").exists());
        std::fs::write(images.join("pages-1.img"), b"x").unwrap();
        std::fs::write(images.join(dir::layout::MANIFEST_FILE), b"{}").unwrap();
        assert!(!rec.repair(work.path(), None).removed_images);
        assert!(images.join("pages-1.img").exists());
    }
}
