//! The front-door matrix: every way a GPU container is checkpointed and restored, with each
//! storage engine, on a CUDA 13.0 and a CUDA 13.4 driver (the test double, `cuda/fake-libcuda`).
//!
//! | door | checkpoint | restore |
//! |---|---|---|
//! | `task_checkpoint` | `ctr tasks checkpoint --image-path DIR` (task left running) | — |
//! | `task_checkpoint_exit` | `ctr tasks checkpoint --exit --image-path DIR` | — |
//! | `container_checkpoint` | `ctr containers checkpoint --task ID IMG`, kill, delete | `ctr containers restore --live ID IMG` |
//! | `cri_restore` | CRI `CheckpointContainer` | CRI `CreateContainer` (image: the archive) in a new pod |
//! | `restore_from_annotation` | CRI `CheckpointContainer` | `gpusnap image build` → registry → `gpusnap image pull --extract NAME` → pod annotation `gpusnap.io/restore-from: NAME` |
//! | `gpusnap_runc` | `gpusnap-runc checkpoint --image-path DIR` (runc directly) | `gpusnap-runc restore -d` |
//! | `runc_v2_task_checkpoint` | door 1 through containerd-shim-runc-v2 with `--runc-binary gpusnap-runc` | — |
//! | `runc_v2_container_checkpoint` | door 2 through containerd-shim-runc-v2 with `--runc-binary gpusnap-runc` | the same |
//!
//! Each door is one function taking the cell's (engine, CUDA version); the table at the end
//! names the cells. A cell asserts, for the container's CUDA process:
//! - the driver calls in order, on the original pid and on the restored one
//!   ([`gpu::checkpoint_calls`], [`gpu::restore_calls`]: with posix the CustomStorage
//!   checkpoint/restore and their `operation_complete`);
//! - the device memory: random bytes set before the checkpoint are the bytes after the restore
//!   (before the restore the test makes the double forget them as CRIU would:
//!   [`GpuDouble::emulate_criu_restore`]);
//! - the manifest's `gpu` section and, with posix, the `gpusnap-gpu-*` extent holding exactly
//!   those bytes ([`gpu::check_gpu_checkpoint`]);
//! - the workload: a counter with a random token continues from the checkpointed value in the
//!   same process (same token), and keeps counting.
//!
//! posix on CUDA 13.0 is refused before anything is locked: the error names the 13.4
//! requirement, the driver saw no call for the process, which is still RUNNING and unlocked,
//! and nothing in the checkpoint directory looks complete.
//!
//! Every cell runs against its own containerd (or runc root) and its own instance of the
//! double, so the cells run in parallel test threads.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use gpusnap_testkit::busybox_registry::{registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::checkpoint::{
    container_checkpoint, container_restore_live_ok, criu_tar_blob, image_refs, kill_and_remove,
    proc_state, task_checkpoint, CkRig,
};
use gpusnap_testkit::counter::{
    check_continues as continues, count_of, wait_count, Count, COUNTER, WARM,
};
use gpusnap_testkit::cri::{gpusnap_handler, wait_for_state, ContainerSpec, CriNode, Pod};
use gpusnap_testkit::gpu::{self, Cuda, CudaProcess, Engine, GpuDouble};
use gpusnap_testkit::runc_gpu::{runc_config, RuncWorkload};
use gpusnap_testkit::{
    gpusnap, paths, CriNodeOptions, OutputExt, Registry, RunOpts, Runtime, TaskState,
};
use k8s_cri::v1::ContainerState;

/// Failures of a leave-running checkpoint's in-place resume (the CUDA process restored and
/// unlocked after the dump). They are reported after the restore, so that a cell still shows
/// whether its restore works.
#[derive(Default)]
struct Deferred(Vec<String>);

impl Deferred {
    fn keep(&mut self, r: Result<()>) {
        if let Err(e) = r {
            self.0.push(format!("{e:#}"));
        }
    }

