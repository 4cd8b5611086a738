//! `gpusnap doctor` on this machine (real runc, CRIU, containerd) and against the fake CUDA
//! driver.

use std::fs;
use std::path::{Path, PathBuf};

use gpusnap_fake_libcuda::{FakeCuda, FakeDevice};
use gpusnap_testkit::containerd::{start_with_config, Containerd};
use gpusnap_testkit::{describe, gpusnap, require_root, rig_bin_dir, text};

/// A private containerd 2.x with its CRI plugin, in `dir`, with the `gpusnap` runtime handler
/// registered or not; its socket is `dir/containerd.sock`.
fn containerd(dir: &Path, with_gpusnap: bool) -> Containerd {
    let q = |p: &Path| format!("{:?}", p.display().to_string());
    let mut c = format!(
        "version = 3\nroot = {}\nstate = {}\n\n[grpc]\n  address = {}\n\n[ttrpc]\n  address = {}\n\n\
         [plugins.'io.containerd.internal.v1.opt']\n  path = {}\n\n\
         [plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = true\n\n\
         [plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = [{}]\n  conf_dir = {}\n\n\
         [plugins.'io.containerd.grpc.v1.cri']\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n\n\
         [plugins.'io.containerd.nri.v1.nri']\n  disable = true\n",
        q(&dir.join("root")),
        q(&dir.join("state")),
        q(&dir.join("containerd.sock")),
        q(&dir.join("containerd.sock.ttrpc")),
        q(&dir.join("opt")),
        q(&dir.join("cni/bin")),
        q(&dir.join("cni/net.d")),
    );
    if with_gpusnap {
        c.push_str(
            "\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap]\n  \
             runtime_type = \"io.containerd.gpusnap.v2\"\n",
        );
    }
    fs::create_dir_all(dir).unwrap();
    let config = dir.join("config.toml");
    fs::write(&config, c).unwrap();
    start_with_config(&config, &dir.join("containerd.sock"), &dir.join("log"))
        .unwrap_or_else(|e| panic!("{e:#}"))
}

fn doctor_json(config: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec![
        "--config".to_owned(),
        config.display().to_string(),
        "doctor".into(),
        "--json".into(),
        "--containerd-bin".into(),
        rig_bin_dir().join("containerd").display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = gpusnap(&args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json is not JSON ({e}): {}", describe(&out)));
    (out.status.code().unwrap_or(-1), v)
}

fn check<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {v:#}"))
}

/// The node's cgroup layout, found independently of gpusnap's mountinfo parser.
fn expected_cgroup_status() -> &'static str {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "ok"
    } else {
        "warn"
    }
}

/// The node's THP mode, read here without gpusnap's parser: the bracketed word.
fn node_thp_mode() -> Option<String> {
    let text = fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let word = text.split_whitespace().find(|w| w.starts_with('['))?;
    Some(word.trim_matches(['[', ']']).to_owned())
}

/// The fake driver (the double, loaded through the real `dlopen` path) in `dir`, showing one
/// H200 per UUID; the fake and its library path.
fn fake_h200s(dir: &Path, uuids: &[&str]) -> (FakeCuda, PathBuf) {
    let fake = FakeCuda::create(dir.join("cuda")).unwrap();
    let devices: Vec<FakeDevice> = uuids
        .iter()
        .map(|uuid| FakeDevice::new(uuid, "NVIDIA H200", 141 << 30))
        .collect();
    fake.set_devices(&devices).unwrap();
    let lib = fake.library_path();
    (fake, lib)
}

