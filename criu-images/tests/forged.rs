//! Forged CRIU images against the spec they are restored into: the honest checkpoint passes,
//! every widening is refused with the task, the file, the field and both values.
//!
//! The honest fixture mirrors what CRIU 4.2 wrote for a runc 1.1 busybox container made with
//! `runc spec` (two tasks, the same namespaces, the same mount table).

use std::path::Path;

use gpusnap_criu_images::caps;
use gpusnap_criu_images::forge::{self, cap_words};
use gpusnap_criu_images::proto::*;
use gpusnap_criu_images::{bound_by_spec_on, Host, HostLsm, ImageError, Kind, Limits, Refusal};
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
        // Each mount its own device (a bind of another shares its device).
        root_dev: id,
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

// ----- the allowlist: what the model does not know is refused -----------------------------

/// An image of the type with `magic` holding `entries`, framed as CRIU frames it.
fn framed(magic: u32, entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = gpusnap_criu_images::image::IMG_COMMON_MAGIC
        .to_ne_bytes()
        .to_vec();
    out.extend(magic.to_ne_bytes());
    for e in entries {
        out.extend((e.len() as u32).to_ne_bytes());
        out.extend(e);
    }
    out
}

fn magic_of(file: &str) -> u32 {
    gpusnap_criu_images::catalog::by_name(file).unwrap().0.magic
}

#[test]
fn unknown_fields_enum_values_files_and_image_types_are_refused_by_name() {
    // A field number core_entry does not have, appended to an honest core.
    let mut f = Fixture::honest();
    let mut entry = prost::Message::encode_to_vec(&f.cores[0].1);
    prost::encoding::uint32::encode(99, &7, &mut entry);
    f.extra
        .push(("core-1.img".into(), forge::image(Kind::Core, &[entry])));
    refused(
        f.check(&spec_of(spec_json())),
        &[
            "core-1.img: entry 0: core_entry.#99 is field number 99 that CRIU 4.2.1's core_entry \
             does not have: not modeled, refused",
            "Take the checkpoint again without it",
        ],
    );

    // One nested in the thread's credentials.
    let mut f = Fixture::honest();
    let mut creds = prost::Message::encode_to_vec(f.creds(1));
    prost::encoding::bytes::encode(4242, &vec![1u8], &mut creds);
    let mut thread = Vec::new();
    prost::encoding::bytes::encode(10, &creds, &mut thread);
    let mut entry = Vec::new();
    prost::encoding::uint32::encode(1, &1, &mut entry);
    prost::encoding::bytes::encode(5, &thread, &mut entry);
    f.extra
        .push(("core-1.img".into(), forge::image(Kind::Core, &[entry])));
    refused(
        f.check(&spec_of(spec_json())),
        &["core_entry.thread_core.creds.#4242 is field number 4242"],
    );

    // An fd type CRIU 4.2.1 does not define.
    let mut f = Fixture::honest();
    let file = FileEntry {
        r#type: 77,
        id: 1,
        ..Default::default()
    };
    f.extra
        .push(("files.img".into(), forge::image_of(Kind::Files, &[file])));
    refused(
        f.check(&spec_of(spec_json())),
        &["files.img: entry 0: file_entry.type is 77, which CRIU 4.2.1's enum fd_types does not define"],
    );

    // Files that are no image of CRIU 4.2.1, and image types the model refuses.
    for (name, says) in [
        (
            "evil.img",
            "evil.img: file is neither gpusnap's nor the runtime's nor an image type",
        ),
        ("notes", "notes: file is neither"),
        ("core-1.img.orig", "core-1.img.orig: file is neither"),
        (
            "bpfmap-file.img",
            "bpfmap-file.img: image type BPFMAP_FILE is refused: BPF maps",
        ),
        (
            "tcp-stream-1a.img",
            "tcp-stream-1a.img: image type TCP_STREAM is refused",
        ),
        (
            "netns-ct-10.img",
            "netns-ct-10.img: image type NETNF_CT is refused: conntrack",
        ),
        (
            "binfmt-misc.img",
            "binfmt-misc.img: image type BINFMT_MISC is refused",
        ),
        (
            "inotify.img",
            "inotify.img: image type INOTIFY_FILE is refused",
        ),
    ] {
        let mut f = Fixture::honest();
        f.extra.push((name.into(), vec![0; 8]));
        refused(f.check(&spec_of(spec_json())), &[says]);
    }

    // Files the runtime and gpusnap write are not images.
    let mut f = Fixture::honest();
    for name in [
        "descriptors.json",
        "dump.log",
        "stats-dump",
        "gpusnap-manifest.json",
    ] {
        f.extra.push((name.into(), b"{}".to_vec()));
    }
    f.check(&spec_of(spec_json())).unwrap();

    // Open files of types the model refuses.
    for (file, says) in [
        (
            FileEntry {
                r#type: FdTypes::Netlinksk as i32,
                id: 3,
                nlsk: Some(NetlinkSkEntry::default()),
                ..Default::default()
            },
            "file_entry.nlsk is present: refused (a netlink socket",
        ),
        (
            FileEntry {
                r#type: FdTypes::Inotify as i32,
                id: 3,
                ify: Some(InotifyFileEntry::default()),
                ..Default::default()
            },
            "file_entry.ify is present: refused (inotify watches",
        ),
    ] {
        let mut f = Fixture::honest();
        f.extra
            .push(("files.img".into(), forge::image_of(Kind::Files, &[file])));
        refused(f.check(&spec_of(spec_json())), &[says]);
    }
}