    fn finish(self) -> Result<()> {
        ensure!(
            self.0.is_empty(),
            "the restore went through, but after the leave-running checkpoint the CUDA process \
             was not resumed in place:\n{}",
            self.0.join("\n")
        );
        Ok(())
    }
}

/// Whether the cell's engine cannot work on its driver: posix without 13.4's CustomStorage.
fn refused(engine: Engine, cuda: Cuda) -> bool {
    engine == Engine::Posix && !cuda.has_custom_storage()
}

// ----- doors 1 and 2: ctr ------------------------------------------------------------------

/// Which shim `ctr` talks to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shim {
    /// containerd-shim-gpusnap-v2, configured by `ctr run --runtime-config-path`.
    Gpusnap,
    /// containerd-shim-runc-v2 with gpusnap-runc as its runc binary (`ctr run --runc-binary`,
    /// the runc options' `BinaryName`), configured by `GPUSNAP_CONFIG` in containerd's
    /// environment. containerd freezes the task before the runtime's checkpoint and thaws it
    /// afterwards, so this is the frozen-caller path of gpusnap-runc.
    RuncV2BinaryName,
}

/// A private containerd with the shim under test, and the double.
struct CtrCell {
    rig: CkRig,
    gpu: GpuDouble,
    config: PathBuf,
    shim: Shim,
}

/// A counter container on a ctr cell whose init is a CUDA process.
struct CtrWorkload {
    id: String,
    cuda: CudaProcess,
    bytes: Vec<u8>,
    pid: u32,
}

impl CtrCell {
    fn start_on(shim: Shim, engine: Engine, cuda: Cuda) -> Result<CtrCell> {
        let gpu = GpuDouble::new(engine, cuda)?;
        let (rig, config) = match shim {
            Shim::Gpusnap => {
                let config = gpu.write_config("")?;
                (CkRig::start_for(Runtime::Gpusnap)?, config)
            }
            Shim::RuncV2BinaryName => {
                // gpusnap-runc runs runc, which runs criu from its PATH; name CRIU's
                // directory explicitly, as `gpusnap install` does.
                let config = gpu.write_config(&paths::criu_config())?;
                let rig = CkRig::start_with(gpusnap_testkit::RigOptions {
                    containerd_env: vec![("GPUSNAP_CONFIG".into(), config.display().to_string())],
                    ..Default::default()
                })?;
                (rig, config)
            }
        };
        Ok(CtrCell {
            rig,
            gpu,
            config,
            shim,
        })
    }

    /// `ctr run -d` of the counter, counted past [`WARM`]: with `--runtime-config-path
    /// <config>` on the gpusnap shim, with `--runc-binary gpusnap-runc` on runc.v2.
    fn run_counter(&self, name: &str) -> Result<CtrWorkload> {
        let (cuda, bytes) = self.gpu.cuda_process(name)?;
        let id = cuda.id.clone();
        let (rt, extra_args) = match self.shim {
            Shim::Gpusnap => (
                Runtime::Gpusnap,
                vec![
                    "--runtime-config-path".into(),
                    self.config.display().to_string(),
                ],
            ),
            Shim::RuncV2BinaryName => (
                Runtime::RuncV2,
                vec![
                    "--runc-binary".into(),
                    paths::binary("gpusnap-runc").display().to_string(),
                ],
            ),
        };
        let opts = RunOpts {
            env: vec![cuda.env()],
            extra_args,
            ..Default::default()
        };
        let task =
            self.rig
                .run_detached_with(rt, &id, &["sh", "-c", COUNTER, cuda.id.as_str()], &opts)?;
        wait_count(&cuda.id, &id, WARM, || count_of(task.pid))?;
        Ok(CtrWorkload {
            id,
            cuda,
            bytes,
            pid: task.pid,
        })
    }

