//! The rollback matrix of the restore's phases, with the recording host (`testing.rs`): no
//! root, no container, no runc or CRIU. Validate and bound run from the front door; apply,
//! restore and unlock from a state built here (CRIU images that pass the privilege bound are
//! CRIU's to write), which is what the phases' state types are for.

use std::error::Error as _;
use std::path::Path;
use std::time::Instant;

use gpusnap_criu_bridge::CriuFlags;

use super::apply::Applied;
use super::bound::Bounded;
use super::validate::Validated;
use super::*;
use crate::error::{Error, Outcome, Refusal};
use crate::inflight::{RestoreInFlight, RestoreRecord};
use crate::lock::DirLock;
use crate::signature::Admission;
use crate::testing::{FakeHost, Node, Op};

fn request(node: &Node, checkpoint_dir: &Path) -> RestoreRequest {
    RestoreRequest {
        container_id: "c1".into(),
        bundle: node.path("bundle"),
        checkpoint_dir: checkpoint_dir.to_path_buf(),
        rootfs_diff: None,
        runc: node.runc(),
        config: node.config(),
        scratch_dir: node.path("scratch"),
        command: RestoreCommand::Build {
            work_dir: node.path("work"),
            pid_file: node.path("work/init.pid"),
            console_socket: None,
            no_pivot: false,
            terminal: false,
        },
        signature_evidence: Default::default(),
        checkpoint_mount: None,
        began: None,
        in_place: None,
    }
}

fn records(node: &Node) -> Vec<RestoreInFlight> {
    RestoreInFlight::read_all(&node.path("scratch"))
}

fn phase_error<E: std::error::Error + 'static>(e: &Error) -> &E {
    e.source()
        .and_then(|s| s.downcast_ref::<E>())
        .unwrap_or_else(|| panic!("not from {}: {e:?}", std::any::type_name::<E>()))
}

/// The state the bound phase leaves, for a restore of `req` (no GPU state).
fn bounded<'a>(req: &'a RestoreRequest, host: &'a FakeHost, lock_dir: &Path) -> Bounded<'a> {
    let criu_log = criu_log_of(req);
    let criu_work_dir = criu_log.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&criu_work_dir).unwrap();
    let mut global = req.runc.clone();
    let criu = crate::criu::prepare(
        &mut global,
        &req.config,
        false,
        &req.bundle,
        &req.scratch_dir,
        host,
    )
    .unwrap();
    Bounded {
        validated: Validated {
            req,
            started: Instant::now(),
            timings: Timings::default(),
            record: RestoreRecord::begin(
                &req.scratch_dir,
                &req.container_id,
                &req.bundle,
                &criu_work_dir,
            ),
            deadline: Deadline::start(&req.config.restore, 0),
            lock: DirLock::shared(lock_dir).unwrap(),
            admitted: Admission::unsigned(&req.checkpoint_dir),
            manifest: Manifest::new(&req.container_id, CriuFlags::default()),
            gpu: None,
            criu_log,
            criu_work_dir,
            in_place: Vec::new(),
        },
        cmd: global.helper(&["restore"]),
        runc: Runc::new(global, &req.container_id, host),
        criu,
        pid_file: Some(criu_work_dir_pid(req)),
        foreground: false,
        rootfs: req.bundle.join("rootfs"),
        fill: None,
    }
}

fn criu_work_dir_pid(req: &RestoreRequest) -> PathBuf {
    match &req.command {
        RestoreCommand::Build { pid_file, .. } => pid_file.clone(),
        RestoreCommand::Given { .. } => unreachable!(),
    }
}

/// The state the apply phase leaves: the bound one, nothing applied.
fn applied<'a>(req: &'a RestoreRequest, host: &'a FakeHost, lock_dir: &Path) -> Applied<'a> {
    let b = bounded(req, host, lock_dir);
    let v = b.validated;
    Applied {
        req,
        started: v.started,
        timings: v.timings,
        record: v.record,
        deadline: v.deadline,
        lock: v.lock,
        manifest: v.manifest,
        gpu: v.gpu,
        runc: b.runc,
        cmd: b.cmd,
        pid_file: b.pid_file,
        foreground: b.foreground,
        criu_log: v.criu_log,
        criu_work_dir: v.criu_work_dir,
        criu: Some(b.criu),
        fill: b.fill,
    }
}

/// A rootfs diff (plain tar) holding `etc/held`.
fn diff(node: &Node) -> RootfsDiff {
    let path = node.path("rootfs-diff.tar");
    let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    b.append_data(&mut h, "etc/held", &b"x\n"[..]).unwrap();
    b.finish().unwrap();
    drop(b);
    RootfsDiff {
        sha256: gpusnap_checkpoint::rootfs_diff::sha256_file(&path).unwrap(),
        path,
        content_bytes: Some(2),
    }
}

