//! `gpusnap install` / `uninstall` against realistic containerd configs (version 2 and 3),
//! then a real containerd started with the result.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use gpusnap_testkit::containerd;
use gpusnap_testkit::fixtures::snapshot;
use gpusnap_testkit::{describe, gpusnap, require_root, rig_bin_dir, text};

struct Scratch {
    dir: tempfile::TempDir,
    original: String,
}

impl Scratch {
    fn new(fixture: &str) -> Scratch {
        // Short path: containerd's socket must fit in sun_path.
        let dir = tempfile::Builder::new()
            .prefix("gsi-")
            .tempdir_in("/tmp")
            .unwrap();
        let template = fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(fixture),
        )
        .unwrap();
        let original = template.replace("@DIR@", dir.path().to_str().unwrap());
        fs::create_dir_all(dir.path().join("etc/containerd")).unwrap();
        fs::write(dir.path().join("etc/containerd/config.toml"), &original).unwrap();
        // A stand-in shim: containerd only needs the path at start-up.
        let shim = dir.path().join("bin/containerd-shim-gpusnap-v2");
        fs::create_dir_all(shim.parent().unwrap()).unwrap();
        fs::write(&shim, "#!/bin/sh\nexit 1\n").unwrap();
        fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
        Scratch { dir, original }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn containerd_config(&self) -> PathBuf {
        self.p("etc/containerd/config.toml")
    }

