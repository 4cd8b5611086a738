//! `gpusnap-runc` with the real runc and CRIU: pass-through, checkpoint/restore of a busybox
//! counter through the same transactions the shim runs, refusal of a tampered image before
//! CRIU, a failed checkpoint that leaves the container running, GPU checkpoints against the
//! fake CUDA driver, and `gpusnap inspect` on the results.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpusnap_testkit::bundle::{BusyboxContainer, COUNTER};
use gpusnap_testkit::cmd::{describe, gpusnap, require_root, run, text, unique};
use gpusnap_testkit::paths::{binary, write_criu_config};
use gpusnap_testkit::wait::wait_some;

fn gpusnap_runc() -> PathBuf {
    binary("gpusnap-runc")
}

/// A gpusnap config pointing runc at the rig's CRIU.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("gpusnap.toml");
    write_criu_config(&p, extra).unwrap();
    p
}

/// The lines gpusnap-runc printed as its own error (`gpusnap-runc: ...`), asserting that
/// stderr holds nothing else and no terminal colours (stderr is a file here).
fn error_lines(stderr: &str) -> Vec<&str> {
    assert!(
        !stderr.contains('\x1b'),
        "ANSI escapes on a non-terminal: {stderr:?}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.iter().all(|l| l.starts_with("gpusnap-runc: ")),
        "stderr holds more than the error line(s): {stderr:?}"
    );
    lines
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gsr-")
        .tempdir_in("/tmp")
        .unwrap()
}

