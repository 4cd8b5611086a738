//! The network namespace images CRIU applies inside the network namespace it creates for the
//! container: devices (loopback only), and the raw dumps it hands to `ip` and
//! `iptables-restore`/nftables, which a container without CAP_NET_ADMIN could not load
//! itself (and which can make the node's kernel load netfilter modules). Each must name a
//! network namespace of the tasks that is not CRIU's own (the node's).

use super::{Check, Refusal};
use crate::allowlist::Listing;
use crate::caps;
use crate::image::{ImageDir, Kind};
use crate::proto::{NdType, NetDeviceEntry, NetnsEntry, PidnsEntry};

/// The keys runc gives CRIU for a pid or network namespace the spec joins by path
/// (`--external pid[...]:extRootPidNS`, `net[...]:extRootNetNS`): CRIU then uses the namespace
/// runc hands it, not one the image describes.
const RUNC_KEYS: [(&str, &str, &str); 2] = [
    ("PIDNS", "pid", "extRootPidNS"),
    ("NETNS", "network", "extRootNetNS"),
];

const RAW: [&str; 7] = [
    "NETNS", "NETDEV", "IFADDR", "ROUTE", "ROUTE6", "RULE", "IPTABLES",
];
const TABLES: [&str; 3] = ["IPTABLES", "IP6TABLES", "NFTABLES"];

impl Check<'_> {
    pub(super) fn netns(&mut self, dir: &mut ImageDir, listing: &Listing) -> Result<(), Refusal> {
        self.external_namespaces(dir, listing)?;
        let criu = self.criu_ns.net_ns_id.unwrap_or(0);
        let joined_net = self.bound.has_ns("network") && !self.bound.new_ns("network");
        for id in RAW.iter().chain(&TABLES[1..]) {
            for (name, ns) in listing.of(id) {
                let ns = ns as u32;
                // A network namespace runc hands CRIU (the spec joins it by path) is not
                // restored from the image; its key is checked above.
                if *id == "NETNS" && joined_net {
                    let name = name.to_owned();
                    let external = dir
                        .read::<NetnsEntry>(&name, Kind::Netns)?
                        .unwrap_or_default()
                        .iter()
                        .all(|e| e.ext_key.as_deref() == Some(&b"extRootNetNS"[..]));
                    if external {
                        continue;
                    }
                }
                if ns == criu || !self.net_ns.contains(&ns) {
                    self.find(
                        None,
                        name,
                        "network namespace",
                        format!(
                            "{ns} is {}: CRIU would apply it to a namespace that is not the \
                             container's",
                            if ns == criu {
                                "CRIU's own (the node's)".to_string()
                            } else {
                                "no task's".to_string()
                            }
                        ),
                    );
                }
            }
        }
        for (name, _) in listing.of("NETDEV") {
            let name = name.to_owned();
            let devices: Vec<NetDeviceEntry> = dir.read(&name, Kind::Netdev)?.unwrap_or_default();
            for d in devices {
                if d.r#type != NdType::Loopback as i32 {
                    let typ = NdType::try_from(d.r#type).map_or("unknown", |t| t.as_str_name());
                    self.find(
                        None,
                        &name,
                        "type",
                        format!(
                            "of device {:?} is {typ}: only the loopback device of the \
                             container's own network namespace is restored",
                            String::from_utf8_lossy(&d.name)
                        ),
                    );
                }
            }
        }
        if self.bound.may(caps::NET_ADMIN) {
            return Ok(());
        }
        for id in TABLES {
            for (name, _) in listing.of(id) {
                let name = name.to_owned();
                let bytes = dir
                    .read_bytes(&name, "netfilter rules")?
                    .unwrap_or_default();
                if let Some(line) = rules_in(id, &bytes) {
                    self.find(
                        None,
                        &name,
                        "rules",
                        format!(
                            "hold {line:?}: netfilter rules CRIU would load, which needs \
                             CAP_NET_ADMIN the spec's {} lacks",
                            self.bound.may_set(caps::NET_ADMIN)
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

impl Check<'_> {
    /// An external namespace key is runc's, for a namespace the spec joins by path.
    fn external_namespaces(
        &mut self,
        dir: &mut ImageDir,
        listing: &Listing,
    ) -> Result<(), Refusal> {
        for (id, typ, runc_key) in RUNC_KEYS {
            for (name, _) in listing.of(id) {
                let name = name.to_owned();
                let keys: Vec<Vec<u8>> = if id == "PIDNS" {
                    dir.read::<PidnsEntry>(&name, Kind::Pidns)?
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|e| e.ext_key)
                        .collect()
                } else {
                    dir.read::<NetnsEntry>(&name, Kind::Netns)?
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|e| e.ext_key)
                        .collect()
                };
                let joined = self.bound.has_ns(typ) && !self.bound.new_ns(typ);
                for key in keys.iter().filter(|k| !k.is_empty()) {
                    if !(joined && key == runc_key.as_bytes()) {
                        self.find(
                            None,
                            &name,
                            "ext_key",
                            format!(
                                "is {:?}: an external {typ} namespace, which only runc's key \
                                 {runc_key:?} for a namespace the spec joins by path may name",
                                String::from_utf8_lossy(key)
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// The first line of `bytes` that is a rule (not a table, an ACCEPT policy, a comment or a
/// commit): what only CAP_NET_ADMIN loads.
fn rules_in(id: &str, bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    for line in text.lines().map(str::trim) {
        let empty_table = id != "NFTABLES"
            && (line.starts_with('*')
                || line == "COMMIT"
                || (line.starts_with(':') && line.split_whitespace().nth(1) == Some("ACCEPT")));
        if line.is_empty() || line.starts_with('#') || empty_table {
            continue;
        }
        return Some(line.chars().take(80).collect());
    }
    None
}