    /// `out`, a checkpoint of `w`, was refused as a posix checkpoint on a driver without
    /// CustomStorage must be, without touching its CUDA process.
    fn check_refused(&self, w: &CtrWorkload, out: &std::process::Output) -> Result<()> {
        ensure!(
            !out.status.success(),
            "the posix checkpoint on {} succeeded: {}",
            self.gpu.cuda,
            out.describe()
        );
        gpu::check_posix_refusal(&out.stderr_str())?;
        self.gpu.check_untouched(&w.cuda, w.pid, &w.bytes)
    }

    /// The task is RUNNING under the same pid, unlocked, and still counting.
    fn check_still_running(&self, w: &CtrWorkload, checkpointed: &Count) -> Result<()> {
        let task = self.rig.task(&w.id)?.context("the task is gone")?;
        ensure!(
            task.state == TaskState::Running && task.pid == w.pid,
            "after the checkpoint the task is {task:?}, want pid {} RUNNING",
            w.pid
        );
        check_continues(&w.id, checkpointed, || count_of(w.pid))
    }
}

/// Door 1: `ctr tasks checkpoint --image-path DIR`, the task left running. ctr has no command
/// that restores an `--image-path` directory (nor any `ctr tasks checkpoint` image: "image name
/// not found in index"), so this door is checked on the checkpoint side only: driver calls,
/// manifest, extents, and the task still running with its CUDA process resumed.
fn task_checkpoint_door(engine: Engine, cuda: Cuda) -> Result<()> {
    task_checkpoint_cell(Shim::Gpusnap, engine, cuda, false)
}

/// Door 1 through containerd-shim-runc-v2 with `BinaryName` = gpusnap-runc: containerd
/// pauses the task, the shim runs `gpusnap-runc checkpoint --leave-running` on the frozen
/// container, then containerd resumes it (`gpusnap-runc resume` finishes the CUDA resume).
fn runc_v2_task_checkpoint_door(engine: Engine, cuda: Cuda) -> Result<()> {
    task_checkpoint_cell(Shim::RuncV2BinaryName, engine, cuda, false)
}

/// Door 1 with `--exit`: the task is stopped once the checkpoint is sealed; its CUDA process
/// stays CHECKPOINTED (no restore, no unlock). Checkpoint side only, as for door 1.
fn task_checkpoint_exit_door(engine: Engine, cuda: Cuda) -> Result<()> {
    task_checkpoint_cell(Shim::Gpusnap, engine, cuda, true)
}

fn task_checkpoint_cell(shim: Shim, engine: Engine, cuda: Cuda, exit: bool) -> Result<()> {
    let cell = CtrCell::start_on(shim, engine, cuda)?;
    let w = cell.run_counter(if exit { "tx" } else { "tc" })?;
    let dir = cell.gpu.scratch().join("image");
    let dir_arg = dir.to_str().context("image path")?;
    let mut args = vec!["--image-path", dir_arg];
    if exit {
        args.insert(0, "--exit");
    }
    let before = wait_count(&w.cuda.id, &w.id, 0, || count_of(w.pid))?;
    let out = task_checkpoint(&cell.rig, &w.id, &args)?;

    if refused(engine, cuda) {
        cell.check_refused(&w, &out)?;
        gpu::check_nothing_complete(&dir)?;
        return cell.check_still_running(&w, &before);
    }

    ensure!(
        out.status.success(),
        "`ctr tasks checkpoint {}` failed: {}",
        args.join(" "),
        out.describe()
    );
    cell.gpu.check_checkpoint_calls(&w.cuda, w.pid, !exit)?;
    gpu::check_gpu_checkpoint(&dir, engine, cuda, w.pid, &w.bytes)?;
    if exit {
        cell.rig
            .wait_task_state(&w.id, TaskState::Stopped, Duration::from_secs(20))?;
        ensure!(
            cell.gpu.device_memory(&w.cuda)?.is_none(),
            "the device still holds the memory of the process checkpointed with --exit"
        );
        ensure!(
            gpusnap_testkit::wait_until(Duration::from_secs(10), || {
                proc_state(w.pid).is_none_or(|s| s == 'Z')
            }),
            "pid {} still alive after `ctr tasks checkpoint --exit`",
            w.pid
        );
    } else {
        // Resumed in place: restored and unlocked with the same device memory.
        cell.gpu
            .check_device_memory(&w.cuda, &w.bytes, "after the checkpoint")?;
        cell.check_still_running(&w, &before)?;
    }
    Ok(())
}

