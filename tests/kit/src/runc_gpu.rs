//! The `gpusnap-runc` door (what CRI-O and Podman run) with the CUDA driver double: a busybox
//! counter whose init is a CUDA process of the double, run by runc in the double's scratch
//! directory, checkpointed and restored through `gpusnap-runc`.

use std::path::Path;

use anyhow::{ensure, Context, Result};

use crate::bundle::BusyboxContainer;
use crate::counter::{count_in_file, counter_script, wait_count, Count, WARM};
use crate::gpu::{CudaProcess, GpuDouble};

/// `gpu`'s config plus the rig's CRIU, written to `<scratch>/gpusnap.toml`; its path, for
/// `GPUSNAP_CONFIG`.
pub fn runc_config(gpu: &GpuDouble) -> Result<String> {
    let config = gpu.write_config(&crate::paths::criu_config())?;
    Ok(config.display().to_string())
}

/// A busybox container whose init is a CUDA process of the double, started through runc,
/// counting.
pub struct RuncWorkload {
    pub c: BusyboxContainer,
    pub cuda: CudaProcess,
    /// The CUDA process's device memory.
    pub bytes: Vec<u8>,
    /// The init's host pid.
    pub pid: u32,
}

impl RuncWorkload {
    /// A new CUDA process `name` of `gpu` as the init of a counter in `gpu`'s scratch
    /// directory, started and counted past [`WARM`].
    pub fn start(gpu: &GpuDouble, name: &str) -> Result<RuncWorkload> {
        let (cuda, bytes) = gpu.cuda_process(name)?;
        let c = BusyboxContainer::create(gpu.scratch(), &cuda.id, &counter_script(&cuda.id));
        c.add_env(&cuda.env());
        c.start();
        let w = RuncWorkload {
            pid: c.pid().context("runc state gives no pid")? as u32,
            c,
            cuda,
            bytes,
        };
        wait_count(&w.cuda.id, &w.c.id, WARM, || w.count())?;
        Ok(w)
    }

    /// The counter's current value.
    pub fn count(&self) -> Option<Count> {
        count_in_file(&self.c.bundle.join("rootfs/tmp/count"))
    }

    /// `gpusnap-runc checkpoint --image-path <images> <id>` (runc's default: the container is
    /// gone afterwards); exit code, stdout, stderr.
    pub fn checkpoint(
        &self,
        gpu: &GpuDouble,
        images: &Path,
        env: &[(&str, &str)],
    ) -> Result<(i32, String, String)> {
        let images = images.to_str().context("image path")?;
        Ok(self.c.wrapper(
            &["checkpoint", "--image-path", images, &self.c.id],
            env,
            gpu.scratch(),
        ))
    }

    /// `gpusnap-runc restore -d` of `images` (CRIU's part emulated on the double first), which
    /// must succeed: the container runs under a new host pid, its CUDA process restored and
    /// unlocked with its device memory back. Returns the new pid.
    pub fn restore(&self, gpu: &GpuDouble, images: &Path, env: &[(&str, &str)]) -> Result<u32> {
        gpu.emulate_criu_restore(&self.cuda)?;
        let (code, _, err) = self.c.wrapper_restore(images, env, gpu.scratch());
        ensure!(
            code == 0,
            "gpusnap-runc restore failed (exit {code}):\n{err}"
        );
        ensure!(
            self.c.status().as_deref() == Some("running"),
            "restored container: {:?}",
            self.c.state()
        );
        let pid = self.c.pid().context("restored pid")? as u32;
        ensure!(pid != self.pid, "restored under the old host pid {pid}");
        gpu.check_restored(&self.cuda, pid, &self.bytes)?;
        Ok(pid)
    }
}
