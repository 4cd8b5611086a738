//! Forged CRIU images against the spec they are restored into: the honest checkpoint passes,
//! every widening is refused with the task, the file, the field and both values.
//!
//! The honest fixture mirrors what CRIU 4.2 wrote for a runc 1.1 busybox container made with
//! `runc spec` (two tasks, the same namespaces, the same mount table).

use std::path::Path;

use gpusnap_criu_images::caps;
use gpusnap_criu_images::forge::{self, cap_words};
use gpusnap_criu_images::proto::*;
use gpusnap_criu_images::{bound_by_spec_on, HostLsm, ImageError, Kind, Limits, Refusal};
use oci_spec::runtime::Spec;
use serde_json::json;

/// CAP_KILL, CAP_NET_BIND_SERVICE, CAP_AUDIT_WRITE: `runc spec`'s set.
const RUNC_CAPS: u64 = 0x2000_0420;

fn spec_json() -> serde_json::Value {
    let caps = json!(["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]);
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": ["sh"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps, "ambient": caps
            },
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": false},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
            {"destination": "/data", "type": "bind", "source": "/srv/data",
             "options": ["rbind", "ro"]}
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"},
                {"type": "mount"}
            ],
            "maskedPaths": ["/proc/keys", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys"]
        }
    })
}

fn spec_of(v: serde_json::Value) -> Spec {
    serde_json::from_value(v).unwrap()
}

fn ids(pid_ns: u32, net: u32, ipc: u32, uts: u32, mnt: u32, user: u32) -> TaskKobjIdsEntry {
    TaskKobjIdsEntry {
        pid_ns_id: Some(pid_ns),
        net_ns_id: Some(net),
        ipc_ns_id: Some(ipc),
        uts_ns_id: Some(uts),
        mnt_ns_id: Some(mnt),
        user_ns_id: Some(user),
        cgroup_ns_id: Some(8),
        time_ns_id: Some(5),
        ..Default::default()
    }
}

fn mnt(id: u32, parent: u32, fstype: u32, mountpoint: &str, flags: u32) -> MntEntry {
    MntEntry {
        fstype,
        mnt_id: id,
        parent_mnt_id: parent,
        flags,
        root: b"/".to_vec(),
        mountpoint: mountpoint.as_bytes().to_vec(),
        source: b"none".to_vec(),
        options: vec![],
        sb_flags: Some(0),
        ..Default::default()
    }
}

fn external(mut m: MntEntry, key: &str) -> MntEntry {
    m.ext_key = Some(key.as_bytes().to_vec());
    m
}

/// An honest checkpoint, as plain messages, edited by each test before it is written.
struct Fixture {
    inventory: InventoryEntry,
    pstree: Vec<PstreeEntry>,
    ids: Vec<(u32, TaskKobjIdsEntry)>,
    cores: Vec<(u32, CoreEntry)>,
    seccomp: SeccompEntry,
    mounts: Vec<MntEntry>,
    extra: Vec<(String, Vec<u8>)>,
}

impl Fixture {
    fn honest() -> Fixture {
        let core = |uid, gid| CoreEntry {
            mtype: 1,
            tc: Some(TaskCoreEntry::default()),
            thread_core: Some(ThreadCoreEntry {
                creds: Some(forge::creds(uid, gid, RUNC_CAPS)),
                seccomp_mode: None,
                seccomp_filter: None,
                ..Default::default()
            }),
            ..Default::default()
        };
        let container = ids(9, 10, 11, 12, 13, 7);
        let (r, nosuid, nodev, noexec) = (1, 2, 4, 8);
        Fixture {
            inventory: InventoryEntry {
                img_version: 2,
                root_ids: Some(ids(1, 2, 3, 4, 6, 7)),
                lsmtype: Some(0),
                ..Default::default()
            },
            pstree: vec![
                PstreeEntry {
                    pid: 1,
                    ppid: 0,
                    pgid: 1,
                    sid: 1,
                    threads: vec![1],
                },
                PstreeEntry {
                    pid: 16,
                    ppid: 1,
                    pgid: 1,
                    sid: 1,
                    threads: vec![16],
                },
            ],
            ids: vec![(1, container), (16, container)],
            cores: vec![(1, core(0, 0)), (16, core(0, 0))],
            seccomp: SeccompEntry::default(),
            mounts: vec![
                mnt(68, 46, 0, "/", 0x20_0000),
                mnt(69, 68, 1, "/proc", 0x20_0000),
                mnt(70, 68, 5, "/dev", 0x100_0002),
                mnt(71, 70, 6, "/dev/pts", nosuid | noexec),
                mnt(72, 70, 5, "/dev/shm", nosuid | nodev | noexec),
                mnt(73, 70, 14, "/dev/mqueue", nosuid | nodev | noexec),
                mnt(74, 68, 2, "/sys", r | nosuid | nodev | noexec),
                mnt(75, 74, 5, "/sys/fs/cgroup", nosuid | nodev | noexec),
                external(
                    mnt(
                        76,
                        75,
                        12,
                        "/sys/fs/cgroup/cpu",
                        r | nosuid | nodev | noexec,
                    ),
                    "/sys/fs/cgroup/cpu",
                ),
                external(mnt(77, 68, 0, "/data", r), "/data"),
                mnt(78, 69, 1, "/proc/sys", r),
                external(mnt(79, 69, 5, "/proc/keys", nosuid), "/dev/null"),
                mnt(80, 74, 5, "/sys/firmware", r),
            ],
            extra: vec![],
        }
    }

