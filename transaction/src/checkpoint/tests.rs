//! The rollback matrix of the checkpoint's phases, with the recording host (`testing.rs`): no
//! root, no container, no runc or CRIU. A CPU-only node (no CUDA driver to load); the CUDA
//! side of each rollback is the orchestrator's, tested in `gpusnap-cuda`.

use std::error::Error as _;

use gpusnap_checkpoint::layout::MANIFEST_FILE;

use super::*;
use crate::error::{Error, Outcome, Refusal};
use crate::testing::{FakeHost, Node, Op};

fn request(node: &Node, exit: bool, frozen: bool) -> CheckpointRequest {
    CheckpointRequest {
        container_id: "c1".into(),
        bundle: node.path("bundle"),
        init_pid: u32::MAX - 1,
        image_dir: node.path("ck"),
        work_dir: None,
        parent: None,
        auto_dedup: false,
        criu: CriuFlags::default(),
        exit,
        frozen,
        runc: node.runc(),
        config: node.config(),
        scratch_dir: node.path("scratch"),
        record_dir: node.path("bundle"),
    }
}

fn sealed(node: &Node) -> bool {
    node.path("ck").join(MANIFEST_FILE).exists()
}

/// The phase error an error was converted from.
fn phase_error<E: std::error::Error + 'static>(e: &Error) -> &E {
    e.source()
        .and_then(|s| s.downcast_ref::<E>())
        .unwrap_or_else(|| panic!("not from {}: {e:?}", std::any::type_name::<E>()))
}

#[test]
fn a_sealed_checkpoint_with_exit_kills_only_after_the_seal() {
    let node = Node::new();
    let host = FakeHost::new(false);
    let report = checkpoint(&request(&node, true, false), &host).unwrap();
    assert!(report.stopped && report.pending_cuda.is_none());
    assert!(sealed(&node));
    assert_eq!(
        host.calls(),
        [
            "criu --version",
            "freeze",
            "runc checkpoint",
            "kill-all",
            "thaw"
        ],
        "frozen for the dump (freeze/lock), dumped, killed once sealed, thawed so it dies"
    );
    let phases: Vec<&str> = report
        .manifest
        .timings
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        phases.contains(&"criu-dump") && phases.contains(&"container-record"),
        "{phases:?}"
    );
}

#[test]
fn a_container_its_caller_froze_is_thawed_after_its_kill() {
    let node = Node::new();
    let host = FakeHost::new(true);
    checkpoint(&request(&node, true, true), &host).unwrap();
    assert_eq!(
        host.calls(),
        ["criu --version", "runc checkpoint", "kill-all", "thaw"]
    );
}

#[test]
fn prepare_refuses_before_anything_is_touched() {
    // CRIU is broken.
    let node = Node::new();
    let host = FakeHost::new(false).fail(Op::CriuVersion);
    let e = checkpoint(&request(&node, true, false), &host).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Precondition), "{e}");
    assert!(e.to_string().starts_with("cannot checkpoint c1: "), "{e}");
    assert_eq!(
        host.calls(),
        ["criu --version"],
        "nothing frozen, dumped or killed"
    );
    assert!(!sealed(&node));

    // No init.
    let node = Node::new();
    let host = FakeHost::new(false);
    let mut req = request(&node, false, false);
    req.init_pid = 0;
    let e = checkpoint(&req, &host).unwrap_err();
    assert!(matches!(
        phase_error::<PrepareError>(&e),
        PrepareError::NoInit
    ));
    assert!(e.to_string().contains("no running init"), "{e}");
    assert!(host.calls().is_empty());

    // A relative image path is the request's fault.
    let mut req = request(&node, false, false);
    req.image_dir = "relative/ck".into();
    let e = checkpoint(&req, &host).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::InvalidRequest), "{e}");
    assert!(matches!(
        phase_error::<PrepareError>(&e),
        PrepareError::Request(_)
    ));

    // Another transaction holds the directory.
    std::fs::create_dir(node.path("ck")).unwrap();
    let _held = crate::lock::DirLock::exclusive(&node.path("ck")).unwrap();
    let e = checkpoint(&request(&node, true, false), &host).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Busy), "{e}");
    assert!(host.calls().is_empty(), "{:?}", host.calls());
}

#[test]
fn a_freeze_for_exit_that_fails_still_dumps_and_kills() {
    let node = Node::new();
    let host = FakeHost::new(false).fail(Op::Freeze);
    let report = checkpoint(&request(&node, true, false), &host).unwrap();
    assert!(report.stopped && sealed(&node));
    assert_eq!(
        host.calls(),
        ["criu --version", "freeze", "runc checkpoint", "kill-all"],
        "never frozen, so not thawed"
    );
}

