//! The check: what a checkpoint's CRIU images give the restored tasks, bounded by the spec of
//! the container they are restored into.
//!
//! CRIU's restorer sets every task's uids and gids, groups, securebits, capability sets,
//! no_new_privs, LSM label and seccomp filters from the images, creates the namespaces and
//! mounts the images describe, and runc hands it none of the spec's process settings. So the
//! images alone would decide what the restored processes may do. [`bound_by_spec`] refuses a
//! checkpoint whose images give any task more than a process of the target container could
//! ever hold, which is a bound the kernel guarantees for the spec's settings:
//!
//! - **capabilities**: no set may hold a capability outside the spec's bounding set (or a set
//!   the spec lists explicitly); the bounding set must be within the spec's; with
//!   `noNewPrivileges` the permitted, effective and ambient sets must be within the spec's
//!   permitted set (execve cannot add to them then);
//! - **ids**: uid, euid, suid, fsuid are the spec's uid unless its bounding set has
//!   `CAP_SETUID`; gid, egid, sgid, fsgid the spec's gid and every supplementary group one of
//!   its gid and additionalGids unless it has `CAP_SETGID`;
//! - **securebits**: no `SECBIT_NO_SETUID_FIXUP` unless the bounding set has `CAP_SETPCAP`;
//! - **no_new_privs** set on every thread when the spec sets `noNewPrivileges`;
//! - **seccomp**: with `linux.seccomp` in the spec every thread is in filter mode with a
//!   well-formed, non-empty chain in `seccomp.img` (or in strict mode), some filter of which
//!   stops everything the spec's profile stops ([`crate::seccomp`]);
//! - **LSM**: on a node running AppArmor (SELinux) every thread's label is the spec's
//!   `apparmorProfile` (`selinuxLabel`) when it sets one; `apparmor.img` loads no policy;
//! - **namespaces**: no task is left in CRIU's (the node's) namespace of a type the spec gives
//!   the container a new one of (a namespace joined by path is CRIU's own in honest images);
//!   no user namespace unless the spec has one, and then its maps are the spec's;
//! - **mounts**: every mount of the container's mount namespace is the rootfs, one of the
//!   spec's mounts (same filesystem type, its `ro`/`nosuid`/`nodev`/`noexec` kept; a bind
//!   mount external, so its source comes from runc), a masked or read-only path as runc makes
//!   it, or a cgroup mount beneath the spec's cgroup mount.

use crate::finding::Finding;
use std::collections::BTreeSet;
use std::path::Path;

use oci_spec::runtime::Spec;

mod cgroup;
mod files;
mod netns;
mod task;
mod tmpfs;

use crate::caps;
use crate::image::{ImageDir, ImageError, Kind, Limits};
use crate::proto::{
    ApparmorEntry, CoreEntry, CredsEntry, InventoryEntry, MntEntry, PstreeEntry, SeccompEntry,
    TaskKobjIdsEntry, UidGidExtent, UsernsEntry,
};

/// The LSM the node enforces, detected the way CRIU does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostLsm {
    None,
    AppArmor,
    SeLinux,
}

impl HostLsm {
    /// AppArmor when its securityfs directory exists (CRIU's test), SELinux when selinuxfs is
    /// mounted, else none.
    pub fn detect() -> HostLsm {
        if Path::new("/sys/kernel/security/apparmor").exists() {
            HostLsm::AppArmor
        } else if Path::new("/sys/fs/selinux/enforce").exists() {
            HostLsm::SeLinux
        } else {
            HostLsm::None
        }
    }
}

/// What the restore inherits from the node and the runtime that runs it: the bounds for the
/// fields a spec does not set (a container inherits them from runc, which inherits them from
/// the shim or gpusnap-runc: this process).
#[derive(Debug, Clone)]
pub struct Host {
    pub lsm: HostLsm,
    /// This process's hard resource limits, by resource number.
    pub rlimits: Vec<u64>,
    /// This process's audit loginuid (`None` without audit).
    pub loginuid: Option<u32>,
    pub oom_score_adj: i32,
    /// `net.core.wmem_max` and `net.core.rmem_max`: the largest socket buffers a process
    /// without CAP_NET_ADMIN sets (the kernel doubles them).
    pub wmem_max: u64,
    pub rmem_max: u64,
    /// The maxima of `net.ipv4.tcp_wmem` and `tcp_rmem`, to which TCP autotuning grows a
    /// connection's buffers.
    pub tcp_wmem_max: u64,
    pub tcp_rmem_max: u64,
}

impl Host {
    /// This process and this node.
    pub fn detect() -> Host {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let num = |p: &str| read(p).and_then(|s| s.trim().parse::<u64>().ok());
        let third = |p: &str| {
            read(p).and_then(|s| {
                s.split_whitespace()
                    .nth(2)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        };
        use rustix::process::Resource as R;
        // By resource number, as `task_rlimits_entry` holds them.
        let rlimits = [
            R::Cpu,
            R::Fsize,
            R::Data,
            R::Stack,
            R::Core,
            R::Rss,
            R::Nproc,
            R::Nofile,
            R::Memlock,
            R::As,
            R::Locks,
            R::Sigpending,
            R::Msgqueue,
            R::Nice,
            R::Rtprio,
            R::Rttime,
        ]
        .into_iter()
        .map(|r| rustix::process::getrlimit(r).maximum.unwrap_or(u64::MAX))
        .collect();
        Host {
            lsm: HostLsm::detect(),
            rlimits,
            loginuid: read("/proc/self/loginuid").and_then(|s| s.trim().parse().ok()),
            oom_score_adj: read("/proc/self/oom_score_adj")
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
            wmem_max: num("/proc/sys/net/core/wmem_max").unwrap_or(212_992),
            rmem_max: num("/proc/sys/net/core/rmem_max").unwrap_or(212_992),
            tcp_wmem_max: third("/proc/sys/net/ipv4/tcp_wmem").unwrap_or(4 << 20),
            tcp_rmem_max: third("/proc/sys/net/ipv4/tcp_rmem").unwrap_or(6 << 20),
        }
    }
}

/// What an accepted checkpoint held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub tasks: usize,
    pub threads: usize,
    pub files_read: usize,
}

/// Why a checkpoint is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the checkpoint's CRIU images cannot be checked against the container's spec: {0}; \
         nothing was changed — take the checkpoint again"
    )]
    Unreadable(#[from] ImageError),
    #[error("the container's spec cannot bound the checkpoint: {0}; nothing was changed")]
    Spec(String),
    #[error(
        "the checkpoint has no {0}, which CRIU needs to restore it; nothing was changed — take \
         the checkpoint again"
    )]
    Incomplete(String),
    #[error("{}", exceeds(.0))]
    Exceeds(Vec<Finding>),
    #[error("{}", not_modeled(.0))]
    NotModeled(Vec<Finding>),
}

