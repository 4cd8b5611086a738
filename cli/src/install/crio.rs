//! The CRI-O drop-in: a runtime handler whose `runtime_path` is `gpusnap-runc`.
//!
//! CRI-O only checkpoints and restores through `runtime_type = "oci"` (the shim-v2 client
//! answers "not implemented"), so the handler runs the runc wrapper, not the containerd shim.
//! Checkpoint/restore is enabled with `[crio.checkpoint_restore] container_level_enabled` in
//! CRI-O 1.34.14, 1.35.9, 1.36.6 and later; older releases use `[crio.runtime]
//! enable_criu_support`. CRI-O decodes its config leniently, so the drop-in sets both and each
//! release reads the key it knows.

use std::path::Path;

/// Drop-in file name; CRI-O applies `crio.conf.d/*.conf` in lexical order, so a late name wins
/// over a distribution's defaults for the checkpoint switch.
pub const DROPIN_NAME: &str = "90-gpusnap.conf";

/// Where runc keeps the state of containers CRI-O runs through the wrapper.
pub const RUNTIME_ROOT: &str = "/run/gpusnap-runc";

/// The `PATH` CRI-O gives conmon and the runtime: the standard system path, whatever CRI-O
/// itself was started with.
pub const MONITOR_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The runtime handler to register.
#[derive(Debug, Clone, Copy)]
pub struct Handler<'a> {
    pub name: &'a str,
    /// Absolute path of `gpusnap-runc`.
    pub wrapper: &'a Path,
    /// The gpusnap config gpusnap-runc reads (`GPUSNAP_CONFIG`).
    pub config: &'a Path,
    /// runc's state root for the handler's containers.
    pub runtime_root: &'a Path,
}

pub fn dropin_text(h: &Handler<'_>) -> String {
    let q = |p: &str| toml_edit::Value::from(p).to_string();
    format!(
        "# Written by `gpusnap install` (gpusnap {version}): the `{name}` runtime handler for \
         CRI-O.\n\
         # `gpusnap uninstall` removes this file again.\n\
         \n\
         [crio.runtime]\n\
         # CRI-O releases before 1.34.14 / 1.35.9 / 1.36.6 enable checkpoint/restore here.\n\
         enable_criu_support = true\n\
         \n\
         [crio.runtime.runtimes.{name}]\n\
         runtime_path = {path}\n\
         runtime_type = \"oci\"\n\
         runtime_root = {root}\n\
         # CRI-O passes this environment to conmon and to its own calls of the runtime\n\
         # (checkpoint, kill, delete): the gpusnap config and a PATH that finds runc and CRIU.\n\
         monitor_env = [{env_path}, {env_config}]\n\
         \n\
         [crio.checkpoint_restore]\n\
         container_level_enabled = \"checkpoint_restore\"\n",
        version = crate::VERSION,
        name = h.name,
        path = q(&h.wrapper.to_string_lossy()),
        root = q(&h.runtime_root.to_string_lossy()),
        env_path = q(&format!("PATH={MONITOR_PATH}")),
        env_config = q(&format!("GPUSNAP_CONFIG={}", h.config.display())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropin_is_valid_toml_with_both_switches() {
        let text = dropin_text(&Handler {
            name: "gpusnap",
            wrapper: Path::new("/usr/bin/gpusnap-runc"),
            config: Path::new("/etc/gpusnap/config.toml"),
            runtime_root: Path::new(RUNTIME_ROOT),
        });
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        let rt = &doc["crio"]["runtime"]["runtimes"]["gpusnap"];
        assert_eq!(rt["runtime_path"].as_str(), Some("/usr/bin/gpusnap-runc"));
        assert_eq!(rt["runtime_type"].as_str(), Some("oci"));
        assert_eq!(rt["runtime_root"].as_str(), Some(RUNTIME_ROOT));
        let env: Vec<&str> = rt["monitor_env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            env,
            [
                format!("PATH={MONITOR_PATH}").as_str(),
                "GPUSNAP_CONFIG=/etc/gpusnap/config.toml"
            ]
        );
        assert_eq!(
            doc["crio"]["runtime"]["enable_criu_support"].as_bool(),
            Some(true)
        );
        assert_eq!(
            doc["crio"]["checkpoint_restore"]["container_level_enabled"].as_str(),
            Some("checkpoint_restore")
        );
    }
}
