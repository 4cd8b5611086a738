//! Apply: the first change. The rootfs diff (a CRI checkpoint's writable layer, restored by
//! pod annotation) is written into the container's root filesystem; then the writable layer
//! is checked against the signed one, and the files the checkpoint's processes hold open are
//! found in the root filesystem as they were dumped (CRIU reopens each by its path and fails
//! mid-restore on one that is missing).
//!
//! Rollback: none is possible for what of the diff was written — it stays in the container's
//! root filesystem, which goes with the container. So a failure after the first write is not a
//! refusal: it is a failure whose outcome is that nothing runs, and its message says the diff
//! stays (as the deadline's does).

use std::path::PathBuf;
use std::time::Instant;

use gpusnap_checkpoint::{self as dir, rootfs_diff::DiffError, Manifest};
use gpusnap_criu_bridge::RuncCommand;

use super::bound::Bounded;
use super::end_phase;
use crate::criu::PreparedCriu;
use crate::deadline::{Changed, Deadline, Phase};
use crate::error::{Error, Outcome};
use crate::gpu::GpuRestore;
use crate::host::Runc;
use crate::inflight::RestoreRecord;
use crate::lock::DirLock;
use crate::timings::Timings;

pub use crate::open_files::OpenFilesError;

/// What a failure after the diff was (partly) written adds to its message.
const DIFF_STAYS: &str =
    "the rootfs diff applied so far stays in the container's root filesystem, which goes with \
     the container";

/// Why the restore stopped before runc ran, and whether the rootfs diff had been written.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The rootfs diff was refused or failed part way.
    #[error("rootfs diff: {source}{}", setting_of(source))]
    Diff {
        #[source]
        source: DiffError,
        changed: Changed,
    },
    /// The checkpoint's open files are not in the root filesystem as they were dumped.
    #[error("{source}")]
    OpenFiles {
        #[source]
        source: OpenFilesError,
        changed: Changed,
    },
    /// A check that classifies its own error (the writable layer, the deadline), and what was
    /// written before it.
    #[error("{source}")]
    Check { source: Error, changed: Changed },
}

/// The node setting behind a refusal by count, and what to do about it.
fn setting_of(e: &DiffError) -> &'static str {
    match e {
        DiffError::TooManyEntries { .. } => {
            " (restore.max_rootfs_diff_entries: raise it in the node's gpusnap config to restore \
             a diff this large, and the restore's deadline with it)"
        }
        _ => "",
    }
}

impl From<ApplyError> for Error {
    fn from(e: ApplyError) -> Error {
        match e {
            ApplyError::Check {
                source,
                changed: Changed::RootfsDiff,
            } => failure_after_diff(source),
            ApplyError::Check { source, .. } => source,
            ApplyError::Diff {
                changed: Changed::Nothing,
                ..
            }
            | ApplyError::OpenFiles {
                changed: Changed::Nothing,
                ..
            } => Error::precondition(e.to_string()).caused_by(e),
            e => Error::failed(Outcome::NothingRunning, format!("{e}; {DIFF_STAYS}")).caused_by(e),
        }
    }
}

/// A check that refused by its own words after the rootfs diff was written: a failure,
/// honestly (one that failed already says what it left).
fn failure_after_diff(e: Error) -> Error {
    match e {
        Error::Refused {
            message, source, ..
        } => Error::Failed {
            outcome: Outcome::NothingRunning,
            message: format!("{message}; {DIFF_STAYS}"),
            runc_exit: None,
            source,
        },
        failed => failed,
    }
}

/// Everything `runc restore` and what follows it need. Built by [`run`]; tests build it
/// directly to drive the later phases.
pub(super) struct Applied<'a> {
    pub req: &'a super::RestoreRequest,
    pub started: Instant,
    pub timings: Timings,
    pub record: RestoreRecord,
    pub deadline: Deadline,
    /// Held (shared) until the restore returns.
    pub lock: DirLock,
    pub manifest: Manifest,
    pub gpu: Option<GpuRestore>,
    pub runc: Runc<'a>,
    pub cmd: RuncCommand,
    pub pid_file: Option<PathBuf>,
    pub foreground: bool,
    pub criu_log: PathBuf,
    pub criu_work_dir: PathBuf,
    /// Kept until runc has returned (`None` only where a test runs no CRIU).
    pub criu: Option<PreparedCriu>,
    pub fill: Option<super::fill::Prepared>,
}