#[test]
fn version_and_help_pass_through() {
    let out = run(gpusnap_runc(), ["--version"]);
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
    let out = run(gpusnap_runc(), ["checkpoint", "--help"]);
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
        let ours = run(gpusnap_runc(), &args);
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

/// Podman runs `kill` and `delete` with no PATH at all: gpusnap-runc still finds runc.
#[test]
fn runc_is_found_without_a_path() {
    let dir = scratch();
    let root = dir.path().join("root");
    let out = Command::new(gpusnap_runc())
        .args(["--root", root.to_str().unwrap(), "state", "no-such-ctr"])
        .env_clear()
        .output()
        .unwrap();
    let theirs = run(
        "runc",
        ["--root", root.to_str().unwrap(), "state", "no-such-ctr"],
    );
    assert_eq!(
        out.status.code(),
        theirs.status.code(),
        "{}",
        describe(&out)
    );
    assert!(
        text(&out.stderr).contains("container does not exist"),
        "runc ran and answered: {}",
        describe(&out)
    );
}

/// A checkpoint and a restore with an empty environment apart from the config: CRIU is found
/// from `criu.binary_dir` and the system path, not the caller's PATH.
#[test]
fn checkpoint_and_restore_without_a_path() {
    require_root();
    let dir = scratch();
    let cfg = config(dir.path(), "");
    let c = BusyboxContainer::create(dir.path(), &unique("gsr-nopath"), COUNTER);
    c.start();
    assert!(
        wait_some(Duration::from_secs(20), || c.count().filter(|n| *n >= 5)).is_some(),
        "counter did not start"
    );
    let images = dir.path().join("images");
    let bare = |args: &[&str]| {
        let mut cmd = Command::new(gpusnap_runc());
        cmd.env_clear()
            .env("GPUSNAP_CONFIG", &cfg)
            .args(c.root_args())
            .args(args);
        gpusnap_testkit::bundle::run_detached_stdio(cmd, dir.path())
    };
    let (code, _, err) = bare(&[
        "checkpoint",
        "--image-path",
        images.to_str().unwrap(),
        &c.id,
    ]);
    assert_eq!(code, 0, "checkpoint without PATH: {err}");
    assert!(c.status().is_none(), "runc's checkpoint ends the container");
    let (code, _, err) = bare(&[
        "restore",
        "-d",
        "--image-path",
        images.to_str().unwrap(),
        "--bundle",
        c.bundle.to_str().unwrap(),
        &c.id,
    ]);
    assert_eq!(code, 0, "restore without PATH: {err}");
    assert_eq!(c.status().as_deref(), Some("running"));
}

#[test]
fn invalid_config_is_refused_naming_the_setting() {
    let dir = scratch();
    let cfg = config(dir.path(), "[storage]\ntransfer_buffer_count = 0\n");
    let out = Command::new(gpusnap_runc())
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
    let before = wait_some(Duration::from_secs(20), || c.count().filter(|n| *n >= 20));
    assert!(before.is_some(), "counter did not start");

    // 1. --leave-running: the container keeps counting, the image is sealed.
    let images_live = dir.path().join("images-live");
    let (code, _, err) = checkpoint(&c, &images_live, &["--leave-running"], &env, dir.path());
    assert_eq!(code, 0, "checkpoint --leave-running failed:\n{err}");
    assert_eq!(c.status().as_deref(), Some("running"));
    let v = inspect_json(&images_live);
    assert_eq!(v["validation"]["status"], "complete", "{v:#}");
    let m = &v["manifest"];
    assert_eq!(m["format_version"], 2, "{m:#}");
    assert_eq!(m["container_id"], c.id.as_str());
    // The CRIU flags of the dump by runc's names; nothing host-specific is recorded.
    assert_eq!(
        m["criu"],
        serde_json::json!({
            "tcp_established": false,
            "ext_unix_sk": false,
            "shell_job": false,
            "file_locks": false,
            "empty_ns": [],
            "manage_cgroups_mode": null
        }),
        "{m:#}"
    );
    assert!(
        m.get("options").is_none() && m.get("bundle").is_none(),
        "{m:#}"
    );
    assert_eq!(m["criu_version"], "4.2.1");
    assert!(m["gpu"].is_null(), "CPU-only container has no GPU section");
    let procs = m["processes"].as_array().unwrap().clone();
    assert!(procs.iter().any(|p| p["container_pid"] == 1), "{procs:?}");
    assert!(
        procs.iter().all(|p| p.get("host_pid").is_none()),
        "{procs:?}"
    );
    assert!(m["images"]["files"].as_array().unwrap().len() > 3);
    let summary = gpusnap(["inspect", images_live.to_str().unwrap()]);
    let summary = text(&summary.stdout);
    assert!(
        summary.contains(&format!("Container   {}", c.id)),
        "{summary}"
    );
    assert!(
        summary.contains("CRIU flags  none") && !summary.contains("Options"),
        "{summary}"
    );
    assert!(summary.contains("pid 1 in the container"), "{summary}");
    assert!(
        summary.contains("GPU         none (CPU-only checkpoint)"),
        "{summary}"
    );
    assert!(summary.contains("Validation  complete"), "{summary}");

    // 2. A plain checkpoint stops the container (runc's default).
    let init_pid = c.pid().expect("runc state gives the init pid");
    let images = dir.path().join("images");
    let work = dir.path().join("work");
    let (code, _, err) = checkpoint(
        &c,
        &images,
        &["--work-path", work.to_str().unwrap()],
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
        .join(gpusnap_checkpoint::layout::MANIFEST_FILE)
        .is_file());
    assert!(work.join("dump.log").is_file(), "--work-path reached CRIU");
    let at_checkpoint = c.count().unwrap();
    // Nothing runs after the dump: the init is gone (or a zombie nobody reaped yet), so the
    // counter cannot move.
    let state = gpusnap_testkit::checkpoint::proc_state(init_pid as u32);
    assert!(
        matches!(state, None | Some('Z')),
        "the checkpointed init {init_pid} still runs (state {state:?})"
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
    let v = inspect_json(&archive);
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
    let pages = files_named(&tampered, "pages-")
        .into_iter()
        .next()
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
    let lines = error_lines(&err);
    assert_eq!(lines.len(), 1, "the error is printed once: {err:?}");
    assert!(
        lines[0].starts_with(&format!("gpusnap-runc: cannot restore {}: ", c.id))
            && lines[0].contains("is corrupted"),
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
    assert_eq!(
        line["msg"].as_str().unwrap(),
        lines[0],
        "the same message in runc's log: {logged}"
    );
    let inspect = gpusnap(["inspect", tampered.to_str().unwrap()]);
    assert_eq!(inspect.status.code(), Some(1), "{}", describe(&inspect));
    assert!(
        text(&inspect.stdout).contains("REFUSED"),
        "{}",
        describe(&inspect)
    );

    // 4. The intact image restores and the counter carries on from where it was.
    let (code, _, err) = c.wrapper_restore(&images, &env, dir.path());
    let rwork = dir.path().join("restore-work");
    assert_eq!(code, 0, "restore failed:\n{err}");
    assert_eq!(c.status().as_deref(), Some("running"));
    let after = wait_some(Duration::from_secs(10), || {
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
    let v = inspect_json(&images);
    assert_eq!(v["validation"]["status"], "complete", "{v:#}");

    // Last, so that a failure here does not hide the rest: each process is recorded with its
    // pid in the container and its command (format 2 drops only host pids and the bundle).
    assert!(
        procs
            .iter()
            .any(|p| p["container_pid"] == 1 && p["command"][0] == "/bin/sh"),
        "the manifest of the --leave-running checkpoint records no command for the \
         container's init: {procs:?}"
    );
}

#[test]
fn remote_pages_are_refused() {
    let dir = scratch();
    let out = run(
        gpusnap_runc(),
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

/// `gpusnap-runc checkpoint <flags> --image-path <images> <id>`.
fn checkpoint(
    c: &BusyboxContainer,
    images: &Path,
    flags: &[&str],
    env: &[(&str, &str)],
    out_dir: &Path,
) -> (i32, String, String) {
    let mut args = vec!["checkpoint"];
    args.extend_from_slice(flags);
    args.extend(["--image-path", images.to_str().unwrap(), &c.id]);
    c.wrapper(&args, env, out_dir)
}

/// `gpusnap inspect --json` of a checkpoint, which must succeed.
fn inspect_json(path: &Path) -> serde_json::Value {
    let out = gpusnap(["inspect", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The files in `dir` whose names start with `prefix`.
fn files_named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect()
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
    assert!(wait_some(Duration::from_secs(20), || c.count()).is_some());
    let pid = c.pid().expect("runc state gives the init pid");
    fake.register(pid).unwrap();

    let images = dir.path().join("images");
    let (code, _, err) = checkpoint(&c, &images, &["--leave-running"], &env, dir.path());
    assert_eq!(code, 0, "{err}");
    let calls: Vec<String> = fake.calls_for(pid).unwrap();
    assert_eq!(
        calls,
        ["lock 0", "checkpoint 0", "restore 0", "unlock 0"],
        "driver calls for {pid}"
    );
    assert_eq!(fake.state(pid).unwrap(), Some(FakeState::Running));
    assert_eq!(c.status().as_deref(), Some("running"));

    let v = inspect_json(&images);
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
    let lines = error_lines(&err);
    assert_eq!(lines.len(), 1, "{err:?}");
    assert!(
        lines[0].starts_with("gpusnap-runc: cannot restore other-id: ") && err.contains("--detach"),
        "{err}"
    );
}

/// A restore onto a rootfs that lost a file the checkpointed process holds open is refused
/// before runc runs, naming the file (CRIU would fail mid-restore with "criu failed: type
/// NOTIFY errno 0"); with the file back as it was (same size), the same images restore.
#[test]
fn open_file_missing_from_the_rootfs_is_refused_before_runc() {
    require_root();
    let dir = scratch();
    let cfg = config(dir.path(), "");
    let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
    let script = "exec 3>/tmp/held; echo held >&3; while :; do sleep 0.1; done";
    let c = BusyboxContainer::create(dir.path(), &unique("gsr-held"), script);
    c.start();
    assert!(
        wait_some(Duration::from_secs(20), || c
            .read_file("tmp/held")
            .filter(|s| s == "held\n"))
        .is_some(),
        "the container did not write /tmp/held"
    );
    let images = dir.path().join("images");
    let (code, _, err) = checkpoint(&c, &images, &[], &env, dir.path());
    assert_eq!(code, 0, "checkpoint failed:\n{err}");
    let held = c.bundle.join("rootfs/tmp/held");
    // Put back with its mode: CRIU compares the permission bits too.
    let perms = fs::metadata(&held).unwrap().permissions();
    fs::remove_file(&held).unwrap();

    let restore = |id: &str| {
        c.wrapper(
            &[
                "restore",
                "-d",
                "--image-path",
                images.to_str().unwrap(),
                "--bundle",
                c.bundle.to_str().unwrap(),
                id,
            ],
            &env,
            dir.path(),
        )
    };
    let (code, _, err) = restore(&c.id);
    assert_eq!(code, 1, "{err}");
    let lines = error_lines(&err);
    assert_eq!(lines.len(), 1, "{err:?}");
    for want in [
        format!("gpusnap-runc: cannot restore {}: ", c.id),
        "/tmp/held (missing)".into(),
        "--rw".into(),
        "nothing was restored".into(),
    ] {
        assert!(lines[0].contains(&want), "lacks {want:?}: {err}");
    }
    assert_eq!(
        c.status(),
        None,
        "runc knows the container after the refusal"
    );
    // Without --work-path, CRIU would have written its log into the image directory.
    assert!(
        !images.join("restore.log").exists(),
        "CRIU ran: {}",
        images.join("restore.log").display()
    );

    fs::write(&held, "held\n").unwrap();
    fs::set_permissions(&held, perms).unwrap();
    let (code, _, err) = restore(&c.id);
    assert_eq!(code, 0, "restore with the file back:\n{err}");
    assert_eq!(c.status().as_deref(), Some("running"));
    assert!(images.join("restore.log").is_file(), "CRIU logs elsewhere");
}

/// A checkpoint that CRIU cannot take (an established TCP connection without
/// `--tcp-established`) is reported once, scrubbed, and leaves the container running.
#[test]
fn failed_checkpoint_scrubs_and_keeps_the_container_running() {
    require_root();
    let dir = scratch();
    let cfg = config(dir.path(), "");
    let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
    // A connection over the container's own loopback, held open by both ends.
    let script = format!(
        "sleep 1000 | busybox nc -l -p 7777 >/dev/null & sleep 0.5; \
         sleep 1000 | busybox nc 127.0.0.1 7777 >/dev/null & {COUNTER}"
    );
    let c = BusyboxContainer::create(dir.path(), &unique("gsr-fail"), &script);
    std::os::unix::fs::symlink("busybox", c.bundle.join("rootfs/bin/nc")).ok();
    c.start();
    assert!(
        wait_some(Duration::from_secs(20), || c.count().filter(|n| *n >= 5)).is_some(),
        "counter did not start"
    );
    let images = dir.path().join("images");
    let log = dir.path().join("runc-log.json");
    let (code, _, err) = c.wrapper(
        &[
            "--log",
            log.to_str().unwrap(),
            "--log-format",
            "json",
            "checkpoint",
            "--image-path",
            images.to_str().unwrap(),
            &c.id,
        ],
        &env,
        dir.path(),
    );
    assert_ne!(
        code, 0,
        "checkpoint of an established TCP connection succeeded"
    );
    let lines = error_lines(&err);
    assert_eq!(lines.len(), 1, "the error is printed once: {err:?}");
    let line = lines[0];
    assert!(
        line.starts_with(&format!("gpusnap-runc: checkpoint of {} failed: ", c.id)),
        "{line}"
    );
    assert!(
        line.ends_with(
            "; the container keeps running as before and nothing in the checkpoint directory \
             looks complete"
        ),
        "{line}"
    );
    let logged = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.lines().any(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|v| v["level"] == "error" && v["msg"] == line)
        }),
        "runc's log holds the same message: {logged}"
    );

    // Scrubbed: no manifest and no CRIU image is left to look like a checkpoint.
    let left: Vec<String> = fs::read_dir(&images)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.iter()
            .all(|n| !n.ends_with(".img") && !n.starts_with("gpusnap-")),
        "{left:?}"
    );
    // And the container runs on.
    assert_eq!(c.status().as_deref(), Some("running"));
    let now = c.count().unwrap();
    assert!(
        wait_some(Duration::from_secs(10), || c.count().filter(|n| *n > now)).is_some(),
        "the counter stopped at {now}"
    );
}

/// A posix-engine GPU checkpoint (CUDA 13.4 CustomStorage, GPU memory written into the
/// checkpoint directory) taken by gpusnap-runc restores through gpusnap-runc, GPU memory
/// included.
#[test]
fn posix_engine_gpu_checkpoint_restores() {
    use gpusnap_fake_libcuda::FakeCuda;
    require_root();
    let dir = scratch();
    let fake = FakeCuda::create(dir.path().join("cuda")).unwrap();
    fake.set_driver_version(13040).unwrap();
    let cfg = config(
        dir.path(),
        &format!(
            "[cuda]\nlibrary = \"{}\"\n[storage]\nengine = \"posix\"\n",
            fake.library_path().display()
        ),
    );
    let env = [("GPUSNAP_CONFIG", cfg.to_str().unwrap())];
    let id = unique("gsr-posix");
    let c = BusyboxContainer::create(dir.path(), &id, COUNTER);
    // The fake keys this CUDA process by the id and its pid in the container (1), which — like
    // real driver state in process memory — survives the restore under a new host pid; so do
    // its device memory and the sizes the CustomStorage checkpoint records.
    c.add_env(&format!("GPUSNAP_FAKE_CUDA_ID={id}"));
    let key = FakeCuda::id_key(&id, 1);
    fs::write(fake.dir().join("procs").join(&key), "running\n").unwrap();
    let device_memory = gpusnap_testkit::fixtures::noise(96 * 1024, u64::from(std::process::id()));
    fake.set_device_memory_of(&key, 0, &device_memory).unwrap();
    c.start();
    assert!(wait_some(Duration::from_secs(20), || c.count().filter(|n| *n >= 10)).is_some());
    let old_pid = c.pid().unwrap();

    let images = dir.path().join("images");
    let (code, _, err) = checkpoint(&c, &images, &[], &env, dir.path());
    assert_eq!(code, 0, "checkpoint failed:\n{err}");
    assert_eq!(
        c.status(),
        None,
        "the container is gone after the checkpoint"
    );
    let at_checkpoint = c.count().unwrap();
    let v = inspect_json(&images);
    assert_eq!(v["validation"]["status"], "complete", "{v:#}");
    assert_eq!(v["manifest"]["gpu"]["engine"], "posix", "{v:#}");
    let extents = files_named(&images, "gpusnap-gpu-");
    assert_eq!(extents.len(), 1, "one extent for the one GPU: {extents:?}");
    assert!(
        fs::read(&extents[0]).unwrap() == device_memory,
        "the extent holds exactly the device memory"
    );

    // What CRIU hands the driver: the process CHECKPOINTED, its device memory gone (it is in
    // the extent).
    fake.emulate_criu_restore(&key, false).unwrap();
    assert_eq!(fake.device_memory_of(&key, 0).unwrap(), None);

    let (code, _, err) = c.wrapper_restore(&images, &env, dir.path());
    assert_eq!(code, 0, "restore failed:\n{err}");
    assert_eq!(c.status().as_deref(), Some("running"));
    let new_pid = c.pid().unwrap();
    assert_ne!(new_pid, old_pid);
    assert_eq!(
        fake.calls_for(new_pid).unwrap(),
        ["restore 0", "operation_complete 0", "unlock 0"],
        "CUDA restore, CustomStorage commit, then unlock of the restored pid"
    );
    // The device memory came back from the extent.
    let vram = fake
        .device_memory_of(&key, 0)
        .unwrap()
        .expect("device memory restored");
    assert!(
        vram == device_memory,
        "restored device memory differs from what was checkpointed"
    );
    let after = wait_some(Duration::from_secs(10), || {
        c.count().filter(|n| *n > at_checkpoint + 3)
    });
    assert!(after.is_some(), "counter stuck at {at_checkpoint}");
}