#[test]
fn a_failed_dump_thaws_what_it_froze_and_scrubs_the_images() {
    let node = Node::new();
    let host = FakeHost::new(false).fail(Op::Dump);
    let e = checkpoint(&request(&node, true, false), &host).unwrap_err();
    assert_eq!(e.outcome(), Some(Outcome::ContainerUnchanged), "{e}");
    assert!(
        matches!(
            e,
            Error::Failed {
                runc_exit: Some(1),
                ..
            }
        ),
        "runc's exit code is passed on: {e:?}"
    );
    assert!(matches!(phase_error::<DumpError>(&e), DumpError::Runc(_)));
    assert!(e.to_string().contains("criu failed"), "{e}");
    let calls = host.calls();
    assert_eq!(
        calls[..4],
        ["criu --version", "freeze", "runc checkpoint", "thaw"]
    );
    assert!(calls[4].starts_with("kill-criu-writing"), "{calls:?}");
    assert_eq!(calls.len(), 5, "settled already, never killed: {calls:?}");
    assert_eq!(host.frozen(), Some(false));
    let ck = node.path("ck");
    assert!(
        !sealed(&node) && !ck.join("pages-1.img").exists(),
        "scrubbed"
    );
    assert!(ck.join("dump.log").exists(), "CRIU's log is kept");
}

#[test]
fn a_failed_dump_leaves_a_caller_frozen_container_frozen() {
    let node = Node::new();
    let mut host = FakeHost::new(true).fail(Op::Dump);
    // The failing CRIU thawed the cgroup behind the transaction's back.
    host.dump_thaws = true;
    let e = checkpoint(&request(&node, false, true), &host).unwrap_err();
    assert_eq!(e.outcome(), Some(Outcome::ContainerUnchanged), "{e}");
    let calls = host.calls();
    assert_eq!(
        calls.last().map(String::as_str),
        Some("freeze"),
        "{calls:?}"
    );
    assert_eq!(host.frozen(), Some(true), "settled as the caller had it");
}

#[test]
fn a_failed_seal_scrubs_and_thaws_and_never_kills() {
    let node = Node::new();
    let host = FakeHost::new(false).fail(Op::Seal);
    let e = checkpoint(&request(&node, true, false), &host).unwrap_err();
    assert_eq!(e.outcome(), Some(Outcome::ContainerUnchanged), "{e}");
    assert!(
        e.to_string().contains("the checkpoint could not be sealed"),
        "{e}"
    );
    let seal = phase_error::<SealError>(&e);
    assert!(matches!(seal, SealError::Unsealed(_)), "{seal:?}");
    assert!(seal.source().is_some(), "the digest's error is kept");
    let calls = host.calls();
    assert_eq!(calls[..3], ["criu --version", "freeze", "runc checkpoint"]);
    assert!(calls[3].starts_with("kill-criu-writing"), "{calls:?}");
    assert_eq!(calls[4], "thaw", "{calls:?}");
    assert!(!host.called("kill-all"), "{calls:?}");
    assert!(!sealed(&node) && !node.path("ck").join("pages-1.img").exists());
}

#[test]
fn a_failed_kill_after_the_seal_keeps_the_checkpoint() {
    let node = Node::new();
    let host = FakeHost::new(false).fail(Op::KillAll);
    let report = checkpoint(&request(&node, true, false), &host).unwrap();
    assert!(!report.stopped, "reported as still running");
    assert!(sealed(&node), "the sealed checkpoint stays");
    assert_eq!(
        host.calls(),
        [
            "criu --version",
            "freeze",
            "runc checkpoint",
            "kill-all",
            "thaw"
        ],
        "thawed again: it was frozen only for its stop"
    );
}

/// The in-flight record is the transaction's: written into the request's `record_dir` before
/// anything runs and gone after; a directory it cannot be written in refuses the checkpoint
/// before anything is done.
#[test]
fn the_in_flight_record_is_written_first_and_removed_after() {
    let node = Node::new();
    let host = FakeHost::new(false);
    let record = node.path("bundle").join(crate::inflight::INFLIGHT_FILE);
    checkpoint(&request(&node, false, false), &host).unwrap();
    assert!(sealed(&node));
    assert!(!record.exists(), "{} is left", record.display());

    let node = Node::new();
    let host = FakeHost::new(false);
    let mut req = request(&node, false, false);
    req.record_dir = node.path("no-such-dir");
    let e = checkpoint(&req, &host).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Precondition), "{e}");
    assert!(
        e.to_string().contains("cannot record the checkpoint in")
            && e.to_string().contains("nothing was done"),
        "{e}"
    );
    assert!(host.calls().is_empty(), "{:?}", host.calls());
    assert!(!node.path("ck").exists(), "the image directory was made");
}
