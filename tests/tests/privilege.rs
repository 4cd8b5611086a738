//! A restored process gets no privilege the spec of the container it is restored into does
//! not give it, whatever the checkpoint's CRIU images claim.
//!
//! Each test takes an honest checkpoint of a busybox counter through a real door, forges its
//! `core-*.img` as an attacker with write access to the checkpoint would (then reseals the
//! gpusnap manifest, a checksum list), and shows that:
//! - the restore is refused before CRIU runs (runc never creates the container, CRIU writes
//!   no restore log), naming the task, the image file, the field and both values;
//! - the honest checkpoint still restores, and the counter goes on from where it was.
//!
//! Doors: `gpusnap-runc restore` (as CRI-O and Podman run it) and `ctr containers restore`
//! (containerd's Create with a checkpoint, through the gpusnap shim).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use gpusnap_criu_images::caps;
use gpusnap_criu_images::forge::cap_words;
use gpusnap_criu_images::proto::ThreadCoreEntry;
use gpusnap_testkit::bundle::BusyboxContainer;
use gpusnap_testkit::counter::{
    check_continues, count_in_file, count_of, counter_script, run_token, wait_count, Count,
    COUNTER, WARM,
};
use gpusnap_testkit::privilege::forge_and_reseal;
use gpusnap_testkit::refused_restore::CriuTar;
use gpusnap_testkit::{paths, Runtime};

/// Copies a flat checkpoint directory.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        fs::copy(e.path(), to.join(e.file_name()))?;
    }
    Ok(())
}

/// What the attacker edits.
enum Forge {
    /// Every `core-<tid>.img`.
    Cores(fn(u32, &mut ThreadCoreEntry)),
    /// Any image of the checkpoint directory (returns how many entries it changed).
    Images(fn(&Path) -> Result<usize>),
}

/// One forgery and what its refusal must say.
struct Forgery {
    name: &'static str,
    /// Changes `runc spec`'s config before the container starts (the restore target's spec
    /// is the same bundle's).
    spec: fn(&BusyboxContainer),
    /// Changes the restore target's spec for the forged restore only (undone before the
    /// honest one).
    retarget: fn(&BusyboxContainer),
    forge: Forge,
    says: &'static [&'static str],
}

fn all_capabilities(_tid: u32, t: &mut ThreadCoreEntry) {
    let c = t.creds.as_mut().expect("creds in the core");
    for set in [&mut c.cap_prm, &mut c.cap_eff, &mut c.cap_bnd] {
        *set = cap_words(caps::ALL);
    }
}

/// `gpusnap-runc`: checkpoint, refuse the forgery before CRIU, restore the honest one.
fn through_gpusnap_runc(f: &Forgery) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let config = dir.join("config.toml");
    paths::write_criu_config(&config, "")?;
    let env = [
        ("GPUSNAP_CONFIG", config.to_str().context("config path")?),
        ("GPUSNAP_LOG", "debug"),
    ];
    let run = run_token();
    let c = BusyboxContainer::create(dir, &format!("priv-{}", f.name), &counter_script(&run));
    (f.spec)(&c);
    c.start();
    let count = || count_in_file(&c.bundle.join("rootfs/tmp/count"));
    wait_count(&run, &c.id, WARM, count)?;
    let images = dir.join("images");
    let (code, _, err) = c.wrapper(
        &[
            "checkpoint",
            "--image-path",
            images.to_str().context("image path")?,
            &c.id,
        ],
        &env,
        dir,
    );
    ensure!(
        code == 0,
        "gpusnap-runc checkpoint failed (exit {code}):\n{err}"
    );
    let before = count().context("no count after the checkpoint")?;

    let forged = dir.join("forged");
    copy_dir(&images, &forged)?;
    match f.forge {
        Forge::Cores(edit) => forge_and_reseal(&forged, edit)?,
        Forge::Images(edit) => edit(&forged)?,
    };
    let spec_path = c.bundle.join("config.json");
    let spec = fs::read(&spec_path)?;
    (f.retarget)(&c);
    let work = dir.join("restore-work");
    let (code, _, err) = c.wrapper_restore(&forged, &env, dir);
    ensure!(code == 1, "the forged restore exited {code}:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("gpusnap-runc:"))
        .with_context(|| format!("no gpusnap-runc error line:\n{err}"))?;
    ensure!(line.contains(&format!("cannot restore {}", c.id)), "{line}");
    for s in f.says {
        ensure!(line.contains(s), "{s:?} missing from: {line}");
    }
    ensure!(
        c.status().is_none(),
        "runc created the container: {:?}",
        c.state()
    );
    ensure!(
        !work.join("restore.log").exists(),
        "CRIU ran: {}",
        work.display()
    );
    fs::write(&spec_path, spec)?;

    // The honest checkpoint restores into the same spec.
    let (code, _, err) = c.wrapper_restore(&images, &env, dir);
    ensure!(code == 0, "the honest restore failed (exit {code}):\n{err}");
    ensure!(c.status().as_deref() == Some("running"), "{:?}", c.state());
    check_continues(&c.id, &before, count)?;
    Ok(())
}

