//! Podman 4.3 (Debian's) running gpusnap-runc as the OCI runtime `gpusnap`, registered by
//! `gpusnap install --podman-conf`: run, checkpoint, restore, `--export` / `--import` into a
//! new name, `stop`, `rm -f` leaving nothing running, `gpusnap inspect` of Podman's zstd
//! export, a tampered export refused with one readable line, and Podman's restore from
//! checkpoint images (chunked and classic) that `gpusnap image build` made.
//!
//! Podman runs the runtime's `kill` and `delete --force` with no `PATH`; `stop` and `rm -f`
//! below go through those calls, so a wrapper that looked runc up on `PATH` would leave the
//! workload running here.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::counter::{parse_memory_state, MEMORY_HOLDER, MEMORY_STATE_FILE};
use gpusnap_testkit::fixtures::{flip_byte, tar_tree};
use gpusnap_testkit::podman::{
    check_continues, check_nothing_running, checkpoint_leave_running, set_checkpoint_root,
    set_restore_setting, wait_count, Podman, RUNC_ROOT, RUNTIME, WARM,
};
use gpusnap_testkit::{describe, gpusnap, require_root, text, unique};

fn podman() -> Podman {
    require_root();
    Podman::new().unwrap_or_else(|e| panic!("{e:#}"))
}

fn run(test: impl FnOnce() -> Result<()>) {
    if let Err(e) = test() {
        panic!("{e:#}");
    }
}

/// What `gpusnap install` wrote: the runtime at an absolute path, the config reaching
/// gpusnap-runc through Podman's and conmon's environment, the test's settings kept, and a
/// gpusnap config naming runc and CRIU absolutely (no caller's PATH decides).
fn check_registration(p: &Podman) -> Result<()> {
    let conf = fs::read_to_string(&p.conf)?;
    let wrapper = gpusnap_testkit::binary("gpusnap-runc");
    ensure!(wrapper.is_absolute(), "{}", wrapper.display());
    let env = format!("\"GPUSNAP_CONFIG={}\"", p.gpusnap_config.display());
    for want in [
        "[engine.runtimes]".to_string(),
        format!("gpusnap = [\"{}\"]", wrapper.display()),
        format!("env = [{env}]"),
        format!("conmon_env_vars = [\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\", {env}]"),
        "cgroup_manager = \"cgroupfs\"".to_string(),
    ] {
        ensure!(conf.contains(&want), "{want} missing from containers.conf:\n{conf}");
    }
    let config = fs::read_to_string(&p.gpusnap_config)?;
    for key in ["binary", "binary_dir"] {
        ensure!(
            config
                .lines()
                .any(|l| l.starts_with(&format!("{key} = \"/"))),
            "{key} is not an absolute path in the installed gpusnap config:\n{config}"
        );
    }
    Ok(())
}

