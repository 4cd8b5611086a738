//! `gpusnap-runc checkpoint`: runc's command line → the checkpoint transaction.
//!
//! Like runc, a checkpoint without `--leave-running` ends with the container gone (killed and
//! deleted), but only once the image is sealed: a failure leaves it running.

use std::path::{Path, PathBuf};

use gpusnap_criu_bridge::{CgroupsMode, CriuFlags};
use gpusnap_transaction::{host::Runc, lock::DirLock, CheckpointRequest, Direct};

use crate::args::{Parsed, CHECKPOINT_VALUE_FLAGS};
use crate::{Context, EXIT_REFUSED, SCRATCH_DIR};

/// What the caller asked runc to do, as far as gpusnap is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: String,
    pub image_dir: PathBuf,
    pub work_dir: Option<PathBuf>,
    pub parent: Option<PathBuf>,
    pub auto_dedup: bool,
    pub leave_running: bool,
    pub criu: CriuFlags,
    pub pre_dump: bool,
    /// `--lazy-pages` / `--page-server`: memory would not be in the image directory.
    pub remote_pages: bool,
}

/// A `checkpoint` command line runc would refuse too (gpusnap-runc then lets runc say so in
/// its own words).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("checkpoint needs a container id")]
    NoId,
    #[error("checkpoint takes one container id, got {0:?}")]
    SeveralIds(Vec<String>),
    #[error(transparent)]
    CgroupsMode(#[from] gpusnap_criu_bridge::OptionsError),
}

/// Builds the request the way runc reads its flags (relative paths against the cwd; the image
/// path defaults to `./checkpoint`).
pub fn request(p: &Parsed, cwd: &Path) -> Result<Request, RequestError> {
    let id = match p.positionals.as_slice() {
        [id] => id.clone(),
        [] => return Err(RequestError::NoId),
        more => return Err(RequestError::SeveralIds(more.to_vec())),
    };
    let abs = |v: &str| {
        let p = PathBuf::from(v);
        if p.is_absolute() {
            p
        } else {
            cwd.join(p)
        }
    };
    let value = |name: &str| p.value(&[name]).filter(|v| !v.is_empty());
    let criu = CriuFlags {
        tcp_established: p.is_set(&["tcp-established"]),
        ext_unix_sk: p.is_set(&["ext-unix-sk"]),
        shell_job: p.is_set(&["shell-job"]),
        file_locks: p.is_set(&["file-locks"]),
        empty_ns: p.values("empty-ns"),
        manage_cgroups_mode: value("manage-cgroups-mode")
            .map(str::parse::<CgroupsMode>)
            .transpose()?,
    };
    Ok(Request {
        id,
        image_dir: value("image-path")
            .map(abs)
            .unwrap_or_else(|| cwd.join("checkpoint")),
        work_dir: value("work-path").map(abs),
        // runc resolves --parent-path relative to the image directory itself.
        parent: value("parent-path").map(PathBuf::from),
        auto_dedup: p.is_set(&["auto-dedup"]),
        leave_running: p.is_set(&["leave-running"]),
        criu,
        pre_dump: p.is_set(&["pre-dump"]),
        remote_pages: p.is_set(&["lazy-pages"]) || value("page-server").is_some(),
    })
}