fn run(f: Forgery) {
    gpusnap_testkit::require_root();
    if let Err(e) = through_gpusnap_runc(&f) {
        panic!("{}: {e:#}", f.name);
    }
}

#[test]
fn gpusnap_runc_refuses_a_core_claiming_every_capability() {
    run(Forgery {
        name: "caps",
        spec: |_| {},
        retarget: |_| {},
        forge: Forge::Cores(all_capabilities),
        says: &[
            "task 1 (core-1.img): cap_eff holds CAP_CHOWN",
            "CAP_SYS_MODULE",
            "CAP_SYS_ADMIN",
            "which the container spec's bounding set does not (spec 0x20000420, image \
             0x1ffffffffff)",
            "cap_bnd holds",
            "Nothing was changed",
        ],
    });
}

#[test]
fn gpusnap_runc_refuses_uid_0_in_a_non_root_container() {
    run(Forgery {
        name: "uid0",
        // CRIU cannot dump a non-root task without CAP_SYS_RESOURCE (prlimit of another
        // uid's task), which some CI sandboxes withhold even from root. So the checkpoint is
        // of a root container, its cores say uid 0 (set again here, as a forger would), and
        // the container it is restored into runs as uid 1000.
        spec: |_| {},
        retarget: |c| {
            c.edit_spec(|s| s["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000}))
        },
        forge: Forge::Cores(|_, t| {
            let c = t.creds.as_mut().expect("creds in the core");
            (c.uid, c.euid, c.suid, c.fsuid) = (0, 0, 0, 0);
        }),
        says: &[
            "task 1 (core-1.img): uid is 0, but the container spec's user is uid 1000 and its \
             bounding set lacks CAP_SETUID (spec 1000, image 0)",
            "euid is 0",
        ],
    });
}

/// A seccomp profile in the spec that stops one call (kexec_load) and allows the rest.
fn kexec_load_errno_profile(c: &BusyboxContainer) {
    c.edit_spec(|s| {
        s["linux"]["seccomp"] = serde_json::json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": ["kexec_load"], "action": "SCMP_ACT_ERRNO"}]
        })
    })
}

#[test]
fn gpusnap_runc_refuses_a_core_that_drops_the_seccomp_filter() {
    run(Forgery {
        name: "seccomp",
        retarget: |_| {},
        spec: kexec_load_errno_profile,
        forge: Forge::Cores(|_, t| t.seccomp_mode = Some(0)),
        says: &[
            "task 1 (core-1.img): seccomp_mode is disabled where the container spec sets a \
             seccomp profile (spec filter, image disabled)",
        ],
    });
}