/// Door 2: `ctr containers checkpoint --task` (containerd's checkpoint image, the task left
/// running), the container killed and deleted, then `ctr containers restore --live`.
fn container_checkpoint_door(engine: Engine, cuda: Cuda) -> Result<()> {
    container_checkpoint_cell(Shim::Gpusnap, engine, cuda)
}

/// Door 2 through containerd-shim-runc-v2 with `BinaryName` = gpusnap-runc (the container's
/// runtime options carry the binary, so the restore runs `gpusnap-runc restore` too).
fn runc_v2_container_checkpoint_door(engine: Engine, cuda: Cuda) -> Result<()> {
    container_checkpoint_cell(Shim::RuncV2BinaryName, engine, cuda)
}

fn container_checkpoint_cell(shim: Shim, engine: Engine, cuda: Cuda) -> Result<()> {
    let cell = CtrCell::start_on(shim, engine, cuda)?;
    let w = cell.run_counter("cc")?;
    let image_ref = format!("docker.io/gpusnap/ck-{}:1", w.id);
    let before = wait_count(&w.cuda.id, &w.id, 0, || count_of(w.pid))?;
    // --rw: the counter's shell may hold /tmp/count open at the dump, and CRIU reopens it on
    // restore, so the container's writable layer travels with the checkpoint.
    let out = container_checkpoint(&cell.rig, &w.id, &image_ref, true)?;

    if refused(engine, cuda) {
        cell.check_refused(&w, &out)?;
        ensure!(
            !image_refs(&cell.rig)?.contains(&image_ref),
            "a refused checkpoint left image {image_ref}"
        );
        return cell.check_still_running(&w, &before);
    }

    ensure!(
        out.status.success(),
        "`ctr containers checkpoint --task` failed: {}",
        out.describe()
    );
    let mut resumed = Deferred::default();
    resumed.keep(cell.gpu.check_checkpoint_calls(&w.cuda, w.pid, true));
    resumed.keep(
        cell.gpu
            .check_device_memory(&w.cuda, &w.bytes, "after the checkpoint"),
    );
    // The checkpoint directory travels as the image's criu.tar.
    let unpacked = cell.gpu.scratch().join("criu-tar");
    let blob = criu_tar_blob(&cell.rig, &image_ref)?;
    tar::Archive::new(fs::File::open(&blob)?)
        .unpack(&unpacked)
        .with_context(|| format!("unpacking {}", blob.display()))?;
    gpu::check_gpu_checkpoint(&unpacked, engine, cuda, w.pid, &w.bytes)?;

    kill_and_remove(&cell.rig, &w.id)?;
    cell.gpu.emulate_criu_restore(&w.cuda)?;
    container_restore_live_ok(&cell.rig, &w.id, &image_ref, true)?;
    let pid = cell.rig.task_pid(&w.id)?;
    ensure!(pid != w.pid, "restored under the old host pid {pid}");
    cell.gpu.check_restored(&w.cuda, pid, &w.bytes)?;
    check_continues(&w.id, &before, || count_of(pid))?;
    resumed.finish()
}

// ----- doors 3 and 4: CRI ------------------------------------------------------------------

/// One node (containerd with CRI and the gpusnap runtime, configured for the double) and the
/// registry it pulls from. Checkpoint and restore happen on this one node, into a new pod.
struct CriCell {
    // Dropped in this order: the node's containerd goes before the double's directory.
    node: CriNode,
    reg: Registry,
    gpu: GpuDouble,
}

