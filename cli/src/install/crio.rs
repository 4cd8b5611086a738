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

pub fn dropin_text(handler: &str, wrapper: &Path) -> String {
    format!(
        "# Written by `gpusnap install` (gpusnap {version}): the `{handler}` runtime handler for \
         CRI-O.\n\
         # `gpusnap uninstall` removes this file again.\n\
         \n\
         [crio.runtime]\n\
         # CRI-O releases before 1.34.14 / 1.35.9 / 1.36.6 enable checkpoint/restore here.\n\
         enable_criu_support = true\n\
         \n\
         [crio.runtime.runtimes.{handler}]\n\
         runtime_path = {path}\n\
         runtime_type = \"oci\"\n\
         runtime_root = \"{RUNTIME_ROOT}\"\n\
         \n\
         [crio.checkpoint_restore]\n\
         container_level_enabled = \"checkpoint_restore\"\n",
        version = crate::VERSION,
        path = toml_edit::Value::from(wrapper.to_string_lossy().as_ref()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropin_is_valid_toml_with_both_switches() {
        let text = dropin_text("gpusnap", Path::new("/usr/bin/gpusnap-runc"));
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        let rt = &doc["crio"]["runtime"]["runtimes"]["gpusnap"];
        assert_eq!(rt["runtime_path"].as_str(), Some("/usr/bin/gpusnap-runc"));
        assert_eq!(rt["runtime_type"].as_str(), Some("oci"));
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