pub fn run(ctx: &Context) -> i32 {
    let parsed = ctx.inv.command_parsed(CHECKPOINT_VALUE_FLAGS);
    if ctx.inv.wants_help(&parsed) {
        // CRI-O probes checkpoint support with `checkpoint --help`.
        return ctx.exec_runc();
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let req = match request(&parsed, &cwd) {
        Ok(r) => r,
        // runc prints the usage error in its own words.
        Err(_) => return ctx.exec_runc(),
    };
    if req.pre_dump {
        // A pre-dump is only the parent of a later dump, never restored by itself: no manifest.
        return ctx.exec_runc();
    }
    if req.remote_pages {
        ctx.fail(
            "--lazy-pages and --page-server leave the container's memory outside the image \
             directory, so gpusnap cannot verify the checkpoint; use runc directly for them",
        );
        return EXIT_REFUSED;
    }
    let global = ctx.global();
    let runc = Runc::new(global.clone(), &req.id, &Direct);
    let Some((init_pid, status)) = runc.state() else {
        // Unknown container: runc reports it exactly as runc would.
        return ctx.exec_runc();
    };
    // One checkpoint of a container at a time, whoever runs it.
    let state_dir = ctx.state_dir(&req.id);
    let _lock = match DirLock::exclusive(&state_dir) {
        Ok(l) => l,
        Err(e) => return ctx.fail_with(&e),
    };
    let Some(bundle) = bundle_of(&state_dir) else {
        ctx.fail(&format!(
            "cannot checkpoint {}: runc's state in {} names no bundle, so its runtime spec \
             cannot be checked; nothing was checkpointed",
            req.id,
            state_dir.display()
        ));
        return EXIT_REFUSED;
    };
    let config = match ctx.config_for(&bundle) {
        Ok(c) => c,
        Err(e) => {
            ctx.fail(&format!(
                "cannot checkpoint {}: {e}; nothing was checkpointed",
                req.id
            ));
            return EXIT_REFUSED;
        }
    };
    let request = CheckpointRequest {
        container_id: req.id.clone(),
        bundle,
        init_pid,
        image_dir: req.image_dir.clone(),
        work_dir: req.work_dir.clone(),
        parent: req.parent.clone(),
        auto_dedup: req.auto_dedup,
        criu: req.criu.clone(),
        exit: !req.leave_running,
        // containerd-shim-runc-v2 (and any caller that pauses first) hands over a frozen
        // container and expects it frozen afterwards.
        frozen: status == "paused",
        runc: global,
        config,
        scratch_dir: PathBuf::from(SCRATCH_DIR),
        // Read back by the next gpusnap-runc call for the container if this one is killed.
        record_dir: state_dir.clone(),
    };
    let report = match gpusnap_transaction::checkpoint(&request, &Direct) {
        Ok(r) => r,
        Err(e) => return ctx.fail_with(&e),
    };
    if report.stopped {
        // runc's checkpoint without --leave-running destroys the container: so does this one,
        // now that the image is sealed.
        if let Err(e) = ctx
            .runc_command(global_args(ctx).into_iter().chain([
                "delete".into(),
                "--force".into(),
                req.id.clone().into(),
            ]))
            .stdin(std::process::Stdio::null())
            .output()
        {
            tracing::warn!(id = %req.id, error = %e, "deleting the container after its checkpoint failed");
        }
    }
    if let Some(pending) = report.pending_cuda {
        // For `gpusnap-runc resume` (or the next checkpoint), in runc's state directory.
        if let Err(e) = pending.save(&state_dir) {
            ctx.fail(&format!(
                "checkpoint of {} is sealed, but {e}; they will not be resumed with the \
                 container",
                req.id,
            ));
            return EXIT_REFUSED;
        }
    }
    0
}

/// The caller's global flags that select runc's containers (`--root`, `--systemd-cgroup`,
/// `--rootless`), for the helper calls the wrapper makes itself.
pub fn global_args(ctx: &Context) -> Vec<std::ffi::OsString> {
    ctx.inv.selection_args()
}

/// The bundle of a container, from runc's `state.json` in its state directory (the
/// transaction's capped reader of it).
fn bundle_of(state_dir: &Path) -> Option<PathBuf> {
    let state = gpusnap_transaction::leftovers::read_runc_state(state_dir)?;
    state
        .pointer("/config/labels")
        .and_then(|l| l.as_array())
        .and_then(|labels| {
            labels
                .iter()
                .filter_map(|l| l.as_str())
                .find_map(|l| l.strip_prefix("bundle="))
        })
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Invocation;
    use std::ffi::OsString;

    fn parsed(args: &[&str]) -> Parsed {
        let mut v = vec![OsString::from("checkpoint")];
        v.extend(args.iter().map(OsString::from));
        Invocation::parse(v).command_parsed(CHECKPOINT_VALUE_FLAGS)
    }

    #[test]
    fn crio_style_request() {
        let p = parsed(&[
            "--file-locks",
            "--image-path",
            "/var/lib/c/ctr/checkpoint",
            "--work-path",
            "/var/lib/c/ctr",
            "--leave-running",
            "ctr",
        ]);
        let r = request(&p, Path::new("/")).unwrap();
        assert_eq!(r.id, "ctr");
        assert_eq!(r.image_dir, Path::new("/var/lib/c/ctr/checkpoint"));
        assert!(r.leave_running && r.criu.file_locks && !r.criu.tcp_established);
        assert_eq!(r.work_dir.as_deref(), Some(Path::new("/var/lib/c/ctr")));
        assert!(!r.pre_dump && !r.remote_pages);
    }

    #[test]
    fn defaults_relative_paths_and_every_flag() {
        let r = request(&parsed(&["x"]), Path::new("/work")).unwrap();
        assert_eq!(r.image_dir, Path::new("/work/checkpoint"));
        assert!(!r.leave_running);
        let r = request(
            &parsed(&[
                "--tcp-established",
                "--ext-unix-sk",
                "--shell-job",
                "--image-path",
                "img",
                "--parent-path",
                "../pre",
                "--auto-dedup",
                "--manage-cgroups-mode",
                "soft",
                "--empty-ns",
                "network",
                "x",
            ]),
            Path::new("/w"),
        )
        .unwrap();
        assert_eq!(r.image_dir, Path::new("/w/img"));
        assert_eq!(r.parent.as_deref(), Some(Path::new("../pre")));
        assert!(r.auto_dedup && r.criu.tcp_established && r.criu.ext_unix_sk && r.criu.shell_job);
        assert_eq!(r.criu.manage_cgroups_mode, Some(CgroupsMode::Soft));
        assert_eq!(r.criu.empty_ns, ["network"]);
    }

    #[test]
    fn bad_requests() {
        assert!(request(&parsed(&[]), Path::new("/")).is_err());
        assert!(request(&parsed(&["a", "b"]), Path::new("/")).is_err());
        let err = request(
            &parsed(&["--manage-cgroups-mode", "sideways", "x"]),
            Path::new("/"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("sideways"), "{err}");
        assert!(
            request(&parsed(&["--lazy-pages", "x"]), Path::new("/"))
                .unwrap()
                .remote_pages
        );
        assert!(
            request(&parsed(&["--pre-dump", "x"]), Path::new("/"))
                .unwrap()
                .pre_dump
        );
    }
}
