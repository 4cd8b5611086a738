//! `gpusnap-runc` with the real runc and CRIU: pass-through, checkpoint/restore of a busybox
//! counter, refusal of a tampered image before CRIU, and `gpusnap inspect` on the results.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// A gpusnap config pointing runc at the rig's CRIU.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("gpusnap.toml");
    fs::write(&p, format!("[criu]\nbinary_dir = \"{RIG_BIN}\"\n{extra}")).unwrap();
    p
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gsr-")
        .tempdir_in("/tmp")
        .unwrap()
}

#[test]
fn version_and_help_pass_through() {
    let out = run(GPUSNAP_RUNC, ["--version"]);
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = text(&out.stdout);
    let runc = run("runc", ["--version"]);
    assert!(
        stdout.starts_with(&text(&runc.stdout)),
        "runc's lines first:\n{stdout}"
    );
    assert!(
        stdout.ends_with(&format!("gpusnap-runc: {}\n", env!("CARGO_PKG_VERSION"))),
        "{stdout}"
    );

    // CRI-O decides whether the runtime can checkpoint from this.
    let out = run(GPUSNAP_RUNC, ["checkpoint", "--help"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        text(&out.stdout).contains("runc checkpoint"),
        "{}",
        describe(&out)
    );
}

#[test]
fn unknown_container_gets_runcs_own_error_and_exit_code() {
    let dir = scratch();
    let root = dir.path().join("root");
    for sub in [
        &["state", "no-such-ctr"][..],
        &["checkpoint", "no-such-ctr"][..],
        &["kill", "no-such-ctr", "KILL"][..],
    ] {
        let mut args = vec!["--root", root.to_str().unwrap()];
        args.extend_from_slice(sub);
        let ours = run(GPUSNAP_RUNC, &args);
        let theirs = run("runc", &args);
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{sub:?}: {}",
            describe(&ours)
        );
        assert_ne!(ours.status.code(), Some(0));
        assert!(
            text(&ours.stderr).contains("container does not exist"),
            "{sub:?}: {}",
            describe(&ours)
        );
    }
}

#[test]
fn invalid_config_is_refused_naming_the_setting() {
    let dir = scratch();
    let cfg = config(dir.path(), "[storage]\ntransfer_buffer_count = 0\n");
    let out = std::process::Command::new(GPUSNAP_RUNC)
        .args(["state", "x"])
        .env("GPUSNAP_CONFIG", &cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("storage.transfer_buffer_count"),
        "{}",
        describe(&out)
    );
}

