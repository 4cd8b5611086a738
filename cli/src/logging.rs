//! Logging for both binaries: structured `tracing` events on stderr, never stdout (stdout carries
//! command output that callers parse, e.g. `--json`, and runc's own output for the wrapper).

use tracing_subscriber::EnvFilter;

/// Installs a stderr subscriber filtered by `env_var` (e.g. `GPUSNAP_LOG=debug`), `default`
/// otherwise. Safe to call once per process; later calls are ignored.
pub fn init(env_var: &str, default: &str) {
    use std::io::IsTerminal as _;
    let filter = EnvFilter::try_from_env(env_var).unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours on a terminal only: a log file or `kubectl logs` gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
