//! `gpusnap-runc checkpoint`: runc's checkpoint with the same arguments, framed by gpusnap's
//! preparation and seal (the order of `shim/src/checkpoint.rs`):
//!
//! probe CRIU → clear the image directory → [GPU: lock + checkpoint CUDA processes] →
//! runc checkpoint → [GPU: with --leave-running, restore + unlock] → seal (digest every file,
//! write the manifest last). A failure before the seal scrubs the directory, so nothing in it
//! looks restorable.

use std::path::{Path, PathBuf};
use std::time::Instant;

use gpusnap_criu_bridge::{
    self as bridge, CgroupsMode, CheckpointOptions, CriuVersion, Manifest, ProcessRecord,
};

use super::args::{Parsed, CHECKPOINT_VALUE_FLAGS};
use super::gpu::{self, CheckpointGpu};
use super::{exit_code, Context, EXIT_REFUSED};

/// What the caller asked runc to do, as far as gpusnap is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: String,
    pub image_dir: PathBuf,
    pub options: CheckpointOptions,
    pub pre_dump: bool,
    /// `--lazy-pages` / `--page-server`: memory would not be in the image directory.
    pub remote_pages: bool,
}

/// Builds the request the way runc reads its flags (relative paths against the cwd; the image
/// path defaults to `./checkpoint`).
pub fn request(p: &Parsed, cwd: &Path) -> Result<Request, String> {
    let id = match p.positionals.as_slice() {
        [id] => id.clone(),
        [] => return Err("checkpoint needs a container id".to_owned()),
        more => return Err(format!("checkpoint takes one container id, got {more:?}")),
    };
    let abs = |v: &str| {
        let p = PathBuf::from(v);
        if p.is_absolute() {
            p
        } else {
            cwd.join(p)
        }
    };
    let image_dir = p
        .value(&["image-path"])
        .filter(|v| !v.is_empty())
        .map(abs)
        .unwrap_or_else(|| cwd.join("checkpoint"));
    let cgroups_mode = p
        .value(&["manage-cgroups-mode"])
        .map(|m| m.parse::<CgroupsMode>().map_err(|e| e.to_string()))
        .transpose()?;
    let options = CheckpointOptions {
        exit: !p.is_set(&["leave-running"]),
        open_tcp: p.is_set(&["tcp-established"]),
        external_unix_sockets: p.is_set(&["ext-unix-sk"]),
        terminal: p.is_set(&["shell-job"]),
        file_locks: p.is_set(&["file-locks"]),
        empty_namespaces: p.values("empty-ns"),
        cgroups_mode,
        image_path: Some(image_dir.clone()),
        work_path: p.value(&["work-path"]).filter(|v| !v.is_empty()).map(abs),
    };
    Ok(Request {
        id,
        image_dir,
        options,
        pre_dump: p.is_set(&["pre-dump"]),
        remote_pages: p.is_set(&["lazy-pages"]) || p.value(&["page-server"]).is_some(),
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
    let Some((bundle, init_pid)) = ctx.state(&req.id) else {
        // Unknown container: runc reports it exactly as runc would.
        return ctx.exec_runc();
    };
    match checkpoint(ctx, &req, &bundle, init_pid) {
        Ok(()) => 0,
        Err(code) => code,
    }
}

fn criu_min(ctx: &Context, gpu: bool) -> CriuVersion {
    let floor = if gpu {
        bridge::MIN_CRIU_GPU
    } else {
        bridge::MIN_CRIU_CPU
    };
    match ctx.config.criu.min_version {
        Some(v) => floor.max(CriuVersion::new(v.major, v.minor, v.patch)),
        None => floor,
    }
}

fn checkpoint(ctx: &Context, req: &Request, bundle: &Path, init_pid: i32) -> Result<(), i32> {
    let started = Instant::now();
    let refuse = |msg: String| {
        ctx.fail(&msg);
        EXIT_REFUSED
    };
    let mut pids = ctx.pids(&req.id);
    if pids.is_empty() {
        pids.push(init_pid);
    }
    let gpu_plan = gpu::prepare_checkpoint(&ctx.config, &pids)
        .map_err(|e| refuse(format!("{}: {e}", req.id)))?;
    let is_gpu = matches!(gpu_plan, CheckpointGpu::Cuda { .. });

    // Fail before touching anything when CRIU is missing or too old. runc's --criu names the
    // binary directly; otherwise runc runs `criu` from its PATH.
    let search = match ctx
        .inv
        .criu_path()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        Some(dir) => dir.into_os_string(),
        None => ctx.path_env.clone(),
    };
    let criu = bridge::probe_criu(&search)
        .and_then(|info| info.require(criu_min(ctx, is_gpu)).map(|()| info))
        .map_err(|e| refuse(e.to_string()))?;

    bridge::begin_checkpoint(&req.image_dir)
        .map_err(|e| refuse(format!("preparing {}: {e}", req.image_dir.display())))?;
    let mut manifest = Manifest::new(&req.id, bundle, req.options.clone());
    manifest.criu_version = Some(criu.version.to_string());
    manifest.runc_version = bridge::runc_version(&ctx.runc).ok().map(|v| v.version);
    manifest.processes = pids
        .iter()
        .map(|&pid| ProcessRecord {
            host_pid: pid as u32,
            container_pid: gpusnap_cuda::discovery::container_pid(Path::new("/proc"), pid)
                .ok()
                .flatten()
                .and_then(|p| u32::try_from(p).ok()),
            command: std::fs::read(format!("/proc/{pid}/cmdline"))
                .ok()
                .map(|raw| {
                    raw.split(|b| *b == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect()
                }),
        })
        .collect();

    let dump_started = Instant::now();
    let mut runc_status = None;
    let mut dump = || -> Result<(), String> {
        let status = ctx
            .run_runc()
            .map_err(|e| format!("cannot run {}: {e}", ctx.runc.display()))?;
        runc_status = Some(status);
        if status.success() {
            Ok(())
        } else {
            Err(format!("runc checkpoint failed ({status})"))
        }
    };
    let leave_running = !req.options.exit;
    let dumped = match gpu_plan {
        CheckpointGpu::CpuOnly => dump().map(|()| None),
        CheckpointGpu::Cuda {
            orchestrator,
            processes,
        } => gpu::checkpoint(orchestrator, &processes, leave_running, dump).map(Some),
    };
    let gpu_section = match dumped {
        Ok(section) => section,
        Err(e) => {
            abandon(&req.image_dir);
            let criu_log = req
                .options
                .criu_log_dir(&req.image_dir)
                .join(bridge::DUMP_LOG);
            let tail = bridge::criu_log_tail(&criu_log, bridge::runc_cmd::ERROR_LOG_LINES)
                .map(|t| format!("\n{t}"))
                .unwrap_or_default();
            ctx.fail(&format!(
                "checkpoint of {} failed before it was complete{}: {e}{tail}",
                req.id,
                if leave_running {
                    "; the container keeps running"
                } else {
                    ""
                }
            ));
            return Err(runc_status
                .filter(|s| !s.success())
                .map(exit_code)
                .unwrap_or(EXIT_REFUSED));
        }
    };
    manifest.record_phase("criu-dump", dump_started.elapsed());
    manifest.gpu = gpu_section;
    match bridge::seal_checkpoint(&req.image_dir, manifest) {
        Ok(m) => {
            tracing::info!(
                id = %req.id,
                dir = %req.image_dir.display(),
                files = m.images.files.len(),
                bytes = m.images.total_bytes,
                gpu = m.gpu.is_some(),
                total_ms = started.elapsed().as_millis() as u64,
                "checkpoint sealed"
            );
            Ok(())
        }
        Err(e) if leave_running => {
            abandon(&req.image_dir);
            Err(refuse(format!(
                "checkpoint of {} could not be sealed; the container keeps running: {e}",
                req.id
            )))
        }
        Err(e) => Err(refuse(format!(
            // runc already stopped the container: these images are its only copy. Keep them
            // (without a manifest restore refuses them) for manual recovery.
            "checkpoint of {} could not be sealed: {e}; the container was stopped by the dump, \
             so its images are kept unsealed in {} for manual recovery",
            req.id,
            req.image_dir.display()
        ))),
    }
}

fn abandon(dir: &Path) {
    if let Err(e) = bridge::scrub_incomplete(dir) {
        tracing::error!(dir = %dir.display(), error = %e, "could not scrub an incomplete checkpoint");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runc_wrapper::Invocation;
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
        assert!(!r.options.exit && r.options.file_locks && !r.options.open_tcp);
        assert_eq!(
            r.options.work_path.as_deref(),
            Some(Path::new("/var/lib/c/ctr"))
        );
        assert!(!r.pre_dump && !r.remote_pages);
    }

    #[test]
    fn defaults_and_relative_paths_follow_runc() {
        let r = request(&parsed(&["--tcp-established", "x"]), Path::new("/work")).unwrap();
        assert_eq!(r.image_dir, Path::new("/work/checkpoint"));
        assert!(r.options.exit && r.options.open_tcp);
        let r = request(
            &parsed(&[
                "--image-path",
                "img",
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
        assert_eq!(r.options.cgroups_mode, Some(CgroupsMode::Soft));
        assert_eq!(r.options.empty_namespaces, ["network"]);
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
        assert!(err.contains("sideways"), "{err}");
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