#[test]
fn checkpoint_and_restore_a_counter() {
    require_root();
    let dir = scratch();
    let cfg = config(dir.path(), "");
    let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
    let c = BusyboxContainer::create(dir.path(), &unique("gsr-count"), COUNTER);
    c.start();
    // Long enough that a restart from zero could never pass for a continuation.
    let before = wait_for(Duration::from_secs(20), || c.count().filter(|n| *n >= 20));
    assert!(before.is_some(), "counter did not start");

    // 1. --leave-running: the container keeps counting, the image is sealed.
    let images_live = dir.path().join("images-live");
    let (code, _, err) = c.wrapper(
        &[
            "checkpoint",
            "--leave-running",
            "--image-path",
            images_live.to_str().unwrap(),
            &c.id,
        ],
        &env,
        dir.path(),
    );
    assert_eq!(code, 0, "checkpoint --leave-running failed:\n{err}");
    assert_eq!(c.status().as_deref(), Some("running"));
    let inspect = gpusnap(["inspect", "--json", images_live.to_str().unwrap()]);
    assert!(inspect.status.success(), "{}", describe(&inspect));
    let v: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(v["validation"]["status"], "complete", "{v:#}");
    assert_eq!(v["manifest"]["container_id"], c.id.as_str());
    assert_eq!(v["manifest"]["options"]["exit"], false);
    assert_eq!(v["manifest"]["criu_version"], "4.2.1");
    assert_eq!(v["manifest"]["bundle"], c.bundle.to_str().unwrap());
    assert!(
        v["manifest"]["gpu"].is_null(),
        "CPU-only container has no GPU section"
    );
    let procs = v["manifest"]["processes"].as_array().unwrap();
    assert!(
        procs
            .iter()
            .any(|p| p["container_pid"] == 1 && p["command"][0] == "/bin/sh"),
        "{procs:?}"
    );
    assert!(v["manifest"]["images"]["files"].as_array().unwrap().len() > 3);
    let summary = gpusnap(["inspect", images_live.to_str().unwrap()]);
    let summary = text(&summary.stdout);
    assert!(
        summary.contains(&format!("Container   {}", c.id)),
        "{summary}"
    );
    assert!(
        summary.contains("GPU         none (CPU-only checkpoint)"),
        "{summary}"
    );
    assert!(summary.contains("Validation  complete"), "{summary}");

    // 2. A plain checkpoint stops the container (runc's default).
    let images = dir.path().join("images");
    let work = dir.path().join("work");
    let (code, _, err) = c.wrapper(
        &[
            "checkpoint",
            "--image-path",
            images.to_str().unwrap(),
            "--work-path",
            work.to_str().unwrap(),
            &c.id,
        ],
        &env,
        dir.path(),
    );
    assert_eq!(code, 0, "checkpoint failed:\n{err}");
    assert_eq!(
        c.status(),
        None,
        "runc destroys the container after a full dump"
    );
    assert!(images
        .join(gpusnap_criu_bridge::layout::MANIFEST_FILE)
        .is_file());
    assert!(work.join("dump.log").is_file(), "--work-path reached CRIU");
    let at_checkpoint = c.count().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        c.count(),
        Some(at_checkpoint),
        "nothing runs after the dump"
    );

    // The same checkpoint as a CRI checkpoint archive (what kubelet writes): images under
    // checkpoint/, next to the engine's .dump files.
    let archive = dir.path().join("checkpoint-archive.tar");
    {
        let mut b = tar::Builder::new(fs::File::create(&archive).unwrap());
        let spec = br#"{"annotations":{}}"#;
        let mut h = tar::Header::new_gnu();
        h.set_size(spec.len() as u64);
        h.set_mode(0o600);
        h.set_cksum();
        b.append_data(&mut h, "spec.dump", &spec[..]).unwrap();
        b.append_dir_all("checkpoint", &images).unwrap();
        b.finish().unwrap();
    }
    let out = gpusnap(["inspect", "--json", archive.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "archive");
    assert_eq!(v["validation"]["status"], "complete", "{v:#}");
    assert_eq!(v["manifest"]["container_id"], c.id.as_str());
    let quick = gpusnap(["inspect", "--no-verify", archive.to_str().unwrap()]);
    assert!(
        text(&quick.stdout).contains("not verified"),
        "{}",
        describe(&quick)
    );

    // 3. A tampered copy is refused before CRIU runs.
    let tampered = dir.path().join("images-tampered");
    copy_dir(&images, &tampered);
    let pages = fs::read_dir(&tampered)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("pages-")
        })
        .expect("CRIU wrote no pages image");
    let mut bytes = fs::read(&pages).unwrap();
    bytes[0] ^= 0xff;
    fs::write(&pages, bytes).unwrap();
    let rwork = dir.path().join("restore-work-tampered");
    fs::create_dir_all(&rwork).unwrap();
    let log = dir.path().join("runc-log.json");
    let mut args = vec![
        "--log".to_owned(),
        log.display().to_string(),
        "--log-format".into(),
        "json".into(),
    ];
    args.extend(
        [
            "restore",
            "-d",
            "--image-path",
            tampered.to_str().unwrap(),
            "--work-path",
            rwork.to_str().unwrap(),
            "--bundle",
            c.bundle.to_str().unwrap(),
            &c.id,
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = c.wrapper(&args, &env, dir.path());
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("refusing to restore") && err.contains("is corrupted"),
        "{err}"
    );
    assert!(
        !rwork.join("restore.log").exists(),
        "CRIU must not have run"
    );
    assert_eq!(c.status(), None);
    // conmon and CRI-O read runc's --log for the error.
    let logged = fs::read_to_string(&log).unwrap();
    let line: serde_json::Value = serde_json::from_str(logged.lines().last().unwrap()).unwrap();
    assert_eq!(line["level"], "error");
    assert!(
        line["msg"].as_str().unwrap().contains("is corrupted"),
        "{logged}"
    );
    let inspect = gpusnap(["inspect", tampered.to_str().unwrap()]);
    assert_eq!(inspect.status.code(), Some(1), "{}", describe(&inspect));
    assert!(
        text(&inspect.stdout).contains("REFUSED"),
        "{}",
        describe(&inspect)
    );

    // 4. The intact image restores and the counter carries on from where it was.
    let rwork = dir.path().join("restore-work");
    fs::create_dir_all(&rwork).unwrap();
    let (code, _, err) = c.wrapper(
        &[
            "restore",
            "-d",
            "--image-path",
            images.to_str().unwrap(),
            "--work-path",
            rwork.to_str().unwrap(),
            "--bundle",
            c.bundle.to_str().unwrap(),
            &c.id,
        ],
        &env,
        dir.path(),
    );
    assert_eq!(code, 0, "restore failed:\n{err}");
    assert_eq!(c.status().as_deref(), Some("running"));
    let after = wait_for(Duration::from_secs(10), || {
        c.count().filter(|n| *n > at_checkpoint + 5)
    });
    let after = after.unwrap_or_else(|| {
        panic!(
            "counter stuck at {:?} (checkpoint {at_checkpoint})",
            c.count()
        )
    });
    assert!(
        after < at_checkpoint + 200,
        "counter jumped: {at_checkpoint} -> {after}"
    );
    // Restore wrote its logs to the work dir, never into the image: it can be restored again.
    assert!(rwork.join("restore.log").exists());
    let again = gpusnap(["inspect", "--json", images.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["validation"]["status"], "complete", "{v:#}");
}

#[test]
fn remote_pages_are_refused() {
    let dir = scratch();
    let out = run(
        GPUSNAP_RUNC,
        [
            "--root",
            dir.path().to_str().unwrap(),
            "checkpoint",
            "--lazy-pages",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("--lazy-pages"),
        "{}",
        describe(&out)
    );
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// With a (fake) CUDA driver that reports the container's init as a CUDA process, the wrapper
/// locks and checkpoints it around runc's dump, then restores and unlocks it
/// (--leave-running), and records the GPU section.
#[test]
fn gpu_process_is_locked_around_the_dump() {
    use gpusnap_fake_libcuda::{FakeCuda, FakeDevice, FakeState};
    const GPU_UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";
    require_root();
    let dir = scratch();
    let fake = FakeCuda::create(dir.path().join("cuda")).unwrap();
    fake.set_devices(&[FakeDevice::new(GPU_UUID, "NVIDIA H200", 141 << 30)])
        .unwrap();
    let cfg = config(
        dir.path(),
        &format!("[cuda]\nlibrary = \"{}\"\n", fake.library_path().display()),
    );
    let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
    let c = BusyboxContainer::create(dir.path(), &unique("gsr-gpu"), COUNTER);
    c.start();
    assert!(wait_for(Duration::from_secs(20), || c.count()).is_some());
    let state = run(
        "runc",
        [&c.root_args()[..], &["state".to_owned(), c.id.clone()]].concat(),
    );
    let pid = serde_json::from_slice::<serde_json::Value>(&state.stdout).unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    fake.register(pid).unwrap();

    let images = dir.path().join("images");
    let (code, _, err) = c.wrapper(
        &[
            "checkpoint",
            "--leave-running",
            "--image-path",
            images.to_str().unwrap(),
            &c.id,
        ],
        &env,
        dir.path(),
    );
    assert_eq!(code, 0, "{err}");
    let calls: Vec<String> = fake.calls_for(pid).unwrap();
    assert_eq!(
        calls,
        ["lock 0", "checkpoint 0", "restore 0", "unlock 0"],
        "driver calls for {pid}"
    );
    assert_eq!(fake.state(pid).unwrap(), Some(FakeState::Running));
    assert_eq!(c.status().as_deref(), Some("running"));

    let out = gpusnap(["inspect", "--json", images.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["validation"]["status"], "complete", "{v:#}");
    let gpu = &v["manifest"]["gpu"];
    assert_eq!(gpu["engine"], "driver-managed", "{v:#}");
    assert_eq!(gpu["processes"][0]["host_pid"], pid);
    assert_eq!(gpu["processes"][0]["cuda"]["container_pid"], 1, "{gpu:#}");
    // The busybox process has no /dev/nvidia* open: every GPU the driver lists is recorded.
    assert_eq!(
        gpu["processes"][0]["devices"],
        serde_json::json!([GPU_UUID]),
        "{gpu:#}"
    );
    let summary = text(&gpusnap(["inspect", images.to_str().unwrap()]).stdout);
    assert!(
        summary.contains("GPU         engine driver-managed, 1 CUDA process(es)"),
        "{summary}"
    );

    // A GPU image must be restored detached (CUDA restore runs after runc returns).
    let (code, _, err) = c.wrapper(
        &[
            "restore",
            "--image-path",
            images.to_str().unwrap(),
            "--bundle",
            c.bundle.to_str().unwrap(),
            "other-id",
        ],
        &env,
        dir.path(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--detach"), "{err}");
}
