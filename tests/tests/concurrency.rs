//! Two requests for one container, or for one checkpoint directory, at the same time, sent
//! through the front doors: `ctr` (the shim) and `gpusnap-runc` (CRI-O, Podman).
//!
//! The first checkpoint is held inside the CUDA driver's lock call (the driver double's `hang`
//! fault on the container's CUDA process) — after gpusnap has taken the container (the shim's
//! state `Checkpointing`, gpusnap-runc's `flock` on runc's state directory) and the checkpoint
//! directory (an exclusive `flock`). The test waits until that lock shows in `/proc/locks`,
//! sends the second request, and checks that the first was still in progress when the second
//! was answered (so the two did overlap). Then it checks what must hold: the second was refused
//! before anything ran (FailedPrecondition / gpusnap-runc's exit code 1, a message saying why),
//! the first sealed a complete image, the container ends running and unfrozen with its CUDA
//! process unlocked, and the sealed image restores to the same process.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use gpusnap_fake_libcuda::{FakeOp, Fault};
use gpusnap_testkit::bundle::BusyboxContainer;
use gpusnap_testkit::can_fail::{
    ensure_thawed, exclusive_flock_on, holds_exclusive_flock, parent_of, wait_for_exclusive_flock,
};
use gpusnap_testkit::checkpoint::{
    container_checkpoint, container_restore_live_ok, kill_and_remove, task_checkpoint, CkRig,
};
use gpusnap_testkit::counter::{check_continues, count_of, wait_count, COUNTER, WARM};
use gpusnap_testkit::gpu::{self, Cuda, Engine, GpuDouble};
use gpusnap_testkit::refused_restore::one_refusal_line;
use gpusnap_testkit::runc_gpu::{runc_config, RuncWorkload};
use gpusnap_testkit::{wait_until, OutputExt, RunOpts, Runtime, TaskState};

/// How long the first checkpoint is held in the driver's lock call: the second request is
/// answered within milliseconds; the rest is margin for a loaded 2-core machine.
const HOLD: Duration = Duration::from_secs(15);
const SECS_30: Duration = Duration::from_secs(30);

/// The first request must still hold its lock once the second was answered, else the two did
/// not overlap and the test proved nothing.
fn ensure_overlapped(still_held: bool) -> Result<()> {
    ensure!(
        still_held,
        "the first checkpoint had finished before the second request was answered: the two did \
         not overlap (raise HOLD)"
    );
    Ok(())
}