    fn args(&self, cmd: &str, extra: &[&str]) -> Vec<String> {
        let mut a = vec![
            cmd.to_owned(),
            "--config".into(),
            self.p("etc/gpusnap/config.toml").display().to_string(),
            "--state-file".into(),
            self.p("var/lib/gpusnap/install-state.json")
                .display()
                .to_string(),
        ];
        if cmd == "install" {
            a.extend(
                [
                    "--containerd-config",
                    self.containerd_config().to_str().unwrap(),
                    "--containerd-bin",
                    rig_bin_dir().join("containerd").to_str().unwrap(),
                    "--shim-path",
                    self.p("bin/containerd-shim-gpusnap-v2").to_str().unwrap(),
                    "--skip-crio",
                    "--skip-podman",
                    "--criu-config",
                    self.p("etc/criu/runc.conf").to_str().unwrap(),
                    "--criu-network-lock",
                    "skip",
                ]
                .map(String::from),
            );
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn gpusnap(&self, cmd: &str, extra: &[&str]) -> std::process::Output {
        gpusnap(self.args(cmd, extra))
    }
}

/// Every line of `original` appears in `installed`, in order: comments and unrelated settings
/// survive.
fn assert_lines_kept(original: &str, installed: &str) {
    let mut rest = installed.lines();
    for line in original.lines() {
        assert!(
            rest.by_ref().any(|l| l == line),
            "line {line:?} of the original is missing or out of order in:\n{installed}"
        );
    }
}

/// install → idempotent → containerd starts with the handler → uninstall restores every byte.
fn full_cycle(fixture: &str, mode: &str, expect_dropin: bool) {
    require_root();
    let s = Scratch::new(fixture);
    let out = s.gpusnap("install", &["--containerd-mode", mode]);
    assert!(out.status.success(), "install: {}", describe(&out));
    let installed = fs::read_to_string(s.containerd_config()).unwrap();
    assert_lines_kept(&s.original, &installed);
    let dropin = s.p("etc/containerd/conf.d/99-gpusnap.toml");
    assert_eq!(dropin.exists(), expect_dropin, "{}", describe(&out));
    let registration = if expect_dropin {
        assert!(
            installed.contains(&format!("imports = [\"{}\"]", dropin.display())),
            "{installed}"
        );
        // The main file only gained the imports line.
        let without: String = installed
            .lines()
            .filter(|l| !l.starts_with("imports = "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(without, s.original);
        fs::read_to_string(&dropin).unwrap()
    } else {
        assert!(installed.starts_with(&s.original), "{installed}");
        installed.clone()
    };
    assert!(registration.contains("runtimes.gpusnap]"), "{registration}");
    assert!(
        registration.contains("runtime_type = \"io.containerd.gpusnap.v2\""),
        "{registration}"
    );
    assert!(
        registration.contains("pod_annotations = [\"gpusnap.io/*\"]"),
        "{registration}"
    );
    let gpusnap_config = s.p("etc/gpusnap/config.toml");
    assert!(registration.contains(&format!("ConfigPath = \"{}\"", gpusnap_config.display())));
    // The gpusnap config was created with valid defaults.
    gpusnap_config::Config::from_toml_str(&fs::read_to_string(&gpusnap_config).unwrap()).unwrap();

    // Second run: nothing changes, not even the state file.
    let before = snapshot(s.dir.path());
    let again = s.gpusnap("install", &["--containerd-mode", mode]);
    assert!(again.status.success(), "{}", describe(&again));
    assert!(
        text(&again.stdout).contains("nothing changed"),
        "{}",
        describe(&again)
    );
    assert_eq!(
        snapshot(s.dir.path()),
        before,
        "second install changed files"
    );

    // A real containerd loads it: the CRI plugins are up and the handler is registered.
    {
        let cd = containerd::start_with_config(
            &s.containerd_config(),
            &s.p("containerd.sock"),
            &s.p("containerd.log"),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let plugins = cd.ctr(&["plugins", "ls"]).unwrap();
        let plugins = text(&plugins.stdout);
        for (ty, id) in [
            ("io.containerd.cri.v1", "runtime"),
            ("io.containerd.grpc.v1", "cri"),
        ] {
            assert!(
                plugins.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.first() == Some(&ty) && f.get(1) == Some(&id) && f.last() == Some(&"ok")
                }),
                "{ty} {id} not ok:\n{plugins}\n{}",
                cd.log_text()
            );
        }
        let log = cd.log_text();
        let cri_line = log
            .lines()
            .find(|l| l.contains("starting cri plugin"))
            .unwrap_or_else(|| panic!("no CRI start line:\n{log}"));
        // The CRI config as containerd parsed it (quotes are escaped inside the log line).
        for needle in [
            r#"\"gpusnap\":{\"runtimeType\":\"io.containerd.gpusnap.v2\""#,
            r#"\"PodAnnotations\":[\"gpusnap.io/*\"]"#,
            r#"\"SystemdCgroup\":true"#,
        ] {
            assert!(
                cri_line.contains(needle),
                "{needle} missing from {cri_line}"
            );
        }
        assert!(
            cri_line.contains(&format!(
                r#"\"ConfigPath\":\"{}\""#,
                gpusnap_config.display()
            )),
            "{cri_line}"
        );
    }

    // Uninstall: byte for byte, created files and directories gone.
    let out = s.gpusnap("uninstall", &[]);
    assert!(out.status.success(), "uninstall: {}", describe(&out));
    assert_eq!(
        fs::read(s.containerd_config()).unwrap(),
        s.original.as_bytes()
    );
    assert!(!dropin.exists() && !s.p("etc/containerd/conf.d").exists());
    assert!(!gpusnap_config.exists() && !s.p("etc/gpusnap").exists());
    assert!(!s.p("var/lib/gpusnap/install-state.json").exists());
    let twice = s.gpusnap("uninstall", &[]);
    assert!(twice.status.success() && text(&twice.stdout).contains("nothing to do"));
}

#[test]
fn v2_config_in_place_cycle() {
    full_cycle("containerd-v2.toml", "in-place", false);
}

#[test]
fn v2_config_auto_uses_dropin_on_containerd_2() {
    // The rig's containerd is 2.x, which merges drop-ins key by key.
    full_cycle("containerd-v2.toml", "auto", true);
}

#[test]
fn v3_config_auto_dropin_cycle() {
    full_cycle("containerd-v3.toml", "auto", true);
}

#[test]
fn dry_run_prints_a_diff_and_changes_nothing() {
    let s = Scratch::new("containerd-v3.toml");
    let before = snapshot(s.dir.path());
    let out = s.gpusnap("install", &["--dry-run"]);
    assert!(out.status.success(), "{}", describe(&out));
    let diff = text(&out.stdout);
    let dropin = s.p("etc/containerd/conf.d/99-gpusnap.toml");
    assert!(
        diff.contains(&format!("--- /dev/null\n+++ {}\n", dropin.display())),
        "{diff}"
    );
    assert!(
        diff.contains("+[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gpusnap]"),
        "{diff}"
    );
    let main = s.containerd_config().display().to_string();
    assert!(
        diff.contains(&format!("--- {main}\n+++ {main}\n")),
        "{diff}"
    );
    assert!(
        diff.contains(&format!("+imports = [\"{}\"]", dropin.display())),
        "{diff}"
    );
    assert!(text(&out.stderr).contains("drop-in"), "{}", describe(&out));
    assert_eq!(snapshot(s.dir.path()), before, "--dry-run wrote something");
}

#[test]
fn edits_after_install_are_kept_unless_forced() {
    let s = Scratch::new("containerd-v2.toml");
    let out = s.gpusnap("install", &["--containerd-mode", "in-place"]);
    assert!(out.status.success(), "{}", describe(&out));
    let mut edited = fs::read_to_string(s.containerd_config()).unwrap();
    edited.push_str("# an operator's later edit\n");
    fs::write(s.containerd_config(), &edited).unwrap();

    let dry = s.gpusnap("uninstall", &["--dry-run"]);
    assert!(
        text(&dry.stderr).contains("changed since gpusnap installed it"),
        "{}",
        describe(&dry)
    );
    let out = s.gpusnap("uninstall", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert_eq!(fs::read_to_string(s.containerd_config()).unwrap(), edited);
    // The gpusnap config was ours and untouched: removed.
    assert!(!s.p("etc/gpusnap/config.toml").exists());
    assert!(
        s.p("var/lib/gpusnap/install-state.json").exists(),
        "state kept for --force"
    );

    let out = s.gpusnap("uninstall", &["--force"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        fs::read(s.containerd_config()).unwrap(),
        s.original.as_bytes()
    );
    assert!(!s.p("var/lib/gpusnap/install-state.json").exists());
}

#[test]
fn invalid_config_from_names_the_setting_and_writes_nothing() {
    let s = Scratch::new("containerd-v3.toml");
    let bad = s.p("bad.toml");
    fs::write(&bad, "[storage]\ntransfer_chunk_bytes = 1000000\n").unwrap();
    let before = snapshot(s.dir.path());
    let out = s.gpusnap("install", &["--config-from", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = text(&out.stderr);
    assert!(err.contains("storage.transfer_chunk_bytes"), "{err}");
    assert!(err.contains(bad.to_str().unwrap()), "{err}");
    assert_eq!(snapshot(s.dir.path()), before);

    // A valid one is installed verbatim, and uninstall removes it again.
    let good = s.p("good.toml");
    fs::write(
        &good,
        "[storage]\nengine = \"posix\"\ntransfer_buffer_count = 2\n",
    )
    .unwrap();
    let out = s.gpusnap("install", &["--config-from", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        fs::read(s.p("etc/gpusnap/config.toml")).unwrap(),
        fs::read(&good).unwrap()
    );
}

#[test]
fn crio_dropin_and_criu_network_lock() {
    let s = Scratch::new("containerd-v3.toml");
    let crio_dir = s.p("etc/crio/crio.conf.d");
    fs::create_dir_all(&crio_dir).unwrap();
    let runc_conf = s.p("etc/criu/runc.conf");
    fs::create_dir_all(runc_conf.parent().unwrap()).unwrap();
    fs::write(&runc_conf, "# site CRIU options\ntcp-established\n").unwrap();
    let wrapper = s.p("bin/gpusnap-runc");
    fs::write(&wrapper, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();

    let mut args = s.args("install", &[]);
    // Replace the defaults from Scratch::args: CRI-O on, nftables forced.
    args.retain(|a| a != "--skip-crio");
    let pos = args.iter().position(|a| a == "skip").unwrap();
    args[pos] = "nftables".into();
    args.extend([
        "--crio-dropin-dir".into(),
        crio_dir.display().to_string(),
        "--runc-wrapper-path".into(),
        wrapper.display().to_string(),
    ]);
    let out = gpusnap(&args);
    assert!(out.status.success(), "{}", describe(&out));
    let dropin = fs::read_to_string(crio_dir.join("90-gpusnap.conf")).unwrap();
    let doc: toml_edit::DocumentMut = dropin.parse().unwrap();
    assert_eq!(
        doc["crio"]["runtime"]["runtimes"]["gpusnap"]["runtime_path"].as_str(),
        Some(wrapper.to_str().unwrap())
    );
    assert_eq!(
        doc["crio"]["runtime"]["runtimes"]["gpusnap"]["runtime_type"].as_str(),
        Some("oci")
    );
    assert_eq!(
        doc["crio"]["checkpoint_restore"]["container_level_enabled"].as_str(),
        Some("checkpoint_restore")
    );
    let criu = fs::read_to_string(&runc_conf).unwrap();
    assert!(
        criu.starts_with("# site CRIU options\ntcp-established\n"),
        "{criu}"
    );
    assert!(criu.ends_with("network-lock nftables\n"), "{criu}");
    assert!(
        text(&out.stdout).contains("restart CRI-O"),
        "{}",
        describe(&out)
    );

    let out = s.gpusnap("uninstall", &[]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        fs::read_to_string(&runc_conf).unwrap(),
        "# site CRIU options\ntcp-established\n"
    );
    assert!(!crio_dir.join("90-gpusnap.conf").exists());
    assert!(
        crio_dir.exists(),
        "CRI-O's own directory is not ours to remove"
    );
    assert_eq!(
        fs::read(s.containerd_config()).unwrap(),
        s.original.as_bytes()
    );
}

#[test]
fn podman_registration_in_an_existing_containers_conf_and_uninstall() {
    let s = Scratch::new("containerd-v3.toml");
    let conf = s.p("etc/containers/containers.conf");
    fs::create_dir_all(conf.parent().unwrap()).unwrap();
    let original = "# site Podman settings\n[engine]\ncgroup_manager = \"cgroupfs\"\n";
    fs::write(&conf, original).unwrap();
    let wrapper = s.p("bin/gpusnap-runc");
    fs::write(&wrapper, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();

    let mut args = s.args("install", &[]);
    args.retain(|a| a != "--skip-podman");
    args.extend([
        "--skip-containerd".into(),
        "--podman-conf".into(),
        conf.display().to_string(),
        "--runc-wrapper-path".into(),
        wrapper.display().to_string(),
    ]);
    let out = gpusnap(&args);
    assert!(out.status.success(), "{}", describe(&out));
    let installed = fs::read_to_string(&conf).unwrap();
    assert!(installed.starts_with(original), "{installed}");
    let doc: toml_edit::DocumentMut = installed.parse().unwrap();
    assert_eq!(
        doc["engine"]["runtimes"]["gpusnap"]
            .as_array()
            .and_then(|a| a.get(0))
            .and_then(|v| v.as_str()),
        Some(wrapper.to_str().unwrap())
    );
    // The gpusnap config is not at its default location: Podman and conmon get its path.
    let env = format!(
        "GPUSNAP_CONFIG={}",
        s.p("etc/gpusnap/config.toml").display()
    );
    for key in ["env", "conmon_env_vars"] {
        assert!(
            doc["engine"][key]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(env.as_str()))),
            "engine.{key} lacks {env}:\n{installed}"
        );
    }
    assert!(
        doc["engine"]["conmon_env_vars"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v.as_str().is_some_and(|s| s.starts_with("PATH=/"))),
        "{installed}"
    );
    // The new gpusnap config names runc absolutely.
    let config = fs::read_to_string(s.p("etc/gpusnap/config.toml")).unwrap();
    assert!(
        config.lines().any(|l| l.starts_with("binary = \"/")),
        "{config}"
    );
    // Idempotent, then reverted byte for byte.
    let again = gpusnap(&args);
    assert!(
        text(&again.stdout).contains("nothing changed"),
        "{}",
        describe(&again)
    );
    let out = s.gpusnap("uninstall", &[]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(fs::read_to_string(&conf).unwrap(), original);
}

/// A k3s/RKE2 node: install edits the config template k3s renders config.toml from (never
/// config.toml, which k3s rewrites at each start); the template, rendered as k3s renders it,
/// gives a containerd that has loaded the handler; uninstall removes the template again.
#[test]
fn k3s_template_is_edited_and_rendered_with_the_handler() {
    require_root();
    let s = Scratch::new("containerd-v3.toml");
    let template = s.p("etc/containerd/config-v3.toml.tmpl");
    let mut args = s.args("install", &[]);
    let at = args
        .iter()
        .position(|a| a == "--containerd-config")
        .unwrap();
    args[at + 1] = template.display().to_string();
    let out = gpusnap(&args);
    assert!(out.status.success(), "install: {}", describe(&out));
    assert_eq!(
        fs::read_to_string(s.containerd_config()).unwrap(),
        s.original,
        "config.toml is k3s's to write"
    );
    let t = fs::read_to_string(&template).unwrap();
    assert!(t.starts_with("{{ template \"base\" . }}\n"), "{t}");
    assert!(
        t.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gpusnap]"),
        "{t}"
    );
    let again = gpusnap(&args);
    assert!(
        text(&again.stdout).contains("nothing changed"),
        "{}",
        describe(&again)
    );

    // What k3s does at start: the base configuration in place of {{ template "base" . }}.
    let rendered = s.p("etc/containerd/rendered.toml");
    fs::write(
        &rendered,
        t.replace("{{ template \"base\" . }}\n", &s.original),
    )
    .unwrap();
    {
        let cd = containerd::start_with_config(
            &rendered,
            &s.p("containerd.sock"),
            &s.p("containerd.log"),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let out = gpusnap([
            "--config",
            "/dev/null",
            "doctor",
            "--json",
            "--containerd-socket",
            cd.address().to_str().unwrap(),
        ]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let c = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "containerd")
            .unwrap();
        assert_eq!(c["status"], "ok", "{c}");
    }
    let out = s.gpusnap("uninstall", &[]);
    assert!(out.status.success(), "uninstall: {}", describe(&out));
    assert!(!template.exists(), "the template gpusnap created is gone");
    assert_eq!(
        fs::read_to_string(s.containerd_config()).unwrap(),
        s.original
    );
}