// ----- finding 1: mount roots --------------------------------------------------------------

#[test]
fn mount_roots_that_leave_their_mount_are_refused() {
    let spec = spec_of(spec_json());
    // runc's read-only /proc/sys: a bind of the container's proc onto itself.
    let mut f = Fixture::honest();
    let proc_dev = f.mounts[1].root_dev;
    let sys = f
        .mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/proc/sys")
        .unwrap();
    sys.root = b"/sys".to_vec();
    sys.root_dev = proc_dev;
    f.check(&spec).unwrap();

    // /dev/shm as a bind of the /dev tmpfs climbing out of CRIU's mount yard.
    let mut f = Fixture::honest();
    let dev = f.mounts[2].root_dev;
    let shm = f
        .mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/dev/shm")
        .unwrap();
    shm.root = b"/../../../../../../etc".to_vec();
    shm.root_dev = dev;
    refused(
        f.check(&spec),
        &["mountpoints-13.img: root of /dev/shm is \"/../../../../../../etc\", not a plain absolute path"],
    );

    // The read-only variant at /sys/firmware (a masked path), and a plain path of the host.
    for root in [&b"/../../../etc"[..], b"/etc", b"/proc/self/root/etc"] {
        let mut f = Fixture::honest();
        let dev = f.mounts[2].root_dev;
        let fw = f
            .mounts
            .iter_mut()
            .find(|m| m.mountpoint == b"/sys/firmware")
            .unwrap();
        fw.root = root.to_vec();
        fw.root_dev = dev;
        refused(
            f.check(&spec),
            &["mountpoints-13.img: root of /sys/firmware is"],
        );
    }

    // A proc bind whose root is not its own mount point.
    let mut f = Fixture::honest();
    let proc_dev = f.mounts[1].root_dev;
    let sys = f
        .mounts
        .iter_mut()
        .find(|m| m.mountpoint == b"/proc/sys")
        .unwrap();
    sys.root = b"/self/root/etc".to_vec();
    sys.root_dev = proc_dev;
    refused(
        f.check(&spec),
        &["root of /proc/sys is \"/self/root/etc\", which is not a bind of the container's own proc mount onto itself"],
    );

    // A deleted mount: CRIU would create and remove the path the image names.
    let mut f = Fixture::honest();
    f.mounts[4].deleted = Some(true);
    refused(
        f.check(&spec),
        &["mnt_entry.deleted is Bool(true): refused (a mount whose root was deleted"],
    );

    // Propagation from a peer group outside the image.
    let mut f = Fixture::honest();
    f.mounts[4].master_id = Some(4242);
    refused(
        f.check(&spec),
        &["master_id of /dev/shm is peer group 4242"],
    );
}

// ----- finding 2: cgroup.img ---------------------------------------------------------------

fn cgroups(path: &str, children: usize) -> CgroupEntry {
    let dir = |name: &str| CgroupDirEntry {
        dir_name: name.as_bytes().to_vec(),
        properties: vec![CgroupPropEntry {
            name: b"pids.max".to_vec(),
            value: b"max".to_vec(),
            perms: None,
        }],
        ..Default::default()
    };
    let mut top = dir("ctr");
    top.children = (0..children).map(|i| dir(&format!("ctr/c{i}"))).collect();
    CgroupEntry {
        sets: vec![CgSetEntry {
            id: 2,
            ctls: ["pids", "memory"]
                .iter()
                .map(|n| CgMemberEntry {
                    name: n.as_bytes().to_vec(),
                    path: path.as_bytes().to_vec(),
                    cgns_prefix: None,
                })
                .collect(),
        }],
        controllers: ["pids", "memory"]
            .iter()
            .map(|n| CgControllerEntry {
                cnames: vec![n.as_bytes().to_vec()],
                dirs: vec![top.clone()],
                is_threaded: None,
            })
            .collect(),
    }
}