#[test]
fn doctor_on_this_node_without_a_driver() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(
        &config,
        format!("[criu]\nbinary_dir = \"{}\"\n", rig_bin_dir().display()),
    )
    .unwrap();
    let missing = dir.path().join("no-driver/libcuda.so.1");
    let ctrd = containerd(&dir.path().join("containerd"), true);
    let (code, v) = doctor_json(
        &config,
        &[
            "--cuda-library",
            missing.to_str().unwrap(),
            "--containerd-socket",
            ctrd.address().to_str().unwrap(),
        ],
    );

    let driver = check(&v, "nvidia driver");
    assert_eq!(driver["status"], "warn", "{v:#}");
    let summary = driver["summary"].as_str().unwrap();
    assert!(summary.contains("no NVIDIA driver found"), "{summary}");
    assert!(
        summary.contains("CPU checkpoint/restore still works"),
        "{summary}"
    );
    assert_eq!(check(&v, "gpus")["status"], "warn");

    let criu = check(&v, "criu");
    assert_eq!(criu["status"], "ok", "{v:#}");
    assert!(
        criu["summary"]
            .as_str()
            .unwrap()
            .starts_with("4.2.1 at /opt/gpusnap-rig/bin/criu"),
        "{criu}"
    );
    assert_eq!(check(&v, "criu check")["status"], "ok", "{v:#}");
    assert_eq!(check(&v, "runc")["status"], "ok", "{v:#}");
    let containerd = check(&v, "containerd");
    assert_eq!(containerd["status"], "ok", "{v:#}");
    let summary = containerd["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("containerd 2.") && summary.contains("has the `gpusnap` handler"),
        "{containerd}"
    );
    assert_eq!(
        check(&v, "cgroups")["status"],
        expected_cgroup_status(),
        "{v:#}"
    );
    assert_eq!(check(&v, "config")["status"], "ok");
    // Without a driver there is no device memory to restore: THP is reported, not warned on.
    let thp = check(&v, "huge pages");
    assert_eq!(thp["status"], "ok", "{thp}");
    let summary = thp["summary"].as_str().unwrap();
    assert!(summary.contains("no NVIDIA driver"), "{summary}");
    if let Some(mode) = node_thp_mode() {
        assert!(summary.contains(&mode), "{summary}");
    }

    // Exit code: 0 exactly when nothing failed.
    assert_eq!(v["summary"]["fail"], 0, "{v:#}");
    assert_eq!(code, 0);

    // The human form says the same, one line per check.
    let out = gpusnap([
        "--config",
        config.to_str().unwrap(),
        "doctor",
        "--cuda-library",
        missing.to_str().unwrap(),
    ]);
    let text = text(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("WARN  nvidia driver") && l.contains("no NVIDIA driver found")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("OK    criu ") && l.contains("4.2.1")),
        "{text}"
    );
}

#[test]
fn invalid_config_fails_and_names_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, "[cuda]\nmax_operation_seconds = 0\n").unwrap();
    let (code, v) = doctor_json(&config, &["--cuda-library", "/nonexistent/libcuda.so.1"]);
    let c = check(&v, "config");
    assert_eq!(c["status"], "fail");
    assert!(
        c["summary"]
            .as_str()
            .unwrap()
            .contains("cuda.max_operation_seconds"),
        "{c}"
    );
    assert_eq!(code, 1, "a FAIL must make doctor exit non-zero");

    fs::write(&config, "[storage]\nengnie = \"posix\"\n").unwrap();
    let (code, v) = doctor_json(&config, &["--cuda-library", "/nonexistent/libcuda.so.1"]);
    let summary = check(&v, "config")["summary"].as_str().unwrap().to_owned();
    assert!(
        summary.contains("storage.engnie") && summary.contains("storage.engine"),
        "{summary}"
    );
    assert_eq!(code, 1);
}

