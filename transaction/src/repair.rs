//! After a runtime killed in the middle of a checkpoint or a restore: one rule that puts the
//! container back, whichever door finds the record ([`crate::inflight`]).
//!
//! A door only says where it keeps its records and hands over the container's runc (through
//! its [`crate::Host`]): the shim's `delete` (records in its bundle), gpusnap-runc's next call
//! naming the container (runc's state directory of the container, its scratch directory). The
//! rule is the same for all of them:
//!
//! - a record whose writer still runs belongs to an operation in progress: left alone;
//! - a record that cannot be read (a symlink, too large, not a record) is removed;
//! - an interrupted checkpoint: a CRIU still writing its images is killed, unsealed images are
//!   removed, the cgroup is frozen or thawed as the caller had it — through runc while runc
//!   knows the container by the recorded init, and, when the caller had it running, every
//!   cgroup runc's state or the bundle's spec names that is still frozen is thawed through
//!   cgroupfs (runc reports a container it cannot lead to as stopped or running, and a frozen
//!   process dies only once thawed). The CUDA processes a checkpoint of a frozen container
//!   left checkpointed stay recorded in the record directory
//!   ([`crate::pending_resume`]): the caller's resume or the next checkpoint brings them back,
//!   as for a checkpoint that ended;
//! - an interrupted restore: the orphaned `runc restore` and its CRIU are killed, what they
//!   restored is killed in the container's cgroup, CRIU's yards are cleared and runc's state of
//!   the id is removed ([`RestoreInFlight::repair`]);
//! - the record is removed.
//!
//! Records are looked at, read and removed through a descriptor of their directory, never
//! followed; paths they name are opened beneath them where read.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::host::Runc;
use crate::inflight::{self, restore_record_name, InFlight, RestoreInFlight, INFLIGHT_FILE};
use crate::leftovers::Cleared;

/// Where a door keeps the records of one container's operations.
#[derive(Debug, Clone, Copy)]
pub struct Records<'p> {
    /// The checkpoint's record directory (the request's `record_dir`).
    pub checkpoint_dir: &'p Path,
    /// The restore's scratch directory (the request's `scratch_dir`).
    pub scratch_dir: &'p Path,
    /// The container's bundle, when the door knows it: its spec names the cgroup when runc's
    /// state no longer does.
    pub bundle: Option<&'p Path>,
}

/// What becomes of the container after the repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Afterwards {
    /// It goes on (gpusnap-runc's next call): its cgroup is put back as the checkpoint's
    /// caller had it, frozen or running.
    GoesOn,
    /// It is deleted next (the shim's cleanup after its own death): every cgroup it left
    /// frozen is thawed, whatever the caller had, since a frozen process dies only once thawed
    /// and runc's forced delete would wait on it past containerd's limit for the command.
    Deleted,
}

/// What a door found of one kind of record, and what was done.
#[derive(Debug)]
pub enum Found<T> {
    /// No record.
    Nothing,
    /// A record that could not be read (or names another container), removed.
    Discarded,
    /// The record's writer still runs: its operation is in progress, left alone.
    InProgress,
    /// The writer was dead: what it left was put back.
    Repaired(T),
}

impl<T> Found<T> {
    /// What was repaired, if anything.
    pub fn repaired(&self) -> Option<&T> {
        match self {
            Found::Repaired(t) => Some(t),
            _ => None,
        }
    }
}

/// What was put back after an interrupted checkpoint.
#[derive(Debug)]
pub struct CheckpointRepaired {
    pub record: InFlight,
    /// Images removed, and the freezer settled through runc.
    pub images_and_runc: inflight::Repaired,
    /// Cgroups found frozen and thawed through cgroupfs (the caller had the container running).
    pub thawed: Vec<PathBuf>,
}

/// What was put back after an interrupted restore.
#[derive(Debug)]
pub struct RestoreRepaired {
    pub record: RestoreInFlight,
    /// What clearing the failed restore found (`None`: it had not started runc yet).
    pub cleared: Option<Cleared>,
}

/// What [`container`] found and did.
#[derive(Debug)]
pub struct Repair {
    pub checkpoint: Found<CheckpointRepaired>,
    pub restore: Found<RestoreRepaired>,
}

