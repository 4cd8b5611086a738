//! Checkpoint and restore as the shim runs them: containerd's checkpoint options in the
//! transaction's terms, where CRIU's work files go, and the `gpusnap_transaction` sequences
//! run from the shim (under its subreaper, on blocking threads). The container
//! (`container/checkpoint.rs`, `container/restore.rs`) builds the requests and moves its state
//! around them; the transaction itself — GPU plan and gate, CRIU through runc, seal,
//! rollback — is the transaction crate's.

use std::{
    io,
    path::PathBuf,
    process::{Command, ExitStatus, Output, Stdio},
    sync::Arc,
};

use containerd_shim::protos::{
    protobuf::{well_known_types::any::Any, Message},
    shim::oci::CheckpointOptions as CheckpointOptionsProto,
};
use gpusnap_criu_bridge::{CgroupsMode, CriuFlags};
use gpusnap_transaction::{
    bundle_spec::BundleSpec, volume::VolumeSource, CheckpointReport, CheckpointRequest, Host,
    PendingCudaResume, RestoreReport, RestoreRequest, RunTool,
};

use crate::{
    errors::*,
    reaper::{run_reaped, run_reaped_with},
    stdio::ProcessPipes,
};

pub const CHECKPOINT_OPTIONS: &str = "containerd.runc.v1.CheckpointOptions";
/// Where runc restore's CRIU work files (restore.log, and CRIU's cgroup yard while it runs)
/// go: the shim's own directory (below), so the checkpoint directory is never written to by a
/// restore and can be restored again.
const RESTORE_WORK_DIR: &str = "criu-restore";

/// This shim's own directory: where containerd started it (the container's bundle, or the
/// bundle of the pod's sandbox whose shim serves the pod) and where containerd runs the shim's
/// `delete` once it died, before it removes that directory. A restore's in-flight record and
/// CRIU's work directory (its cgroup yard is mounted there) live here so that the `delete`
/// finds them: containerd may already have removed a pod container's own bundle by then.
pub fn own_dir(bundle: &std::path::Path) -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| bundle.to_path_buf())
}

/// CRIU's work directory for a restore of `id` whose bundle is `bundle`: `criu-restore` in
/// the container's own bundle, `criu-restore.<id>` in the sandbox's.
pub fn restore_work_dir(own: &std::path::Path, bundle: &std::path::Path, id: &str) -> PathBuf {
    if own == bundle {
        own.join(RESTORE_WORK_DIR)
    } else {
        own.join(format!("{RESTORE_WORK_DIR}.{id}"))
    }
}

/// containerd's checkpoint options, in the transaction's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointOptions {
    pub exit: bool,
    pub criu: CriuFlags,
    pub image_path: Option<PathBuf>,
    pub work_path: Option<PathBuf>,
}

/// Why containerd's checkpoint options were refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointOptionsError {
    #[error("checkpoint options ({name}) could not be decoded: {source}")]
    Decode {
        name: String,
        source: containerd_shim::protos::protobuf::Error,
    },
    #[error("{0}")]
    CgroupsMode(String),
}

impl From<CheckpointOptionsError> for Error {
    fn from(e: CheckpointOptionsError) -> Self {
        invalid_argument(e.to_string())
    }
}

/// Decodes containerd's checkpoint options. No options, or options of another type (CRI
/// sends none for runtimes not named runc.v2), mean "leave running, no extra permissions".
pub fn checkpoint_options(
    any: Option<&Any>,
) -> std::result::Result<CheckpointOptions, CheckpointOptionsError> {
    let Some(any) = any.filter(|a| !a.type_url.is_empty()) else {
        return Ok(CheckpointOptions::default());
    };
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    if name != CHECKPOINT_OPTIONS {
        tracing::info!(type_url = %any.type_url, "checkpoint options of another type ignored; leaving the task running");
        return Ok(CheckpointOptions::default());
    }
    let o = CheckpointOptionsProto::parse_from_bytes(&any.value).map_err(|source| {
        CheckpointOptionsError::Decode {
            name: name.to_string(),
            source,
        }
    })?;
    let path = |p: &str| (!p.is_empty()).then(|| PathBuf::from(p));
    Ok(CheckpointOptions {
        exit: o.exit,
        criu: CriuFlags {
            tcp_established: o.open_tcp,
            ext_unix_sk: o.external_unix_sockets,
            shell_job: o.terminal,
            file_locks: o.file_locks,
            empty_ns: o.empty_namespaces.clone(),
            manage_cgroups_mode: CgroupsMode::parse_optional(&o.cgroups_mode)
                .map_err(|e| CheckpointOptionsError::CgroupsMode(e.to_string()))?,
        },
        image_path: path(&o.image_path),
        work_path: path(&o.work_path),
    })
}