fn with_cgroups(cg: CgroupEntry) -> Fixture {
    let mut f = Fixture::honest();
    f.inventory.root_cg_set = Some(1);
    for (_, core) in &mut f.cores {
        core.tc.as_mut().unwrap().cg_set = Some(2);
        core.thread_core.as_mut().unwrap().cg_set = Some(2);
    }
    f.extra
        .push(("cgroup.img".into(), forge::image_of(Kind::Cgroup, &[cg])));
    f
}

#[test]
fn cgroup_sets_stay_in_the_container_cgroup() {
    let spec = spec_of(spec_json());
    with_cgroups(cgroups("/ctr", 0)).check(&spec).unwrap();
    // The node's root cgroup: CRIU would not rewrite it.
    refused(
        with_cgroups(cgroups("/", 0)).check(&spec),
        &["cgroup.img: sets set 2 (tc.cg_set of core-1.img): \"pids\" path \"/\" is not the dumped cgroup \"/ctr\""],
    );
    // A sibling that shares the dumped name's prefix, and a climb out of it.
    for path in ["/ctrevil", "/ctr/../evil", "/other/ctr"] {
        refused(
            with_cgroups(cgroups(path, 0)).check(&spec),
            &["is not the dumped cgroup \"/ctr\""],
        );
    }
    // Nested cgroups CRIU would create and configure.
    refused(
        with_cgroups(cgroups("/ctr", 2)).check(&spec),
        &[
            "cgroup.img: entry 0: cgroup_entry.controllers.dirs.children is present: refused \
           (nested cgroups CRIU would create and configure",
        ],
    );
    // A set the image does not hold.
    let mut f = with_cgroups(cgroups("/ctr", 0));
    f.cores[1].1.thread_core.as_mut().unwrap().cg_set = Some(9);
    refused(
        f.check(&spec),
        &["task 16 (core-16.img): thread_core.cg_set is set 9, which cgroup.img does not hold"],
    );
    // A controller whose cgroup was not dumped is not rewritten.
    let mut cg = cgroups("/ctr", 0);
    cg.controllers.pop();
    refused(
        with_cgroups(cg).check(&spec),
        &["\"memory\" path \"/ctr\" is not rewritten to the container's cgroup"],
    );
}

// ----- finding 9: limits, loginuid, oom, scheduling ------------------------------------------

fn rlimits(nofile: (u64, u64)) -> TaskRlimitsEntry {
    let mut r: Vec<RlimitEntry> = (0..16).map(|_| RlimitEntry { cur: 0, max: 0 }).collect();
    r[7] = RlimitEntry {
        cur: nofile.0,
        max: nofile.1,
    };
    TaskRlimitsEntry { rlimits: r }
}

