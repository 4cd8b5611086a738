//! gpusnap's configuration.
//!
//! Three layers, later ones winning: the TOML file (default [`DEFAULT_CONFIG_PATH`]), the
//! containerd runtime options for the gpusnap runtime, and the pod's `gpusnap.io/` annotations.
//! [`Config::layered`] applies all three; each step validates, so a `Config` obtained from this
//! crate is always valid.
//!
//! ```toml
//! [storage]
//! engine = "posix"                 # or "driver-managed" (default)
//! transfer_buffer_count = 8        # 1-8
//! transfer_chunk_bytes = "16MiB"   # 1 MiB-256 MiB, multiple of 4096; count x chunk <= 1 GiB
//!
//! [cuda]
//! max_operation_seconds = 3600     # 1-3600
//! lock_timeout_ms = 10000          # 0 = wait forever
//! restore_budget_seconds = 7200    # > 0
//! library = "libcuda.so.1"
//!
//! [runc]
//! binary = "runc"
//! root = "/run/containerd/runc"
//! systemd_cgroup = false
//!
//! [criu]
//! binary_dir = "/opt/gpusnap-rig/bin"  # prepended to runc's PATH
//! min_version = "4.1"
//! ```

mod bytes;
mod destination;
mod error;
mod model;
mod overlay;
mod settings;

use std::collections::HashMap;
use std::io;
use std::path::Path;

pub use bytes::{parse_bytes, ByteSizeError, GIB, KIB, MIB};
pub use destination::{
    allowed, is_checkpoint_to_annotation, Destination, DestinationError, DestinationPattern,
    CHECKPOINT_TO_ANNOTATION, DESTINATION_MAX_LEN,
};
pub use error::ConfigError;
pub use model::{
    CheckpointConfig, Config, CriuConfig, CudaConfig, MinVersion, RestoreConfig, RuncConfig,
    SignaturePolicy, StorageConfig, StorageEngine, StoreConfig, ValueError, PUSH_RETRY_MAX,
};
pub use overlay::{
    annotation_settings, is_restore_annotation, ANNOTATION_PREFIX, RESTORE_FROM_ANNOTATION,
    RESTORE_FROM_VOLUME_ANNOTATION,
};
pub use settings::{
    CRIU_MIN_VERSION_FLOOR, LOCK_TIMEOUT_MS_MAX, MAX_OPERATION_SECONDS_MAX,
    PINNED_BYTES_PER_GPU_MAX, PUSH_ATTEMPTS_MAX, TRANSFER_BUFFER_COUNT_MAX, TRANSFER_CHUNK_ALIGN,
    TRANSFER_CHUNK_BYTES_MAX, TRANSFER_CHUNK_BYTES_MIN,
};

/// Where the node's config file lives unless runtime options name another (`ConfigPath`).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpusnap/config.toml";
/// The environment variable naming another config file: read by the shim (when its runtime
/// options give no ConfigPath), gpusnap-runc and the `gpusnap` CLI.
pub const CONFIG_ENV: &str = "GPUSNAP_CONFIG";

impl Config {
    /// Reads and validates the file at `path`. A missing file means defaults: gpusnap works
    /// out of the box, and the file only exists to change something.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::debug!(path = %path.display(), "no gpusnap config file; using defaults");
                Ok(Config::default())
            }
            Err(e) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        }
    }

    /// Parses and validates TOML text (same rules as a file).
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        Self::parse(text, "config text")
    }

    fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let parse_err = |e: toml::de::Error| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        };
        // Key check first so an unknown key gets its dotted name and a suggestion; serde's
        // deny_unknown_fields stays as the backstop.
        let table: toml::Table = text.parse().map_err(parse_err)?;
        overlay::check_known_keys(&table, origin)?;
        let config: Config = toml::from_str(text).map_err(parse_err)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting and the cross-setting limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        settings::validate(self)
    }

    /// File, then runtime options (`config_body`, if any), then annotations.
    pub fn layered(
        path: &Path,
        runtime_options: Option<&str>,
        annotations: &HashMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::load(path)?;
        if let Some(body) = runtime_options.filter(|b| !b.trim().is_empty()) {
            config.apply_runtime_options(body)?;
        }
        config.apply_annotations(annotations)?;
        Ok(config)
    }

    /// The effective configuration as TOML, for logs and `-info`.
    pub fn to_toml_string(&self) -> String {
        // Serialising plain structs of strings, numbers and bools cannot fail.
        toml::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