/// A counter container in its pod, its init a CUDA process.
struct CriWorkload {
    pod: Pod,
    id: String,
    cuda: CudaProcess,
    bytes: Vec<u8>,
    pid: u32,
}

impl CriCell {
    fn start(engine: Engine, cuda: Cuda) -> Result<CriCell> {
        let gpu = GpuDouble::new(engine, cuda)?;
        let reg = registry_with_busybox()?;
        let node = CriNode::start(CriNodeOptions {
            gpusnap_config: gpu.config(),
            registry_host: Some(reg.host()),
            ..Default::default()
        })?;
        node.cri
            .pull_image(&reg.image(BUSYBOX_REPO))
            .context("CRI PullImage of busybox")?;
        Ok(CriCell { gpu, reg, node })
    }

    fn counter_spec(&self, image: String, cuda: &CudaProcess) -> ContainerSpec {
        let (k, v) = cuda.env_pair();
        ContainerSpec {
            name: "counter".into(),
            image,
            command: vec!["sh".into(), "-c".into(), COUNTER.into(), cuda.id.clone()],
            env: vec![(k.to_string(), v.to_string())],
        }
    }

    fn run_counter(&self, name: &str) -> Result<CriWorkload> {
        let (cuda, bytes) = self.gpu.cuda_process(name)?;
        let pod = self.node.run_pod(&cuda.id, &[], gpusnap_handler())?;
        let id = self.node.run_container(
            &pod,
            &self.counter_spec(self.reg.image(BUSYBOX_REPO), &cuda),
        )?;
        wait_for_state(
            &self.node,
            &id,
            ContainerState::ContainerRunning,
            Duration::from_secs(20),
        )?;
        let pid = self.node.pid(&id)?;
        wait_count(&cuda.id, &id, WARM, || count_of(pid))?;
        Ok(CriWorkload {
            pod,
            id,
            cuda,
            bytes,
            pid,
        })
    }

    /// Container `id` runs the restored workload `w`: a new pid, restored and unlocked by the
    /// driver with its device memory, counting on.
    fn check_restored(&self, w: &CriWorkload, id: &str, checkpointed: &Count) -> Result<()> {
        wait_for_state(
            &self.node,
            id,
            ContainerState::ContainerRunning,
            Duration::from_secs(30),
        )?;
        let pid = self.node.pid(id)?;
        ensure!(
            pid != 0 && pid != w.pid,
            "restored container pid {pid}, original {}",
            w.pid
        );
        self.gpu.check_restored(&w.cuda, pid, &w.bytes)?;
        check_continues(id, checkpointed, || count_of(pid))
    }
}

/// A CRI checkpoint archive of a running workload.
struct CriCheckpoint {
    w: CriWorkload,
    archive: PathBuf,
    before: Count,
    resumed: Deferred,
}

