//! What a container's OCI runtime spec grants its processes, recorded at seal and compared at
//! restore.
//!
//! Under `restore.signature_policy = require` the spec of the container a checkpoint is
//! restored into must grant nothing beyond what the dumped container's spec granted: on
//! `ctr containers restore` and Podman's import that spec comes from the checkpoint itself,
//! so a replaced spec blob could otherwise widen `linux.resources.devices` to `a *:* rwm`, add a
//! bind of a host directory or a hook that runs on the host. The seal records the
//! privilege-relevant fields of the bundle's `config.json` ([`SpecGrants::of`]); the manifest
//! holding them is what the node signs. [`SpecGrants::excess`] then names every field of the
//! restore target's spec that grants more; a narrower spec passes.
//!
//! | field | the restore target's spec may |
//! |---|---|
//! | `process.user` | have the same uid and gid, and a subset of the additional gids |
//! | `process.capabilities` | hold a subset of each set |
//! | `process.noNewPrivileges` | not clear it |
//! | `process.rlimits` | set the same types, each no higher |
//! | `process.apparmorProfile`, `selinuxLabel`, `linux.mountLabel` | keep them |
//! | `root.readonly` | not clear it |
//! | `mounts` | mount only at a recorded destination, with the same type, no flag dropped (`ro`, `nosuid`, `nodev`, `noexec`), the same data options, no shared propagation added, and the same source — but for the identifiers in it ([`relocation`]) |
//! | `hooks` | run only recorded hooks |
//! | `linux.namespaces` | keep every namespace; join one by path only where the record joined one, and never one of the node's own |
//! | `linux.uidMappings`, `gidMappings` | keep them |
//! | `linux.devices` | create only recorded device nodes |
//! | `linux.resources.devices` | allow no device access the record does not |
//! | `linux.seccomp` | keep the recorded profile |
//! | `linux.maskedPaths`, `readonlyPaths` | keep every path |
//! | `linux.sysctl` | set only recorded keys to their recorded values |
//! | `linux.rootfsPropagation` | not make it shared |
//! | annotation `org.criu.config` | name the recorded CRIU configuration file, or none |
//!
//! Not compared: resource limits other than devices, the cgroup path (each container has its
//! own), the process's arguments, environment and working directory (CRIU restores the
//! process), hostname.
//!
//! runc reads `config.json` with Go's `encoding/json`, which matches object keys without regard
//! to case; serde does not. A key serde would skip but runc would apply (`"Devices"`) is
//! refused before anything is compared ([`check_spelling`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{
    Hook, Hooks, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, LinuxIdMapping, LinuxNamespace,
    LinuxNamespaceType, Mount, PosixRlimit, Spec,
};
use serde::{Deserialize, Serialize};

/// The annotation runc reads CRIU's configuration file from.
pub const CRIU_CONFIG_ANNOTATION: &str = "org.criu.config";

/// The five capability sets, each sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilitySets {
    pub bounding: Vec<String>,
    pub effective: Vec<String>,
    pub inheritable: Vec<String>,
    pub permitted: Vec<String>,
    pub ambient: Vec<String>,
}

/// `process.user`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserGrant {
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub additional_gids: Vec<u32>,
}

/// The privilege-relevant fields of a runtime spec (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecGrants {
    pub user: UserGrant,
    pub capabilities: CapabilitySets,
    pub no_new_privileges: bool,
    #[serde(default)]
    pub rlimits: Vec<PosixRlimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apparmor_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selinux_label: Option<String>,
    pub root_readonly: bool,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Hooks>,
    #[serde(default)]
    pub namespaces: Vec<LinuxNamespace>,
    #[serde(default)]
    pub uid_mappings: Vec<LinuxIdMapping>,
    #[serde(default)]
    pub gid_mappings: Vec<LinuxIdMapping>,
    #[serde(default)]
    pub devices: Vec<LinuxDevice>,
    /// `linux.resources.devices`, in order.
    #[serde(default)]
    pub device_cgroup: Vec<LinuxDeviceCgroup>,
    /// `linux.seccomp` as written (compared whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<serde_json::Value>,
    #[serde(default)]
    pub masked_paths: Vec<String>,
    #[serde(default)]
    pub readonly_paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_label: Option<String>,
    #[serde(default)]
    pub sysctl: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_propagation: Option<String>,
    /// The `org.criu.config` annotation: runc hands CRIU that file, which may name action
    /// scripts CRIU runs as root on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criu_config: Option<String>,
}

/// What the comparison needs to know of the node the container is restored on.
pub trait NodeFacts {
    /// Whether the namespace file `path` is one of the node's own (pid 1's) namespaces of that
    /// type.
    fn host_namespace(&self, typ: LinuxNamespaceType, path: &Path) -> bool;
    /// Whether `path` and every directory above it belong to root, none writable by others
    /// (a sticky directory such as `/tmp` aside, below which the next one belongs to root):
    /// a file a container runtime made, which no other user could have planted or replaced.
    fn runtime_owned(&self, path: &Path) -> bool;
}

/// One field of a restore target's spec that grants more than the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excess {
    /// The spec field, as the runtime spec names it (`linux.resources.devices`).
    pub field: &'static str,
    /// What it grants beyond the record.
    pub detail: String,
}

impl std::fmt::Display for Excess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// Why a spec could not be read for this comparison.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("not a runtime spec runc would read the same way: {0}")]
    Spelling(#[source] SpellingError),
    #[error("not a valid runtime spec: {0}")]
    Invalid(String),
}

