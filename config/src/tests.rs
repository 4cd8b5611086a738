use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

fn err(text: &str) -> String {
    Config::from_toml_str(text).unwrap_err().to_string()
}

fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Asserts the message names the setting, the bad value and the valid range.
fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{p:?} missing from: {msg}");
    }
}

#[test]
fn defaults() {
    let c = Config::default();
    assert_eq!(c.storage.engine, StorageEngine::default());
    assert_eq!(c.storage.transfer_buffer_count, 8);
    assert_eq!(c.storage.transfer_chunk_bytes, 16 * MIB);
    assert_eq!(c.storage.pinned_bytes_per_gpu(), 128 * MIB);
    assert_eq!(c.cuda.max_operation(), Duration::from_secs(3600));
    assert_eq!(c.cuda.lock_timeout(), Some(Duration::from_secs(10)));
    assert_eq!(c.cuda.restore_budget(), Duration::from_secs(7200));
    assert_eq!(c.cuda.library, "libcuda.so.1");
    assert_eq!(c.runc.binary, Path::new("runc"));
    assert_eq!(c.runc.root, Path::new("/run/containerd/runc"));
    assert!(!c.runc.systemd_cgroup);
    assert_eq!(c.criu, CriuConfig::default());
    c.validate().unwrap();
    assert_eq!(Config::from_toml_str("").unwrap(), c);
}

#[test]
fn every_setting_parses_from_a_file() {
    // Also keeps the settings table and the serde structs in step: every key is accepted by
    // the unknown-key check and by serde, and lands in the right field.
    let c = Config::from_toml_str(
        r#"
        [storage]
        engine = "posix"
        transfer_buffer_count = 8
        transfer_chunk_bytes = "128MiB"
        [cuda]
        max_operation_seconds = 60
        lock_timeout_ms = 0
        restore_budget_seconds = 1
        library = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        [runc]
        binary = "/usr/sbin/runc"
        root = "/run/gpusnap/runc"
        systemd_cgroup = true
        [criu]
        binary_dir = "/opt/gpusnap-rig/bin"
        min_version = "4.1"
        [checkpoint]
        signing_key = "/etc/gpusnap/signing.key"
        "#,
    )
    .unwrap();
    assert_eq!(
        c.checkpoint.signing_key,
        Some(PathBuf::from("/etc/gpusnap/signing.key"))
    );
    assert_eq!(c.storage.engine, "posix");
    assert_eq!(c.storage.pinned_bytes_per_gpu(), GIB);
    assert_eq!(c.cuda.lock_timeout(), None);
    assert_eq!(c.cuda.restore_budget_seconds, 1);
    assert!(c.runc.systemd_cgroup);
    assert_eq!(
        c.criu.binary_dir,
        Some(PathBuf::from("/opt/gpusnap-rig/bin"))
    );
    assert_eq!(c.criu.min_version, Some(MinVersion::new(4, 1, 0)));
    // Round trip through the serialised form.
    assert_eq!(Config::from_toml_str(&c.to_toml_string()).unwrap(), c);
}

#[test]
fn load_missing_file_is_defaults_and_unreadable_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        Config::load(&dir.path().join("absent.toml")).unwrap(),
        Config::default()
    );
    let e = Config::load(dir.path()).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    let file = dir.path().join("config.toml");
    std::fs::write(&file, "[cuda]\nlock_timeout_ms = 5\n").unwrap();
    assert_eq!(Config::load(&file).unwrap().cuda.lock_timeout_ms, 5);
    std::fs::write(&file, "[cuda]\nlock_timeout_ms = \"soon\"\n").unwrap();
    let msg = Config::load(&file).unwrap_err().to_string();
    assert_names(&msg, &[file.to_str().unwrap(), "line 2", "lock_timeout_ms"]);
}

#[test]
fn unknown_keys_are_named_with_suggestions() {
    let msg = err("[storage]\nenigne = \"posix\"\n");
    assert_names(
        &msg,
        &[
            "unknown setting `storage.enigne`",
            "did you mean `storage.engine`?",
            "valid settings in [storage]: engine, transfer_buffer_count",
        ],
    );
    let msg = err("[stroage]\nengine = \"posix\"\n");
    assert_names(
        &msg,
        &["unknown setting `stroage`", "did you mean `storage`?"],
    );
    let msg = err("[cuda]\nflux_capacitor = 1\n");
    assert!(!msg.contains("did you mean"), "{msg}");
    assert_names(&msg, &["`cuda.flux_capacitor`", "max_operation_seconds"]);
}