    fn core(&mut self, tid: u32) -> &mut ThreadCoreEntry {
        let core = &mut self.cores.iter_mut().find(|(t, _)| *t == tid).unwrap().1;
        core.thread_core.as_mut().unwrap()
    }

    fn creds(&mut self, tid: u32) -> &mut CredsEntry {
        self.core(tid).creds.as_mut().unwrap()
    }

    fn write(&self, dir: &Path) {
        let put = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
        put(
            "inventory.img",
            forge::image_of(Kind::Inventory, std::slice::from_ref(&self.inventory)),
        );
        put("pstree.img", forge::image_of(Kind::Pstree, &self.pstree));
        for (pid, ids) in &self.ids {
            put(
                &format!("ids-{pid}.img"),
                forge::image_of(Kind::Ids, std::slice::from_ref(ids)),
            );
        }
        for (tid, core) in &self.cores {
            put(
                &format!("core-{tid}.img"),
                forge::image_of(Kind::Core, std::slice::from_ref(core)),
            );
        }
        put(
            "seccomp.img",
            forge::image_of(Kind::Seccomp, std::slice::from_ref(&self.seccomp)),
        );
        put(
            "mountpoints-13.img",
            forge::image_of(Kind::Mountpoints, &self.mounts),
        );
        for (name, bytes) in &self.extra {
            put(name, bytes.clone());
        }
    }

    fn check_on(&self, spec: &Spec, lsm: HostLsm) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        self.write(dir.path());
        bound_by_spec_on(dir.path(), spec, lsm, Limits::default())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn check(&self, spec: &Spec) -> Result<(), String> {
        self.check_on(spec, HostLsm::None)
    }
}

/// The refusal must contain every one of `says`.
fn refused(result: Result<(), String>, says: &[&str]) {
    let err = result.expect_err("the forged checkpoint was accepted");
    for s in says {
        assert!(err.contains(s), "{s:?} missing from: {err}");
    }
}

#[test]
fn honest_checkpoint_passes() {
    let f = Fixture::honest();
    let dir = tempfile::tempdir().unwrap();
    f.write(dir.path());
    let report = bound_by_spec_on(
        dir.path(),
        &spec_of(spec_json()),
        HostLsm::None,
        Limits::default(),
    )
    .unwrap();
    assert_eq!((report.tasks, report.threads), (2, 2));
    // inventory, pstree, 2 ids, 2 cores, mountpoints.
    assert_eq!(report.files_read, 7);
}

#[test]
fn every_capability_is_refused_by_task_file_field_and_values() {
    let mut f = Fixture::honest();
    let all = caps::ALL;
    let c = f.creds(1);
    (c.cap_prm, c.cap_eff, c.cap_bnd) = (cap_words(all), cap_words(all), cap_words(all));
    let err = f.check(&spec_of(spec_json())).unwrap_err();
    for s in [
        "task 1 (core-1.img): cap_eff holds CAP_CHOWN",
        "CAP_SYS_MODULE",
        "CAP_SYS_ADMIN",
        "which the container spec's bounding set does not (spec 0x20000420, image 0x1ffffffffff)",
        "task 1 (core-1.img): cap_prm",
        "task 1 (core-1.img): cap_bnd",
    ] {
        assert!(err.contains(s), "{s:?} missing from: {err}");
    }
    assert!(!err.contains("task 16"), "{err}");
}