/// `ctr containers checkpoint --task` held in the driver, and `ctr tasks checkpoint` of the
/// same container meanwhile: the second is refused by the shim's state (FailedPrecondition: the
/// container is being checkpointed) and writes nothing; the first completes, the task runs on
/// unfrozen and unlocked, and its image restores.
#[test]
fn two_checkpoints_of_one_container_through_ctr() -> Result<()> {
    let gpu = GpuDouble::new(Engine::DriverManaged, Cuda::V13_0)?;
    let config = gpu.write_config("")?;
    let rig = CkRig::start_for(Runtime::Gpusnap)?;
    let (cuda, bytes) = gpu.cuda_process("race")?;
    let id = cuda.id.clone();
    let run = cuda.id.clone();
    let opts = RunOpts {
        env: vec![cuda.env()],
        extra_args: vec!["--runtime-config-path".into(), config.display().to_string()],
        ..Default::default()
    };
    let task = rig.run_detached_with(
        Runtime::Gpusnap,
        &id,
        &["sh", "-c", COUNTER, run.as_str()],
        &opts,
    )?;
    wait_count(&run, &id, WARM, || count_of(task.pid))?;
    let shim = parent_of(task.pid).context("the container init has no parent")?;
    gpu.fake
        .inject(task.pid as i32, FakeOp::Lock, &Fault::hang(HOLD))?;

    let image = format!("docker.io/gpusnap/race-{id}:1");
    let second_dir = gpu.scratch().join("second");
    let second_arg = second_dir.display().to_string();
    let before = wait_count(&run, &id, 0, || count_of(task.pid))?;
    let (first, second, overlapped) = std::thread::scope(|s| -> Result<_> {
        let first = s.spawn(|| container_checkpoint(&rig, &id, &image, true));
        if !wait_until(SECS_30, || holds_exclusive_flock(shim)) {
            bail!("the first checkpoint never locked its directory (shim pid {shim})");
        }
        let second = task_checkpoint(&rig, &id, &["--image-path", &second_arg])?;
        let overlapped = holds_exclusive_flock(shim);
        let first = first.join().expect("checkpoint thread panicked")?;
        Ok((first, second, overlapped))
    })?;
    ensure!(
        !second.status.success(),
        "the second checkpoint succeeded (the first still held its lock when it was answered: \
         {overlapped}): {}",
        second.describe()
    );
    ensure_overlapped(overlapped)?;
    let err = second.stderr_str();
    // The shim refuses with FailedPrecondition (shim/src/errors.rs); ctr prints the message.
    ensure!(
        err.contains(&format!(
            "container {id} is being checkpointed: one checkpoint or restore at a time; nothing \
             was done"
        )),
        "the second checkpoint must be refused naming the checkpoint in progress: {err}"
    );
    gpu::check_nothing_complete(&second_dir)?;

    ensure!(
        first.status.success(),
        "the first checkpoint failed: {}",
        first.describe()
    );
    let t = rig.task(&id)?.context("the task is gone")?;
    ensure!(
        t.state == TaskState::Running && t.pid == task.pid,
        "after both checkpoints the task is {t:?}, want pid {} RUNNING",
        task.pid
    );
    ensure_thawed(task.pid, "after both checkpoints")?;
    gpu.check_checkpoint_calls(&cuda, task.pid, true)?;
    check_continues(&id, &before, || count_of(task.pid))?;

    // The sealed image is complete: it restores to the same process.
    kill_and_remove(&rig, &id)?;
    gpu.emulate_criu_restore(&cuda)?;
    container_restore_live_ok(&rig, &id, &image, true)?;
    let pid = rig.task_pid(&id)?;
    gpu.check_restored(&cuda, pid, &bytes)?;
    check_continues(&id, &before, || count_of(pid)).map(drop)
}

/// Two `gpusnap-runc checkpoint --leave-running` of one container (into two directories), as
/// two CRI-O or Podman requests would run them: the second is refused with exit code 1 (the
/// container's runc state directory is locked) and writes nothing; the first seals its image,
/// the container runs on unfrozen with its CUDA process unlocked, and the image restores.
#[test]
fn two_checkpoints_of_one_container_through_gpusnap_runc() -> Result<()> {
    gpusnap_testkit::require_root();
    let gpu = GpuDouble::new(Engine::DriverManaged, Cuda::V13_0)?;
    let config = runc_config(&gpu)?;
    let env = [("GPUSNAP_CONFIG", config.as_str())];
    let dir = gpu.scratch();
    let w = RuncWorkload::start(&gpu, "rrace")?;
    let count = || w.count();
    let before = wait_count(&w.cuda.id, &w.c.id, 0, count)?;
    gpu.fake
        .inject(w.pid as i32, FakeOp::Lock, &Fault::hang(HOLD))?;
    let (first_dir, second_dir) = (dir.join("first"), dir.join("second"));
    let checkpoint = |images: &Path, out: &Path| {
        std::fs::create_dir_all(out).unwrap();
        w.c.wrapper(
            &[
                "checkpoint",
                "--leave-running",
                "--image-path",
                images.to_str().unwrap(),
                &w.c.id,
            ],
            &env,
            out,
        )
    };
    let ((code1, _, err1), (code2, _, err2), overlapped) = std::thread::scope(|s| -> Result<_> {
        let first = s.spawn(|| checkpoint(&first_dir, &dir.join("out1")));
        wait_for_exclusive_flock(&first_dir, SECS_30)?;
        let second = checkpoint(&second_dir, &dir.join("out2"));
        let overlapped = exclusive_flock_on(&first_dir);
        Ok((first.join().expect("checkpoint thread"), second, overlapped))
    })?;
    one_refusal_line(code2, &err2, "another checkpoint or restore is using")?;
    ensure_overlapped(overlapped)?;
    gpu::check_nothing_complete(&second_dir)?;

    ensure!(
        code1 == 0,
        "the first checkpoint failed (exit {code1}):\n{err1}"
    );
    ensure!(
        w.c.status().as_deref() == Some("running") && w.c.pid() == Some(w.pid as i32),
        "after both checkpoints runc says {:?}",
        w.c.state()
    );
    ensure_thawed(w.pid, "after both checkpoints")?;
    gpu.check_checkpoint_calls(&w.cuda, w.pid, true)?;
    gpu::check_gpu_checkpoint(
        &first_dir,
        Engine::DriverManaged,
        Cuda::V13_0,
        w.pid,
        &w.bytes,
    )?;
    check_continues(&w.c.id, &before, count)?;

    // The sealed image restores to the same process.
    let out = w.c.runc().args(["delete", "--force", &w.c.id]).output()?;
    ensure!(out.status.success(), "runc delete: {}", out.describe());
    w.restore(&gpu, &first_dir, &env)
        .context("restore of the sealed image")?;
    check_continues(&w.c.id, &before, count).map(drop)
}

