//! Kubernetes-style checkpoint and restore through containerd's real CRI, with the test playing
//! the kubelet (CRI gRPC over containerd's socket) and a real OCI registry on loopback.
//!
//! Node A checkpoints a running pod's container with `CheckpointContainer` (the kubelet
//! checkpoint API's CRI call); the archive becomes a gpusnap checkpoint image
//! (`gpusnap_oci_image::build`), is pushed to the registry and pulled again; node B —
//! a second containerd with its own root, state and gpusnap config — restores it:
//!
//! - (b) by pod annotation `gpusnap.io/restore-from: NAME` on a checkpoint extracted under its
//!   `restore.checkpoint_root` (what `gpusnap image pull --extract` does);
//! - (a) by containerd 2.1's own CRI restore: `CreateContainer` with the checkpoint image as the
//!   container image, pulled by CRI from the registry.
//!
//! The tests run one at a time (each drives two containerds on a 2-core machine).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use gpusnap_fake_libcuda::FakeCuda;
use gpusnap_oci_image::{self as image, BuildOptions, RegistryOptions};
use gpusnap_testkit::busybox_registry::{registry_with_busybox, BUSYBOX_REPO};
use gpusnap_testkit::cri::{
    gpusnap_handler, wait_for_state, ConfigVia, ContainerSpec, CriNode, CriNodeOptions, Pod,
    Registry,
};
use k8s_cri::v1::ContainerState;

/// The workload: a random token kept in shell memory and a counter, reported every 100 ms.
/// A restored process goes on with the same token and counts up from where it was; a fresh
/// start would draw a new token and start from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counter {
    /// Into /tmp/count (so the rootfs diff carries it too), read with ExecSync.
    File,
    /// To stdout, read from the CRI container log on the host. For the GPU test: no file in
    /// the container changes while it runs (see the note at the GPU test).
    Stdout,
}

impl Counter {
    fn script(self) -> &'static str {
        match self {
            Counter::File => {
                "tok=$(cat /proc/sys/kernel/random/uuid); i=0; \
                 while true; do i=$((i+1)); echo \"$tok $i\" > /tmp/count; sleep 0.1; done"
            }
            Counter::Stdout => {
                "tok=$(cat /proc/sys/kernel/random/uuid); i=0; \
                 while true; do i=$((i+1)); echo \"$tok $i\"; sleep 0.1; done"
            }
        }
    }
}

/// The file the test writes into the container (through ExecSync) before the checkpoint: it
/// reaches node B only through the checkpoint's rootfs diff.
const NOTE: &str = "/tmp/note.txt";
const NOTE_TEXT: &str = "written on node A before the checkpoint";

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn check(f: impl FnOnce() -> Result<()>) {
    let _serial = serial();
    if let Err(e) = f() {
        panic!("{e:#}");
    }
}

fn node(reg: &Registry, extra_config: &str, via: ConfigVia) -> Result<CriNode> {
    let node = CriNode::start(CriNodeOptions {
        gpusnap_config: extra_config.to_string(),
        config_via: via,
        registry_host: Some(reg.host()),
        ..Default::default()
    })?;
    node.cri
        .pull_image(&reg.image(BUSYBOX_REPO))
        .context("CRI PullImage of busybox from the test registry")?;
    Ok(node)
}

