//! The three binaries follow their ecosystems' conventions, through the binaries themselves:
//! `--help` and `--version` on each, man pages and shell completions generated from each
//! one's clap command, and `$GPUSNAP_CONFIG` honoured by `gpusnap` as by the shim and
//! gpusnap-runc.

use std::fs;
use std::process::{Command, Output};

use gpusnap_testkit::{describe, paths, text};

const BINARIES: [&str; 3] = ["gpusnap", "gpusnap-runc", "containerd-shim-gpusnap-v2"];

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(paths::binary(bin))
        .args(args)
        .env_remove("GPUSNAP_CONFIG")
        .env_remove("GPUSNAP_LOG")
        .output()
        .unwrap()
}

#[test]
fn every_binary_answers_help_and_version() {
    for bin in BINARIES {
        let out = run(bin, &["--help"]);
        assert!(out.status.success(), "{bin} --help: {}", describe(&out));
        assert!(
            text(&out.stdout).contains(&format!("Usage: {bin}")),
            "{bin} --help: {}",
            describe(&out)
        );
        let out = run(bin, &["--version"]);
        assert!(out.status.success(), "{bin} --version: {}", describe(&out));
        assert!(
            text(&out.stdout).contains(env!("CARGO_PKG_VERSION")),
            "{bin} --version: {}",
            describe(&out)
        );
    }
    // The shim is started by containerd with one-dash flags; `-v` is what containerd asks.
    let out = run("containerd-shim-gpusnap-v2", &["-v"]);
    assert!(
        text(&out.stdout).contains("io.containerd.gpusnap.v2"),
        "{}",
        describe(&out)
    );
    // gpusnap-runc's own usage first, then runc's help (when a runc is installed).
    let out = run("gpusnap-runc", &["--help"]);
    let help = text(&out.stdout);
    assert!(
        help.contains("GPUSNAP_CONFIG") && help.contains("checkpoint"),
        "{help}"
    );
    if std::path::Path::new("/usr/sbin/runc").exists()
        || std::path::Path::new("/usr/bin/runc").exists()
    {
        let ours = help.find("Usage: gpusnap-runc").unwrap();
        let runcs = help.find("runc - Open Container Initiative runtime");
        assert!(
            runcs.is_some_and(|r| r > ours),
            "runc's help after ours: {help}"
        );
    }
}

#[test]
fn man_pages_and_completions_for_every_binary() {
    let dir = tempfile::tempdir().unwrap();
    for bin in BINARIES {
        let out = run(bin, &["--generate-man", dir.path().to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{bin} --generate-man: {}",
            describe(&out)
        );
        let page = fs::read_to_string(dir.path().join(format!("{bin}.1"))).unwrap();
        assert!(page.contains(".TH"), "{bin}.1: {page}");
        for shell in ["bash", "zsh", "fish"] {
            let out = run(bin, &["--generate-completion", shell]);
            assert!(out.status.success(), "{bin} {shell}: {}", describe(&out));
            assert!(text(&out.stdout).contains(bin), "{bin} {shell} completion");
        }
    }
    // One page per gpusnap subcommand, nested ones included.
    for page in [
        "gpusnap-install.1",
        "gpusnap-doctor.1",
        "gpusnap-image-pull.1",
        "gpusnap-checkpoint-verify.1",
    ] {
        assert!(dir.path().join(page).is_file(), "{page} missing");
    }
    // What users type: `gpusnap completion SHELL`.
    let out = run("gpusnap", &["completion", "bash"]);
    assert!(
        out.status.success() && text(&out.stdout).contains("complete"),
        "{}",
        describe(&out)
    );
    let out = run("gpusnap", &["--generate-completion", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn gpusnap_config_env_is_honoured_and_the_flag_wins() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("from-env.toml");
    fs::write(&bad, "[storage]\ntransfer_buffer_count = 99\n").unwrap();
    let good = dir.path().join("given.toml");
    fs::write(&good, "[storage]\ntransfer_buffer_count = 2\n").unwrap();
    let cmd = |args: &[&str]| {
        Command::new(paths::binary("gpusnap"))
            .args(args)
            .env("GPUSNAP_CONFIG", &bad)
            .env_remove("GPUSNAP_LOG")
            .output()
            .unwrap()
    };
    let out = cmd(&["config", "check"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("storage.transfer_buffer_count"),
        "{}",
        describe(&out)
    );
    let out = cmd(&["--config", good.to_str().unwrap(), "config", "check"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        text(&out.stdout).contains("given.toml"),
        "{}",
        describe(&out)
    );
    // doctor reads the same file.
    let out = cmd(&["doctor", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let config = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "config")
        .unwrap();
    assert_eq!(config["status"], "fail", "{config}");
    assert!(
        config["summary"]
            .as_str()
            .unwrap()
            .contains("transfer_buffer_count"),
        "{config}"
    );
}
