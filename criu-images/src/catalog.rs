//! Every image type CRIU 4.2.1 knows (`criu/image-desc.c`, magics from
//! `criu/include/magic.h`), with the file name it has in a checkpoint, its framing, its root
//! message, and whether gpusnap restores it.
//!
//! A file of the checkpoint directory is gpusnap's own, one the runtime writes there (runc's
//! `descriptors.json`, CRIU's logs and service files), or one of these: anything else is
//! refused with its name. An image type marked [`Verdict::Refused`] is refused when present,
//! whatever it holds; the entries of an allowed one are walked against the rule table
//! ([`crate::rules`]).

/// How a file name is formed: CRIU's `imgset_template` formats, plus `.img`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    /// `<name>.img`.
    Exact(&'static str),
    /// `<prefix><decimal>.img`.
    Dec(&'static str),
    /// `<prefix><hex>.img`.
    Hex(&'static str),
    /// `<prefix><decimal>.tar.gz.img` (a tmpfs tarball).
    DecTar(&'static str),
}

impl Name {
    /// The number in `file` when it has this form (0 for [`Name::Exact`]).
    pub fn matches(self, file: &str) -> Option<u64> {
        let digits = |s: &str, radix: u32| -> Option<u64> {
            let ok = !s.is_empty()
                && s.len() <= 20
                && s.chars().all(|c| c.is_digit(radix) && !c.is_uppercase());
            ok.then(|| u64::from_str_radix(s, radix).ok()).flatten()
        };
        match self {
            Name::Exact(n) => (file.strip_suffix(".img")? == n).then_some(0),
            Name::Dec(p) => digits(file.strip_prefix(p)?.strip_suffix(".img")?, 10),
            Name::Hex(p) => digits(file.strip_prefix(p)?.strip_suffix(".img")?, 16),
            Name::DecTar(p) => digits(file.strip_prefix(p)?.strip_suffix(".tar.gz.img")?, 10),
        }
    }

    pub fn shown(self) -> String {
        match self {
            Name::Exact(n) => format!("{n}.img"),
            Name::Dec(p) => format!("{p}<n>.img"),
            Name::Hex(p) => format!("{p}<hex>.img"),
            Name::DecTar(p) => format!("{p}<n>.tar.gz.img"),
        }
    }
}

/// What follows the magics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Length-prefixed entries of the root message.
    Entries,
    /// A `pagemap_head` entry, then `pagemap_entry` entries.
    Pagemap,
    /// Each entry followed by raw bytes, as many as the named field of the entry says
    /// (`pipe_data_entry.bytes`, `sk_packet_entry.length`).
    EntriesWithData(&'static str),
    /// `tcp_stream_entry`, then its input and output queues (`inq_len` + `outq_len` bytes).
    TcpStream,
    /// `ipc_shm_entry` entries, each followed by `size` bytes rounded up to 4.
    IpcShm,
    /// One `ghost_file_entry`, then the file's content (raw, or `ghost_chunk_entry` + data).
    GhostFile,
    /// No magic, no entries: bytes CRIU hands to another program or copies (memory pages,
    /// netlink dumps, iptables-save output, tarballs).
    Raw,
}

/// Whether the restore accepts the image type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted; every entry is walked and the fields' rules apply.
    Allowed(&'static str),
    /// Refused when present, with why.
    Refused(&'static str),
}

/// One image type.
#[derive(Debug, Clone, Copy)]
pub struct ImageType {
    /// CRIU's name for it (`CR_FD_*` without the prefix).
    pub id: &'static str,
    pub name: Name,
    /// Its type magic (`0` for raw images, which have none).
    pub magic: u32,
    /// The message of its entries.
    pub root: Option<&'static str>,
    pub framing: Framing,
    pub verdict: Verdict,
}

use Framing::*;
use Name::*;
use Verdict::*;

const fn t(
    id: &'static str,
    name: Name,
    magic: u32,
    root: Option<&'static str>,
    framing: Framing,
    verdict: Verdict,
) -> ImageType {
    ImageType {
        id,
        name,
        magic,
        root,
        framing,
        verdict,
    }
}

const LEGACY: &str =
    "a format CRIU 4.x no longer writes (its content is in files.img or core-*.img)";
const NETNS_RAW: &str =
    "applied by CRIU inside the task's network namespace, which must be a new one of the container";

/// Every image type of CRIU 4.2.1. Order: as `criu/image-desc.c`.
pub const IMAGE_TYPES: &[ImageType] = &[
    t("INVENTORY", Exact("inventory"), 0x5831_3116, Some("inventory_entry"), Entries, Allowed("the dump's description; root_ids and root_cg_set are bounded")),
    t("FDINFO", Dec("fdinfo-"), 0x5621_3732, Some("fdinfo_entry"), Entries, Allowed("a task's descriptor table: numbers and flags of files in files.img")),
    t("PAGEMAP", Dec("pagemap-"), 0x5608_4025, Some("pagemap_entry"), Pagemap, Allowed("where the task's own memory pages are in pages-*.img")),
    t("SHMEM_PAGEMAP", Dec("pagemap-shmem-"), 0x5608_4025, Some("pagemap_entry"), Pagemap, Allowed("pages of shared anonymous memory the tasks map")),
    t("REG_FILES", Exact("reg-files"), 0x5036_3636, Some("reg_file_entry"), Entries, Refused(LEGACY)),
    t("EXT_FILES", Exact("ext-files"), 0x5925_5641, Some("ext_file_entry"), Entries, Refused("external files are handed in by a plugin from outside the container")),
    t("NS_FILES", Exact("ns-files"), 0x6139_4011, Some("ns_file_entry"), Entries, Refused(LEGACY)),
    t("EVENTFD_FILE", Exact("eventfd"), 0x4452_3722, Some("eventfd_file_entry"), Entries, Refused(LEGACY)),
    t("EVENTPOLL_FILE", Exact("eventpoll"), 0x4502_3858, Some("eventpoll_file_entry"), Entries, Refused(LEGACY)),
    t("EVENTPOLL_TFD", Exact("eventpoll-tfd"), 0x4443_3746, Some("eventpoll_tfd_entry"), Entries, Refused(LEGACY)),
    t("SIGNALFD", Exact("signalfd"), 0x5732_3820, Some("signalfd_entry"), Entries, Refused(LEGACY)),
    t("INOTIFY_FILE", Exact("inotify"), 0x4842_4431, Some("inotify_file_entry"), Entries, Refused(LEGACY)),
    t("INOTIFY_WD", Exact("inotify-wd"), 0x5456_2009, Some("inotify_wd_entry"), Entries, Refused(LEGACY)),
    t("FANOTIFY_FILE", Exact("fanotify"), 0x5509_6122, Some("fanotify_file_entry"), Entries, Refused(LEGACY)),
    t("FANOTIFY_MARK", Exact("fanotify-mark"), 0x5650_6035, Some("fanotify_mark_entry"), Entries, Refused(LEGACY)),
    t("CORE", Dec("core-"), 0x5505_3847, Some("core_entry"), Entries, Allowed("a thread's registers, signals, credentials, limits: fields bounded one by one")),
    t("IDS", Dec("ids-"), 0x5443_2030, Some("task_kobj_ids_entry"), Entries, Allowed("which namespaces and shared objects a task has: bounded by the spec's namespaces")),
    t("MM", Dec("mm-"), 0x5749_2820, Some("mm_entry"), Entries, Allowed("the task's own memory layout")),
    t("VMAS", Dec("vmas-"), 0x5412_3737, Some("vma_entry"), Entries, Refused(LEGACY)),
    t("PIPES", Exact("pipes"), 0x5651_3555, Some("pipe_entry"), Entries, Refused(LEGACY)),
    t("PIPES_DATA", Exact("pipes-data"), 0x5645_3709, Some("pipe_data_entry"), EntriesWithData("bytes"), Allowed("data queued in the tasks' pipes")),
    t("FIFO", Exact("fifo"), 0x5836_4939, Some("fifo_entry"), Entries, Refused(LEGACY)),
    t("FIFO_DATA", Exact("fifo-data"), 0x5933_3054, Some("pipe_data_entry"), EntriesWithData("bytes"), Allowed("data queued in the tasks' FIFOs")),
    t("PSTREE", Exact("pstree"), 0x5027_3030, Some("pstree_entry"), Entries, Allowed("the process tree")),
    t("SIGACT", Dec("sigacts-"), 0x5534_4201, Some("sa_entry"), Entries, Refused(LEGACY)),
    t("UNIXSK", Exact("unixsk"), 0x5437_3943, Some("unix_sk_entry"), Entries, Refused(LEGACY)),
    t("INETSK", Exact("inetsk"), 0x5644_3851, Some("inet_sk_entry"), Entries, Refused(LEGACY)),
    t("PACKETSK", Exact("packetsk"), 0x6045_4618, Some("packet_sock_entry"), Entries, Refused(LEGACY)),
    t("NETLINK_SK", Exact("netlinksk"), 0x5800_5614, Some("netlink_sk_entry"), Entries, Refused(LEGACY)),
    t("SK_QUEUES", Exact("sk-queues"), 0x5626_4026, Some("sk_packet_entry"), EntriesWithData("length"), Allowed("data queued in the tasks' unix sockets")),
    t("ITIMERS", Dec("itimers-"), 0x5746_4056, Some("itimer_entry"), Entries, Refused(LEGACY)),
    t("POSIX_TIMERS", Dec("posix-timers-"), 0x5260_3957, Some("posix_timer_entry"), Entries, Refused(LEGACY)),
    t("CREDS", Dec("creds-"), 0x5402_3547, Some("creds_entry"), Entries, Allowed("credentials in images of CRIU before 1.x's core-embedded ones: bounded like core's")),
    t("UTSNS", Dec("utsns-"), 0x5447_3203, Some("utsns_entry"), Entries, Allowed("host and domain name of the container's own UTS namespace")),
    t("IPC_VAR", Dec("ipcns-var-"), 0x5311_5007, Some("ipc_var_entry"), Entries, Allowed("limits of the container's own IPC namespace")),
    t("IPCNS_SHM", Dec("ipcns-shm-"), 0x4628_3044, Some("ipc_shm_entry"), IpcShm, Allowed("System V shared memory of the container's own IPC namespace")),
    t("IPCNS_MSG", Dec("ipcns-msg-"), 0x5545_3737, Some("ipc_msg_entry"), Entries, Refused("System V message queues: their payload framing is not modeled")),
    t("IPCNS_SEM", Dec("ipcns-sem-"), 0x5957_3019, Some("ipc_sem_entry"), Entries, Refused("System V semaphores: their payload framing is not modeled")),
    t("FS", Dec("fs-"), 0x5140_3912, Some("fs_entry"), Entries, Allowed("a task's cwd, root and umask, by file ids of files.img")),
    t("REMAP_FPATH", Exact("remap-fpath"), 0x5913_3954, Some("remap_file_path_entry"), Entries, Allowed("open files CRIU brings back from the checkpoint (ghost files, links)")),
    t("GHOST_FILE", Hex("ghost-file-"), 0x5258_3605, Some("ghost_file_entry"), GhostFile, Allowed("an unlinked open file, recreated from the image: mode, owner and device bounded")),
    t("MEMFD_INODE", Exact("memfd"), 0x4845_3499, Some("memfd_inode_entry"), Entries, Allowed("anonymous memory files (memfd_create) of the tasks")),
    t("TCP_STREAM", Hex("tcp-stream-"), 0x5146_5506, Some("tcp_stream_entry"), TcpStream, Refused("established TCP connections, restored with TCP repair: a connection with any addresses and sequence numbers, which a container cannot make")),
    t("MNTS", Dec("mountpoints-"), 0x5556_3928, Some("mnt_entry"), Entries, Allowed("the mounts CRIU makes: bounded by the spec's mounts")),
    t("NETDEV", Dec("netdev-"), 0x5737_3951, Some("net_device_entry"), Entries, Allowed("network devices of the container's own network namespace: loopback only")),
    t("NETNS", Dec("netns-"), 0x5593_3752, Some("netns_entry"), Entries, Allowed("sysctls of the container's own network namespace")),
    t("IFADDR", Dec("ifaddr-"), 0, None, Raw, Allowed(NETNS_RAW)),
    t("ROUTE", Dec("route-"), 0, None, Raw, Allowed(NETNS_RAW)),
    t("ROUTE6", Dec("route6-"), 0, None, Raw, Allowed(NETNS_RAW)),
    t("RULE", Dec("rule-"), 0, None, Raw, Allowed(NETNS_RAW)),
    t("IPTABLES", Dec("iptables-"), 0, None, Raw, Allowed("iptables-save output CRIU feeds to iptables-restore in the container's network namespace: only empty tables unless the spec grants CAP_NET_ADMIN")),
    t("IP6TABLES", Dec("ip6tables-"), 0, None, Raw, Allowed("as iptables-<n>.img, for IPv6")),
    t("NFTABLES", Dec("nftables-"), 0, None, Raw, Allowed("an nftables ruleset CRIU loads in the container's network namespace: only an empty one unless the spec grants CAP_NET_ADMIN")),
    t("TMPFS_IMG", DecTar("tmpfs-"), 0, None, Raw, Allowed("a tmpfs's content, untarred by CRIU as root: every entry checked")),
    t("TMPFS_DEV", DecTar("tmpfs-dev-"), 0, None, Raw, Allowed("the content of a tmpfs at /dev, untarred by CRIU as root: every entry checked")),
    t("AUTOFS", Dec("autofs-"), 0x4935_3943, Some("autofs_entry"), Entries, Refused("autofs mounts: a container never has one")),
    t("BINFMT_MISC_OLD", Dec("binfmt-misc-"), 0x6734_3323, Some("binfmt_misc_entry"), Entries, Refused("binfmt_misc handlers are registered for the whole node")),
    t("BINFMT_MISC", Exact("binfmt-misc"), 0x6734_3323, Some("binfmt_misc_entry"), Entries, Refused("binfmt_misc handlers are registered for the whole node")),
    t("TTY_FILES", Exact("tty"), 0x5943_3025, Some("tty_file_entry"), Entries, Refused(LEGACY)),
    t("TTY_INFO", Exact("tty-info"), 0x5945_3036, Some("tty_info_entry"), Entries, Allowed("terminals the tasks hold: pseudo-terminals and runc's external console only")),
    t("TTY_DATA", Exact("tty-data"), 0x5941_3026, Some("tty_data_entry"), Entries, Allowed("data queued in the tasks' pseudo-terminals")),
    t("FILE_LOCKS", Exact("filelocks"), 0x5432_3616, Some("file_lock_entry"), Entries, Allowed("locks the tasks hold on their own open files")),
    t("RLIMIT", Dec("rlimit-"), 0x5711_3925, Some("rlimit_entry"), Entries, Refused(LEGACY)),
    t("PAGES", Dec("pages-"), 0, None, Raw, Allowed("the tasks' own memory pages")),
    t("SIGNAL", Dec("signal-s-"), 0x5925_5647, Some("signal_queue_entry"), Entries, Refused(LEGACY)),
    t("PSIGNAL", Dec("signal-p-"), 0x5925_5647, Some("signal_queue_entry"), Entries, Refused(LEGACY)),
    t("TUNFILE", Exact("tunfile"), 0x5714_3751, Some("tunfile_entry"), Entries, Refused(LEGACY)),
    t("CGROUP", Exact("cgroup"), 0x5938_3330, Some("cgroup_entry"), Entries, Allowed("the tasks' cgroups: every path under the container's own, no properties")),
    t("TIMERFD", Exact("timerfd"), 0x5049_3712, Some("timerfd_entry"), Entries, Refused(LEGACY)),
    t("CPUINFO", Exact("cpuinfo"), 0x6140_4013, Some("cpuinfo_entry"), Entries, Allowed("CPU features the dump needs; CRIU compares them with the node's")),
    t("SECCOMP", Exact("seccomp"), 0x6441_3049, Some("seccomp_entry"), Entries, Allowed("seccomp filters: each thread's chain as strict as the spec's profile")),
    t("USERNS", Dec("userns-"), 0x5547_4906, Some("userns_entry"), Entries, Allowed("uid/gid maps CRIU writes as root: the spec's")),
    t("NETNF_CT", Dec("netns-ct-"), 0, None, Raw, Refused("conntrack entries, loaded into the node's connection tracking")),
    t("NETNF_EXP", Dec("netns-exp-"), 0, None, Raw, Refused("conntrack expectations, loaded into the node's connection tracking")),
    t("FILES", Exact("files"), 0x5630_3138, Some("file_entry"), Entries, Allowed("every open file of every task, by type: each type bounded or refused")),
    t("TIMENS", Dec("timens-"), 0x4311_4433, Some("timens_entry"), Entries, Allowed("clock offsets of the container's own time namespace")),
    t("PIDNS", Dec("pidns-"), 0x6115_7326, Some("pidns_entry"), Entries, Allowed("the pid namespace's external key (none in a container's own)")),
    t("BPFMAP_FILE", Exact("bpfmap-file"), 0x5750_6142, Some("bpfmap_file_entry"), Entries, Refused("BPF maps need CAP_BPF or CAP_SYS_ADMIN of the node")),
    t("BPFMAP_DATA", Exact("bpfmap-data"), 0x6432_4033, Some("bpfmap_data_entry"), Entries, Refused("BPF maps need CAP_BPF or CAP_SYS_ADMIN of the node")),
    t("APPARMOR", Exact("apparmor"), 0x5942_3047, Some("apparmor_entry"), Entries, Allowed("AppArmor policies CRIU would load into the node's kernel: refused when any is present")),
    t("PIDFD", Exact("pidfd"), 0x5443_5556, Some("pidfd_entry"), Entries, Refused(LEGACY)),
];

/// The root messages of an allowed image type's entries (a pagemap starts with a
/// `pagemap_head`; a ghost file's content may come in `ghost_chunk_entry` pieces).
pub fn roots(t: &ImageType) -> Vec<&'static str> {
    let mut roots: Vec<&'static str> = t.root.into_iter().collect();
    match t.framing {
        Framing::Pagemap => roots.push("pagemap_head"),
        Framing::GhostFile => roots.push("ghost_chunk_entry"),
        _ => {}
    }
    roots
}

/// The type of `file` by its name; the longest matching prefix wins (`pagemap-shmem-1.img`
/// is SHMEM_PAGEMAP, not PAGEMAP; `tmpfs-dev-3.tar.gz.img` TMPFS_DEV).
pub fn by_name(file: &str) -> Option<(&'static ImageType, u64)> {
    IMAGE_TYPES
        .iter()
        .filter_map(|t| t.name.matches(file).map(|n| (t, n)))
        .max_by_key(|(t, _)| match t.name {
            Exact(p) | Dec(p) | Hex(p) | DecTar(p) => p.len(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_their_type_only() {
        let id = |f: &str| by_name(f).map(|(t, n)| (t.id, n));
        assert_eq!(id("core-12.img"), Some(("CORE", 12)));
        assert_eq!(id("pagemap-shmem-5.img"), Some(("SHMEM_PAGEMAP", 5)));
        assert_eq!(id("pagemap-5.img"), Some(("PAGEMAP", 5)));
        assert_eq!(id("tmpfs-dev-42.tar.gz.img"), Some(("TMPFS_DEV", 42)));
        assert_eq!(id("tmpfs-42.tar.gz.img"), Some(("TMPFS_IMG", 42)));
        assert_eq!(id("ghost-file-1a.img"), Some(("GHOST_FILE", 0x1a)));
        assert_eq!(id("netns-ct-3.img"), Some(("NETNF_CT", 3)));
        assert_eq!(id("netns-3.img"), Some(("NETNS", 3)));
        assert_eq!(id("inventory.img"), Some(("INVENTORY", 0)));
        for odd in [
            "core-.img",
            "core-1x.img",
            "core-1.img.bak",
            "core--1.img",
            "ghost-file-1A.img",
            "x.img",
            "core-1",
        ] {
            assert_eq!(id(odd), None, "{odd}");
        }
    }

    #[test]
    fn every_root_message_exists_in_crius_protos() {
        for t in IMAGE_TYPES {
            if let Some(root) = t.root {
                crate::schema::message(root);
            }
        }
    }
}
