//! Bound: how CRIU will run and what the images may give the restored processes. CRIU is
//! found where runc will look, new enough, without its own cuda plugin and with config files
//! the model allows; runc's command is built from the request and what the node grants
//! (`restore.criu_flags`); and the CRIU images are bounded by the spec of the container being
//! created (`privilege.rs`).
//!
//! The last of the refusals: nothing was changed. Rollback is the state's drop (the record
//! removed, the lock released, CRIU's private plugin directory removed).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use gpusnap_checkpoint::chunks::InPlaceFile;
use gpusnap_checkpoint::Manifest;
use gpusnap_criu_bridge::{CriuFlags, OptionsError, Restore, RuncCommand, RuncGlobal};

use super::validate::Validated;
use super::{end_phase, RestoreCommand, RestoreRequest};
use crate::criu::PreparedCriu;
use crate::deadline::{Changed, Phase};
use crate::error::Error;
use crate::host::{Host, Runc};

/// Why a checkpoint was refused before anything was changed.
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    /// The node's `restore.criu_flags` names a switch that does not exist.
    #[error("restore.criu_flags in the gpusnap configuration: {0}")]
    GrantedFlags(#[source] OptionsError),
    /// The request cannot be a `runc restore` (bad option, relative path, bad id).
    #[error("{0}")]
    Request(#[source] OptionsError),
    #[error("cannot create {}: {source}", path.display())]
    WorkDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "a checkpoint with GPU state is restored with --detach: runc must return before \
         gpusnap restores the CUDA processes"
    )]
    ForegroundWithGpu,
    /// The page images read from the image's chunks could not be written for CRIU; nothing
    /// has run yet.
    #[error("cannot prepare the page images read from the image's chunks: {0}")]
    InPlace(#[source] Box<super::fill::PrepareError>),
    #[error(
        "page images read from the image's chunks need the restore command built by gpusnap, \
         not the caller's own `runc restore`"
    )]
    InPlaceWithGivenCommand,
    /// A check that classifies its own refusal: CRIU, the spec, the privilege bound, the
    /// deadline.
    #[error(transparent)]
    Check(#[from] Error),
}

impl From<BoundError> for Error {
    fn from(e: BoundError) -> Error {
        match e {
            BoundError::Check(e) => e,
            e @ (BoundError::WorkDir { .. } | BoundError::InPlace(_)) => {
                Error::precondition(e.to_string()).caused_by(e)
            }
            e => Error::invalid(e.to_string()).caused_by(e),
        }
    }
}

/// A restore bounded and ready to change the container's root filesystem.
pub(super) struct Bounded<'a> {
    pub validated: Validated<'a>,
    /// runc with the environment CRIU's private plugin directory needs.
    pub runc: Runc<'a>,
    /// Kept until runc has returned: it owns the plugin directory runc's environment names.
    pub criu: PreparedCriu,
    pub cmd: RuncCommand,
    /// runc's pid file, when the command was built here.
    pub pid_file: Option<PathBuf>,
    /// runc runs the container in the foreground (gpusnap-runc without `--detach`).
    pub foreground: bool,
    /// The container's root filesystem, as its spec names it.
    pub rootfs: PathBuf,
    /// The pages gpusnap writes itself (`restore.page_fill_min_bytes`), CRIU reading split
    /// images and leaving the tasks stopped.
    pub fill: Option<super::fill::Prepared>,
}

pub(super) fn run<'a>(
    mut validated: Validated<'a>,
    host: &'a dyn Host,
) -> Result<Bounded<'a>, BoundError> {
    let req = validated.req;
    let t = Instant::now();
    let mut global = req.runc.clone();
    let criu = crate::criu::prepare(
        &mut global,
        &req.config,
        validated.gpu.is_some(),
        &req.bundle,
        &req.scratch_dir,
        host,
    )?;
    let granted = CriuFlags::from_switch_names(&req.config.restore.criu_flags)
        .map_err(BoundError::GrantedFlags)?;
    let (cmd, pid_file, fill) = restore_command(
        req,
        &global,
        &granted,
        &validated.manifest,
        &validated.in_place,
    )?;
    let foreground = matches!(req.command, RestoreCommand::Given { detach: false, .. });
    if foreground && validated.gpu.is_some() {
        return Err(BoundError::ForegroundWithGpu);
    }
    end_phase(
        &validated.deadline,
        Phase::CriuPrepare,
        Changed::Nothing,
        &mut validated.timings,
        t,
    )?;

    // Last of the refusals: what the CRIU images give the restored processes, bounded by
    // the spec of the container being created (`privilege.rs`).
    let t = Instant::now();
    let spec = crate::privilege::read_spec(&req.bundle)?;
    validated
        .admitted
        .check_spec(&req.bundle, req.checkpoint_mount.as_ref())?;
    crate::privilege::check(&spec, &req.checkpoint_dir)?;
    end_phase(
        &validated.deadline,
        Phase::PrivilegeCheck,
        Changed::Nothing,
        &mut validated.timings,
        t,
    )?;

    Ok(Bounded {
        rootfs: crate::open_files::rootfs_of(&req.bundle, &spec),
        runc: Runc::new(global, &req.container_id, host),
        validated,
        criu,
        cmd,
        pid_file,
        foreground,
        fill,
    })
}