fn not_modeled(findings: &[Finding]) -> String {
    let mut s = String::from(
        "the checkpoint holds CRIU images or fields that gpusnap's model of what CRIU applies \
         on restore does not accept (what it does not know is refused): ",
    );
    s.push_str(&shown(findings));
    s.push_str(
        ". Nothing was changed. Take the checkpoint again without it (docs/security.md lists \
         every image type and field the restore accepts, and why)",
    );
    s
}

fn shown(findings: &[Finding]) -> String {
    const SHOWN: usize = 6;
    let shown: Vec<String> = findings
        .iter()
        .take(SHOWN)
        .map(Finding::to_string)
        .collect();
    let mut s = shown.join("; ");
    if findings.len() > SHOWN {
        s.push_str(&format!(" (and {} more)", findings.len() - SHOWN));
    }
    s
}

fn exceeds(findings: &[Finding]) -> String {
    let mut s = String::from(
        "the checkpoint's CRIU images give its processes more than the spec of the container \
         being restored allows: ",
    );
    s.push_str(&shown(findings));
    s.push_str(
        ". Nothing was changed. Restore it into a container whose spec grants this (user, \
         capabilities, no_new_privs, seccomp, LSM label, namespaces, mounts), or take the \
         checkpoint again from the container as it is specified",
    );
    s
}

/// Checks the CRIU images in `checkpoint_dir` against `spec`, on this node.
pub fn bound_by_spec(checkpoint_dir: &Path, spec: &Spec) -> Result<Report, Refusal> {
    bound_by_spec_host(checkpoint_dir, spec, &Host::detect(), Limits::default())
}

/// [`bound_by_spec`] for a given LSM and reader limits (the rest of [`Host`] detected).
pub fn bound_by_spec_on(
    checkpoint_dir: &Path,
    spec: &Spec,
    lsm: HostLsm,
    limits: Limits,
) -> Result<Report, Refusal> {
    let host = Host {
        lsm,
        ..Host::detect()
    };
    bound_by_spec_host(checkpoint_dir, spec, &host, limits)
}

/// [`bound_by_spec`] for a given node and runtime, and reader limits.
pub fn bound_by_spec_host(
    checkpoint_dir: &Path,
    spec: &Spec,
    host: &Host,
    limits: Limits,
) -> Result<Report, Refusal> {
    let bound = Bound::of(spec, host.lsm)?;
    let mut dir = ImageDir::open(checkpoint_dir, limits).map_err(|source| {
        Refusal::Unreadable(ImageError::Open {
            name: checkpoint_dir.display().to_string(),
            source,
        })
    })?;
    let mut unmodeled = Vec::new();
    let listing = crate::allowlist::walk_dir(&mut dir, &mut unmodeled)?;
    if !unmodeled.is_empty() {
        return Err(Refusal::NotModeled(unmodeled));
    }
    let mut check = Check {
        bound: &bound,
        host,
        findings: Vec::new(),
        compared: std::collections::HashMap::new(),
        cg_sets: Vec::new(),
        net_ns: BTreeSet::new(),
        root_cg_set: None,
        criu_ns: Default::default(),
        tree: Tree::default(),
    };
    let (tasks, threads) = check.tasks(&mut dir)?;
    let cut = cut_short(&listing, &check.tree);
    if !cut.is_empty() {
        return Err(Refusal::NotModeled(cut));
    }
    check.cgroups(&mut dir)?;
    check.files(&mut dir, &listing)?;
    check.tmpfs(&mut dir, &listing)?;
    check.netns(&mut dir, &listing)?;
    check.apparmor(&mut dir)?;
    if check.findings.is_empty() {
        Ok(Report {
            tasks,
            threads,
            files_read: dir.files_read(),
        })
    } else {
        Err(Refusal::Exceeds(check.findings))
    }
}

// ----- the spec, as a bound --------------------------------------------------------------

const MS_RDONLY: u32 = 1;
const MS_NOSUID: u32 = 2;
const MS_NODEV: u32 = 4;
const MS_NOEXEC: u32 = 8;

/// CRIU's `fstype` codes (mnt.proto).
mod fs {
    pub const UNSUPPORTED: u32 = 0;
    pub const PROC: u32 = 1;
    pub const SYSFS: u32 = 2;
    pub const DEVTMPFS: u32 = 3;
    pub const BINFMT_MISC: u32 = 4;
    pub const TMPFS: u32 = 5;
    pub const DEVPTS: u32 = 6;
    pub const CGROUP: u32 = 12;
    pub const MQUEUE: u32 = 14;
    pub const AUTO: u32 = 16;
    pub const CGROUP2: u32 = 23;

    /// Filesystems that take no device or path as their source: what a container with
    /// `CAP_SYS_ADMIN` could mount itself.
    pub const PSEUDO: [u32; 7] = [PROC, SYSFS, TMPFS, DEVPTS, CGROUP, MQUEUE, CGROUP2];

    /// The codes an OCI mount `type` appears as (a cgroup v1 mount is a tmpfs with cgroup
    /// mounts beneath it).
    pub fn codes(typ: &str) -> &'static [u32] {
        match typ {
            "proc" => &[PROC],
            "sysfs" => &[SYSFS],
            "tmpfs" | "shm" => &[TMPFS],
            "devpts" => &[DEVPTS],
            "mqueue" => &[MQUEUE],
            "cgroup" => &[CGROUP, CGROUP2, TMPFS],
            "cgroup2" => &[CGROUP2],
            "devtmpfs" => &[DEVTMPFS],
            "binfmt_misc" => &[BINFMT_MISC],
            _ => &[],
        }
    }

    pub fn name(code: u32) -> String {
        match code {
            UNSUPPORTED => "an unsupported (device-backed) filesystem".into(),
            PROC => "proc".into(),
            SYSFS => "sysfs".into(),
            DEVTMPFS => "devtmpfs".into(),
            BINFMT_MISC => "binfmt_misc".into(),
            TMPFS => "tmpfs".into(),
            DEVPTS => "devpts".into(),
            CGROUP => "cgroup".into(),
            MQUEUE => "mqueue".into(),
            AUTO => "a filesystem named by the image (auto)".into(),
            CGROUP2 => "cgroup2".into(),
            other => format!("filesystem type {other}"),
        }
    }
}

struct SpecMount {
    dest: String,
    typ: String,
    bind: bool,
    /// `MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC` as its options ask.
    flags: u32,
}

