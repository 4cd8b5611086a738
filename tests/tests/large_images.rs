//! Page images larger than one digest chunk (64 MiB), through `gpusnap-runc` (the door CRI-O
//! and Podman use): gpusnap hashes CRIU's page images while CRIU writes them, and what it
//! recorded must be exactly what a restore and `gpusnap inspect` verify afterwards.

use std::fs;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::bundle::BusyboxContainer;
use gpusnap_testkit::counter::{
    check_continues, count_in_file, counter_script, run_token, wait_count, WARM,
};
use gpusnap_testkit::paths;

/// 768 MiB of process memory (a `dd` block held while `dd` waits on a pipe nobody reads),
/// started before the counter.
const HOLDER: &str = "busybox dd if=/dev/zero bs=768M count=1 2>/dev/null | sleep 100000 & ";

#[test]
fn page_images_hashed_while_written_verify_on_restore() {
    gpusnap_testkit::require_root();
    if let Err(e) = run() {
        panic!("{e:#}");
    }
}

fn run() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let config = dir.join("config.toml");
    paths::write_criu_config(&config, "")?;
    let config_s = config.to_str().context("config path")?;
    let env = [("GPUSNAP_CONFIG", config_s), ("GPUSNAP_LOG", "info")];
    let run = run_token();
    let c = BusyboxContainer::create(dir, "big", &format!("{HOLDER}{}", counter_script(&run)));
    c.start();
    let count = || count_in_file(&c.bundle.join("rootfs/tmp/count"));
    wait_count(&run, &c.id, WARM, count)?;
    let before = wait_count(&run, &c.id, 0, count)?;

    let images = dir.join("images");
    let log = dir.join("runc.log");
    let images_s = images.to_str().context("image path")?;
    let log_s = log.to_str().context("log path")?;
    let (code, _, err) = c.wrapper(
        &[
            "--log",
            log_s,
            "checkpoint",
            "--image-path",
            images_s,
            &c.id,
        ],
        &env,
        dir,
    );
    ensure!(
        code == 0,
        "gpusnap-runc checkpoint failed (exit {code}):\n{err}"
    );

    // The dump wrote more than a chunk of pages, and some of it was hashed before CRIU ended.
    let pages: u64 = fs::read_dir(&images)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    ensure!(pages > 512 << 20, "page images hold only {pages} bytes");
    let log_text = fs::read_to_string(&log)?;
    let sealed = log_text
        .lines()
        .find(|l| l.contains("checkpoint sealed") && l.contains("total_ms"))
        .with_context(|| {
            format!(
                "no `checkpoint sealed` line in {}:\n{log_text}",
                log.display()
            )
        })?;
    let early: u64 = sealed
        .split("hashed_during_dump_bytes=")
        .nth(1)
        .and_then(|rest| rest.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no hashed_during_dump_bytes in: {sealed}"))?;
    ensure!(
        early >= 64 << 20,
        "only {early} bytes were hashed while CRIU wrote {pages}: {sealed}"
    );

    // Every recorded digest holds: inspect re-hashes the whole image ...
    let inspect = std::process::Command::new(paths::binary("gpusnap"))
        .args(["inspect", images_s])
        .output()?;
    ensure!(
        inspect.status.success(),
        "gpusnap inspect: {}\n{}",
        String::from_utf8_lossy(&inspect.stdout),
        String::from_utf8_lossy(&inspect.stderr)
    );
    // ... and the restore verifies it before CRIU runs, then the counter goes on.
    let (code, _, err) = c.wrapper_restore(&images, &env, dir);
    ensure!(
        code == 0,
        "gpusnap-runc restore failed (exit {code}):\n{err}"
    );
    check_continues(&c.id, &before, count).map(|_| ())
}