pub(super) fn run(bounded: Bounded<'_>) -> Result<Applied<'_>, ApplyError> {
    let Bounded {
        mut validated,
        runc,
        criu,
        cmd,
        pid_file,
        foreground,
        rootfs,
        fill,
    } = bounded;
    let req = validated.req;
    let deadline = &validated.deadline;
    let changed = if req.rootfs_diff.is_some() {
        Changed::RootfsDiff
    } else {
        Changed::Nothing
    };
    if let Some(diff) = &req.rootfs_diff {
        let t = Instant::now();
        // The walk and the writes stop when the restore's deadline passes, so a diff built to
        // be slow cannot hold the restore past it.
        let applied = dir::rootfs_diff::apply(
            &diff.path,
            &rootfs,
            dir::rootfs_diff::Limits {
                max_bytes: diff
                    .content_bytes
                    .map_or(req.config.restore.max_rootfs_diff_bytes, |recorded| {
                        recorded.min(req.config.restore.max_rootfs_diff_bytes)
                    }),
                // The decompressed stream, headers and padding included: a small gzip file
                // that inflates past the setting is refused as it is read.
                max_inflated_bytes: req.config.restore.max_rootfs_diff_bytes,
                max_entries: req.config.restore.max_rootfs_diff_entries,
                deadline: Some(deadline.at()),
            },
        )
        .map_err(|source| {
            let changed = if source.nothing_applied() {
                Changed::Nothing
            } else {
                Changed::RootfsDiff
            };
            if let DiffError::Deadline { .. } = source {
                // The same words as every other phase's deadline, saying what was written.
                if let Err(ran_out) = deadline.check(Phase::RootfsDiff, changed) {
                    return ApplyError::Check {
                        source: ran_out,
                        changed,
                    };
                }
            }
            ApplyError::Diff { source, changed }
        })?;
        tracing::debug!(
            entries = applied.entries,
            bytes = applied.bytes,
            privileges_dropped = applied.privileges_dropped,
            "rootfs diff applied"
        );
        end_phase(
            deadline,
            Phase::RootfsDiff,
            Changed::RootfsDiff,
            &mut validated.timings,
            t,
        )
        .map_err(|source| ApplyError::Check { source, changed })?;
    }

    // The writable layer as the runtime or the diff left it, compared with the signed one.
    let t = Instant::now();
    validated
        .admitted
        .check_layer(
            &rootfs,
            req.rootfs_diff.as_ref().map(|d| d.path.as_path()),
            deadline,
            changed,
        )
        .map_err(|source| ApplyError::Check { source, changed })?;
    end_phase(
        deadline,
        Phase::LayerCheck,
        changed,
        &mut validated.timings,
        t,
    )
    .map_err(|source| ApplyError::Check { source, changed })?;

    // After the diff, which may bring them: CRIU reopens every open file by its path and
    // fails mid-restore on one the rootfs lacks (`open_files.rs`).
    let t = Instant::now();
    crate::open_files::check(&rootfs, &req.checkpoint_dir)
        .map_err(|source| ApplyError::OpenFiles { source, changed })?;
    end_phase(
        deadline,
        Phase::OpenFilesCheck,
        changed,
        &mut validated.timings,
        t,
    )
    .map_err(|source| ApplyError::Check { source, changed })?;

    Ok(Applied {
        req,
        started: validated.started,
        timings: validated.timings,
        record: validated.record,
        deadline: validated.deadline,
        lock: validated.lock,
        manifest: validated.manifest,
        gpu: validated.gpu,
        runc,
        cmd,
        pid_file,
        foreground,
        criu_log: validated.criu_log,
        criu_work_dir: validated.criu_work_dir,
        criu: Some(criu),
        fill,
    })
}
