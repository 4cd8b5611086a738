//! The packaging files agree with the code: configs are valid gpusnap configs, the
//! RuntimeClass names the handler install registers. (`packaging/check.sh` renders and
//! schema-checks the manifests and builds the .deb.)

use std::fs;

use gpusnap_testkit::paths::workspace_root;
use gpusnap_testkit::{describe, gpusnap, text};

fn repo(rel: &str) -> std::path::PathBuf {
    workspace_root().join(rel)
}

#[test]
fn shipped_configs_are_valid_and_cover_every_table() {
    for rel in [
        "packaging/kubernetes/config.toml",
        "packaging/overlays/example/config.toml",
    ] {
        let text = fs::read_to_string(repo(rel)).unwrap();
        gpusnap_config::Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for table in ["[storage]", "[cuda]", "[runc]", "[criu]"] {
            assert!(text.contains(table), "{rel} lacks {table}");
        }
    }
    // The base lists every setting (commented when optional): all the config crate serialises,
    let base = fs::read_to_string(repo("packaging/kubernetes/config.toml")).unwrap();
    let defaults: toml_edit::DocumentMut = gpusnap_config::Config::default()
        .to_toml_string()
        .parse()
        .unwrap();
    for (table, item) in defaults.iter() {
        for (key, _) in item.as_table().into_iter().flat_map(|t| t.iter()) {
            assert!(
                base.contains(&format!("[{table}]")) && base.contains(&format!("\n{key} = ")),
                "packaging config lacks {table}.{key}"
            );
        }
    }
    // and the optional ones.
    for key in [
        "engine",
        "transfer_buffer_count",
        "transfer_chunk_bytes",
        "max_operation_seconds",
        "lock_timeout_ms",
        "restore_budget_seconds",
        "library",
        "binary",
        "root",
        "systemd_cgroup",
        "binary_dir",
        "min_version",
    ] {
        assert!(
            base.contains(&format!("{key} = ")),
            "packaging config lacks {key}"
        );
    }
}

#[test]
fn runtimeclass_handler_matches_install() {
    let rc = fs::read_to_string(repo("packaging/kubernetes/runtimeclass.yaml")).unwrap();
    assert!(
        rc.lines()
            .any(|l| l == format!("handler: {}", gpusnap_cli::HANDLER)),
        "{rc}"
    );
    let ds = fs::read_to_string(repo("packaging/kubernetes/daemonset.yaml")).unwrap();
    assert!(
        rc.contains("nvidia.com/gpu.present: \"true\"")
            && ds.contains("nvidia.com/gpu.present: \"true\"")
    );
}

#[test]
fn config_subcommands() {
    let out = gpusnap(["config", "default"]);
    assert!(out.status.success(), "{}", describe(&out));
    let parsed = gpusnap_config::Config::from_toml_str(&text(&out.stdout)).unwrap();
    assert_eq!(parsed, gpusnap_config::Config::default());

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("c.toml");
    fs::write(&bad, "[storage]\ntransfer_chunk_bytes = \"2GiB\"\n").unwrap();
    let out = gpusnap(["--config", bad.to_str().unwrap(), "config", "check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("storage.transfer_chunk_bytes"),
        "{}",
        describe(&out)
    );
}
