//! GPU checkpoint/restore through containerd and the gpusnap shim, with the test-double
//! `libcuda.so` standing in for the NVIDIA driver (CI has no GPU). The shim loads the double
//! through the same libloading path as the real driver (`cuda.library` in its config, passed
//! with `ctr run --runtime-config-path`), and the double keeps each process's CUDA state in
//! files, so these tests observe exactly which driver calls the shim made, in which order,
//! on which pid, and what state every process is left in.
//!
//! The container's init process is the "CUDA process": it runs with
//! `GPUSNAP_FAKE_CUDA_ID=<id>`, and the double keys its state by that id and the pid inside
//! the container (1), which — like real driver state living in process memory — survives a
//! CRIU restore under a new host pid.

use std::{fs, path::Path, time::Duration};

use anyhow::{ensure, Context, Result};
use gpusnap_fake_libcuda::{FakeCuda, FakeDevice, FakeOp, Fault};
use gpusnap_testkit::can_fail::ensure_frozen;
use gpusnap_testkit::counter::{counter_command, parse_count, run_token, wait_count, Count};
use gpusnap_testkit::{wait_until, OutputExt, Rig, RunOpts, Runtime, TaskState};

struct GpuRig {
    rig: Rig,
    fake: FakeCuda,
    config: std::path::PathBuf,
    /// The run token of this test's counter (see gpusnap_testkit::counter).
    run: String,
    _dir: tempfile::TempDir,
}

impl GpuRig {
    fn start(config_extra: &str) -> Result<Self> {
        let rig = Rig::start_for(Runtime::Gpusnap)?;
        let dir = tempfile::tempdir()?;
        let fake = FakeCuda::create(dir.path().join("fake"))?;
        // Like driver 580 on the H200: a live process without CUDA answers NOT_INITIALIZED.
        fake.set_unknown_pid_code(3)?;
        let config = dir.path().join("gpusnap.toml");
        fs::write(
            &config,
            format!(
                "[cuda]\nlibrary = \"{}\"\nlock_timeout_ms = 2000\n{config_extra}",
                fake.library_path().display()
            ),
        )?;
        Ok(Self {
            rig,
            fake,
            config,
            run: run_token(),
            _dir: dir,
        })
    }

    fn state_file(&self, id: &str) -> std::path::PathBuf {
        self.fake.dir().join("procs").join(format!("id-{id}-1"))
    }