/// The spec's profile as runc compiled it, replaced in `seccomp.img` by one
/// `SECCOMP_RET_ALLOW`: the cores still say "filter mode", only the filter's content is
/// weaker than the profile.
#[test]
fn gpusnap_runc_refuses_a_filter_weaker_than_the_spec_profile() {
    run(Forgery {
        name: "permissive",
        retarget: |_| {},
        spec: kexec_load_errno_profile,
        forge: Forge::Images(gpusnap_testkit::seccomp::forge_permissive_and_reseal),
        says: &[
            "task 1 (core-1.img): seccomp_filter leads to a filter chain in seccomp.img none of \
             whose filters is as strict as the container spec's seccomp profile",
            "it returns SECCOMP_RET_ALLOW for kexec_load (x86_64 nr 246), where the spec's \
             seccomp profile gives SCMP_ACT_ERRNO",
        ],
    });
}

/// The counter "src" checkpointed into `image` (`ctr c checkpoint --task --rw`: its writable
/// layer travels, as the counter's file does) once it has counted past WARM, then removed;
/// returns its count after the checkpoint.
fn checkpoint_src(
    rig: &gpusnap_testkit::checkpoint::CkRig,
    run: &str,
    image: &str,
) -> Result<Count> {
    use gpusnap_testkit::checkpoint::{container_checkpoint_ok, kill_and_remove};
    let src_pid = rig.task_pid("src")?;
    wait_count(run, "src", WARM, || count_of(src_pid))?;
    container_checkpoint_ok(rig, "src", image, true)?;
    let before = count_of(src_pid).context("no count after the checkpoint")?;
    kill_and_remove(rig, "src")?;
    Ok(before)
}

/// `image`'s criu.tar forged by `forge`: `ctr containers restore` of it as `id` must fail and
/// leave nothing running; returns its messages (where `ctr` lands a restore). The pristine
/// criu.tar is put back.
fn ctr_restore_forged(
    rig: &gpusnap_testkit::checkpoint::CkRig,
    image: &str,
    id: &str,
    forge: impl FnOnce(&Path) -> Result<usize>,
) -> Result<String> {
    let criu_tar = CriuTar::of(rig, image)?;
    let restore = criu_tar
        .restore_altered(id, |d| forge(d).map(drop))
        .with_context(|| rig.log_tail(60))?;
    criu_tar.put_back()?;
    ensure!(!restore.succeeded, "the forged restore succeeded");
    ensure!(!restore.running, "the forged restore left a running task");
    Ok(restore.stderr)
}

/// The honest `image` restored live as "honest", counting on from `before`; returns how long
/// that took.
fn ctr_restore_honest(
    rig: &gpusnap_testkit::checkpoint::CkRig,
    image: &str,
    before: &Count,
) -> Result<Duration> {
    let started = Instant::now();
    gpusnap_testkit::checkpoint::container_restore_live_ok(rig, "honest", image, true)?;
    let pid = rig.task_pid("honest")?;
    check_continues("honest", before, || count_of(pid))?;
    Ok(started.elapsed())
}

/// `ctr containers restore` (containerd → the gpusnap shim's Create with a checkpoint): a
/// forged criu.tar is refused before CRIU runs; the honest one restores and counts on.
#[test]
fn ctr_restore_refuses_forged_cores_and_restores_the_honest_one() -> Result<()> {
    use gpusnap_testkit::checkpoint::CkRig;
    let rig = CkRig::start_for(Runtime::Gpusnap)?;
    let run = run_token();
    rig.run_detached(
        Runtime::Gpusnap,
        "src",
        &["sh", "-c", COUNTER, run.as_str()],
    )?;
    let image = "ck/privilege:1";
    let before = checkpoint_src(&rig, &run, image)?;

    type Edit = fn(u32, &mut ThreadCoreEntry);
    let cases: [(&str, Edit, &[&str]); 2] = [
        (
            "caps",
            all_capabilities,
            &[
                "task 1 (core-1.img): cap_eff holds",
                "CAP_SYS_ADMIN",
                // containerd's default set.
                "which the container spec's bounding set does not (spec 0xa80425fb, image \
                 0x1ffffffffff)",
            ],
        ),
        (
            "no-creds",
            |_, t| t.creds = None,
            &["task 1 (core-1.img): creds are missing"],
        ),
    ];
    let mut failures = Vec::new();
    for (i, (name, forge, says)) in cases.iter().enumerate() {
        let err = ctr_restore_forged(&rig, image, &format!("forged{i}"), |d| {
            forge_and_reseal(d, forge)
        })?;
        let missing: Vec<&&str> = says.iter().filter(|s| !err.contains(**s)).collect();
        if !missing.is_empty() {
            failures.push(format!("{name}: {missing:?} missing from {err:?}"));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));

    let took = ctr_restore_honest(&rig, image, &before)?;
    eprintln!("honest ctr restore took {took:?}");
    Ok(())
}