#[test]
fn syntax_and_type_errors_show_the_line() {
    let msg = err("[storage\n");
    assert_names(&msg, &["invalid gpusnap config in config text", "line 1"]);
    let msg = err("[storage]\ntransfer_buffer_count = \"four\"\n");
    assert_names(&msg, &["line 2", "transfer_buffer_count"]);
}

#[test]
fn storage_engine_error() {
    // Which engines exist is the cuda crate's registry; the config checks the spelling.
    let msg = err("[storage]\nengine = \"Fast Engine\"\n");
    assert_names(&msg, &["Fast Engine", "driver-managed", "posix"]);
    assert_eq!(
        Config::from_toml_str("[storage]\nengine = \"pagebroker\"\n")
            .unwrap()
            .storage
            .engine,
        "pagebroker"
    );
}

#[test]
fn transfer_buffer_count_range() {
    for bad in [0, 9] {
        let msg = err(&format!("[storage]\ntransfer_buffer_count = {bad}\n"));
        assert_eq!(
            msg,
            format!(
                "invalid storage.transfer_buffer_count = {bad}: expected an integer from 1 to 8"
            )
        );
    }
    Config::from_toml_str("[storage]\ntransfer_buffer_count = 1\n").unwrap();
}

#[test]
fn transfer_chunk_bytes_range_and_alignment() {
    let expected = "expected a size from 1048576 (1 MiB) to 268435456 (256 MiB) that is a \
                    multiple of 4096";
    let msg = err("[storage]\ntransfer_chunk_bytes = 4096\n");
    assert_eq!(
        msg,
        format!("invalid storage.transfer_chunk_bytes = 4096 (4 KiB): {expected}")
    );
    let msg = err("[storage]\ntransfer_chunk_bytes = \"512MiB\"\n");
    assert_names(&msg, &["536870912 (512 MiB)", expected]);
    let msg = err("[storage]\ntransfer_chunk_bytes = 1048577\n");
    assert_names(&msg, &["= 1048577:", "multiple of 4096"]);
    let msg = err("[storage]\ntransfer_chunk_bytes = \"64MB\"\n");
    assert_names(&msg, &["64MB", "use KiB, MiB or GiB"]);
    let c = Config::from_toml_str("[storage]\ntransfer_chunk_bytes = \"1MiB\"\n").unwrap();
    assert_eq!(c.storage.transfer_chunk_bytes, MIB);
}

#[test]
fn pinned_memory_budget() {
    let msg = err("[storage]\ntransfer_buffer_count = 8\ntransfer_chunk_bytes = \"256MiB\"\n");
    assert_eq!(
        msg,
        "invalid storage.transfer_buffer_count × storage.transfer_chunk_bytes = 8 × 268435456 \
         (256 MiB) = 2147483648 (2 GiB) bytes of pinned memory per GPU: expected at most \
         1073741824 (1 GiB) per GPU; lower the buffer count or the chunk size"
    );
    Config::from_toml_str(
        "[storage]\ntransfer_buffer_count = 4\ntransfer_chunk_bytes = \"256MiB\"\n",
    )
    .unwrap();
}

#[test]
fn cuda_ranges() {
    for bad in [0, 3601] {
        assert_eq!(
            err(&format!("[cuda]\nmax_operation_seconds = {bad}\n")),
            format!(
                "invalid cuda.max_operation_seconds = {bad}: expected an integer from 1 to 3600"
            )
        );
    }
    assert_eq!(
        err("[cuda]\nlock_timeout_ms = 3600001\n"),
        "invalid cuda.lock_timeout_ms = 3600001: expected 0 (wait forever) or up to 3600000 \
         (one hour)"
    );
    assert_eq!(
        err("[cuda]\nrestore_budget_seconds = 0\n"),
        "invalid cuda.restore_budget_seconds = 0: expected an integer from 1 to 86400 (one day)"
    );
    let msg = err("[cuda]\nrestore_budget_seconds = -5\n");
    assert_names(&msg, &["restore_budget_seconds", "line 2"]);
    assert_eq!(
        err("[cuda]\nlibrary = \"lib/libcuda.so.1\"\n"),
        "invalid cuda.library = \"lib/libcuda.so.1\": expected a name such as libcuda.so.1 or \
         an absolute path"
    );
    assert_names(&err("[cuda]\nlibrary = \"\"\n"), &["cuda.library = \"\""]);
}

