//! gpusnap's bridge to runc and CRIU.
//!
//! - [`options`]: the CRIU flags of a checkpoint or restore ([`CriuFlags`]), in one place.
//! - [`runc_cmd`]: `runc checkpoint` / `runc restore` command lines and a synchronous runner.
//! - [`runc_error`]: what a failed runc command's message means (no such container, ...): the
//!   one place runc's wording is matched.
//! - [`criu_probe`]: finding CRIU on runc's `PATH` and checking its version.
//! - [`criu_log`]: the useful lines of CRIU's `dump.log` / `restore.log`, and the yards a
//!   killed restore's CRIU left.
//! - [`criu_config`]: CRIU's config files, held to what gpusnap's model of a restore allows.
//! - [`plugins`]: keeping CRIU's own cuda plugin out of the CRIU runs gpusnap starts.
//! - [`versions`]: runc version, kernel release, architecture.

mod exec;

pub mod criu_config;
pub mod criu_log;
pub mod criu_probe;
pub mod options;
pub mod plugins;
pub mod runc_cmd;
pub mod runc_error;
pub mod versions;

pub use criu_log::{criu_log_tail, LogTail, DUMP_LOG, RESTORE_LOG};
pub use criu_probe::{
    criu_check, find_in_path, probe_criu, probe_criu_cached, probe_criu_with, CriuCheck, CriuInfo,
    CriuVersion, ProbeError, MIN_CRIU_CPU, MIN_CRIU_GPU,
};
pub use exec::{Direct, RunTool};
pub use options::{is_plain_id, validate_container_id, CgroupsMode, CriuFlags, OptionsError};
pub use plugins::PluginDir;
pub use runc_cmd::{
    run_captured, runc_log_error, Dump, Restore, RunOutput, RuncCommand, RuncError, RuncGlobal,
};
pub use runc_error::{classify_runc_error, RuncErrorKind};
pub use versions::{
    host_arch, kernel_release, runc_version, runc_version_with, RuncVersion, VersionError,
};