/// The check's cost on an honest checkpoint, from the restore's own log line.
#[test]
fn the_check_costs_milliseconds_on_an_honest_checkpoint() {
    gpusnap_testkit::require_root();
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().into();
    let config = dir.join("config.toml");
    paths::write_criu_config(&config, "").unwrap();
    let env = [
        ("GPUSNAP_CONFIG", config.to_str().unwrap()),
        ("GPUSNAP_LOG", "debug"),
    ];
    let run = run_token();
    let c = BusyboxContainer::create(&dir, "priv-cost", &counter_script(&run));
    c.start();
    let count = || count_in_file(&c.bundle.join("rootfs/tmp/count"));
    wait_count(&run, &c.id, WARM, count).unwrap();
    let images = dir.join("images");
    let (code, _, err) = c.wrapper(
        &[
            "checkpoint",
            "--image-path",
            images.to_str().unwrap(),
            &c.id,
        ],
        &env,
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = c.wrapper_restore(&images, &env, &dir);
    assert_eq!(code, 0, "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("CRIU images within the container's spec"))
        .unwrap_or_else(|| panic!("no check line in:\n{err}"));
    let us: u64 = line
        .split("elapsed_us=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_us in {line}"));
    eprintln!("privilege check: {us} µs ({line})");
    assert!(
        us < 50_000,
        "the check took {us} µs on a two-task checkpoint"
    );
}

/// `ctr run --seccomp` (containerd's default profile, compiled by runc): the honest checkpoint
/// restores under the content comparison, and the same checkpoint with every filter replaced
/// by one `SECCOMP_RET_ALLOW` is refused before CRIU runs, naming a call the profile stops.
#[test]
fn ctr_restore_compares_seccomp_filters_with_the_default_profile() -> Result<()> {
    use gpusnap_testkit::checkpoint::CkRig;
    use gpusnap_testkit::rig::RunOpts;
    let rig = CkRig::start_for(Runtime::Gpusnap)?;
    let run = run_token();
    rig.run_detached_with(
        Runtime::Gpusnap,
        "src",
        &["sh", "-c", COUNTER, run.as_str()],
        &RunOpts {
            extra_args: vec!["--seccomp".into()],
            ..RunOpts::default()
        },
    )?;
    let src_pid = rig.task_pid("src")?;
    let status = fs::read_to_string(format!("/proc/{src_pid}/status"))?;
    ensure!(
        status
            .lines()
            .any(|l| l.starts_with("Seccomp:") && l.ends_with('2')),
        "the container runs without a seccomp filter: {status}"
    );
    let image = "ck/seccomp:1";
    let before = checkpoint_src(&rig, &run, image)?;

    let err = ctr_restore_forged(&rig, image, "forged", |d| {
        gpusnap_testkit::seccomp::forge_permissive_and_reseal(d)
    })?;
    for says in [
        "task 1 (core-1.img): seccomp_filter leads to a filter chain in seccomp.img none of \
         whose filters is as strict as the container spec's seccomp profile",
        "it returns SECCOMP_RET_ALLOW for",
        "where the spec's seccomp profile gives SCMP_ACT_ERRNO",
    ] {
        ensure!(err.contains(says), "{says:?} missing from {err:?}");
    }

    let took = ctr_restore_honest(&rig, image, &before)?;
    eprintln!("honest ctr restore with the default seccomp profile took {took:?}");
    Ok(())
}
