//! The CRIU image messages the privilege check reads, written by hand from CRIU's documented
//! image format (`images/*.proto` of CRIU 4.x: message names, field numbers, types).
//!
//! Only the fields the check needs are declared; prost skips every other field when it
//! decodes, so a message here reads a whole CRIU entry. Strings CRIU writes from C (paths,
//! LSM labels) are declared as bytes: protobuf-c does not require UTF-8, and neither may this
//! reader. Repeated scalars are unpacked, as CRIU's proto2 files declare them; prost reads
//! both encodings.
//!
//! [`crate::forge`] re-encodes entries without losing the undeclared fields (it splices the
//! edited fields into the original bytes).

/// `creds_entry` (creds.proto): a thread's credentials, in `thread_core_entry.creds` or, in
/// old images, alone in `creds-<pid>.img`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CredsEntry {
    #[prost(uint32, required, tag = "1")]
    pub uid: u32,
    #[prost(uint32, required, tag = "2")]
    pub gid: u32,
    #[prost(uint32, required, tag = "3")]
    pub euid: u32,
    #[prost(uint32, required, tag = "4")]
    pub egid: u32,
    #[prost(uint32, required, tag = "5")]
    pub suid: u32,
    #[prost(uint32, required, tag = "6")]
    pub sgid: u32,
    #[prost(uint32, required, tag = "7")]
    pub fsuid: u32,
    #[prost(uint32, required, tag = "8")]
    pub fsgid: u32,
    /// Capability sets as 32-bit words, low word first.
    #[prost(uint32, repeated, packed = "false", tag = "9")]
    pub cap_inh: Vec<u32>,
    #[prost(uint32, repeated, packed = "false", tag = "10")]
    pub cap_prm: Vec<u32>,
    #[prost(uint32, repeated, packed = "false", tag = "11")]
    pub cap_eff: Vec<u32>,
    #[prost(uint32, repeated, packed = "false", tag = "12")]
    pub cap_bnd: Vec<u32>,
    #[prost(uint32, required, tag = "13")]
    pub secbits: u32,
    #[prost(uint32, repeated, packed = "false", tag = "14")]
    pub groups: Vec<u32>,
    /// The AppArmor profile name or the SELinux context; absent for "unconfined".
    #[prost(bytes = "vec", optional, tag = "15")]
    pub lsm_profile: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "16")]
    pub lsm_sockcreate: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "17")]
    pub apparmor_data: Option<Vec<u8>>,
    #[prost(uint32, optional, tag = "18")]
    pub no_new_privs: Option<u32>,
    #[prost(uint32, repeated, packed = "false", tag = "19")]
    pub cap_amb: Vec<u32>,
}

/// `thread_core_entry` (core.proto), the fields that confine a thread.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ThreadCoreEntry {
    #[prost(message, optional, tag = "10")]
    pub creds: Option<CredsEntry>,
    /// `seccomp_mode`: 0 disabled, 1 strict, 2 filter.
    #[prost(int32, optional, tag = "11")]
    pub seccomp_mode: Option<i32>,
    /// Index of the thread's newest filter in `seccomp.img`.
    #[prost(uint32, optional, tag = "12")]
    pub seccomp_filter: Option<u32>,
}

/// `task_core_entry` (core.proto): the task's state, and the per-task seccomp fields of old
/// images, which CRIU moves onto the main thread when present.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskCoreEntry {
    /// 1 alive, 2 dead (a zombie: CRIU restores it only to exit), 3 stopped.
    #[prost(uint32, optional, tag = "1")]
    pub task_state: Option<u32>,
    #[prost(int32, optional, tag = "11")]
    pub old_seccomp_mode: Option<i32>,
    #[prost(uint32, optional, tag = "12")]
    pub old_seccomp_filter: Option<u32>,
}

/// `core_entry` (core.proto), one per thread in `core-<tid>.img`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CoreEntry {
    #[prost(uint32, required, tag = "1")]
    pub mtype: u32,
    #[prost(message, optional, tag = "3")]
    pub tc: Option<TaskCoreEntry>,
    #[prost(message, optional, tag = "5")]
    pub thread_core: Option<ThreadCoreEntry>,
}

/// `task_kobj_ids_entry` (core.proto): the namespaces (and shared objects) of a task, in
/// `ids-<pid>.img` and in `inventory.img` as CRIU's own (`root_ids`). A namespace is a small
/// number CRIU assigned at dump; a task's namespace is created at restore when its number
/// differs from its parent's (the root task's: from `root_ids`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskKobjIdsEntry {
    #[prost(uint32, optional, tag = "5")]
    pub pid_ns_id: Option<u32>,
    #[prost(uint32, optional, tag = "6")]
    pub net_ns_id: Option<u32>,
    #[prost(uint32, optional, tag = "7")]
    pub ipc_ns_id: Option<u32>,
    #[prost(uint32, optional, tag = "8")]
    pub uts_ns_id: Option<u32>,
    #[prost(uint32, optional, tag = "9")]
    pub mnt_ns_id: Option<u32>,
    #[prost(uint32, optional, tag = "10")]
    pub user_ns_id: Option<u32>,
    #[prost(uint32, optional, tag = "11")]
    pub cgroup_ns_id: Option<u32>,
    #[prost(uint32, optional, tag = "12")]
    pub time_ns_id: Option<u32>,
}

/// `inventory_entry` (inventory.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct InventoryEntry {
    #[prost(uint32, required, tag = "1")]
    pub img_version: u32,
    #[prost(message, optional, tag = "3")]
    pub root_ids: Option<TaskKobjIdsEntry>,
    /// `lsmtype`: 0 none, 1 SELinux, 2 AppArmor.
    #[prost(int32, optional, tag = "6")]
    pub lsmtype: Option<i32>,
}

