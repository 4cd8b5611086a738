//! The network namespace images CRIU applies inside the network namespace it creates for the
//! container: devices (loopback only), and the raw dumps it hands to `ip` and
//! `iptables-restore`/nftables, which a container without CAP_NET_ADMIN could not load
//! itself (and which can make the node's kernel load netfilter modules). Each must name a
//! network namespace of the tasks that is not CRIU's own (the node's).

use super::{Check, Refusal};
use crate::allowlist::Listing;
use crate::caps;
use crate::image::{ImageDir, Kind};
use crate::proto::{NdType, NetDeviceEntry};

const RAW: [&str; 7] = [
    "NETNS", "NETDEV", "IFADDR", "ROUTE", "ROUTE6", "RULE", "IPTABLES",
];
const TABLES: [&str; 3] = ["IPTABLES", "IP6TABLES", "NFTABLES"];

impl Check<'_> {
    pub(super) fn netns(&mut self, dir: &mut ImageDir, listing: &Listing) -> Result<(), Refusal> {
        let criu = self.criu_ns.net_ns_id.unwrap_or(0);
        for id in RAW.iter().chain(&TABLES[1..]) {
            for (name, ns) in listing.of(id) {
                let ns = ns as u32;
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