/// run → checkpoint → restore → export (zstd) → inspect → import as a new name → stop → rm -f.
#[test]
fn checkpoint_restore_export_import_stop_and_rm() {
    let p = podman();
    run(|| {
        check_registration(&p).with_context(|| p.install_output.clone())?;
        let marker = unique("gpp-counter");
        let a = unique("gpp-a");
        let a_id = p.run_counter(&a, &marker)?;
        wait_count(&marker, &a, WARM, || p.count(&a))?;

        // In place: the container stops at the checkpoint and goes on at the restore.
        let before = wait_count(&marker, &a, 0, || p.count(&a))?;
        p.ok(&["container", "checkpoint", &a])?;
        ensure!(
            p.inspect(&a, "{{.State.Status}}")? == "exited",
            "after the checkpoint {a} is {}",
            p.inspect(&a, "{{.State.Status}}")?
        );
        p.ok(&["container", "restore", &a])?;
        let counted = check_continues(&a, &before, || p.count(&a))?;

        // Export: Podman writes zstd whatever the name says; gpusnap inspect reads it.
        let export = p.dir().join("a-export.tar.gz");
        let export_arg = export.display().to_string();
        p.ok(&["container", "checkpoint", "--export", &export_arg, &a])?;
        let at_export = counted;
        let magic = fs::read(&export)?.get(..4).map(<[u8]>::to_vec);
        ensure!(
            magic.as_deref() == Some(&[0x28, 0xb5, 0x2f, 0xfd][..]),
            "Podman's export is not zstd (magic {magic:?}): the inspect check below would not \
             test decompression"
        );
        let insp = gpusnap(["inspect", &export_arg]);
        ensure!(
            insp.status.success(),
            "gpusnap inspect {export_arg}: {}",
            describe(&insp)
        );
        let summary = text(&insp.stdout);
        ensure!(
            summary.contains("archive, zstd")
                && summary.contains("complete: restore would proceed"),
            "gpusnap inspect of Podman's export:\n{summary}"
        );
        ensure!(
            summary.contains(&format!("Container   {a_id}")),
            "the manifest names another container:\n{summary}"
        );

        // Import under a new name: the same process, going on.
        let b = unique("gpp-b");
        p.ok(&[
            "container",
            "restore",
            "--import",
            &export_arg,
            "--name",
            &b,
        ])?;
        check_continues(&b, &at_export, || p.count(&b))?;
        let b_id = p.inspect(&b, "{{.Id}}")?;

        // The original comes back from its own (exported) checkpoint too.
        p.ok(&["container", "restore", &a])?;
        check_continues(&a, &at_export, || p.count(&a))?;

        // stop: through the runtime's kill, which Podman runs without PATH.
        p.ok(&["stop", "-t", "1", &b])?;
        ensure!(
            p.inspect(&b, "{{.State.Status}}")? == "exited",
            "after podman stop {b} is {}",
            p.inspect(&b, "{{.State.Status}}")?
        );
        // rm -f of a running container: kill and delete --force, both without PATH.
        p.ok(&["rm", "-f", "-t", "1", &a])?;
        ensure!(
            p.run(&["inspect", &a])?.status.code() != Some(0),
            "{a} still known to Podman after rm -f"
        );
        p.ok(&["rm", &b])?;
        check_nothing_running(Path::new(RUNC_ROOT), &[&a_id, &b_id], &marker)
    });
}

/// `podman container checkpoint --compress none --export <dir>/FILE NAME`; the export's path.
fn export_uncompressed(p: &Podman, name: &str, file: &str) -> Result<PathBuf> {
    let export = p.dir().join(file);
    let export_arg = export.display().to_string();
    p.ok(&[
        "container",
        "checkpoint",
        "--compress",
        "none",
        "--export",
        &export_arg,
        name,
    ])?;
    Ok(export)
}

