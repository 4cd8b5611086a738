//! Layers on top of the file: containerd runtime options, then pod annotations.
//!
//! Who controls each layer decides what it may set:
//! - the file and the runtime options (`[...runtimes.<name>.options]` in containerd's config,
//!   delivered as TOML in `runtimeoptions.v1.Options.config_body`) belong to
//!   the node administrator and may set everything;
//! - pod annotations (`gpusnap.io/...`, copied into the OCI spec when listed in the runtime's
//!   `pod_annotations`) belong to whoever writes the pod, so they may only tune storage and
//!   timeouts, never binaries, libraries or host paths that gpusnap uses as root.

use std::collections::HashMap;

use crate::destination::is_checkpoint_to_annotation;
use crate::error::ConfigError;
use crate::model::Config;
use crate::settings::{self, Input, SETTINGS};

/// Prefix of gpusnap's pod annotations. Every annotation under it must be a setting: a typo
/// fails loudly instead of silently running with defaults.
pub const ANNOTATION_PREFIX: &str = "gpusnap.io/";
/// The pod annotation that asks for a restore (`gpusnap.io/restore-from: NAME`, or
/// `gpusnap.io/restore-from.CONTAINER: NAME` in a pod of several containers). It names a
/// checkpoint, not a setting, so the configuration overlay leaves it alone.
pub const RESTORE_FROM_ANNOTATION: &str = "gpusnap.io/restore-from";
/// The pod annotation that asks for a restore from a checkpoint image mounted as an image
/// volume (`gpusnap.io/restore-from-volume: MOUNT_PATH`, or
/// `gpusnap.io/restore-from-volume.CONTAINER: MOUNT_PATH`). It names where the container mounts
/// the volume, not a setting, so the configuration overlay leaves it alone.
pub const RESTORE_FROM_VOLUME_ANNOTATION: &str = "gpusnap.io/restore-from-volume";

/// runc `Options` TOML keys and the gpusnap settings they map to.
const RUNC_ALIASES: [(&str, &str); 3] = [
    ("BinaryName", "runc.binary"),
    ("Root", "runc.root"),
    ("SystemdCgroup", "runc.systemd_cgroup"),
];

/// runc `Options` keys gpusnap has no equivalent for. Accepted only with their zero value, so a
/// block copied from a runc runtime works unless it actually relies on one of them.
const RUNC_UNSUPPORTED: [&str; 8] = [
    "NoPivotRoot",
    "NoNewKeyring",
    "ShimCgroup",
    "IoUid",
    "IoGid",
    "CriuPath",
    "CriuImagePath",
    "CriuWorkPath",
];

const RUNTIME_OPTIONS: &str = "containerd runtime options";

