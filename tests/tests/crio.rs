//! CRI-O 1.36.3 with gpusnap-runc as the runtime handler `gpusnap`, configured by the drop-in
//! `gpusnap install --crio-dropin-dir` writes, driven with crictl: pod, counter,
//! `crictl checkpoint --export`, restore into a new pod (the archive as the container's
//! image), the counter going on; a tampered archive refused with one readable error naming
//! the file; the same with the CUDA driver double, its calls checked in order; CRI-O's
//! image-based restore of the checkpoint images `gpusnap image build` makes (chunked, classic);
//! and gpusnap-runc's own restore at `create` from the pod annotations
//! `gpusnap.io/restore-from-volume` (an image volume) and `gpusnap.io/restore-from` (a node
//! checkpoint by name), the container shown as created until `start`, refusals failing the
//! create with the reason.
//!
//! CRI-O and crictl come from ../shared/tools via scripts/setup-env.sh; without them the tests
//! fail saying so.

use std::fs;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::crio::{Crio, BUSYBOX_IMAGE};
use gpusnap_testkit::fixtures::{flip_byte, tar_tree};
use gpusnap_testkit::gpu::{self, Cuda, Engine, GpuDouble};
use gpusnap_testkit::podman::{
    check_continues, checkpoint_leave_running, processes_with, runc_list, wait_count, Count, WARM,
};
use gpusnap_testkit::signing::{keypair, set_policy, Policy};
use gpusnap_testkit::{describe, require_root, text, unique};

fn run(test: impl FnOnce() -> Result<()>) {
    require_root();
    if let Err(e) = test() {
        panic!("{e:#}");
    }
}

/// The drop-in names gpusnap-runc and the gpusnap config by absolute paths, with a PATH for
/// conmon and CRI-O's own runtime calls.
fn check_dropin(c: &Crio) -> Result<()> {
    let text = fs::read_to_string(&c.dropin)?;
    let wrapper = gpusnap_testkit::binary("gpusnap-runc");
    for want in [
        "[crio.runtime.runtimes.gpusnap]".to_string(),
        format!("runtime_path = \"{}\"", wrapper.display()),
        "runtime_type = \"oci\"".to_string(),
        format!("runtime_root = \"{}\"", c.runtime_root.display()),
        format!(
            "monitor_env = [\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\", \
             \"GPUSNAP_CONFIG={}\"]",
            c.gpusnap_config.display()
        ),
        "enable_criu_support = true".to_string(),
    ] {
        ensure!(
            text.contains(&want),
            "{want} missing from the drop-in:\n{text}"
        );
    }
    ensure!(
        c.log().contains("Checkpoint/restore support enabled"),
        "CRI-O did not enable checkpoint/restore:\n{}",
        c.log()
    );
    Ok(())
}

/// A counter in a pod of its own under the gpusnap handler; returns (container id, count
/// once warm).
fn counter(c: &Crio, name: &str, marker: &str, env: &[(&str, &str)]) -> Result<(String, Count)> {
    let (pod, pod_cfg) = c.run_pod(name)?;
    let id = c.create_and_start(
        &pod,
        &pod_cfg,
        &c.container_config("counter", BUSYBOX_IMAGE, Some(marker), env),
    )?;
    let warm = wait_count(marker, name, WARM, || c.count(&id))?;
    Ok((id, warm))
}

/// `crictl checkpoint --export`: the container keeps running (CRI-O checkpoints with
/// --leave-running); returns the count read just before.
fn export(c: &Crio, run: &str, id: &str, archive: &Path) -> Result<Count> {
    let before = wait_count(run, id, 0, || c.count(id))?;
    let arg = format!("--export={}", archive.display());
    c.ok(&["checkpoint", &arg, id])?;
    ensure!(archive.is_file(), "no archive at {}", archive.display());
    ensure!(
        c.state(id)? == "CONTAINER_RUNNING",
        "after the checkpoint {id} is {}",
        c.state(id)?
    );
    Ok(before)
}

/// Restores `archive` into a new pod; returns the new container's id.
fn restore_into_new_pod(c: &Crio, name: &str, archive: &Path) -> Result<String> {
    let (pod, pod_cfg) = c.run_pod(name)?;
    c.create_and_start(
        &pod,
        &pod_cfg,
        &c.container_config("counter", &archive.display().to_string(), None, &[]),
    )
}

