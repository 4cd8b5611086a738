//! Where the rig's external pieces live.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// Binary name containerd derives from the runtime type `io.containerd.gpusnap.v2`.
pub const GPUSNAP_SHIM_NAME: &str = "containerd-shim-gpusnap-v2";

/// Prefix that `scripts/setup-env.sh` installs into (`$GPUSNAP_RIG_PREFIX`, default
/// `/opt/gpusnap-rig`).
pub fn rig_prefix() -> PathBuf {
    std::env::var_os("GPUSNAP_RIG_PREFIX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/gpusnap-rig"))
}

/// `<prefix>/bin`: containerd, ctr, containerd-shim-runc-v2, criu.
pub fn rig_bin_dir() -> PathBuf {
    rig_prefix().join("bin")
}

/// `<prefix>/images/busybox.oci.tar` (`docker.io/gpusnap/busybox:test`).
pub fn busybox_archive() -> PathBuf {
    rig_prefix().join("images/busybox.oci.tar")
}

/// `<prefix>/images/pause.oci.tar` (`docker.io/gpusnap/pause:test`).
pub fn pause_archive() -> PathBuf {
    rig_prefix().join("images/pause.oci.tar")
}

/// The cargo workspace root (parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate lives inside the workspace")
        .to_path_buf()
}

/// Candidate locations of the gpusnap shim, in search order (see the crate docs).
pub fn gpusnap_shim_candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        // <target>/<profile>/deps/<test-binary> -> <target>/<profile>/
        if let Some(profile_dir) = exe.parent().and_then(|deps| {
            if deps.file_name().is_some_and(|n| n == "deps") {
                deps.parent()
            } else {
                Some(deps)
            }
        }) {
            v.push(profile_dir.join(GPUSNAP_SHIM_NAME));
        }
    }
    let ws = workspace_root()
        .join("target/debug")
        .join(GPUSNAP_SHIM_NAME);
    if !v.contains(&ws) {
        v.push(ws);
    }
    v
}

/// Locate the `containerd-shim-gpusnap-v2` binary: `$GPUSNAP_SHIM_BIN`, else the test
/// binary's profile directory, else `<workspace>/target/debug`. The error says where it
/// looked and how to get the binary.
pub fn locate_gpusnap_shim() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GPUSNAP_SHIM_BIN") {
        let p = PathBuf::from(p);
        if is_executable(&p) {
            return Ok(p);
        }
        bail!(
            "GPUSNAP_SHIM_BIN={} is not an executable file; build the shim with \
             `cargo build -p gpusnap-shim` or point GPUSNAP_SHIM_BIN at it",
            p.display()
        );
    }
    let candidates = gpusnap_shim_candidates();
    for c in &candidates {
        if is_executable(c) {
            return Ok(c.clone());
        }
    }
    bail!(
        "gpusnap shim binary `{GPUSNAP_SHIM_NAME}` not found (GPUSNAP_SHIM_BIN is unset; looked at: {}). \
         Build it with `cargo build -p gpusnap-shim` (scripts/test.sh does) or set GPUSNAP_SHIM_BIN.",
        candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