fn caps(set: &Option<oci_spec::runtime::Capabilities>) -> Vec<String> {
    let mut v: Vec<String> = set
        .iter()
        .flatten()
        .map(|c| {
            serde_json::to_value(c)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("{c:?}"))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

impl SpecGrants {
    /// Reads `config.json`'s bytes: refuses keys runc would read differently from serde
    /// ([`check_spelling`]), then records the grants.
    pub fn from_json(bytes: &[u8]) -> Result<SpecGrants, SpecError> {
        let raw: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| SpecError::Invalid(e.to_string()))?;
        check_spelling(&raw).map_err(SpecError::Spelling)?;
        let spec: Spec =
            serde_json::from_value(raw.clone()).map_err(|e| SpecError::Invalid(e.to_string()))?;
        let seccomp = raw.pointer("/linux/seccomp").cloned();
        Ok(SpecGrants::of(&spec, seccomp))
    }

    /// The grants of `spec`; `seccomp` is its `linux.seccomp` object as written.
    pub fn of(spec: &Spec, seccomp: Option<serde_json::Value>) -> SpecGrants {
        let process = spec.process().as_ref();
        let linux = spec.linux().as_ref();
        let user = process.map(|p| p.user());
        let capabilities = process.and_then(|p| p.capabilities().as_ref());
        let mut rlimits: Vec<PosixRlimit> = process
            .and_then(|p| p.rlimits().clone())
            .unwrap_or_default();
        rlimits.sort_by_key(|r| format!("{:?}", r.typ()));
        let mut additional_gids = user
            .and_then(|u| u.additional_gids().clone())
            .unwrap_or_default();
        additional_gids.sort_unstable();
        additional_gids.dedup();
        SpecGrants {
            user: UserGrant {
                uid: user.map_or(0, |u| u.uid()),
                gid: user.map_or(0, |u| u.gid()),
                additional_gids,
            },
            capabilities: CapabilitySets {
                bounding: caps(capabilities.map_or(&None, |c| c.bounding())),
                effective: caps(capabilities.map_or(&None, |c| c.effective())),
                inheritable: caps(capabilities.map_or(&None, |c| c.inheritable())),
                permitted: caps(capabilities.map_or(&None, |c| c.permitted())),
                ambient: caps(capabilities.map_or(&None, |c| c.ambient())),
            },
            no_new_privileges: process.and_then(|p| p.no_new_privileges()) == Some(true),
            rlimits,
            apparmor_profile: process
                .and_then(|p| p.apparmor_profile().clone())
                .filter(|s| !s.is_empty()),
            selinux_label: process
                .and_then(|p| p.selinux_label().clone())
                .filter(|s| !s.is_empty()),
            root_readonly: spec.root().as_ref().and_then(|r| r.readonly()) == Some(true),
            mounts: spec.mounts().clone().unwrap_or_default(),
            hooks: spec.hooks().clone(),
            namespaces: linux
                .and_then(|l| l.namespaces().clone())
                .unwrap_or_default(),
            uid_mappings: linux
                .and_then(|l| l.uid_mappings().clone())
                .unwrap_or_default(),
            gid_mappings: linux
                .and_then(|l| l.gid_mappings().clone())
                .unwrap_or_default(),
            devices: linux.and_then(|l| l.devices().clone()).unwrap_or_default(),
            device_cgroup: linux
                .and_then(|l| l.resources().as_ref())
                .and_then(|r| r.devices().clone())
                .unwrap_or_default(),
            seccomp: seccomp.filter(|v| !v.is_null()),
            masked_paths: linux
                .and_then(|l| l.masked_paths().clone())
                .unwrap_or_default(),
            readonly_paths: linux
                .and_then(|l| l.readonly_paths().clone())
                .unwrap_or_default(),
            mount_label: linux
                .and_then(|l| l.mount_label().clone())
                .filter(|s| !s.is_empty()),
            sysctl: linux
                .and_then(|l| l.sysctl().clone())
                .unwrap_or_default()
                .into_iter()
                .collect(),
            rootfs_propagation: linux
                .and_then(|l| l.rootfs_propagation().clone())
                .filter(|s| !s.is_empty()),
            criu_config: spec
                .annotations()
                .as_ref()
                .and_then(|a| a.get(CRIU_CONFIG_ANNOTATION).cloned()),
        }
    }

    /// Every field in which `target` (the spec of the container being restored) grants more
    /// than `self` (the record), with what `node` says of the node's own files.
    pub fn excess(&self, target: &SpecGrants, node: &dyn NodeFacts) -> Vec<Excess> {
        let mut out = Vec::new();
        let mut push = |field: &'static str, detail: String| out.push(Excess { field, detail });

        if target.user.uid != self.user.uid || target.user.gid != self.user.gid {
            push(
                "process.user",
                format!(
                    "uid:gid {}:{} where the signed spec has {}:{}",
                    target.user.uid, target.user.gid, self.user.uid, self.user.gid
                ),
            );
        }
        let extra: Vec<u32> = target
            .user
            .additional_gids
            .iter()
            .filter(|g| !self.user.additional_gids.contains(g))
            .copied()
            .collect();
        if !extra.is_empty() {
            push(
                "process.user.additionalGids",
                format!("{extra:?}, which the signed spec does not give"),
            );
        }
        for (field, t, s) in [
            (
                "process.capabilities.bounding",
                &target.capabilities.bounding,
                &self.capabilities.bounding,
            ),
            (
                "process.capabilities.effective",
                &target.capabilities.effective,
                &self.capabilities.effective,
            ),
            (
                "process.capabilities.inheritable",
                &target.capabilities.inheritable,
                &self.capabilities.inheritable,
            ),
            (
                "process.capabilities.permitted",
                &target.capabilities.permitted,
                &self.capabilities.permitted,
            ),
            (
                "process.capabilities.ambient",
                &target.capabilities.ambient,
                &self.capabilities.ambient,
            ),
        ] {
            let more: Vec<&str> = t
                .iter()
                .filter(|c| !s.contains(c))
                .map(String::as_str)
                .collect();
            if !more.is_empty() {
                push(
                    field,
                    format!("{}, which the signed spec does not give", more.join(", ")),
                );
            }
        }
        if self.no_new_privileges && !target.no_new_privileges {
            push(
                "process.noNewPrivileges",
                "not set, where the signed spec sets it".into(),
            );
        }
        rlimit_excess(&self.rlimits, &target.rlimits, &mut push);
        for (field, t, s) in [
            (
                "process.apparmorProfile",
                &target.apparmor_profile,
                &self.apparmor_profile,
            ),
            (
                "process.selinuxLabel",
                &target.selinux_label,
                &self.selinux_label,
            ),
            ("linux.mountLabel", &target.mount_label, &self.mount_label),
        ] {
            if s.is_some() && t != s {
                push(field, format!("{t:?}, where the signed spec has {s:?}"));
            }
        }
        if self.root_readonly && !target.root_readonly {
            push(
                "root.readonly",
                "not set, where the signed spec sets it".into(),
            );
        }
        let mut relocated = Vec::new();
        for m in &target.mounts {
            if let Some(why) = mount_excess(m, &self.mounts, node, &mut relocated) {
                push("mounts", why);
            }
        }
        if let Some(why) = relocation_excess(&relocated) {
            push("mounts", why);
        }
        hook_excess(self.hooks.as_ref(), target.hooks.as_ref(), &mut push);
        namespace_excess(&self.namespaces, &target.namespaces, node, &mut push);
        if !target.uid_mappings.is_empty() || !self.uid_mappings.is_empty() {
            let new_userns = |g: &SpecGrants| {
                g.namespaces
                    .iter()
                    .any(|n| n.typ() == LinuxNamespaceType::User && n.path().is_none())
            };
            // A user namespace the record did not have is narrower; one it had keeps its maps.
            if new_userns(self)
                && (target.uid_mappings != self.uid_mappings
                    || target.gid_mappings != self.gid_mappings)
            {
                push(
                    "linux.uidMappings",
                    "the user namespace's id mappings differ from the signed spec's".into(),
                );
            }
        }
        for d in &target.devices {
            if !self.devices.contains(d) {
                push(
                    "linux.devices",
                    format!(
                        "{} ({} {}:{}), which the signed spec does not create",
                        d.path().display(),
                        d.typ().as_str(),
                        d.major(),
                        d.minor()
                    ),
                );
            }
        }
        if let Some(why) = device_cgroup_excess(&self.device_cgroup, &target.device_cgroup) {
            push("linux.resources.devices", why);
        }
        if self.seccomp.is_some() && target.seccomp != self.seccomp {
            push(
                "linux.seccomp",
                if target.seccomp.is_none() {
                    "none, where the signed spec has a profile".into()
                } else {
                    "a profile other than the signed spec's".into()
                },
            );
        }
        for (field, t, s) in [
            (
                "linux.maskedPaths",
                &target.masked_paths,
                &self.masked_paths,
            ),
            (
                "linux.readonlyPaths",
                &target.readonly_paths,
                &self.readonly_paths,
            ),
        ] {
            let dropped: Vec<&str> = s
                .iter()
                .filter(|p| !t.contains(p))
                .map(String::as_str)
                .collect();
            if !dropped.is_empty() {
                push(
                    field,
                    format!(
                        "{} left out, which the signed spec lists",
                        dropped.join(", ")
                    ),
                );
            }
        }
        for (k, v) in &target.sysctl {
            if self.sysctl.get(k) != Some(v) {
                push(
                    "linux.sysctl",
                    format!("{k}={v}, which the signed spec does not set"),
                );
            }
        }
        let shared = |p: &Option<String>| p.as_deref().is_some_and(|p| p.contains("shared"));
        if shared(&target.rootfs_propagation) && !shared(&self.rootfs_propagation) {
            push(
                "linux.rootfsPropagation",
                format!(
                    "{:?}, where the signed spec has {:?}",
                    target.rootfs_propagation, self.rootfs_propagation
                ),
            );
        }
        if target.criu_config.is_some() && target.criu_config != self.criu_config {
            push(
                "annotations.org.criu.config",
                format!(
                    "{:?}, where the signed spec has {:?}",
                    target.criu_config, self.criu_config
                ),
            );
        }
        out
    }
}

fn rlimit_excess(
    signed: &[PosixRlimit],
    target: &[PosixRlimit],
    push: &mut dyn FnMut(&'static str, String),
) {
    let name = |r: &PosixRlimit| {
        serde_json::to_value(r.typ())
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{:?}", r.typ()))
    };
    for t in target {
        match signed.iter().find(|s| s.typ() == t.typ()) {
            None => push(
                "process.rlimits",
                format!(
                    "{} {}:{}, which the signed spec does not set",
                    name(t),
                    t.soft(),
                    t.hard()
                ),
            ),
            Some(s) if t.soft() > s.soft() || t.hard() > s.hard() => push(
                "process.rlimits",
                format!(
                    "{} {}:{}, above the signed spec's {}:{}",
                    name(t),
                    t.soft(),
                    t.hard(),
                    s.soft(),
                    s.hard()
                ),
            ),
            Some(_) => {}
        }
    }
    for s in signed {
        if !target.iter().any(|t| t.typ() == s.typ()) {
            push(
                "process.rlimits",
                format!(
                    "{} not set, where the signed spec limits it to {}:{}",
                    name(s),
                    s.soft(),
                    s.hard()
                ),
            );
        }
    }
}

/// A path as runc compares destinations: `.` components and repeated or trailing slashes
/// ignored.
fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// The flags a mount's options leave in force, in order (later options override earlier).
#[derive(Debug, Default, PartialEq, Eq)]
struct MountFlags {
    ro: bool,
    nosuid: bool,
    nodev: bool,
    noexec: bool,
    nosymfollow: bool,
    bind: bool,
    recursive: bool,
    shared: bool,
    /// Options that are not flags (`mode=1777`, `size=64m`, `newinstance`, ...).
    data: BTreeSet<String>,
}

fn flags_of(m: &Mount) -> MountFlags {
    let mut f = MountFlags {
        bind: m.typ().as_deref() == Some("bind"),
        ..MountFlags::default()
    };
    for o in m.options().iter().flatten() {
        // runc's recursive variants (`rro`, `rnosuid`, ...) set the flag on every submount.
        let o = match o.as_str() {
            "rro" | "rrw" | "rnosuid" | "rsuid" | "rnodev" | "rdev" | "rnoexec" | "rexec"
            | "rnosymfollow" | "rsymfollow" => &o[1..],
            other => other,
        };
        match o {
            "ro" => f.ro = true,
            "rw" => f.ro = false,
            "nosuid" => f.nosuid = true,
            "suid" => f.nosuid = false,
            "nodev" => f.nodev = true,
            "dev" => f.nodev = false,
            "noexec" => f.noexec = true,
            "exec" => f.noexec = false,
            "nosymfollow" => f.nosymfollow = true,
            "symfollow" => f.nosymfollow = false,
            "bind" => f.bind = true,
            "rbind" => {
                f.bind = true;
                f.recursive = true;
            }
            "shared" | "rshared" => f.shared = true,
            "private" | "rprivate" | "slave" | "rslave" | "unbindable" | "runbindable" => {}
            // Flags that only narrow or only concern times.
            "relatime" | "norelatime" | "strictatime" | "nostrictatime" | "noatime" | "atime"
            | "nodiratime" | "diratime" | "sync" | "async" | "dirsync" | "lazytime"
            | "nolazytime" | "mand" | "nomand" | "defaults" => {}
            other => {
                f.data.insert(other.to_owned());
            }
        }
    }
    f
}

/// Source-less filesystems: their `source` is a name, not something of the node.
const PSEUDO_FS: &[&str] = &[
    "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "shm",
];

/// Whether a path component is an identifier a runtime or the kubelet generates per pod or
/// container: a container or sandbox id (hex, 8 digits or more), a pod UID (a UUID), or a
/// generated name (`kube-api-access-7xk2p`: a name, `-`, five letters or digits). Returns the
/// part that must stay the same (empty for an id, the name's stem for a generated name).
fn id_shape(c: &str) -> Option<&str> {
    let hex = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if c.len() >= 8 && hex(c) {
        return Some("");
    }
    let groups: Vec<&str> = c.split('-').collect();
    if groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]) && groups.iter().all(|g| hex(g)) {
        return Some("");
    }
    let (stem, suffix) = c.rsplit_once('-')?;
    (!stem.is_empty()
        && suffix.len() == 5
        && suffix
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()))
    .then_some(stem)
}