/// `pstree_entry` (pstree.proto), one per task in `pstree.img`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PstreeEntry {
    #[prost(uint32, required, tag = "1")]
    pub pid: u32,
    #[prost(uint32, required, tag = "2")]
    pub ppid: u32,
    #[prost(uint32, required, tag = "3")]
    pub pgid: u32,
    #[prost(uint32, required, tag = "4")]
    pub sid: u32,
    #[prost(uint32, repeated, packed = "false", tag = "5")]
    pub threads: Vec<u32>,
}

/// `seccomp_filter` (seccomp.proto): one classic BPF program and the filter installed before
/// it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SeccompFilter {
    #[prost(bytes = "vec", required, tag = "1")]
    pub filter: Vec<u8>,
    #[prost(uint32, optional, tag = "2")]
    pub prev: Option<u32>,
    #[prost(uint32, optional, tag = "3")]
    pub flags: Option<u32>,
}

/// `seccomp_entry` (seccomp.proto), the one entry of `seccomp.img`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SeccompEntry {
    #[prost(message, repeated, tag = "1")]
    pub seccomp_filters: Vec<SeccompFilter>,
}

/// `mnt_entry` (mnt.proto), one per mount in `mountpoints-<mnt ns>.img`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MntEntry {
    /// CRIU's `fstype` enum (see [`crate::bound`] for the codes the check knows).
    #[prost(uint32, required, tag = "1")]
    pub fstype: u32,
    #[prost(uint32, required, tag = "2")]
    pub mnt_id: u32,
    #[prost(uint32, required, tag = "4")]
    pub parent_mnt_id: u32,
    /// Mount flags (`MS_RDONLY`, `MS_NOSUID`, ...).
    #[prost(uint32, required, tag = "5")]
    pub flags: u32,
    #[prost(bytes = "vec", required, tag = "6")]
    pub root: Vec<u8>,
    #[prost(bytes = "vec", required, tag = "7")]
    pub mountpoint: Vec<u8>,
    #[prost(bytes = "vec", required, tag = "8")]
    pub source: Vec<u8>,
    #[prost(bytes = "vec", required, tag = "9")]
    pub options: Vec<u8>,
    #[prost(bool, optional, tag = "13")]
    pub ext_mount: Option<bool>,
    #[prost(bytes = "vec", optional, tag = "14")]
    pub fsname: Option<Vec<u8>>,
    #[prost(uint32, optional, tag = "17")]
    pub sb_flags: Option<u32>,
    /// Key of an external mount: its source is what runc maps the key to, not the image.
    #[prost(bytes = "vec", optional, tag = "18")]
    pub ext_key: Option<Vec<u8>>,
}

/// `uid_gid_extent` (userns.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct UidGidExtent {
    #[prost(uint32, required, tag = "1")]
    pub first: u32,
    #[prost(uint32, required, tag = "2")]
    pub lower_first: u32,
    #[prost(uint32, required, tag = "3")]
    pub count: u32,
}

/// `userns_entry` (userns.proto), in `userns-<id>.img`: the maps CRIU writes, as root, for a
/// user namespace it creates.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UsernsEntry {
    #[prost(message, repeated, tag = "1")]
    pub uid_map: Vec<UidGidExtent>,
    #[prost(message, repeated, tag = "2")]
    pub gid_map: Vec<UidGidExtent>,
}

/// `apparmor_entry` (apparmor.proto), in `apparmor.img`: AppArmor namespaces whose policies
/// CRIU loads into the node's kernel. Only counted, so the namespaces stay undecoded.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ApparmorEntry {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub namespaces: Vec<Vec<u8>>,
}

/// `file_entry` (fdinfo.proto), one per open file description in `files.img`; only regular
/// files (`type` 1, `REG`) are read.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FileEntry {
    /// CRIU's `fd_types`.
    #[prost(uint32, required, tag = "1")]
    pub r#type: u32,
    #[prost(uint32, required, tag = "2")]
    pub id: u32,
    #[prost(message, optional, tag = "3")]
    pub reg: Option<RegFileEntry>,
}

/// `fd_types.REG` (fdinfo.proto).
pub const FD_TYPE_REG: u32 = 1;

/// `reg_file_entry` (regfile.proto): a regular file a task holds open or maps, by its path in
/// the task's mount namespace (leading `/`) and the mount it was reached through.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegFileEntry {
    #[prost(uint32, required, tag = "1")]
    pub id: u32,
    #[prost(bytes = "vec", required, tag = "6")]
    pub name: Vec<u8>,
    #[prost(sint32, optional, tag = "7")]
    pub mnt_id: Option<i32>,
    /// The size at the dump; CRIU refuses to reopen a file whose size differs.
    #[prost(uint64, optional, tag = "8")]
    pub size: Option<u64>,
    /// An external file, handed in by the caller at restore (`--inherit-fd`).
    #[prost(bool, optional, tag = "9")]
    pub ext: Option<bool>,
    /// `st_mode` at the dump (type and permission bits); CRIU refuses another.
    #[prost(uint32, optional, tag = "10")]
    pub mode: Option<u32>,
}

/// `remap_file_path_entry` (remap-file-path.proto): an open file CRIU brings back from the
/// checkpoint itself (an unlinked file's content, a link it made) instead of by its path.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RemapFilePathEntry {
    #[prost(uint32, required, tag = "1")]
    pub orig_id: u32,
    #[prost(uint32, required, tag = "2")]
    pub remap_id: u32,
}