#[test]
fn capabilities_of_another_thread_and_ambient_are_refused() {
    let mut f = Fixture::honest();
    f.pstree[1].threads = vec![16, 17];
    let mut thread = f.cores[1].1.clone();
    thread
        .thread_core
        .as_mut()
        .unwrap()
        .creds
        .as_mut()
        .unwrap()
        .cap_amb = cap_words(caps::SYS_ADMIN);
    f.cores.push((17, thread));
    refused(
        f.check(&spec_of(spec_json())),
        &["task 16 (core-17.img): cap_amb holds CAP_SYS_ADMIN"],
    );
}

#[test]
fn no_new_privs_bounds_the_permitted_set_by_the_specs() {
    // CAP_SYS_CHROOT is in the bounding set but not the permitted set: without
    // no_new_privs a setuid-root exec could gain it, with it nothing can.
    let mut spec = spec_json();
    spec["process"]["capabilities"]["bounding"] = json!([
        "CAP_AUDIT_WRITE",
        "CAP_KILL",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT"
    ]);
    let mut f = Fixture::honest();
    f.creds(1).cap_eff = cap_words(RUNC_CAPS | 1 << 18);
    f.creds(1).cap_prm = cap_words(RUNC_CAPS | 1 << 18);
    refused(
        f.check(&spec_of(spec.clone())),
        &["cap_prm holds CAP_SYS_CHROOT, outside the spec's permitted set"],
    );
    spec["process"]["noNewPrivileges"] = false.into();
    for t in [1, 16] {
        f.creds(t).no_new_privs = Some(0);
    }
    f.check(&spec_of(spec)).unwrap();
}

#[test]
fn uid_0_in_a_non_root_container_is_refused() {
    let mut spec = spec_json();
    spec["process"]["user"] = json!({"uid": 1000, "gid": 1000, "additionalGids": [27]});
    let spec = spec_of(spec);
    let mut f = Fixture::honest();
    for t in [1, 16] {
        *f.creds(t) = forge::creds(1000, 1000, 0);
        f.creds(t).groups = vec![27];
    }
    f.check(&spec).unwrap();
    f.creds(16).uid = 0;
    f.creds(16).euid = 0;
    f.creds(1).egid = 0;
    f.creds(1).groups = vec![27, 0];
    refused(
        f.check(&spec),
        &[
            "task 16 (core-16.img): uid is 0, but the container spec's user is uid 1000 and its \
             bounding set lacks CAP_SETUID (spec 1000, image 0)",
            "task 16 (core-16.img): euid is 0",
            "task 1 (core-1.img): egid is 0",
            "task 1 (core-1.img): groups hold 0",
        ],
    );
}

/// Finding 4: with noNewPrivileges, a root checkpoint restored into a `--user 1000:1000`
/// container whose spec lists CAP_SETUID in every set but the ambient one (containerd's
/// default for `ctr run --user`) would run as uid 0 with the spec's capabilities; that
/// container's own process runs as uid 1000 with none.
#[test]
fn no_new_privileges_keeps_a_non_root_user_without_capabilities() {
    let mut spec = spec_json();
    spec["process"]["user"] = json!({"uid": 1000, "gid": 1000});
    let caps = json!([
        "CAP_KILL",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_NET_BIND_SERVICE"
    ]);
    spec["process"]["capabilities"] =
        json!({"bounding": caps, "permitted": caps, "effective": caps});
    let mut f = Fixture::honest();
    for t in [1, 16] {
        *f.creds(t) = forge::creds(1000, 1000, 0);
        f.creds(t).cap_bnd = cap_words(0x4e0 | 1 << 10);
    }
    f.check(&spec_of(spec.clone())).unwrap();
    // The honest root checkpoint of the same container run as root.
    for t in [1, 16] {
        *f.creds(t) = forge::creds(0, 0, 0x4e0);
    }
    refused(
        f.check(&spec_of(spec.clone())),
        &[
            "task 1 (core-1.img): uid is 0, but the container spec's user is uid 1000 and its \
             ambient set",
            "lacks CAP_SETUID",
            "task 1 (core-1.img): cap_eff holds CAP_KILL, CAP_SETGID, CAP_SETUID, \
             CAP_NET_BIND_SERVICE, outside the spec's ambient set",
        ],
    );
    // Without noNewPrivileges a setuid-root program could make it so: accepted.
    spec["process"]["noNewPrivileges"] = false.into();
    for t in [1, 16] {
        f.creds(t).no_new_privs = Some(0);
    }
    f.check(&spec_of(spec)).unwrap();
}