/// The directories under which container runtimes and the kubelet keep the files they make
/// per pod and per container and bind into it: containerd's CRI plugin
/// (`<root>/io.containerd.grpc.v1.cri/sandboxes/<id>/hosts`, `<state>/…/<id>/shm`),
/// containers/storage (CRI-O, Podman: `…/overlay-containers/<id>/userdata/hosts`), the
/// kubelet (`…/pods/<pod UID>/volumes/…`).
pub const RUNTIME_DIRS: &[&str] = &["io.containerd.grpc.v1.cri", "overlay-containers", "pods"];

/// How a bind source of the restore target (`target`) is a relocation of the recorded one
/// (`signed`), or `None`. A restore into a new pod, on this node or another, binds the new pod's
/// files — `/etc/hosts` from its sandbox's directory, its `/dev/shm`, its service account
/// token — at the same places under a runtime's directory ([`RUNTIME_DIRS`]), named by the new
/// pod's and container's identifiers, under that runtime's root on this node. So a relocation
/// keeps the path below the runtime's directory but for identifiers ([`id_shape`]), and may put
/// it under another root; the pairs returned (the recorded root and identifiers, what replaces
/// each) must be consistent across the whole spec. Whether the target is the runtime's own
/// file is for [`NodeFacts::runtime_owned`].
pub fn relocation(signed: &Path, target: &Path) -> Option<Vec<(String, String)>> {
    let (s, t) = (clean(signed), clean(target));
    let (sc, tc): (Vec<_>, Vec<_>) = (s.iter().collect(), t.iter().collect());
    let marker = |c: &[&std::ffi::OsStr]| {
        c.iter()
            .rposition(|x| x.to_str().is_some_and(|x| RUNTIME_DIRS.contains(&x)))
    };
    let (ms, mt) = (marker(&sc)?, marker(&tc)?);
    if sc[ms] != tc[mt] || sc.len() - ms != tc.len() - mt {
        return None;
    }
    let join = |c: &[&std::ffi::OsStr]| c.iter().collect::<PathBuf>().display().to_string();
    let mut pairs = Vec::new();
    let (sroot, troot) = (join(&sc[..=ms]), join(&tc[..=mt]));
    if sroot != troot {
        pairs.push((sroot, troot));
    }
    for (a, b) in sc[ms + 1..].iter().zip(&tc[mt + 1..]) {
        if a == b {
            continue;
        }
        let (a, b) = (a.to_str()?, b.to_str()?);
        match (id_shape(a), id_shape(b)) {
            (Some(x), Some(y)) if x == y => pairs.push((a.to_owned(), b.to_owned())),
            _ => return None,
        }
    }
    Some(pairs)
}