/// A tampered export: one byte of a CRIU image flipped, re-packed. `gpusnap inspect` and the
/// restore refuse it naming the file; nothing runs afterwards.
#[test]
fn tampered_export_is_refused_with_one_line_naming_the_file() {
    let p = podman();
    run(|| {
        let marker = unique("gpp-tamper");
        let c = unique("gpp-c");
        let c_id = p.run_counter(&c, &marker)?;
        wait_count(&marker, &c, WARM, || p.count(&c))?;
        let export = export_uncompressed(&p, &c, "c-export.tar")?;
        let unpacked = p.dir().join("c-unpacked");
        tar::Archive::new(fs::File::open(&export)?)
            .unpack(&unpacked)
            .context("unpacking Podman's export")?;
        let pages = unpacked.join("checkpoint/pages-1.img");
        ensure!(pages.is_file(), "no checkpoint/pages-1.img in the export");
        flip_byte(&pages);
        let bad = p.dir().join("c-tampered.tar");
        tar_tree(&unpacked, &bad);
        let bad_arg = bad.display().to_string();

        let insp = gpusnap(["inspect", &bad_arg]);
        ensure!(
            !insp.status.success()
                && text(&insp.stdout).contains("c-tampered.tar!/checkpoint/pages-1.img"),
            "gpusnap inspect of the tampered export: {}",
            describe(&insp)
        );

        let d = unique("gpp-d");
        let out = p.run(&["container", "restore", "--import", &bad_arg, "--name", &d])?;
        ensure!(
            !out.status.success(),
            "the tampered export was restored: {}",
            describe(&out)
        );
        let err = text(&out.stderr);
        ensure!(
            !err.contains('\u{1b}'),
            "escape codes in Podman's error: {err:?}"
        );
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        ensure!(
            lines.len() == 1,
            "want one error line, got {}:\n{err}",
            lines.len()
        );
        let line = lines[0];
        ensure!(
            line.contains("checkpoint/pages-1.img is corrupted")
                && line.matches("gpusnap-runc:").count() == 1,
            "the error does not name the file once: {line}"
        );
        // Podman keeps the failed container as created; runc and the process table hold
        // nothing of it, nor of the original.
        let d_id = p
            .run(&["inspect", "--format", "{{.Id}}", &d])?
            .stdout
            .clone();
        let d_id = text(&d_id).trim().to_string();
        ensure!(
            p.inspect(&c, "{{.State.Status}}")? == "exited",
            "the checkpointed original is {}",
            p.inspect(&c, "{{.State.Status}}")?
        );
        let mut ids = vec![c_id.as_str()];
        if !d_id.is_empty() {
            ids.push(&d_id);
        }
        check_nothing_running(Path::new(RUNC_ROOT), &ids, &marker)
    });
}

/// Podman's own image-based restore (`podman container restore IMAGE`) of a checkpoint image
/// `gpusnap image build` made from Podman's export, pulled into Podman's storage with `podman
/// pull oci:LAYOUT`: the default chunked layout (Podman copies the image's files, chunks and
/// chunk list included, into the container; gpusnap-runc's restore assembles them) and the
/// classic one. Both go on counting from the checkpoint.
#[test]
fn checkpoint_images_chunked_and_classic_restore_through_podman() {
    let p = podman();
    run(|| {
        let marker = unique("gpp-img");
        let a = unique("gpp-img-a");
        let a_id = p.run_counter(&a, &marker)?;
        wait_count(&marker, &a, WARM, || p.count(&a))?;
        let at_export = wait_count(&marker, &a, 0, || p.count(&a))?;
        let export = export_uncompressed(&p, &a, "img-export.tar")?;
        let export_arg = export.display().to_string();
        let lower = tempfile::Builder::new()
            .prefix(&unique("gpp-img-layouts"))
            .rand_bytes(0)
            .tempdir_in("/tmp")?;
        let mut ids = vec![a_id.clone()];
        for (layout_kind, extra) in [("chunked", None), ("classic", Some("--classic"))] {
            // Podman names an image pulled from oci:PATH after PATH, which must be lowercase.
            let layout = lower.path().join(format!("layout-{layout_kind}"));
            let tag = format!("localhost/gpusnap-test/podman-ck:{layout_kind}");
            let layout_arg = layout.display().to_string();
            let mut args = vec![
                "image",
                "build",
                export_arg.as_str(),
                "--layout",
                layout_arg.as_str(),
                "--tag",
                tag.as_str(),
            ];
            args.extend(extra);
            let built = gpusnap(&args);
            ensure!(
                built.status.success(),
                "gpusnap {}: {}",
                args.join(" "),
                describe(&built)
            );
            let index = fs::read_to_string(layout.join("index.json"))?;
            let (ref_name, roles) = layout_refname_and_roles(&layout, &index)?;
            ensure!(
                roles.iter().any(|r| r == "chunk-list") == (layout_kind == "chunked"),
                "the {layout_kind} image's layer roles: {roles:?}"
            );
            let pulled = p.ok(&["pull", &format!("oci:{layout_arg}:{ref_name}")])?;
            let image_id = pulled.lines().last().unwrap_or_default().to_string();
            let b = unique(&format!("gpp-img-{layout_kind}"));
            // Podman restores a checkpoint image only with the runtime it names.
            p.ok(&[
                "--runtime",
                RUNTIME,
                "container",
                "restore",
                "--name",
                &b,
                &image_id,
            ])
            .with_context(|| {
                format!(
                    "podman container restore of the {layout_kind} image (image inspect: {:?})",
                    p.ok(&["image", "inspect", &image_id])
                )
            })?;
            check_continues(&b, &at_export, || p.count(&b))
                .with_context(|| format!("the container restored from the {layout_kind} image"))?;
            ids.push(p.inspect(&b, "{{.Id}}")?);
            p.ok(&["rm", "-f", "-t", "1", &b])?;
        }
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        check_nothing_running(Path::new(RUNC_ROOT), &ids, &marker)
    });
}