fn counter_spec(reg: &Registry, counter: Counter, env: &[(&str, &str)]) -> ContainerSpec {
    ContainerSpec {
        name: "counter".into(),
        image: reg.image(BUSYBOX_REPO),
        command: vec!["sh".into(), "-c".into(), counter.script().into()],
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// (token, count) the workload reported last.
fn count(node: &CriNode, w: &Workload) -> Result<(String, u64)> {
    let id = &w.id;
    let mut last = String::new();
    for _ in 0..50 {
        last = match w.counter {
            Counter::File => node.exec_ok(id, &["cat", "/tmp/count"])?,
            Counter::Stdout => {
                // CRI log lines: `<time> stdout F <text>`.
                let log = Path::new(&w.pod.config.log_directory).join("counter.log");
                let text = fs::read_to_string(&log).unwrap_or_default();
                text.lines()
                    .rev()
                    .find_map(|l| l.split_once(" stdout F ").map(|(_, t)| t.to_string()))
                    .unwrap_or_default()
            }
        };
        if let Some((tok, n)) = last.trim().split_once(' ') {
            if let Ok(n) = n.parse() {
                return Ok((tok.to_string(), n));
            }
        }
        // Caught between truncate and write.
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "the counter of {id} ({:?}) does not read `TOKEN N`: {last:?}",
        w.counter
    )
}

/// Waits (10 s at most) until the counter of `w` — still the process with `token` — is past
/// `n`.
fn advances(node: &CriNode, w: &Workload, token: &str, n: u64) -> Result<u64> {
    let mut last = None;
    let got = gpusnap_testkit::wait_some(Duration::from_secs(10), || {
        let c = count(node, w).ok();
        last.clone_from(&c);
        c.filter(|(t, m)| t == token && *m > n).map(|(_, m)| m)
    });
    got.with_context(|| format!("want token {token} past {n}; last read {last:?}"))
}

/// A counter container and its pod.
struct Workload {
    pod: Pod,
    id: String,
    counter: Counter,
}

/// A running counter container in a fresh pod on `node`, counted past 15, with the note file
/// written.
fn start_workload(
    node: &CriNode,
    reg: &Registry,
    pod_name: &str,
    counter: Counter,
    env: &[(&str, &str)],
) -> Result<Workload> {
    let pod = node.run_pod(pod_name, &[], gpusnap_handler())?;
    let id = node.run_container(&pod, &counter_spec(reg, counter, env))?;
    let w = Workload { pod, id, counter };
    let id = &w.id;
    wait_for_state(
        node,
        id,
        ContainerState::ContainerRunning,
        Duration::from_secs(20),
    )?;
    node.exec_ok(id, &["sh", "-c", &format!("echo '{NOTE_TEXT}' > {NOTE}")])?;
    // Counting for a while, so that a restart from 1 cannot be mistaken for a restore.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, n) = count(node, &w)?;
        if n >= 15 {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "counter stuck at {n}");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(w)
}

/// A checkpoint archive of `w` made through CRI; returns the path and the counter observed
/// just before and just after it.
struct Checkpointed {
    archive: PathBuf,
    token: String,
    before: u64,
    after: u64,
}

fn cri_checkpoint(node: &CriNode, w: &Workload, dir: &Path) -> Result<Checkpointed> {
    let (token, before) = count(node, w)?;
    let archive = dir.join("checkpoint-counter.tar");
    node.cri
        .checkpoint_container(&w.id, &archive, 60)
        .context("CRI CheckpointContainer")?;
    let (tok2, after) = count(node, w)?;
    ensure!(tok2 == token, "the checkpoint restarted the workload");
    Ok(Checkpointed {
        archive,
        token,
        before,
        after,
    })
}

/// A counter started in pod `pod_name` on a fresh node and checkpointed through CRI into
/// `dir`; the node is gone when this returns.
fn checkpoint_on_a_node(reg: &Registry, pod_name: &str, dir: &Path) -> Result<Checkpointed> {
    let a = node(reg, "", ConfigVia::RuntimeOptions)?;
    let w = start_workload(&a, reg, pod_name, Counter::File, &[])?;
    cri_checkpoint(&a, &w, dir)
}

/// The archive extracted into `dir`, with the type of every entry by path.
fn unpack_archive(archive: &Path, dir: &Path) -> Result<BTreeMap<String, tar::EntryType>> {
    let mut kinds = BTreeMap::new();
    let mut a = tar::Archive::new(fs::File::open(archive)?);
    for e in a.entries()? {
        let mut e = e?;
        let path = e
            .path()?
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        kinds.insert(path, e.header().entry_type());
        e.unpack_in(dir)?;
    }
    Ok(kinds)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Checks the CRI checkpoint archive file by file; returns the parsed gpusnap manifest.
fn assert_archive_layout(
    ck: &Checkpointed,
    node: &CriNode,
    w: &Workload,
    reg: &Registry,
) -> Result<serde_json::Value> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(&ck.archive)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "archive mode {mode:o}, CRI writes 0600");
    let x = tempfile::tempdir()?;
    let kinds = unpack_archive(&ck.archive, x.path())?;
    let root = x.path();

    // Top level: what containerd 2.1's CheckpointContainer writes, and nothing unknown.
    for required in [
        "checkpoint",
        "rootfs-diff.tar",
        "spec.dump",
        "config.dump",
        "status.dump",
        "status",
        "container.log",
    ] {
        ensure!(
            kinds.contains_key(required),
            "{required} missing from the archive: {:?}",
            kinds.keys().collect::<Vec<_>>()
        );
    }
    let known_top = [
        "checkpoint",
        "rootfs-diff.tar",
        "spec.dump",
        "config.dump",
        "status.dump",
        "status",
        "container.log",
        "dump.log",
        "stats-dump",
    ];
    for top in kinds.keys().filter(|k| !k.contains('/')) {
        ensure!(
            known_top.contains(&top.as_str()),
            "unexpected top-level entry {top}"
        );
    }
    ensure!(kinds["checkpoint"] == tar::EntryType::Directory);

    // checkpoint/: flat (CRI's unpacking creates no directories), CRIU + runc + gpusnap files.
    let mut in_checkpoint = BTreeMap::new();
    for (path, kind) in kinds.iter().filter(|(k, _)| k.starts_with("checkpoint/")) {
        let name = &path["checkpoint/".len()..];
        ensure!(
            !name.contains('/'),
            "nested entry {path}: the checkpoint dir must be flat"
        );
        ensure!(
            *kind == tar::EntryType::Regular,
            "{path} is {kind:?}, not a file"
        );
        in_checkpoint.insert(name.to_string(), fs::metadata(root.join(path))?.len());
    }
    for required in [
        "inventory.img",
        "pstree.img",
        "core-1.img",
        "mm-1.img",
        "pagemap-1.img",
        "descriptors.json",
        "gpusnap-manifest.json",
    ] {
        ensure!(
            in_checkpoint.contains_key(required),
            "checkpoint/{required} missing: {:?}",
            in_checkpoint.keys().collect::<Vec<_>>()
        );
    }
    ensure!(
        in_checkpoint
            .keys()
            .any(|n| n.starts_with("pages-") && n.ends_with(".img")),
        "no CRIU pages-*.img"
    );

    // The gpusnap manifest: this container, its processes, every image file with its digests.
    let m = read_json(&root.join("checkpoint/gpusnap-manifest.json"))?;
    ensure!(
        m["kind"] == "gpusnap-checkpoint" && m["format_version"] == 2,
        "{m}"
    );
    ensure!(
        m["container_id"] == w.id.as_str(),
        "manifest container_id {}",
        m["container_id"]
    );
    let init_pid = node.pid(&w.id)?;
    let procs = m["processes"].as_array().context("manifest processes")?;
    ensure!(
        procs
            .iter()
            .any(|p| p["container_pid"] == 1 && p.get("host_pid").is_none()),
        "init (container pid 1, no host pid {init_pid}) not among {procs:?}"
    );
    ensure!(
        m["criu"]
            == serde_json::json!({"tcp_established": false, "ext_unix_sk": false, "shell_job": false, "file_locks": false, "empty_ns": [], "manage_cgroups_mode": null}),
        "CRI asks for no CRIU flags: {}",
        m["criu"]
    );
    let files = m["images"]["files"]
        .as_array()
        .context("manifest images.files")?;
    let mut listed = BTreeMap::new();
    let mut total = 0;
    for f in files {
        let path = f["path"].as_str().context("file path")?;
        let size = f["size"].as_u64().context("file size")?;
        let chunks: Vec<&str> = f["blake3_chunks"]
            .as_array()
            .context("blake3_chunks")?
            .iter()
            .filter_map(|c| c.as_str())
            .collect();
        let data = fs::read(root.join("checkpoint").join(path))
            .with_context(|| format!("manifest lists {path}, the archive lacks it"))?;
        ensure!(
            data.len() as u64 == size,
            "{path}: {} bytes, manifest {size}",
            data.len()
        );
        // One chunk per 64 MiB; these files are small.
        ensure!(chunks.len() == 1, "{path}: {} digests", chunks.len());
        ensure!(
            blake3::hash(&data).to_hex().as_str() == chunks[0],
            "{path}: BLAKE3 differs from the manifest"
        );
        listed.insert(path.to_string(), size);
        total += size;
    }
    ensure!(m["images"]["total_bytes"] == total, "total_bytes");
    for (name, size) in &in_checkpoint {
        let is_log = name.ends_with(".log");
        if name == "gpusnap-manifest.json" || is_log {
            continue;
        }
        // The writable layer's record: outside the inventory, sealed by the size and BLAKE3
        // the manifest's container record holds.
        if name == "gpusnap-writable-layer.jsonl" {
            let layer = &m["container"]["writable_layer"];
            ensure!(
                layer["listing_bytes"] == *size
                    && layer["listing_blake3"].as_str()
                        == Some(
                            blake3::hash(&fs::read(root.join("checkpoint").join(name))?)
                                .to_hex()
                                .as_str()
                        ),
                "checkpoint/{name} is not the listing the manifest records: {layer}"
            );
            continue;
        }
        ensure!(
            listed.get(name) == Some(size),
            "checkpoint/{name} ({size} bytes) not sealed by the manifest"
        );
    }

    // spec.dump: the container's OCI spec, with CRI's annotations.
    let spec = read_json(&root.join("spec.dump"))?;
    let ann = &spec["annotations"];
    ensure!(
        ann["io.kubernetes.cri.container-type"] == "container",
        "{ann}"
    );
    ensure!(
        ann["io.kubernetes.cri.sandbox-id"] == w.pod.id.as_str(),
        "{ann}"
    );
    ensure!(
        ann["io.kubernetes.cri.container-name"] == "counter",
        "{ann}"
    );
    ensure!(
        spec["process"]["args"][2] == w.counter.script(),
        "{}",
        spec["process"]["args"]
    );
    // config.dump: checkpointctl's container config.
    let config = read_json(&root.join("config.dump"))?;
    ensure!(config["id"] == w.id.as_str(), "{config}");
    ensure!(config["runtime"] == "io.containerd.gpusnap.v2", "{config}");
    ensure!(
        config["rootfsImageName"] == reg.image(BUSYBOX_REPO).as_str(),
        "{config}"
    );
    let image_ref = config["rootfsImageRef"].as_str().unwrap_or_default();
    ensure!(
        image_ref.starts_with(&format!("{}/gpusnap/busybox@sha256:", reg.host())),
        "rootfsImageRef {image_ref:?}: the base image by digest"
    );
    // status.dump: the CRI ContainerStatus at checkpoint time (RUNNING).
    let status = read_json(&root.join("status.dump"))?;
    ensure!(
        status["id"] == w.id.as_str() && status["state"] == 1,
        "{status}"
    );
    ensure!(
        read_json(&root.join("status"))?["Pid"] == init_pid,
        "status Pid"
    );

    // rootfs-diff.tar: the writable layer (gzip despite the name) with the files written.
    let diff = fs::File::open(root.join("rootfs-diff.tar"))?;
    let mut diff = tar::Archive::new(flate2::read::GzDecoder::new(diff));
    let mut diff_files = BTreeMap::new();
    for e in diff.entries()? {
        let mut e = e?;
        let path = e.path()?.to_string_lossy().into_owned();
        let mut data = String::new();
        if e.header().entry_type() == tar::EntryType::Regular {
            std::io::Read::read_to_string(&mut e, &mut data)?;
        }
        diff_files.insert(path, data);
    }
    ensure!(
        diff_files.get("tmp/note.txt").map(|s| s.trim()) == Some(NOTE_TEXT),
        "rootfs diff lacks the note: {diff_files:?}"
    );
    if w.counter == Counter::File {
        ensure!(
            diff_files
                .get("tmp/count")
                .is_some_and(|c| c.starts_with(&ck.token)),
            "rootfs diff lacks the counter file: {diff_files:?}"
        );
    }
    Ok(m)
}

/// The checkpoint archive as an image in the registry, pulled back into a local layout.
struct Published {
    built: image::BuiltImage,
    /// The pulled OCI layout (what `gpusnap image pull` writes).
    pulled: PathBuf,
    /// `127.0.0.1:<port>/<repo:tag>`, as CRI pulls it.
    cri_ref: String,
}

fn publish(
    reg: &Registry,
    archive: &Path,
    repo_tag: &str,
    work: &Path,
    verify_checkpoint: bool,
) -> Result<Published> {
    let oci = work.join(format!("{}.oci.tar", repo_tag.replace(['/', ':'], "_")));
    let built = image::build(
        archive,
        &BuildOptions {
            archive_path: Some(oci.clone()),
            image_name: Some(reg.image(repo_tag)),
            verify_checkpoint,
            ..Default::default()
        },
    )
    .context("image build")?;
    ensure!(
        built
            .annotations
            .get(image::keys::CRIU_CONTAINER_NAME)
            .map(String::as_str)
            == Some("counter"),
        "containerd's checkpoint annotation: {:?}",
        built.annotations
    );
    let pushed =
        image::push(&oci, &reg.url(repo_tag), &RegistryOptions::default()).context("image push")?;
    ensure!(pushed.digest == built.index_digest, "pushed {pushed:?}");
    let pulled = work.join(format!("pulled-{}", repo_tag.replace(['/', ':'], "_")));
    let report =
        image::pull(&reg.url(repo_tag), &pulled, &RegistryOptions::default()).context("pull")?;
    ensure!(report.digest == built.index_digest, "pulled {report:?}");
    Ok(Published {
        built,
        pulled,
        cri_ref: reg.image(repo_tag),
    })
}

/// `gpusnap image pull --extract`: the pulled image extracted under the node's
/// `restore.checkpoint_root`; returns the checkpoint's name there.
fn extract_to_node(p: &Published, node: &CriNode, name: &str) -> Result<PathBuf> {
    let dest = node.checkpoint_root().join(name);
    let out = image::extract(&p.pulled, &dest).context("image extract")?;
    ensure!(out.checkpoint_dir == dest.join("checkpoint"), "{out:?}");
    ensure!(
        dest.join("rootfs-diff.tar").is_file(),
        "no rootfs-diff.tar in {}",
        dest.display()
    );
    Ok(dest)
}

/// A counter container in a new pod `pod_name` whose annotation restores it from the
/// checkpoint `checkpoint` under the node's checkpoint root.
fn restore_by_annotation(
    node: &CriNode,
    reg: &Registry,
    pod_name: &str,
    checkpoint: &str,
    counter: Counter,
    env: &[(&str, &str)],
) -> Result<Workload> {
    let pod = node.run_pod(
        pod_name,
        &[("gpusnap.io/restore-from", checkpoint)],
        gpusnap_handler(),
    )?;
    let id = node.run_container(&pod, &counter_spec(reg, counter, env))?;
    Ok(Workload { pod, id, counter })
}

/// The restored container runs the checkpointed process: same token, counting on from the
/// checkpointed value, and the note written before the checkpoint is there.
fn assert_restored(node: &CriNode, w: &Workload, ck: &Checkpointed) -> Result<u64> {
    let id = &w.id;
    wait_for_state(
        node,
        id,
        ContainerState::ContainerRunning,
        Duration::from_secs(20),
    )?;
    let (token, n) = count(node, w)?;
    ensure!(
        token == ck.token,
        "restored container runs a new process (token {token}, checkpointed {})",
        ck.token
    );
    ensure!(
        n >= ck.before,
        "counter {n} is below the checkpointed value (between {} and {})",
        ck.before,
        ck.after
    );
    let note = node.exec_ok(id, &["cat", NOTE])?;
    ensure!(note.trim() == NOTE_TEXT, "note after restore: {note:?}");
    // It goes on: the same process counts past n (a bounded wait, no fixed sleep).
    advances(node, w, &ck.token, n).context("the restored counter does not advance")?;
    Ok(n)
}

#[test]
fn cri_checkpoint_writes_the_archive_and_leaves_the_container_running() {
    check(|| {
        let reg = registry_with_busybox()?;
        let a = node(&reg, "", ConfigVia::RuntimeOptions)?;
        let w = start_workload(&a, &reg, "ck-layout", Counter::File, &[])?;
        let pid = a.pid(&w.id)?;
        let out = tempfile::tempdir()?;
        let ck = cri_checkpoint(&a, &w, out.path())?;
        let m = assert_archive_layout(&ck, &a, &w, &reg)?;
        ensure!(
            m.get("gpu").is_none_or(|g| g.is_null()),
            "no CUDA, no gpu section: {m}"
        );
        // CRI leaves the container running: same process, still counting.
        ensure!(a.state(&w.id)? == ContainerState::ContainerRunning);
        ensure!(a.pid(&w.id)? == pid, "the checkpoint replaced the process");
        advances(&a, &w, &ck.token, ck.after)
            .context("the counter stopped after the checkpoint")?;
        // A second checkpoint of the same container works too (the work dir is reused).
        let again = out.path().join("again.tar");
        a.cri.checkpoint_container(&w.id, &again, 0)?;
        ensure!(again.is_file());
        Ok(())
    })
}

#[test]
fn checkpoint_image_restores_on_another_node_by_pod_annotation() {
    check(|| {
        let reg = registry_with_busybox()?;
        let work = tempfile::tempdir()?;
        // Node A goes away after the checkpoint: the workload moves.
        let ck = checkpoint_on_a_node(&reg, "ann-a", work.path())?;
        let published = publish(
            &reg,
            &ck.archive,
            "gpusnap/ck-counter:ann",
            work.path(),
            true,
        )?;

        let b = node(&reg, "", ConfigVia::RuntimeOptions)?;
        let dir = extract_to_node(&published, &b, "counter-ck1")?;
        let restored = restore_by_annotation(&b, &reg, "ann-b", "counter-ck1", Counter::File, &[])?;
        assert_restored(&b, &restored, &ck)?;
        // The shim read the checkpoint without writing into it: it can be restored again.
        gpusnap_checkpoint::validate_for_restore(&dir.join("checkpoint"))
            .context("checkpoint still intact after the restore")?;
        Ok(())
    })
}

#[test]
fn checkpoint_image_restores_on_another_node_through_containerd_cri() {
    check(|| {
        let reg = registry_with_busybox()?;
        let work = tempfile::tempdir()?;
        let (ck, base_ref) = {
            let a = node(&reg, "", ConfigVia::RuntimeOptions)?;
            let w = start_workload(&a, &reg, "cri-a", Counter::File, &[])?;
            let (status, _) = a.cri.container_status(&w.id)?;
            (cri_checkpoint(&a, &w, work.path())?, status.image_ref)
        };
        let published = publish(
            &reg,
            &ck.archive,
            "gpusnap/ck-counter:cri",
            work.path(),
            true,
        )?;

        // Node B has never seen busybox: containerd 2.1's restore pulls the checkpoint's base
        // image by digest (config.dump rootfsImageRef) itself.
        let b = CriNode::start(CriNodeOptions {
            registry_host: Some(reg.host()),
            ..Default::default()
        })?;
        ensure!(
            b.cri.image_status(&base_ref)?.is_none(),
            "base image already on node B"
        );
        // The kubelet pulls the pod's image: the checkpoint image.
        b.cri.pull_image(&published.cri_ref)?;
        let pod = b.run_pod("cri-b", &[], gpusnap_handler())?;
        let spec = ContainerSpec {
            image: published.cri_ref.clone(),
            ..counter_spec(&reg, Counter::File, &[])
        };
        let id = b.create_container(&pod, &spec)?;
        let (created, _) = b.cri.container_status(&id)?;
        ensure!(
            created.annotations.get("restored").map(String::as_str) == Some("true")
                && created.annotations.get("checkpointImage") == Some(&published.cri_ref),
            "CreateContainer did not take the restore path: {:?}",
            created.annotations
        );
        ensure!(
            created.image.as_ref().map(|i| i.image.as_str())
                == Some(reg.image(BUSYBOX_REPO).as_str()),
            "the restored container shows its base image: {:?}",
            created.image
        );
        ensure!(
            b.cri.image_status(&base_ref)?.is_some(),
            "base image {base_ref} not pulled"
        );
        b.cri.start_container(&id)?;
        assert_restored(
            &b,
            &Workload {
                pod,
                id,
                counter: Counter::File,
            },
            &ck,
        )?;
        Ok(())
    })
}

/// Flips one byte in the middle of `file`.
fn flip_byte(file: &Path) -> Result<()> {
    let mut data = fs::read(file)?;
    ensure!(!data.is_empty(), "{} is empty", file.display());
    let i = data.len() / 2;
    data[i] ^= 0x5a;
    fs::write(file, data)?;
    Ok(())
}

/// A failed restore leaves nothing running: the container is not running, no process is in
/// its cgroup, and runc never created it.
fn assert_nothing_runs(node: &CriNode, id: &str) -> Result<()> {
    let state = node.state(id)?;
    ensure!(
        state != ContainerState::ContainerRunning,
        "{id} is {state:?}"
    );
    ensure!(
        node.cgroup_procs(id).is_empty(),
        "processes in {id}'s cgroup: {:?}",
        node.cgroup_procs(id)
    );
    ensure!(
        node.runc_state(id).is_none(),
        "runc knows {id}: {:?}",
        node.runc_state(id)
    );
    Ok(())
}

fn assert_digest_refusal(err: &str) -> Result<()> {
    ensure!(
        err.contains("pages-1.img") && err.contains("corrupted") && err.contains("digest"),
        "the error does not name the digest problem: {err}"
    );
    Ok(())
}

#[test]
fn tampered_checkpoint_is_refused_before_criu_runs_on_both_restore_paths() {
    check(|| {
        let reg = registry_with_busybox()?;
        let work = tempfile::tempdir()?;
        let ck = checkpoint_on_a_node(&reg, "tamper-a", work.path())?;
        // Node B takes its gpusnap config from $GPUSNAP_CONFIG in containerd's environment.
        let b = node(&reg, "", ConfigVia::Env)?;

        // (b) the pod annotation: an extracted checkpoint damaged at rest on the node.
        let published = publish(
            &reg,
            &ck.archive,
            "gpusnap/ck-counter:good",
            work.path(),
            true,
        )?;
        let dir = extract_to_node(&published, &b, "damaged")?;
        flip_byte(&dir.join("checkpoint/pages-1.img"))?;
        let pod = b.run_pod(
            "tamper-b",
            &[("gpusnap.io/restore-from", "damaged")],
            gpusnap_handler(),
        )?;
        let id = b.create_container(&pod, &counter_spec(&reg, Counter::File, &[]))?;
        let err = match b.cri.start_container(&id) {
            Ok(()) => bail!("a damaged checkpoint was restored"),
            Err(e) => e.message,
        };
        assert_digest_refusal(&err)?;
        ensure!(
            err.contains(&dir.display().to_string()),
            "the error names the file: {err}"
        );
        assert_nothing_runs(&b, &id)?;

        // (a) containerd's CRI restore: gpusnap image build refuses to publish a checkpoint
        // that does not match its sealed manifest ...
        let x = work.path().join("damaged-archive");
        fs::create_dir_all(&x)?;
        unpack_archive(&ck.archive, &x)?;
        flip_byte(&x.join("checkpoint/pages-1.img"))?;
        let refused = publish(&reg, &x, "gpusnap/ck-counter:refused", work.path(), true);
        let refused = format!(
            "{:#}",
            refused
                .err()
                .context("build published a damaged checkpoint")?
        );
        ensure!(refused.contains("pages-1.img"), "build refusal: {refused}");
        // ... and an image built without that check (its OCI digests all consistent) is
        // refused by the shim when containerd hands it over.
        let damaged = publish(&reg, &x, "gpusnap/ck-counter:damaged", work.path(), false)?;
        b.cri.pull_image(&damaged.cri_ref)?;
        let pod = b.run_pod("tamper-cri", &[], gpusnap_handler())?;
        let spec = ContainerSpec {
            image: damaged.cri_ref.clone(),
            ..counter_spec(&reg, Counter::File, &[])
        };
        let id = b.create_container(&pod, &spec)?;
        let err = match b.cri.start_container(&id) {
            Ok(()) => bail!("a damaged checkpoint image was restored"),
            Err(e) => e.message,
        };
        assert_digest_refusal(&err)?;
        assert_nothing_runs(&b, &id)?;
        Ok(())
    })
}

/// The calls the fake driver logged for `pid`, as "op rc".
fn cuda_calls(fake: &FakeCuda, pid: u32) -> Vec<String> {
    fake.calls()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.pid == pid as i32)
        .map(|c| format!("{} {}", c.op, c.code))
        .collect()
}