#[test]
fn fake_driver_lists_gpus_and_api_level() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, lib) = fake_h200s(
        dir.path(),
        &[
            "GPU-11111111-2222-3333-4444-555555555555",
            "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        ],
    );
    let config = dir.path().join("config.toml");
    let (_, v) = doctor_json(&config, &["--cuda-library", lib.to_str().unwrap()]);
    let driver = check(&v, "nvidia driver");
    assert_eq!(driver["status"], "ok", "{v:#}");
    assert!(
        driver["summary"].as_str().unwrap().starts_with("CUDA 13.0"),
        "{driver}"
    );
    let api = check(&v, "checkpoint api");
    assert_eq!(api["status"], "ok", "{v:#}");
    assert!(
        api["summary"]
            .as_str()
            .unwrap()
            .contains("driver-managed: available"),
        "{api}"
    );
    let gpus = check(&v, "gpus")["summary"].as_str().unwrap().to_owned();
    assert!(
        gpus.contains("0: NVIDIA H200 GPU-11111111-2222-3333-4444-555555555555")
            && gpus.contains("1: NVIDIA H200 GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"),
        "{gpus}"
    );

    // A driver without the checkpoint API cannot checkpoint GPUs: FAIL, exit 1.
    fake.hide_symbol("cuCheckpointProcessLock").unwrap();
    let (code, v) = doctor_json(&config, &["--cuda-library", lib.to_str().unwrap()]);
    let api = check(&v, "checkpoint api");
    assert_eq!(api["status"], "fail", "{v:#}");
    assert!(
        api["action"]
            .as_str()
            .unwrap()
            .contains("cuCheckpointProcessLock"),
        "{api}"
    );
    assert_eq!(code, 1);
}

#[test]
fn huge_pages_warned_on_where_a_gpu_restores_through_criu() {
    let dir = tempfile::tempdir().unwrap();
    let (_fake, lib) = fake_h200s(dir.path(), &["GPU-11111111-2222-3333-4444-555555555555"]);
    let config = dir.path().join("config.toml");

    // The default engine stages device memory in the process, so the mode decides the page
    // size CRIU restores it in: a warning with what to do unless the node runs `always`.
    let (_, v) = doctor_json(&config, &["--cuda-library", lib.to_str().unwrap()]);
    let thp = check(&v, "huge pages");
    match node_thp_mode().as_deref() {
        Some("always") => assert_eq!(thp["status"], "ok", "{thp}"),
        Some(mode) => {
            assert_eq!(thp["status"], "warn", "{thp}");
            assert!(thp["summary"].as_str().unwrap().contains(mode), "{thp}");
            assert!(
                thp["action"]
                    .as_str()
                    .unwrap()
                    .contains("/sys/kernel/mm/transparent_hugepage/enabled"),
                "{thp}"
            );
        }
        None => assert_eq!(thp["status"], "warn", "{thp}"),
    }

    // The posix engine keeps device memory out of CRIU's pages: the mode no longer matters.
    fs::write(&config, "[storage]\nengine = \"posix\"\n").unwrap();
    let (_, v) = doctor_json(&config, &["--cuda-library", lib.to_str().unwrap()]);
    let thp = check(&v, "huge pages");
    assert_eq!(thp["status"], "ok", "{thp}");
    assert!(thp["summary"].as_str().unwrap().contains("posix"), "{thp}");
}

/// doctor asks containerd itself: a containerd that does not run, or runs without the handler,
/// fails the check (it said OK from the binary's version alone, with no containerd running).
#[test]
fn doctor_asks_the_running_containerd_for_the_handler() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, "").unwrap();
    let socket_arg = |p: &Path| vec!["--containerd-socket".to_owned(), p.display().to_string()];

    let absent = dir.path().join("nothing/containerd.sock");
    let args = socket_arg(&absent);
    let (code, v) = doctor_json(
        &config,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let c = check(&v, "containerd");
    assert_eq!(c["status"], "fail", "{v:#}");
    assert!(
        c["summary"].as_str().unwrap().contains("not running"),
        "{c}"
    );
    assert_eq!(code, 1);

    let without = containerd(&dir.path().join("without"), false);
    let args = socket_arg(without.address());
    let (_, v) = doctor_json(
        &config,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let c = check(&v, "containerd");
    assert_eq!(c["status"], "fail", "{v:#}");
    let summary = c["summary"].as_str().unwrap();
    assert!(
        summary.contains("without the `gpusnap` runtime handler"),
        "{c}"
    );
    assert!(summary.contains("runc"), "lists what it has: {c}");
    assert!(
        c["action"].as_str().unwrap().contains("gpusnap install"),
        "{c}"
    );
    drop(without);

    let with = containerd(&dir.path().join("with"), true);
    let args = socket_arg(with.address());
    let (_, v) = doctor_json(
        &config,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_eq!(check(&v, "containerd")["status"], "ok", "{v:#}");
}