/// The `org.opencontainers.image.ref.name` of an OCI layout's first manifest, and the
/// `io.gpusnap.layer.role` of each of its layers.
fn layout_refname_and_roles(layout: &Path, index: &str) -> Result<(String, Vec<String>)> {
    let index: serde_json::Value = serde_json::from_str(index)?;
    let first = &index["manifests"][0];
    let ref_name = first["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .with_context(|| format!("no ref.name in the layout's index: {index}"))?
        .to_string();
    let blob = |d: &serde_json::Value| -> Result<serde_json::Value> {
        let digest = d["digest"].as_str().context("no digest")?;
        let hex = digest
            .strip_prefix("sha256:")
            .context("not a sha256 digest")?;
        Ok(serde_json::from_slice(&fs::read(
            layout.join("blobs/sha256").join(hex),
        )?)?)
    };
    // index.json -> the image's index (one platform) -> its manifest.
    let mut manifest = blob(first)?;
    if manifest["manifests"].is_array() {
        manifest = blob(&manifest["manifests"][0])?;
    }
    let roles = manifest["layers"]
        .as_array()
        .context("no layers in the manifest")?
        .iter()
        .map(|l| {
            l["annotations"]["io.gpusnap.layer.role"]
                .as_str()
                .unwrap_or("-")
                .to_string()
        })
        .collect();
    Ok((ref_name, roles))
}

/// `podman run -d --runtime gpusnap --annotation ANNOTATION --name NAME` of the counter.
fn annotated_counter<'a>(name: &'a str, annotation: &'a str, marker: &'a str) -> [&'a str; 13] {
    [
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        "--annotation",
        annotation,
        "--name",
        name,
        gpusnap_testkit::podman::BUSYBOX_IMAGE,
        "sh",
        "-c",
        gpusnap_testkit::podman::COUNTER,
        marker,
    ]
}

/// Runs [`annotated_counter`]; returns the container's id.
fn run_annotated(p: &Podman, name: &str, annotation: &str, marker: &str) -> Result<String> {
    p.ok(&annotated_counter(name, annotation, marker))
}

