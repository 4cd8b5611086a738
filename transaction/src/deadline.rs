//! One deadline for a whole restore, from the moment the transaction starts to a running
//! container: copying an image volume's checkpoint onto the node (`volume.rs`, where the
//! deadline starts for that door), assembling a chunked image, verifying every file, the GPU gate, CRIU's
//! preparation and the privilege check, the rootfs diff (checked as it is walked and applied),
//! the writable layer's comparison with a signed record (stopped mid-walk), the open-files
//! check and `runc restore` itself (enforced by the watchdog, which kills runc
//! and CRIU). A hostile or oversized checkpoint cannot hold a front end (and the containerd or
//! CRI-O call behind it) in any phase longer than the node allows.
//!
//! The limit is `restore.deadline_seconds`, or, when it is 0, derived from how much the
//! restore reads ([`gpusnap_config::RestoreConfig::deadline`]): first from what the manifest
//! claims (untrusted, only ever a larger bound, capped at a day), then, once every file is
//! verified, from the verified sizes. The CUDA restore after CRIU has its own budget
//! (`cuda.restore_budget_seconds`), enforced by the CUDA orchestrator.

use std::fmt;
use std::time::{Duration, Instant};

use gpusnap_config::RestoreConfig;

use crate::error::{Error, Outcome, Result};

/// A phase of the restore, as deadline refusals and timings name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// An image volume's checkpoint copied onto the node (its chunked files assembled).
    VolumeCopy,
    /// A chunked image's files assembled from their chunks.
    Assemble,
    /// The signature policy, the manifest and every file's digest.
    Validate,
    /// The GPU compatibility gate (the driver loaded).
    GpuGate,
    /// CRIU found and its configuration checked.
    CriuPrepare,
    /// The CRIU images bounded by the container's spec.
    PrivilegeCheck,
    /// The rootfs diff checked and applied.
    RootfsDiff,
    /// The writable layer compared with the signed record (signed checkpoints only).
    LayerCheck,
    /// The open files found in the rootfs.
    OpenFilesCheck,
    /// `runc restore` (CRIU).
    CriuRestore,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::VolumeCopy => "volume-copy",
            Phase::Assemble => "assemble",
            Phase::Validate => "validate",
            Phase::GpuGate => "gpu-gate",
            Phase::CriuPrepare => "criu-prepare",
            Phase::PrivilegeCheck => "privilege-check",
            Phase::RootfsDiff => "rootfs-diff",
            Phase::LayerCheck => "layer-check",
            Phase::OpenFilesCheck => "open-files-check",
            Phase::CriuRestore => "criu-restore",
        }
    }
}

/// What the restore has changed by the end of a phase: the rootfs diff is the only change
/// before runc runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    Nothing,
    /// (Some of) the rootfs diff was written into the container's root filesystem.
    RootfsDiff,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a limit came from, for the refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `restore.deadline_seconds`.
    Configured,
    /// Derived from the manifest's claim (before verification).
    Claimed,
    /// Derived from the verified images.
    Verified,
}

/// The deadline of one restore.
#[derive(Debug, Clone)]
pub struct Deadline {
    started: Instant,
    limit: Duration,
    source: Source,
}

impl Deadline {
    /// Starts the deadline now, with what the checkpoint claims it holds (the manifest read
    /// before verification; 0 when it cannot be read).
    pub fn start(config: &RestoreConfig, claimed_bytes: u64) -> Deadline {
        Deadline::start_at(Instant::now(), config, claimed_bytes)
    }

    /// The deadline of a restore that began at `started`, before the transaction (the copy of
    /// an image volume's checkpoint): one limit over that and every phase after it.
    pub fn start_at(started: Instant, config: &RestoreConfig, claimed_bytes: u64) -> Deadline {
        Deadline {
            started,
            limit: config.deadline(claimed_bytes),
            source: if config.deadline_seconds > 0 {
                Source::Configured
            } else {
                Source::Claimed
            },
        }
    }

    /// Derives the limit again from what was verified (`bytes` the restore reads: the images,
    /// and the rootfs diff), keeping the start. A configured limit stays as it is.
    pub fn settle(&mut self, config: &RestoreConfig, bytes: u64) {
        if self.source != Source::Configured {
            self.limit = config.deadline(bytes);
            self.source = Source::Verified;
        }
    }

    /// The instant the restore must be done by.
    pub fn at(&self) -> Instant {
        self.started + self.limit
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// What is left (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.at().saturating_duration_since(Instant::now())
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.at()
    }

    /// Ends the restore when the deadline passed during `phase` (checked as the phase ends):
    /// a refusal before anything changed, a failure that says what was left after.
    pub fn check(&self, phase: Phase, changed: Changed) -> Result<()> {
        if !self.passed() {
            return Ok(());
        }
        let message = self.ran_out(phase);
        Err(if changed == Changed::RootfsDiff {
            Error::failed(
                Outcome::NothingRunning,
                format!(
                    "{message}; the rootfs diff applied so far stays in the container's root \
                     filesystem, which goes with the container"
                ),
            )
        } else {
            Error::precondition(format!("{message}; nothing was changed"))
        })
    }

    /// "the restore ran out of time in PHASE ...", with where the limit came from and what to
    /// do (a loaded node is a common cause, so the wording invites a retry).
    pub fn ran_out(&self, phase: Phase) -> String {
        let source = match self.source {
            Source::Configured => "restore.deadline_seconds".to_string(),
            Source::Claimed | Source::Verified => {
                "derived from what the restore reads, as restore.deadline_seconds = 0 asks"
                    .to_string()
            }
        };
        format!(
            "the restore did not finish within {}s ({source}): it ran out of time in the {phase} \
             phase, {:.1}s after it started. A loaded node can cause this: try again, or raise \
             restore.deadline_seconds",
            self.limit.as_secs(),
            self.elapsed().as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_deadline_names_its_phase_and_what_was_changed() {
        let config = RestoreConfig {
            deadline_seconds: 3,
            ..Default::default()
        };
        let d = Deadline::start_at(Instant::now() - Duration::from_secs(4), &config, 0);
        assert!(d.passed() && d.remaining() == Duration::ZERO);
        let e = d.check(Phase::Validate, Changed::Nothing).unwrap_err();
        assert!(e.outcome().is_none(), "a refusal: {e}");
        let text = e.to_string();
        assert!(text.contains("within 3s"), "{text}");
        assert!(text.contains("in the validate phase"), "{text}");
        assert!(text.contains("try again"), "{text}");
        let e = d
            .check(Phase::OpenFilesCheck, Changed::RootfsDiff)
            .unwrap_err();
        assert_eq!(e.outcome(), Some(Outcome::NothingRunning), "{e}");
        let fresh = Deadline::start(&config, 0);
        fresh.check(Phase::CriuRestore, Changed::Nothing).unwrap();
    }

    #[test]
    fn a_derived_limit_follows_the_verified_size() {
        let config = RestoreConfig::default();
        let mut d = Deadline::start(&config, 1 << 40);
        assert_eq!(d.limit(), config.deadline(1 << 40));
        d.settle(&config, 64 << 20);
        assert_eq!(d.limit(), config.deadline(64 << 20));
        let configured = RestoreConfig {
            deadline_seconds: 7,
            ..Default::default()
        };
        let mut d = Deadline::start(&configured, 0);
        d.settle(&configured, 1 << 40);
        assert_eq!(d.limit(), Duration::from_secs(7));
    }
}