/// Repairs the container `runc.id` from both its records: its checkpoint first (a CRIU it
/// left holds the container's tasks seized, which would stall the restore's kills), then its
/// restore.
pub fn container(records: &Records<'_>, runc: &Runc<'_>) -> Repair {
    let checkpoint = checkpoint(
        records.checkpoint_dir,
        records.bundle,
        runc,
        Afterwards::GoesOn,
    );
    let restore = restore(records.scratch_dir, runc);
    Repair {
        checkpoint,
        restore,
    }
}

/// Repairs an interrupted checkpoint of `runc.id` recorded in `record_dir` (see the module's
/// rule). `bundle`: the container's, when the door knows it.
pub fn checkpoint(
    record_dir: &Path,
    bundle: Option<&Path>,
    runc: &Runc<'_>,
    afterwards: Afterwards,
) -> Found<CheckpointRepaired> {
    let name = OsStr::new(INFLIGHT_FILE);
    if !gpusnap_criu_bridge::is_plain_id(&runc.id) || !inflight::exists_beneath(record_dir, name) {
        return Found::Nothing;
    }
    let Some(record) = InFlight::read(record_dir).filter(|r| r.container_id == runc.id) else {
        tracing::warn!(id = %runc.id, dir = %record_dir.display(), "removing an unreadable checkpoint record");
        inflight::remove_beneath(record_dir, name);
        return Found::Discarded;
    };
    if record.writer_alive() {
        return Found::InProgress;
    }
    // Settled back through runc only for a container that goes on.
    let init_lives = afterwards == Afterwards::GoesOn
        && runc
            .state()
            .is_some_and(|(pid, status)| pid == record.init_pid && status != "stopped");
    let images_and_runc = record.repair(record_dir, runc, init_lives);
    let thawed = if record.frozen_by_caller && afterwards == Afterwards::GoesOn {
        Vec::new()
    } else {
        thaw_frozen_cgroups(runc, bundle)
    };
    Found::Repaired(CheckpointRepaired {
        record,
        images_and_runc,
        thawed,
    })
}

/// Repairs an interrupted restore of `runc.id` recorded in `scratch_dir` (see the module's
/// rule).
pub fn restore(scratch_dir: &Path, runc: &Runc<'_>) -> Found<RestoreRepaired> {
    if !gpusnap_criu_bridge::is_plain_id(&runc.id) {
        return Found::Nothing;
    }
    let file = restore_record_name(&runc.id);
    let name = OsStr::new(&file);
    if !inflight::exists_beneath(scratch_dir, name) {
        return Found::Nothing;
    }
    let Some(record) = RestoreInFlight::read(scratch_dir, &runc.id) else {
        tracing::warn!(id = %runc.id, dir = %scratch_dir.display(), "removing an unreadable restore record");
        inflight::remove_beneath(scratch_dir, name);
        return Found::Discarded;
    };
    if record.writer_alive() {
        return Found::InProgress;
    }
    let cleared = record.repair(scratch_dir, runc);
    Found::Repaired(RestoreRepaired { record, cleared })
}