/// A restore from a directory a checkpoint is still writing (gpusnap-runc, another container):
/// refused with exit code 1 before runc runs (the directory is locked), the restored container
/// never created; once the checkpoint has sealed the directory, a restore from it succeeds and
/// runs the checkpointed process.
#[test]
fn restore_racing_a_checkpoint_of_its_directory_through_gpusnap_runc() -> Result<()> {
    gpusnap_testkit::require_root();
    let gpu = GpuDouble::new(Engine::DriverManaged, Cuda::V13_0)?;
    let config = runc_config(&gpu)?;
    let env = [("GPUSNAP_CONFIG", config.as_str())];
    let dir = gpu.scratch();
    let w = RuncWorkload::start(&gpu, "crace")?;
    let count = || w.count();
    let before = wait_count(&w.cuda.id, &w.c.id, 0, count)?;
    gpu.fake
        .inject(w.pid as i32, FakeOp::Lock, &Fault::hang(HOLD))?;
    // Restored as another container of the same runc root, from the same directory.
    let other = BusyboxContainer::create(dir, &format!("{}-b", w.c.id), "sleep 100");
    let images = dir.join("images");
    let out1 = dir.join("out1");
    std::fs::create_dir_all(&out1)?;
    let ((code1, _, err1), (code2, _, err2), overlapped) = std::thread::scope(|s| -> Result<_> {
        let first = s.spawn(|| {
            w.c.wrapper(
                &[
                    "checkpoint",
                    "--image-path",
                    images.to_str().unwrap(),
                    &w.c.id,
                ],
                &env,
                &out1,
            )
        });
        wait_for_exclusive_flock(&images, SECS_30)?;
        let second = other.wrapper_restore(&images, &env, dir);
        let overlapped = exclusive_flock_on(&images);
        Ok((first.join().expect("checkpoint thread"), second, overlapped))
    })?;
    one_refusal_line(
        code2,
        &err2,
        &format!(
            "another checkpoint or restore is using {}",
            images.display()
        ),
    )?;
    ensure_overlapped(overlapped)?;
    ensure!(
        other.status().is_none(),
        "runc created the container whose restore was refused: {:?}",
        other.state()
    );

    ensure!(code1 == 0, "the checkpoint failed (exit {code1}):\n{err1}");
    ensure!(
        w.c.status().is_none(),
        "runc destroys the container after a full dump; it is {:?}",
        w.c.status()
    );
    gpu.check_checkpoint_calls(&w.cuda, w.pid, false)?;
    gpu::check_gpu_checkpoint(&images, Engine::DriverManaged, Cuda::V13_0, w.pid, &w.bytes)?;

    // Sealed now: the same restore goes through and runs the checkpointed process.
    w.restore(&gpu, &images, &env)
        .context("restore after the checkpoint")?;
    check_continues(&w.c.id, &before, count).map(drop)
}