#[test]
fn ids_may_change_when_the_spec_grants_setuid_and_setgid() {
    let mut spec = spec_json();
    spec["process"]["user"] = json!({"uid": 1000, "gid": 1000});
    let all = json!(["CAP_KILL", "CAP_SETUID", "CAP_SETGID"]);
    // A non-root process keeps across runc's execve only its ambient capabilities, and
    // no_new_privs keeps it within them: they must be ambient for it to hold them.
    spec["process"]["capabilities"] = json!({
        "bounding": all, "permitted": all, "effective": all, "inheritable": all, "ambient": all
    });
    let mut f = Fixture::honest();
    for t in [1, 16] {
        *f.creds(t) = forge::creds(1000, 1000, 0xe0);
    }
    let c = f.creds(1);
    c.euid = 0;
    c.gid = 0;
    c.groups = vec![4];
    f.check(&spec_of(spec)).unwrap();
}

#[test]
fn dropped_no_new_privs_and_weaker_securebits_are_refused() {
    let mut f = Fixture::honest();
    f.creds(1).no_new_privs = None;
    f.creds(16).secbits = 1 << 2;
    refused(
        f.check(&spec_of(spec_json())),
        &[
            "task 1 (core-1.img): no_new_privs is off, but the container spec sets \
             noNewPrivileges (spec true, image absent)",
            "task 16 (core-16.img): secbits set SECBIT_NO_SETUID_FIXUP",
        ],
    );
    // KEEP_CAPS any process may set.
    let mut f = Fixture::honest();
    f.creds(1).secbits = 1 << 4;
    f.check(&spec_of(spec_json())).unwrap();
}

fn seccomp_spec() -> Spec {
    let mut spec = spec_json();
    spec["linux"]["seccomp"] = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["kexec_load"], "action": "SCMP_ACT_ERRNO"}]
    });
    spec_of(spec)
}

/// What libseccomp makes of [`seccomp_spec`] on x86-64: kexec_load (246) gets EPERM, other
/// ABIs (which the profile does not list) are killed, everything else is allowed.
fn kexec_filter() -> Vec<u8> {
    forge::bpf(&[
        (0x20, 0, 0, 4),           // 0: ld arch
        (0x15, 0, 5, 0xc000_003e), // 1: x86-64 ? 2 : 7
        (0x20, 0, 0, 0),           // 2: ld nr
        (0x25, 3, 0, 0x3fff_ffff), // 3: x32 ? 7 : 4
        (0x15, 1, 0, 246),         // 4: kexec_load ? 6 : 5
        (0x06, 0, 0, 0x7fff_0000), // 5: allow
        (0x06, 0, 0, 0x0005_0001), // 6: EPERM
        (0x06, 0, 0, 0),           // 7: kill
    ])
}

fn filtered() -> Fixture {
    let mut f = Fixture::honest();
    f.seccomp.seccomp_filters = vec![
        SeccompFilter {
            filter: kexec_filter(),
            prev: None,
            flags: None,
        },
        SeccompFilter {
            filter: vec![0; 24],
            prev: Some(0),
            flags: None,
        },
    ];
    for t in [1, 16] {
        f.core(t).seccomp_mode = Some(2);
        f.core(t).seccomp_filter = Some(1);
    }
    f
}

