//! gpusnap's bridge to runc and CRIU.
//!
//! - [`options`]: plain checkpoint/restore options (the shim converts containerd's protos).
//! - [`runc_cmd`]: `runc checkpoint` / `runc restore` command lines and a synchronous runner.
//! - [`criu_probe`]: finding CRIU on runc's `PATH` and checking its version.
//! - [`criu_log`]: the useful lines of CRIU's `dump.log` / `restore.log`.
//! - [`layout`], [`manifest`], [`inventory`]: gpusnap's files inside a checkpoint directory,
//!   the manifest that marks a checkpoint complete, and the file digests it carries.
//! - [`validate`]: refusing to restore an incomplete, foreign or damaged checkpoint before any
//!   CRIU work. [`scrub`]: cleaning up after a failed checkpoint.
//! - [`versions`]: runc version, kernel release, architecture.
//!
//! A checkpoint, from the shim's point of view:
//!
//! ```text
//! begin_checkpoint(dir)                       // scrub leftovers, create dir
//! checkpoint_command(..) + run (or run_checkpoint)
//!   on failure: scrub_incomplete(dir)
//! seal_checkpoint(dir, manifest)              // hash, then write manifest last
//! ```
//!
//! and a restore: `validate_for_restore(dir)` first, then `restore_command(..)`.

mod exec;

pub mod criu_log;
pub mod criu_probe;
pub mod image;
pub mod inventory;
pub mod layout;
pub mod manifest;
pub mod options;
pub mod runc_cmd;
pub mod scrub;
pub mod validate;
pub mod versions;

pub use criu_log::{criu_log_tail, LogTail, DUMP_LOG, RESTORE_LOG};
pub use criu_probe::{
    criu_check, find_in_path, probe_criu, probe_criu_cached, CriuCheck, CriuInfo, CriuVersion,
    ProbeError, MIN_CRIU_CPU, MIN_CRIU_GPU,
};
pub use inventory::{FileRecord, ImageInventory, InventoryError};
pub use layout::CheckpointLayout;
pub use manifest::{
    seal_checkpoint, write_manifest_atomically, GpuProcessRecord, GpuSection, HostRecord, Manifest,
    ManifestError, PhaseTiming, ProcessRecord, MANIFEST_FORMAT_VERSION, MANIFEST_KIND,
};
pub use options::{CgroupsMode, CheckpointOptions, OptionsError, RestoreOptions};
pub use runc_cmd::{
    checkpoint_command, restore_command, run_captured, run_checkpoint, RunOutput, RuncCommand,
    RuncError, RuncGlobal,
};
pub use scrub::{begin_checkpoint, scrub_incomplete, ScrubError, ScrubReport};
pub use validate::{
    read_manifest, validate_for_restore, validate_for_restore_with, RestoreRefusal, ValidateOptions,
};
pub use versions::{host_arch, kernel_release, runc_version, RuncVersion, VersionError};
