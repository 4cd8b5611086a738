//! Real runc + CRIU round trip through this crate's command builders and runner, with the
//! checkpoint directory sealed and validated by `gpusnap_checkpoint`.
//!
//! Needs root, `runc` on PATH, CRIU at /opt/gpusnap-rig/bin/criu (scripts/setup-env.sh) and a
//! static busybox at /bin/busybox. A missing prerequisite fails the test, naming it.

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use gpusnap_checkpoint::{
    begin_checkpoint, scrub_incomplete, seal_checkpoint, validate_for_restore, Manifest,
    ProcessRecord, RestoreRefusal,
};
use gpusnap_criu_bridge::{
    find_in_path, probe_criu, run_captured, runc_version, CriuFlags, Dump, Restore, RuncError,
    RuncGlobal, MIN_CRIU_GPU,
};
use gpusnap_testkit::bundle::{BusyboxContainer, COUNTER};
use gpusnap_testkit::cmd::{require_root, unique};
use gpusnap_testkit::paths::rig_bin_dir;
use gpusnap_testkit::wait::wait_some;

fn require_prerequisites() {
    require_root();
    assert!(
        find_in_path("runc", &std::env::var_os("PATH").unwrap_or_default()).is_some(),
        "runc not on PATH: install Debian's runc"
    );
    assert!(
        rig_bin_dir().join("criu").exists(),
        "{}/criu missing: run scripts/setup-env.sh",
        rig_bin_dir().display()
    );
}

fn global(c: &BusyboxContainer) -> RuncGlobal {
    RuncGlobal {
        root: Some(c.runc_root.clone()),
        criu_dir: Some(rig_bin_dir()),
        ..Default::default()
    }
}

