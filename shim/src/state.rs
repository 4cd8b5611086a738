//! The state of a container's init process, as one type with every transition in one place.
//!
//! ```text
//!                 Start                  Pause             Checkpoint
//!   Created ───────────────► Running ◄─────────► Paused ◄──────────────┐
//!                              ▲  │    Resume       │                   │
//!   CreatedFromCheckpoint      │  └──Checkpoint──┐  └──Checkpoint──┐    │
//!        │ Start               │                 ▼                 ▼    │
//!        ▼                     │            Checkpointing { frozen }────┘
//!   Restoring ─────────────────┘                 │ (back where it came from)
//!                                                ▼ exit event
//!   (any live state) ── exit ──► Stopped
//! ```
//!
//! A second checkpoint or restore of a container already in one is refused here, before
//! anything runs, and the state containerd reads (State RPC) is derived from this type, so it
//! always matches what the shim did to the cgroup.

use containerd_shim::protos::types::task::Status;
use gpusnap_transaction::PendingCudaResume;

use crate::errors::{failed_precondition, Error};

/// What Create recorded for a task that Start must restore from a checkpoint.
#[derive(Debug, Clone)]
pub struct PendingRestore {
    pub image: std::path::PathBuf,
    /// containerd's parent checkpoint (pre-dump chains); runc restores from `image`, which
    /// references its parent itself, so this is only logged.
    pub parent: Option<std::path::PathBuf>,
    /// Writable-layer changes to apply to the rootfs before CRIU runs (a pod restoring from a
    /// CRI checkpoint archive; containerd applies it itself on its own restore paths).
    pub rootfs_diff: Option<gpusnap_transaction::RootfsDiff>,
    /// What the door knows of the checkpoint's signature (the origin record of a pull); the
    /// restore transaction decides the node's policy on it.
    pub signature_evidence: gpusnap_transaction::SignatureEvidence,
    /// A checkpoint image mounted as an image volume (`restore_source::by_volume`): Start makes the
    /// node's copy of it and restores from that; `image` is then the volume's mount.
    /// Boxed: most restores have none, and the state carries this until Start.
    pub volume: Option<Box<gpusnap_transaction::volume::VolumeSource>>,
}

#[derive(Debug)]
pub enum InitState {
    /// `runc create` ran; Start runs `runc start`.
    Created,
    /// Created from a checkpoint; Start restores it.
    CreatedFromCheckpoint(PendingRestore),
    /// Start is restoring the checkpoint.
    Restoring,
    Running,
    /// Frozen. `pending_cuda`: a checkpoint of the frozen task left its CUDA processes
    /// checkpointed; they are restored and unlocked on Resume.
    Paused {
        pending_cuda: Option<PendingCudaResume>,
    },
    /// A checkpoint is running; `frozen` is whether the caller had paused the task.
    Checkpointing {
        frozen: bool,
    },
    Stopped,
}

/// What Start has to do.
pub enum StartKind {
    Start,
    Restore(PendingRestore),
}

/// What a checkpoint starts from.
pub struct CheckpointTicket {
    pub frozen: bool,
    /// A previous checkpoint of the frozen task left CUDA processes checkpointed: they must be
    /// resumed (thawed) before a new checkpoint can lock them.
    pub pending_cuda: Option<PendingCudaResume>,
}

impl InitState {
    /// The status containerd sees. A checkpoint in progress shows what the task was before it
    /// (and is, once the checkpoint ends).
    pub fn status(&self) -> Status {
        match self {
            InitState::Created | InitState::CreatedFromCheckpoint(_) | InitState::Restoring => {
                Status::CREATED
            }
            InitState::Running | InitState::Checkpointing { frozen: false } => Status::RUNNING,
            InitState::Paused { .. } | InitState::Checkpointing { frozen: true } => Status::PAUSED,
            InitState::Stopped => Status::STOPPED,
        }
    }

    /// Whether the init process exists and has not exited.
    pub fn is_alive(&self) -> bool {
        matches!(
            self,
            InitState::Running | InitState::Paused { .. } | InitState::Checkpointing { .. }
        )
    }

    /// Whether runc knows the container (runc create or restore ran).
    pub fn has_runc_container(&self) -> bool {
        !matches!(
            self,
            InitState::CreatedFromCheckpoint(_) | InitState::Restoring
        )
    }

