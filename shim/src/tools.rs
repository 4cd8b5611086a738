//! Version probes of the external tools the shim drives (CRIU, runc).
//!
//! They run through the shim's reaper: the shim collects every child itself, so the
//! blocking probes in criu-bridge (which wait on their own child) cannot be used here.

use std::{
    collections::HashMap,
    ffi::{OsStr, OsString},
    process::Stdio,
    sync::{Mutex, OnceLock},
};

use gpusnap_criu_bridge::{self as bridge, CriuInfo, ProbeError};
use tokio::process::Command;

use crate::reaper::run_reaped;

async fn version_output(path: &std::path::Path) -> Result<String, String> {
    let mut cmd = Command::new(path);
    cmd.arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (status, _, out, err) = run_reaped(cmd).await.map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("{status}: {}", err.trim()));
    }
    Ok(out)
}

/// Finds `criu` where runc will look for it and reads its version. Successes are cached per
/// search path; failures are not, so installing CRIU fixes a running shim.
pub async fn probe_criu(search_path: &OsStr) -> Result<CriuInfo, ProbeError> {
    static CACHE: OnceLock<Mutex<HashMap<OsString, CriuInfo>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(search_path)
    {
        return Ok(hit.clone());
    }
    let path =
        bridge::find_in_path("criu", search_path).ok_or_else(|| ProbeError::CriuNotFound {
            path_searched: search_path.to_owned(),
        })?;
    let text = version_output(&path)
        .await
        .map_err(|reason| ProbeError::Exec {
            path: path.clone(),
            reason,
        })?;
    let (version, git_id) =
        bridge::criu_probe::parse_criu_version_output(&text).map_err(|source| {
            ProbeError::BadVersion {
                path: path.clone(),
                source,
            }
        })?;
    let info = CriuInfo {
        path,
        version,
        git_id,
    };
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(search_path.to_owned(), info.clone());
    Ok(info)
}

/// `runc --version`'s version string, asked once per shim.
pub async fn runc_version(binary: &str) -> Option<String> {
    static CACHE: OnceLock<String> = OnceLock::new();
    if let Some(v) = CACHE.get() {
        return Some(v.clone());
    }
    let path = bridge::find_in_path(binary, &std::env::var_os("PATH").unwrap_or_default())
        .unwrap_or_else(|| binary.into());
    let text = version_output(&path).await.ok()?;
    let version = bridge::versions::parse_runc_version(&text).ok()?.version;
    Some(CACHE.get_or_init(|| version).clone())
}
