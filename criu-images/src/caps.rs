//! Capability sets as 64-bit masks, and their names (`linux/capability.h`).

/// Capability names by number.
pub const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

pub const SETGID: u64 = 1 << 6;
pub const SETUID: u64 = 1 << 7;
pub const SETPCAP: u64 = 1 << 8;
pub const SYS_ADMIN: u64 = 1 << 21;
pub const CHOWN: u64 = 1;
pub const NET_BIND_SERVICE: u64 = 1 << 10;
pub const NET_ADMIN: u64 = 1 << 12;
pub const NET_RAW: u64 = 1 << 13;
pub const SYS_NICE: u64 = 1 << 23;
pub const SYS_RESOURCE: u64 = 1 << 24;
pub const AUDIT_CONTROL: u64 = 1 << 30;
pub const WAKE_ALARM: u64 = 1 << 35;

/// Every capability this table names.
pub const ALL: u64 = (1 << NAMES.len()) - 1;

/// The bit of a capability name (`CAP_SYS_ADMIN`), `None` when unknown.
pub fn bit(name: &str) -> Option<u64> {
    NAMES.iter().position(|n| *n == name).map(|i| 1 << i)
}

/// A mask from CRIU's words (low word first). CRIU restores two words (`CR_CAP_SIZE`); a
/// word beyond them is ignored by CRIU, and by this reader.
pub fn from_words(words: &[u32]) -> u64 {
    let lo = words.first().copied().unwrap_or(0) as u64;
    let hi = words.get(1).copied().unwrap_or(0) as u64;
    lo | hi << 32
}

/// The names of the bits of `mask`, `CAP_<n>` for numbers without one.
pub fn names(mask: u64) -> String {
    (0..64)
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| {
            NAMES
                .get(i)
                .map_or_else(|| format!("CAP_{i}"), |n| (*n).to_string())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_names() {
        // containerd's default set.
        let defaults = [
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FSETID",
            "CAP_FOWNER",
            "CAP_MKNOD",
            "CAP_NET_RAW",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETFCAP",
            "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE",
            "CAP_SYS_CHROOT",
            "CAP_KILL",
            "CAP_AUDIT_WRITE",
        ];
        let mask = defaults
            .iter()
            .map(|n| bit(n).unwrap())
            .fold(0, |a, b| a | b);
        assert_eq!(mask, 0xa80425fb);
        assert_eq!(from_words(&[0xa80425fb, 0]), mask);
        assert_eq!(names(SYS_ADMIN | 1 << 16), "CAP_SYS_MODULE, CAP_SYS_ADMIN");
        assert_eq!(names(1 << 50), "CAP_50");
        assert_eq!(ALL, 0x1ff_ffff_ffff);
    }
}