#[test]
fn checkpoint_export_restore_into_new_pod_and_tampered_archive_refused() {
    run(|| {
        let c = Crio::start(None)?;
        check_dropin(&c)?;
        let marker = unique("gco-counter");
        let (a, _) = counter(&c, &unique("gco-a"), &marker, &[])?;
        let archive = c.dir().join("a.tar");
        let before = export(&c, &marker, &a, &archive)?;
        let b = restore_into_new_pod(&c, &unique("gco-b"), &archive)?;
        check_continues("the restored container", &before, || c.count(&b))?;
        ensure!(
            runc_list(&c.runtime_root)?
                .iter()
                .any(|(id, st)| id == &b && st == "running"),
            "the restored container is not running under {}",
            c.runtime_root.display()
        );

        // Tampered: one byte of a CRIU image flipped, the archive re-packed.
        let unpacked = c.dir().join("a-unpacked");
        tar::Archive::new(fs::File::open(&archive)?)
            .unpack(&unpacked)
            .context("unpacking the export")?;
        flip_byte(&unpacked.join("checkpoint/pages-1.img"));
        let bad = c.dir().join("tampered.tar");
        tar_tree(&unpacked, &bad);
        let (pod, pod_cfg) = c.run_pod(&unique("gco-t"))?;
        let ctr = c.container_config("counter", &bad.display().to_string(), None, &[]);
        let created = c.create(&pod, &pod_cfg, &ctr)?;
        ensure!(
            created.status.success(),
            "crictl create of the tampered archive: {}",
            describe(&created)
        );
        let t = text(&created.stdout).trim().to_string();
        let started = c.crictl(&["start", &t])?;
        ensure!(
            !started.status.success(),
            "the tampered archive was restored: {}",
            describe(&started)
        );
        let err = text(&started.stderr);
        ensure!(
            !err.contains('\u{1b}'),
            "escape codes in the error: {err:?}"
        );
        // crictl logs the error and then exits with it; each report carries gpusnap-runc's
        // message exactly once.
        let fatal = err
            .lines()
            .find(|l| l.contains("level=fatal"))
            .with_context(|| format!("no error from crictl start:\n{err}"))?;
        ensure!(
            fatal.matches("gpusnap-runc:").count() == 1
                && fatal.matches("checkpoint/pages-1.img is corrupted").count() == 1,
            "the error does not name the file exactly once: {fatal}"
        );
        ensure!(
            !runc_list(&c.runtime_root)?
                .iter()
                .any(|(id, st)| id == &t && st != "stopped"),
            "the refused container is left in runc under {}",
            c.runtime_root.display()
        );
        // Source and good restore run on; removing the pods leaves nothing running.
        check_continues("the source after the export", &before, || c.count(&a))?;
        c.remove_all_pods()?;
        let left = runc_list(&c.runtime_root)?;
        ensure!(left.is_empty(), "runc still has {left:?} after rmp");
        let procs = processes_with(&marker);
        ensure!(procs.is_empty(), "workload left running: {procs:?}");
        Ok(())
    });
}

/// CRI-O's own image-based restore: the export built into a checkpoint image by `gpusnap image
/// build` (the default chunked layout, and `--classic`), put into CRI-O's storage, named as a
/// new pod's container image; CRI-O copies the image's files into the container and
/// gpusnap-runc's restore assembles the chunks. The counter goes on from the checkpoint.
#[test]
fn checkpoint_images_chunked_and_classic_restore_through_crio() {
    run(|| {
        let c = Crio::start(None)?;
        let marker = unique("gco-img");
        let (a, _) = counter(&c, &unique("gco-img-a"), &marker, &[])?;
        let archive = c.dir().join("img-a.tar");
        let before = export(&c, &marker, &a, &archive)?;
        for (kind, extra) in [("chunked", None), ("classic", Some("--classic"))] {
            let oci = c.dir().join(format!("img-{kind}.oci.tar"));
            let name = format!("localhost/gpusnap-test/crio-ck:{kind}");
            let (archive_arg, oci_arg) = (archive.display().to_string(), oci.display().to_string());
            let mut args = vec!["image", "build", &archive_arg, "-t", &name, "-o", &oci_arg];
            args.extend(extra);
            let built = gpusnap_testkit::gpusnap(&args);
            ensure!(
                built.status.success(),
                "gpusnap {}: {}",
                args.join(" "),
                describe(&built)
            );
            c.load_image(&oci, &name)?;
            let (pod, pod_cfg) = c.run_pod(&unique(&format!("gco-img-{kind}")))?;
            let b = c
                .create_and_start(
                    &pod,
                    &pod_cfg,
                    &c.container_config("counter", &name, None, &[]),
                )
                .with_context(|| format!("CRI-O restore from the {kind} checkpoint image"))?;
            check_continues(
                &format!("the container restored from the {kind} image"),
                &before,
                || c.count(&b),
            )?;
        }
        c.remove_all_pods()?;
        let procs = processes_with(&marker);
        ensure!(procs.is_empty(), "workload left running: {procs:?}");
        Ok(())
    });
}