#[test]
fn path_settings() {
    assert_eq!(
        err("[runc]\nroot = \"run/runc\"\n"),
        "invalid runc.root = \"run/runc\": expected an absolute path"
    );
    assert_eq!(
        err("[runc]\nbinary = \"./runc\"\n"),
        "invalid runc.binary = \"./runc\": expected a name such as runc or an absolute path"
    );
    assert_eq!(
        err("[criu]\nbinary_dir = \"bin\"\n"),
        "invalid criu.binary_dir = \"bin\": expected an absolute path"
    );
}

#[test]
fn criu_min_version() {
    assert_eq!(
        err("[criu]\nmin_version = \"3.10\"\n"),
        "invalid criu.min_version = 3.10.0: expected a version of at least 3.16.0 (the minimum \
         containerd and CRI-O accept)"
    );
    let msg = err("[criu]\nmin_version = \"four\"\n");
    assert_names(&msg, &["\"four\" is not a version", "line 2"]);
    let c = Config::from_toml_str("[criu]\nmin_version = \"4.2.1\"\n").unwrap();
    assert_eq!(c.criu.min_version, Some(MinVersion::new(4, 2, 1)));
}

#[test]
fn runtime_options_overlay() {
    let mut c = Config::from_toml_str("[storage]\nengine = \"posix\"\n").unwrap();
    c.apply_runtime_options(
        "BinaryName = \"/usr/bin/nvidia-container-runtime\"\nSystemdCgroup = true\n\
         Root = \"/run/gpusnap\"\nNoPivotRoot = false\n\
         [storage]\ntransfer_chunk_bytes = \"32MiB\"\n[cuda]\nlock_timeout_ms = 0\n",
    )
    .unwrap();
    assert_eq!(
        c.storage.engine, "posix",
        "untouched keys keep the file's value"
    );
    assert_eq!(c.storage.transfer_chunk_bytes, 32 * MIB);
    assert_eq!(
        c.runc.binary,
        Path::new("/usr/bin/nvidia-container-runtime")
    );
    assert_eq!(c.runc.root, Path::new("/run/gpusnap"));
    assert!(c.runc.systemd_cgroup);
    assert_eq!(c.cuda.lock_timeout(), None);
}

#[test]
fn runtime_options_errors_name_the_layer() {
    let mut c = Config::default();
    let before = c.clone();
    let msg = c
        .apply_runtime_options("[storage]\ntransfer_buffer_count = 0\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "containerd runtime options: invalid storage.transfer_buffer_count = 0: expected an \
         integer from 1 to 8"
    );
    let msg = c
        .apply_runtime_options("[storage]\ntransfer_buffer_count = \"many\"\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "containerd runtime options: invalid storage.transfer_buffer_count = \"many\": expected \
         a non-negative integer"
    );
    let e = c
        .apply_runtime_options("[cuda]\nlibary = \"x\"\n")
        .unwrap_err();
    assert!(matches!(e.root(), ConfigError::UnknownKey { .. }), "{e}");
    assert!(
        e.to_string().contains("did you mean `cuda.library`?"),
        "{e}"
    );
    let e = c
        .apply_runtime_options("ShimCgroup = \"/pods\"\n")
        .unwrap_err();
    assert!(
        matches!(e.root(), ConfigError::UnsupportedRuncOption { key } if key == "ShimCgroup"),
        "{e}"
    );
    let e = c.apply_runtime_options("storage = 3\n").unwrap_err();
    assert!(e.to_string().contains("`storage` must be a table"), "{e}");
    assert_eq!(c, before, "a failed overlay changes nothing");
}

