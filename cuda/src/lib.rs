//! GPU side of gpusnap: the CUDA driver's process-checkpoint API, finding the
//! CUDA processes of a container, and sequencing lock → checkpoint → CRIU dump
//! → restore → unlock with rollback.
//!
//! - [`driver`]: a thin binding loaded at run time (`libcuda.so.1` by default).
//! - [`discovery`]: which pids of a container the driver treats as CUDA processes.
//! - [`orchestrate`]: the checkpoint and restore sequences the shim and the
//!   runc wrapper call, with watchdogs, rollback and serialisable records.
//! - [`engine`]: where device memory goes ([`engine::DriverManaged`], or
//!   [`posix::Posix`]: CUDA 13.4 CustomStorage into extent files).
//!
//! Tests drive all of it against the fake driver in `cuda/fake-libcuda`, loaded
//! through the same path as the real one.

pub mod discovery;
pub mod driver;
pub mod engine;
pub mod engines;
pub mod orchestrate;
pub mod posix;
mod watchdog;

pub use driver::{
    Capabilities, Driver, DriverConfig, GpuUuid, LoadError, PendingDriver, ProcessState,
    ResolveError,
};
pub use orchestrate::{OrchestrateError, Orchestrator, OrchestratorOptions, Outcome};
