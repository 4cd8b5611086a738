//! A durable record of a checkpoint or restore in progress, so that whoever comes after a
//! runtime killed in the middle (containerd's `shim delete`, gpusnap-runc's guard, the next
//! `gpusnap-runc` call for the container) can put things back: after a checkpoint, the
//! unsealed images removed and the cgroup thawed or frozen as the caller had it; after a
//! restore, the orphaned `runc restore`, its CRIU and what they restored killed, CRIU's yards
//! unmounted and removed, and runc's state of the id removed.
//!
//! The transaction writes it in the front end's own directory for the container (the request's
//! `record_dir` for a checkpoint: the shim's bundle, runc's state directory for gpusnap-runc;
//! `scratch_dir` for a restore) before anything changes and removes it after, whatever the
//! result. A record whose writer is still alive belongs to an operation in progress and is left
//! alone.

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use gpusnap_checkpoint as dir;
use gpusnap_checkpoint::beneath;
use serde::{Deserialize, Serialize};

use crate::host::Runc;

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
        read_record(dir, INFLIGHT_FILE)
    }

    /// Whether the process that wrote the record still runs (its checkpoint is in progress).
    pub fn writer_alive(&self) -> bool {
        alive(self.writer_pid, self.writer_start)
    }

    /// Puts back what the interrupted checkpoint left: removes its images unless they were
    /// sealed, and, when `init_lives` (runc knows the container by the recorded init), freezes
    /// or thaws its cgroup through runc as the caller had it. Removes the record from `dir`.
    /// The whole rule, cgroups runc no longer leads to included, is [`crate::repair`]'s.
    pub fn repair(&self, dir: &Path, runc: &Runc<'_>, init_lives: bool) -> Repaired {
        let mut repaired = Repaired::default();
        // The dump of a killed runtime's runc may still be running: it must not write after
        // the images are removed.
        runc.host().kill_criu_writing(&self.image_dir);
        // Looked at through a descriptor of the image directory, never followed.
        let sealed = beneath::open_root(&self.image_dir).is_ok_and(|fd| {
            matches!(
                beneath::stat_at(fd.as_fd(), OsStr::new(dir::layout::MANIFEST_FILE)),
                Ok(Some(st)) if st.st_mode & libc::S_IFMT == libc::S_IFREG
            )
        });
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
        if init_lives {
            let frozen = runc.host().cgroup_frozen(self.init_pid);
            if frozen.is_some_and(|f| f != self.frozen_by_caller) {
                runc.settle_freezer(self.init_pid, self.frozen_by_caller);
                repaired.freezer_settled = true;
            }
        }
        remove_beneath(dir, OsStr::new(INFLIGHT_FILE));
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

/// Writes `record` to `path` durably; it is removed when the guard drops.
fn write_record<T: Serialize>(record: &T, path: &Path) -> io::Result<InFlightGuard> {
    write_file(record, path)?;
    Ok(InFlightGuard {
        path: path.to_path_buf(),
    })
}

/// Writes `record` to `path` durably (temp file, fsync, rename, directory fsync).
pub(crate) fn write_file<T: Serialize>(record: &T, path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(record).map_err(io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// The record `name` in `dir`, when it is a regular file of at most [`MAX_BYTES`] that parses:
/// opened beneath `dir` (no symlink followed, no device opened).
fn read_record<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Option<T> {
    let root = beneath::open_root(dir).ok()?;
    dir::layout::read_json_capped(root.as_fd(), name, MAX_BYTES).ok()
}

/// Whether `dir` holds an entry `name` (of any type: never followed).
pub(crate) fn exists_beneath(dir: &Path, name: &OsStr) -> bool {
    beneath::open_root(dir)
        .is_ok_and(|fd| matches!(beneath::stat_at(fd.as_fd(), name), Ok(Some(_))))
}

/// Removes the entry `name` of `dir` through a descriptor of `dir` (a symlink is removed, never
/// followed).
pub(crate) fn remove_beneath(dir: &Path, name: &OsStr) {
    if let Ok(fd) = beneath::open_root(dir) {
        let _ = beneath::unlink_at(fd.as_fd(), name);
    }
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

/// The container ids of the restore records in `dir`, by their file names.
pub fn restore_ids(dir: &Path) -> Vec<String> {
    let Ok(fd) = beneath::open_root(dir) else {
        return Vec::new();
    };
    beneath::names(fd.as_fd())
        .unwrap_or_default()
        .iter()
        .filter_map(|name| {
            name.to_str()?
                .strip_prefix("gpusnap-restore-inflight.")?
                .strip_suffix(".json")
                .map(str::to_owned)
        })
        .collect()
}

/// Where a restore in progress is, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "kebab-case")]
pub enum RestorePhase {
    /// Checks and preparation: nothing runs and nothing of the container was touched; only the
    /// front end's scratch files (CRIU's private plugin directory) exist.
    Preparing,
    /// `runc restore` runs as `runc_pid` (started at `runc_start`, for pid reuse).
    Runc {
        runc_pid: u32,
        runc_start: Option<u64>,
    },
    /// runc has returned and the container runs; the caller has not yet been told (the GPU
    /// state is restored next, or the result is being reported).
    Restored,
}

/// A restore in progress. A runtime killed before it reported the result leaves runc and CRIU
/// orphaned (a stalled CRIU then holds the half-restored tree, with CRIU's capabilities, for
/// good: the deadline's watch died with the runtime), CRIU's yards mounted in the host's mount
/// namespace, or a container that runs while its caller was told the restore failed. Whoever
/// comes next repairs from this record: the shim's `delete` (containerd runs it when the shim
/// died), gpusnap-runc's guard (which outlives a killed gpusnap-runc) or the next gpusnap-runc
/// call naming the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreInFlight {
    pub container_id: String,
    /// The bundle of the container being restored (its spec names the cgroup).
    pub bundle: PathBuf,
    /// CRIU's work directory (where `restore.log` and CRIU's cgroup yard go).
    pub criu_work_dir: PathBuf,
    pub writer_pid: u32,
    pub writer_start: Option<u64>,
    #[serde(flatten)]
    pub phase: RestorePhase,
}

/// A restore's record on disk, rewritten as the restore moves on and removed when dropped
/// (after the restore succeeded, or after a failed one was cleared).
#[derive(Debug)]
pub struct RestoreRecord {
    record: RestoreInFlight,
    path: PathBuf,
}

impl RestoreRecord {
    /// Records a restore of `container_id` by this process, [`RestorePhase::Preparing`], in
    /// `dir` (the front end's scratch directory). A record that cannot be written is logged:
    /// the restore goes on without one (only a killed runtime would miss it).
    pub fn begin(dir: &Path, container_id: &str, bundle: &Path, criu_work_dir: &Path) -> Self {
        let me = std::process::id();
        if let Err(e) = std::fs::create_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot create the scratch directory");
        }
        let mut r = RestoreRecord {
            record: RestoreInFlight {
                container_id: container_id.to_owned(),
                bundle: bundle.to_path_buf(),
                criu_work_dir: criu_work_dir.to_path_buf(),
                writer_pid: me,
                writer_start: crate::watchdog::start_time(me),
                phase: RestorePhase::Preparing,
            },
            path: dir.join(restore_record_name(container_id)),
        };
        r.write();
        r
    }

    /// Moves the record to `phase`, durably.
    pub fn phase(&mut self, phase: RestorePhase) {
        self.record.phase = phase;
        self.write();
    }

    /// `runc restore` was started as `pid`.
    pub fn runc_started(&mut self, pid: u32) {
        self.phase(RestorePhase::Runc {
            runc_pid: pid,
            runc_start: crate::watchdog::start_time(pid),
        });
    }

    fn write(&mut self) {
        if let Err(e) = write_file(&self.record, &self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot record the restore in progress");
        }
    }
}

impl Drop for RestoreRecord {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl RestoreInFlight {
    /// The record of a restore of `container_id` in `dir`, if there is a readable one.
    pub fn read(dir: &Path, container_id: &str) -> Option<RestoreInFlight> {
        read_record(dir, &restore_record_name(container_id))
            .filter(|r: &RestoreInFlight| r.container_id == container_id)
    }

    /// Every readable restore record in `dir` (a shim serving a pod's containers keeps them
    /// all in its own directory, where its `delete` runs).
    pub fn read_all(dir: &Path) -> Vec<RestoreInFlight> {
        restore_ids(dir)
            .iter()
            .filter_map(|id| RestoreInFlight::read(dir, id))
            .collect()
    }

    /// Whether the process that wrote the record still runs (its restore is in progress).
    pub fn writer_alive(&self) -> bool {
        alive(self.writer_pid, self.writer_start)
    }

    /// Ends what the interrupted restore left, by its phase. Preparing: the writer's private
    /// CRIU plugin directory in `dir`, and the page fill's split images in the CRIU work
    /// directory. Runc: the orphaned `runc restore` and everything below
    /// it (CRIU, the tree CRIU forked) are killed; then, as after any failed restore, every
    /// process in the container's cgroup, CRIU's yards, the cgroup and runc's state of the id
    /// (a container CRIU finished restoring after its runtime died was never reported to the
    /// caller). Restored: the same without runc. Removes the record from `dir`.
    pub fn repair(&self, dir: &Path, runc: &Runc<'_>) -> Option<crate::leftovers::Cleared> {
        crate::leftovers::remove_plugin_dirs_of(dir, self.writer_pid);
        let (orphans, cleared) = match self.phase {
            RestorePhase::Preparing => {
                // Killed while the page fill's split images were written: nothing ran them.
                crate::leftovers::remove_split_images(&self.criu_work_dir);
                (0, None)
            }
            RestorePhase::Runc {
                runc_pid,
                runc_start,
            } => {
                let orphans = if alive(runc_pid, runc_start) {
                    crate::watchdog::kill_tree(runc_pid)
                } else {
                    0
                };
                let cleared = crate::leftovers::clear_failed_restore(
                    runc,
                    &self.bundle,
                    None,
                    &self.criu_work_dir,
                );
                (orphans, Some(cleared))
            }
            RestorePhase::Restored => (
                0,
                Some(crate::leftovers::clear_failed_restore(
                    runc,
                    &self.bundle,
                    None,
                    &self.criu_work_dir,
                )),
            ),
        };
        remove_beneath(dir, OsStr::new(&restore_record_name(&self.container_id)));
        tracing::warn!(
            id = %self.container_id,
            phase = ?self.phase,
            runc_and_criu_killed = orphans,
            restored_killed = cleared.as_ref().map_or(0, |c| c.killed),
            left = cleared.as_ref().map_or(0, |c| c.remaining.len()),
            "repaired after a restore whose runtime was killed"
        );
        cleared
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;

    #[test]
    fn an_interrupted_checkpoint_is_removed_and_a_sealed_one_kept() {
        let work = tempfile::tempdir().unwrap();
        let host = FakeHost::new(false);
        let runc = Runc::new(Default::default(), "c1", &host);
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
        assert!(dead.repair(work.path(), &runc, false).removed_images);
        assert!(!images.exists());
        assert!(InFlight::read(work.path()).is_none());
        drop(guard);

        // A directory the caller made is scrubbed, not removed; a sealed one is left.
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("pages-1.img"), b"x").unwrap();
        std::fs::write(images.join("dump.log"), b"log").unwrap();
        let rec = InFlight::new("c1", &images, false, 0);
        assert!(!rec.created_dir);
        rec.repair(work.path(), &runc, false);
        assert!(!images.join("pages-1.img").exists());
        assert!(images.join("dump.log").exists());
        std::fs::write(images.join("pages-1.img"), b"x").unwrap();
        std::fs::write(images.join(dir::layout::MANIFEST_FILE), b"{}").unwrap();
        assert!(!rec.repair(work.path(), &runc, false).removed_images);
        assert!(images.join("pages-1.img").exists());
    }
}