    fn describe(&self) -> &'static str {
        match self {
            InitState::Created => "created",
            InitState::CreatedFromCheckpoint(_) => "waiting to be restored",
            InitState::Restoring => "being restored",
            InitState::Running => "running",
            InitState::Paused { .. } => "paused",
            InitState::Checkpointing { .. } => "being checkpointed",
            InitState::Stopped => "stopped",
        }
    }

    fn refuse(&self, id: &str, what: &str) -> Error {
        failed_precondition(format!(
            "container {id} cannot be {what}: it is {}",
            self.describe()
        ))
    }

    /// Created → (Start); CreatedFromCheckpoint → Restoring.
    pub fn start(&mut self, id: &str) -> Result<StartKind, Error> {
        match std::mem::replace(self, InitState::Restoring) {
            InitState::Created => {
                *self = InitState::Created;
                Ok(StartKind::Start)
            }
            InitState::CreatedFromCheckpoint(p) => Ok(StartKind::Restore(p)),
            other => {
                *self = other;
                Err(self.refuse(id, "started"))
            }
        }
    }

    /// Start succeeded: Created | Restoring → Running. A task that exited in between stays
    /// Stopped.
    pub fn started(&mut self) {
        if matches!(self, InitState::Created | InitState::Restoring) {
            *self = InitState::Running;
        }
    }

    /// A restore failed (nothing of it runs): the task is created from the checkpoint again,
    /// as containerd-shim-runc-v2 leaves it, to be deleted or started once more.
    pub fn restore_failed(&mut self, pending: PendingRestore) {
        if matches!(self, InitState::Restoring) {
            *self = InitState::CreatedFromCheckpoint(pending);
        }
    }

    /// Running → Paused.
    pub fn pause(&mut self, id: &str) -> Result<(), Error> {
        match self {
            InitState::Running => {
                *self = InitState::Paused { pending_cuda: None };
                Ok(())
            }
            _ => Err(self.refuse(id, "paused")),
        }
    }

    /// Checks that Resume is possible (before runc runs).
    pub fn check_resume(&self, id: &str) -> Result<(), Error> {
        match self {
            InitState::Paused { .. } => Ok(()),
            _ => Err(self.refuse(id, "resumed")),
        }
    }

    /// Paused → Running, handing over CUDA processes a checkpoint left checkpointed.
    pub fn resumed(&mut self) -> Option<PendingCudaResume> {
        match std::mem::replace(self, InitState::Running) {
            InitState::Paused { pending_cuda } => pending_cuda,
            other => {
                *self = other;
                None
            }
        }
    }

    /// Running | Paused → Checkpointing. A checkpoint or restore already in progress, or a
    /// task that does not run, is refused.
    pub fn begin_checkpoint(&mut self, id: &str) -> Result<CheckpointTicket, Error> {
        match std::mem::replace(self, InitState::Stopped) {
            InitState::Running => {
                *self = InitState::Checkpointing { frozen: false };
                Ok(CheckpointTicket {
                    frozen: false,
                    pending_cuda: None,
                })
            }
            InitState::Paused { pending_cuda } => {
                *self = InitState::Checkpointing { frozen: true };
                Ok(CheckpointTicket {
                    frozen: true,
                    pending_cuda,
                })
            }
            other => {
                *self = other;
                Err(match self {
                    InitState::Checkpointing { .. } | InitState::Restoring => {
                        failed_precondition(format!(
                            "container {id} is {}: one checkpoint or restore at a time; nothing \
                             was done, try again when it has finished",
                            self.describe()
                        ))
                    }
                    _ => failed_precondition(format!(
                        "container {id} cannot be checkpointed: it is {}; only a running or \
                         paused task can be (start or restore it first)",
                        self.describe()
                    )),
                })
            }
        }
    }

    /// The checkpoint ended: back to Running or Paused as it was (with the CUDA processes a
    /// checkpoint of a frozen task left checkpointed). An exit during the checkpoint wins.
    pub fn end_checkpoint(&mut self, pending_cuda: Option<PendingCudaResume>) {
        if let InitState::Checkpointing { frozen } = self {
            *self = if *frozen {
                InitState::Paused { pending_cuda }
            } else {
                InitState::Running
            };
        }
    }

    /// The checkpoint failed: back to Running or Paused as the cgroup is now (`frozen_now`),
    /// which is what containerd must see; the transaction put it back as the caller had it
    /// where it could. An exit during the checkpoint wins.
    pub fn checkpoint_failed(&mut self, frozen_now: bool) {
        if let InitState::Checkpointing { .. } = self {
            *self = if frozen_now {
                InitState::Paused { pending_cuda: None }
            } else {
                InitState::Running
            };
        }
    }

    /// Running or Paused as the cgroup really is (`frozen_now`), when something other than
    /// this shim froze or thawed it (a runtime or CRIU killed mid-checkpoint). Processes a
    /// checkpoint left checkpointed keep the state Paused: Resume brings them back.
    pub fn reconcile(&mut self, frozen_now: bool) {
        match self {
            InitState::Running if frozen_now => *self = InitState::Paused { pending_cuda: None },
            InitState::Paused { pending_cuda: None } if !frozen_now => *self = InitState::Running,
            _ => {}
        }
    }

    /// The init exited.
    pub fn exited(&mut self) {
        *self = InitState::Stopped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_task_starts_and_runs() {
        let mut s = InitState::Created;
        assert!(matches!(s.start("c"), Ok(StartKind::Start)));
        s.started();
        assert_eq!(s.status(), Status::RUNNING);
        assert!(s.start("c").is_err(), "started twice");
    }

    #[test]
    fn checkpointed_task_restores_once() {
        let mut s = InitState::CreatedFromCheckpoint(PendingRestore {
            image: "/cp".into(),
            parent: None,
            rootfs_diff: None,
            signature_evidence: Default::default(),
            volume: None,
        });
        assert_eq!(s.status(), Status::CREATED);
        assert!(!s.has_runc_container());
        assert!(matches!(s.start("c"), Ok(StartKind::Restore(_))));
        let err = s.start("c").err().unwrap().to_string();
        assert!(err.contains("being restored"), "{err}");
        assert!(
            s.begin_checkpoint("c").is_err(),
            "no checkpoint while restoring"
        );
        s.restore_failed(PendingRestore {
            image: "/cp".into(),
            parent: None,
            rootfs_diff: None,
            signature_evidence: Default::default(),
            volume: None,
        });
        assert_eq!(s.status(), Status::CREATED);
        assert!(!s.has_runc_container());
    }

    #[test]
    fn one_checkpoint_at_a_time_and_the_status_matches_the_cgroup() {
        let mut s = InitState::Running;
        let t = s.begin_checkpoint("c").unwrap();
        assert!(!t.frozen);
        assert_eq!(s.status(), Status::RUNNING);
        let err = s.begin_checkpoint("c").err().unwrap().to_string();
        assert!(err.contains("one checkpoint or restore at a time"), "{err}");
        assert!(s.pause("c").is_err(), "no pause during a checkpoint");
        s.end_checkpoint(None);
        assert_eq!(s.status(), Status::RUNNING);

        s.pause("c").unwrap();
        let t = s.begin_checkpoint("c").unwrap();
        assert!(t.frozen);
        assert_eq!(s.status(), Status::PAUSED);
        s.end_checkpoint(None);
        assert_eq!(s.status(), Status::PAUSED);
        s.check_resume("c").unwrap();
        assert!(s.resumed().is_none());
        assert_eq!(s.status(), Status::RUNNING);
    }

    #[test]
    fn a_failed_checkpoint_reports_the_cgroup() {
        // The caller paused, CRIU was killed and thawed the cgroup: containerd sees RUNNING,
        // so its Resume is refused as "not paused" and a later Pause works.
        let mut s = InitState::Paused { pending_cuda: None };
        s.begin_checkpoint("c").unwrap();
        s.checkpoint_failed(false);
        assert_eq!(s.status(), Status::RUNNING);
        s.pause("c").unwrap();
        s.reconcile(false);
        assert_eq!(s.status(), Status::RUNNING, "thawed behind the shim's back");
        s.reconcile(true);
        assert_eq!(s.status(), Status::PAUSED);
        let mut s = InitState::Running;
        s.begin_checkpoint("c").unwrap();
        s.checkpoint_failed(true);
        assert_eq!(s.status(), Status::PAUSED);
    }

    #[test]
    fn exit_during_a_checkpoint_wins() {
        let mut s = InitState::Running;
        s.begin_checkpoint("c").unwrap();
        s.exited();
        s.end_checkpoint(None);
        assert_eq!(s.status(), Status::STOPPED);
        assert!(s.begin_checkpoint("c").is_err());
        assert!(s.check_resume("c").is_err());
    }
}