/// The GPU workload reports on stdout, not into a file. (An earlier shim let the task run
/// between the CRIU dump and containerd's diff of its writable layer, which broke a restore of
/// a file open at the dump; `tests/tests/crictl.rs`'s GPU test covers an open, growing file.)
#[test]
fn gpu_container_checkpointed_through_cri_restores_by_annotation_with_its_cuda_state() {
    check(|| {
        // The test-double libcuda (see gpu_fake.rs): the container's init is a "CUDA process"
        // through GPUSNAP_FAKE_CUDA_ID; its driver state lives in the fake's directory, shared
        // by both nodes (real driver state travels inside the process memory CRIU restores).
        let gpu = tempfile::tempdir()?;
        let fake = FakeCuda::create(gpu.path().join("fake"))?;
        fake.set_unknown_pid_code(3)?;
        let cuda = format!(
            "[cuda]\nlibrary = \"{}\"\nlock_timeout_ms = 2000\n",
            fake.library_path().display()
        );
        let cuda_id = format!("cri-gpu-{}", std::process::id());
        let state_file = fake.dir().join("procs").join(format!("id-{cuda_id}-1"));
        fs::write(&state_file, "running\n")?;
        let env = [("GPUSNAP_FAKE_CUDA_ID", cuda_id.as_str())];

        let reg = registry_with_busybox()?;
        let work = tempfile::tempdir()?;
        let ck = {
            let a = node(&reg, &cuda, ConfigVia::RuntimeOptions)?;
            let w = start_workload(&a, &reg, "gpu-a", Counter::Stdout, &env)?;
            let pid = a.pid(&w.id)?;
            let ck = cri_checkpoint(&a, &w, work.path())?;
            ensure!(
                cuda_calls(&fake, pid) == ["lock 0", "checkpoint 0", "restore 0", "unlock 0"],
                "driver calls on node A: {:?}",
                cuda_calls(&fake, pid)
            );
            ensure!(
                fs::read_to_string(&state_file)?.trim() == "running",
                "left running"
            );
            let m = assert_archive_layout(&ck, &a, &w, &reg)?;
            let g = &m["gpu"];
            ensure!(g["engine"] == "driver-managed", "manifest gpu section: {m}");
            let procs = g["processes"].as_array().context("gpu.processes")?;
            ensure!(procs.len() == 1, "one CUDA process: {g}");
            ensure!(
                procs[0]["host_pid"] == pid && procs[0]["cuda"]["container_pid"] == 1,
                "{g}"
            );
            ensure!(
                g.get("driver_version").is_some_and(|v| !v.is_null()),
                "driver version recorded: {g}"
            );
            a.remove_pod(&w.pod.id)?;
            ck
        };
        // The image holds the process as it was during the dump: CHECKPOINTED.
        fs::write(&state_file, "checkpointed\n")?;

        let published = publish(&reg, &ck.archive, "gpusnap/ck-gpu:1", work.path(), true)?;
        ensure!(
            published
                .built
                .annotations
                .get(image::keys::GPUSNAP_GPU_ENGINE)
                .map(String::as_str)
                == Some("driver-managed"),
            "image annotations: {:?}",
            published.built.annotations
        );
        let b = node(&reg, &cuda, ConfigVia::RuntimeOptions)?;
        extract_to_node(&published, &b, "gpu-ck")?;
        let restored = restore_by_annotation(&b, &reg, "gpu-b", "gpu-ck", Counter::Stdout, &env)?;
        assert_restored(&b, &restored, &ck)?;
        let id = restored.id;
        let pid = b.pid(&id)?;
        ensure!(
            cuda_calls(&fake, pid) == ["restore 0", "unlock 0"],
            "CUDA restore then unlock of the restored pid {pid}: {:?}",
            cuda_calls(&fake, pid)
        );
        ensure!(
            fs::read_to_string(&state_file)?.trim() == "running",
            "unlocked and running"
        );
        Ok(())
    })
}