/// Why the target mount `t` is not within some signed mount, if it is not; the identifiers its
/// source relocates are added to `relocated`.
fn mount_excess(
    t: &Mount,
    signed: &[Mount],
    node: &dyn NodeFacts,
    relocated: &mut Vec<(String, String)>,
) -> Option<String> {
    let dest = clean(t.destination());
    let tf = flags_of(t);
    let candidates: Vec<&Mount> = signed
        .iter()
        .filter(|s| clean(s.destination()) == dest)
        .collect();
    if candidates.is_empty() {
        return Some(format!(
            "{} ({} from {}), which the signed spec does not mount",
            dest.display(),
            t.typ().as_deref().unwrap_or("bind"),
            t.source().as_deref().unwrap_or(Path::new("")).display()
        ));
    }
    let mut why = String::new();
    for s in candidates {
        let sf = flags_of(s);
        let reason = if tf.bind != sf.bind || (!tf.bind && t.typ() != s.typ()) {
            Some(format!(
                "type {:?}{}, where the signed spec has {:?}{}",
                t.typ(),
                if tf.bind { " (bind)" } else { "" },
                s.typ(),
                if sf.bind { " (bind)" } else { "" }
            ))
        } else if tf.recursive && !sf.recursive {
            Some("a recursive bind, where the signed spec binds one mount".into())
        } else if let Some(flag) = [
            ("ro", sf.ro && !tf.ro),
            ("nosuid", sf.nosuid && !tf.nosuid),
            ("nodev", sf.nodev && !tf.nodev),
            ("noexec", sf.noexec && !tf.noexec),
            ("nosymfollow", sf.nosymfollow && !tf.nosymfollow),
        ]
        .iter()
        .find(|(_, dropped)| *dropped)
        {
            Some(format!("without {}, which the signed spec sets", flag.0))
        } else if tf.shared && !sf.shared {
            Some("shared propagation, which the signed spec does not set".into())
        } else if tf.data != sf.data {
            Some(format!(
                "options {:?}, where the signed spec has {:?}",
                tf.data, sf.data
            ))
        } else if t.uid_mappings() != s.uid_mappings() || t.gid_mappings() != s.gid_mappings() {
            Some("id mappings other than the signed spec's".into())
        } else if let Some(pairs) = source_within(t, s, tf.bind, node) {
            relocated.extend(pairs);
            None
        } else {
            Some(format!(
                "source {}, where the signed spec has {}",
                t.source().as_deref().unwrap_or(Path::new("")).display(),
                s.source().as_deref().unwrap_or(Path::new("")).display()
            ))
        };
        match reason {
            None => return None,
            Some(r) => why = r,
        }
    }
    Some(format!("{}: {why}", dest.display()))
}

/// The identifiers `t`'s source relocates from `s`'s, when it is within it.
fn source_within(
    t: &Mount,
    s: &Mount,
    bind: bool,
    node: &dyn NodeFacts,
) -> Option<Vec<(String, String)>> {
    let (ts, ss) = (t.source().as_deref(), s.source().as_deref());
    if !bind && PSEUDO_FS.contains(&t.typ().as_deref().unwrap_or("")) {
        return Some(Vec::new());
    }
    match (ts, ss) {
        (None, None) => Some(Vec::new()),
        (Some(a), Some(b)) if clean(a) == clean(b) => Some(Vec::new()),
        (Some(a), Some(b)) if bind => relocation(b, a).filter(|_| node.runtime_owned(a)),
        _ => None,
    }
}

