//! `gpusnap image build` on a terminal shows what it wrote, counted where it is written (the
//! kernel's count of this process's writes): at least the image it produced. Off a terminal
//! it shows nothing. (Push and pull progress: store_cli.rs.)

use std::process::Command;
use std::time::Duration;

use gpusnap_testkit::fixtures::fixture;
use gpusnap_testkit::{describe, paths, pty};

/// `12.50 KiB` -> bytes.
fn bytes(text: &str) -> f64 {
    let mut it = text.split_whitespace();
    let n: f64 = it.next().unwrap().parse().unwrap();
    let unit = it.next().unwrap();
    n * match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        u => panic!("unit {u}"),
    }
}

#[test]
fn build_progress_counts_the_bytes_written() {
    let fx = fixture();
    let out_path = fx.work.path().join("image.oci.tar");
    let mut cmd = Command::new(paths::binary("gpusnap"));
    cmd.args(["image", "build"])
        .arg(&fx.archive)
        .arg("-o")
        .arg(&out_path)
        .env_remove("GPUSNAP_CONFIG");
    let out = pty::run_in_pty(cmd, Duration::from_secs(120)).unwrap();
    let text = out.text();
    assert!(out.status.success(), "{text}");
    let line = text
        .rsplit("built ")
        .next()
        .filter(|_| text.contains("built "))
        .unwrap_or_else(|| panic!("no build progress on a terminal: {text}"));
    let written = line.split(" written").next().unwrap();
    // `⠁ 35.12 KiB`: drop the spinner.
    let written = written.split_once(' ').map_or(written, |(_, rest)| rest);
    let archive = std::fs::metadata(&out_path).unwrap().len() as f64;
    assert!(
        bytes(written) >= archive,
        "counted {written} written, but the archive alone is {archive} bytes: {text}"
    );

    // Off a terminal: the summary only.
    let out = Command::new(paths::binary("gpusnap"))
        .args(["image", "build"])
        .arg(&fx.archive)
        .arg("-o")
        .arg(fx.work.path().join("again.oci.tar"))
        .env_remove("GPUSNAP_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("written"),
        "{}",
        describe(&out)
    );
}