/// CRI `CheckpointContainer` of a fresh workload, checked; then the original pod is removed
/// and the double holds the process as CRIU will hand it back. `None` when the cell's
/// checkpoint must be (and was) refused.
fn cri_checkpoint(cell: &CriCell, engine: Engine, cuda: Cuda) -> Result<Option<CriCheckpoint>> {
    let w = cell.run_counter("cri")?;
    let archive = cell.gpu.scratch().join("checkpoint.tar");
    let before = wait_count(&w.cuda.id, &w.id, 0, || count_of(w.pid))?;
    let result = cell.node.cri.checkpoint_container(&w.id, &archive, 60);

    if refused(engine, cuda) {
        let err = match result {
            Ok(()) => bail!("the posix checkpoint on {cuda} succeeded"),
            Err(e) => e.message,
        };
        gpu::check_posix_refusal(&err)?;
        cell.gpu.check_untouched(&w.cuda, w.pid, &w.bytes)?;
        ensure!(
            !archive.exists(),
            "a refused checkpoint left the archive {}",
            archive.display()
        );
        let state = cell.node.state(&w.id)?;
        ensure!(
            state == ContainerState::ContainerRunning && cell.node.pid(&w.id)? == w.pid,
            "after the refused checkpoint the container is {state:?}"
        );
        check_continues(&w.id, &before, || count_of(w.pid))?;
        return Ok(None);
    }

    result.context("CRI CheckpointContainer")?;
    let mut resumed = Deferred::default();
    resumed.keep(cell.gpu.check_checkpoint_calls(&w.cuda, w.pid, true));
    resumed.keep(
        cell.gpu
            .check_device_memory(&w.cuda, &w.bytes, "after the checkpoint"),
    );
    let state = cell.node.state(&w.id)?;
    ensure!(
        state == ContainerState::ContainerRunning,
        "CRI leaves the container running; it is {state:?}"
    );
    let unpacked = cell.gpu.scratch().join("archive");
    let dir = gpu::unpack_cri_archive(&archive, &unpacked)?;
    gpu::check_gpu_checkpoint(&dir, engine, cuda, w.pid, &w.bytes)?;

    // The workload moves: its pod goes away, and the driver state comes back only through the
    // restore (the double keys it by the process's id and its pid in the container, which the
    // restored process has too).
    cell.node.remove_pod(&w.pod.id)?;
    cell.gpu.emulate_criu_restore(&w.cuda)?;
    Ok(Some(CriCheckpoint {
        w,
        archive,
        before,
        resumed,
    }))
}

/// Door 3: CRI `CheckpointContainer`, then containerd 2.1's CRI restore: `CreateContainer` in a
/// new pod with the checkpoint archive as the container's image, and `StartContainer`.
fn cri_restore_door(engine: Engine, cuda: Cuda) -> Result<()> {
    let cell = CriCell::start(engine, cuda)?;
    let Some(ck) = cri_checkpoint(&cell, engine, cuda)? else {
        return Ok(());
    };
    let pod = cell
        .node
        .run_pod(&format!("{}-b", ck.w.cuda.id), &[], gpusnap_handler())?;
    let archive = ck.archive.display().to_string();
    let id = cell
        .node
        .create_container(&pod, &cell.counter_spec(archive.clone(), &ck.w.cuda))
        .map_err(anyhow::Error::from)
        .context("CRI CreateContainer from the checkpoint archive")?;
    let (created, _) = cell.node.cri.container_status(&id)?;
    ensure!(
        created.annotations.get("restored").map(String::as_str) == Some("true")
            && created.annotations.get("checkpointImage") == Some(&archive),
        "CreateContainer did not take the restore path: {:?}",
        created.annotations
    );
    cell.node
        .cri
        .start_container(&id)
        .map_err(anyhow::Error::from)
        .context("CRI StartContainer of the restored container")?;
    cell.check_restored(&ck.w, &id, &ck.before)?;
    ck.resumed.finish()
}

