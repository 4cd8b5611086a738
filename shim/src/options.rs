//! Runtime options containerd passes in `CreateTaskRequest.options` (from the runtime's
//! `options` table in containerd's config), and how the shim finds them again later.
//!
//! Two encodings arrive in practice: `containerd.runc.v1.Options` (what containerd sends for
//! runc-style runtimes and what `ctr --runc-binary` produces) and `runtimeoptions.v1.Options`
//! (what CRI sends for other runtime types: a type URL plus a config path/body).

use std::path::{Path, PathBuf};

use containerd_shim::protos::{
    protobuf::{well_known_types::any::Any, CodedInputStream, Message},
    shim::oci::Options as RuncOptions,
};
use serde::{Deserialize, Serialize};

const RUNC_OPTIONS: &str = "containerd.runc.v1.Options";
const CRI_RUNTIME_OPTIONS: &str = "runtimeoptions.v1.Options";
const DEFAULT_RUNC_ROOT: &str = "/run/containerd/runc";
/// The file in the bundle where the shim records its settings, so `shim delete` (a fresh
/// process) runs runc exactly as the serving shim did.
const SETTINGS_FILE: &str = "gpusnap-runtime.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuntimeSettings {
    pub runc_binary: String,
    /// runc's `--root`, already including the namespace.
    pub runc_root: PathBuf,
    pub systemd_cgroup: bool,
    pub no_pivot_root: bool,
    pub no_new_keyring: bool,
    pub io_uid: u32,
    pub io_gid: u32,
    pub criu_image_path: Option<PathBuf>,
    pub criu_work_path: Option<PathBuf>,
    /// gpusnap configuration file named by CRI's runtime options, if any.
    pub config_path: Option<PathBuf>,
}

impl RuntimeSettings {
    pub fn defaults(namespace: &str) -> Self {
        Self {
            runc_binary: "runc".to_string(),
            runc_root: Path::new(DEFAULT_RUNC_ROOT).join(namespace),
            systemd_cgroup: false,
            no_pivot_root: false,
            no_new_keyring: false,
            io_uid: 0,
            io_gid: 0,
            criu_image_path: None,
            criu_work_path: None,
            config_path: None,
        }
    }

    /// Builds settings from the options `Any`; `None` or an empty value means defaults.
    pub fn from_any(namespace: &str, any: Option<&Any>) -> Result<Self, OptionsError> {
        let mut s = Self::defaults(namespace);
        let Some(any) = any.filter(|a| !a.type_url.is_empty()) else {
            return Ok(s);
        };
        let name = any.type_url.rsplit('/').next().unwrap_or_default();
        match name {
            RUNC_OPTIONS => {
                let o = RuncOptions::parse_from_bytes(&any.value).map_err(|e| {
                    OptionsError::Decode {
                        name: name.to_string(),
                        detail: e.to_string(),
                    }
                })?;
                if !o.binary_name.is_empty() {
                    s.runc_binary = o.binary_name;
                }
                if !o.root.is_empty() {
                    s.runc_root = Path::new(&o.root).join(namespace);
                }
                s.systemd_cgroup = o.systemd_cgroup;
                s.no_pivot_root = o.no_pivot_root;
                s.no_new_keyring = o.no_new_keyring;
                s.io_uid = o.io_uid;
                s.io_gid = o.io_gid;
                s.criu_image_path = non_empty(o.criu_image_path);
                s.criu_work_path = non_empty(o.criu_work_path);
            }
            CRI_RUNTIME_OPTIONS => {
                let (_type_url, config_path) =
                    decode_cri_options(&any.value).map_err(|e| OptionsError::Decode {
                        name: name.to_string(),
                        detail: e.to_string(),
                    })?;
                s.config_path = non_empty(config_path);
            }
            other => return Err(OptionsError::Unsupported(other.to_string())),
        }
        Ok(s)
    }

    pub fn save(&self, bundle: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(bundle.join(SETTINGS_FILE), data)
    }

    pub fn load(bundle: &Path, namespace: &str) -> Self {
        std::fs::read(bundle.join(SETTINGS_FILE))
            .ok()
            .and_then(|d| serde_json::from_slice(&d).ok())
            .unwrap_or_else(|| Self::defaults(namespace))
    }

    pub fn runc_log(bundle: &Path) -> PathBuf {
        bundle.join("log.json")
    }