#[test]
fn annotations_overlay_and_errors() {
    let mut c = Config::default();
    c.apply_annotations(&ann(&[
        ("gpusnap.io/storage-engine", "posix"),
        ("gpusnap.io/storage-transfer-chunk-bytes", "16Mi"),
        ("gpusnap.io/cuda-lock-timeout-ms", "2500"),
        ("io.kubernetes.cri.container-type", "container"),
    ]))
    .unwrap();
    assert_eq!(c.storage.engine, "posix");
    assert_eq!(c.storage.transfer_chunk_bytes, 16 * MIB);
    assert_eq!(c.cuda.lock_timeout_ms, 2500);

    let before = c.clone();
    let msg = c
        .apply_annotations(&ann(&[("gpusnap.io/storage-engine", "NVMe!")]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "annotation gpusnap.io/storage-engine: invalid storage.engine = \"NVMe!\": expected an \
         engine name of lowercase letters, digits and '-', such as driver-managed or posix"
    );
    let msg = c
        .apply_annotations(&ann(&[("gpusnap.io/cuda-max-operation-seconds", "7200")]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "annotation gpusnap.io/cuda-max-operation-seconds: invalid cuda.max_operation_seconds = \
         7200: expected an integer from 1 to 3600"
    );
    let e = c
        .apply_annotations(&ann(&[("gpusnap.io/storage-engin", "posix")]))
        .unwrap_err();
    assert_names(
        &e.to_string(),
        &[
            "unknown annotation `gpusnap.io/storage-engin`",
            "did you mean `gpusnap.io/storage-engine`?",
            "gpusnap.io/cuda-restore-budget-seconds",
        ],
    );
    for (name, setting) in [
        ("gpusnap.io/runc-binary", "runc.binary"),
        ("gpusnap.io/cuda-library", "cuda.library"),
        ("gpusnap.io/criu-binary-dir", "criu.binary_dir"),
    ] {
        let e = c.apply_annotations(&ann(&[(name, "/tmp/x")])).unwrap_err();
        assert_eq!(
            e,
            ConfigError::AnnotationNotAllowed {
                annotation: name.into(),
                setting
            }
        );
    }
    // Cross-setting limits are checked after all annotations.
    let msg = c
        .apply_annotations(&ann(&[
            ("gpusnap.io/storage-transfer-buffer-count", "8"),
            ("gpusnap.io/storage-transfer-chunk-bytes", "256Mi"),
        ]))
        .unwrap_err()
        .to_string();
    assert_names(
        &msg,
        &[
            "after applying gpusnap.io/ annotations",
            "pinned memory per GPU",
            "1 GiB",
        ],
    );
    assert_eq!(c, before, "failed overlays change nothing");
}

#[test]
fn precedence_file_then_runtime_options_then_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        "[storage]\nengine = \"posix\"\ntransfer_buffer_count = 2\n\
         [cuda]\nrestore_budget_seconds = 100\nlock_timeout_ms = 1\n",
    )
    .unwrap();
    let c = Config::layered(
        &file,
        Some("[storage]\ntransfer_buffer_count = 3\ntransfer_chunk_bytes = \"32MiB\"\n[cuda]\nlock_timeout_ms = 2\n"),
        &ann(&[
            ("gpusnap.io/storage-transfer-buffer-count", "5"),
            ("gpusnap.io/cuda-lock-timeout-ms", "3"),
        ]),
    )
    .unwrap();
    assert_eq!(c.storage.engine, "posix", "file only");
    assert_eq!(c.cuda.restore_budget_seconds, 100, "file only");
    assert_eq!(
        c.storage.transfer_chunk_bytes,
        32 * MIB,
        "runtime options over file"
    );
    assert_eq!(c.storage.transfer_buffer_count, 5, "annotation over both");
    assert_eq!(c.cuda.lock_timeout_ms, 3, "annotation over both");
    // Missing file and empty runtime options: defaults plus annotations.
    let c = Config::layered(
        &dir.path().join("absent.toml"),
        Some("  "),
        &ann(&[("gpusnap.io/storage-engine", "posix")]),
    )
    .unwrap();
    assert_eq!(c.storage.engine, "posix");
    assert_eq!(c.storage.transfer_buffer_count, 8);
}

#[test]
fn annotation_table_is_complete() {
    let names: Vec<String> = annotation_settings().into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        names,
        [
            "gpusnap.io/storage-engine",
            "gpusnap.io/storage-transfer-buffer-count",
            "gpusnap.io/storage-transfer-chunk-bytes",
            "gpusnap.io/cuda-max-operation-seconds",
            "gpusnap.io/cuda-lock-timeout-ms",
            "gpusnap.io/cuda-restore-budget-seconds",
        ]
    );
}

