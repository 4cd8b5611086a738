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

/// The gpusnap config table naming the rig's CRIU (`[criu] binary_dir`), which runc (run by
/// gpusnap-runc) would otherwise look for on its PATH.
pub fn criu_config() -> String {
    format!("[criu]\nbinary_dir = \"{}\"\n", rig_bin_dir().display())
}

/// A gpusnap config at `path`: [`criu_config`] and then `extra`.
pub fn write_criu_config(path: &Path, extra: &str) -> std::io::Result<()> {
    std::fs::write(path, format!("{}{extra}", criu_config()))
}

/// `<prefix>/images/busybox.oci.tar` (`docker.io/gpusnap/busybox:test`).
pub fn busybox_archive() -> PathBuf {
    rig_prefix().join("images/busybox.oci.tar")
}

/// `<prefix>/images/pause.oci.tar` (`docker.io/gpusnap/pause:test`).
pub fn pause_archive() -> PathBuf {
    rig_prefix().join("images/pause.oci.tar")
}

/// The cargo workspace root: the nearest ancestor of this crate's directory holding
/// `Cargo.lock` (the kit lives in `<workspace>/tests/kit`).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or_else(|| here.parent().and_then(Path::parent).unwrap_or(here))
        .to_path_buf()
}

/// The environment variable that overrides where binary `name` is taken from:
/// `GPUSNAP_SHIM_BIN` for the shim, `GPUSNAP_CLI_BIN` for `gpusnap`, `GPUSNAP_RUNC_BIN` for
/// `gpusnap-runc`, else `GPUSNAP_<NAME>_BIN` (upper case, `-` as `_`).
pub fn binary_env_var(name: &str) -> String {
    match name {
        GPUSNAP_SHIM_NAME => "GPUSNAP_SHIM_BIN".to_owned(),
        "gpusnap" => "GPUSNAP_CLI_BIN".to_owned(),
        other => format!(
            "GPUSNAP_{}_BIN",
            other
                .strip_prefix("gpusnap-")
                .unwrap_or(other)
                .to_uppercase()
                .replace('-', "_")
        ),
    }
}

/// Candidate locations of binary `name` built by this workspace, in search order: the running
/// test binary's profile directory (`<target-dir>/<profile>/<name>`, which follows
/// `CARGO_TARGET_DIR` and `--release`), then `<workspace>/target/debug/<name>`.
pub fn binary_candidates(name: &str) -> Vec<PathBuf> {
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
            v.push(profile_dir.join(name));
        }
    }
    let ws = workspace_root().join("target/debug").join(name);
    if !v.contains(&ws) {
        v.push(ws);
    }
    v
}

/// The cargo package that builds binary `name`, for error messages.
fn package_of(name: &str) -> &'static str {
    match name {
        GPUSNAP_SHIM_NAME => "gpusnap-shim",
        "gpusnap" => "gpusnap-cli",
        "gpusnap-runc" => "gpusnap-runc",
        _ => "<package>",
    }
}

/// Locates binary `name` of this workspace: `$GPUSNAP_<NAME>_BIN` (see [`binary_env_var`];
/// an error if it is not executable), else the test binary's profile directory, else
/// `<workspace>/target/debug`. The error says where it looked and how to get the binary.
///
/// Cargo builds a package's binaries before its own integration tests, and every binary
/// before `cargo test --workspace`; a test of another package (`cargo test -p X`) finds what
/// the last build of that binary left in the profile directory.
pub fn locate_binary(name: &str) -> Result<PathBuf> {
    let var = binary_env_var(name);
    let package = package_of(name);
    if let Some(p) = std::env::var_os(&var) {
        let p = PathBuf::from(p);
        if is_executable(&p) {
            return Ok(p);
        }
        bail!(
            "{var}={} is not an executable file; build it with `cargo build -p {package}` or \
             point {var} at it",
            p.display()
        );
    }
    let candidates = binary_candidates(name);
    for c in &candidates {
        if is_executable(c) {
            return Ok(c.clone());
        }
    }
    bail!(
        "binary `{name}` not found ({var} is unset; looked at: {}). Build it with \
         `cargo build -p {package}` (`cargo test --workspace` does) or set {var}.",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// [`locate_binary`] for tests: the path, or a panic that says how to get the binary.
pub fn binary(name: &str) -> PathBuf {
    locate_binary(name).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Candidate locations of the gpusnap shim, in search order (see the crate docs).
pub fn gpusnap_shim_candidates() -> Vec<PathBuf> {
    binary_candidates(GPUSNAP_SHIM_NAME)
}

/// Locate the `containerd-shim-gpusnap-v2` binary: `$GPUSNAP_SHIM_BIN`, else the test
/// binary's profile directory, else `<workspace>/target/debug`. The error says where it
/// looked and how to get the binary.
pub fn locate_gpusnap_shim() -> Result<PathBuf> {
    locate_binary(GPUSNAP_SHIM_NAME)
}

/// An executable called `name` on `PATH`, or `name` itself when it is an absolute path to
/// one.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = if name.contains('/') {
        vec![PathBuf::from(name)]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect())
            .unwrap_or_default()
    };
    candidates.into_iter().find(|p| is_executable(p))
}

/// [`find_tool`], or a failure that says what to install. Never a silent skip.
pub fn require_tool(name: &str, package: &str) -> PathBuf {
    find_tool(name)
        .unwrap_or_else(|| panic!("{name} not found: run scripts/setup-env.sh (needs {package})"))
}

/// Whether `p` is a regular file with an execute bit.
pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
