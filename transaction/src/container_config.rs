//! gpusnap's configuration for one container, the same on every door: the node's file overlaid
//! by the container's `gpusnap.io/` annotations (the settings a pod may choose: those
//! `gpusnap_config` gives an annotation; any other `gpusnap.io/` name is refused), with the
//! storage engine checked by name. Both doors take the annotations from the bundle's runtime
//! spec, read capped ([`crate::bundle_spec`]): the shim at create (containerd's CRI puts the
//! pod's `pod_annotations` there), gpusnap-runc at checkpoint and restore
//! ([`bundle_annotations`]; Podman's `--annotation` puts them there).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gpusnap_config::{Config, ConfigError};

use crate::gpu::{check_engine_name, UnknownEngine};

/// Why a container's configuration could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ContainerConfigError {
    /// The file, or a setting an annotation gives, is invalid.
    #[error("gpusnap configuration ({}): {source}", path.display())]
    Invalid {
        path: PathBuf,
        // Boxed: a configuration error carries the layer and setting it names.
        #[source]
        source: Box<ConfigError>,
    },
    /// The storage engine named does not exist in this gpusnap.
    #[error("gpusnap configuration ({}): storage.engine: {source}", path.display())]
    Engine {
        path: PathBuf,
        #[source]
        source: UnknownEngine,
    },
    /// The bundle's runtime spec, which holds the annotations, cannot be read.
    #[error("the container's runtime spec {} cannot be read: {why}", path.display())]
    Spec { path: PathBuf, why: String },
}

/// The configuration for a container with `annotations`: the file at `path` (which must
/// exist and be valid), then the annotations' settings.
pub fn for_container(
    path: &Path,
    annotations: &HashMap<String, String>,
) -> Result<Config, ContainerConfigError> {
    let config = Config::load(path).map_err(|source| ContainerConfigError::Invalid {
        path: path.to_path_buf(),
        source: Box::new(source),
    })?;
    layered(path, config, annotations)
}

/// [`for_container`] for a container whose annotations are in its bundle's runtime spec, over
/// the configuration already `loaded` from `path` (not read again).
pub fn for_bundle(
    path: &Path,
    loaded: &Config,
    bundle: &Path,
) -> Result<Config, ContainerConfigError> {
    layered(path, loaded.clone(), &bundle_annotations(bundle)?)
}

/// `config` (read from `path`, named in errors) with the annotations' settings, the storage
/// engine checked by name.
fn layered(
    path: &Path,
    mut config: Config,
    annotations: &HashMap<String, String>,
) -> Result<Config, ContainerConfigError> {
    config
        .apply_annotations(annotations)
        .map_err(|source| ContainerConfigError::Invalid {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
    check_engine_name(config.storage.engine.as_str()).map_err(|source| {
        ContainerConfigError::Engine {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(config)
}

/// The annotations of the runtime spec in `bundle` (`config.json`, read as every reader of it
/// is: [`crate::bundle_spec`]); none when the spec has none.
pub fn bundle_annotations(bundle: &Path) -> Result<HashMap<String, String>, ContainerConfigError> {
    let unreadable = |why: String| ContainerConfigError::Spec {
        path: crate::bundle_spec::path(bundle),
        why,
    };
    let bytes = crate::bundle_spec::read_bytes(bundle).map_err(|e| unreadable(e.to_string()))?;
    /// Only what this reads of a spec; the rest of it is the runtime's to check.
    #[derive(serde::Deserialize)]
    struct Annotated {
        #[serde(default)]
        annotations: Option<HashMap<String, String>>,
    }
    let spec: Annotated = serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))?;
    Ok(spec.annotations.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle_with(annotations: serde_json::Value) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            serde_json::json!({"ociVersion": "1.0.2", "annotations": annotations}).to_string(),
        )
        .unwrap();
        d
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn a_bundles_gpusnap_annotations_layer_over_the_file() {
        let f = file("[storage]\nengine = \"driver-managed\"\n");
        let loaded = Config::load(f.path()).unwrap();
        let b = bundle_with(serde_json::json!({
            "gpusnap.io/storage-engine": "posix",
            "io.podman.annotations.other": "x"
        }));
        let c = for_bundle(f.path(), &loaded, b.path()).unwrap();
        assert_eq!(c.storage.engine.as_str(), "posix");

        // No gpusnap.io/ annotation: the loaded configuration as it is.
        let b = bundle_with(serde_json::json!({"io.podman.annotations.other": "x"}));
        let c = for_bundle(f.path(), &loaded, b.path()).unwrap();
        assert_eq!(c.storage.engine.as_str(), "driver-managed");
    }

    #[test]
    fn annotations_a_pod_may_not_set_and_unknown_engines_are_refused_by_name() {
        let f = file("");
        let loaded = Config::load(f.path()).unwrap();
        let b = bundle_with(serde_json::json!({"gpusnap.io/restore-checkpoint-root": "/x"}));
        let e = for_bundle(f.path(), &loaded, b.path()).unwrap_err();
        assert!(matches!(e, ContainerConfigError::Invalid { .. }), "{e:?}");
        assert!(
            e.to_string().contains("gpusnap.io/restore-checkpoint-root"),
            "{e}"
        );
        let b = bundle_with(serde_json::json!({"gpusnap.io/storage-engine": "nvme-magic"}));
        let e = for_bundle(f.path(), &loaded, b.path()).unwrap_err();
        assert!(e.to_string().contains("nvme-magic"), "{e}");
    }

    #[test]
    fn a_spec_that_cannot_be_read_says_which() {
        let f = file("");
        let loaded = Config::load(f.path()).unwrap();
        let d = tempfile::tempdir().unwrap();
        let e = for_bundle(f.path(), &loaded, d.path()).unwrap_err();
        assert!(
            matches!(e, ContainerConfigError::Spec { .. }) && e.to_string().contains("config.json"),
            "{e}"
        );
    }
}