/// gpusnap-runc's work directory of the restore at `create` of container `id` (CRIU's
/// `restore.log`), kept until the container is deleted.
fn create_restore_work_dir(id: &str) -> std::path::PathBuf {
    Path::new("/run/gpusnap-runc/create-restore").join(id)
}

/// CRI-O whose gpusnap config sets `restore.checkpoint_root` to a directory of its own: (the
/// directory holding it and the config, the checkpoint root, CRI-O).
fn crio_with_checkpoint_root(
    prefix: &str,
) -> Result<(tempfile::TempDir, std::path::PathBuf, Crio)> {
    crio_with_restore_settings(prefix, "")
}

/// [`crio_with_checkpoint_root`] with `settings` (lines) added to the config's `[restore]`.
fn crio_with_restore_settings(
    prefix: &str,
    settings: &str,
) -> Result<(tempfile::TempDir, std::path::PathBuf, Crio)> {
    let own = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp")?;
    let root = own.path().join("checkpoints");
    fs::create_dir_all(&root)?;
    let config = own.path().join("gpusnap.toml");
    fs::write(
        &config,
        format!(
            "[restore]\ncheckpoint_root = \"{}\"\n{settings}",
            root.display()
        ),
    )?;
    let c = Crio::start(Some(&config))?;
    Ok((own, root, c))
}

/// A counter checkpointed through CRI-O (`crictl checkpoint --export`) and built into the
/// checkpoint image `name` (`gpusnap image build`), loaded into CRI-O's storage; returns the
/// count at the checkpoint.
fn counter_as_volume_image(c: &Crio, marker: &str, name: &str) -> Result<Count> {
    let (a, _) = counter(c, &unique("gco-vol-a"), marker, &[])?;
    let archive = c.dir().join(format!("{}.tar", unique("vol-a")));
    let before = export(c, marker, &a, &archive)?;
    let oci = c.dir().join(format!("{}.oci.tar", unique("vol")));
    let (archive_arg, oci_arg) = (archive.display().to_string(), oci.display().to_string());
    let args = ["image", "build", &archive_arg, "-t", name, "-o", &oci_arg];
    let built = gpusnap_testkit::gpusnap(args);
    ensure!(
        built.status.success(),
        "gpusnap {}: {}",
        args.join(" "),
        describe(&built)
    );
    c.load_image(&oci, name)?;
    Ok(before)
}

/// The counter's container config with the checkpoint image `name` mounted as an image volume
/// at `/ckpt`, the path the pod's annotation names.
fn volume_container(c: &Crio, marker: &str, name: &str) -> Result<serde_json::Value> {
    let mut ctr = c.container_config("counter", BUSYBOX_IMAGE, Some(marker), &[]);
    ctr["mounts"]
        .as_array_mut()
        .context("mounts")?
        .push(serde_json::json!(
            {"container_path": "/ckpt", "image": {"image": name}, "readonly": true}
        ));
    Ok(ctr)
}

/// The container `ctr` created in a new pod annotated `annotation` (a restore at create):
/// shown as created, held until start; returns its id.
fn create_held(c: &Crio, ctr: &serde_json::Value, annotation: (&str, &str)) -> Result<String> {
    let (pod, pod_cfg) = c.run_pod_annotated(&unique("gco-held"), &[annotation])?;
    let created = c.create(&pod, &pod_cfg, ctr)?;
    ensure!(
        created.status.success(),
        "crictl create of the annotated container: {}",
        describe(&created)
    );
    let id = text(&created.stdout).trim().to_string();
    ensure!(
        c.state(&id)? == "CONTAINER_CREATED",
        "the restored container is {} before start",
        c.state(&id)?
    );
    Ok(id)
}