/// A container's `gpusnap.io/` annotations (`podman run --annotation`) layer over the node's
/// gpusnap configuration at checkpoint, as a pod's annotations do through the shim: one that
/// names a storage engine this gpusnap lacks refuses the checkpoint, naming it, and the
/// container runs on untouched; one that names a setting pods may not change is refused the
/// same way; a valid one is accepted and the checkpoint restores. Before, gpusnap-runc read the
/// configuration file alone and ignored them.
#[test]
fn podman_annotations_layer_gpusnap_settings_as_pod_annotations_do() {
    let p = podman();
    run(|| {
        for (annotation, named) in [
            ("gpusnap.io/storage-engine=nvme-magic", "nvme-magic"),
            (
                "gpusnap.io/restore-checkpoint-root=/tmp",
                "restore.checkpoint_root",
            ),
        ] {
            let marker = unique("gpp-ann");
            let a = unique("gpp-ann");
            run_annotated(&p, &a, annotation, &marker)?;
            let before = wait_count(&marker, &a, WARM, || p.count(&a))?;
            let out = p.run(&["container", "checkpoint", &a])?;
            ensure!(
                !out.status.success(),
                "checkpointed with {annotation}: {}",
                describe(&out)
            );
            let err = text(&out.stderr);
            ensure!(
                err.contains(named) && err.contains("nothing was checkpointed"),
                "the refusal of {annotation} does not name {named}: {err}"
            );
            ensure!(
                p.inspect(&a, "{{.State.Status}}")? == "running",
                "after the refused checkpoint {a} is {}",
                p.inspect(&a, "{{.State.Status}}")?
            );
            check_continues(&a, &before, || p.count(&a))?;
            p.ok(&["rm", "-f", &a])?;
        }

        // A setting pods may choose: used, and the checkpoint restores.
        let marker = unique("gpp-ann");
        let a = unique("gpp-ann");
        run_annotated(&p, &a, "gpusnap.io/cuda-lock-timeout-ms=3000", &marker)?;
        let before = wait_count(&marker, &a, WARM, || p.count(&a))?;
        p.ok(&["container", "checkpoint", &a])?;
        p.ok(&["container", "restore", &a])?;
        check_continues(&a, &before, || p.count(&a))?;
        p.ok(&["rm", "-f", &a])?;
        check_nothing_running(Path::new(RUNC_ROOT), &[&a], &marker)
    });
}

/// Restore by name through Podman: a counter checkpointed on the node by `gpusnap-runc
/// checkpoint --leave-running` into `restore.checkpoint_root` (this node's record vouches for
/// it), then `podman run --annotation gpusnap.io/restore-from=NAME` of the same image: gpusnap-runc
/// restores at `create` under conmon, `start` thaws it, and the counter goes on from the
/// checkpoint. A name with no checkpoint fails `podman run` with the reason, nothing left
/// running in runc.
#[test]
fn podman_run_annotated_restore_from_restores_a_node_checkpoint() {
    let p = podman();
    run(|| {
        let root = p.dir().join("checkpoints");
        fs::create_dir_all(&root)?;
        // The node's setting, in the config `gpusnap install` wrote for this Podman.
        set_checkpoint_root(&p.gpusnap_config, &root)?;

        let marker = unique("gpp-rf");
        let a = unique("gpp-rf-a");
        p.run_counter(&a, &marker)?;
        let before = wait_count(&marker, &a, WARM, || p.count(&a))?;
        let id = p.inspect(&a, "{{.Id}}")?;
        checkpoint_leave_running(
            Path::new(RUNC_ROOT),
            &p.gpusnap_config,
            &root.join("ck-a"),
            &id,
        )?;
        p.ok(&["rm", "-f", &a])?;

        let b = unique("gpp-rf-b");
        run_annotated(&p, &b, "gpusnap.io/restore-from=ck-a", &marker)?;
        check_continues("the container restored by name", &before, || p.count(&b))?;
        let b_id = p.inspect(&b, "{{.Id}}")?;

        let r = unique("gpp-rf-r");
        let refused = p.run(&annotated_counter(
            &r,
            "gpusnap.io/restore-from=absent",
            &marker,
        ))?;
        ensure!(
            !refused.status.success(),
            "podman run naming no checkpoint succeeded: {}",
            describe(&refused)
        );
        let err = text(&refused.stderr);
        ensure!(
            err.contains("does not exist on this node"),
            "the refusal does not say why: {err}"
        );
        let r_id = p.inspect(&r, "{{.Id}}").unwrap_or_default();
        p.ok(&["rm", "-f", &b])?;
        let _ = p.run(&["rm", "-f", &r]);
        let mut gone: Vec<&str> = vec![&id, &b_id];
        if !r_id.is_empty() {
            gone.push(&r_id);
        }
        check_nothing_running(Path::new(RUNC_ROOT), &gone, &marker)
    });
}