    /// The runc client for these settings, waiting on runc through the shim's reaper.
    pub fn runc(&self, bundle: &Path) -> Result<runc::Runc, runc::error::Error> {
        let mut opts = runc::options::GlobalOpts::new()
            .command(&self.runc_binary)
            .root(&self.runc_root)
            .log(Self::runc_log(bundle))
            .log_json()
            .systemd_cgroup(self.systemd_cgroup);
        opts.custom_spawner(std::sync::Arc::new(crate::reaper::ReaperSpawner));
        opts.build()
    }
}

/// Why containerd's runtime options were refused.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("runtime options of type {name} could not be decoded: {detail}")]
    Decode { name: String, detail: String },
    #[error(
        "unsupported runtime options type {0:?}: gpusnap accepts {RUNC_OPTIONS} (runc binary, \
         root, systemd cgroup) or {CRI_RUNTIME_OPTIONS} (ConfigPath); fix the runtime's \
         `options` in containerd's config"
    )]
    Unsupported(String),
}

impl From<OptionsError> for crate::errors::Error {
    fn from(e: OptionsError) -> Self {
        crate::errors::invalid_argument(e.to_string())
    }
}

/// Why CRI's runtime options message could not be decoded.
#[derive(Debug, thiserror::Error)]
enum CriOptionsError {
    #[error(transparent)]
    Protobuf(#[from] containerd_shim::protos::protobuf::Error),
    #[error("bad wire type {0}")]
    WireType(u32),
}

fn non_empty(s: String) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// Decodes `runtimeoptions.v1.Options { string type_url = 1; string config_path = 2; }`
/// without generated code: the message is two strings.
fn decode_cri_options(bytes: &[u8]) -> Result<(String, String), CriOptionsError> {
    let mut input = CodedInputStream::from_bytes(bytes);
    let (mut type_url, mut config_path) = (String::new(), String::new());
    while let Some(tag) = input.read_raw_tag_or_eof()? {
        match tag {
            10 => type_url = input.read_string()?,
            18 => config_path = input.read_string()?,
            t => input.skip_field(
                containerd_shim::protos::protobuf::rt::WireType::new(t & 7)
                    .ok_or(CriOptionsError::WireType(t & 7))?,
            )?,
        }
    }
    Ok((type_url, config_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.to_string();
        a.value = value;
        a
    }

    #[test]
    fn no_options_means_defaults() {
        let s = RuntimeSettings::from_any("k8s.io", None).unwrap();
        assert_eq!(s.runc_binary, "runc");
        assert_eq!(s.runc_root, PathBuf::from("/run/containerd/runc/k8s.io"));
        assert!(!s.systemd_cgroup);
    }

    #[test]
    fn runc_options_are_applied() {
        let mut o = RuncOptions::new();
        o.binary_name = "/usr/local/sbin/runc".into();
        o.root = "/run/custom".into();
        o.systemd_cgroup = true;
        let a = any("containerd.runc.v1.Options", o.write_to_bytes().unwrap());
        let s = RuntimeSettings::from_any("default", Some(&a)).unwrap();
        assert_eq!(s.runc_binary, "/usr/local/sbin/runc");
        assert_eq!(s.runc_root, PathBuf::from("/run/custom/default"));
        assert!(s.systemd_cgroup);
    }

    #[test]
    fn cri_options_carry_config_path() {
        // type_url = "x", config_path = "/etc/gpusnap/config.toml"
        let mut bytes = vec![10, 1, b'x', 18];
        let path = b"/etc/gpusnap/config.toml";
        bytes.push(path.len() as u8);
        bytes.extend_from_slice(path);
        let a = any("type.googleapis.com/runtimeoptions.v1.Options", bytes);
        let s = RuntimeSettings::from_any("k8s.io", Some(&a)).unwrap();
        assert_eq!(
            s.config_path,
            Some(PathBuf::from("/etc/gpusnap/config.toml"))
        );
    }

    #[test]
    fn unknown_and_malformed_options_are_refused_clearly() {
        let err = RuntimeSettings::from_any("d", Some(&any("example.Other", vec![])))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unsupported runtime options type \"example.Other\""),
            "{err}"
        );
        let err = RuntimeSettings::from_any(
            "d",
            Some(&any("containerd.runc.v1.Options", vec![0xff, 0xff])),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("could not be decoded"), "{err}");
    }
}