/// Door 4: CRI `CheckpointContainer`; the archive becomes an image (`gpusnap image build`),
/// goes through the registry (`gpusnap image push`) and is extracted under the node's
/// `restore.checkpoint_root` (`gpusnap image pull --extract NAME`); a new pod asks for it with
/// `gpusnap.io/restore-from: NAME`.
fn restore_from_annotation_door(engine: Engine, cuda: Cuda) -> Result<()> {
    let cell = CriCell::start(engine, cuda)?;
    let Some(ck) = cri_checkpoint(&cell, engine, cuda)? else {
        return Ok(());
    };
    let repo = format!("gpusnap/ck-{}:1", ck.w.cuda.id);
    let oci = cell.gpu.scratch().join("image.oci.tar");
    let name = "ck-annotated";
    for args in [
        vec![
            "image".to_string(),
            "build".into(),
            ck.archive.display().to_string(),
            "-t".into(),
            cell.reg.image(&repo),
            "-o".into(),
            oci.display().to_string(),
        ],
        vec![
            "image".into(),
            "push".into(),
            oci.display().to_string(),
            cell.reg.url(&repo),
        ],
        vec![
            "--config".into(),
            cell.node.config_path().display().to_string(),
            "image".into(),
            "pull".into(),
            cell.reg.url(&repo),
            "--extract".into(),
            name.into(),
        ],
    ] {
        let out = gpusnap(&args);
        ensure!(
            out.status.success(),
            "`gpusnap {}` failed: {}",
            args.join(" "),
            out.describe()
        );
    }
    // What the registry carried is what was checkpointed, extents included.
    let extracted = cell.node.checkpoint_root().join(name).join("checkpoint");
    gpu::check_gpu_checkpoint(&extracted, engine, cuda, ck.w.pid, &ck.w.bytes)?;

    let pod = cell.node.run_pod(
        &format!("{}-b", ck.w.cuda.id),
        &[("gpusnap.io/restore-from", name)],
        gpusnap_handler(),
    )?;
    let id = cell.node.run_container(
        &pod,
        &cell.counter_spec(cell.reg.image(BUSYBOX_REPO), &ck.w.cuda),
    )?;
    cell.check_restored(&ck.w, &id, &ck.before)?;
    ck.resumed.finish()
}

// ----- door 5: gpusnap-runc ----------------------------------------------------------------

/// Door 5: runc directly, through gpusnap-runc (what CRI-O and Podman run):
/// `checkpoint --image-path DIR` (runc's default: the container is gone afterwards), then
/// `restore -d` of the same bundle.
fn gpusnap_runc_door(engine: Engine, cuda: Cuda) -> Result<()> {
    let gpu = GpuDouble::new(engine, cuda)?;
    let config = runc_config(&gpu)?;
    let env = [("GPUSNAP_CONFIG", config.as_str())];
    let w = RuncWorkload::start(&gpu, "rn")?;
    let (c, old_pid) = (&w.c, w.pid);
    let before = wait_count(&w.cuda.id, &c.id, 0, || w.count())?;
    let images = gpu.scratch().join("images");
    let (code, _, err) = w.checkpoint(&gpu, &images, &env)?;

    if refused(engine, cuda) {
        ensure!(code != 0, "the posix checkpoint on {cuda} succeeded");
        gpu::check_posix_refusal(&err)?;
        gpu.check_untouched(&w.cuda, old_pid, &w.bytes)?;
        gpu::check_nothing_complete(&images)?;
        ensure!(
            c.status().as_deref() == Some("running") && c.pid() == Some(old_pid as i32),
            "after the refused checkpoint runc says {:?}",
            c.state()
        );
        return check_continues(&c.id, &before, || w.count());
    }

    ensure!(
        code == 0,
        "gpusnap-runc checkpoint failed (exit {code}):\n{err}"
    );
    ensure!(
        c.status().is_none(),
        "runc destroys the container after a full dump; it is {:?}",
        c.status()
    );
    gpu.check_checkpoint_calls(&w.cuda, old_pid, false)?;
    gpu::check_gpu_checkpoint(&images, engine, cuda, old_pid, &w.bytes)?;

    w.restore(&gpu, &images, &env)?;
    check_continues(&c.id, &before, || w.count())
}

// ----- the matrix --------------------------------------------------------------------------

fn cell(door: fn(Engine, Cuda) -> Result<()>, engine: Engine, cuda: Cuda) {
    gpusnap_testkit::require_root();
    if let Err(e) = door(engine, cuda) {
        panic!("{engine} on {cuda}: {e:#}");
    }
}

/// `door: test_name(Engine, Cuda), ...;` → one #[test] per cell.
macro_rules! matrix {
    ($($door:ident: $($name:ident($engine:ident, $cuda:ident)),+;)+) => {
        $($(
            #[test]
            fn $name() {
                cell($door, Engine::$engine, Cuda::$cuda);
            }
        )+)+
    };
}