#[test]
fn checkpoint_seal_validate_restore() {
    require_prerequisites();
    let tmp = tempfile::Builder::new()
        .prefix("gsb-")
        .tempdir_in("/tmp")
        .unwrap();
    let images = tmp.path().join("checkpoint");
    let work = tmp.path().join("work");
    fs::create_dir_all(&work).unwrap();
    let ctr = BusyboxContainer::create(tmp.path(), &unique("gpusnap-it"), COUNTER);
    let global = global(&ctr);

    // The probe finds the rig's CRIU on the PATH runc will get.
    let criu = probe_criu(&global.effective_search_path()).unwrap();
    assert_eq!(criu.path, rig_bin_dir().join("criu"));
    criu.require(MIN_CRIU_GPU).unwrap();

    ctr.start();
    assert!(
        wait_some(Duration::from_secs(20), || ctr.count().filter(|n| *n >= 20)).is_some(),
        "the counter did not reach 20"
    );

    // Checkpoint without --leave-running, so the same id can be restored afterwards.
    let dump = Dump {
        image_dir: images.clone(),
        work_dir: Some(work.clone()),
        ..Default::default()
    };
    begin_checkpoint(&images).unwrap();
    let cmd = global.checkpoint(&ctr.id, &dump).unwrap();
    let args = cmd.args_lossy();
    assert!(!args.contains(&"--leave-running".to_owned()), "{args:?}");
    let started = Instant::now();
    run_captured(&cmd, &dump.criu_log(), Some(Duration::from_secs(120)))
        .unwrap_or_else(|e| panic!("{e}"));
    let dump_time = started.elapsed();
    assert!(
        work.join("dump.log").is_file(),
        "CRIU logs into --work-path"
    );
    let at_checkpoint = ctr.count().unwrap();
    assert_eq!(
        ctr.status(),
        None,
        "runc destroys the container after a checkpoint without --leave-running"
    );

    let mut manifest = Manifest::new(&ctr.id, dump.flags.clone());
    manifest.criu_version = Some(criu.version.to_string());
    manifest.runc_version = Some(runc_version(Path::new("runc")).unwrap().version);
    manifest.processes.push(ProcessRecord {
        container_pid: Some(1),
        command: None,
    });
    manifest.record_phase("criu-dump", dump_time);
    let sealed = seal_checkpoint(&images, manifest).unwrap();
    let names: Vec<&str> = sealed
        .images
        .files
        .iter()
        .map(|f| f.path.as_str())
        .collect();
    for expected in ["inventory.img", "pstree.img", "descriptors.json"] {
        assert!(names.contains(&expected), "{expected} not in {names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("pages-")), "{names:?}");
    eprintln!(
        "dump {:?}, {} files, {} bytes, timings {:?}",
        dump_time,
        names.len(),
        sealed.images.total_bytes,
        sealed.timings
    );

    // runc, CRIU and gpusnap together leave a flat directory: containerd's CRI unpacks the
    // checkpoint tar without creating directories (see checkpoint/tests/cri_checkpoint_unpack.rs).
    for e in fs::read_dir(&images).unwrap() {
        let e = e.unwrap();
        assert!(
            !e.file_type().unwrap().is_dir(),
            "{} is a directory",
            e.path().display()
        );
    }

    // A corrupted copy is refused before CRIU would see it.
    let copy = tmp.path().join("copy");
    // The directory is flat, so copying its regular files copies the manifest too.
    fs::create_dir_all(&copy).unwrap();
    for f in fs::read_dir(&images).unwrap() {
        let f = f.unwrap();
        if f.file_type().unwrap().is_file() {
            fs::copy(f.path(), copy.join(f.file_name())).unwrap();
        }
    }
    assert!(copy.join("gpusnap-manifest.json").is_file());
    validate_for_restore(&copy).unwrap();
    let mut pstree = fs::read(copy.join("pstree.img")).unwrap();
    let last = pstree.len() - 1;
    pstree[last] ^= 0xff;
    fs::write(copy.join("pstree.img"), pstree).unwrap();
    assert!(matches!(
        validate_for_restore(&copy),
        Err(RestoreRefusal::DigestMismatch { .. })
    ));

    // Restore the intact one. Its CRIU flags come from the caller, never from the image.
    let validated = validate_for_restore(&images).unwrap();
    assert_eq!(validated.container_id, ctr.id);
    assert_eq!(validated.criu, CriuFlags::default());
    let restore = Restore {
        work_dir: Some(work.clone()),
        pid_file: Some(tmp.path().join("init.pid")),
        // The Go shim restores with --no-subreaper because it is the subreaper; this test is not.
        no_subreaper: false,
        ..Restore::new(&images, &ctr.bundle)
    };
    let out = global
        .restore(&ctr.id, &restore)
        .unwrap()
        .to_command()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restore failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        gpusnap_criu_bridge::criu_log_tail(&restore.criu_log(), 10)
            .map(|t| t.to_string())
            .unwrap_or_default()
    );
    assert_eq!(ctr.status().as_deref(), Some("running"));
    let pid: u32 = fs::read_to_string(tmp.path().join("init.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid > 1);
    // The loop resumes where it stopped instead of starting again from 1.
    let moved = wait_some(Duration::from_secs(20), || {
        ctr.count().filter(|n| *n != at_checkpoint)
    });
    let moved = moved.unwrap_or_else(|| panic!("counter stuck at {at_checkpoint}"));
    assert!(
        moved > at_checkpoint,
        "counter went from {at_checkpoint} to {moved}: restarted, not restored"
    );
}

#[test]
fn failed_checkpoint_carries_runc_error_and_scrubs() {
    require_prerequisites();
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("checkpoint");
    begin_checkpoint(&images).unwrap();
    // A stale image from an earlier attempt must not survive the failure cleanup.
    fs::write(images.join("pages-1.img"), b"stale").unwrap();
    let global = RuncGlobal {
        root: Some(tmp.path().join("runc-root")),
        criu_dir: Some(rig_bin_dir()),
        ..Default::default()
    };
    let dump = Dump {
        image_dir: images.clone(),
        ..Default::default()
    };
    let cmd = global.checkpoint("no-such-ctr", &dump).unwrap();
    let err = run_captured(&cmd, &dump.criu_log(), Some(Duration::from_secs(30))).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, RuncError::Failed { .. }), "{msg}");
    assert!(msg.contains("no-such-ctr"), "{msg}");
    let report = scrub_incomplete(&images).unwrap();
    assert_eq!(report.removed, [images.join("pages-1.img")]);
    assert!(images.exists());
}