struct Bound {
    bnd: u64,
    /// With `noNewPrivileges`, what any process of the container can ever hold: the spec's
    /// permitted set for uid 0 (execve intersects root's new set with the old permitted one);
    /// for another uid the ambient set (all execve leaves a non-root process, and runc's
    /// execve of the container's process comes after it set the uid). Without it, the
    /// bounding set (a setuid-root program gets it).
    held: u64,
    /// Everything a process of the container could ever hold: the bounding set and the sets
    /// the spec gives explicitly (runc sets them even where they exceed the bounding set).
    any: u64,
    nnp: bool,
    uid: u32,
    gid: u32,
    gids: BTreeSet<u32>,
    /// The spec's seccomp profile, when it sets one.
    seccomp: Option<crate::seccomp::Profile>,
    lsm: HostLsm,
    apparmor: Option<String>,
    selinux: Option<String>,
    /// The spec's namespaces by OCI type, and whether the container joins an existing one
    /// (a `path`) rather than getting a new one.
    namespaces: std::collections::BTreeMap<String, bool>,
    uid_map: Vec<(u32, u32, u32)>,
    gid_map: Vec<(u32, u32, u32)>,
    mounts: Vec<SpecMount>,
    masked: BTreeSet<String>,
    readonly: BTreeSet<String>,
    root_readonly: bool,
    terminal: bool,
    /// The spec's hard resource limits by OCI name (`RLIMIT_NOFILE`).
    rlimits: std::collections::BTreeMap<String, u64>,
    oom_score_adj: Option<i32>,
    /// The spec's `linux.sysctl`.
    sysctl: std::collections::BTreeMap<String, String>,
    /// The spec's devices (path, type, major, minor) and runc's defaults.
    devices: Vec<(String, char, i64, i64)>,
}

fn cap_mask(set: &Option<oci_spec::runtime::Capabilities>) -> u64 {
    set.iter()
        .flatten()
        .filter_map(|c| serde_json::to_value(c).ok())
        .filter_map(|v| v.as_str().and_then(caps::bit))
        .fold(0, |a, b| a | b)
}

fn mount_flags(options: &[String]) -> u32 {
    options.iter().fold(0, |f, o| {
        f | match o.as_str() {
            "ro" => MS_RDONLY,
            "nosuid" => MS_NOSUID,
            "nodev" => MS_NODEV,
            "noexec" => MS_NOEXEC,
            _ => 0,
        }
    })
}

fn flag_names(flags: u32) -> String {
    let names: Vec<&str> = [
        (MS_RDONLY, "ro"),
        (MS_NOSUID, "nosuid"),
        (MS_NODEV, "nodev"),
        (MS_NOEXEC, "noexec"),
    ]
    .iter()
    .filter(|(f, _)| flags & f != 0)
    .map(|(_, n)| *n)
    .collect();
    names.join(",")
}