/// Repairs every interrupted restore recorded in `scratch_dir` (a shim serving a pod's
/// containers keeps all their records in its own directory); `runc_of` gives each container's
/// runc. Returns what was repaired.
pub fn restores_in<'h>(
    scratch_dir: &Path,
    runc_of: impl Fn(&str) -> Runc<'h>,
) -> Vec<RestoreRepaired> {
    inflight::restore_ids(scratch_dir)
        .iter()
        .filter_map(|id| match restore(scratch_dir, &runc_of(id)) {
            Found::Repaired(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// Thaws, through cgroupfs, each cgroup of the container that runc's state or the bundle's
/// spec names and that is frozen: runc may no longer lead to it (its init is dead, or runc
/// does not know the container as paused), yet a frozen process dies only once thawed.
fn thaw_frozen_cgroups(runc: &Runc<'_>, bundle: Option<&Path>) -> Vec<PathBuf> {
    let host = runc.host();
    let mut cgroups: Vec<PathBuf> = Vec::new();
    let named = [
        crate::leftovers::runc_state_cgroup(runc),
        bundle.and_then(|b| crate::cgroup::of_spec(b, &runc.id, runc.global.systemd_cgroup)),
    ];
    for dir in named.into_iter().flatten() {
        if !cgroups.contains(&dir) {
            cgroups.push(dir);
        }
    }
    let mut thawed = Vec::new();
    for dir in cgroups {
        if host.cgroup_frozen_at(&dir) != Some(true) {
            continue;
        }
        match host.thaw_cgroup_at(&dir) {
            Ok(()) => thawed.push(dir),
            Err(e) => {
                tracing::warn!(id = %runc.id, cgroup = %dir.display(), error = %e, "cannot thaw the cgroup of an interrupted checkpoint's container")
            }
        }
    }
    if !thawed.is_empty() {
        tracing::warn!(id = %runc.id, cgroups = ?thawed, "thawed the cgroup an interrupted checkpoint left frozen");
    }
    thawed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflight::RestorePhase;
    use crate::testing::{FakeHost, Node, Op};

    /// runc's `state.json` of `c1` naming its cgroup, as runc leaves it.
    fn runc_state_naming_its_cgroup(node: &Node) {
        let state_dir = node.path("runc-root/c1");
        std::fs::create_dir_all(&state_dir).unwrap();
        std::fs::write(
            state_dir.join("state.json"),
            r#"{"cgroup_paths": {"": "/sys/fs/cgroup/gpusnap-test/c1"}}"#,
        )
        .unwrap();
    }

    /// A checkpoint record of `c1` by a writer that is gone, its images half written.
    fn dead_checkpoint(node: &Node, frozen_by_caller: bool) -> (PathBuf, PathBuf) {
        let record_dir = node.path("bundle");
        let images = node.path("cp");
        let mut rec = InFlight::new("c1", &images, frozen_by_caller, 4242);
        rec.writer_pid = u32::MAX;
        inflight::write_file(&rec, &record_dir.join(INFLIGHT_FILE)).unwrap();
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("pages-1.img"), b"x").unwrap();
        (record_dir, images)
    }

    fn records(node: &Node) -> (PathBuf, PathBuf, PathBuf) {
        let scratch = node.path("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        (node.path("bundle"), scratch, node.path("bundle"))
    }

    #[test]
    fn a_frozen_cgroup_runc_calls_running_is_thawed_through_cgroupfs() {
        let node = Node::new();
        let (record_dir, images) = dead_checkpoint(&node, false);
        // runc knows the container by its init but not as paused: its resume is refused.
        let mut host = FakeHost::new(true).fail(Op::Thaw);
        host.runc_state = Some((4242, "running".into()));
        let runc = Runc::new(node.runc(), "c1", &host);
        let found = checkpoint(&record_dir, Some(&record_dir), &runc, Afterwards::GoesOn);
        let done = found.repaired().expect("repaired");
        assert!(done.images_and_runc.removed_images);
        assert!(!images.exists());
        assert_eq!(host.frozen(), Some(false), "{:?}", host.calls());
        assert!(host.called("thaw-cgroup"), "{:?}", host.calls());
        assert!(!record_dir.join(INFLIGHT_FILE).exists());
    }

    #[test]
    fn a_frozen_cgroup_runc_no_longer_knows_is_thawed_on_every_door() {
        let node = Node::new();
        let (record_dir, _images) = dead_checkpoint(&node, false);
        // runc's state still names the cgroup; `runc state` does not know the container.
        runc_state_naming_its_cgroup(&node);
        let host = FakeHost::new(true);
        let runc = Runc::new(node.runc(), "c1", &host);
        // gpusnap-runc knows no bundle: runc's state names the cgroup.
        let (_, scratch, _) = records(&node);
        let repair = container(
            &Records {
                checkpoint_dir: &record_dir,
                scratch_dir: &scratch,
                bundle: None,
            },
            &runc,
        );
        let done = repair.checkpoint.repaired().expect("repaired");
        assert_eq!(
            done.thawed,
            vec![PathBuf::from("/sys/fs/cgroup/gpusnap-test/c1")]
        );
        assert!(!done.images_and_runc.freezer_settled, "runc was not asked");
        assert!(
            !host.calls().iter().any(|c| c == "thaw"),
            "{:?}",
            host.calls()
        );
        assert_eq!(host.frozen(), Some(false));
        assert!(matches!(repair.restore, Found::Nothing));
    }

    #[test]
    fn a_container_its_caller_froze_stays_frozen() {
        let node = Node::new();
        let (record_dir, images) = dead_checkpoint(&node, true);
        let mut host = FakeHost::new(true);
        host.runc_state = Some((4242, "paused".into()));
        let runc = Runc::new(node.runc(), "c1", &host);
        let done = checkpoint(&record_dir, Some(&record_dir), &runc, Afterwards::GoesOn);
        let done = done.repaired().expect("repaired");
        assert!(done.thawed.is_empty());
        assert!(!images.exists());
        assert_eq!(host.frozen(), Some(true), "{:?}", host.calls());
    }

    #[test]
    fn a_container_deleted_next_is_thawed_whatever_its_caller_had() {
        let node = Node::new();
        let (record_dir, _images) = dead_checkpoint(&node, true);
        runc_state_naming_its_cgroup(&node);
        let mut host = FakeHost::new(true);
        host.runc_state = Some((4242, "paused".into()));
        let runc = Runc::new(node.runc(), "c1", &host);
        let done = checkpoint(&record_dir, None, &runc, Afterwards::Deleted);
        let done = done.repaired().expect("repaired");
        assert!(!done.images_and_runc.freezer_settled, "{:?}", host.calls());
        assert_eq!(done.thawed.len(), 1, "{:?}", host.calls());
        assert_eq!(host.frozen(), Some(false), "{:?}", host.calls());
    }

    #[test]
    fn a_live_writer_is_left_alone() {
        let node = Node::new();
        let record_dir = node.path("bundle");
        let images = node.path("cp");
        let rec = InFlight::new("c1", &images, false, 4242);
        let _guard = rec.write(&record_dir).unwrap();
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("pages-1.img"), b"x").unwrap();
        let host = FakeHost::new(true);
        let runc = Runc::new(node.runc(), "c1", &host);
        assert!(matches!(
            checkpoint(&record_dir, Some(&record_dir), &runc, Afterwards::GoesOn),
            Found::InProgress
        ));
        assert!(images.join("pages-1.img").exists());
        assert!(record_dir.join(INFLIGHT_FILE).exists());
        assert!(host.calls().is_empty(), "{:?}", host.calls());
        assert_eq!(host.frozen(), Some(true));

        // A live restore too.
        let (_, scratch, bundle) = records(&node);
        let _restore = crate::inflight::RestoreRecord::begin(&scratch, "c1", &bundle, &scratch);
        assert!(matches!(restore(&scratch, &runc), Found::InProgress));
        assert!(scratch.join(restore_record_name("c1")).exists());
    }

    #[test]
    fn an_unreadable_record_is_removed_and_never_followed() {
        let node = Node::new();
        let record_dir = node.path("bundle");
        let elsewhere = node.path("elsewhere.json");
        std::fs::write(&elsewhere, b"{}").unwrap();
        std::os::unix::fs::symlink(&elsewhere, record_dir.join(INFLIGHT_FILE)).unwrap();
        let host = FakeHost::new(false);
        let runc = Runc::new(node.runc(), "c1", &host);
        assert!(matches!(
            checkpoint(&record_dir, None, &runc, Afterwards::GoesOn),
            Found::Discarded
        ));
        assert!(std::fs::symlink_metadata(record_dir.join(INFLIGHT_FILE)).is_err());
        assert!(elsewhere.exists());
    }

    #[test]
    fn an_orphaned_restore_is_cleared() {
        let node = Node::new();
        let (_, scratch, bundle) = records(&node);
        let work = node.path("criu-work");
        std::fs::create_dir_all(&work).unwrap();
        // The orphaned `runc restore`: a process of ours.
        let mut orphan = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let record = RestoreInFlight {
            container_id: "c1".into(),
            bundle: bundle.clone(),
            criu_work_dir: work.clone(),
            writer_pid: u32::MAX,
            writer_start: None,
            phase: RestorePhase::Runc {
                runc_pid: orphan.id(),
                runc_start: crate::watchdog::start_time(orphan.id()),
            },
        };
        inflight::write_file(&record, &scratch.join(restore_record_name("c1"))).unwrap();
        let host = FakeHost::new(false);
        let runc = Runc::new(node.runc(), "c1", &host);
        let repaired = restores_in(&scratch, |id| Runc::new(node.runc(), id, &host));
        assert_eq!(repaired.len(), 1);
        assert_eq!(repaired[0].record, record);
        assert!(repaired[0].cleared.is_some());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(orphan.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(host.called("kill-cgroup"), "{:?}", host.calls());
        assert!(host.called(&format!("clear-yards {}", work.display())));
        assert!(host.called("runc delete"), "{:?}", host.calls());
        assert!(!scratch.join(restore_record_name("c1")).exists());
        // Nothing is left to repair.
        assert!(matches!(restore(&scratch, &runc), Found::Nothing));
    }
}