#[test]
fn validate_refuses_what_is_no_checkpoint_and_removes_its_record() {
    let node = Node::new();
    std::fs::create_dir(node.path("empty")).unwrap();
    let host = FakeHost::new(false);
    let e = restore(&request(&node, &node.path("empty")), &host).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Precondition), "{e}");
    assert!(e.to_string().starts_with("cannot restore c1: "), "{e}");
    assert!(matches!(
        phase_error::<ValidateError>(&e),
        ValidateError::Manifest(_)
    ));
    assert!(host.calls().is_empty(), "{:?}", host.calls());
    assert!(records(&node).is_empty(), "the in-flight record is removed");
}

#[test]
fn validate_refuses_a_rootfs_diff_changed_since_it_was_recorded() {
    let node = Node::new();
    let host = FakeHost::new(false);
    crate::checkpoint::checkpoint(&checkpoint_request(&node), &host).unwrap();
    let mut req = request(&node, &node.path("ck"));
    let mut d = diff(&node);
    d.sha256 = "0".repeat(64);
    req.rootfs_diff = Some(d);
    let e = restore(&req, &host).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Precondition), "{e}");
    assert!(e.to_string().contains("pull the checkpoint again"), "{e}");
    assert!(matches!(
        phase_error::<ValidateError>(&e),
        ValidateError::DiffChanged { .. }
    ));
    assert!(
        !node.path("bundle/rootfs/etc/held").exists(),
        "nothing applied"
    );
    assert!(records(&node).is_empty());
}

fn checkpoint_request(node: &Node) -> crate::CheckpointRequest {
    crate::CheckpointRequest {
        container_id: "c1".into(),
        bundle: node.path("bundle"),
        init_pid: u32::MAX - 1,
        image_dir: node.path("ck"),
        work_dir: None,
        parent: None,
        auto_dedup: false,
        criu: CriuFlags::default(),
        exit: false,
        frozen: false,
        runc: node.runc(),
        config: node.config(),
        scratch_dir: node.path("scratch"),
        record_dir: node.path("bundle"),
    }
}

#[test]
fn bound_refuses_images_outside_the_model_before_anything_changes() {
    let node = Node::new();
    let host = FakeHost::new(false);
    // A checkpoint whose "images" are not CRIU's.
    crate::checkpoint::checkpoint(&checkpoint_request(&node), &host).unwrap();
    let before = host.calls().len();
    let mut req = request(&node, &node.path("ck"));
    req.rootfs_diff = Some(diff(&node));
    let e = restore(&req, &host).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Precondition), "{e}");
    let calls = &host.calls()[before..];
    assert!(
        calls.iter().all(|c| c == "criu --version"),
        "nothing ran, froze or was cleared: {calls:?}"
    );
    assert!(
        !node.path("bundle/rootfs/etc/held").exists(),
        "the diff is not applied"
    );
    assert!(records(&node).is_empty());
}

#[test]
fn an_open_files_refusal_before_any_change_is_a_refusal() {
    let node = Node::new();
    let host = FakeHost::new(false);
    // No images to compare: the check cannot run.
    let req = request(&node, &node.path("no-images"));
    let lock_dir = node.dir.path();
    let e: Error = apply::run(bounded(&req, &host, lock_dir))
        .map(drop)
        .unwrap_err()
        .into();
    assert_eq!(e.refusal(), Some(Refusal::Precondition), "{e}");
    assert!(e.to_string().contains("nothing was restored"), "{e}");
    assert!(!e.to_string().contains("rootfs diff"), "{e}");
    assert!(host.calls().iter().all(|c| c == "criu --version"));
}

#[test]
fn an_open_files_refusal_after_the_diff_says_the_diff_stays() {
    let node = Node::new();
    let host = FakeHost::new(false);
    let mut req = request(&node, &node.path("no-images"));
    req.rootfs_diff = Some(diff(&node));
    let e: Error = apply::run(bounded(&req, &host, node.dir.path()))
        .map(drop)
        .unwrap_err()
        .into();
    // Not "nothing was changed": the diff was written, and stays with the container.
    assert_eq!(e.refusal(), None, "{e}");
    assert_eq!(e.outcome(), Some(Outcome::NothingRunning), "{e}");
    let text = e.to_string();
    assert!(text.contains("nothing was restored"), "{text}");
    assert!(
        text.contains("the rootfs diff applied so far stays in the container's root filesystem"),
        "{text}"
    );
    assert!(matches!(
        phase_error::<ApplyError>(&e),
        ApplyError::OpenFiles {
            changed: crate::deadline::Changed::RootfsDiff,
            ..
        }
    ));
    assert_eq!(
        std::fs::read(node.path("bundle/rootfs/etc/held")).unwrap(),
        b"x\n"
    );
    assert!(
        host.calls().iter().all(|c| c == "criu --version"),
        "runc never ran: {:?}",
        host.calls()
    );
}

