//! Restore: `runc restore` (CRIU), watched by the deadline's watchdog, which kills runc and
//! CRIU when the deadline passes or CRIU dies mid-restore. The in-flight record says `runc`
//! while it runs and `restored` once the container runs.
//!
//! Rollback, after any failure of runc or CRIU: what CRIU restored is killed in the
//! container's cgroup, CRIU's yards are detached and removed, runc's state of the id is
//! removed (`leftovers.rs`); what could not be is named. Once runc has returned with a running
//! container whose init cannot be found, the container is killed.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Instant;

use gpusnap_checkpoint::Manifest;

use super::apply::Applied;
use super::{criu_finished, outcome_of, read_pid, runc_state_file, RestoreReport};
use crate::criu::PreparedCriu;
use crate::deadline::{Deadline, Phase};
use crate::error::{Error, Outcome};
use crate::gpu::GpuRestore;
use crate::host::{Runc, RuncFailure};
use crate::inflight::{RestorePhase, RestoreRecord};
use crate::leftovers::{self, Cleared};
use crate::lock::DirLock;
use crate::timings::Timings;
use crate::watchdog::{CriuEnd, Watchdog};

/// Why `runc restore` did not leave a running container, and what its rollback cleared.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// runc could not be started at all.
    #[error("cannot run {}: {source}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The deadline passed while CRIU was restoring: runc and CRIU were killed.
    #[error(
        "{ran_out}; CRIU was still restoring: runc, CRIU and {below} process(es) below them \
         were killed; {cleared}"
    )]
    Deadline {
        ran_out: String,
        below: usize,
        cleared: Box<Cleared>,
        runc_exit: Option<i32>,
    },
    /// CRIU died mid-restore: runc and what was below it were killed.
    #[error(
        "CRIU (pid {criu_pid}) {end} mid-restore, {secs:.1}s into the restore: runc and \
         {below} process(es) below it were killed; {cleared}{log}"
    )]
    CriuDied {
        criu_pid: u32,
        end: CriuEnd,
        secs: f64,
        below: usize,
        cleared: Box<Cleared>,
        /// The tail of CRIU's `restore.log`, on lines of its own.
        log: String,
        runc_exit: Option<i32>,
    },
    /// runc failed (CRIU's words in its log tail).
    #[error("{criu}{failure}\n{cleared}")]
    Runc {
        /// "CRIU (pid N) was killed by signal S mid-restore; " when runc noticed a dead CRIU.
        criu: String,
        #[source]
        failure: RuncFailure,
        cleared: Box<Cleared>,
    },
    /// runc returned, the container runs, and its init cannot be found: it was killed.
    #[error("runc restored the container but its init pid could not be read")]
    NoInitPid,
}

impl From<RunError> for Error {
    fn from(e: RunError) -> Error {
        let (outcome, runc_exit) = match &e {
            RunError::Spawn { .. } => (Outcome::NothingRunning, None),
            RunError::Deadline {
                cleared, runc_exit, ..
            }
            | RunError::CriuDied {
                cleared, runc_exit, ..
            } => (outcome_of(cleared), *runc_exit),
            RunError::Runc {
                cleared, failure, ..
            } => (outcome_of(cleared), failure.exit),
            RunError::NoInitPid => (Outcome::RestoredProcessesKilled, None),
        };
        Error::failed(outcome, e.to_string())
            .with_runc_exit(runc_exit)
            .caused_by(e)
    }
}

/// What `runc restore` left.
pub(super) enum Ran<'a> {
    /// A foreground runc ran the container to its end.
    Foreground(Box<RestoreReport>),
    /// The container runs; its GPU state (if any) is next.
    Detached(Box<Restored<'a>>),
}

/// A running container, not yet reported to the caller.
pub(super) struct Restored<'a> {
    pub req: &'a super::RestoreRequest,
    pub started: Instant,
    pub timings: Timings,
    /// Says `restored`: a killed front end's successor kills the container.
    pub record: RestoreRecord,
    pub deadline: Deadline,
    pub lock: DirLock,
    pub manifest: Manifest,
    pub gpu: Option<GpuRestore>,
    pub runc: Runc<'a>,
    pub init_pid: u32,
    pub criu: Option<PreparedCriu>,
    /// The pages gpusnap writes into the tasks CRIU left stopped.
    pub fill: Option<super::fill::Prepared>,
}