/// Each recorded identifier replaced by one identifier, and no two by the same: a spec that
/// binds one pod's files in one place and another's in the next is refused.
fn relocation_excess(pairs: &[(String, String)]) -> Option<String> {
    let mut forward: BTreeMap<&str, &str> = BTreeMap::new();
    let mut backward: BTreeMap<&str, &str> = BTreeMap::new();
    for (a, b) in pairs {
        if let Some(prev) = forward.insert(a, b).filter(|p| p != b) {
            return Some(format!(
                "binds files of {prev} and of {b} where the signed spec binds files of {a}"
            ));
        }
        if let Some(prev) = backward.insert(b, a).filter(|p| p != a) {
            return Some(format!(
                "binds files of {b} where the signed spec binds files of {prev} and of {a}"
            ));
        }
    }
    None
}

fn hook_excess(
    signed: Option<&Hooks>,
    target: Option<&Hooks>,
    push: &mut dyn FnMut(&'static str, String),
) {
    let Some(target) = target else {
        return;
    };
    #[allow(deprecated)]
    let lists = |h: Option<&Hooks>| -> [(&'static str, Vec<Hook>); 6] {
        let get = |v: Option<&Option<Vec<Hook>>>| v.cloned().flatten().unwrap_or_default();
        [
            ("hooks.prestart", get(h.map(|h| h.prestart()))),
            ("hooks.createRuntime", get(h.map(|h| h.create_runtime()))),
            (
                "hooks.createContainer",
                get(h.map(|h| h.create_container())),
            ),
            ("hooks.startContainer", get(h.map(|h| h.start_container()))),
            ("hooks.poststart", get(h.map(|h| h.poststart()))),
            ("hooks.poststop", get(h.map(|h| h.poststop()))),
        ]
    };
    for ((field, t), (_, s)) in lists(Some(target)).into_iter().zip(lists(signed)) {
        for hook in t {
            let same = |x: &Hook| {
                x.path() == hook.path() && x.args() == hook.args() && x.env() == hook.env()
            };
            if !s.iter().any(same) {
                push(
                    field,
                    format!(
                        "runs {}, which the signed spec does not",
                        hook.path().display()
                    ),
                );
            }
        }
    }
}

fn namespace_excess(
    signed: &[LinuxNamespace],
    target: &[LinuxNamespace],
    node: &dyn NodeFacts,
    push: &mut dyn FnMut(&'static str, String),
) {
    let name = |t: LinuxNamespaceType| t.to_string();
    for s in signed {
        match target.iter().find(|t| t.typ() == s.typ()) {
            None => push(
                "linux.namespaces",
                format!(
                    "no {} namespace (the node's is shared), where the signed spec has one",
                    name(s.typ())
                ),
            ),
            Some(t) => match (t.path(), s.path()) {
                (None, _) => {}
                (Some(p), None) => push(
                    "linux.namespaces",
                    format!(
                        "joins the {} namespace {}, where the signed spec creates a new one",
                        name(t.typ()),
                        p.display()
                    ),
                ),
                (Some(p), Some(_)) if node.host_namespace(t.typ(), p) => push(
                    "linux.namespaces",
                    format!(
                        "joins {}, the node's own {} namespace",
                        p.display(),
                        name(t.typ())
                    ),
                ),
                (Some(_), Some(_)) => {}
            },
        }
    }
    for t in target {
        if let Some(p) = t.path() {
            if !signed.iter().any(|s| s.typ() == t.typ()) {
                push(
                    "linux.namespaces",
                    format!(
                        "joins the {} namespace {}, which the signed spec does not",
                        name(t.typ()),
                        p.display()
                    ),
                );
            }
        }
    }
}

/// A device cgroup rule's match: type (`a` for all), major and minor (`None` for all).
fn matches(r: &LinuxDeviceCgroup, typ: LinuxDeviceType, major: i64, minor: i64) -> bool {
    let t = r.typ().unwrap_or(LinuxDeviceType::A);
    (t == LinuxDeviceType::A || t == typ)
        && r.major().is_none_or(|m| m == -1 || m == major)
        && r.minor().is_none_or(|m| m == -1 || m == minor)
}

fn grants(r: &LinuxDeviceCgroup, access: char) -> bool {
    r.access()
        .as_deref()
        .is_none_or(|a| a.is_empty() || a.contains(access))
}

/// Whether a rule resets the whole list (`a` with wildcard numbers), as runc's device
/// emulator and the cgroup v1 controller treat it.
fn resets(r: &LinuxDeviceCgroup) -> bool {
    r.typ().unwrap_or(LinuxDeviceType::A) == LinuxDeviceType::A
        && r.major().is_none_or(|m| m == -1)
        && r.minor().is_none_or(|m| m == -1)
}

/// Allowed by `rules`, the last matching rule deciding. `lenient`: a deny rule that does not
/// reset the whole list is ignored — an over-approximation of what the rules allow, used for
/// the restore target (the cgroup v1 semantics of a narrow deny under a wide allow are that it
/// removes nothing).
fn allowed(
    rules: &[LinuxDeviceCgroup],
    typ: LinuxDeviceType,
    major: i64,
    minor: i64,
    access: char,
    lenient: bool,
) -> bool {
    let mut allow = false;
    for r in rules {
        if !matches(r, typ, major, minor) || !grants(r, access) {
            continue;
        }
        if r.allow() {
            allow = true;
        } else if !lenient || resets(r) {
            allow = false;
        }
    }
    allow
}

fn device_cgroup_excess(
    signed: &[LinuxDeviceCgroup],
    target: &[LinuxDeviceCgroup],
) -> Option<String> {
    if signed == target {
        return None;
    }
    // Every class of device the rules can tell apart: each number either rule list names, and
    // one neither names.
    let numbers = |f: fn(&LinuxDeviceCgroup) -> Option<i64>| {
        let mut v: BTreeSet<i64> = signed
            .iter()
            .chain(target)
            .filter_map(f)
            .filter(|n| *n >= 0)
            .collect();
        let fresh = (0..).find(|n| !v.contains(n)).unwrap_or(0);
        v.insert(fresh);
        v
    };
    let majors = numbers(|r| r.major());
    let minors = numbers(|r| r.minor());
    for typ in [LinuxDeviceType::C, LinuxDeviceType::B] {
        for &major in &majors {
            for &minor in &minors {
                for access in ['r', 'w', 'm'] {
                    if allowed(target, typ, major, minor, access, true)
                        && !allowed(signed, typ, major, minor, access, false)
                    {
                        return Some(format!(
                            "allows {access} on {} {major}:{minor}, which the signed spec does not",
                            typ.as_str()
                        ));
                    }
                }
            }
        }
    }
    None
}

/// Every key of the runtime spec (any object) that runc reads into a field.
const SPEC_KEYS: &[&str] = &[
    "ociVersion",
    "root",
    "path",
    "readonly",
    "mounts",
    "destination",
    "source",
    "options",
    "type",
    "uidMappings",
    "gidMappings",
    "process",
    "terminal",
    "consoleSize",
    "height",
    "width",
    "user",
    "uid",
    "gid",
    "umask",
    "additionalGids",
    "username",
    "args",
    "commandLine",
    "env",
    "cwd",
    "capabilities",
    "bounding",
    "effective",
    "inheritable",
    "permitted",
    "ambient",
    "rlimits",
    "soft",
    "hard",
    "noNewPrivileges",
    "apparmorProfile",
    "oomScoreAdj",
    "selinuxLabel",
    "ioPriority",
    "class",
    "priority",
    "scheduler",
    "policy",
    "nice",
    "flags",
    "runtime",
    "deadline",
    "period",
    "execCPUAffinity",
    "initial",
    "final",
    "hostname",
    "domainname",
    "hooks",
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
    "timeout",
    "annotations",
    "linux",
    "namespaces",
    "containerID",
    "hostID",
    "size",
    "timeOffsets",
    "secs",
    "nanosecs",
    "devices",
    "major",
    "minor",
    "fileMode",
    "netDevices",
    "name",
    "cgroupsPath",
    "resources",
    "allow",
    "access",
    "memory",
    "limit",
    "reservation",
    "swap",
    "kernel",
    "kernelTCP",
    "swappiness",
    "disableOOMKiller",
    "useHierarchy",
    "checkBeforeUpdate",
    "cpu",
    "shares",
    "quota",
    "burst",
    "realtimeRuntime",
    "realtimePeriod",
    "cpus",
    "mems",
    "idle",
    "blockIO",
    "weight",
    "leafWeight",
    "weightDevice",
    "throttleReadBpsDevice",
    "throttleWriteBpsDevice",
    "throttleReadIOPSDevice",
    "throttleWriteIOPSDevice",
    "rate",
    "hugepageLimits",
    "pageSize",
    "network",
    "classID",
    "priorities",
    "pids",
    "rdma",
    "hcaHandles",
    "hcaObjects",
    "unified",
    "intelRdt",
    "closID",
    "l3CacheSchema",
    "memBwSchema",
    "schemata",
    "enableCMT",
    "enableMBM",
    "enableMonitoring",
    "personality",
    "domain",
    "sysctl",
    "seccomp",
    "defaultAction",
    "defaultErrnoRet",
    "architectures",
    "listenerPath",
    "listenerMetadata",
    "syscalls",
    "names",
    "action",
    "errnoRet",
    "index",
    "value",
    "valueTwo",
    "op",
    "rootfsPropagation",
    "maskedPaths",
    "readonlyPaths",
    "mountLabel",
    "memoryPolicy",
    "mode",
    "nodes",
    "solaris",
    "windows",
    "vm",
    "zos",
];

/// Objects whose keys are names, not fields: their keys are not checked.
const FREE_FORM: &[&str] = &[
    "annotations",
    "sysctl",
    "unified",
    "rdma",
    "netDevices",
    "timeOffsets",
];

/// How Go's `encoding/json` compares a key with a field name: Unicode simple case folding,
/// which for ASCII names is ASCII case plus the Kelvin sign (K) and the long s (ſ).
fn fold(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{212A}' => 'k',
            '\u{017F}' => 's',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Where runc and serde would read a spec JSON differently ([`check_spelling`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpellingError {
    /// Two keys of one object that runc reads as one field.
    #[error("{at} has both {first:?} and {second:?}, which runc reads as one field")]
    Twice {
        at: String,
        first: String,
        second: String,
    },
    /// A key runc reads as a spec field spelled otherwise (serde skips it).
    #[error(
        "{at}.{key}: runc reads it as {field:?}, which is spelled otherwise in the runtime spec"
    )]
    Case {
        at: String,
        key: String,
        field: String,
    },
}

/// Refuses a spec JSON where runc and serde would read different fields: a key that is not
/// spelled exactly as a spec field but matches one without regard to case (runc reads it,
/// serde skips it), or two keys of one object that match each other so.
pub fn check_spelling(raw: &serde_json::Value) -> Result<(), SpellingError> {
    let known: BTreeMap<String, &str> = SPEC_KEYS.iter().map(|k| (fold(k), *k)).collect();
    fn walk(
        v: &serde_json::Value,
        at: &str,
        known: &BTreeMap<String, &str>,
    ) -> Result<(), SpellingError> {
        match v {
            serde_json::Value::Object(map) => {
                let mut seen: BTreeMap<String, &str> = BTreeMap::new();
                for (k, child) in map {
                    let folded = fold(k);
                    if let Some(other) = seen.insert(folded.clone(), k) {
                        return Err(SpellingError::Twice {
                            at: at.to_owned(),
                            first: other.to_owned(),
                            second: k.clone(),
                        });
                    }
                    if let Some(field) = known.get(&folded) {
                        if field != k {
                            return Err(SpellingError::Case {
                                at: at.to_owned(),
                                key: k.clone(),
                                field: (*field).to_owned(),
                            });
                        }
                    }
                    if !FREE_FORM.contains(&k.as_str()) {
                        walk(child, &format!("{at}.{k}"), known)?;
                    }
                }
                Ok(())
            }
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{at}[{i}]"), known)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    walk(raw, "config.json", &known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A containerd-like spec: default capabilities, a device cgroup list, CRI binds.
    fn spec() -> serde_json::Value {
        json!({
            "ociVersion": "1.1.0",
            "process": {
                "user": {"uid": 0, "gid": 0, "additionalGids": [10]},
                "args": ["sh"], "cwd": "/",
                "capabilities": {
                    "bounding": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                    "effective": ["CAP_CHOWN", "CAP_KILL"],
                    "permitted": ["CAP_CHOWN", "CAP_KILL"]
                },
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
                "noNewPrivileges": true
            },
            "root": {"path": "rootfs", "readonly": false},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc",
                 "options": ["nosuid", "noexec", "nodev"]},
                {"destination": "/etc/hosts", "type": "bind",
                 "source": "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/aaaa0000/hosts",
                 "options": ["rbind", "rprivate", "rw"]},
                {"destination": "/data", "type": "bind", "source": "/srv/data",
                 "options": ["rbind", "ro", "nosuid"]}
            ],
            "linux": {
                "namespaces": [
                    {"type": "pid"}, {"type": "mount"},
                    {"type": "network", "path": "/proc/100/ns/net"}
                ],
                "resources": {"devices": [
                    {"allow": false, "access": "rwm"},
                    {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
                ]},
                "maskedPaths": ["/proc/kcore"],
                "readonlyPaths": ["/proc/sys"],
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64"],
                            "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]}
            },
            "annotations": {"io.kubernetes.cri.sandbox-id": "aaaa0000"}
        })
    }

    fn grants(v: &serde_json::Value) -> SpecGrants {
        SpecGrants::from_json(&serde_json::to_vec(v).unwrap()).unwrap()
    }

    /// The node: pid 1's network namespace is `/proc/1/ns/net`, and everything but `/home` and
    /// `/tmp/evil` is the runtime's.
    struct Node;
    impl NodeFacts for Node {
        fn host_namespace(&self, _: LinuxNamespaceType, path: &Path) -> bool {
            path == Path::new("/proc/1/ns/net")
        }
        fn runtime_owned(&self, path: &Path) -> bool {
            !path.starts_with("/home") && !path.starts_with("/tmp/evil")
        }
    }

    fn excess(signed: &serde_json::Value, target: &serde_json::Value) -> Vec<String> {
        grants(signed)
            .excess(&grants(target), &Node)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn the_same_spec_and_a_new_pod_of_it_grant_nothing_more() {
        let s = spec();
        assert!(excess(&s, &s).is_empty());
        // Another pod: its own sandbox files and network namespace.
        let mut t = s.clone();
        t["mounts"][1]["source"] =
            "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/bbbb1111/hosts".into();
        t["linux"]["namespaces"][2]["path"] = "/proc/200/ns/net".into();
        assert!(excess(&s, &t).is_empty(), "{:?}", excess(&s, &t));
        // Narrower: fewer capabilities, a mount dropped, an extra masked path, read-only.
        let mut n = s.clone();
        n["process"]["capabilities"]["effective"] = json!(["CAP_KILL"]);
        n["mounts"].as_array_mut().unwrap().remove(2);
        n["linux"]["maskedPaths"] = json!(["/proc/kcore", "/proc/keys"]);
        n["root"]["readonly"] = true.into();
        assert!(excess(&s, &n).is_empty(), "{:?}", excess(&s, &n));
        // The record survives the manifest.
        let g = grants(&s);
        let back: SpecGrants = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
        assert_eq!(back, g);
    }

    #[test]
    fn every_wider_field_is_named() {
        let s = spec();
        let case = |edit: &dyn Fn(&mut serde_json::Value), field: &str| {
            let mut t = s.clone();
            edit(&mut t);
            let found = excess(&s, &t);
            assert!(
                found.iter().any(|e| e.starts_with(field)),
                "{field} not named: {found:?}"
            );
        };
        case(
            &|t| t["linux"]["resources"]["devices"] = json!([{"allow": true, "access": "rwm"}]),
            "linux.resources.devices",
        );
        case(
            &|t| {
                t["linux"]["resources"]["devices"]
                    .as_array_mut()
                    .unwrap()
                    .push(
                        json!({"allow": true, "type": "c", "major": 1, "minor": 11, "access": "w"}),
                    )
            },
            "linux.resources.devices",
        );
        case(&|t| t["process"]["user"]["uid"] = 1.into(), "process.user");
        case(
            &|t| t["process"]["user"]["additionalGids"] = json!([10, 0]),
            "process.user.additionalGids",
        );
        case(
            &|t| {
                t["process"]["capabilities"]["bounding"]
                    .as_array_mut()
                    .unwrap()
                    .push("CAP_SYS_ADMIN".into())
            },
            "process.capabilities.bounding",
        );
        case(
            &|t| t["process"]["noNewPrivileges"] = false.into(),
            "process.noNewPrivileges",
        );
        case(
            &|t| t["process"]["rlimits"][0]["hard"] = 20000.into(),
            "process.rlimits",
        );
        case(&|t| t["process"]["rlimits"] = json!([]), "process.rlimits");
        case(
            &|t| {
                t["mounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"destination": "/host", "type": "bind", "source": "/", "options": ["rbind"]}))
            },
            "mounts",
        );
        case(&|t| t["mounts"][2]["source"] = "/etc".into(), "mounts");
        case(
            &|t| t["mounts"][2]["options"] = json!(["rbind", "nosuid"]),
            "mounts",
        );
        case(
            &|t| t["mounts"][1]["source"] = "/var/lib/containerd/io.containerd.grpc.v1.cri".into(),
            "mounts",
        );
        case(
            &|t| t["mounts"][0]["options"] = json!(["nosuid", "noexec"]),
            "mounts",
        );
        case(
            &|t| {
                t["hooks"] =
                    json!({"createRuntime": [{"path": "/bin/sh", "args": ["sh", "-c", "id"]}]})
            },
            "hooks.createRuntime",
        );
        case(
            &|t| {
                t["linux"]["namespaces"].as_array_mut().unwrap().remove(0);
            },
            "linux.namespaces",
        );
        case(
            &|t| t["linux"]["namespaces"][2]["path"] = "/proc/1/ns/net".into(),
            "linux.namespaces",
        );
        case(
            &|t| t["linux"]["namespaces"][0]["path"] = "/proc/1/ns/pid".into(),
            "linux.namespaces",
        );
        case(
            &|t| {
                t["linux"]["devices"] =
                    json!([{"path": "/dev/kmsg", "type": "c", "major": 1, "minor": 11}])
            },
            "linux.devices",
        );
        case(
            &|t| t["linux"]["seccomp"] = serde_json::Value::Null,
            "linux.seccomp",
        );
        case(
            &|t| t["linux"]["seccomp"]["defaultAction"] = "SCMP_ACT_ALLOW".into(),
            "linux.seccomp",
        );
        case(
            &|t| t["linux"]["maskedPaths"] = json!([]),
            "linux.maskedPaths",
        );
        case(
            &|t| t["linux"]["readonlyPaths"] = json!([]),
            "linux.readonlyPaths",
        );
        case(
            &|t| t["linux"]["sysctl"] = json!({"net.ipv4.ip_unprivileged_port_start": "0"}),
            "linux.sysctl",
        );
        case(
            &|t| t["linux"]["rootfsPropagation"] = "rshared".into(),
            "linux.rootfsPropagation",
        );
        case(
            &|t| t["annotations"]["org.criu.config"] = "/tmp/evil.conf".into(),
            "annotations.org.criu.config",
        );
    }

    #[test]
    fn bind_sources_may_differ_only_in_identifiers_and_consistently() {
        let cri = "/tmp/rig/root/io.containerd.grpc.v1.cri/sandboxes";
        let a = "f88e75c6341faed161db17b2033c5fdfa52b933e3b4bb6ec683e340b2b478a1a";
        let b = "b70704ac37f5579309c7adda14c773eb4aa0a62d2eee580604ece0f73b0fd443";
        let rel = |s: &str, t: &str| relocation(Path::new(s), Path::new(t));
        assert_eq!(
            rel(&format!("{cri}/{a}/hosts"), &format!("{cri}/{b}/hosts")),
            Some(vec![(a.to_owned(), b.to_owned())])
        );
        assert!(rel(
            "/var/lib/kubelet/pods/0b9c1f2e-3c4d-4e5f-8a9b-0c1d2e3f4a5b/volumes/kubernetes.io~projected/kube-api-access-7xk2p",
            "/var/lib/kubelet/pods/9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b/volumes/kubernetes.io~projected/kube-api-access-q9zzt",
        )
        .is_some());
        // Another node's containerd root (a rig's temporary one).
        assert_eq!(
            rel(
                &format!("/tmp/rig-0/root/io.containerd.grpc.v1.cri/sandboxes/{a}/hosts"),
                &format!("/tmp/rig-1/root/io.containerd.grpc.v1.cri/sandboxes/{b}/hosts")
            ),
            Some(vec![
                (
                    "/tmp/rig-0/root/io.containerd.grpc.v1.cri".to_owned(),
                    "/tmp/rig-1/root/io.containerd.grpc.v1.cri".to_owned()
                ),
                (a.to_owned(), b.to_owned())
            ])
        );
        for (s, t) in [
            (format!("{cri}/{a}/hosts"), "/etc/shadow".to_owned()),
            (format!("{cri}/{a}/hosts"), format!("{cri}/{b}/hostname")),
            (format!("{cri}/{a}/hosts"), format!("{cri}/{b}")),
            ("/srv/data".to_owned(), "/srv/other".to_owned()),
            (format!("/srv/{a}/data"), format!("/srv/{b}/data")),
            (
                "/var/lib/kubelet/pods/x/volumes/a-7xk2p".to_owned(),
                "/var/lib/kubelet/pods/x/volumes/b-7xk2p".to_owned(),
            ),
        ] {
            assert_eq!(rel(&s, &t), None, "{s} -> {t}");
        }
        // Two binds relocated to two different pods: refused.
        let s = spec();
        let mut signed = s.clone();
        signed["mounts"].as_array_mut().unwrap().push(json!({
            "destination": "/dev/shm", "type": "bind",
            "source": format!("/run/containerd/io.containerd.grpc.v1.cri/sandboxes/{}/shm", "aaaa0000"),
            "options": ["rbind", "rw"]}));
        signed["mounts"][1]["source"] =
            "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/aaaa0000/hosts".into();
        let mut t = signed.clone();
        t["mounts"][1]["source"] =
            "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/bbbb1111/hosts".into();
        t["mounts"][3]["source"] =
            "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/bbbb1111/shm".into();
        assert!(excess(&signed, &t).is_empty(), "{:?}", excess(&signed, &t));
        t["mounts"][3]["source"] =
            "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/cccc2222/shm".into();
        let found = excess(&signed, &t);
        assert!(found[0].contains("binds files of"), "{found:?}");
        // A directory someone else could have made: not the runtime's.
        let mut t = signed.clone();
        t["mounts"][1]["source"] =
            "/tmp/evil/io.containerd.grpc.v1.cri/sandboxes/bbbb1111/hosts".into();
        t["mounts"].as_array_mut().unwrap().remove(3);
        assert!(!excess(&signed, &t).is_empty());
    }

    #[test]
    fn a_wider_profile_is_refused_but_a_narrower_apparmor_profile_passes() {
        let mut s = spec();
        s["process"]["apparmorProfile"] = "cri-containerd.apparmor.d".into();
        let mut t = s.clone();
        t["process"]["apparmorProfile"] = "unconfined".into();
        assert_eq!(excess(&s, &t).len(), 1);
        let unconfined = spec();
        assert!(excess(&unconfined, &s).is_empty());
    }

    #[test]
    fn device_rules_are_compared_by_what_they_allow() {
        let rule = |allow: bool, typ: &str, major: i64, minor: i64, access: &str| json!({"allow": allow, "type": typ, "major": major, "minor": minor, "access": access});
        let mut s = spec();
        s["linux"]["resources"]["devices"] = json!([
            {"allow": false, "access": "rwm"},
            rule(true, "c", 1, 3, "rwm"),
            rule(true, "c", 136, -1, "rwm")
        ]);
        // The same allowances written otherwise, and fewer of them, pass.
        let mut t = s.clone();
        t["linux"]["resources"]["devices"] = json!([
            {"allow": false, "access": "rwm"},
            rule(true, "c", 136, 5, "rw"),
            rule(true, "c", 1, 3, "rwm")
        ]);
        assert!(excess(&s, &t).is_empty(), "{:?}", excess(&s, &t));
        // A narrow deny under a wide allow removes nothing: refused.
        let mut t = s.clone();
        t["linux"]["resources"]["devices"] = json!([
            {"allow": true, "access": "rwm"},
            {"allow": false, "type": "c", "major": 1, "minor": 11, "access": "rwm"}
        ]);
        assert!(!excess(&s, &t).is_empty());
        // Another major's wildcard.
        let mut t = s.clone();
        t["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(rule(true, "b", 8, -1, "r"));
        assert!(excess(&s, &t)[0].contains("b 8:"), "{:?}", excess(&s, &t));
    }

    #[test]
    fn keys_runc_would_read_but_serde_would_not_are_refused() {
        for raw in [
            json!({"ociVersion": "1", "linux": {"resources": {"Devices": [{"allow": true, "access": "rwm"}]}}}),
            json!({"ociVersion": "1", "Mounts": []}),
            json!({"ociVersion": "1", "linux": {"namespaces": [], "NAMESPACES": []}}),
            json!({"ociVersion": "1", "linux": {"\u{17f}eccomp": {}}}),
            json!({"ociVersion": "1", "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/", "noNewPrivileges": true, "NoNewPrivileges": false}}),
        ] {
            let e = SpecGrants::from_json(&serde_json::to_vec(&raw).unwrap()).unwrap_err();
            assert!(matches!(e, SpecError::Spelling(_)), "{raw}: {e}");
        }
        // Annotation and sysctl keys are names, not fields.
        let ok = json!({"ociVersion": "1", "annotations": {"Linux": "x", "MOUNTS": "y"},
                        "linux": {"sysctl": {"Kernel.X": "1"}}});
        SpecGrants::from_json(&serde_json::to_vec(&ok).unwrap()).unwrap();
    }
}