/// containerd's CRI asks runc.v2 for CRIU's work files (`dump.log`, `stats-dump`) at the top
/// of the checkpoint archive, beside `checkpoint/`, where CRI tooling (checkpointctl) reads
/// them; other runtimes get no options. So a checkpoint into a directory named `checkpoint`
/// without options (CRI) puts them in its parent, as runc.v2's does.
pub fn cri_work_dir(image_dir: &std::path::Path) -> Option<PathBuf> {
    (image_dir.file_name()? == "checkpoint")
        .then(|| image_dir.parent().map(std::path::Path::to_path_buf))
        .flatten()
}

/// The work path containerd's CRI gives runtimes of type io.containerd.runc.v2 for a
/// `CheckpointContainer` of container `id`, when `spec` is a CRI container's. CRIU's
/// `dump.log` and `stats-dump` land there and end up at the top of the archive, where CRI
/// tooling (checkpointctl) reads them. The gpusnap runtime gets no options from CRI
/// (containerd 2.1.9 hands it only an image directory under /tmp), so the shim finds the same
/// directory itself: CRI mounts the pod's `/etc/hosts` (`hostname`, `resolv.conf`) from
/// `<cri root>/sandboxes/<sandbox id>/` and keeps the container's files in
/// `<cri root>/containers/<id>/`, whose `status` file confirms it. containerd 2.1.9 archives
/// `<that>/ctrd-checkpoint/`, which it creates just before the checkpoint and passes as the
/// work path; earlier 2.x releases passed the container directory itself and copied the two
/// files from there.
pub fn cri_work_path(spec: &BundleSpec, id: &str) -> Option<PathBuf> {
    let dir = cri_container_dir(spec, id)?;
    let archived = dir.join("ctrd-checkpoint");
    if std::fs::symlink_metadata(&archived).is_ok_and(|m| m.is_dir()) {
        Some(archived)
    } else {
        Some(dir)
    }
}

/// CRI's directory of container `id` (see [`cri_work_path`]).
fn cri_container_dir(spec: &BundleSpec, id: &str) -> Option<PathBuf> {
    if !spec.is_cri_container() || !gpusnap_criu_bridge::is_plain_id(id) {
        return None;
    }
    let sandbox = spec.cri_sandbox_id()?;
    spec.mounts().iter().find_map(|m| {
        let dest = m.destination().to_str()?;
        if !matches!(dest, "/etc/hosts" | "/etc/hostname" | "/etc/resolv.conf") {
            return None;
        }
        let sandbox_dir = m.source().as_deref()?.parent()?;
        let sandboxes = sandbox_dir.parent()?;
        if sandbox_dir.file_name()? != sandbox || sandboxes.file_name()? != "sandboxes" {
            return None;
        }
        let dir = sandboxes.parent()?.join("containers").join(id);
        dir.join("status").is_file().then_some(dir)
    })
}

/// How the transaction runs programs from inside the shim: under the shim's subreaper (which
/// collects every child itself), from a blocking thread.
struct ShimHost {
    handle: tokio::runtime::Handle,
    /// The restored container's stdio (restore only).
    pipes: Option<Arc<ProcessPipes>>,
}

impl RunTool for ShimHost {
    fn output(&self, cmd: Command) -> io::Result<Output> {
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (status, _pid, stdout, stderr) = self.handle.block_on(run_reaped(cmd))?;
        Ok(Output {
            status,
            stdout: stdout.into_bytes(),
            stderr: stderr.into_bytes(),
        })
    }
}

impl Host for ShimHost {
    fn run_restore(&self, cmd: Command, started: &dyn Fn(u32)) -> io::Result<ExitStatus> {
        let mut cmd = tokio::process::Command::from(cmd);
        if let Some(pipes) = &self.pipes {
            pipes.apply(&mut cmd)?;
        }
        let result = self.handle.block_on(run_reaped_with(cmd, started));
        if let Some(pipes) = &self.pipes {
            pipes.close_child_ends();
        }
        result.map(|(status, ..)| status)
    }
}

/// Runs a transaction step on a blocking thread (driver calls and runc block).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal(e.to_string()))
}

/// Restores and unlocks CUDA processes a checkpoint of the paused task left checkpointed;
/// the task must be running (thawed).
pub async fn resume_cuda(id: &str, pending: PendingCudaResume) -> Result<()> {
    let started = std::time::Instant::now();
    blocking(move || pending.resume()).await?.map_err(|e| {
        internal(format!(
            "{id} was resumed but its CUDA processes could not be: {e}"
        ))
    })?;
    tracing::info!(
        id,
        cuda_resume_ms = started.elapsed().as_millis() as u64,
        "CUDA processes resumed after checkpoint"
    );
    Ok(())
}

/// Runs the checkpoint transaction. A previous checkpoint of this paused task may have left
/// its CUDA processes checkpointed (`pending`): the transaction brings them back first, once
/// its in-flight record is written.
pub async fn checkpoint(
    request: CheckpointRequest,
    pending: Option<PendingCudaResume>,
) -> Result<CheckpointReport> {
    let host = ShimHost {
        handle: tokio::runtime::Handle::current(),
        pipes: None,
    };
    blocking(move || {
        gpusnap_transaction::checkpoint_resuming(&request, &host, pending).map_err(Error::from)
    })
    .await?
}