pub(super) fn run(applied: Applied<'_>) -> Result<Ran<'_>, RunError> {
    let Applied {
        req,
        started,
        mut timings,
        record,
        deadline,
        lock,
        manifest,
        gpu,
        runc,
        cmd,
        pid_file,
        foreground,
        criu_log,
        criu_work_dir,
        criu,
        fill,
    } = applied;
    // A runc state of this id whose init is dead (a restore or runtime killed before it could
    // clean up) would fail this restore with "container exists".
    leftovers::clear_dead_runc_state(&runc);
    crate::failpoint::reached(crate::failpoint::BEFORE_RESTORE);
    let t = Instant::now();
    let watch = Watchdog::start(deadline.at(), foreground.then(|| runc_state_file(&runc)));
    // Durable while runc restores: if this runtime is killed, whoever comes next kills the
    // orphaned runc and CRIU (`inflight.rs`). The front end's callback may only read what it
    // is given, so the record is lent to it for the call.
    let record = std::cell::RefCell::new(record);
    let status = runc.host().run_restore(cmd.to_command(), &|pid| {
        watch.started(pid);
        record.borrow_mut().runc_started(pid);
    });
    let mut record = record.into_inner();
    let watched = watch.finish();
    // CRIU has read the split images, if any.
    if let Some(f) = &fill {
        f.remove_files();
    }
    let status: ExitStatus = status.map_err(|source| RunError::Spawn {
        program: cmd.program.clone(),
        source,
    })?;
    let clear =
        |observed| leftovers::clear_failed_restore(&runc, &req.bundle, observed, &criu_work_dir);
    if watched.expired {
        let cleared = Box::new(clear(watched.cgroup));
        return Err(RunError::Deadline {
            ran_out: deadline.ran_out(Phase::CriuRestore),
            below: watched.killed.saturating_sub(1),
            cleared,
            runc_exit: status.code(),
        });
    }
    if let Some((criu_pid, end)) = watched.criu_died {
        let cleared = Box::new(clear(watched.cgroup));
        let log = gpusnap_criu_bridge::criu_log_tail(&criu_log, 5)
            .ok()
            .filter(|t| !t.is_empty())
            .map(|t| format!("\n{t}"))
            .unwrap_or_default();
        return Err(RunError::CriuDied {
            criu_pid,
            end,
            secs: deadline.elapsed().as_secs_f64(),
            below: watched.killed.saturating_sub(1),
            cleared,
            log,
            runc_exit: status.code(),
        });
    }
    // A foreground runc returns when the container ends; its status is a failed restore's only
    // while CRIU had not finished.
    let restore_failed =
        !status.success() && !(foreground && (watched.restored || criu_finished(&criu_log)));
    if restore_failed {
        let failure = runc.failure("restore", status, b"", Some(&criu_log));
        let cleared = Box::new(clear(watched.cgroup));
        // runc notices a dead CRIU by itself when nothing else holds CRIU's socket.
        let criu = watched
            .criu_ended
            .filter(|(_, end)| matches!(end, CriuEnd::Signal(_)))
            .map(|(pid, end)| format!("CRIU (pid {pid}) {end} mid-restore; "))
            .unwrap_or_default();
        return Err(RunError::Runc {
            criu,
            failure,
            cleared,
        });
    }
    if foreground {
        // runc ran the container to its end; its status is the container's.
        return Ok(Ran::Foreground(Box::new(RestoreReport {
            init_pid: 0,
            foreground_exit: Some(status),
            manifest,
            cuda_processes: 0,
            elapsed: started.elapsed(),
        })));
    }
    timings.add(Phase::CriuRestore.name(), t.elapsed());
    // The container runs; until this transaction returns, its caller does not know.
    record.phase(RestorePhase::Restored);
    crate::failpoint::reached(crate::failpoint::AFTER_CRIU);
    let Some(init_pid) = (match &pid_file {
        Some(p) => read_pid(p),
        None => runc.state().map(|(pid, _)| pid),
    }) else {
        let _ = runc.kill_all();
        return Err(RunError::NoInitPid);
    };
    Ok(Ran::Detached(Box::new(Restored {
        req,
        started,
        timings,
        record,
        deadline,
        lock,
        manifest,
        gpu,
        runc,
        init_pid,
        criu,
        fill,
    })))
}