#[test]
fn limits_loginuid_oom_and_scheduling_are_bounded() {
    let mut spec = spec_json();
    spec["process"]["rlimits"] = json!([{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]);
    spec["process"]["oomScoreAdj"] = json!(0);
    let spec = spec_of(spec);
    let host = Host::detect();
    fn tc(f: &mut Fixture) -> &mut TaskCoreEntry {
        f.cores[0].1.tc.as_mut().unwrap()
    }
    let mut f = Fixture::honest();
    tc(&mut f).rlimits = Some(rlimits((1024, 1024)));
    tc(&mut f).loginuid = host.loginuid;
    tc(&mut f).oom_score_adj = Some(0);
    f.check(&spec).unwrap();

    let mut bad = Fixture::honest();
    tc(&mut bad).rlimits = Some(rlimits((20000, 20000)));
    refused(
        bad.check(&spec),
        &["task 1 (core-1.img): rlimits[RLIMIT_NOFILE] has hard limit 20000, above the spec's process.rlimits, and the spec's bounding set lacks CAP_SYS_RESOURCE to raise it (spec 1024, image 20000)"],
    );
    let mut bad = Fixture::honest();
    tc(&mut bad).rlimits = Some(rlimits((2048, 1024)));
    refused(
        bad.check(&spec),
        &["has a soft limit 2048 above its hard limit 1024"],
    );

    let mut bad = Fixture::honest();
    tc(&mut bad).loginuid = Some(host.loginuid.map_or(0, |l| l.wrapping_add(1)));
    refused(
        bad.check(&spec),
        &[
            "task 1 (core-1.img): loginuid is",
            "lacks CAP_AUDIT_CONTROL",
        ],
    );

    let mut bad = Fixture::honest();
    tc(&mut bad).oom_score_adj = Some(-1000);
    refused(
        bad.check(&spec),
        &["oom_score_adj is -1000, below the 0 the container starts with"],
    );

    let mut bad = Fixture::honest();
    bad.core(16).sched_policy = Some(1);
    bad.core(16).sched_nice = Some(-20);
    refused(
        bad.check(&spec),
        &[
            "task 16 (core-16.img): sched_policy is a real-time policy (1)",
            "sched_nice is -20, a raised priority",
        ],
    );

    // With CAP_SYS_RESOURCE, CAP_AUDIT_CONTROL and CAP_SYS_NICE the container could do it.
    let mut spec = spec_json();
    let caps = json!([
        "CAP_AUDIT_WRITE",
        "CAP_KILL",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_RESOURCE",
        "CAP_AUDIT_CONTROL",
        "CAP_SYS_NICE"
    ]);
    spec["process"]["capabilities"] =
        json!({"bounding": caps, "permitted": caps, "effective": caps});
    spec["process"]["rlimits"] = json!([{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]);
    let mut f = Fixture::honest();
    tc(&mut f).rlimits = Some(rlimits((20000, 20000)));
    tc(&mut f).loginuid = Some(0);
    tc(&mut f).oom_score_adj = Some(-1000);
    f.core(16).sched_policy = Some(1);
    f.check(&spec_of(spec)).unwrap();
}

// ----- finding 9: tmpfs tarballs, ghost files ------------------------------------------------

enum Member<'a> {
    File(&'a str, u32),
    Dir(&'a str),
    Device(&'a str, tar::EntryType, u32, u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

fn tarball(members: &[Member<'_>]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for m in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_uid(0);
        h.set_gid(0);
        let name = match m {
            Member::File(n, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                n
            }
            Member::Dir(n) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                n
            }
            Member::Device(n, t, major, minor) => {
                h.set_entry_type(*t);
                h.set_mode(0o666);
                h.set_device_major(*major).unwrap();
                h.set_device_minor(*minor).unwrap();
                n
            }
            Member::Symlink(n, to) | Member::Hardlink(n, to) => {
                h.set_entry_type(if matches!(m, Member::Symlink(..)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                });
                h.set_mode(0o777);
                h.set_link_name(to).unwrap();
                n
            }
        };
        // Names as GNU tar writes them; set raw so that `..` and absolute names survive.
        let bytes = name.as_bytes();
        h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
        h.set_cksum();
        b.append(&h, std::io::empty()).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// The honest fixture with a tarball of its `/dev` tmpfs (device number: mount 70's).
fn with_dev_tarball(members: &[Member<'_>]) -> Fixture {
    let mut f = Fixture::honest();
    let dev = f.mounts[2].root_dev;
    f.extra
        .push((format!("tmpfs-dev-{dev}.tar.gz.img"), tarball(members)));
    f
}

#[test]
fn tmpfs_tarballs_hold_no_setuid_file_and_only_runcs_devices() {
    use tar::EntryType::{Block, Char};
    let spec = spec_of(spec_json());
    let honest = [
        Member::Dir("./"),
        Member::Device("./null", Char, 1, 3),
        Member::Device("./zero", Char, 1, 5),
        Member::Dir("./pts"),
        Member::Symlink("./fd", "/proc/self/fd"),
        Member::Symlink("./ptmx", "pts/ptmx"),
        Member::File("./console", 0o644),
    ];
    with_dev_tarball(&honest).check(&spec).unwrap();
    for (member, says) in [
        (
            Member::File("./suid-sh", 0o4755),
            "holds \"./suid-sh\", which is setuid (mode 0o4755)",
        ),
        (
            Member::File("./sgid-sh", 0o2755),
            "holds \"./sgid-sh\", which is setgid",
        ),
        (
            Member::Device("./sda", Block, 8, 0),
            "holds \"./sda\", a block device 8:0 at /dev/sda, which is not one runc creates",
        ),
        (
            Member::Device("./null", Char, 1, 1),
            "holds \"./null\", a character device 1:1 at /dev/null",
        ),
        (
            Member::Device("./kmsg", Char, 1, 11),
            "a character device 1:11 at /dev/kmsg",
        ),
        (
            Member::File("../escape", 0o644),
            "an absolute name or one with `..`",
        ),
        (
            Member::File("/etc/cron.d/x", 0o644),
            "an absolute name or one with `..`",
        ),
        (
            Member::File("./fd/x", 0o644),
            "below the symlink \"fd\" of the archive",
        ),
        (
            Member::Hardlink("./shadow", "/etc/shadow"),
            "a hard link to \"/etc/shadow\", which is not an earlier entry",
        ),
    ] {
        let mut members: Vec<Member<'_>> = vec![Member::Symlink("./fd", "/proc/self/fd")];
        members.push(member);
        refused(
            with_dev_tarball(&members).check(&spec),
            &["tmpfs-dev-70.tar.gz.img: content", says],
        );
    }
    // A device of the spec's linux.devices, at its path.
    let mut with_fuse = spec_json();
    with_fuse["linux"]["devices"] =
        json!([{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]);
    with_dev_tarball(&[Member::Device("./fuse", Char, 10, 229)])
        .check(&spec_of(with_fuse))
        .unwrap();
    // Not a tarball at all.
    let mut f = Fixture::honest();
    f.extra
        .push(("tmpfs-dev-70.tar.gz.img".into(), b"not gzip".to_vec()));
    refused(
        f.check(&spec),
        &["tmpfs-dev-70.tar.gz.img: content is not a"],
    );
}

#[test]
fn ghost_files_are_no_device_and_no_setuid_file() {
    let spec = spec_of(spec_json());
    let ghost = |mode: u32, rdev: Option<u32>| {
        let entry = prost::Message::encode_to_vec(&GhostFileEntry {
            mode,
            rdev,
            size: Some(3),
            ..Default::default()
        });
        let mut img = framed(magic_of("ghost-file-1.img"), &[entry]);
        img.extend(b"abc");
        img
    };
    let mut f = Fixture::honest();
    f.extra
        .push(("ghost-file-1.img".into(), ghost(0o100644, None)));
    f.check(&spec).unwrap();
    for (mode, rdev, says) in [
        (0o104755, None, "ghost-file-1.img: mode is setuid"),
        (
            0o060600,
            Some(0x800),
            "ghost-file-1.img: mode is a block device",
        ),
        (
            0o020666,
            Some(0x10b),
            "ghost-file-1.img: mode is a character device",
        ),
        (0o100644, Some(0x10b), "ghost-file-1.img: rdev is 0x10b"),
    ] {
        let mut f = Fixture::honest();
        f.extra.push(("ghost-file-1.img".into(), ghost(mode, rdev)));
        refused(f.check(&spec), &[says]);
    }
}

// ----- sockets, timers, terminals, network images ----------------------------------------------

#[test]
fn sockets_timers_terminals_and_devices_need_their_capabilities() {
    let spec = spec_of(spec_json());
    let files = |f: FileEntry| {
        let mut fx = Fixture::honest();
        fx.extra
            .push(("files.img".into(), forge::image_of(Kind::Files, &[f])));
        fx
    };
    let inet = |edit: &dyn Fn(&mut InetSkEntry)| {
        let mut s = InetSkEntry {
            id: 5,
            family: 2,
            r#type: 1,
            proto: 6,
            state: 10,
            src_port: 8080,
            ..Default::default()
        };
        edit(&mut s);
        FileEntry {
            r#type: FdTypes::Inetsk as i32,
            id: 5,
            isk: Some(s),
            ..Default::default()
        }
    };
    files(inet(&|_| {})).check(&spec).unwrap();
    // runc spec's set has CAP_NET_BIND_SERVICE.
    files(inet(&|s| s.src_port = 80)).check(&spec).unwrap();
    for (edit, says) in [
        (
            &(|s: &mut InetSkEntry| s.r#type = 3) as &dyn Fn(&mut InetSkEntry),
            "files.img: isk.type of socket 5 is a raw socket, which needs CAP_NET_RAW",
        ),
        (
            &|s: &mut InetSkEntry| s.opts.so_mark = Some(7),
            "opts.so_mark of socket 5 is 0x7, which needs CAP_NET_ADMIN",
        ),
        (
            &|s: &mut InetSkEntry| s.opts.so_priority = Some(7),
            "opts.so_priority of socket 5 is 7, above 6",
        ),
        (
            &|s: &mut InetSkEntry| s.opts.so_sndbuf = u32::MAX,
            "opts.so_sndbuf of socket 5 is 4294967295 bytes",
        ),
    ] {
        refused(files(inet(edit)).check(&spec), &[says]);
    }
    let mut no_bind = spec_json();
    no_bind["process"]["capabilities"] =
        json!({"bounding": ["CAP_KILL"], "permitted": ["CAP_KILL"]});
    let mut f = files(inet(&|s| s.src_port = 80));
    for t in [1, 16] {
        *f.creds(t) = forge::creds(0, 0, 1 << 5);
    }
    refused(
        f.check(&spec_of(no_bind)),
        &["isk.src_port of socket 5 is 80, below 1024"],
    );

    let timer = FileEntry {
        r#type: FdTypes::Timerfd as i32,
        id: 6,
        tfd: Some(TimerfdEntry {
            id: 6,
            clockid: 9,
            ..Default::default()
        }),
        ..Default::default()
    };
    refused(
        files(timer).check(&spec),
        &["tfd.clockid of timerfd 6 is an alarm clock (9), which needs CAP_WAKE_ALARM"],
    );

    // A type that does not match its sub-message.
    let odd = FileEntry {
        r#type: FdTypes::Pipe as i32,
        id: 7,
        reg: Some(RegFileEntry::default()),
        ..Default::default()
    };
    refused(
        files(odd).check(&spec),
        &["type of file 7 is PIPE but the entry holds [\"REG\"]"],
    );

    // SIGIO owner credentials, bounded like the uid.
    let mut user = spec_json();
    user["process"]["user"] = json!({"uid": 1000, "gid": 1000});
    let pipe = FileEntry {
        r#type: FdTypes::Pipe as i32,
        id: 8,
        pipe: Some(PipeEntry {
            id: 8,
            fown: FownEntry {
                uid: 0,
                euid: 0,
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut f = files(pipe);
    for t in [1, 16] {
        *f.creds(t) = forge::creds(1000, 1000, 0);
    }
    refused(
        f.check(&spec_of(user)),
        &["files.img: fown.uid of file 8 is 0"],
    );

    // A terminal that is not a pseudo-terminal.
    let mut f = Fixture::honest();
    let tty = TtyInfoEntry {
        id: 1,
        r#type: TtyType::Vt as i32,
        ..Default::default()
    };
    f.extra.push((
        "tty-info.img".into(),
        forge::image_of(Kind::TtyInfo, &[tty]),
    ));
    refused(f.check(&spec), &["tty-info.img: type of terminal 1 is VT"]);

    // A network device other than loopback, in the container's namespace (10).
    let mut f = Fixture::honest();
    let veth = NetDeviceEntry {
        r#type: NdType::Veth as i32,
        name: b"eth0".to_vec(),
        ..Default::default()
    };
    f.extra.push((
        "netdev-10.img".into(),
        forge::image_of(Kind::Netdev, &[veth]),
    ));
    refused(
        f.check(&spec),
        &["netdev-10.img: type of device \"eth0\" is VETH"],
    );

    // Network images for the node's namespace (CRIU's own, 2).
    let mut f = Fixture::honest();
    f.extra.push(("route-2.img".into(), vec![]));
    refused(
        f.check(&spec),
        &["route-2.img: network namespace 2 is CRIU's own"],
    );

    // Netfilter rules without CAP_NET_ADMIN; empty tables are what every namespace has.
    let mut f = Fixture::honest();
    f.extra.push((
        "iptables-10.img".into(),
        b"# Generated\n*filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n".to_vec(),
    ));
    f.check(&spec).unwrap();
    f.extra.push((
        "ip6tables-10.img".into(),
        b"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j LOG\nCOMMIT\n".to_vec(),
    ));
    refused(
        f.check(&spec),
        &["ip6tables-10.img: rules hold \"-A INPUT -j LOG\""],
    );
}

/// A process tree cut short at an entry boundary, or a thread left out of its task's list, is
/// a well-formed `pstree.img`: the images of what it lost give it away (CRIU would restore
/// without them), and the checkpoint is refused naming them.
#[test]
fn a_process_tree_cut_short_is_refused_by_the_images_it_left() {
    let spec = spec_of(spec_json());
    let mut f = Fixture::honest();
    f.pstree.truncate(1);
    refused(
        f.check(&spec),
        &[
            "core-16.img: thread 16 is not in pstree.img: the process tree was cut short",
            "ids-16.img: task 16 is not in pstree.img",
        ],
    );
    let mut f = Fixture::honest();
    f.pstree[1].threads = vec![16, 17];
    let thread = f.cores[1].1.clone();
    f.cores.push((17, thread));
    f.check(&spec).unwrap();
    f.pstree[1].threads = vec![16];
    refused(
        f.check(&spec),
        &["core-17.img: thread 17 is not in pstree.img"],
    );
}

// ----- a bounded, deterministic fuzz run --------------------------------------------------

/// xorshift64*: a fixed seed gives the same run everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The honest fixture with one of each image the model bounds beyond the credentials.
fn rich_fixture() -> Fixture {
    let mut f = with_cgroups(cgroups("/ctr", 0));
    let dev = f.mounts[2].root_dev;
    f.extra.push((
        format!("tmpfs-dev-{dev}.tar.gz.img"),
        tarball(&[
            Member::Dir("./"),
            Member::Device("./null", tar::EntryType::Char, 1, 3),
            Member::Symlink("./fd", "/proc/self/fd"),
            Member::File("./console", 0o644),
        ]),
    ));
    let files = [
        FileEntry {
            r#type: FdTypes::Reg as i32,
            id: 1,
            reg: Some(RegFileEntry {
                id: 1,
                name: b"/tmp/log".to_vec(),
                mnt_id: Some(68),
                ..Default::default()
            }),
            ..Default::default()
        },
        FileEntry {
            r#type: FdTypes::Inetsk as i32,
            id: 2,
            isk: Some(InetSkEntry {
                id: 2,
                family: 2,
                r#type: 1,
                proto: 6,
                src_port: 8080,
                ..Default::default()
            }),
            ..Default::default()
        },
        FileEntry {
            r#type: FdTypes::Pipe as i32,
            id: 3,
            pipe: Some(PipeEntry {
                id: 3,
                pipe_id: 9,
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    f.extra
        .push(("files.img".into(), forge::image_of(Kind::Files, &files)));
    let data = prost::Message::encode_to_vec(&PipeDataEntry {
        pipe_id: 9,
        bytes: 4,
        size: None,
    });
    let mut pipes = framed(magic_of("pipes-data.img"), &[data]);
    pipes.extend(b"data");
    f.extra.push(("pipes-data.img".into(), pipes));
    let ghost = prost::Message::encode_to_vec(&GhostFileEntry {
        mode: 0o100600,
        size: Some(2),
        ..Default::default()
    });
    let mut img = framed(magic_of("ghost-file-1.img"), &[ghost]);
    img.extend(b"hi");
    f.extra.push(("ghost-file-1.img".into(), img));
    f
}

/// Mutations of the honest images (bit flips, truncations, duplicated and dropped bytes,
/// changed lengths, inserted unknown fields) through the parser, the walk and the whole
/// bound: no panic, and every outcome either a refusal or exactly the honest result.
///
/// The honest result is what the bound returns for the unmutated images: accepted, with the
/// same [`gpusnap_criu_images::Report`] — as many tasks and threads, and the same number of
/// image files read. A mutation the bound accepts may change only what it does not bound (a
/// register, a timestamp: as honest as the original); one that changes what is restored — a
/// task or thread fewer or more, an image read or left unread — must be refused. Bounded for
/// CI: a fixed seed and a fixed number of runs (a few seconds unloaded).
#[test]
fn mutated_images_are_refused_or_exactly_the_honest_result() {
    const RUNS: usize = 1500;
    let spec = spec_of(spec_json());
    let honest = rich_fixture();
    let dir = tempfile::tempdir().unwrap();
    honest.write(dir.path());
    let honest_result = bound_by_spec_on(dir.path(), &spec, HostLsm::None, Limits::default())
        .expect("the honest fixture passes");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let originals: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(dir.path().join(n)).unwrap())
        .collect();
    let mut rng = Rng(0x6770_7573_6e61_7000);
    let (mut accepted, mut refused) = (0, 0);
    for run in 0..RUNS {
        let i = rng.below(names.len());
        let mut bytes = originals[i].clone();
        let what = mutate(&mut rng, &mut bytes);
        std::fs::write(dir.path().join(&names[i]), &bytes).unwrap();
        let outcome = std::panic::catch_unwind(|| {
            bound_by_spec_on(dir.path(), &spec, HostLsm::None, Limits::default())
        });
        std::fs::write(dir.path().join(&names[i]), &originals[i]).unwrap();
        match outcome {
            Err(_) => panic!("run {run}: {what} of {} panicked", names[i]),
            Ok(Ok(r)) => {
                // Accepted: exactly what the honest images give, or the bound missed a change.
                assert_eq!(
                    r, honest_result,
                    "run {run}: {what} of {} was accepted with a result the honest images do \
                     not give",
                    names[i]
                );
                accepted += 1;
            }
            Ok(Err(e)) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
        }
    }
    // Both outcomes happen: the run reaches past the framing into the model.
    assert!(
        accepted > 0 && refused > RUNS / 4,
        "{accepted} accepted, {refused} refused"
    );
}

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) -> &'static str {
    let len = bytes.len();
    match rng.below(6) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(len);
                bytes[at] ^= 1 << rng.below(8);
            }
            "bit flips"
        }
        1 => {
            bytes.truncate(rng.below(len));
            "truncation"
        }
        2 => {
            // A field (or any span) repeated: protobuf merges repeated fields.
            let from = rng.below(len);
            let to = (from + 1 + rng.below(16)).min(len);
            let span = bytes[from..to].to_vec();
            let at = rng.below(len);
            bytes.splice(at..at, span);
            "duplicated bytes"
        }
        3 => {
            let at = rng.below(len.saturating_sub(4)).min(len.saturating_sub(4));
            let n = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
            let delta = [1u32, 2, 7, 1 << 20, u32::MAX][rng.below(5)];
            bytes[at..at + 4].copy_from_slice(&n.wrapping_add(delta).to_ne_bytes());
            "changed length"
        }
        4 => {
            // An unknown field appended to the first entry, its length fixed up.
            if len >= 12 {
                let mut field = Vec::new();
                let tag = 50 + rng.below(1000) as u32;
                prost::encoding::uint64::encode(tag, &rng.next(), &mut field);
                let n = u32::from_ne_bytes(bytes[8..12].try_into().unwrap()) as usize;
                if 12 + n <= len {
                    bytes.splice(12 + n..12 + n, field.iter().copied());
                    bytes[8..12].copy_from_slice(&((n + field.len()) as u32).to_ne_bytes());
                }
            }
            "inserted unknown field"
        }
        _ => {
            let from = rng.below(len);
            let to = (from + 1 + rng.below(8)).min(len);
            bytes.drain(from..to);
            "dropped bytes"
        }
    }
}

/// runc hands CRIU a pid or network namespace the spec joins by path under its own key
/// (pods sharing a pid namespace): accepted only then, and only with runc's key.
#[test]
fn external_namespaces_are_runcs_for_a_namespace_the_spec_joins() {
    let pidns = |key: &str| {
        let entry = prost::Message::encode_to_vec(&PidnsEntry {
            ext_key: Some(key.as_bytes().to_vec()),
        });
        framed(magic_of("pidns-9.img"), &[entry])
    };
    let mut joined = spec_json();
    joined["linux"]["namespaces"][0] = json!({"type": "pid", "path": "/proc/1/ns/pid"});
    let mut f = Fixture::honest();
    f.extra.push(("pidns-9.img".into(), pidns("extRootPidNS")));
    f.check(&spec_of(joined.clone())).unwrap();
    refused(
        f.check(&spec_of(spec_json())),
        &["pidns-9.img: ext_key is \"extRootPidNS\": an external pid namespace"],
    );
    let mut f = Fixture::honest();
    f.extra.push(("pidns-9.img".into(), pidns("CRIU:whatever")));
    refused(
        f.check(&spec_of(joined)),
        &["pidns-9.img: ext_key is \"CRIU:whatever\""],
    );
}

/// With a terminal, runc binds the pty it allocated (`/0` of the container's devpts) over
/// `/dev/console`; only that.
#[test]
fn the_console_is_a_pty_of_the_containers_devpts() {
    let mut spec = spec_json();
    spec["process"]["terminal"] = true.into();
    let spec = spec_of(spec);
    let console = |f: &mut Fixture, root: &[u8], dev: u32| {
        let mut m = mnt(90, 70, 6, "/dev/console", 0);
        m.root = root.to_vec();
        m.root_dev = dev;
        f.mounts.push(m);
    };
    let mut f = Fixture::honest();
    let devpts = f.mounts[3].root_dev;
    console(&mut f, b"/0", devpts);
    f.check(&spec).unwrap();
    for (root, dev, says) in [
        (
            &b"/../../etc"[..],
            devpts,
            "root of /dev/console is \"/../../etc\", not a plain",
        ),
        (b"/ptmx", devpts, "root of /dev/console is \"/ptmx\""),
        (
            b"/0",
            4242,
            "a pseudo-terminal of no devpts mount of the container",
        ),
    ] {
        let mut f = Fixture::honest();
        console(&mut f, root, dev);
        refused(f.check(&spec), &[says]);
    }
}
