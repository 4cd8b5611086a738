//! The table of settings: dotted key, annotation name, how to set it from an overlay value and
//! how to check it. The TOML file goes through serde; overlays (runtime options, annotations)
//! go key by key through this table so their errors can name the exact setting. A test checks
//! that both paths know the same keys.

use std::path::{Path, PathBuf};

use crate::bytes::{describe, parse_bytes, GIB, MIB};
use crate::error::ConfigError;
use crate::model::{Config, MinVersion, StorageEngine};

/// What a setting accepts, when an overlay's value is not that: the `expected` of
/// [`ConfigError::Invalid`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Expected(pub String);

impl From<&str> for Expected {
    fn from(s: &str) -> Self {
        Expected(s.to_owned())
    }
}

impl From<crate::model::ValueError> for Expected {
    fn from(e: crate::model::ValueError) -> Self {
        Expected(e.to_string())
    }
}

impl From<crate::bytes::ByteSizeError> for Expected {
    fn from(e: crate::bytes::ByteSizeError) -> Self {
        Expected(e.to_string())
    }
}

impl From<crate::destination::DestinationError> for Expected {
    fn from(e: crate::destination::DestinationError) -> Self {
        Expected(e.to_string())
    }
}

/// A value from an overlay: typed TOML from runtime options, or text from an annotation.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Input<'a> {
    Toml(&'a toml::Value),
    Text(&'a str),
}

impl Input<'_> {
    /// The value as the user wrote it, for messages.
    pub(crate) fn shown(&self) -> String {
        match self {
            Input::Toml(v) => v.to_string(),
            Input::Text(t) => format!("{t:?}"),
        }
    }

    fn text(&self) -> Result<&str, Expected> {
        match self {
            Input::Toml(toml::Value::String(s)) => Ok(s),
            Input::Text(t) => Ok(t),
            Input::Toml(_) => Err("a string".into()),
        }
    }

    fn u64(&self) -> Result<u64, Expected> {
        let bad = || Expected::from("a non-negative integer");
        match self {
            Input::Toml(toml::Value::Integer(i)) => u64::try_from(*i).map_err(|_| bad()),
            Input::Text(t) => t.trim().parse().map_err(|_| bad()),
            Input::Toml(_) => Err(bad()),
        }
    }

    fn u32(&self) -> Result<u32, Expected> {
        u32::try_from(self.u64()?).map_err(|_| "an integer below 2^32".into())
    }

    fn bool(&self) -> Result<bool, Expected> {
        match self {
            Input::Toml(toml::Value::Boolean(b)) => Ok(*b),
            Input::Text("true") => Ok(true),
            Input::Text("false") => Ok(false),
            _ => Err("true or false".into()),
        }
    }

    fn bytes(&self) -> Result<u64, Expected> {
        match self {
            Input::Toml(toml::Value::Integer(_)) => self.u64(),
            _ => Ok(parse_bytes(
                self.text().map_err(|_| Expected::from("a byte size"))?,
            )?),
        }
    }

    fn path(&self) -> Result<PathBuf, Expected> {
        self.text().map(PathBuf::from)
    }

    fn string_list(&self) -> Result<Vec<String>, Expected> {
        match self {
            Input::Toml(toml::Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Expected::from("a list of strings")),
            Input::Text(t) => Ok(t
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()),
            Input::Toml(_) => Err("a list of strings".into()),
        }
    }
}

pub(crate) struct Setting {
    /// Dotted key, `table.field`.
    pub key: &'static str,
    /// Annotation name after `gpusnap.io/`; `None` when pods may not set it.
    pub annotation: Option<&'static str>,
    pub set: fn(&mut Config, &Input<'_>) -> Result<(), Expected>,
    pub check: fn(&Config) -> Result<(), ConfigError>,
}

pub(crate) const STORAGE_ENGINE: &str = "storage.engine";
pub(crate) const BUFFER_COUNT: &str = "storage.transfer_buffer_count";
pub(crate) const CHUNK_BYTES: &str = "storage.transfer_chunk_bytes";
pub(crate) const PINNED: &str = "storage.transfer_buffer_count × storage.transfer_chunk_bytes";

/// Bounds, public through the crate root for documentation and callers' own messages.
pub const TRANSFER_BUFFER_COUNT_MAX: u32 = 8;
pub const TRANSFER_CHUNK_BYTES_MIN: u64 = MIB;
pub const TRANSFER_CHUNK_BYTES_MAX: u64 = 256 * MIB;
pub const TRANSFER_CHUNK_ALIGN: u64 = 4096;
pub const PINNED_BYTES_PER_GPU_MAX: u64 = GIB;
pub const MAX_OPERATION_SECONDS_MAX: u64 = 3600;
pub const LOCK_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// Most attempts of one push by the node agent (each failed one waits longer than the last).
pub const PUSH_ATTEMPTS_MAX: u32 = 20;
/// containerd's CRI and CRI-O refuse older CRIU anyway (containerd's `checkCriu`, CRI-O's CRIU check).
pub const CRIU_MIN_VERSION_FLOOR: MinVersion = MinVersion::new(3, 16, 0);

fn invalid(
    setting: &'static str,
    value: impl ToString,
    expected: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        setting,
        value: value.to_string(),
        expected: expected.into(),
    }
}