#[test]
fn a_dropped_seccomp_filter_is_refused() {
    filtered().check(&seccomp_spec()).unwrap();

    let mut f = filtered();
    f.core(1).seccomp_mode = Some(0);
    refused(
        f.check(&seccomp_spec()),
        &["task 1 (core-1.img): seccomp_mode is disabled where the container spec sets a seccomp profile"],
    );
    let mut f = filtered();
    f.core(16).seccomp_mode = None;
    refused(
        f.check(&seccomp_spec()),
        &["task 16 (core-16.img): seccomp_mode is disabled"],
    );

    // The per-task mode of old images wins, as in CRIU.
    let mut f = filtered();
    f.cores[0].1.tc = Some(TaskCoreEntry {
        task_state: 1,
        old_seccomp_mode: Some(0),
        old_seccomp_filter: None,
        ..Default::default()
    });
    refused(
        f.check(&seccomp_spec()),
        &["task 1 (core-1.img): seccomp_mode is disabled"],
    );

    for (name, edit) in [
        (
            "index",
            (|f: &mut Fixture| f.core(1).seccomp_filter = Some(9)) as fn(&mut Fixture),
        ),
        ("empty", |f| f.seccomp.seccomp_filters[0].filter.clear()),
        ("loop", |f| f.seccomp.seccomp_filters[0].prev = Some(1)),
        ("no image", |f| f.seccomp.seccomp_filters.clear()),
    ] {
        let mut f = filtered();
        edit(&mut f);
        let err = f.check(&seccomp_spec()).expect_err(name);
        assert!(
            err.contains("seccomp_filter does not lead to a usable filter"),
            "{name}: {err}"
        );
    }
}

#[test]
fn extra_mounts_are_refused() {
    let cases: Vec<(&str, MntEntry, &str)> = vec![
        (
            "host disk",
            {
                let mut m = mnt(90, 68, 16, "/mnt/host", 0);
                m.fsname = Some(b"ext4".to_vec());
                m.source = b"/dev/vda".to_vec();
                m
            },
            "/mnt/host (a filesystem named by the image (auto)) is not a mount of the container spec",
        ),
        (
            "devtmpfs",
            mnt(90, 70, 3, "/dev/host", 0),
            "/dev/host (devtmpfs) is not a mount of the container spec",
        ),
        (
            "external dev",
            external(mnt(90, 68, 0, "/data2", 0), "CRIU:EXTERNAL_DEV"),
            "CRIU would mount a source the image names",
        ),
        (
            "unknown external",
            external(mnt(90, 68, 0, "/elsewhere", 0), "/etc"),
            "/elsewhere is an external mount the container spec does not have",
        ),
        (
            "wrong type at a spec mount",
            mnt(90, 68, 0, "/proc", 0),
            "/proc is proc in the container spec",
        ),
        (
            "dotdot",
            mnt(90, 68, 5, "/proc/../etc", 0),
            "is not a plain absolute path",
        ),
    ];
    for (name, m, says) in cases {
        let mut f = Fixture::honest();
        f.mounts.push(m);
        let err = f.check(&spec_of(spec_json())).expect_err(name);
        assert!(
            err.contains("mountpoints-13.img: mountpoint"),
            "{name}: {err}"
        );
        assert!(err.contains(says), "{name}: {err}");
    }
}

#[test]
fn mounts_lose_no_flag_the_spec_gives() {
    let mut f = Fixture::honest();
    f.mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/data")
        .unwrap()
        .flags = 0;
    refused(
        f.check(&spec_of(spec_json())),
        &["/data is mounted without ro that the container spec gives it"],
    );
    let mut f = Fixture::honest();
    f.mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/proc/sys")
        .unwrap()
        .flags = 0;
    refused(
        f.check(&spec_of(spec_json())),
        &["/proc/sys is mounted without ro"],
    );
    let mut f = Fixture::honest();
    f.mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/dev/shm")
        .unwrap()
        .flags = 0;
    refused(
        f.check(&spec_of(spec_json())),
        &["/dev/shm is mounted without nosuid,nodev,noexec"],
    );
    let mut f = Fixture::honest();
    f.mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/sys/fs/cgroup/cpu")
        .unwrap()
        .flags = 2 | 4 | 8;
    refused(
        f.check(&spec_of(spec_json())),
        &["/sys/fs/cgroup/cpu is mounted without ro"],
    );
    // runc keys a bind mount by the spec's destination, wherever symlinks in the rootfs put it.
    let mut f = Fixture::honest();
    f.mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/data")
        .unwrap()
        .mountpoint = b"/srv/data".to_vec();
    f.check(&spec_of(spec_json())).unwrap();
    // A read-only spec mount's source put elsewhere keeps its flags.
    let mut f = Fixture::honest();
    f.mounts
        .push(external(mnt(91, 72, 0, "/proc/keys", 0), "/data"));
    refused(
        f.check(&spec_of(spec_json())),
        &["/proc/keys is mounted without ro"],
    );
}

