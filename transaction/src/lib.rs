//! The checkpoint and restore transactions every gpusnap front end calls.
//!
//! [`checkpoint()`] and [`restore()`] hold the whole sequence: the GPU plan and compatibility
//! gate, CRIU through runc (without CRIU's own cuda plugin), the storage engine, sealing and
//! validating the manifest, rollback, and the outcome of a failure. Front ends — the containerd
//! shim, gpusnap-runc, and anything later — only convert their request into a
//! [`CheckpointRequest`] or [`RestoreRequest`], supply a [`Host`] (how they run programs),
//! and map the one [`Error`] onto their protocol, once.
//!
//! Nothing here knows ttrpc, protobuf or runc's command-line syntax.

pub mod bundle_spec;
pub mod cgroup;
pub mod checkpoint;
pub mod container_config;
mod container_record;
pub mod criu;
pub mod criu_remains;
pub mod deadline;
pub mod error;
pub mod failpoint;
pub mod gpu;
pub mod host;
pub mod inflight;
pub mod leftovers;
pub mod lock;
mod open_files;
pub mod pending_resume;
mod privilege;
pub mod repair;
pub mod restore;
pub mod restore_source;
mod sealed_here;
pub mod signature;
#[cfg(test)]
mod testing;
mod timings;
pub mod volume;
pub mod watchdog;

pub use checkpoint::{checkpoint, checkpoint_resuming, CheckpointReport, CheckpointRequest};
pub use error::{Error, Outcome, Refusal, Result};
pub use gpu::{GpuRestoreError, PendingCudaResume, ResumeError, UnknownEngine};
pub use host::{Direct, Host, RunTool};
pub use pending_resume::PendingError;
pub use restore::{restore, RestoreCommand, RestoreReport, RestoreRequest, RootfsDiff};
pub use restore_source::{RestoreSource, RestoreSourceError};
pub use signature::SignatureEvidence;