fn check_abs(setting: &'static str, path: Option<&Path>) -> Result<(), ConfigError> {
    match path {
        Some(p) if !p.is_absolute() => Err(invalid(
            setting,
            format!("{:?}", p.display().to_string()),
            "an absolute path",
        )),
        _ => Ok(()),
    }
}

/// A bare command name (looked up on PATH) or an absolute path; a relative path with `/` would
/// resolve against whatever directory the shim happens to run in.
fn check_name_or_abs(setting: &'static str, value: &str, example: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && !value.contains('\0')
        && (!value.contains('/') || value.starts_with('/'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            setting,
            format!("{value:?}"),
            format!("a name such as {example} or an absolute path"),
        ))
    }
}

/// The longest restore budget: a deadline this far ahead is still a real point in time.
const RESTORE_BUDGET_SECONDS_MAX: u64 = 86_400;

pub(crate) static SETTINGS: &[Setting] = &[
    Setting {
        key: STORAGE_ENGINE,
        annotation: Some("storage-engine"),
        set: |c, v| {
            c.storage.engine = v.text()?.parse::<StorageEngine>()?;
            Ok(())
        },
        check: |_| Ok(()),
    },
    Setting {
        key: BUFFER_COUNT,
        annotation: Some("storage-transfer-buffer-count"),
        set: |c, v| {
            c.storage.transfer_buffer_count = v.u32()?;
            Ok(())
        },
        check: |c| {
            let n = c.storage.transfer_buffer_count;
            if (1..=TRANSFER_BUFFER_COUNT_MAX).contains(&n) {
                Ok(())
            } else {
                Err(invalid(
                    BUFFER_COUNT,
                    n,
                    format!("an integer from 1 to {TRANSFER_BUFFER_COUNT_MAX}"),
                ))
            }
        },
    },
    Setting {
        key: CHUNK_BYTES,
        annotation: Some("storage-transfer-chunk-bytes"),
        set: |c, v| {
            c.storage.transfer_chunk_bytes = v.bytes()?;
            Ok(())
        },
        check: |c| {
            let b = c.storage.transfer_chunk_bytes;
            if (TRANSFER_CHUNK_BYTES_MIN..=TRANSFER_CHUNK_BYTES_MAX).contains(&b)
                && b % TRANSFER_CHUNK_ALIGN == 0
            {
                Ok(())
            } else {
                Err(invalid(
                    CHUNK_BYTES,
                    describe(b),
                    format!(
                        "a size from {} to {} that is a multiple of {TRANSFER_CHUNK_ALIGN}",
                        describe(TRANSFER_CHUNK_BYTES_MIN),
                        describe(TRANSFER_CHUNK_BYTES_MAX)
                    ),
                ))
            }
        },
    },
    Setting {
        key: "cuda.max_operation_seconds",
        annotation: Some("cuda-max-operation-seconds"),
        set: |c, v| {
            c.cuda.max_operation_seconds = v.u64()?;
            Ok(())
        },
        check: |c| {
            let s = c.cuda.max_operation_seconds;
            if (1..=MAX_OPERATION_SECONDS_MAX).contains(&s) {
                Ok(())
            } else {
                Err(invalid(
                    "cuda.max_operation_seconds",
                    s,
                    format!("an integer from 1 to {MAX_OPERATION_SECONDS_MAX}"),
                ))
            }
        },
    },
    Setting {
        key: "cuda.lock_timeout_ms",
        annotation: Some("cuda-lock-timeout-ms"),
        set: |c, v| {
            c.cuda.lock_timeout_ms = v.u64()?;
            Ok(())
        },
        check: |c| {
            let ms = c.cuda.lock_timeout_ms;
            if ms <= LOCK_TIMEOUT_MS_MAX {
                Ok(())
            } else {
                Err(invalid(
                    "cuda.lock_timeout_ms",
                    ms,
                    format!("0 (wait forever) or up to {LOCK_TIMEOUT_MS_MAX} (one hour)"),
                ))
            }
        },
    },
    Setting {
        key: "cuda.restore_budget_seconds",
        annotation: Some("cuda-restore-budget-seconds"),
        set: |c, v| {
            c.cuda.restore_budget_seconds = v.u64()?;
            Ok(())
        },
        check: |c| {
            let s = c.cuda.restore_budget_seconds;
            if (1..=RESTORE_BUDGET_SECONDS_MAX).contains(&s) {
                Ok(())
            } else {
                Err(invalid(
                    "cuda.restore_budget_seconds",
                    s,
                    format!("an integer from 1 to {RESTORE_BUDGET_SECONDS_MAX} (one day)"),
                ))
            }
        },
    },
    Setting {
        key: "cuda.library",
        // dlopen'ed into the shim, which runs as root.
        annotation: None,
        set: |c, v| {
            c.cuda.library = v.text()?.to_owned();
            Ok(())
        },
        check: |c| check_name_or_abs("cuda.library", &c.cuda.library, "libcuda.so.1"),
    },
    Setting {
        key: "runc.binary",
        annotation: None,
        set: |c, v| {
            c.runc.binary = v.path()?;
            Ok(())
        },
        check: |c| check_name_or_abs("runc.binary", &c.runc.binary.to_string_lossy(), "runc"),
    },
    Setting {
        key: "runc.root",
        annotation: None,
        set: |c, v| {
            c.runc.root = v.path()?;
            Ok(())
        },
        check: |c| check_abs("runc.root", Some(&c.runc.root)),
    },
    Setting {
        key: "runc.systemd_cgroup",
        annotation: None,
        set: |c, v| {
            c.runc.systemd_cgroup = v.bool()?;
            Ok(())
        },
        check: |_| Ok(()),
    },
    Setting {
        key: "criu.binary_dir",
        annotation: None,
        set: |c, v| {
            c.criu.binary_dir = Some(v.path()?);
            Ok(())
        },
        check: |c| check_abs("criu.binary_dir", c.criu.binary_dir.as_deref()),
    },
    Setting {
        key: "criu.min_version",
        annotation: None,
        set: |c, v| {
            c.criu.min_version = Some(v.text()?.parse()?);
            Ok(())
        },
        check: |c| match c.criu.min_version {
            Some(v) if v < CRIU_MIN_VERSION_FLOOR => Err(invalid(
                "criu.min_version",
                v,
                format!(
                    "a version of at least {CRIU_MIN_VERSION_FLOOR} (the minimum containerd and \
                     CRI-O accept)"
                ),
            )),
            _ => Ok(()),
        },
    },
    Setting {
        key: "restore.checkpoint_root",
        annotation: None,
        set: |c, v| {
            c.restore.checkpoint_root = v.path()?;
            Ok(())
        },
        check: |c| check_abs("restore.checkpoint_root", Some(&c.restore.checkpoint_root)),
    },
    Setting {
        key: "restore.criu_flags",
        annotation: None,
        set: |c, v| {
            c.restore.criu_flags = v.string_list()?;
            Ok(())
        },
        // The names are runc's; the restore checks them (the criu bridge knows them).
        check: |_| Ok(()),
    },
    Setting {
        key: "restore.max_rootfs_diff_bytes",
        annotation: None,
        set: |c, v| {
            c.restore.max_rootfs_diff_bytes = v.bytes()?;
            Ok(())
        },
        check: |c| {
            if c.restore.max_rootfs_diff_bytes > 0 {
                Ok(())
            } else {
                Err(invalid(
                    "restore.max_rootfs_diff_bytes",
                    0,
                    "a size greater than 0",
                ))
            }
        },
    },
    Setting {
        key: "restore.max_rootfs_diff_entries",
        // A pod could otherwise let a hostile diff hold the restore (and the node's disk).
        annotation: None,
        set: |c, v| {
            c.restore.max_rootfs_diff_entries = v.u64()?;
            Ok(())
        },
        check: |c| {
            if c.restore.max_rootfs_diff_entries > 0 {
                Ok(())
            } else {
                Err(invalid(
                    "restore.max_rootfs_diff_entries",
                    0,
                    "a number of entries greater than 0",
                ))
            }
        },
    },
    Setting {
        key: "restore.max_volume_bytes",
        // What the node gives copies of image volumes is the node's, never a pod's.
        annotation: None,
        set: |c, v| {
            c.restore.max_volume_bytes = v.bytes()?;
            Ok(())
        },
        check: |c| {
            if c.restore.max_volume_bytes > 0 {
                Ok(())
            } else {
                Err(invalid(
                    "restore.max_volume_bytes",
                    0,
                    "a size greater than 0",
                ))
            }
        },
    },
    Setting {
        key: "restore.page_fill_min_bytes",
        // How the node's memory is written on restore is the node's, never a pod's.
        annotation: None,
        set: |c, v| {
            c.restore.page_fill_min_bytes = v.bytes()?;
            Ok(())
        },
        check: |_| Ok(()),
    },
    Setting {
        key: "restore.deadline_seconds",
        // A pod could otherwise let a hostile image hold CRIU (and its capabilities) longer.
        annotation: None,
        set: |c, v| {
            c.restore.deadline_seconds = v.u64()?;
            Ok(())
        },
        check: |c| {
            let s = c.restore.deadline_seconds;
            if s <= crate::model::RESTORE_DEADLINE_MAX.as_secs() {
                Ok(())
            } else {
                Err(invalid(
                    "restore.deadline_seconds",
                    s,
                    format!(
                        "0 (derived from the image size) or up to {} (one day)",
                        crate::model::RESTORE_DEADLINE_MAX.as_secs()
                    ),
                ))
            }
        },
    },
    Setting {
        key: "restore.signature_policy",
        annotation: None,
        set: |c, v| {
            c.restore.signature_policy = v.text()?.parse()?;
            Ok(())
        },
        check: |c| {
            if c.restore.signature_policy != crate::model::SignaturePolicy::Off
                && c.restore.signature_keys.is_empty()
            {
                return Err(invalid(
                    "restore.signature_policy",
                    c.restore.signature_policy,
                    "a policy with keys: set restore.signature_keys to the public key files"
                        .to_string(),
                ));
            }
            Ok(())
        },
    },
    Setting {
        key: "restore.signature_keys",
        annotation: None,
        set: |c, v| {
            c.restore.signature_keys = v.string_list()?.into_iter().map(PathBuf::from).collect();
            Ok(())
        },
        check: |c| {
            for k in &c.restore.signature_keys {
                check_abs("restore.signature_keys", Some(k))?;
            }
            Ok(())
        },
    },
    Setting {
        key: "restore.decryption_keys",
        annotation: None,
        set: |c, v| {
            c.restore.decryption_keys = v.string_list()?.into_iter().map(PathBuf::from).collect();
            Ok(())
        },
        check: |c| {
            for k in &c.restore.decryption_keys {
                check_abs("restore.decryption_keys", Some(k))?;
            }
            Ok(())
        },
    },
    Setting {
        key: "checkpoint.signing_key",
        annotation: None,
        set: |c, v| {
            c.checkpoint.signing_key = Some(v.path()?);
            Ok(())
        },
        check: |c| {
            check_abs(
                "checkpoint.signing_key",
                c.checkpoint.signing_key.as_deref(),
            )
        },
    },
    Setting {
        key: "checkpoint.allowed_destinations",
        // The node pushes with its own credentials: where to is the admin's to allow.
        annotation: None,
        set: |c, v| {
            c.checkpoint.allowed_destinations = v
                .string_list()?
                .iter()
                .map(|p| p.parse())
                .collect::<Result<_, crate::destination::DestinationError>>()?;
            Ok(())
        },
        // Each pattern is checked as it is parsed (serde or the overlay).
        check: |_| Ok(()),
    },
    Setting {
        key: "checkpoint.registry_config",
        annotation: None,
        set: |c, v| {
            c.checkpoint.registry_config = Some(v.path()?);
            Ok(())
        },
        check: |c| {
            check_abs(
                "checkpoint.registry_config",
                c.checkpoint.registry_config.as_deref(),
            )
        },
    },
    Setting {
        key: "checkpoint.registry_ca_files",
        annotation: None,
        set: |c, v| {
            c.checkpoint.registry_ca_files =
                v.string_list()?.into_iter().map(PathBuf::from).collect();
            Ok(())
        },
        check: |c| {
            for f in &c.checkpoint.registry_ca_files {
                check_abs("checkpoint.registry_ca_files", Some(f))?;
            }
            Ok(())
        },
    },
    Setting {
        key: "checkpoint.push_attempts",
        annotation: None,
        set: |c, v| {
            c.checkpoint.push_attempts = v.u32()?;
            Ok(())
        },
        check: |c| {
            let n = c.checkpoint.push_attempts;
            if (1..=PUSH_ATTEMPTS_MAX).contains(&n) {
                Ok(())
            } else {
                Err(invalid(
                    "checkpoint.push_attempts",
                    n,
                    format!("an integer from 1 to {PUSH_ATTEMPTS_MAX}"),
                ))
            }
        },
    },
    Setting {
        key: "checkpoint.push_retry_seconds",
        annotation: None,
        set: |c, v| {
            c.checkpoint.push_retry_seconds = v.u64()?;
            Ok(())
        },
        check: |c| {
            let s = c.checkpoint.push_retry_seconds;
            let max = crate::model::PUSH_RETRY_MAX.as_secs();
            if (1..=max).contains(&s) {
                Ok(())
            } else {
                Err(invalid(
                    "checkpoint.push_retry_seconds",
                    s,
                    format!("an integer from 1 to {max}"),
                ))
            }
        },
    },
    Setting {
        key: "store.root",
        annotation: None,
        set: |c, v| {
            c.store.root = v.path()?;
            Ok(())
        },
        check: |c| check_abs("store.root", Some(&c.store.root)),
    },
    Setting {
        key: "store.max_bytes",
        annotation: None,
        set: |c, v| {
            c.store.max_bytes = v.bytes()?;
            Ok(())
        },
        check: |_| Ok(()),
    },
];