fn is_zero(v: &toml::Value) -> bool {
    match v {
        toml::Value::Boolean(b) => !b,
        toml::Value::Integer(i) => *i == 0,
        toml::Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// Checks every key of a parsed file or runtime-options table against the settings table, so
/// an unknown key is reported with its full dotted name and a suggestion.
pub(crate) fn check_known_keys(table: &toml::Table, origin: &str) -> Result<(), ConfigError> {
    let tables = settings::tables();
    for (name, value) in table {
        if !tables.contains(name) {
            return Err(ConfigError::UnknownKey {
                origin: origin.to_owned(),
                key: name.clone(),
                suggestion: settings::suggest(name, tables.iter().map(String::as_str)),
                table: None,
                valid: tables.iter().map(|t| format!("[{t}]")).collect(),
            });
        }
        // A non-table value here is a type error that serde reports with its line.
        if let toml::Value::Table(inner) = value {
            let keys = settings::keys_in(name);
            for key in inner.keys() {
                if !keys.contains(key) {
                    return Err(ConfigError::UnknownKey {
                        origin: origin.to_owned(),
                        key: format!("{name}.{key}"),
                        suggestion: settings::suggest(key, keys.iter().map(String::as_str))
                            .map(|s| format!("{name}.{s}")),
                        table: Some(name.clone()),
                        valid: keys.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

impl Config {
    /// Overlays containerd runtime options: the TOML `config_body` CRI sends for a non-runc
    /// runtime type. It may hold gpusnap's own tables (`[storage]`, `[cuda]`, ...) and the runc
    /// keys `BinaryName`, `Root`, `SystemdCgroup`. Only keys present change; the result must be
    /// valid on its own (full [`Config::validate`] runs at the end).
    pub fn apply_runtime_options(&mut self, config_body: &str) -> Result<(), ConfigError> {
        let layer = |e: ConfigError| e.in_layer(RUNTIME_OPTIONS);
        let mut table: toml::Table = config_body.parse().map_err(|e: toml::de::Error| {
            layer(ConfigError::Parse {
                origin: RUNTIME_OPTIONS.to_owned(),
                message: e.to_string(),
            })
        })?;
        let mut next = self.clone();
        for (alias, key) in RUNC_ALIASES {
            if let Some(v) = table.remove(alias) {
                let s = settings::find(key).expect("alias targets exist");
                settings::apply(&mut next, s, &Input::Toml(&v)).map_err(layer)?;
            }
        }
        for key in RUNC_UNSUPPORTED {
            if let Some(v) = table.remove(key) {
                if !is_zero(&v) {
                    return Err(layer(ConfigError::UnsupportedRuncOption {
                        key: key.to_owned(),
                    }));
                }
            }
        }
        check_known_keys(&table, RUNTIME_OPTIONS).map_err(layer)?;
        for (name, value) in &table {
            let toml::Value::Table(inner) = value else {
                return Err(layer(ConfigError::Parse {
                    origin: RUNTIME_OPTIONS.to_owned(),
                    message: format!("`{name}` must be a table, got {value}"),
                }));
            };
            for (key, v) in inner {
                let dotted = format!("{name}.{key}");
                let s = settings::find(&dotted).expect("checked by check_known_keys");
                settings::apply(&mut next, s, &Input::Toml(v)).map_err(layer)?;
            }
        }
        next.validate().map_err(layer)?;
        *self = next;
        Ok(())
    }

    /// Overlays pod annotations under [`ANNOTATION_PREFIX`]; other annotations are ignored, and
    /// so are the ones that name a checkpoint (`gpusnap.io/restore-from`) or a destination
    /// (`gpusnap.io/checkpoint-to`) rather than a setting. Unknown `gpusnap.io/` names and
    /// settings pods may not change are errors. Full
    /// [`Config::validate`] runs at the end.
    pub fn apply_annotations(
        &mut self,
        annotations: &HashMap<String, String>,
    ) -> Result<(), ConfigError> {
        let mut next = self.clone();
        // Sorted so the first error reported does not depend on hash order.
        let mut ours: Vec<(&str, &str)> = annotations
            .iter()
            .filter(|(k, _)| !is_restore_annotation(k) && !is_checkpoint_to_annotation(k))
            .filter_map(|(k, v)| Some((k.strip_prefix(ANNOTATION_PREFIX)?, v.as_str())))
            .collect();
        ours.sort_unstable();
        for (name, value) in ours {
            let full = format!("{ANNOTATION_PREFIX}{name}");
            let setting = SETTINGS.iter().find(|s| s.annotation == Some(name));
            let Some(setting) = setting else {
                return Err(unknown_annotation(name, &full));
            };
            settings::apply(&mut next, setting, &Input::Text(value))
                .map_err(|e| e.in_layer(format!("annotation {full}")))?;
        }
        next.validate()
            .map_err(|e| e.in_layer("after applying gpusnap.io/ annotations"))?;
        *self = next;
        Ok(())
    }
}

/// `gpusnap.io/restore-from[.<container>]` or `gpusnap.io/restore-from-volume[.<container>]`.
pub fn is_restore_annotation(key: &str) -> bool {
    [RESTORE_FROM_ANNOTATION, RESTORE_FROM_VOLUME_ANNOTATION]
        .iter()
        .any(|a| {
            key == *a
                || key
                    .strip_prefix(a)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
}

/// Names every settable annotation, and says so when the name is a setting pods may not touch.
fn unknown_annotation(name: &str, full: &str) -> ConfigError {
    let as_annotation = |key: &str| key.replace(['.', '_'], "-");
    if let Some(s) = SETTINGS
        .iter()
        .find(|s| s.annotation.is_none() && as_annotation(s.key) == name)
    {
        return ConfigError::AnnotationNotAllowed {
            annotation: full.to_owned(),
            setting: s.key,
        };
    }
    let valid: Vec<&str> = SETTINGS.iter().filter_map(|s| s.annotation).collect();
    ConfigError::UnknownAnnotation {
        annotation: full.to_owned(),
        suggestion: settings::suggest(name, valid.iter().copied())
            .map(|s| format!("{ANNOTATION_PREFIX}{s}")),
        valid: valid
            .iter()
            .map(|a| format!("{ANNOTATION_PREFIX}{a}"))
            .collect(),
    }
}

/// Annotation name → setting key, for documentation and `-info` output.
pub fn annotation_settings() -> Vec<(String, &'static str)> {
    SETTINGS
        .iter()
        .filter_map(|s| Some((format!("{ANNOTATION_PREFIX}{}", s.annotation?), s.key)))
        .collect()
}