#[test]
fn checkpoint_to_annotations_are_not_settings() {
    let mut c = Config::default();
    let a: HashMap<String, String> = [
        (
            "gpusnap.io/checkpoint-to".to_string(),
            "registry.example.com/ckpt/a".to_string(),
        ),
        (
            "gpusnap.io/checkpoint-to.app".to_string(),
            "registry.example.com/ckpt/b".to_string(),
        ),
    ]
    .into();
    c.apply_annotations(&a)
        .expect("checkpoint-to annotations pass the overlay");
    assert_eq!(c, Config::default(), "they set nothing");
    let bad: HashMap<String, String> =
        [("gpusnap.io/checkpoint-toast".to_string(), "x".to_string())].into();
    assert!(c.apply_annotations(&bad).is_err());
    // Where to push is the node's to allow, never a pod's.
    let allow: HashMap<String, String> = [(
        "gpusnap.io/checkpoint-allowed-destinations".to_string(),
        "evil.example.com/*".to_string(),
    )]
    .into();
    let err = c.apply_annotations(&allow).unwrap_err().to_string();
    assert!(
        err.contains("checkpoint.allowed_destinations") && err.contains("only the node"),
        "{err}"
    );
}

#[test]
fn push_settings_parse_check_and_round_trip() {
    let c = Config::from_toml_str(
        r#"
        [checkpoint]
        allowed_destinations = ["registry.example.com/ckpt/*", "http://127.0.0.1:5000/x"]
        registry_config = "/etc/gpusnap/registry/config.json"
        registry_ca_files = ["/etc/gpusnap/registry-ca/ca.crt"]
        push_attempts = 3
        push_retry_seconds = 2
        "#,
    )
    .unwrap();
    let d = crate::Destination::parse("registry.example.com/ckpt/t").unwrap();
    let hit = crate::allowed(&c.checkpoint.allowed_destinations, &d).unwrap();
    assert!(!hit.plain_http());
    assert_eq!(c.checkpoint.push_attempts, 3);
    assert_eq!(c.checkpoint.push_retry_after(1).as_secs(), 2);
    assert_eq!(c.checkpoint.push_retry_after(3).as_secs(), 8);
    assert_eq!(c.checkpoint.push_retry_after(40), crate::PUSH_RETRY_MAX);
    assert_eq!(Config::from_toml_str(&c.to_toml_string()).unwrap(), c);
    let d = Config::default().checkpoint;
    assert!(
        d.allowed_destinations.is_empty(),
        "nothing allowed by default"
    );
    assert_eq!((d.push_attempts, d.push_retry_seconds), (5, 10));

    for (text, setting) in [
        (
            "[checkpoint]\nallowed_destinations = [\"*\"]\n",
            "checkpoint.allowed_destinations",
        ),
        (
            "[checkpoint]\nallowed_destinations = [\"r.io/a*\"]\n",
            "checkpoint.allowed_destinations",
        ),
        (
            "[checkpoint]\nregistry_config = \"config.json\"\n",
            "checkpoint.registry_config",
        ),
        (
            "[checkpoint]\nregistry_ca_files = [\"ca.pem\"]\n",
            "checkpoint.registry_ca_files",
        ),
        (
            "[checkpoint]\npush_attempts = 0\n",
            "checkpoint.push_attempts",
        ),
        (
            "[checkpoint]\npush_attempts = 21\n",
            "checkpoint.push_attempts",
        ),
        (
            "[checkpoint]\npush_retry_seconds = 0\n",
            "checkpoint.push_retry_seconds",
        ),
    ] {
        let err = Config::from_toml_str(text).unwrap_err().to_string();
        // serde's errors name the key by its line; the table's name it in full.
        let key = setting.rsplit('.').next().unwrap();
        assert!(err.contains(setting) || err.contains(key), "{text}: {err}");
    }
    // The runtime-options overlay takes them too (the node admin's layer).
    let mut c = Config::default();
    c.apply_runtime_options("[checkpoint]\nallowed_destinations = [\"r.io/x/*\"]\n")
        .unwrap();
    assert_eq!(c.checkpoint.allowed_destinations.len(), 1);
    assert!(c
        .apply_runtime_options("[checkpoint]\nallowed_destinations = [\"r.io/x*\"]\n")
        .is_err());
}