/// [`MEMORY_HOLDER`]'s last state in container `name`: (round, matched).
fn holder_state(p: &Podman, name: &str) -> Option<(u64, bool)> {
    let out = p.run(&["exec", name, "cat", MEMORY_STATE_FILE]).ok()?;
    parse_memory_state(&String::from_utf8_lossy(&out.stdout))
}

fn wait_holder(p: &Podman, name: &str, min: u64) -> Result<(u64, bool)> {
    let reached = gpusnap_testkit::wait_until(std::time::Duration::from_secs(120), || {
        holder_state(p, name).is_some_and(|(n, _)| n >= min)
    });
    let state = holder_state(p, name);
    ensure!(reached, "{name} did not reach round {min}: {state:?}");
    state.context("no state")
}

/// `restore.page_fill_min_bytes` through gpusnap-runc's restore at `create` (`podman run
/// --annotation gpusnap.io/restore-from=NAME`): CRIU restores the holder without its large
/// memory area and leaves it stopped (CRIU's restore.log names gpusnap's config file), and
/// gpusnap-runc writes the area in before the container runs; the holder's copies still match.
#[test]
fn podman_restore_from_with_page_fill_keeps_large_memory_intact() {
    let p = podman();
    run(|| {
        let root = p.dir().join("checkpoints");
        fs::create_dir_all(&root)?;
        set_checkpoint_root(&p.gpusnap_config, &root)?;
        set_restore_setting(&p.gpusnap_config, "page_fill_min_bytes", "16MiB")?;
        let holder = |name: &str, annotation: Option<&str>| {
            let mut args = vec!["run", "-d", "--runtime", RUNTIME];
            if let Some(a) = annotation {
                args.extend(["--annotation", a]);
            }
            args.extend([
                "--name",
                name,
                gpusnap_testkit::podman::BUSYBOX_IMAGE,
                "sh",
                "-c",
                MEMORY_HOLDER,
            ]);
            p.ok(&args)
        };
        let a = unique("gpp-fill-a");
        holder(&a, None)?;
        let (_, ok) = wait_holder(&p, &a, 2)?;
        ensure!(ok, "the holder's memory changed before any checkpoint");
        let id = p.inspect(&a, "{{.Id}}")?;
        checkpoint_leave_running(
            Path::new(RUNC_ROOT),
            &p.gpusnap_config,
            &root.join("ck-fill"),
            &id,
        )?;
        p.ok(&["rm", "-f", &a])?;

        let b = unique("gpp-fill-b");
        holder(&b, Some("gpusnap.io/restore-from=ck-fill"))?;
        let b_id = p.inspect(&b, "{{.Id}}")?;
        let restore_log = Path::new(gpusnap_runc_scratch())
            .join("create-restore")
            .join(&b_id)
            .join("restore.log");
        let log = fs::read_to_string(&restore_log)
            .with_context(|| format!("reading {}", restore_log.display()))?;
        ensure!(
            log.contains("gpusnap-leave-stopped.conf"),
            "CRIU did not read gpusnap's leave-stopped config: {}",
            restore_log.display()
        );
        let (first, _) = wait_holder(&p, &b, 1)?;
        let (n, ok) = wait_holder(&p, &b, first + 2)?;
        ensure!(ok, "round {n} after the restore found the memory changed");
        p.ok(&["rm", "-f", &b])?;
        check_nothing_running(Path::new(RUNC_ROOT), &[&id, &b_id], "gpp-fill")
    });
}

/// gpusnap-runc's scratch directory (`SCRATCH_DIR`), where a restore at `create` keeps CRIU's
/// work directory until the container is deleted.
fn gpusnap_runc_scratch() -> &'static str {
    "/run/gpusnap-runc"
}