// Door 4 at posix/13.0 is not a cell of its own: its checkpoint is door 3's CRI
// CheckpointContainer, refused the same way (`cri_restore_posix_cuda13_0_is_refused`).
//
// Doors 2, 3 and 4 with posix cover a failure this matrix found: ctr and CRI freeze the task
// around Checkpoint and delete the checkpoint directory before their Resume, so the posix
// engine restores device memory before Checkpoint returns and leaves only the unlock to
// Resume. A cell that finds a failure after the checkpoint goes on to the restore and reports
// everything at the end (`Deferred`).
//
// The runc.v2 rows (containerd-shim-runc-v2 with gpusnap-runc as `BinaryName`) take a subset
// of the engine × driver cells: the frozen-caller path is the same code for both driver
// versions, so one driver-managed and the posix cells cover it within the CI budget.
matrix! {
    task_checkpoint_door:
        task_checkpoint_driver_managed_cuda13_0(DriverManaged, V13_0),
        task_checkpoint_driver_managed_cuda13_4(DriverManaged, V13_4),
        task_checkpoint_posix_cuda13_4(Posix, V13_4),
        task_checkpoint_posix_cuda13_0_is_refused(Posix, V13_0);
    task_checkpoint_exit_door:
        task_checkpoint_exit_driver_managed_cuda13_0(DriverManaged, V13_0),
        task_checkpoint_exit_driver_managed_cuda13_4(DriverManaged, V13_4),
        task_checkpoint_exit_posix_cuda13_4(Posix, V13_4),
        task_checkpoint_exit_posix_cuda13_0_is_refused(Posix, V13_0);
    container_checkpoint_door:
        container_checkpoint_restore_driver_managed_cuda13_0(DriverManaged, V13_0),
        container_checkpoint_restore_driver_managed_cuda13_4(DriverManaged, V13_4),
        container_checkpoint_restore_posix_cuda13_4(Posix, V13_4),
        container_checkpoint_posix_cuda13_0_is_refused(Posix, V13_0);
    cri_restore_door:
        cri_restore_driver_managed_cuda13_0(DriverManaged, V13_0),
        cri_restore_driver_managed_cuda13_4(DriverManaged, V13_4),
        cri_restore_posix_cuda13_4(Posix, V13_4),
        cri_restore_posix_cuda13_0_is_refused(Posix, V13_0);
    restore_from_annotation_door:
        restore_from_annotation_driver_managed_cuda13_0(DriverManaged, V13_0),
        restore_from_annotation_driver_managed_cuda13_4(DriverManaged, V13_4),
        restore_from_annotation_posix_cuda13_4(Posix, V13_4);
    runc_v2_task_checkpoint_door:
        runc_v2_task_checkpoint_driver_managed_cuda13_0(DriverManaged, V13_0),
        runc_v2_task_checkpoint_posix_cuda13_4(Posix, V13_4),
        runc_v2_task_checkpoint_posix_cuda13_0_is_refused(Posix, V13_0);
    runc_v2_container_checkpoint_door:
        runc_v2_container_checkpoint_restore_driver_managed_cuda13_4(DriverManaged, V13_4),
        runc_v2_container_checkpoint_restore_posix_cuda13_4(Posix, V13_4);
    gpusnap_runc_door:
        gpusnap_runc_restore_driver_managed_cuda13_0(DriverManaged, V13_0),
        gpusnap_runc_restore_driver_managed_cuda13_4(DriverManaged, V13_4),
        gpusnap_runc_restore_posix_cuda13_4(Posix, V13_4),
        gpusnap_runc_posix_cuda13_0_is_refused(Posix, V13_0);
}

/// [`continues`] for doors that need nothing back from it.
fn check_continues(
    what: &str,
    checkpointed: &Count,
    read: impl FnMut() -> Option<Count>,
) -> Result<()> {
    continues(what, checkpointed, read).map(drop)
}
