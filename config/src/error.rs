//! Configuration errors. Every message names the setting (or annotation), the offending value
//! and what would be accepted.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read gpusnap config {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },

    /// TOML syntax or type error; `message` comes from the TOML parser and shows the line.
    #[error("invalid gpusnap config in {origin}: {message}")]
    Parse { origin: String, message: String },

    #[error(
        "unknown setting `{key}` in {origin}{}; valid settings{}: {}",
        suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(),
        table.as_ref().map(|t| format!(" in [{t}]")).unwrap_or_default(),
        valid.join(", ")
    )]
    UnknownKey {
        origin: String,
        key: String,
        suggestion: Option<String>,
        table: Option<String>,
        valid: Vec<String>,
    },

    #[error("invalid {setting} = {value}: expected {expected}")]
    Invalid {
        setting: &'static str,
        value: String,
        expected: String,
    },

    #[error(
        "unknown annotation `{annotation}`{}; gpusnap annotations are: {}",
        suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(),
        valid.join(", ")
    )]
    UnknownAnnotation {
        annotation: String,
        suggestion: Option<String>,
        valid: Vec<String>,
    },

    #[error(
        "annotation `{annotation}` would set {setting}, which only the node's config file or \
         containerd runtime options may set: pods must not choose binaries or host paths that \
         gpusnap uses as root"
    )]
    AnnotationNotAllowed {
        annotation: String,
        setting: &'static str,
    },

    #[error(
        "runtime option `{key}` is a runc shim option gpusnap does not support; supported \
         runc-style keys are BinaryName, Root and SystemdCgroup, plus gpusnap's own tables \
         ([storage], [cuda], [runc], [criu])"
    )]
    UnsupportedRuncOption { key: String },

    /// An error in one overlay layer, with the layer named.
    #[error("{layer}: {error}")]
    InLayer {
        layer: String,
        #[source]
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    pub(crate) fn in_layer(self, layer: impl Into<String>) -> Self {
        ConfigError::InLayer {
            layer: layer.into(),
            error: Box::new(self),
        }
    }

    /// The innermost error, without layer context.
    pub fn root(&self) -> &ConfigError {
        match self {
            ConfigError::InLayer { error, .. } => error.root(),
            other => other,
        }
    }
}