/// `/a//b/` → `/a/b`; `None` for a relative path or one with `.` or `..` components.
fn normalize(path: &[u8]) -> Option<String> {
    let s = String::from_utf8_lossy(path);
    if !s.starts_with('/') {
        return None;
    }
    let mut out = String::new();
    for part in s.split('/').filter(|p| !p.is_empty()) {
        if part == "." || part == ".." {
            return None;
        }
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

fn label(value: &Option<String>) -> Option<String> {
    value.as_ref().filter(|v| !v.is_empty()).cloned()
}

impl Bound {
    fn of(spec: &Spec, lsm: HostLsm) -> Result<Bound, Refusal> {
        let process = spec
            .process()
            .as_ref()
            .ok_or_else(|| Refusal::Spec("it has no process".into()))?;
        let caps = process.capabilities().as_ref();
        let set = |f: fn(&oci_spec::runtime::LinuxCapabilities) -> &Option<_>| {
            caps.map_or(0, |c| cap_mask(f(c)))
        };
        let bnd = set(|c| c.bounding());
        let prm = set(|c| c.permitted());
        let amb = set(|c| c.ambient());
        let any = bnd | prm | set(|c| c.effective()) | set(|c| c.inheritable()) | amb;
        let nnp = process.no_new_privileges().unwrap_or(false);
        let held = match (nnp, process.user().uid()) {
            (false, _) => bnd,
            (true, 0) => prm,
            (true, _) => amb & prm,
        };
        let user = process.user();
        let mut gids: BTreeSet<u32> = user.additional_gids().iter().flatten().copied().collect();
        gids.insert(user.gid());
        let linux = spec.linux().as_ref();
        let namespaces = linux
            .and_then(|l| l.namespaces().as_ref())
            .into_iter()
            .flatten()
            .filter_map(|n| {
                let typ = serde_json::to_value(n.typ()).ok()?.as_str()?.to_owned();
                Some((typ, n.path().is_some()))
            })
            .collect();
        let map = |m: Option<&Vec<oci_spec::runtime::LinuxIdMapping>>| {
            let mut v: Vec<(u32, u32, u32)> = m
                .into_iter()
                .flatten()
                .map(|m| (m.container_id(), m.host_id(), m.size()))
                .collect();
            v.sort_unstable();
            v
        };
        let paths = |p: Option<&Vec<String>>| {
            p.into_iter()
                .flatten()
                .filter_map(|p| normalize(p.as_bytes()))
                .collect::<BTreeSet<_>>()
        };
        let mounts = spec
            .mounts()
            .iter()
            .flatten()
            .filter_map(|m| {
                let options = m.options().clone().unwrap_or_default();
                let typ = m.typ().clone().unwrap_or_default();
                Some(SpecMount {
                    dest: normalize(m.destination().as_os_str().as_encoded_bytes())?,
                    bind: typ == "bind" || options.iter().any(|o| o == "bind" || o == "rbind"),
                    flags: mount_flags(&options),
                    typ,
                })
            })
            .collect();
        Ok(Bound {
            bnd,
            held,
            any,
            nnp,
            uid: user.uid(),
            gid: user.gid(),
            gids,
            seccomp: linux
                .and_then(|l| l.seccomp().as_ref())
                .map(crate::seccomp::Profile::of),
            lsm,
            apparmor: label(process.apparmor_profile()).filter(|p| p != "unconfined"),
            selinux: label(process.selinux_label()),
            namespaces,
            uid_map: map(linux.and_then(|l| l.uid_mappings().as_ref())),
            gid_map: map(linux.and_then(|l| l.gid_mappings().as_ref())),
            mounts,
            masked: paths(linux.and_then(|l| l.masked_paths().as_ref())),
            readonly: paths(linux.and_then(|l| l.readonly_paths().as_ref())),
            root_readonly: spec
                .root()
                .as_ref()
                .is_some_and(|r| r.readonly().unwrap_or(false)),
            terminal: process.terminal().unwrap_or(false),
            rlimits: process
                .rlimits()
                .iter()
                .flatten()
                .filter_map(|r| {
                    let name = serde_json::to_value(r.typ()).ok()?.as_str()?.to_owned();
                    Some((name, r.hard()))
                })
                .collect(),
            oom_score_adj: process.oom_score_adj(),
            sysctl: linux
                .and_then(|l| l.sysctl().clone())
                .map(|m| m.into_iter().collect())
                .unwrap_or_default(),
            devices: tmpfs::devices(linux),
        })
    }

    /// Whether a process of the container could ever hold `cap` ([`Bound::held`]): in the
    /// bounding set (execve of a setuid or file-capability program grants it), or with
    /// `noNewPrivileges` only what execve left the container's process (no execve adds to it
    /// then, and capset only removes).
    fn may(&self, cap: u64) -> bool {
        self.held & cap != 0
    }

    /// The set that denies `cap` in [`Bound::may`], for messages.
    fn may_set(&self, cap: u64) -> &'static str {
        if self.bnd & cap == 0 {
            "bounding set"
        } else if self.uid == 0 {
            "permitted set (which noNewPrivileges keeps every process of it within)"
        } else {
            "ambient set (all a process of a non-root user keeps across execve, and \
             noNewPrivileges keeps it within that)"
        }
    }

    fn has_ns(&self, typ: &str) -> bool {
        self.namespaces.contains_key(typ)
    }

    /// The spec gives the container a new namespace of this type (not one to join by path).
    fn new_ns(&self, typ: &str) -> bool {
        self.namespaces.get(typ) == Some(&false)
    }
}

// ----- the images, against the bound -------------------------------------------------------

struct Check<'a> {
    bound: &'a Bound,
    host: &'a Host,
    findings: Vec<Finding>,
    /// The cgroup sets tasks and threads are in: (task, file, field, set id).
    cg_sets: Vec<(u32, String, &'static str, u32)>,
    /// The network namespaces of the tasks.
    net_ns: BTreeSet<u32>,
    /// CRIU's own cgroup set at the dump (`inventory.img`).
    root_cg_set: Option<u32>,
    /// CRIU's own namespaces (`inventory.img`'s `root_ids`).
    criu_ns: TaskKobjIdsEntry,
    /// Filters of `seccomp.img` already compared with the spec's profile, by index (threads
    /// share them): `Err` says how the filter is weaker.
    compared: std::collections::HashMap<u32, Result<(), String>>,
    /// The tasks (pids) and threads (tids) of `pstree.img`.
    tree: Tree,
}

/// The tasks and threads a process tree holds.
#[derive(Debug, Default)]
struct Tree {
    pids: BTreeSet<u64>,
    tids: BTreeSet<u64>,
}

/// Per-task and per-thread images of tasks and threads `tree` does not hold. A process tree
/// cut short at an entry boundary (or with a thread left out of a task's list) is still a
/// well-formed `pstree.img`; the images of what it lost give it away, since CRIU dumps a core
/// image for every thread and an ids image for every task. CRIU would restore without them:
/// not the checkpoint that was taken.
fn cut_short(listing: &crate::allowlist::Listing, tree: &Tree) -> Vec<Finding> {
    let mut found = Vec::new();
    for (id, of, held) in [
        ("CORE", "thread", &tree.tids),
        ("IDS", "task", &tree.pids),
        ("CREDS", "task", &tree.pids),
    ] {
        for (name, n) in listing.of(id) {
            if !held.contains(&n) {
                found.push(Finding {
                    task: None,
                    file: name.into(),
                    field: of.into(),
                    detail: format!(
                        "{n} is not in pstree.img: the process tree was cut short, and CRIU \
                         would restore without it"
                    ),
                });
            }
        }
    }
    found
}

/// Namespace types CRIU creates for the root task when its id differs from CRIU's own, with
/// their OCI names.
type NsId = fn(&TaskKobjIdsEntry) -> Option<u32>;

const OWN_NAMESPACES: [(&str, NsId); 5] = [
    ("pid", |i| i.pid_ns_id),
    ("network", |i| i.net_ns_id),
    ("ipc", |i| i.ipc_ns_id),
    ("uts", |i| i.uts_ns_id),
    ("mount", |i| i.mnt_ns_id),
];

impl Check<'_> {
    fn find(&mut self, task: Option<u32>, file: &str, field: &str, detail: String) {
        self.findings.push(Finding {
            task,
            file: file.into(),
            field: field.into(),
            detail,
        });
    }

    /// Every task and thread of `pstree.img`; returns (tasks, threads).
    fn tasks(&mut self, dir: &mut ImageDir) -> Result<(usize, usize), Refusal> {
        let inventory: InventoryEntry = dir
            .read_one("inventory.img", Kind::Inventory)?
            .ok_or_else(|| missing("inventory.img"))?;
        let pstree: Vec<PstreeEntry> = dir
            .read("pstree.img", Kind::Pstree)?
            .ok_or_else(|| missing("pstree.img"))?;
        if pstree.is_empty() {
            return Err(missing("a task in pstree.img"));
        }
        let root_ids = inventory.root_ids.unwrap_or_default();
        self.criu_ns = root_ids;
        self.root_cg_set = inventory.root_cg_set;
        let mut seccomp: Option<SeccompEntry> = None;
        let mut threads = 0;
        let mut root_mnt_ns = None;
        for task in &pstree {
            self.tree.pids.insert(task.pid.into());
            self.tree.tids.insert(task.pid.into());
            self.tree
                .tids
                .extend(task.threads.iter().map(|t| u64::from(*t)));
        }
        for (index, task) in pstree.iter().enumerate() {
            let pid = task.pid;
            let ids_file = format!("ids-{pid}.img");
            let ids: Option<TaskKobjIdsEntry> = dir.read_one(&ids_file, Kind::Ids)?;
            match &ids {
                Some(ids) => {
                    self.net_ns.insert(ids.net_ns_id.unwrap_or(0));
                    self.namespaces(dir, pid, &ids_file, ids, &root_ids, index == 0)?;
                    if index == 0 {
                        root_mnt_ns = Some(ids.mnt_ns_id.unwrap_or(0));
                    }
                }
                // CRIU refuses a root task without ids; others share their parent's.
                None if index == 0 => return Err(missing(&ids_file)),
                None => {}
            }

            let creds_file = format!("creds-{pid}.img");
            let legacy: Option<CredsEntry> = dir.read_one(&creds_file, Kind::Creds)?;
            if let Some(c) = &legacy {
                self.creds(pid, &creds_file, c);
            }

            let mut tids: Vec<u32> = vec![pid];
            tids.extend(task.threads.iter().filter(|t| **t != pid));
            for tid in tids {
                threads += 1;
                let core_file = format!("core-{tid}.img");
                let core: CoreEntry = dir
                    .read_one(&core_file, Kind::Core)?
                    .ok_or_else(|| missing(&core_file))?;
                // A zombie's core has no thread state: CRIU restores it only to exit, and
                // none of its credentials are set.
                if tid == pid && core.tc.as_ref().map(|t| t.task_state) == Some(TASK_DEAD) {
                    break;
                }
                if tid == pid {
                    self.task_state(pid, &core_file, &core, self.host);
                    if let Some(set) = core.tc.as_ref().and_then(|t| t.cg_set) {
                        self.cg_sets
                            .push((pid, core_file.clone(), "tc.cg_set", set));
                    }
                }
                if let Some(t) = &core.thread_core {
                    self.thread_state(pid, &core_file, t);
                    if let Some(set) = t.cg_set {
                        self.cg_sets
                            .push((pid, core_file.clone(), "thread_core.cg_set", set));
                    }
                }
                let Some(thread) = &core.thread_core else {
                    self.find(
                        Some(pid),
                        &core_file,
                        "thread_core",
                        "is missing: CRIU would leave the thread with CRIU's own credentials \
                         (root, every capability)"
                            .into(),
                    );
                    continue;
                };
                match (&thread.creds, &legacy) {
                    (Some(c), _) => self.creds(pid, &core_file, c),
                    (None, Some(_)) if tid == pid => {}
                    (None, _) => self.find(
                        Some(pid),
                        &core_file,
                        "creds",
                        format!(
                            "are missing (and {creds_file} does not hold them for the main \
                             thread): CRIU would not set the thread's credentials"
                        ),
                    ),
                }
                // Old images keep the mode per task; CRIU moves it onto the thread.
                let tc = core.tc.as_ref();
                let mode = tc
                    .and_then(|t| t.old_seccomp_mode)
                    .or(thread.seccomp_mode)
                    .unwrap_or(0);
                let filter = tc
                    .and_then(|t| t.old_seccomp_filter)
                    .or(thread.seccomp_filter)
                    .unwrap_or(0);
                if self.bound.seccomp.is_some() {
                    if seccomp.is_none() && mode == SECCOMP_MODE_FILTER {
                        seccomp = Some(
                            dir.read_one("seccomp.img", Kind::Seccomp)?
                                .unwrap_or_default(),
                        );
                    }
                    self.seccomp(pid, &core_file, mode, filter, seccomp.as_ref());
                }
            }
        }
        if let Some(root_mnt) = root_mnt_ns {
            self.mounts(dir, root_mnt)?;
        }
        Ok((pstree.len(), threads))
    }

    fn creds(&mut self, pid: u32, file: &str, c: &CredsEntry) {
        let b = self.bound;
        let task = Some(pid);
        let sets = [
            ("cap_inh", &c.cap_inh),
            ("cap_prm", &c.cap_prm),
            ("cap_eff", &c.cap_eff),
            ("cap_amb", &c.cap_amb),
        ];
        for (field, words) in sets {
            let mask = caps::from_words(words);
            let extra = mask & !b.any;
            if extra != 0 {
                self.find(
                    task,
                    file,
                    field,
                    format!(
                        "holds {}, which the container spec's bounding set does not (spec \
                         {:#x}, image {mask:#x})",
                        caps::names(extra),
                        b.any
                    ),
                );
            } else if b.nnp && field != "cap_inh" && mask & !b.held != 0 {
                let which = if b.uid == 0 {
                    "the spec's permitted set, which no_new_privs keeps any process of the \
                     container within"
                } else {
                    "the spec's ambient set: a process of a non-root user keeps only its ambient \
                     capabilities across runc's execve, and no_new_privs keeps it within them"
                };
                self.find(
                    task,
                    file,
                    field,
                    format!(
                        "holds {}, outside {which} (spec {:#x}, image {mask:#x})",
                        caps::names(mask & !b.held),
                        b.held
                    ),
                );
            }
        }
        let bnd = caps::from_words(&c.cap_bnd);
        if bnd & !b.bnd != 0 {
            self.find(
                task,
                file,
                "cap_bnd",
                format!(
                    "holds {}, which the container spec's bounding set does not (spec {:#x}, \
                     image {bnd:#x})",
                    caps::names(bnd & !b.bnd),
                    b.bnd
                ),
            );
        }

        if !b.may(caps::SETUID) {
            for (field, v) in [
                ("uid", c.uid),
                ("euid", c.euid),
                ("suid", c.suid),
                ("fsuid", c.fsuid),
            ] {
                if v != b.uid {
                    self.find(
                        task,
                        file,
                        field,
                        format!(
                            "is {v}, but the container spec's user is uid {} and its {} \
                             lacks CAP_SETUID (spec {}, image {v})",
                            b.uid,
                            b.may_set(caps::SETUID),
                            b.uid
                        ),
                    );
                }
            }
        }
        if !b.may(caps::SETGID) {
            for (field, v) in [
                ("gid", c.gid),
                ("egid", c.egid),
                ("sgid", c.sgid),
                ("fsgid", c.fsgid),
            ] {
                if v != b.gid {
                    self.find(
                        task,
                        file,
                        field,
                        format!(
                            "is {v}, but the container spec's user is gid {} and its {} \
                             lacks CAP_SETGID (spec {}, image {v})",
                            b.gid,
                            b.may_set(caps::SETGID),
                            b.gid
                        ),
                    );
                }
            }
            let extra: Vec<String> = c
                .groups
                .iter()
                .filter(|g| !b.gids.contains(g))
                .map(u32::to_string)
                .collect();
            if !extra.is_empty() {
                self.find(
                    task,
                    file,
                    "groups",
                    format!(
                        "hold {}, which are neither the spec's gid nor its additionalGids and \
                         its {} lacks CAP_SETGID (spec {:?}, image {:?})",
                        extra.join(", "),
                        b.may_set(caps::SETGID),
                        b.gids,
                        c.groups
                    ),
                );
            }
        }

        const SECBIT_NO_SETUID_FIXUP: u32 = 1 << 2;
        if c.secbits & SECBIT_NO_SETUID_FIXUP != 0 && !b.may(caps::SETPCAP) {
            self.find(
                task,
                file,
                "secbits",
                format!(
                    "set SECBIT_NO_SETUID_FIXUP (capabilities kept across uid changes), which \
                     needs CAP_SETPCAP the container spec's {} lacks (spec 0, image {:#x})",
                    b.may_set(caps::SETPCAP),
                    c.secbits
                ),
            );
        }
        if b.nnp && c.no_new_privs.unwrap_or(0) == 0 {
            self.find(
                task,
                file,
                "no_new_privs",
                format!(
                    "is off, but the container spec sets noNewPrivileges (spec true, image {})",
                    c.no_new_privs.map_or("absent".into(), |v| v.to_string())
                ),
            );
        }
        self.lsm(pid, file, c);
    }

    fn lsm(&mut self, pid: u32, file: &str, c: &CredsEntry) {
        let shown = |v: &Option<Vec<u8>>| {
            v.as_ref().map_or("none".to_string(), |v| {
                format!("{:?}", String::from_utf8_lossy(v))
            })
        };
        let same = |v: &Option<Vec<u8>>, want: &str| v.as_deref() == Some(want.as_bytes());
        let (which, want) = match self.bound.lsm {
            HostLsm::AppArmor => ("apparmorProfile", &self.bound.apparmor),
            HostLsm::SeLinux => ("selinuxLabel", &self.bound.selinux),
            HostLsm::None => return,
        };
        let Some(want) = want else { return };
        if !same(&c.lsm_profile, want) {
            self.find(
                Some(pid),
                file,
                "lsm_profile",
                format!(
                    "is not the container spec's {which} (spec {want:?}, image {}): CRIU would \
                     restore the task under the image's label",
                    shown(&c.lsm_profile)
                ),
            );
        }
        if self.bound.lsm == HostLsm::SeLinux
            && c.lsm_sockcreate.is_some()
            && !same(&c.lsm_sockcreate, want)
        {
            self.find(
                Some(pid),
                file,
                "lsm_sockcreate",
                format!(
                    "labels new sockets with another context than the spec's selinuxLabel \
                     (spec {want:?}, image {})",
                    shown(&c.lsm_sockcreate)
                ),
            );
        }
    }

    fn seccomp(
        &mut self,
        pid: u32,
        file: &str,
        mode: i32,
        filter: u32,
        image: Option<&SeccompEntry>,
    ) {
        match mode {
            SECCOMP_MODE_STRICT => {}
            SECCOMP_MODE_FILTER => match chain(image, filter) {
                Err(why) => self.find(
                    Some(pid),
                    file,
                    "seccomp_filter",
                    format!("does not lead to a usable filter in seccomp.img: {why}"),
                ),
                Ok(indexes) => {
                    if let Err(why) = self.as_strict(image, &indexes) {
                        self.find(
                            Some(pid),
                            file,
                            "seccomp_filter",
                            format!(
                                "leads to a filter chain in seccomp.img none of whose \
                                 filters is as strict as the container spec's seccomp profile: \
                                 {why}"
                            ),
                        );
                    }
                }
            },
            other => self.find(
                Some(pid),
                file,
                "seccomp_mode",
                format!(
                    "is {} where the container spec sets a seccomp profile (spec filter, \
                     image {})",
                    seccomp_mode_name(other),
                    seccomp_mode_name(other)
                ),
            ),
        }
    }

    /// Some filter of the chain (`indexes`, newest first) is, alone, at least as strict as
    /// the spec's profile. The kernel runs every filter of a chain and takes the strictest
    /// outcome, so the chain then is too; runc installs the spec's profile as one filter, and
    /// filters the workload stacked on it only restrict further.
    fn as_strict(&mut self, image: Option<&SeccompEntry>, indexes: &[u32]) -> Result<(), String> {
        let Some(profile) = &self.bound.seccomp else {
            return Ok(());
        };
        if !crate::seccomp::supported() {
            // Documented: filter content is compared on x86-64 and arm64 nodes only.
            return Ok(());
        }
        let filters = image.map_or(&[][..], |e| &e.seccomp_filters[..]);
        let mut first_why = None;
        // Oldest first: runc's is the oldest in an honest chain.
        for &i in indexes.iter().rev() {
            let result = self
                .compared
                .entry(i)
                .or_insert_with(|| {
                    crate::seccomp::at_least_as_strict(&filters[i as usize].filter, profile)
                        .map_err(|w| w.what)
                })
                .clone();
            match result {
                Ok(()) => return Ok(()),
                Err(why) => {
                    first_why.get_or_insert_with(|| {
                        format!(
                            "filter {i} (the oldest of {} in the thread's chain): {why}",
                            indexes.len()
                        )
                    });
                }
            }
        }
        Err(first_why.unwrap_or_else(|| "the chain is empty".into()))
    }

    fn namespaces(
        &mut self,
        dir: &mut ImageDir,
        pid: u32,
        file: &str,
        ids: &TaskKobjIdsEntry,
        root_ids: &TaskKobjIdsEntry,
        root_task: bool,
    ) -> Result<(), Refusal> {
        let task = Some(pid);
        for (typ, get) in OWN_NAMESPACES {
            let (mine, criu) = (get(ids).unwrap_or(0), get(root_ids).unwrap_or(0));
            // A namespace joined by path (a pod's network, ipc, uts) is one runc has CRIU
            // join, and CRIU records it as its own; only a new one must not be.
            if self.bound.new_ns(typ) && mine == criu {
                self.find(
                    task,
                    file,
                    &format!("{typ} namespace"),
                    format!(
                        "is CRIU's own (id {mine}, as inventory.img's root_ids): CRIU would \
                         restore the task in the node's {typ} namespace, where the container \
                         spec gives the container its own"
                    ),
                );
            }
        }
        let (mine, criu) = (
            ids.user_ns_id.unwrap_or(0),
            root_ids.user_ns_id.unwrap_or(0),
        );
        if !self.bound.has_ns("user") {
            if mine != criu {
                self.find(
                    task,
                    file,
                    "user namespace",
                    format!(
                        "is a new one (id {mine}, CRIU's is {criu}): CRIU would create it and \
                         write its uid/gid maps as root, but the container spec has no user \
                         namespace"
                    ),
                );
            }
            return Ok(());
        }
        if !self.bound.new_ns("user") {
            // Joined by path: CRIU creates none and writes no maps.
            return Ok(());
        }
        if mine == criu {
            self.find(
                task,
                file,
                "user namespace",
                format!(
                    "is CRIU's own (id {mine}): CRIU would restore the task in the node's user \
                     namespace, where the container spec gives it its own"
                ),
            );
            return Ok(());
        }
        if !root_task {
            return Ok(());
        }
        let userns_file = format!("userns-{mine}.img");
        let Some(userns) = dir.read_one::<UsernsEntry>(&userns_file, Kind::Userns)? else {
            return Err(missing(&userns_file));
        };
        let map = |m: &[UidGidExtent]| {
            let mut v: Vec<(u32, u32, u32)> = m
                .iter()
                .map(|e| (e.first, e.lower_first, e.count))
                .collect();
            v.sort_unstable();
            v
        };
        for (field, image, spec) in [
            ("uid_map", map(&userns.uid_map), &self.bound.uid_map),
            ("gid_map", map(&userns.gid_map), &self.bound.gid_map),
        ] {
            if &image != spec {
                self.find(
                    task,
                    &userns_file,
                    field,
                    format!(
                        "is not the container spec's mapping (spec {spec:?}, image {image:?}, \
                         as container id, host id, size)"
                    ),
                );
            }
        }
        Ok(())
    }

    /// Every `mountpoints-<ns>.img`: the container's mount namespace (`root_mnt`) and any
    /// other the workload made.
    fn mounts(&mut self, dir: &mut ImageDir, root_mnt: u32) -> Result<(), Refusal> {
        let names = dir.names().map_err(|source| ImageError::Read {
            name: dir.path().display().to_string(),
            source,
        })?;
        for name in names {
            let Some(ns) = name
                .strip_prefix("mountpoints-")
                .and_then(|n| n.strip_suffix(".img"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let entries: Vec<MntEntry> = dir.read(&name, Kind::Mountpoints)?.unwrap_or_default();
            let own = ns == root_mnt;
            let sysadmin = self.bound.may(caps::SYS_ADMIN);
            if !own && !sysadmin {
                self.find(
                    None,
                    &name,
                    "mount namespace",
                    format!(
                        "{ns} is not the container's ({root_mnt}): only a process with \
                         CAP_SYS_ADMIN makes one, which the container spec's {} lacks",
                        self.bound.may_set(caps::SYS_ADMIN)
                    ),
                );
                continue;
            }
            let ids: BTreeSet<u32> = entries.iter().map(|e| e.mnt_id).collect();
            for e in &entries {
                let ns_root = !ids.contains(&e.parent_mnt_id);
                if let Err(why) = self.mount(e, ns_root, own, sysadmin) {
                    self.find(None, &name, "mountpoint", why);
                }
                if !(ns_root && own) {
                    if let Err(why) = self.mount_root(e, &entries) {
                        self.find(None, &name, "root", why);
                    }
                }
                if let Err(why) = propagation(e, &entries) {
                    self.find(None, &name, "master_id", why);
                }
            }
        }
        Ok(())
    }

    fn mount(&self, e: &MntEntry, ns_root: bool, own: bool, sysadmin: bool) -> Result<(), String> {
        let b = self.bound;
        let raw = String::from_utf8_lossy(&e.mountpoint).into_owned();
        let path = normalize(&e.mountpoint)
            .ok_or_else(|| format!("{raw:?} is not a plain absolute path"))?;
        let flags = e.flags | e.sb_flags.unwrap_or(0);
        let missing_flags = |want: u32| -> Result<(), String> {
            let lost = want & !flags;
            if lost == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{path} is mounted without {} that the container spec gives it (spec {}, \
                     image flags {:#x})",
                    flag_names(lost),
                    flag_names(want),
                    e.flags
                ))
            }
        };
        if ns_root {
            if path != "/" {
                return Err(format!(
                    "{path} is the root of a mount namespace, which CRIU mounts only at /"
                ));
            }
            // CRIU bind-mounts runc's rootfs here; only its flags come from the image.
            return if own && b.root_readonly {
                missing_flags(MS_RDONLY)
            } else {
                Ok(())
            };
        }
        // An external mount's source is what runc maps its key to; the special keys make CRIU
        // mount what the image names instead.
        let ext = match (&e.ext_key, e.ext_mount.unwrap_or(false)) {
            (Some(k), _) if !k.is_empty() => Some(String::from_utf8_lossy(k).into_owned()),
            (_, true) => Some(String::from_utf8_lossy(&e.root).into_owned()),
            _ => None,
        };
        if let Some(k) = &ext {
            if k.starts_with("CRIU:") {
                return Err(format!(
                    "{path} is an external mount with key {k:?}: CRIU would mount a source the \
                     image names, not one runc gives"
                ));
            }
            // A spec bind mount's source keeps the spec's flags wherever the image puts it (runc
            // keys it by the spec's destination, which symlinks in the rootfs may move).
            if let Some(m) = normalize(k.as_bytes())
                .and_then(|k| b.mounts.iter().find(|m| m.dest == k && m.bind))
            {
                return missing_flags(m.flags);
            }
        }
        if let Some(m) = b.mounts.iter().find(|m| m.dest == path) {
            if m.bind {
                return if ext.is_some() {
                    missing_flags(m.flags)
                } else {
                    Err(format!(
                        "{path} is a bind mount in the container spec, but the image mounts {} \
                         there from a source it names",
                        fs::name(e.fstype)
                    ))
                };
            }
            if ext.is_none() && !fs::codes(&m.typ).contains(&e.fstype) {
                return Err(format!(
                    "{path} is {} in the container spec, but {} in the image",
                    m.typ,
                    fs::name(e.fstype)
                ));
            }
            // runc mounts a cgroup v1 tree as a writable tmpfs with read-only cgroup mounts
            // beneath it.
            let want = if m.typ == "cgroup" && e.fstype == fs::TMPFS {
                m.flags & !MS_RDONLY
            } else {
                m.flags
            };
            return missing_flags(want);
        }
        let under_cgroup = b.mounts.iter().find(|m| {
            (m.typ == "cgroup" || m.typ == "cgroup2") && path.starts_with(&format!("{}/", m.dest))
        });
        if let Some(m) = under_cgroup {
            // runc's cgroup v1 mounts beneath the tree, with the spec's flags: a writable one
            // would let the container change its own limits or a release agent.
            return if [fs::CGROUP, fs::CGROUP2].contains(&e.fstype) {
                missing_flags(m.flags)
            } else {
                Err(format!(
                    "{path} is beneath the spec's cgroup mount but is {}",
                    fs::name(e.fstype)
                ))
            };
        }
        if b.masked.contains(&path) {
            // runc masks a directory with a read-only tmpfs and a file with /dev/null, an
            // external bind mount.
            return if ext.is_some() || e.fstype == fs::TMPFS {
                if ext.is_none() {
                    missing_flags(MS_RDONLY)
                } else {
                    Ok(())
                }
            } else {
                Err(format!(
                    "{path} is masked in the container spec, but the image mounts {} there",
                    fs::name(e.fstype)
                ))
            };
        }
        if b.readonly.contains(&path) {
            return missing_flags(MS_RDONLY);
        }
        if path == "/dev/console" && b.terminal && e.fstype == fs::DEVPTS {
            return Ok(());
        }
        if sysadmin && ext.is_none() && fs::PSEUDO.contains(&e.fstype) {
            // The container could mount this itself.
            return Ok(());
        }
        if ext.is_some() {
            return Err(format!(
                "{path} is an external mount the container spec does not have"
            ));
        }
        Err(format!(
            "{path} ({}) is not a mount of the container spec (its mounts, masked or read-only \
             paths)",
            fs::name(e.fstype)
        ))
    }

    /// The path CRIU bind-mounts from. For a mount that is not external, CRIU takes a mount
    /// of the image with the same device (`root_dev`) whose root is a prefix of this one's as
    /// the bind source, and mounts `<that mount in CRIU's yard>/<the rest of root>`, walking
    /// the path as root with symlinks followed (`criu/mount.c`, `do_bind_mount`). So a root of
    /// `/` binds a mount of the container onto another (its own content), and any other root
    /// is accepted only as runc makes one: a read-only or masked path of the spec that is a
    /// bind of the container's own proc or sysfs mount onto itself (`/proc/sys` with root
    /// `/sys`), whose components are plain names (procfs and sysfs have no symlink on those
    /// paths; tmpfs content comes from the image, so no tmpfs root is accepted), or, with a
    /// terminal, the pty of the container's own devpts runc binds over `/dev/console`.
    fn mount_root(&self, e: &MntEntry, all: &[MntEntry]) -> Result<(), String> {
        let ext = e.ext_key.as_ref().is_some_and(|k| !k.is_empty()) || e.ext_mount == Some(true);
        if ext {
            // runc hands CRIU the source of an external mount; the root is not used.
            return Ok(());
        }
        if e.root == b"/" {
            return Ok(());
        }
        let shown = String::from_utf8_lossy(&e.root).escape_debug().to_string();
        let mountpoint = normalize(&e.mountpoint).unwrap_or_default();
        let plain = e.root.starts_with(b"/")
            && e.root[1..]
                .split(|c| *c == b'/')
                .all(|p| !p.is_empty() && p != b"." && p != b"..");
        if !plain {
            return Err(format!(
                "of {mountpoint} is {shown:?}, not a plain absolute path: CRIU would bind-mount \
                 a path outside the mount it binds from"
            ));
        }
        let b = self.bound;
        // runc's console: the pty it allocated (`/<n>` of the container's own devpts)
        // bind-mounted over /dev/console. devpts holds device nodes by number, no symlink.
        let console = e.fstype == fs::DEVPTS
            && b.terminal
            && mountpoint == "/dev/console"
            && e.root.len() > 1
            && e.root[1..].iter().all(u8::is_ascii_digit);
        if console {
            let own_devpts = all.iter().any(|s| {
                s.mnt_id != e.mnt_id
                    && s.root_dev == e.root_dev
                    && s.fstype == fs::DEVPTS
                    && s.root == b"/"
            });
            return if own_devpts {
                Ok(())
            } else {
                Err(format!(
                    "of /dev/console is {shown:?}, a pseudo-terminal of no devpts mount of the \
                     container"
                ))
            };
        }
        if ![fs::PROC, fs::SYSFS].contains(&e.fstype)
            || !(b.readonly.contains(&mountpoint) || b.masked.contains(&mountpoint))
        {
            return Err(format!(
                "of {mountpoint} is {shown:?}: CRIU would bind-mount that path of another mount \
                 (with symlinks followed); runc makes such a bind only of proc or sysfs onto a \
                 read-only or masked path of the spec"
            ));
        }
        let onto_itself = all.iter().any(|s| {
            s.mnt_id != e.mnt_id
                && s.root_dev == e.root_dev
                && s.fstype == e.fstype
                && s.root == b"/"
                && normalize(&s.mountpoint).is_some_and(|p| {
                    let joined = if p == "/" {
                        shown.clone()
                    } else {
                        format!("{p}{shown}")
                    };
                    joined == mountpoint
                })
        });
        if onto_itself {
            Ok(())
        } else {
            Err(format!(
                "of {mountpoint} is {shown:?}, which is not a bind of the container's own {} \
                 mount onto itself",
                fs::name(e.fstype)
            ))
        }
    }

    fn apparmor(&mut self, dir: &mut ImageDir) -> Result<(), Refusal> {
        let entries: Vec<ApparmorEntry> = dir
            .read("apparmor.img", Kind::Apparmor)?
            .unwrap_or_default();
        let namespaces: usize = entries.iter().map(|e| e.namespaces.len()).sum();
        if namespaces > 0 {
            self.find(
                None,
                "apparmor.img",
                "namespaces",
                format!(
                    "hold {namespaces} AppArmor namespace(s) whose policies CRIU would load \
                     into the node's kernel; a container spec never grants that (spec none, \
                     image {namespaces})"
                ),
            );
        }
        Ok(())
    }
}

/// A mount receives propagation only from a peer group of the image's own mounts: CRIU
/// refuses an external master unless told to, and gpusnap does not tell it.
fn propagation(e: &MntEntry, all: &[MntEntry]) -> Result<(), String> {
    let Some(master) = e.master_id.filter(|m| *m != 0) else {
        return Ok(());
    };
    if all
        .iter()
        .any(|o| o.mnt_id != e.mnt_id && o.shared_id == Some(master))
    {
        return Ok(());
    }
    Err(format!(
        "of {} is peer group {master}, which no mount of the image shares: propagation from a \
         mount outside the checkpoint",
        String::from_utf8_lossy(&e.mountpoint).escape_debug()
    ))
}

const TASK_DEAD: u32 = 2;
const SECCOMP_MODE_STRICT: i32 = 1;
const SECCOMP_MODE_FILTER: i32 = 2;

fn seccomp_mode_name(mode: i32) -> String {
    match mode {
        0 => "disabled".into(),
        1 => "strict".into(),
        2 => "filter".into(),
        other => format!("{other} (unknown)"),
    }
}

/// The filter chain from `index` back to the first filter (its indexes, newest first): every
/// filter a non-empty, whole number of BPF instructions, every `prev` a filter of the image,
/// no loop.
fn chain(image: Option<&SeccompEntry>, index: u32) -> Result<Vec<u32>, String> {
    const BPF_INSN: usize = 8;
    let filters = image.map_or(&[][..], |e| &e.seccomp_filters[..]);
    let mut at = Some(index);
    let mut indexes = Vec::new();
    while let Some(i) = at {
        let f = filters.get(i as usize).ok_or_else(|| {
            format!(
                "filter {i} does not exist (the image holds {})",
                filters.len()
            )
        })?;
        if f.filter.is_empty() || f.filter.len() % BPF_INSN != 0 {
            return Err(format!(
                "filter {i} is {} bytes, not a BPF program",
                f.filter.len()
            ));
        }
        indexes.push(i);
        if indexes.len() > filters.len() {
            return Err("the chain loops".into());
        }
        at = f.prev;
    }
    Ok(indexes)
}

fn missing(what: &str) -> Refusal {
    Refusal::Incomplete(what.into())
}