/// A pod's `gpusnap.io/` annotations reach the shim through containerd's `pod_annotations` and
/// layer over the node's gpusnap configuration, as a container's do through gpusnap-runc
/// (`podman.rs`): one naming a storage engine this gpusnap lacks, or a setting pods may not
/// change, fails the pod's sandbox (or its container's start) naming it, with nothing
/// running; a pod without them runs.
#[test]
fn pod_annotations_naming_no_setting_a_pod_may_choose_fail_the_pod_naming_it() {
    let node = CriNode::start(CriNodeOptions::default()).unwrap();
    node.import_image(
        &gpusnap_testkit::paths::busybox_archive(),
        gpusnap_testkit::rig::BUSYBOX_IMAGE,
    )
    .unwrap();
    let spec = ContainerSpec {
        name: "sleeper".into(),
        image: gpusnap_testkit::rig::BUSYBOX_IMAGE.into(),
        command: vec!["sleep".into(), "1000".into()],
        env: vec![],
    };
    let cases = [
        (
            "gpusnap.io/storage-engine",
            "nvme-magic",
            "storage.engine: storage engine `nvme-magic` does not exist",
        ),
        (
            "gpusnap.io/restore-checkpoint-root",
            "/tmp",
            "restore.checkpoint_root",
        ),
    ];
    for (i, (key, value, named)) in cases.into_iter().enumerate() {
        // The sandbox's shim reads the pod's annotations first: RunPodSandbox fails.
        let err = match node.run_pod(&format!("ann-{i}"), &[(key, value)], gpusnap_handler()) {
            Err(e) => format!("{e:#}"),
            Ok(pod) => {
                let err = match node.create_container(&pod, &spec) {
                    Err(e) => e.to_string(),
                    Ok(id) => {
                        let started = node.cri.start_container(&id);
                        assert!(started.is_err(), "{key}={value}: the container started");
                        assert!(node.runc_state(&id).is_none(), "runc knows {id}");
                        started.unwrap_err().to_string()
                    }
                };
                node.remove_pod(&pod.id).unwrap();
                err
            }
        };
        assert!(
            err.contains(named),
            "{key}={value}: the error does not name {named:?}: {err}"
        );
    }
    let pod = node.run_pod("ann-none", &[], gpusnap_handler()).unwrap();
    let id = node.run_container(&pod, &spec).unwrap();
    wait_for_state(
        &node,
        &id,
        ContainerState::ContainerRunning,
        Duration::from_secs(30),
    )
    .unwrap();
    node.remove_pod(&pod.id).unwrap();
}