#[test]
fn a_failed_runc_restore_clears_what_it_left_and_removes_the_record() {
    let node = Node::new();
    let mut host = FakeHost::new(false).fail(Op::Restore);
    host.record_dir = Some(node.path("scratch"));
    let req = request(&node, &node.path("ck"));
    let state = applied(&req, &host, node.dir.path());
    let e: Error = run::run(state).map(|_| ()).unwrap_err().into();
    assert_eq!(e.outcome(), Some(Outcome::NothingRunning), "{e}");
    assert!(
        matches!(
            e,
            Error::Failed {
                runc_exit: Some(1),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(matches!(phase_error::<RunError>(&e), RunError::Runc { .. }));
    let text = e.to_string();
    assert!(text.contains("runc restore failed"), "{text}");
    assert!(
        text.contains("runc's state of the container was removed"),
        "{text}"
    );
    let calls = host.calls();
    let at = |prefix: &str| {
        calls
            .iter()
            .position(|c| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix}: {calls:?}"))
    };
    assert_eq!(
        calls[at("runc restore")],
        "runc restore Preparing",
        "recorded while it ran"
    );
    assert!(at("runc restore") < at("kill-cgroup"), "{calls:?}");
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("kill-cgroup") && c.ends_with("gpusnap-test/c1")),
        "the spec's cgroup is emptied: {calls:?}"
    );
    assert!(at("kill-cgroup") < at("runc delete"), "{calls:?}");
    assert!(at("runc delete") < at("clear-yards"), "{calls:?}");
    assert!(at("clear-yards") < at("remove-cgroup"), "{calls:?}");
    assert!(!host.called("kill-all"), "{calls:?}");
    assert!(records(&node).is_empty(), "the record goes once cleared");
}

#[test]
fn a_runc_that_cannot_start_leaves_nothing_to_clear() {
    let node = Node::new();
    let host = FakeHost::new(false).fail(Op::RestoreSpawn);
    let req = request(&node, &node.path("ck"));
    let e: Error = run::run(applied(&req, &host, node.dir.path()))
        .map(|_| ())
        .unwrap_err()
        .into();
    assert_eq!(e.outcome(), Some(Outcome::NothingRunning), "{e}");
    assert!(e.to_string().starts_with("cannot run "), "{e}");
    assert!(!host.called("kill-cgroup") && !host.called("runc delete"));
    assert!(records(&node).is_empty());
}

#[test]
fn a_restored_container_without_an_init_pid_is_killed() {
    let node = Node::new();
    let host = FakeHost::new(false);
    let req = request(&node, &node.path("ck"));
    // runc "restored" and wrote no pid file.
    let e: Error = run::run(applied(&req, &host, node.dir.path()))
        .map(|_| ())
        .unwrap_err()
        .into();
    assert_eq!(e.outcome(), Some(Outcome::RestoredProcessesKilled), "{e}");
    assert!(matches!(phase_error::<RunError>(&e), RunError::NoInitPid));
    assert!(host.called("kill-all"), "{:?}", host.calls());
    assert!(records(&node).is_empty());
}

#[test]
fn a_restore_that_runs_is_unlocked_and_reported() {
    let node = Node::new();
    let host = FakeHost::new(false);
    let req = request(&node, &node.path("ck"));
    let state = applied(&req, &host, node.dir.path());
    std::fs::write(node.path("work/init.pid"), "4242\n").unwrap();
    let run::Ran::Detached(restored) = run::run(state).map_err(Error::from).unwrap() else {
        panic!("a detached restore")
    };
    assert_eq!(restored.init_pid, 4242);
    let r = records(&node);
    assert_eq!(r.len(), 1, "still recorded until reported");
    assert_eq!(r[0].phase, crate::inflight::RestorePhase::Restored);
    let report = unlock::run(*restored).map_err(Error::from).unwrap();
    assert_eq!((report.init_pid, report.cuda_processes), (4242, 0));
    assert!(records(&node).is_empty(), "reported: the record goes");
    assert!(!host.called("kill-all") && !host.called("kill-cgroup"));
}