#[test]
fn another_mount_namespace_needs_cap_sys_admin() {
    let mut f = Fixture::honest();
    f.extra.push((
        "mountpoints-30.img".into(),
        forge::image_of(Kind::Mountpoints, &[mnt(1, 0, 5, "/", 0)]),
    ));
    refused(
        f.check(&spec_of(spec_json())),
        &["mountpoints-30.img: mount namespace 30 is not the container's (13)"],
    );
}

#[test]
fn namespaces_the_spec_gives_are_not_left_to_the_node() {
    let mut f = Fixture::honest();
    f.ids[0].1 = ids(9, 2, 11, 12, 13, 7);
    refused(
        f.check(&spec_of(spec_json())),
        &["task 1 (ids-1.img): network namespace is CRIU's own (id 2"],
    );
    // A pod's container joins the sandbox's network namespace by path: runc has CRIU join
    // it, and an honest image records it as CRIU's own.
    let mut spec = spec_json();
    spec["linux"]["namespaces"][1] = json!({"type": "network", "path": "/proc/42/ns/net"});
    f.check(&spec_of(spec)).unwrap();
    let mut f = Fixture::honest();
    f.ids.clear();
    refused(f.check(&spec_of(spec_json())), &["has no ids-1.img"]);
}

#[test]
fn a_user_namespace_the_spec_lacks_is_refused() {
    let mut f = Fixture::honest();
    f.ids[0].1.user_ns_id = Some(20);
    f.extra.push((
        "userns-20.img".into(),
        forge::image_of(
            Kind::Userns,
            &[UsernsEntry {
                uid_map: vec![UidGidExtent {
                    first: 0,
                    lower_first: 0,
                    count: u32::MAX,
                }],
                gid_map: vec![],
            }],
        ),
    ));
    refused(
        f.check(&spec_of(spec_json())),
        &["task 1 (ids-1.img): user namespace is a new one (id 20, CRIU's is 7)"],
    );

    // With a user namespace in the spec, its maps are the spec's.
    let mut spec = spec_json();
    spec["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "user"}));
    spec["linux"]["uidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
    spec["linux"]["gidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
    refused(
        f.check(&spec_of(spec.clone())),
        &["task 1 (userns-20.img): uid_map is not the container spec's mapping (spec [(0, 100000, 65536)], image [(0, 0, 4294967295)]"],
    );
    f.ids[0].1.user_ns_id = Some(7);
    refused(
        f.check(&spec_of(spec)),
        &["user namespace is CRIU's own (id 7)"],
    );
}

#[test]
fn legacy_creds_files_are_checked_too() {
    let mut f = Fixture::honest();
    f.core(1).creds = None;
    let mut legacy = forge::creds(0, 0, caps::ALL);
    legacy.no_new_privs = Some(1);
    f.extra.push((
        "creds-1.img".into(),
        forge::image_of(Kind::Creds, &[legacy]),
    ));
    refused(
        f.check(&spec_of(spec_json())),
        &["task 1 (creds-1.img): cap_eff holds", "CAP_SYS_ADMIN"],
    );
    // No credentials anywhere: CRIU would not set them.
    let mut f = Fixture::honest();
    f.core(16).creds = None;
    refused(
        f.check(&spec_of(spec_json())),
        &["task 16 (core-16.img): creds are missing"],
    );
    let mut f = Fixture::honest();
    f.cores[1].1.thread_core = None;
    refused(
        f.check(&spec_of(spec_json())),
        &["task 16 (core-16.img): thread_core is missing"],
    );
    // A zombie has none, and CRIU sets none of its credentials.
    f.cores[1].1.tc = Some(TaskCoreEntry {
        task_state: 2,
        ..Default::default()
    });
    f.check(&spec_of(spec_json())).unwrap();
}

#[test]
fn lsm_labels_are_the_specs() {
    let mut spec = spec_json();
    spec["process"]["apparmorProfile"] = "cri-containerd.apparmor.d".into();
    spec["process"]["selinuxLabel"] = "system_u:system_r:container_t:s0:c1,c2".into();
    let spec = spec_of(spec);
    let mut f = Fixture::honest();
    for t in [1, 16] {
        f.creds(t).lsm_profile = Some(b"cri-containerd.apparmor.d".to_vec());
    }
    f.check_on(&spec, HostLsm::AppArmor).unwrap();
    // Without an LSM on the node there is nothing to compare (CRIU cannot set a label).
    f.check_on(&spec, HostLsm::None).unwrap();
    f.creds(16).lsm_profile = None;
    refused(
        f.check_on(&spec, HostLsm::AppArmor),
        &["task 16 (core-16.img): lsm_profile is not the container spec's apparmorProfile (spec \"cri-containerd.apparmor.d\", image none)"],
    );

    let mut f = Fixture::honest();
    for t in [1, 16] {
        f.creds(t).lsm_profile = Some(b"system_u:system_r:container_t:s0:c1,c2".to_vec());
    }
    f.check_on(&spec, HostLsm::SeLinux).unwrap();
    f.creds(1).lsm_profile = Some(b"system_u:system_r:spc_t:s0".to_vec());
    f.creds(16).lsm_sockcreate = Some(b"system_u:system_r:spc_t:s0".to_vec());
    refused(
        f.check_on(&spec, HostLsm::SeLinux),
        &[
            "task 1 (core-1.img): lsm_profile is not the container spec's selinuxLabel",
            "task 16 (core-16.img): lsm_sockcreate",
        ],
    );
}

#[test]
fn apparmor_policy_loads_are_refused() {
    let mut f = Fixture::honest();
    f.extra.push((
        "apparmor.img".into(),
        forge::image_of(
            Kind::Apparmor,
            &[ApparmorEntry {
                namespaces: vec![AaNamespace {
                    name: b"../".to_vec(),
                    ..Default::default()
                }],
            }],
        ),
    ));
    refused(
        f.check(&spec_of(spec_json())),
        &["apparmor.img: namespaces hold 1 AppArmor namespace(s)"],
    );
}

fn read_err(f: &Fixture, edit: impl FnOnce(&Path), limits: Limits) -> ImageError {
    let dir = tempfile::tempdir().unwrap();
    f.write(dir.path());
    edit(dir.path());
    match bound_by_spec_on(dir.path(), &spec_of(spec_json()), HostLsm::None, limits) {
        Err(Refusal::Unreadable(e)) => e,
        other => panic!("expected an unreadable image, got {other:?}"),
    }
}

#[test]
fn malformed_images_are_refused_with_what_is_wrong() {
    let f = Fixture::honest();
    let core = |d: &Path| d.join("core-1.img");
    let e = read_err(
        &f,
        |d| {
            let mut b = std::fs::read(core(d)).unwrap();
            b.truncate(b.len() - 3);
            std::fs::write(core(d), b).unwrap();
        },
        Limits::default(),
    );
    assert!(
        matches!(e, ImageError::Truncated { ref name, index: 0 } if name == "core-1.img"),
        "{e}"
    );

    let e = read_err(
        &f,
        |d| {
            let mut b = std::fs::read(core(d)).unwrap();
            b[0] ^= 0xff;
            std::fs::write(core(d), b).unwrap();
        },
        Limits::default(),
    );
    assert!(
        e.to_string()
            .contains("core-1.img does not start with CRIU's image magic"),
        "{e}"
    );

    let e = read_err(
        &f,
        |d| {
            std::fs::copy(d.join("pstree.img"), core(d))
                .map(drop)
                .unwrap()
        },
        Limits::default(),
    );
    assert!(
        e.to_string()
            .contains("core-1.img is not a CRIU core (thread state) image"),
        "{e}"
    );

    let small = Limits {
        max_entry_bytes: 16,
        ..Limits::default()
    };
    let e = read_err(&f, |_| {}, small);
    assert!(matches!(e, ImageError::EntryTooLarge { .. }), "{e}");

    let small = Limits {
        max_file_bytes: 20,
        ..Limits::default()
    };
    let e = read_err(&f, |_| {}, small);
    assert!(matches!(e, ImageError::FileTooLarge { .. }), "{e}");

    let few = Limits {
        max_entries: 1,
        ..Limits::default()
    };
    let e = read_err(&f, |_| {}, few);
    assert!(
        e.to_string().contains("pstree.img has more than 1 entries"),
        "{e}"
    );

    // A length that claims more than the file holds.
    let e = read_err(
        &f,
        |d| {
            let mut b = forge::image(Kind::Core, &[vec![8u8, 1]]);
            b[8..12].copy_from_slice(&u32::MAX.to_ne_bytes());
            std::fs::write(core(d), b).unwrap();
        },
        Limits::default(),
    );
    assert!(matches!(e, ImageError::EntryTooLarge { .. }), "{e}");

    // Not a protobuf message.
    let e = read_err(
        &f,
        |d| std::fs::write(core(d), forge::image(Kind::Core, &[vec![0xffu8; 4]])).unwrap(),
        Limits::default(),
    );
    assert!(matches!(e, ImageError::Decode { .. }), "{e}");

    // A symlink to a file outside the checkpoint is not followed.
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("core.img");
    let e = read_err(
        &f,
        |d| {
            std::fs::rename(core(d), &target).unwrap();
            std::os::unix::fs::symlink(&target, core(d)).unwrap();
        },
        Limits::default(),
    );
    assert!(matches!(e, ImageError::Open { .. }), "{e}");
}

#[test]
fn forged_cores_keep_every_field_the_check_does_not_read() {
    // A core with fields the check does not read (registers, the task's comm, the thread's
    // robust futex list), as CRIU writes them.
    let regs = ThreadInfoX86 {
        clear_tid_addr: 0x7f00,
        gpregs: UserX86RegsEntry {
            r15: 0xaaaa,
            ip: 0x4000,
            ..Default::default()
        },
        fpregs: UserX86FpregsEntry::default(),
        ..Default::default()
    };
    let core = CoreEntry {
        mtype: 1,
        thread_info: Some(regs.clone()),
        tc: Some(TaskCoreEntry {
            comm: b"sh".to_vec(),
            ..Default::default()
        }),
        thread_core: Some(ThreadCoreEntry {
            futex_rla: 0x1234,
            creds: Some(forge::creds(1000, 1000, 0)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let img = forge::image_of(Kind::Core, std::slice::from_ref(&core));

    let forged = forge::edit_creds(&img, |c| {
        c.uid = 0;
        c.cap_eff = cap_words(caps::ALL);
    })
    .unwrap();
    let entries =
        gpusnap_criu_images::image::split_entries("core", &forged, Kind::Core, &Limits::default())
            .unwrap();
    let e = entries[0];
    let forged: CoreEntry = prost::Message::decode(e).unwrap();
    assert_eq!(forged.thread_info, Some(regs), "registers kept");
    assert_eq!(forged.tc, core.tc, "task state kept");
    let thread = forged.thread_core.unwrap();
    assert_eq!(thread.futex_rla, 0x1234, "futex_rla kept");
    let c = thread.creds.unwrap();
    assert_eq!((c.uid, caps::from_words(&c.cap_eff)), (0, caps::ALL));
    assert_eq!(c.euid, 1000);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_filter_weaker_than_the_spec_profile_is_refused() {
    // One SECCOMP_RET_ALLOW in place of the spec's filter, on every thread.
    let mut f = filtered();
    f.seccomp.seccomp_filters[0].filter = forge::allow_all_filter();
    refused(
        f.check(&seccomp_spec()),
        &[
            "task 1 (core-1.img): seccomp_filter leads to a filter chain in seccomp.img none \
             of whose filters is as strict as the container spec's seccomp profile: filter 0 \
             (the oldest of 2 in the thread's chain): it returns SECCOMP_RET_ALLOW for kexec_load \
             (x86_64 nr 246), where the spec's seccomp profile gives SCMP_ACT_ERRNO",
            "task 16 (core-16.img): seccomp_filter",
        ],
    );
    // A filter that stops kexec_load but lets x32 through: x32 is not in the profile.
    let mut f = filtered();
    f.seccomp.seccomp_filters[0].filter = forge::bpf(&[
        (0x20, 0, 0, 4),
        (0x15, 0, 3, 0xc000_003e),
        (0x20, 0, 0, 0),
        (0x15, 1, 0, 246),
        (0x06, 0, 0, 0x7fff_0000),
        (0x06, 0, 0, 0x0005_0001),
    ]);
    refused(f.check(&seccomp_spec()), &["x32 nr"]);
    // The workload stacked a stricter filter on the spec's: still accepted, whichever is
    // newer; a permissive filter stacked on the spec's restricts nothing and is accepted too.
    let mut f = filtered();
    f.seccomp.seccomp_filters[1].filter = forge::bpf(&[(0x06, 0, 0, 0x0005_0001)]);
    f.check(&seccomp_spec()).unwrap();
    let mut f = filtered();
    f.seccomp.seccomp_filters[1].filter = forge::allow_all_filter();
    f.check(&seccomp_spec()).unwrap();
}
