//! `restore.page_fill_min_bytes` through the shim's front door (`ctr`): a container holding a
//! large private memory area with content a zero-filled area cannot pass for (the text of
//! `seq`, held twice and compared every 0.2 s inside the container) is checkpointed, killed and
//! restored. CRIU restores it with that area's pages taken out of its images and leaves the
//! tasks stopped; the shim writes the pages in and continues them. The workload must go on
//! with its memory intact, and the shim must say it wrote them. The node's config does not name
//! the setting: this is its default (16 MiB). A second run does the same with a zombie in the
//! checkpoint (the init is a `sleep` that never reaps an exited child): CRIU restores it dead,
//! and the fill must go on without it.
//!
//! Needs root and `scripts/setup-env.sh`, and `cargo build -p gpusnap-shim`.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::checkpoint::{
    container_checkpoint_ok, container_restore_live_ok, kill_and_remove, read_in_task, CkRig,
};
use gpusnap_testkit::counter::{parse_memory_state, MEMORY_HOLDER, MEMORY_STATE_FILE};
use gpusnap_testkit::paths::rig_bin_dir;
use gpusnap_testkit::{wait_until, RigOptions, Runtime};

#[test]
fn large_memory_written_by_the_shim_goes_on_intact() {
    gpusnap_testkit::require_root();
    if let Err(e) = run("filled", Workload::Holder) {
        panic!("{e:#}");
    }
}

/// CRIU restores a zombie dead: the fill must neither look for it nor fail for want of it.
#[test]
fn a_zombie_in_the_checkpoint_leaves_the_fill_working() {
    gpusnap_testkit::require_root();
    if let Err(e) = run("zombied", Workload::HolderBesideAZombie) {
        panic!("{e:#}");
    }
}

enum Workload {
    /// The holder is the container's init.
    Holder,
    /// The init is `sleep`, which never reaps: the holder runs as its child, beside a child
    /// that has exited (a zombie until the container goes).
    HolderBesideAZombie,
}

/// The host pids of `pid`'s children that are zombies.
fn zombie_children(pid: u32) -> Vec<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/stat")).is_ok_and(|stat| {
                // The state follows the command's closing parenthesis.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
        })
        .collect()
}

/// The state line the workload last wrote: (round, ok).
fn state(rig: &CkRig, id: &str) -> Option<(u64, bool)> {
    parse_memory_state(&read_in_task(rig, id, MEMORY_STATE_FILE)?)
}

fn run(id: &str, workload: Workload) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("gpusnap.toml");
    std::fs::write(
        &config,
        format!("[criu]\nbinary_dir = \"{}\"\n", rig_bin_dir().display()),
    )?;
    let rig = CkRig::start_with(RigOptions {
        require_gpusnap: true,
        containerd_env: vec![("GPUSNAP_CONFIG".into(), config.display().to_string())],
        ..RigOptions::default()
    })?;
    let command: &[&str] = match workload {
        Workload::Holder => &["sh", "-c", MEMORY_HOLDER],
        Workload::HolderBesideAZombie => &[
            "sh",
            "-c",
            "sh -c \"$0\" & true & exec sleep 100000",
            MEMORY_HOLDER,
        ],
    };
    rig.run_detached(Runtime::Gpusnap, id, command)?;
    ensure!(
        wait_until(Duration::from_secs(120), || {
            state(&rig, id).is_some_and(|(n, ok)| n >= 2 && ok)
        }),
        "the holder did not finish two rounds: {:?}",
        state(&rig, id)
    );
    if let Workload::HolderBesideAZombie = workload {
        let init = rig.task_pid(id)?;
        ensure!(
            wait_until(Duration::from_secs(10), || !zombie_children(init)
                .is_empty()),
            "no zombie child of the init {init} to checkpoint"
        );
    }
    let image = format!("ck/{id}:1");
    container_checkpoint_ok(&rig, id, &image, true)?;
    kill_and_remove(&rig, id)?;
    container_restore_live_ok(&rig, id, &image, true)?;
    if let Workload::HolderBesideAZombie = workload {
        let init = rig.task_pid(id)?;
        ensure!(
            !zombie_children(init).is_empty(),
            "the restored init {init} has no zombie child: the checkpoint held none"
        );
    }
    let (first, _) = state(&rig, id).context("no state after the restore")?;
    ensure!(
        wait_until(Duration::from_secs(60), || {
            state(&rig, id).is_some_and(|(n, _)| n >= first + 2)
        }),
        "no two more rounds after the restore: {:?}",
        state(&rig, id)
    );
    let (n, ok) = state(&rig, id).context("no state")?;
    ensure!(ok, "round {n} after the restore found the memory changed");
    let log = rig.log_tail(400);
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("restore complete") && l.contains(id))
        .context("no 'restore complete' line in containerd's log")?;
    let bytes: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("page_fill_bytes="))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .with_context(|| format!("no page_fill_bytes in {line}"))?;
    let about_pages: Vec<&str> = log.lines().filter(|l| l.contains("page")).collect();
    ensure!(
        bytes >= 16 << 20,
        "the shim wrote {bytes} bytes itself, want the holder's area: {line}\n{}",
        about_pages.join("\n")
    );
    Ok(())
}