    fn cuda_state(&self, id: &str) -> String {
        fs::read_to_string(self.state_file(id))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// A counter container whose init is a CUDA process of the double.
    fn run_cuda_counter(&self, id: &str) -> Result<u32> {
        fs::write(self.state_file(id), "running\n")?;
        let opts = RunOpts {
            env: vec![format!("GPUSNAP_FAKE_CUDA_ID={id}")],
            extra_args: vec![
                "--runtime-config-path".into(),
                self.config.display().to_string(),
            ],
            ..Default::default()
        };
        let command = counter_command(&self.run);
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let task = self
            .rig
            .run_detached_with(Runtime::Gpusnap, id, &command, &opts)?;
        self.wait_count(id, 1)?;
        Ok(task.pid)
    }

    /// The container's counter, read with `ctr tasks exec` (retried: on a loaded 2-core
    /// machine an exec can fail to start in time).
    fn count(&self, id: &str) -> Option<Count> {
        let mut value = None;
        wait_until(Duration::from_secs(10), || {
            let exec_id = format!("c{}", rand_suffix());
            value = self
                .rig
                .exec(id, &exec_id, &["cat", "/tmp/count"])
                .ok()
                .and_then(|out| parse_count(&String::from_utf8_lossy(&out.stdout)));
            value.is_some()
        });
        value
    }

    /// Waits until this test's counter in `id` reached `min`.
    fn wait_count(&self, id: &str, min: u64) -> Result<Count> {
        wait_count(&self.run, id, min, || self.count(id))
    }

    /// The same process counts on past `from` (bounded wait, no fixed sleep).
    fn keeps_counting(&self, id: &str, from: &Count) -> Result<()> {
        let later = self.wait_count(id, from.n + 3)?;
        ensure!(
            later.token == from.token,
            "{id} runs another process after {from:?}: {later:?}"
        );
        Ok(())
    }

    /// `ctr tasks checkpoint --image-path DIR ID`.
    fn task_checkpoint(&self, id: &str, dir: &Path) -> Result<std::process::Output> {
        let dir = dir.to_str().context("image path is not UTF-8")?;
        self.rig
            .ctr(&["tasks", "checkpoint", "--image-path", dir, id])
    }

    /// A checkpoint that must fail; returns ctr's stderr.
    fn refused_checkpoint(&self, id: &str, dir: &Path) -> Result<String> {
        let out = self.task_checkpoint(id, dir)?;
        ensure!(
            !out.status.success(),
            "checkpoint must fail: {}",
            out.describe()
        );
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// The calls the double logged for `pid`, as "op rc".
    fn calls(&self, pid: u32) -> Vec<String> {
        self.fake
            .calls()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.pid == pid as i32)
            .map(|c| format!("{} {}", c.op, c.code))
            .collect()
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn manifest(dir: &Path) -> Result<serde_json::Value> {
    let text = fs::read_to_string(dir.join("gpusnap-manifest.json"))
        .with_context(|| format!("no gpusnap manifest in {}", dir.display()))?;
    Ok(serde_json::from_str(&text)?)
}

#[test]
fn leave_running_checkpoint_locks_checkpoints_dumps_then_resumes_the_cuda_process() -> Result<()> {
    let g = GpuRig::start("")?;
    let pid = g.run_cuda_counter("lr")?;
    let image = tempfile::tempdir()?;
    let path = image.path().join("ck");
    let out = g.task_checkpoint("lr", &path)?;
    ensure!(
        out.status.success(),
        "checkpoint failed: {}",
        out.describe()
    );

    assert_eq!(
        g.calls(pid),
        ["lock 0", "checkpoint 0", "restore 0", "unlock 0"],
        "driver calls for the CUDA process, in order"
    );
    assert_eq!(g.cuda_state("lr"), "running", "left running and unlocked");
    assert_eq!(g.rig.task_state("lr")?, Some(TaskState::Running));
    let before = g.wait_count("lr", 0)?;
    g.keeps_counting("lr", &before)?;

    let m = manifest(&path)?;
    let gpu = &m["gpu"];
    assert_eq!(gpu["engine"], "driver-managed");
    let procs = gpu["processes"].as_array().context("gpu.processes")?;
    assert_eq!(procs.len(), 1, "one CUDA process in the container: {gpu}");
    assert_eq!(procs[0]["host_pid"], pid);
    assert_eq!(procs[0]["cuda"]["container_pid"], 1);
    assert_eq!(procs[0]["cuda"]["engine"], "driver-managed");
    assert!(
        procs[0]["cuda"]["timings"]["lock_ms"].is_number(),
        "{}",
        procs[0]
    );
    let phases: Vec<&str> = m["timings"]
        .as_array()
        .context("timings")?
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    // ctr pauses the task around Checkpoint: the CUDA resume then happens at its Resume, after
    // the manifest is sealed, so the manifest has no cuda-resume phase.
    assert!(!phases.contains(&"cuda-resume"), "{phases:?}");
    for phase in ["cuda-lock", "cuda-checkpoint", "criu-dump", "digest"] {
        assert!(
            phases.contains(&phase),
            "phase {phase} missing from {phases:?}"
        );
    }
    Ok(())
}

#[test]
fn killed_gpu_container_is_restored_with_its_cuda_state_and_continues() -> Result<()> {
    let g = GpuRig::start("")?;
    let pid = g.run_cuda_counter("rs")?;
    // The checkpoint leaves the task running, so its counter value lies between these two.
    let before = g.wait_count("rs", 0)?;
    g.rig.ctr_ok(&[
        "containers",
        "checkpoint",
        "--task",
        "rs",
        "docker.io/gpusnap/ck-rs:1",
    ])?;
    let after_checkpoint = g.wait_count("rs", 0)?;
    g.rig.stop_and_delete("rs")?;
    g.rig.delete_container("rs")?;
    // The image holds the process as it was during the dump: CHECKPOINTED (real driver state
    // lives in process memory, which CRIU restores; the double's lives in a file).
    fs::write(g.state_file("rs"), "checkpointed\n")?;

    g.rig.ctr_ok(&[
        "containers",
        "restore",
        "--live",
        "rs",
        "docker.io/gpusnap/ck-rs:1",
    ])?;
    let task = g
        .rig
        .wait_task_state("rs", TaskState::Running, Duration::from_secs(20))?;
    assert_ne!(task.pid, pid, "restored under a new host pid");
    assert_eq!(
        g.calls(task.pid),
        ["restore 0", "unlock 0"],
        "CUDA restore then unlock of the restored pid"
    );
    assert_eq!(g.cuda_state("rs"), "running");
    let restored = g.wait_count("rs", 0)?;
    ensure!(
        restored.token == before.token,
        "the restored container runs another process than the checkpointed one: {restored:?}, \
         checkpointed {before:?}"
    );
    ensure!(
        restored.n >= before.n && restored.n < after_checkpoint.n + 30,
        "counter continues from the checkpoint (between {} and {} at checkpoint, {} after restore)",
        before.n,
        after_checkpoint.n,
        restored.n
    );
    g.keeps_counting("rs", &restored)?;
    Ok(())
}

#[test]
fn failed_lock_leaves_the_workload_running_and_no_checkpoint() -> Result<()> {
    let g = GpuRig::start("")?;
    let pid = g.run_cuda_counter("lk")?;
    // CUDA_ERROR_NOT_READY: the lock timed out; the driver leaves the process running.
    g.fake.inject(pid as i32, FakeOp::Lock, &Fault::fail(600))?;
    let image = tempfile::tempdir()?;
    let path = image.path().join("ck");
    let err = g.refused_checkpoint("lk", &path)?;
    assert!(
        err.contains("CUDA_ERROR_NOT_READY"),
        "error names the CUresult: {err}"
    );
    assert!(
        err.contains("running"),
        "error says the workload is running: {err}"
    );
    assert!(
        err.contains("waited 2000 ms") && err.contains("raise cuda.lock_timeout_ms"),
        "error says what to raise (the rig's lock_timeout_ms is 2000): {err}"
    );
    assert_eq!(g.calls(pid), ["lock 600"], "nothing else was attempted");
    assert_eq!(g.cuda_state("lk"), "running");
    assert_eq!(g.rig.task_state("lk")?, Some(TaskState::Running));
    assert!(
        !path.join("gpusnap-manifest.json").exists(),
        "a failed checkpoint leaves nothing that looks complete"
    );
    Ok(())
}

#[test]
fn failed_cuda_checkpoint_is_rolled_back_to_running_and_unlocked() -> Result<()> {
    let g = GpuRig::start("")?;
    let pid = g.run_cuda_counter("cf")?;
    // CUDA_ERROR_OUT_OF_MEMORY from the checkpoint call, the process stays LOCKED.
    g.fake
        .inject(pid as i32, FakeOp::Checkpoint, &Fault::fail(2))?;
    let image = tempfile::tempdir()?;
    let path = image.path().join("ck");
    let err = g.refused_checkpoint("cf", &path)?;
    assert!(
        err.contains("rolled back"),
        "error classifies the outcome: {err}"
    );
    let calls = g.calls(pid);
    assert_eq!(
        calls.first().map(String::as_str),
        Some("lock 0"),
        "{calls:?}"
    );
    assert_eq!(
        calls.last().map(String::as_str),
        Some("unlock 0"),
        "rolled back with an unlock: {calls:?}"
    );
    assert_eq!(g.cuda_state("cf"), "running", "unlocked again");
    assert_eq!(g.rig.task_state("cf")?, Some(TaskState::Running));
    assert!(!path.join("gpusnap-manifest.json").exists());
    let before = g.wait_count("cf", 0)?;
    g.keeps_counting("cf", &before)?;
    Ok(())
}

#[test]
fn posix_engine_without_the_13_4_api_is_refused_before_anything_is_locked() -> Result<()> {
    let g = GpuRig::start("[storage]\nengine = \"posix\"\n")?;
    g.fake.hide_symbol("cuCheckpointOperationComplete")?;
    let pid = g.run_cuda_counter("px")?;
    // What the refusal must leave alone: gpusnap creates the directory (0700) and locks it
    // before the GPU plan, and scrubs an earlier checkpoint's files only after every check
    // passed. So a stale CRIU image and a foreign file already there must survive as they
    // are, and no CRIU image, GPU state file or manifest may appear.
    let image = tempfile::tempdir()?;
    let path = image.path().join("ck");
    fs::create_dir(&path)?;
    fs::write(path.join("operator-note"), b"keep")?;
    fs::write(path.join("core-9.img"), b"an earlier checkpoint")?;
    let err = g.refused_checkpoint("px", &path)?;
    assert!(
        err.contains("posix") && err.contains("13.4"),
        "names the engine and what it needs: {err}"
    );
    assert!(err.contains("driver-managed"), "says what to do: {err}");
    assert!(
        g.calls(pid).iter().all(|c| !c.starts_with("lock")),
        "nothing was locked: {:?}",
        g.calls(pid)
    );
    assert_eq!(g.cuda_state("px"), "running");
    assert_eq!(g.rig.task_state("px")?, Some(TaskState::Running));
    let mut left: Vec<String> = fs::read_dir(&path)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    left.sort();
    assert_eq!(
        left,
        ["core-9.img", "operator-note"],
        "the refused checkpoint cleared or wrote into {}",
        path.display()
    );
    assert_eq!(fs::read(path.join("operator-note"))?, b"keep");
    assert_eq!(fs::read(path.join("core-9.img"))?, b"an earlier checkpoint");
    Ok(())
}

#[test]
fn restore_onto_another_gpu_type_is_refused_before_criu_runs() -> Result<()> {
    let g = GpuRig::start("")?;
    g.run_cuda_counter("gt")?;
    g.rig.ctr_ok(&[
        "containers",
        "checkpoint",
        "--task",
        "gt",
        "docker.io/gpusnap/ck-gt:1",
    ])?;
    g.rig.stop_and_delete("gt")?;
    g.rig.delete_container("gt")?;
    fs::write(g.state_file("gt"), "checkpointed\n")?;
    g.fake.set_devices(&[FakeDevice::new(
        "GPU-0b5e4c2a-1111-2222-3333-444455556666",
        "NVIDIA A100-SXM4-80GB",
        80 << 30,
    )])?;
    let calls_before = g.fake.calls()?.len();
    let out = g.rig.ctr(&[
        "containers",
        "restore",
        "--live",
        "gt",
        "docker.io/gpusnap/ck-gt:1",
    ])?;
    ensure!(
        !out.status.success(),
        "restore must be refused: {}",
        out.describe()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVIDIA H200") && err.contains("no free GPU of that type"),
        "{err}"
    );
    assert_eq!(
        g.fake.calls()?.len(),
        calls_before,
        "no driver call on any process"
    );
    let restore_log = g.rig.bundle_dir("gt").join("criu-restore/restore.log");
    assert!(
        !restore_log.exists(),
        "CRIU never ran: {} exists",
        restore_log.display()
    );
    assert_ne!(g.rig.task_state("gt")?, Some(TaskState::Running));
    Ok(())
}

/// ctr and CRI pause the task around Checkpoint and take the rootfs diff while it is paused
/// (CRI after the checkpoint). The driver needs the CUDA processes running to checkpoint them,
/// so gpusnap thaws the task for that, freezes it again before CRIU dumps it, and keeps it
/// frozen — CUDA state still checkpointed — until the caller resumes it; then it restores and
/// unlocks the CUDA processes. Nothing in the container may run between the dump and the resume.
#[test]
fn paused_gpu_task_stays_frozen_after_checkpoint_until_it_is_resumed() -> Result<()> {
    let g = GpuRig::start("")?;
    let pid = g.run_cuda_counter("fz")?;
    g.rig.pause("fz")?;
    let image = tempfile::tempdir()?;
    let path = image.path().join("ck");
    let out = g.task_checkpoint("fz", &path)?;
    ensure!(
        out.status.success(),
        "checkpoint failed: {}",
        out.describe()
    );
    assert_eq!(
        g.rig.task_state("fz")?,
        Some(TaskState::Paused),
        "the caller's pause is kept"
    );
    assert_eq!(
        g.calls(pid),
        ["lock 0", "checkpoint 0"],
        "no CUDA resume while paused"
    );
    assert_eq!(g.cuda_state("fz"), "checkpointed");
    // Frozen since the dump: the kernel's freezer holds the container's cgroup (proof that
    // nothing in it runs, where a wait would only sample).
    ensure_frozen(pid, "after the checkpoint of the paused task")?;
    let frozen = parse_count(&fs::read_to_string(
        g.rig.bundle_dir("fz").join("rootfs/tmp/count"),
    )?)
    .context("counter file")?;

    g.rig.resume("fz")?;
    assert_eq!(
        g.calls(pid),
        ["lock 0", "checkpoint 0", "restore 0", "unlock 0"],
        "resume restored and unlocked the CUDA process"
    );
    assert_eq!(g.cuda_state("fz"), "running");
    // The same process goes on from the frozen value.
    g.keeps_counting("fz", &frozen)?;
    assert!(manifest(&path)?["gpu"]["processes"]
        .as_array()
        .is_some_and(|p| p.len() == 1));
    Ok(())
}

/// Two checkpoints of a task paused once: the first leaves the CUDA process checkpointed for
/// the caller's resume; the second brings it back first (the driver cannot lock a checkpointed
/// process), freezing the task again before its own dump, and leaves it checkpointed in turn;
/// the resume then brings it back once more. Both images hold the process.
#[test]
fn a_second_checkpoint_of_a_paused_gpu_task_resumes_the_first_ones_cuda_first() -> Result<()> {
    let g = GpuRig::start("")?;
    let pid = g.run_cuda_counter("fz2")?;
    g.rig.pause("fz2")?;
    let image = tempfile::tempdir()?;
    let (first, second) = (image.path().join("ck1"), image.path().join("ck2"));
    for path in [&first, &second] {
        let out = g.task_checkpoint("fz2", path)?;
        ensure!(
            out.status.success(),
            "checkpoint into {} failed: {}",
            path.display(),
            out.describe()
        );
        assert_eq!(g.rig.task_state("fz2")?, Some(TaskState::Paused));
        assert_eq!(g.cuda_state("fz2"), "checkpointed");
        ensure_frozen(pid, "after a checkpoint of the paused task")?;
        assert!(manifest(path)?["gpu"]["processes"]
            .as_array()
            .is_some_and(|p| p.len() == 1));
        // ctr names the checkpoint image by the second it was taken: the next one, taken in
        // the same second, would be refused as existing.
        let images = g.rig.ctr(&["images", "ls", "-q"])?;
        for image in String::from_utf8_lossy(&images.stdout)
            .lines()
            .filter(|l| l.starts_with("containerd.io/checkpoint/fz2:"))
        {
            g.rig.ctr(&["images", "rm", image])?;
        }
    }
    assert_eq!(
        g.calls(pid),
        [
            "lock 0",
            "checkpoint 0",
            "restore 0",
            "unlock 0",
            "lock 0",
            "checkpoint 0"
        ],
        "the second checkpoint resumed the first one's CUDA process before its own"
    );
    let frozen = parse_count(&fs::read_to_string(
        g.rig.bundle_dir("fz2").join("rootfs/tmp/count"),
    )?)
    .context("counter file")?;
    g.rig.resume("fz2")?;
    assert_eq!(g.calls(pid).len(), 8, "{:?}", g.calls(pid));
    assert_eq!(g.cuda_state("fz2"), "running");
    g.keeps_counting("fz2", &frozen)?;
    Ok(())
}