/// [`create_held`] from the image volume at `/ckpt`, then started; returns its id.
fn create_from_volume_and_start(c: &Crio, ctr: &serde_json::Value) -> Result<String> {
    let id = create_held(c, ctr, ("gpusnap.io/restore-from-volume", "/ckpt"))?;
    c.ok(&["start", &id])?;
    Ok(id)
}

/// Restore by pod annotation through gpusnap-runc, CRI-O's own restore not involved: the
/// export built into a checkpoint image, mounted into a new pod's container as an image volume
/// (KEP-4639) that the pod's `gpusnap.io/restore-from-volume` annotation names. gpusnap-runc
/// restores it at `create` and holds it frozen, so CRI-O sees a created container; `start`
/// thaws it and the counter goes on from the checkpoint. An annotation naming a path where the
/// container mounts nothing fails the create, saying why, with nothing left running.
#[test]
fn image_volume_named_by_annotation_restores_at_create_through_gpusnap_runc() {
    run(|| {
        let (_own, root, c) = crio_with_checkpoint_root("gco-vol-")?;
        let marker = unique("gco-vol");
        let name = "localhost/gpusnap-test/crio-vol:1";
        let before = counter_as_volume_image(&c, &marker, name)?;
        let ctr = volume_container(&c, &marker, name)?;
        let b = create_from_volume_and_start(&c, &ctr)?;
        check_continues(
            "the container restored from the image volume",
            &before,
            || c.count(&b),
        )?;
        ensure!(
            c.state(&b)? == "CONTAINER_RUNNING",
            "after start the restored container is {}",
            c.state(&b)?
        );
        ensure!(
            root.join(".gpusnap-volumes").is_dir(),
            "no node copy under {}",
            root.display()
        );

        // Refused: nothing is mounted at the path the annotation names.
        let (pod, pod_cfg) = c.run_pod_annotated(
            &unique("gco-vol-r"),
            &[("gpusnap.io/restore-from-volume", "/nowhere")],
        )?;
        let before_refusal = runc_list(&c.runtime_root)?;
        let refused = c.create(&pod, &pod_cfg, &ctr)?;
        ensure!(
            !refused.status.success(),
            "a create naming an unmounted path succeeded: {}",
            describe(&refused)
        );
        let err = text(&refused.stderr);
        ensure!(
            err.contains("gpusnap.io/restore-from-volume")
                && err.contains("mounts nothing there")
                && err.contains("nothing was restored"),
            "the refusal does not say why: {err}"
        );
        ensure!(
            runc_list(&c.runtime_root)? == before_refusal,
            "the refused create left a container in runc: {:?}",
            runc_list(&c.runtime_root)?
        );
        check_continues("the restored container after the refusal", &before, || {
            c.count(&b)
        })?;
        ensure!(
            create_restore_work_dir(&b).join("restore.log").is_file(),
            "no restore.log of the restore at create"
        );
        c.remove_all_pods()?;
        let left = runc_list(&c.runtime_root)?;
        ensure!(left.is_empty(), "runc still has {left:?} after rmp");
        ensure!(
            !create_restore_work_dir(&b).exists(),
            "the restore's work directory outlived the container"
        );
        let procs = processes_with(&marker);
        ensure!(procs.is_empty(), "workload left running: {procs:?}");
        Ok(())
    });
}

