//! Real runc + CRIU round trip through this crate's command builders, manifest and validation.
//!
//! Needs root, `runc` on PATH, CRIU at /opt/gpusnap-rig/bin/criu (scripts/setup-env.sh) and a
//! static busybox at /bin/busybox. When any is missing the test says which and checks only that
//! the CRIU probe reports the missing CRIU, so it still asserts something on a bare machine.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpusnap_criu_bridge::{
    begin_checkpoint, checkpoint_command, find_in_path, probe_criu, restore_command,
    run_checkpoint, runc_version, scrub_incomplete, seal_checkpoint, validate_for_restore,
    CheckpointOptions, Manifest, ProbeError, ProcessRecord, RestoreOptions, RestoreRefusal,
    RuncError, RuncGlobal, MIN_CRIU_GPU,
};

const RIG: &str = "/opt/gpusnap-rig/bin";
const BUSYBOX: &str = "/bin/busybox";

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn missing_prerequisite() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    if find_in_path("runc", &std::env::var_os("PATH").unwrap_or_default()).is_none() {
        return Some("runc not on PATH".into());
    }
    if !Path::new(RIG).join("criu").exists() {
        return Some(format!("{RIG}/criu missing"));
    }
    if !Path::new(BUSYBOX).exists() {
        return Some(format!("{BUSYBOX} missing"));
    }
    None
}

/// Kills and deletes the container however the test ends.
struct Container {
    root: PathBuf,
    id: String,
}

impl Container {
    fn runc(&self) -> Command {
        let mut c = Command::new("runc");
        c.arg("--root").arg(&self.root);
        c
    }

    fn status(&self) -> Option<String> {
        let out = self.runc().arg("state").arg(&self.id).output().ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["status"].as_str().map(str::to_owned)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self
            .runc()
            .args(["delete", "--force", &self.id])
            .stderr(Stdio::null())
            .status();
    }
}

fn make_bundle(bundle: &Path) {
    fs::create_dir_all(bundle.join("rootfs/bin")).unwrap();
    fs::create_dir_all(bundle.join("rootfs/tmp")).unwrap();
    fs::copy(BUSYBOX, bundle.join("rootfs/bin/busybox")).unwrap();
    let ok = Command::new("runc")
        .arg("spec")
        .current_dir(bundle)
        .status()
        .unwrap()
        .success();
    assert!(ok, "runc spec failed");
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!([
        "/bin/busybox",
        "sh",
        "-c",
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; /bin/busybox sleep 0.05; done"
    ]);
    spec["root"]["readonly"] = false.into();
    fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

fn counter(bundle: &Path) -> u64 {
    fs::read_to_string(bundle.join("rootfs/tmp/counter"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn checkpoint_seal_validate_restore() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("real runc/CRIU round trip not run: {why}");
        if !Path::new(RIG).join("criu").exists() {
            assert!(matches!(
                probe_criu(OsStr::new(RIG)),
                Err(ProbeError::CriuNotFound { .. })
            ));
        }
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    let images = tmp.path().join("checkpoint");
    let work = tmp.path().join("work");
    fs::create_dir_all(&work).unwrap();
    make_bundle(&bundle);
    let ctr = Container {
        root: tmp.path().join("runc-root"),
        id: format!("gpusnap-it-{}", std::process::id()),
    };
    let global = RuncGlobal {
        root: Some(ctr.root.clone()),
        criu_dir: Some(RIG.into()),
        ..Default::default()
    };

    // The probe finds the rig's CRIU on the PATH runc will get.
    let criu = probe_criu(&global.effective_search_path()).unwrap();
    assert_eq!(criu.path, Path::new(RIG).join("criu"));
    criu.require(MIN_CRIU_GPU).unwrap();

    let ok = ctr
        .runc()
        .args(["run", "--detach", "--bundle"])
        .arg(&bundle)
        .arg(&ctr.id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "runc run failed");
    wait_for("the counter to reach 20", || counter(&bundle) >= 20);

    // Checkpoint with exit, so the same id can be restored afterwards.
    let opts = CheckpointOptions {
        exit: true,
        work_path: Some(work.clone()),
        ..Default::default()
    };
    begin_checkpoint(&images).unwrap();
    let cmd = checkpoint_command(&global, &ctr.id, &images, &opts).unwrap();
    let started = Instant::now();
    run_checkpoint(
        &cmd,
        opts.criu_log_dir(&images),
        Some(Duration::from_secs(120)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dump_time = started.elapsed();
    let at_checkpoint = counter(&bundle);
    assert_eq!(
        ctr.status(),
        None,
        "runc destroys the container after an exit checkpoint"
    );

    let mut manifest = Manifest::new(&ctr.id, &bundle, opts.clone());
    manifest.criu_version = Some(criu.version.to_string());
    manifest.runc_version = Some(runc_version(Path::new("runc")).unwrap().version);
    manifest.processes.push(ProcessRecord {
        host_pid: 0,
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
    // checkpoint tar without creating directories (see tests/cri_checkpoint_unpack.rs).
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

    // Restore the intact one.
    let validated = validate_for_restore(&images).unwrap();
    assert_eq!(validated.container_id, ctr.id);
    let mut ropts = RestoreOptions::new(&images, &bundle).with_checkpoint_flags(&validated.options);
    ropts.work_path = Some(work.clone());
    ropts.pid_file = Some(tmp.path().join("init.pid"));
    // The Go shim restores with --no-subreaper because it is the subreaper; this test is not.
    ropts.no_subreaper = false;
    let out = restore_command(&global, &ctr.id, &ropts)
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
        gpusnap_criu_bridge::criu_log_tail(&work.join("restore.log"), 10)
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
    wait_for("the counter to move", || counter(&bundle) != at_checkpoint);
    assert!(
        counter(&bundle) > at_checkpoint,
        "counter went from {at_checkpoint} to {}: restarted, not restored",
        counter(&bundle)
    );
}

#[test]
fn failed_checkpoint_carries_runc_error_and_scrubs() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("real runc failure test not run: {why}");
        assert!(RuncGlobal::default().path_env(None).is_none());
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("checkpoint");
    begin_checkpoint(&images).unwrap();
    // A stale image from an earlier attempt must not survive the failure cleanup.
    fs::write(images.join("pages-1.img"), b"stale").unwrap();
    let global = RuncGlobal {
        root: Some(tmp.path().join("runc-root")),
        criu_dir: Some(RIG.into()),
        ..Default::default()
    };
    let cmd = checkpoint_command(
        &global,
        "no-such-ctr",
        &images,
        &CheckpointOptions::default(),
    )
    .unwrap();
    let err = run_checkpoint(&cmd, &images, Some(Duration::from_secs(30))).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, RuncError::Failed { .. }), "{msg}");
    assert!(msg.contains("no-such-ctr"), "{msg}");
    let report = scrub_incomplete(&images).unwrap();
    assert_eq!(report.removed, [images.join("pages-1.img")]);
    assert!(images.exists());
}
