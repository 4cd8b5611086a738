//! `/etc/criu/runc.conf`: the CRIU config file runc hands to every dump and restore (runc
//! `libcontainer/criu_linux.go`; a pod can override it with the `org.criu.config` annotation).
//!
//! gpusnap only touches it for one reason: CRIU locks the container's network during a dump with
//! `iptables-restore` by default, and nodes that ship only nftables fail every checkpoint of a
//! container with a network namespace. There, `network-lock nftables` is added, provided this
//! CRIU was built with nftables support.

use std::path::Path;
use std::process::{Command, Stdio};

/// Which network-lock setting install should ensure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkLock {
    /// nftables when `iptables-restore` is missing and CRIU supports it; otherwise leave alone.
    Auto,
    /// Always write `network-lock nftables`.
    Nftables,
    /// Never touch the CRIU config.
    Skip,
}

/// What the host offers, probed by [`probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub iptables_restore: bool,
    pub criu_nftables: bool,
}

/// Looks for `iptables-restore` and asks CRIU (`criu check --feature network_lock_nftables`).
pub fn probe(criu: Option<&Path>) -> Facts {
    let search = std::env::var_os("PATH").unwrap_or_default();
    let iptables_restore = gpusnap_criu_bridge::find_in_path("iptables-restore", &search).is_some()
        // CRIU runs it from the standard sbin directories even when PATH lacks them.
        || Path::new("/usr/sbin/iptables-restore").exists()
        || Path::new("/sbin/iptables-restore").exists();
    let criu_nftables = criu.is_some_and(|c| {
        Command::new(c)
            .args(["check", "--feature", "network_lock_nftables"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    Facts {
        iptables_restore,
        criu_nftables,
    }
}

/// Decides the network lock to ensure; `Err` carries a warning for the operator.
pub fn decide(mode: NetworkLock, facts: Facts) -> Result<Option<&'static str>, String> {
    match mode {
        NetworkLock::Skip => Ok(None),
        NetworkLock::Nftables => Ok(Some("nftables")),
        NetworkLock::Auto if facts.iptables_restore => Ok(None),
        NetworkLock::Auto if facts.criu_nftables => Ok(Some("nftables")),
        NetworkLock::Auto => Err(
            "iptables-restore is missing and this CRIU has no nftables network lock: \
             checkpoints of containers with their own network namespace will fail; install \
             iptables or a CRIU built with libnftables"
                .to_owned(),
        ),
    }
}

/// The config text with `network-lock <lock>` present. A file that already sets a network lock
/// is the administrator's choice and is returned unchanged.
pub fn with_network_lock(existing: Option<&str>, lock: &str) -> String {
    let text = existing.unwrap_or_default();
    let already = text.lines().any(|l| {
        let l = l.trim_start().trim_start_matches("--");
        l.starts_with("network-lock")
    });
    if already {
        return text.to_owned();
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "# Added by `gpusnap install`: iptables-restore is not available on this node.\n\
         network-lock {lock}\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_table() {
        let f = |i, n| Facts {
            iptables_restore: i,
            criu_nftables: n,
        };
        assert_eq!(decide(NetworkLock::Auto, f(true, true)), Ok(None));
        assert_eq!(
            decide(NetworkLock::Auto, f(false, true)),
            Ok(Some("nftables"))
        );
        assert!(decide(NetworkLock::Auto, f(false, false)).is_err());
        assert_eq!(
            decide(NetworkLock::Nftables, f(true, false)),
            Ok(Some("nftables"))
        );
        assert_eq!(decide(NetworkLock::Skip, f(false, false)), Ok(None));
    }

    #[test]
    fn network_lock_is_appended_once() {
        let fresh = with_network_lock(None, "nftables");
        assert!(fresh.ends_with("network-lock nftables\n"), "{fresh}");
        assert_eq!(with_network_lock(Some(&fresh), "nftables"), fresh);
        let admin = "tcp-established\nnetwork-lock iptables\n";
        assert_eq!(with_network_lock(Some(admin), "nftables"), admin);
        let no_newline = "tcp-established";
        assert_eq!(
            with_network_lock(Some(no_newline), "nftables")
                .lines()
                .next(),
            Some("tcp-established")
        );
    }
}