/// Runs the restore transaction with the restored container's stdio on `pipes`; from the
/// node's copy of an image volume's checkpoint when `volume` names one.
pub async fn restore(
    request: RestoreRequest,
    volume: Option<Box<VolumeSource>>,
    pipes: Arc<ProcessPipes>,
) -> Result<RestoreReport> {
    let host = ShimHost {
        handle: tokio::runtime::Handle::current(),
        pipes: Some(pipes),
    };
    blocking(move || {
        gpusnap_transaction::restore_source::restore(volume.as_deref(), request, &host)
    })
    .await?
    .map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        a
    }

    #[test]
    fn absent_or_foreign_options_leave_the_task_running() {
        assert_eq!(
            checkpoint_options(None).unwrap(),
            CheckpointOptions::default()
        );
        let foreign = any("example.Other", vec![1, 2, 3]);
        assert!(!checkpoint_options(Some(&foreign)).unwrap().exit);
    }

    #[test]
    fn runc_checkpoint_options_are_decoded() {
        let mut o = CheckpointOptionsProto::new();
        o.exit = true;
        o.open_tcp = true;
        o.file_locks = true;
        o.cgroups_mode = "soft".into();
        o.work_path = "/tmp/work".into();
        let a = any(
            "containerd.runc.v1.CheckpointOptions",
            o.write_to_bytes().unwrap(),
        );
        let opts = checkpoint_options(Some(&a)).unwrap();
        assert!(opts.exit && opts.criu.tcp_established && opts.criu.file_locks);
        assert_eq!(opts.criu.manage_cgroups_mode, Some(CgroupsMode::Soft));
        assert_eq!(opts.work_path, Some(PathBuf::from("/tmp/work")));
    }

    #[test]
    fn cri_container_dir_is_found_from_the_sandbox_mounts() {
        let root = tempfile::tempdir().unwrap();
        let cri = root.path().join("io.containerd.grpc.v1.cri");
        let dir = cri.join("containers/c1");
        std::fs::create_dir_all(&dir).unwrap();
        let spec = |kind: &str, sandbox: &str, source: &std::path::Path| {
            let json = serde_json::json!({
                "annotations": {
                    "io.kubernetes.cri.container-type": kind,
                    "io.kubernetes.cri.sandbox-id": sandbox,
                },
                "mounts": [
                    {"destination": "/dev/shm", "source": "/run/x/sandboxes/s1/shm"},
                    {"destination": "/etc/hosts", "source": source},
                ]
            });
            BundleSpec::from_bytes(&serde_json::to_vec(&json).unwrap()).unwrap()
        };
        let hosts = cri.join("sandboxes/s1/hosts");
        // Without CRI's status file it is not CRI's container directory.
        assert_eq!(
            cri_container_dir(&spec("container", "s1", &hosts), "c1"),
            None
        );
        std::fs::write(dir.join("status"), "{}").unwrap();
        assert_eq!(
            cri_container_dir(&spec("container", "s1", &hosts), "c1"),
            Some(dir.clone())
        );
        // The sandbox itself, another sandbox's files, other layouts and odd ids: none.
        assert_eq!(
            cri_container_dir(&spec("sandbox", "s1", &hosts), "c1"),
            None
        );
        assert_eq!(
            cri_container_dir(&spec("container", "s2", &hosts), "c1"),
            None
        );
        let elsewhere = root.path().join("etc/s1/hosts");
        assert_eq!(
            cri_container_dir(&spec("container", "s1", &elsewhere), "c1"),
            None
        );
        assert_eq!(
            cri_container_dir(&spec("container", "s1", &hosts), "../c1"),
            None
        );
        let empty = BundleSpec::from_bytes(b"{}").unwrap();
        assert_eq!(cri_container_dir(&empty, "c1"), None);
        // containerd 2.1.9 archives a fresh ctrd-checkpoint/ inside; older ones the directory.
        let s = spec("container", "s1", &hosts);
        assert_eq!(cri_work_path(&s, "c1"), Some(dir.clone()));
        std::fs::create_dir(dir.join("ctrd-checkpoint")).unwrap();
        assert_eq!(cri_work_path(&s, "c1"), Some(dir.join("ctrd-checkpoint")));
    }

    #[test]
    fn bad_cgroups_mode_is_refused_with_its_name() {
        let mut o = CheckpointOptionsProto::new();
        o.cgroups_mode = "sideways".into();
        let a = any(
            "containerd.runc.v1.CheckpointOptions",
            o.write_to_bytes().unwrap(),
        );
        let err = checkpoint_options(Some(&a)).unwrap_err().to_string();
        assert!(err.contains("sideways"), "{err}");
    }
}
