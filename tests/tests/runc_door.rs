//! The pending CUDA resume through `gpusnap-runc` (the runc command line CRI-O, Podman and
//! containerd-shim-runc-v2 call), with the CUDA driver double: a container its caller paused is
//! checkpointed twice with `--leave-running`, then resumed.
//!
//! gpusnap-runc exits between the calls, so the first checkpoint saves the CUDA process it left
//! checkpointed in runc's state directory. The second takes it back and resumes it (thawing the
//! container for the driver and freezing it again) before its own dump: before, the second
//! checkpoint locked a checkpointed process and its record replaced the first one's. The
//! resume then brings the process back once more, and the same process counts on.

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::can_fail::ensure_frozen;
use gpusnap_testkit::counter::{check_continues, wait_count};
use gpusnap_testkit::gpu::{checkpoint_calls, manifest, Cuda, Engine, GpuDouble};
use gpusnap_testkit::runc_gpu::{runc_config, RuncWorkload};

const PENDING: &str = "gpusnap-pending-cuda.json";

#[test]
fn a_second_checkpoint_of_a_paused_container_resumes_the_first_ones_cuda_first() -> Result<()> {
    gpusnap_testkit::require_root();
    let gpu = GpuDouble::new(Engine::DriverManaged, Cuda::V13_0)?;
    let config = runc_config(&gpu)?;
    let env = [("GPUSNAP_CONFIG", config.as_str())];
    let w = RuncWorkload::start(&gpu, "pend")?;
    let state_dir = w.c.runc_root.join(&w.c.id);
    let (code, _, err) = w.c.wrapper(&["pause", &w.c.id], &env, gpu.scratch());
    ensure!(code == 0, "pause: {err}");
    let frozen = wait_count(&w.cuda.id, &w.c.id, 0, || w.count())?;

    for (n, name) in ["ck1", "ck2"].into_iter().enumerate() {
        let images = gpu.scratch().join(name);
        let images = images.to_str().context("image path")?;
        let (code, _, err) = w.c.wrapper(
            &[
                "checkpoint",
                "--leave-running",
                "--image-path",
                images,
                &w.c.id,
            ],
            &env,
            gpu.scratch(),
        );
        ensure!(code == 0, "checkpoint {}: {err}", n + 1);
        ensure!(
            w.c.status().as_deref() == Some("paused"),
            "after checkpoint {}: {:?}",
            n + 1,
            w.c.status()
        );
        ensure!(
            gpu.state(&w.cuda) == "checkpointed",
            "after checkpoint {}: the CUDA process is {}",
            n + 1,
            gpu.state(&w.cuda)
        );
        ensure!(
            state_dir.join(PENDING).is_file(),
            "checkpoint {} saved no pending resume in {}",
            n + 1,
            state_dir.display()
        );
        ensure_frozen(w.pid, "after a checkpoint of the paused container")?;
        let gpu_processes = manifest(std::path::Path::new(images))?["gpu"]["processes"]
            .as_array()
            .map_or(0, Vec::len);
        ensure!(
            gpu_processes == 1,
            "image {name}: {gpu_processes} CUDA processes"
        );
    }
    // The first checkpoint's calls, its resume, then the second's, left checkpointed.
    let want = [
        checkpoint_calls(Engine::DriverManaged, true),
        checkpoint_calls(Engine::DriverManaged, false),
    ]
    .concat();
    let calls = gpu.calls(w.pid);
    ensure!(
        calls == want,
        "the second checkpoint did not resume the first one's CUDA process before its own: \
         {calls:?}, want {want:?}\n{}",
        gpu.call_log()
    );

    let (code, _, err) = w.c.wrapper(&["resume", &w.c.id], &env, gpu.scratch());
    ensure!(code == 0, "resume: {err}");
    let want = [
        checkpoint_calls(Engine::DriverManaged, true),
        checkpoint_calls(Engine::DriverManaged, true),
    ]
    .concat();
    ensure!(
        gpu.calls(w.pid) == want && gpu.state(&w.cuda) == "running",
        "the resume did not restore and unlock the CUDA process: {:?}, {}",
        gpu.calls(w.pid),
        gpu.state(&w.cuda)
    );
    ensure!(
        !state_dir.join(PENDING).exists(),
        "the pending resume is left in {}",
        state_dir.display()
    );
    gpu.check_device_memory(&w.cuda, &w.bytes, "after the resume")?;
    check_continues(&w.c.id, &frozen, || w.count()).map(drop)
}