pub(crate) fn find(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

/// Setting names under one table, for "valid settings in [table]" messages.
pub(crate) fn keys_in(table: &str) -> Vec<String> {
    SETTINGS
        .iter()
        .filter_map(|s| s.key.strip_prefix(table)?.strip_prefix('.'))
        .map(str::to_owned)
        .collect()
}

pub(crate) fn tables() -> Vec<String> {
    let mut t: Vec<String> = SETTINGS
        .iter()
        .filter_map(|s| s.key.split_once('.').map(|(t, _)| t.to_owned()))
        .collect();
    t.dedup();
    t
}

/// Whole-config validation: each setting, then the pinned-memory budget.
pub(crate) fn validate(c: &Config) -> Result<(), ConfigError> {
    for s in SETTINGS {
        (s.check)(c)?;
    }
    let pinned = c.storage.pinned_bytes_per_gpu();
    if pinned > PINNED_BYTES_PER_GPU_MAX {
        return Err(invalid(
            PINNED,
            format!(
                "{} × {} = {} bytes of pinned memory per GPU",
                c.storage.transfer_buffer_count,
                describe(c.storage.transfer_chunk_bytes),
                describe(pinned)
            ),
            format!(
                "at most {} per GPU; lower the buffer count or the chunk size",
                describe(PINNED_BYTES_PER_GPU_MAX)
            ),
        ));
    }
    Ok(())
}

/// Sets one key from an overlay value and checks that setting alone (cross-setting checks wait
/// for [`validate`] after the last layer, since a later layer may fix them).
pub(crate) fn apply(c: &mut Config, s: &Setting, v: &Input<'_>) -> Result<(), ConfigError> {
    (s.set)(c, v).map_err(|Expected(expected)| ConfigError::Invalid {
        setting: s.key,
        value: v.shown(),
        expected,
    })?;
    (s.check)(c)
}

/// Closest candidate by edit distance, when close enough to be a plausible typo.
pub(crate) fn suggest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 3.max(c.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_owned())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_and_suggestions() {
        assert_eq!(edit_distance("engine", "enigne"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(
            suggest(
                "transfer-buffer-count",
                keys_in("storage").iter().map(String::as_str)
            ),
            Some("transfer_buffer_count".into())
        );
        assert_eq!(suggest("zzzzzzzz", ["engine"]), None);
    }

    #[test]
    fn tables_and_keys() {
        assert_eq!(
            tables(),
            [
                "storage",
                "cuda",
                "runc",
                "criu",
                "restore",
                "checkpoint",
                "store"
            ]
        );
        assert_eq!(
            keys_in("criu"),
            ["binary_dir".to_string(), "min_version".to_string()]
        );
    }
}