/// `restore.page_fill_min_bytes` through CRI-O's door (gpusnap-runc's restore at create from
/// an image volume): the page images are read from the volume's chunks, not copied onto the
/// node, and the private memory areas CRIU leaves out are written by gpusnap-runc into the
/// stopped tasks; the counter goes on, and the node's copy holds no page image.
#[test]
fn image_volume_page_images_are_read_in_place_through_crio() {
    run(|| {
        let (_own, root, c) =
            crio_with_restore_settings("gco-volfill-", "page_fill_min_bytes = 4096\n")?;
        let marker = unique("gco-volfill");
        let name = "localhost/gpusnap-test/crio-volfill:1";
        let before = counter_as_volume_image(&c, &marker, name)?;
        let ctr = volume_container(&c, &marker, name)?;
        let b = create_from_volume_and_start(&c, &ctr)?;
        check_continues(
            "the container restored with its page images read in place",
            &before,
            || c.count(&b),
        )?;
        let copies: Vec<std::path::PathBuf> = fs::read_dir(root.join(".gpusnap-volumes"))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("checkpoint").is_dir())
            .collect();
        ensure!(copies.len() == 1, "one node copy expected: {copies:?}");
        let names: Vec<String> = fs::read_dir(copies[0].join("checkpoint"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        ensure!(
            names.iter().any(|n| n == "gpusnap-manifest.json")
                && !names.iter().any(|n| n.starts_with("pages-")),
            "the node copy holds page images: {names:?}"
        );
        let log = fs::read_to_string(create_restore_work_dir(&b).join("restore.log"))?;
        ensure!(
            log.contains("gpusnap-leave-stopped.conf"),
            "CRIU did not read gpusnap's leave-stopped config (no task split for the fill)"
        );
        c.remove_all_pods()?;
        let procs = processes_with(&marker);
        ensure!(procs.is_empty(), "workload left running: {procs:?}");
        Ok(())
    });
}

/// A node that requires signatures (`restore.signature_policy = require`) restores a
/// checkpoint its own key signed at seal from a CRI-O image volume: the spec is compared with
/// the signed one leaving out exactly the overlay mount the volume was recognised in, as
/// containerd's read-only bind is. Before, CRI-O's overlay was compared like any other mount
/// and such a node refused every image-volume restore.
#[test]
fn image_volume_restores_through_crio_on_a_node_that_requires_signatures() {
    run(|| {
        let (own, _root, c) = crio_with_checkpoint_root("gco-sig-")?;
        let key = keypair(own.path(), "node")?;
        set_policy(
            &c.gpusnap_config,
            &Policy {
                policy: "require",
                trusted: vec![&key.public],
                signing_key: Some(&key.private),
            },
        )?;
        let marker = unique("gco-sig");
        let name = "localhost/gpusnap-test/crio-vol-signed:1";
        let before = counter_as_volume_image(&c, &marker, name)?;
        let ctr = volume_container(&c, &marker, name)?;
        let b = create_from_volume_and_start(&c, &ctr)?;
        check_continues(
            "the signed checkpoint restored from the volume",
            &before,
            || c.count(&b),
        )?;
        c.remove_all_pods()?;
        let left = runc_list(&c.runtime_root)?;
        ensure!(left.is_empty(), "runc still has {left:?} after rmp");
        Ok(())
    });
}

/// Restore by name through gpusnap-runc: a counter checkpointed on the node by `gpusnap-runc
/// checkpoint --leave-running` into `restore.checkpoint_root` (this node's record vouches for
/// it), and a new pod annotated `gpusnap.io/restore-from: NAME` whose container names the
/// original image: restored at `create`, created until `start`, then counting on. A name
/// with no checkpoint fails the create, saying what to do, with nothing left running.
#[test]
fn node_checkpoint_named_by_annotation_restores_at_create_and_an_unknown_name_is_refused() {
    run(|| {
        let (_own, root, c) = crio_with_checkpoint_root("gco-name-")?;
        let marker = unique("gco-name");
        let (a, _) = counter(&c, &unique("gco-name-a"), &marker, &[])?;
        let before = wait_count(&marker, &a, 0, || c.count(&a))?;
        checkpoint_leave_running(&c.runtime_root, &c.gpusnap_config, &root.join("ck-a"), &a)?;

        let ctr = c.container_config("counter", BUSYBOX_IMAGE, Some(&marker), &[]);
        let b = create_held(&c, &ctr, ("gpusnap.io/restore-from", "ck-a"))?;
        c.ok(&["start", &b])?;
        check_continues("the container restored by name", &before, || c.count(&b))?;

        let (pod, pod_cfg) = c.run_pod_annotated(
            &unique("gco-name-r"),
            &[("gpusnap.io/restore-from", "absent")],
        )?;
        let before_refusal = runc_list(&c.runtime_root)?;
        let refused = c.create(&pod, &pod_cfg, &ctr)?;
        ensure!(
            !refused.status.success(),
            "a create naming no checkpoint succeeded: {}",
            describe(&refused)
        );
        let err = text(&refused.stderr);
        ensure!(
            err.contains("does not exist on this node") && err.contains("gpusnap image pull"),
            "the refusal does not say why: {err}"
        );
        ensure!(
            runc_list(&c.runtime_root)? == before_refusal,
            "the refused create left a container in runc: {:?}",
            runc_list(&c.runtime_root)?
        );
        // Removed before it was ever started: its held (frozen) processes are killed.
        let h = create_held(&c, &ctr, ("gpusnap.io/restore-from", "ck-a"))?;
        let held_pid = c.pid(&h)?;
        // A stop with CRI-O's grace period: a held container never started, so the first
        // signal kills it (the counter's shell ignores SIGTERM; thawed, it would run on until
        // the period ends).
        let stopping = std::time::Instant::now();
        c.ok(&["stop", "-t", "30", &h])?;
        ensure!(
            stopping.elapsed() < std::time::Duration::from_secs(15),
            "stopping the held container took {:?}",
            stopping.elapsed()
        );
        c.ok(&["rm", &h])?;
        let gone = gpusnap_testkit::wait::wait_until(std::time::Duration::from_secs(10), || {
            !Path::new(&format!("/proc/{held_pid}")).exists()
        });
        ensure!(
            gone,
            "the held container's init {held_pid} outlived its removal"
        );
        ensure!(
            !runc_list(&c.runtime_root)?.iter().any(|(id, _)| id == &h),
            "runc still knows the removed held container"
        );
        // Stopping the restored container works as for any other (kill, then delete).
        c.ok(&["stop", "-t", "0", &b])?;
        ensure!(
            c.state(&b)? == "CONTAINER_EXITED",
            "after stop the restored container is {}",
            c.state(&b)?
        );
        ensure!(
            create_restore_work_dir(&b).join("restore.log").is_file(),
            "no restore.log of the restore at create"
        );
        c.remove_all_pods()?;
        let left = runc_list(&c.runtime_root)?;
        ensure!(left.is_empty(), "runc still has {left:?} after rmp");
        ensure!(
            !create_restore_work_dir(&b).exists(),
            "the restore's work directory outlived the container"
        );
        let procs = processes_with(&marker);
        ensure!(procs.is_empty(), "workload left running: {procs:?}");
        Ok(())
    });
}

/// The driver double as the container's CUDA: checkpoint locks, checkpoints, restores and
/// unlocks the running process (CRI-O keeps it running); the restore in a new pod restores
/// and unlocks the new process with the device memory intact.
fn gpu_double(engine: Engine, cuda: Cuda) {
    run(|| {
        let gpu = GpuDouble::new(engine, cuda)?;
        let config = gpu.write_config("")?;
        let c = Crio::start(Some(&config))?;
        ensure!(
            fs::read(&c.gpusnap_config)? == fs::read(&config)?,
            "gpusnap install did not install the double's config"
        );
        let (proc_, bytes) = gpu.cuda_process("gco")?;
        let marker = unique("gco-gpu");
        let (a, _) = counter(&c, &unique("gco-ga"), &marker, &[proc_.env_pair()])?;
        let old_pid = c.pid(&a)?;
        let archive = c.dir().join("gpu.tar");
        let before = export(&c, &marker, &a, &archive)?;
        gpu.check_checkpoint_calls(&proc_, old_pid, true)?;
        let unpacked = c.dir().join("gpu-unpacked");
        let ck = gpu::unpack_cri_archive(&archive, &unpacked)?;
        gpu::check_gpu_checkpoint(&ck, engine, cuda, old_pid, &bytes)?;
        check_continues("the checkpointed source", &before, || c.count(&a))?;

        // The source goes, as a migration's would; its CUDA state moves with the archive.
        c.remove_all_pods()?;
        gpu.emulate_criu_restore(&proc_)?;
        let b = restore_into_new_pod(&c, &unique("gco-gb"), &archive)?;
        let pid = c.pid(&b)?;
        ensure!(pid != old_pid, "restored under the old host pid {pid}");
        gpu.check_restored(&proc_, pid, &bytes)?;
        check_continues("the restored GPU container", &before, || c.count(&b))?;
        Ok(())
    });
}

#[test]
fn gpu_double_driver_managed_cuda13_0() {
    gpu_double(Engine::DriverManaged, Cuda::V13_0);
}

/// posix: device memory goes to gpusnap-gpu-* files inside the checkpoint, so through the
/// archive CRI-O exports.
#[test]
fn gpu_double_posix_cuda13_4() {
    gpu_double(Engine::Posix, Cuda::V13_4);
}
