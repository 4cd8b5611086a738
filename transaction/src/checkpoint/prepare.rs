//! Prepare: everything that can be checked and set up without touching the container. Every
//! error here is a refusal; nothing needs rolling back (the directory's lock goes with the
//! state, and CRIU's private plugin directory with [`crate::criu::PreparedCriu`]).

use std::io;
use std::path::PathBuf;
use std::time::Instant;

use gpusnap_checkpoint::signature::SigningKey;
use gpusnap_checkpoint::{self as dir, Manifest, ProcessRecord};
use gpusnap_criu_bridge::{Dump, OptionsError, RuncCommand};

use super::CheckpointRequest;
use crate::criu::PreparedCriu;
use crate::error::Error;
use crate::gpu::{self, GpuCheckpoint};
use crate::host::{Host, Runc};
use crate::lock::DirLock;
use crate::timings::Timings;

/// Why a checkpoint was refused before anything was changed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The request cannot be a runc checkpoint (bad option, relative path, bad id).
    #[error("{0}")]
    Request(#[source] OptionsError),
    #[error(
        "the container has no running init; only a running or paused container can be \
         checkpointed"
    )]
    NoInit,
    /// The image directory cannot be created or made private.
    #[error("cannot use {}: {source}", dir.display())]
    ImageDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An earlier checkpoint's leftovers cannot be cleared from the image directory.
    #[error("cannot prepare {}: {source}", dir.display())]
    Clear {
        dir: PathBuf,
        #[source]
        source: dir::ScrubError,
    },
    /// A check that classifies its own refusal: the signing key, the directory's lock (busy),
    /// the GPU plan, CRIU.
    #[error(transparent)]
    Check(#[from] Error),
}

impl From<PrepareError> for Error {
    fn from(e: PrepareError) -> Error {
        match e {
            PrepareError::Check(e) => e,
            e @ PrepareError::Request(_) => Error::invalid(e.to_string()).caused_by(e),
            e => Error::precondition(e.to_string()).caused_by(e),
        }
    }
}

/// A checkpoint ready to touch the container.
pub(super) struct Prepared<'a> {
    pub req: &'a CheckpointRequest,
    pub started: Instant,
    pub timings: Timings,
    /// runc with the environment CRIU's private plugin directory needs.
    pub runc: Runc<'a>,
    pub dump_cmd: RuncCommand,
    pub criu_log: PathBuf,
    /// Kept until runc has returned (the dump drops it): it owns the plugin directory runc's
    /// environment names.
    pub criu: Option<PreparedCriu>,
    /// `None`: no CUDA process (a CPU-only checkpoint).
    pub plan: Option<GpuCheckpoint>,
    pub manifest: Manifest,
    pub signer: Option<SigningKey>,
    /// Held until the transaction returns.
    pub _lock: DirLock,
}

pub(super) fn run<'a>(
    req: &'a CheckpointRequest,
    host: &'a dyn Host,
) -> Result<Prepared<'a>, PrepareError> {
    let started = Instant::now();
    let image_dir = &req.image_dir;
    let mut global = req.runc.clone();
    let dump = Dump {
        image_dir: image_dir.clone(),
        work_dir: req.work_dir.clone(),
        parent: req.parent.clone(),
        auto_dedup: req.auto_dedup,
        leave_running: true,
        flags: req.criu.clone(),
    };
    // Everything that can be checked without touching anything.
    global
        .checkpoint(&req.container_id, &dump)
        .map_err(PrepareError::Request)?;
    if req.init_pid == 0 {
        return Err(PrepareError::NoInit);
    }

    let signer = crate::signature::node_signer(&req.config)?;
    dir::beneath::create_private_dir(image_dir).map_err(|source| PrepareError::ImageDir {
        dir: image_dir.clone(),
        source,
    })?;
    let lock = DirLock::exclusive(image_dir)?;
    let pids = Runc::new(global.clone(), &req.container_id, host).pids(req.init_pid);
    let plan = gpu::plan_checkpoint(&req.config, &pids, image_dir)
        .map_err(|e| e.context("refused before anything was touched"))?;
    let criu = crate::criu::prepare(
        &mut global,
        &req.config,
        plan.is_some(),
        &req.bundle,
        &req.scratch_dir,
        host,
    )?;
    let runc = Runc::new(global.clone(), &req.container_id, host);
    let dump_cmd = global
        .checkpoint(&req.container_id, &dump)
        .map_err(PrepareError::Request)?;

    dir::begin_checkpoint(image_dir).map_err(|source| PrepareError::Clear {
        dir: image_dir.clone(),
        source,
    })?;
    let mut manifest = Manifest::new(&req.container_id, req.criu.clone());
    manifest.criu_version = Some(criu.info.version.to_string());
    manifest.runc_version = super::runc_version_cached(&global, host);
    manifest.processes = pids
        .iter()
        .map(|&pid| ProcessRecord {
            container_pid: container_pid(pid),
            command: command_line(pid),
        })
        .collect();

    Ok(Prepared {
        req,
        started,
        timings: Timings::default(),
        runc,
        criu_log: dump.criu_log(),
        dump_cmd,
        criu: Some(criu),
        plan,
        manifest,
        signer,
        _lock: lock,
    })
}

/// A process's argv, when readable.
fn command_line(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// The pid inside the container's pid namespace (last NSpid field), when readable.
fn container_pid(host_pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}
