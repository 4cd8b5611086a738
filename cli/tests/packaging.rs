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
    // Pods of the class land only on nodes the installer found ready (the label it sets).
    assert!(
        rc.contains(&format!("{}: \"true\"", gpusnap_cli::kube::READY_LABEL)),
        "{rc}"
    );
}

/// Every setting of the config model is a chart value (values.yaml, values.schema.json, and
/// rendered into config.toml by the chart's template), except those that name key, credential
/// and CA files, which come from Secrets: the schema cannot refuse a setting gpusnap accepts
/// (`restore.deadline_seconds` was refused).
#[test]
fn chart_values_cover_every_config_setting() {
    const FROM_SECRETS: [&str; 5] = [
        "restore.signature_keys",
        "restore.decryption_keys",
        "checkpoint.signing_key",
        "checkpoint.registry_config",
        "checkpoint.registry_ca_files",
    ];
    let chart = repo("packaging/helm/gpusnap");
    let schema: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(chart.join("values.schema.json")).unwrap())
            .unwrap();
    let values = fs::read_to_string(chart.join("values.yaml")).unwrap();
    let helpers = fs::read_to_string(chart.join("templates/_helpers.tpl")).unwrap();
    let config = &schema["properties"]["config"]["properties"];
    // Every setting the model serialises, and the optional ones it leaves out when unset.
    let defaults: toml_edit::DocumentMut = gpusnap_config::Config::default()
        .to_toml_string()
        .parse()
        .unwrap();
    let mut settings: Vec<String> = defaults
        .iter()
        .flat_map(|(table, item)| {
            item.as_table()
                .into_iter()
                .flat_map(|t| t.iter())
                .map(move |(key, _)| format!("{table}.{key}"))
        })
        .collect();
    settings.extend(
        [
            "criu.binary_dir",
            "criu.min_version",
            "checkpoint.signing_key",
            "checkpoint.registry_config",
        ]
        .map(String::from),
    );
    let mut missing = Vec::new();
    for setting in &settings {
        if FROM_SECRETS.contains(&setting.as_str()) {
            continue;
        }
        let (table, key) = setting.split_once('.').unwrap();
        if config[table]["properties"][key].is_null() {
            missing.push(format!("{setting}: not in values.schema.json"));
        }
        if !values.contains(&format!("\n    {key}: ")) {
            missing.push(format!("{setting}: not in values.yaml"));
        }
        if !helpers.contains(&format!("$c.{table}.{key}")) {
            missing.push(format!("{setting}: not rendered by templates/_helpers.tpl"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    // And nothing the model lacks: the schema's settings are the model's.
    for (table, t) in config.as_object().unwrap() {
        for key in t["properties"].as_object().unwrap().keys() {
            assert!(
                settings.contains(&format!("{table}.{key}")),
                "values.schema.json has config.{table}.{key}, which gpusnap does not know"
            );
        }
    }
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