#[test]
fn restore_annotations_are_not_settings() {
    let mut c = Config::default();
    let a: HashMap<String, String> = [
        ("gpusnap.io/restore-from".to_string(), "ckpt-1".to_string()),
        (
            "gpusnap.io/restore-from.app".to_string(),
            "ckpt-2".to_string(),
        ),
        (
            "gpusnap.io/restore-from-volume".to_string(),
            "/ckpt".to_string(),
        ),
        (
            "gpusnap.io/restore-from-volume.app".to_string(),
            "/ckpt2".to_string(),
        ),
    ]
    .into();
    c.apply_annotations(&a)
        .expect("restore annotations pass the overlay");
    assert!(crate::is_restore_annotation("gpusnap.io/restore-from.app"));
    assert!(crate::is_restore_annotation(
        "gpusnap.io/restore-from-volume.app"
    ));
    assert!(!crate::is_restore_annotation(
        "gpusnap.io/restore-from-volumes"
    ));
    assert!(!crate::is_restore_annotation("gpusnap.io/restore-fromage"));
    let bad: HashMap<String, String> =
        [("gpusnap.io/restore-fromage".to_string(), "x".to_string())].into();
    assert!(
        c.apply_annotations(&bad).is_err(),
        "near-miss names are still unknown settings"
    );
}

#[test]
fn checkpoint_root_must_be_absolute() {
    let err = Config::from_toml_str("[restore]\ncheckpoint_root = \"relative/dir\"\n").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("restore.checkpoint_root") && msg.contains("absolute"),
        "{msg}"
    );
}

#[test]
fn numeric_annotations_are_bounded() {
    let mut c = Config::default();
    for (key, value) in [
        (
            "gpusnap.io/cuda-restore-budget-seconds",
            "18446744073709551615",
        ),
        (
            "gpusnap.io/cuda-restore-budget-seconds",
            "18446744073709551616",
        ),
        ("gpusnap.io/cuda-lock-timeout-ms", "18446744073709551615"),
        ("gpusnap.io/cuda-max-operation-seconds", "-1"),
        ("gpusnap.io/storage-transfer-chunk-bytes", "99999999999PiB"),
    ] {
        let before = c.clone();
        let err = c
            .apply_annotations(&[(key.to_string(), value.to_string())].into_iter().collect())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}={value}: {err}");
        assert_eq!(
            c, before,
            "{key}={value}: a refused overlay changes nothing"
        );
    }
}

#[test]
fn rootfs_diff_limit_reads_sizes() {
    let c = Config::from_toml_str(
        "[restore]\ncheckpoint_root = \"/x\"\n\nmax_rootfs_diff_bytes = \"1MiB\"\n",
    )
    .unwrap();
    assert_eq!(c.restore.max_rootfs_diff_bytes, 1 << 20);
}

#[test]
fn volume_store_cap_reads_sizes_and_refuses_zero() {
    assert_eq!(Config::default().restore.max_volume_bytes, 256 << 30);
    let c = Config::from_toml_str("[restore]\nmax_volume_bytes = \"3GiB\"\n").unwrap();
    assert_eq!(c.restore.max_volume_bytes, 3 << 30);
    let e = Config::from_toml_str("[restore]\nmax_volume_bytes = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("restore.max_volume_bytes"), "{e}");
}

#[test]
fn storage_directory_is_not_a_setting() {
    // The posix engine's extents always live in the checkpoint directory; a key that looked
    // like it moved them elsewhere would be a setting that does nothing.
    let e = Config::from_toml_str("[storage]\ndirectory = \"/var/lib/gpusnap\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown setting `storage.directory`"), "{e}");
}

#[test]
fn rootfs_diff_entry_cap_reads_counts_and_refuses_zero() {
    assert_eq!(Config::default().restore.max_rootfs_diff_entries, 100_000);
    let c = Config::from_toml_str("[restore]\nmax_rootfs_diff_entries = 250000\n").unwrap();
    assert_eq!(c.restore.max_rootfs_diff_entries, 250_000);
    let e = Config::from_toml_str("[restore]\nmax_rootfs_diff_entries = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("restore.max_rootfs_diff_entries"), "{e}");
}