/// The `runc restore` command and the pid file (when built here).
fn restore_command(
    req: &RestoreRequest,
    global: &RuncGlobal,
    granted: &CriuFlags,
    manifest: &Manifest,
    in_place: &[Arc<InPlaceFile>],
) -> Result<(RuncCommand, Option<PathBuf>, Option<super::fill::Prepared>), BoundError> {
    match &req.command {
        RestoreCommand::Build {
            work_dir,
            pid_file,
            console_socket,
            no_pivot,
            terminal,
        } => {
            let missing = manifest.criu.not_granted_by(granted);
            if !missing.is_empty() {
                // CRIU refuses such images itself; say what the operator can do about it.
                tracing::warn!(
                    flags = %missing.join(","),
                    "the checkpoint was dumped with CRIU flags this node does not grant restores \
                     (restore.criu_flags); CRIU may refuse it"
                );
            }
            std::fs::create_dir_all(work_dir).map_err(|source| BoundError::WorkDir {
                path: work_dir.clone(),
                source,
            })?;
            let mut flags = granted.clone();
            flags.shell_job |= *terminal;
            let fill = prepare_fill(req, work_dir, global, in_place)?;
            let images = fill
                .as_ref()
                .map_or(req.checkpoint_dir.as_path(), |f| f.images.as_path());
            let r = Restore {
                work_dir: Some(work_dir.clone()),
                pid_file: Some(pid_file.clone()),
                console_socket: console_socket.clone(),
                no_pivot: *no_pivot,
                flags,
                ..Restore::new(images, &req.bundle)
            };
            let mut cmd = global
                .restore(&req.container_id, &r)
                .map_err(BoundError::Request)?;
            if let Some(env) = fill.as_ref().and_then(super::fill::Prepared::env) {
                cmd.env.push(env);
            }
            Ok((cmd, Some(pid_file.clone()), fill))
        }
        RestoreCommand::Given { .. } if !in_place.is_empty() => {
            Err(BoundError::InPlaceWithGivenCommand)
        }
        RestoreCommand::Given { args, .. } => {
            let mut cmd = global.helper(&[]);
            cmd.args = args.clone();
            Ok((cmd, None, None))
        }
    }
}

/// The split images when the node asks gpusnap to write large private memory itself
/// (`restore.page_fill_min_bytes`), and the page images read from the image's chunks
/// (`in_place`), which CRIU gets written out of verified pieces. Its CRIU config file replaces
/// the one runc's environment names (gpusnap's private plugin directory's, else the
/// caller's), keeping its options. A split that cannot be prepared leaves every page to CRIU
/// (nothing has run yet, and CRIU restores the checkpoint as it is) unless page images are
/// read from chunks: CRIU has no copy of those to read, and the restore is refused.
fn prepare_fill(
    req: &RestoreRequest,
    work_dir: &std::path::Path,
    global: &RuncGlobal,
    in_place: &[Arc<InPlaceFile>],
) -> Result<Option<super::fill::Prepared>, BoundError> {
    let min = req.config.restore.page_fill_min_bytes;
    if min == 0 && in_place.is_empty() {
        return Ok(None);
    }
    let base = global
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == super::fill::CRIU_CONFIG_ENV)
        .map(|(_, v)| PathBuf::from(v))
        .or_else(|| std::env::var_os(super::fill::CRIU_CONFIG_ENV).map(PathBuf::from));
    match super::fill::prepare(
        &req.checkpoint_dir,
        work_dir,
        min,
        base.as_deref(),
        in_place,
    ) {
        Ok(prepared) => {
            tracing::debug!(
                min_vma_bytes = min,
                bytes = prepared.as_ref().map_or(0, super::fill::Prepared::bytes),
                in_place_files = in_place.len(),
                "pages gpusnap writes itself"
            );
            Ok(prepared)
        }
        Err(e) if in_place.is_empty() => {
            tracing::warn!(error = %e, "CRIU restores every page instead");
            Ok(None)
        }
        Err(e) => Err(BoundError::InPlace(Box::new(e))),
    }
}
