//! Before CRIU runs: CRIU is where runc will look, new enough, runs without its own cuda
//! plugin, and reads no config file that sets what gpusnap's model of a restore forbids
//! (`gpusnap_criu_bridge::criu_config`: CRIU's cgroup mode other than soft, action scripts,
//! plugin directories, mount maps, other images or logs, ...).

use std::path::Path;

use gpusnap_config::Config;
use gpusnap_criu_bridge::criu_config;
use gpusnap_criu_bridge::plugins::{self, PluginDir, CRIU_CONFIG_ANNOTATION, RUNC_CRIU_CONFIG};
use gpusnap_criu_bridge::{
    probe_criu_cached, CriuInfo, CriuVersion, RunTool, RuncGlobal, MIN_CRIU_CPU, MIN_CRIU_GPU,
};

use crate::error::{Error, Result};

/// CRIU, checked and prepared for one transaction. Keep it alive until runc returns: it owns
/// the private plugin directory runc's environment names.
#[derive(Debug)]
pub struct PreparedCriu {
    pub info: CriuInfo,
    pub plugins: PluginDir,
}

/// The oldest CRIU accepted: 3.16 for CPU containers, 4.1 with GPU state (frozen-cgroup and
/// restore-thread handling), raised by `criu.min_version`.
pub fn floor(config: &Config, gpu: bool) -> CriuVersion {
    let floor = if gpu { MIN_CRIU_GPU } else { MIN_CRIU_CPU };
    match config.criu.min_version {
        Some(v) => floor.max(CriuVersion::new(v.major, v.minor, v.patch)),
        None => floor,
    }
}

/// Finds CRIU where runc will run it and checks its version; then gives runc (and through it
/// CRIU) a plugin directory without CRIU's cuda plugin, under `scratch`. Refuses, before
/// anything is touched, when CRIU is missing or too old, or when runc's CRIU config file would
/// still load the cuda plugin for a container with GPU state.
pub fn prepare(
    global: &mut RuncGlobal,
    config: &Config,
    gpu: bool,
    bundle: &Path,
    scratch: &Path,
    tool: &dyn RunTool,
) -> Result<PreparedCriu> {
    let info = probe_criu_cached(&global.effective_search_path(), tool)
        .and_then(|info| info.require(floor(config, gpu)).map(|()| info))
        .map_err(|e| Error::precondition(e.to_string()))?;

    // runc hands CRIU its config file (the spec's `org.criu.config`, else the node's
    // runc.conf), which CRIU applies over every setting of runc's request; CRIU's default
    // files are read by every CRIU run. Each may set only what the model allows.
    let annotation = spec_annotation(bundle, CRIU_CONFIG_ANNOTATION)?;
    let runc_conf =
        criu_config::check_runc_config(annotation.as_deref(), Path::new(RUNC_CRIU_CONFIG))
            .map_err(config_refusal)?;
    let defaults = plugins::default_config_files(
        std::env::var_os("HOME").as_deref(),
        std::env::var_os("CRIU_CONFIG_FILE").as_deref(),
    );
    criu_config::check_default_configs(&defaults).map_err(config_refusal)?;
    tracing::debug!(runc_config = %runc_conf, "CRIU's config files checked");

    // The directory CRIU would load from, a libdir in its default config files included.
    let source = plugins::plugin_source(std::env::var_os("CRIU_LIBS_DIR").as_deref(), &defaults);
    let inherited = std::env::var_os("CRIU_CONFIG_FILE").map(std::path::PathBuf::from);
    let dir = PluginDir::prepare(scratch, &source, inherited.as_deref()).map_err(|e| {
        Error::precondition(format!(
            "cannot prepare CRIU's plugin directory under {}: {e}",
            scratch.display()
        ))
    })?;
    if !dir.excluded.is_empty() {
        tracing::info!(
            source = %source.display(),
            excluded = %dir.excluded.join(","),
            kept = dir.kept.len(),
            "CRIU runs without its own GPU plugins"
        );
    }
    global.env.extend(dir.env());
    Ok(PreparedCriu { info, plugins: dir })
}

/// A CRIU config file gpusnap will not run CRIU with, as a refusal that says what to do.
fn config_refusal(e: criu_config::ConfigRefusal) -> Error {
    Error::precondition(format!(
        "CRIU's configuration: {e}. gpusnap runs CRIU only with options its model of the \
         restore knows (see docs/security.md, \"CRIU's configuration files\"): remove that \
         setting, or name no file (org.criu.config set to \"\")"
    ))
}

/// One annotation of the container's runtime spec (`<bundle>/config.json`): `None` when the
/// spec has none by that name. A spec that cannot be read is refused, never taken for one
/// without the annotation: runc still hands CRIU the file the container was created with.
fn spec_annotation(bundle: &Path, key: &str) -> Result<Option<String>> {
    let refused = |why: String| {
        Error::precondition(format!(
            "cannot read the container's runtime spec ({}) to check the CRIU config file it \
             may name ({key}): {why}",
            crate::bundle_spec::path(bundle).display()
        ))
    };
    let bytes = crate::bundle_spec::read_bytes(bundle).map_err(|e| refused(e.to_string()))?;
    let spec: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| refused(e.to_string()))?;
    Ok(spec
        .get("annotations")
        .and_then(|a| a.get(key))
        .and_then(|v| v.as_str())
        .map(str::to_string))
}
