//! `gpusnap doctor`: one line per fact about this node that decides whether checkpoint/restore
//! works, each OK, WARN (works with a limitation) or FAIL (will not work), with what to do.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpusnap_config::Config;
use gpusnap_criu_bridge::{self as bridge, MIN_CRIU_CPU, MIN_CRIU_GPU};
use gpusnap_cuda::engines::engine_by_name;
use gpusnap_cuda::{Driver, DriverConfig, LoadError};
use serde::Serialize;

use crate::host::{self, CgroupLayout, Release, ThpMode};
use crate::term;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

impl Check {
    fn new(name: &'static str, status: Status, summary: impl Into<String>) -> Self {
        Check {
            name,
            status,
            summary: summary.into(),
            action: None,
        }
    }

    fn action(mut self, action: impl Into<String>) -> Self {
        self.action = Some(action.into());
        self
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// The process exit code: non-zero exactly when a check failed.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.worst() == Status::Fail)
    }

    pub fn render(&self, width: usize) -> String {
        let name_w = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        let indent = 6 + name_w + 2;
        for c in &self.checks {
            let prefix = format!("{:<4}  {:<name_w$}  ", c.status.label(), c.name);
            out.push_str(&term::wrap(&prefix, &c.summary, width, indent));
            if let Some(a) = &c.action {
                let prefix = format!("{}→ ", " ".repeat(indent));
                out.push_str(&term::wrap(&prefix, a, width, indent + 2));
            }
        }
        out.push_str(&format!(
            "\n{} OK, {} WARN, {} FAIL\n",
            self.count(Status::Ok),
            self.count(Status::Warn),
            self.count(Status::Fail)
        ));
        out
    }
}

#[derive(Debug, Clone)]
pub struct DoctorOptions {
    pub config_path: PathBuf,
    /// Overrides `cuda.library` from the config.
    pub cuda_library: Option<PathBuf>,
    /// containerd binary (its presence says whether this is a containerd node).
    pub containerd_bin: PathBuf,
    /// containerd's socket, asked whether it runs and has the handler.
    pub containerd_socket: PathBuf,
}

pub fn run(opts: &DoctorOptions) -> Report {
    let mut checks = Vec::new();
    let (config, config_check) = config_check(&opts.config_path);
    checks.push(kernel_check());
    checks.push(cgroup_check(host::cgroup_layout()));
    checks.push(runc_check(&config));
    checks.push(containerd_check(
        &opts.containerd_bin,
        &opts.containerd_socket,
    ));
    let search = criu_search_path(&config);
    let criu = bridge::probe_criu(&search);
    checks.push(criu_version_check(&criu));
    checks.push(criu_check_check(&criu));
    checks.push(criu_plugins_check(
        std::env::var_os("CRIU_LIBS_DIR").as_deref(),
        Path::new(bridge::plugins::RUNC_CRIU_CONFIG),
    ));
    checks.push(criu_config_check(
        Path::new(bridge::plugins::RUNC_CRIU_CONFIG),
        &bridge::plugins::default_config_files(
            std::env::var_os("HOME").as_deref(),
            std::env::var_os("CRIU_CONFIG_FILE").as_deref(),
        ),
    ));
    let library = opts
        .cuda_library
        .clone()
        .unwrap_or_else(|| PathBuf::from(&config.cuda.library));
    let driver = Driver::load(&DriverConfig::with_library(&library));
    checks.extend(gpu_checks(&driver, &config));
    // An engine this build lacks is reported by the checks above; count it as staging.
    let staged = engine_by_name(config.storage.engine.as_str(), &config.storage)
        .and_then(Result::ok)
        .is_none_or(|engine| !engine.keeps_memory_in_files());
    checks.push(thp_check(
        host::thp_mode(),
        config.storage.engine.as_str(),
        staged,
        driver.is_ok(),
    ));
    checks.push(binaries_check());
    checks.push(config_check);
    Report { checks }
}

/// The config (defaults when invalid, so the other checks still run) and its check.
fn config_check(path: &Path) -> (Config, Check) {
    match Config::load(path) {
        Ok(c) if path.exists() => (
            c,
            Check::new("config", Status::Ok, format!("{} is valid", path.display())),
        ),
        Ok(c) => (
            c,
            Check::new(
                "config",
                Status::Ok,
                format!("{} absent: built-in defaults apply", path.display()),
            ),
        ),
        Err(e) => (
            Config::default(),
            Check::new("config", Status::Fail, e.to_string()).action(format!(
                "fix {} (the message names the setting)",
                path.display()
            )),
        ),
    }
}

fn kernel_check() -> Check {
    match bridge::kernel_release() {
        Ok(k) => {
            let major = Release::parse(&k).map(|r| r.major).unwrap_or(0);
            let c = Check::new(
                "kernel",
                if major >= 5 { Status::Ok } else { Status::Warn },
                format!("{k} ({})", bridge::host_arch()),
            );
            if major >= 5 {
                c
            } else {
                c.action("CRIU and the CUDA checkpoint API are tested on kernel 5.x and newer")
            }
        }
        Err(e) => Check::new("kernel", Status::Warn, format!("release unreadable: {e}")),
    }
}

fn cgroup_check(layout: CgroupLayout) -> Check {
    match layout {
        CgroupLayout::Unified => Check::new("cgroups", Status::Ok, layout.to_string()),
        CgroupLayout::Hybrid | CgroupLayout::Legacy => {
            Check::new("cgroups", Status::Warn, layout.to_string()).action(
                "checkpoint/restore works on cgroup v1, but Kubernetes ≥ 1.31 keeps v1 in \
                 maintenance only; boot with systemd.unified_cgroup_hierarchy=1 for v2",
            )
        }
        CgroupLayout::Unknown => Check::new("cgroups", Status::Fail, layout.to_string())
            .action("mount cgroup2 at /sys/fs/cgroup; runc cannot run containers without cgroups"),
    }
}

/// The page size restored memory is faulted in. CRIU writes a task's memory back before it
/// reapplies the task's `MADV_HUGEPAGE` (criu/pie/restorer.c), so unless the node's mode is
/// `always`, the copy of device memory that the driver-managed engine stages in the process
/// comes back 4 KiB at a time. Only a warning: `always` changes every workload on the node,
/// which is the operator's call, and only where there is a GPU to restore. `staged`: the
/// node's engine leaves device memory inside the process rather than in its own files.
fn thp_check(mode: Option<ThpMode>, engine: &str, staged: bool, gpu_driver: bool) -> Check {
    const NAME: &str = "huge pages";
    let shown = mode.map_or_else(|| "not available".to_owned(), |m| m.to_string());
    if !gpu_driver && mode != Some(ThpMode::Always) {
        return Check::new(
            NAME,
            Status::Ok,
            format!(
                "transparent huge pages: {shown}; it matters for restoring device memory, and \
                 there is no NVIDIA driver here"
            ),
        );
    }
    match mode {
        Some(ThpMode::Always) => Check::new(
            NAME,
            Status::Ok,
            "transparent huge pages: always; CRIU restores memory in 2 MiB pages",
        ),
        Some(mode) if staged => Check::new(
            NAME,
            Status::Warn,
            format!(
                "transparent huge pages: {mode}; CRIU restores memory before it reapplies \
                 MADV_HUGEPAGE, so the device memory storage.engine = \"{engine}\" stages in \
                 the process comes back 4 KiB at a time"
            ),
        )
        .action(
            "GPU restores are faster under `always` (8 GiB on an H200: CRIU 5.2-5.9 s -> \
             3.1-3.5 s, CUDA 1.6-2.0 s -> 1.2-1.3 s); if the node's other workloads allow it, \
             write `always` to /sys/kernel/mm/transparent_hugepage/enabled or boot with \
             transparent_hugepage=always (docs/gpu.md, \"Transparent huge pages\")",
        ),
        Some(mode) => Check::new(
            NAME,
            Status::Ok,
            format!(
                "transparent huge pages: {mode}; storage.engine = \"{engine}\" keeps device \
                 memory out of CRIU's pages"
            ),
        ),
        None if staged => Check::new(
            NAME,
            Status::Warn,
            format!(
                "transparent huge pages: {} is absent or unreadable; restored memory is \
                 faulted 4 KiB at a time",
                host::THP_ENABLED
            ),
        )
        .action(
            "use a kernel built with CONFIG_TRANSPARENT_HUGEPAGE and set its mode to `always` \
             (docs/gpu.md, \"Transparent huge pages\")",
        ),
        None => Check::new(
            NAME,
            Status::Ok,
            format!(
                "transparent huge pages: not available; storage.engine = \"{engine}\" keeps \
                 device memory out of CRIU's pages"
            ),
        ),
    }
}

fn runc_check(config: &Config) -> Check {
    let name = config.runc.binary.to_string_lossy().into_owned();
    let Some(path) = crate::fsutil::which(&name) else {
        return Check::new("runc", Status::Fail, format!("`{name}` not found on PATH"))
            .action("install runc (apt install runc) or set runc.binary in the gpusnap config");
    };
    match bridge::runc_version(&path) {
        Ok(v) => Check::new(
            "runc",
            Status::Ok,
            format!("{} at {}", v.version, path.display()),
        ),
        Err(e) => Check::new("runc", Status::Fail, e.to_string())
            .action("runc.binary must name a working runc"),
    }
}

/// containerd as it runs: it must answer on its socket and list the `gpusnap` handler (what
/// containerd loaded, not what a file on disk says). No containerd binary and no socket: a
/// CRI-O or Podman node, a warning only.
fn containerd_check(bin: &Path, socket: &Path) -> Check {
    const NAME: &str = "containerd";
    let binary = crate::fsutil::which(&bin.to_string_lossy());
    let facts = match crate::cri::query(socket, std::time::Duration::from_secs(10)) {
        Ok(f) => f,
        Err(crate::cri::CriError::NoSocket(_)) if binary.is_none() => {
            return Check::new(
                NAME,
                Status::Warn,
                format!("not found: no binary on PATH, no socket at {}", socket.display()),
            )
            .action(
                "nothing to do on CRI-O or Podman nodes; on containerd nodes give                  --containerd-socket (k3s and RKE2: /run/k3s/containerd/containerd.sock)",
            );
        }
        Err(e) => {
            return Check::new(NAME, Status::Fail, format!("not running: {e}")).action(format!(
                "start containerd (systemctl start containerd), or give its socket with                  --containerd-socket (k3s and RKE2: /run/k3s/containerd/containerd.sock){}",
                binary
                    .as_ref()
                    .map(|b| format!("; {} is installed", b.display()))
                    .unwrap_or_default()
            ));
        }
    };
    let release = Release::parse(&facts.runtime_version);
    let version = format!("{} {}", facts.runtime_name, facts.runtime_version);
    if !facts.handlers.iter().any(|h| h == crate::HANDLER) {
        return Check::new(
            NAME,
            Status::Fail,
            format!(
                "{version} answers on {} without the `{}` runtime handler (it has: {})",
                socket.display(),
                crate::HANDLER,
                facts.handlers.join(", ")
            ),
        )
        .action(
            "run `gpusnap install`, then restart containerd so that it loads the handler              (install prints the command)",
        );
    }
    match release {
        Some(r) if r.major < 2 => Check::new(
            NAME,
            Status::Warn,
            format!(
                "{version} on {} has the `{}` handler; no CRI CheckpointContainer before 2.0",
                socket.display(),
                crate::HANDLER
            ),
        )
        .action("upgrade to containerd 2.x for kubelet checkpoints; `ctr` checkpoints still work"),
        _ => Check::new(
            NAME,
            Status::Ok,
            format!(
                "{version} on {} has the `{}` handler (CRI checkpoint supported)",
                socket.display(),
                crate::HANDLER
            ),
        ),
    }
}

/// runc runs `criu` from its PATH; probe the same one the wrapper and shim will use.
fn criu_search_path(config: &Config) -> OsString {
    bridge::RuncGlobal {
        criu_dir: config.criu.binary_dir.clone(),
        ..Default::default()
    }
    .effective_search_path()
}

fn criu_version_check(criu: &Result<bridge::CriuInfo, bridge::ProbeError>) -> Check {
    match criu {
        Ok(info) if info.version >= MIN_CRIU_GPU => Check::new(
            "criu",
            Status::Ok,
            format!("{} at {}", info.version, info.path.display()),
        ),
        Ok(info) if info.version >= MIN_CRIU_CPU => Check::new(
            "criu",
            Status::Warn,
            format!(
                "{} at {}: enough for CPU containers, GPU containers need ≥ {MIN_CRIU_GPU}",
                info.version,
                info.path.display()
            ),
        )
        .action("install CRIU ≥ 4.1 or point criu.binary_dir at one"),
        Ok(info) => Check::new(
            "criu",
            Status::Fail,
            format!(
                "{} at {} is older than {MIN_CRIU_CPU}",
                info.version,
                info.path.display()
            ),
        )
        .action("install CRIU ≥ 4.1 or point criu.binary_dir at one"),
        Err(e) => Check::new("criu", Status::Fail, e.to_string()),
    }
}

/// CRIU's own cuda plugin: where CRIU would load plugins from, whether the cuda plugin is
/// there, and whether gpusnap can keep it out of its CRIU runs (a `libdir` in runc's CRIU config
/// file outranks the plugin directory gpusnap gives CRIU).
fn criu_plugins_check(criu_libs_dir: Option<&std::ffi::OsStr>, runc_conf: &Path) -> Check {
    use bridge::plugins;
    let dir = plugins::plugin_dir_for(criu_libs_dir);
    let found = plugins::excluded_in(&dir);
    if let Some(c) = plugins::runc_config_libdir(None, runc_conf) {
        return Check::new(
            "criu plugins",
            Status::Fail,
            format!(
                "{} sets `libdir {}`, which holds CRIU's cuda plugin: it would run in every CRIU \
                 run runc starts, and gpusnap refuses GPU checkpoints and restores",
                c.file.display(),
                c.libdir.display()
            ),
        )
        .action(format!(
            "remove the libdir line from {} (gpusnap performs the CUDA checkpoint itself)",
            c.file.display()
        ));
    }
    let summary = if found.is_empty() {
        format!("no cuda plugin in {}", dir.display())
    } else {
        format!(
            "CRIU's cuda plugin found ({}); gpusnap runs CRIU without it (private plugin \
             directory through CRIU_LIBS_DIR and CRIU_CONFIG_FILE), other plugins are kept",
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Check::new("criu plugins", Status::Ok, summary)
}

/// CRIU's config files (runc's, which CRIU applies over runc's request, and CRIU's default
/// ones) held to the allowlist every dump and restore is held to, so that a line gpusnap
/// refuses is reported here rather than by the first failed checkpoint or restore.
fn criu_config_check(runc_conf: &Path, defaults: &[PathBuf]) -> Check {
    use bridge::criu_config;
    let checked = criu_config::check_runc_config(None, runc_conf)
        .and_then(|runc| criu_config::check_default_configs(defaults).map(|()| runc));
    match checked {
        Ok(runc) => Check::new(
            "criu config",
            Status::Ok,
            format!("runc's CRIU config file {runc} and CRIU's default files set only what gpusnap allows"),
        ),
        Err(e) => Check::new(
            "criu config",
            Status::Fail,
            format!("{e}: gpusnap refuses every checkpoint and restore while it is there"),
        )
        .action(format!(
            "remove that setting from {} (docs/security.md, \"CRIU's configuration files\", lists what is allowed)",
            e.file().display()
        )),
    }
}

fn criu_check_check(criu: &Result<bridge::CriuInfo, bridge::ProbeError>) -> Check {
    let Ok(info) = criu else {
        return Check::new("criu check", Status::Fail, "not run: no usable CRIU");
    };
    match bridge::criu_check(info) {
        Ok(c) if c.passed => {
            let first = c
                .output
                .lines()
                .last()
                .unwrap_or("passed")
                .trim()
                .to_owned();
            Check::new("criu check", Status::Ok, first)
        }
        Ok(c) => {
            let errors: Vec<&str> = c
                .output
                .lines()
                .filter(|l| l.starts_with("Error") || l.starts_with("Warn"))
                .take(2)
                .collect();
            Check::new(
                "criu check",
                Status::Warn,
                format!("kernel features missing: {}", errors.join("; ")),
            )
            .action(format!(
                "run `{} check` as root; containers that need these features cannot be dumped",
                info.path.display()
            ))
        }
        Err(e) => Check::new("criu check", Status::Warn, format!("could not run: {e}"))
            .action("run doctor as root"),
    }
}

fn gpu_checks(driver: &Result<Driver, LoadError>, config: &Config) -> Vec<Check> {
    let driver = match driver {
        Ok(d) => d,
        Err(e) => {
            let summary = match e {
                LoadError::Library { path, .. } => format!(
                    "no NVIDIA driver found ({} cannot be loaded): GPU checkpoint is unavailable; \
                     CPU checkpoint/restore still works",
                    path.display()
                ),
                other => format!(
                    "NVIDIA driver unusable: {other}; GPU checkpoint is unavailable, CPU \
                     checkpoint/restore still works"
                ),
            };
            return vec![
                Check::new("nvidia driver", Status::Warn, summary).action(
                    "nothing to do on CPU-only nodes; on GPU nodes install driver r570+ (or set \
                     cuda.library)",
                ),
                Check::new(
                    "checkpoint api",
                    Status::Warn,
                    "not checked: no NVIDIA driver",
                ),
                Check::new("gpus", Status::Warn, "none visible: no NVIDIA driver"),
            ];
        }
    };
    let caps = driver.capabilities();
    let mut out = vec![Check::new(
        "nvidia driver",
        Status::Ok,
        format!("{} at {}", caps.driver_version, caps.library_path.display()),
    )];
    let posix = if caps.custom_storage {
        "available"
    } else {
        "not available (needs CUDA 13.4)"
    };
    let summary = format!(
        "driver-managed: {}; posix (CustomStorage): {posix}; GPU remap on restore: {}",
        if caps.checkpoint_api {
            "available"
        } else {
            "not available"
        },
        if caps.gpu_remap { "yes" } else { "no" }
    );
    let api = if !caps.checkpoint_api {
        Check::new("checkpoint api", Status::Fail, summary).action(format!(
            "upgrade the NVIDIA driver to r570 (CUDA 12.8) or newer; missing: {}",
            caps.missing_symbols.join(", ")
        ))
    } else if let Some(Err(e)) = engine_by_name(config.storage.engine.as_str(), &config.storage)
        .map(|engine| engine.and_then(|engine| engine.admit(caps)))
    {
        Check::new("checkpoint api", Status::Fail, summary).action(format!(
            "storage.engine = \"{}\" cannot run here: {e}",
            config.storage.engine
        ))
    } else {
        Check::new("checkpoint api", Status::Ok, summary)
    };
    out.push(api);
    if caps.devices.is_empty() {
        out.push(Check::new(
            "gpus",
            Status::Warn,
            "driver loaded but no GPU visible",
        ));
    } else {
        let list: Vec<String> = caps
            .devices
            .iter()
            .map(|d| {
                format!(
                    "{}: {} {} ({} GiB)",
                    d.index,
                    d.name,
                    d.uuid,
                    d.total_memory_bytes >> 30
                )
            })
            .collect();
        out.push(Check::new("gpus", Status::Ok, list.join("; ")));
    }
    out
}

fn binaries_check() -> Check {
    let shim = crate::fsutil::which(crate::SHIM_BINARY);
    let wrapper = crate::fsutil::which(crate::RUNC_WRAPPER_BINARY);
    let show = |p: &Option<PathBuf>, name: &str| {
        p.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| format!("{name} not on PATH"))
    };
    let summary = format!(
        "{}; {}",
        show(&shim, crate::SHIM_BINARY),
        show(&wrapper, crate::RUNC_WRAPPER_BINARY)
    );
    if shim.is_some() {
        Check::new("binaries", Status::Ok, summary)
    } else {
        Check::new("binaries", Status::Warn, summary).action(format!(
            "containerd finds {} on its PATH when restoring through CRI; install it in \
             /usr/local/bin or /usr/bin",
            crate::SHIM_BINARY
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_follows_the_worst_check() {
        let mut r = Report {
            checks: vec![
                Check::new("a", Status::Ok, "x"),
                Check::new("b", Status::Warn, "y"),
            ],
        };
        assert_eq!(r.exit_code(), 0);
        r.checks
            .push(Check::new("c", Status::Fail, "z").action("fix it"));
        assert_eq!(r.exit_code(), 1);
        let text = r.render(80);
        assert!(text.contains("FAIL  c  z\n"), "{text}");
        assert!(text.contains("→ fix it"), "{text}");
        assert!(text.ends_with("1 OK, 1 WARN, 1 FAIL\n"), "{text}");
    }

    #[test]
    fn invalid_config_fails_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        std::fs::write(&p, "[storage]\ntransfer_buffer_count = 99\n").unwrap();
        let (cfg, check) = config_check(&p);
        assert_eq!(check.status, Status::Fail);
        assert!(
            check.summary.contains("storage.transfer_buffer_count"),
            "{}",
            check.summary
        );
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn criu_plugins_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("absent.conf");
        let c = criu_plugins_check(Some(dir.path().as_os_str()), &none);
        assert_eq!(c.status, Status::Ok);
        assert!(c.summary.contains("no cuda plugin"), "{}", c.summary);
        std::fs::write(dir.path().join("cuda_plugin.so"), b"").unwrap();
        let c = criu_plugins_check(Some(dir.path().as_os_str()), &none);
        assert_eq!(c.status, Status::Ok);
        assert!(c.summary.contains("cuda_plugin.so"), "{}", c.summary);
        let conf = dir.path().join("runc.conf");
        std::fs::write(&conf, format!("libdir {}\n", dir.path().display())).unwrap();
        let c = criu_plugins_check(None, &conf);
        assert_eq!(c.status, Status::Fail);
        assert!(c.summary.contains("libdir"), "{}", c.summary);
    }

    #[test]
    fn criu_config_lines_gpusnap_refuses_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        // No file where runc looks, in a directory only root may write (as /etc/criu is):
        // CRIU reads nothing.
        let absent = Path::new("/etc/gpusnap-doctor-test-absent.conf");
        let c = criu_config_check(absent, &[]);
        assert_eq!(c.status, Status::Ok, "{}", c.summary);
        // A default file is read whoever owns it; an action script there runs as root.
        let default = dir.path().join("default.conf");
        std::fs::write(&default, "tcp-established\naction-script /bin/true\n").unwrap();
        let c = criu_config_check(absent, std::slice::from_ref(&default));
        assert_eq!(c.status, Status::Fail, "{}", c.summary);
        assert!(c.summary.contains("line 2"), "{}", c.summary);
        assert!(c.summary.contains("action-script"), "{}", c.summary);
        assert!(
            c.action.as_deref().unwrap().contains("default.conf"),
            "{c:?}"
        );
        // runc's file must be root's alone: one in a world-writable directory is refused.
        let runc = dir.path().join("runc.conf");
        std::fs::write(&runc, "tcp-established\n").unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let c = criu_config_check(&runc, &[]);
        assert_eq!(c.status, Status::Fail, "{}", c.summary);
        assert!(c.summary.contains("runc.conf"), "{}", c.summary);
    }

    #[test]
    fn thp_statuses_follow_the_engine() {
        let c = thp_check(Some(ThpMode::Always), "driver-managed", true, true);
        assert_eq!(c.status, Status::Ok);
        assert!(c.action.is_none());
        for mode in [Some(ThpMode::Madvise), Some(ThpMode::Never), None] {
            let c = thp_check(mode, "driver-managed", true, true);
            assert_eq!(c.status, Status::Warn, "{mode:?}");
            assert!(c.action.as_deref().unwrap().contains("always"), "{c:?}");
            let c = thp_check(mode, "posix", false, true);
            assert_eq!(c.status, Status::Ok, "{mode:?}");
            assert!(c.summary.contains("out of CRIU's pages"), "{}", c.summary);
            let c = thp_check(mode, "driver-managed", true, false);
            assert_eq!(c.status, Status::Ok, "{mode:?}");
            assert!(c.summary.contains("no NVIDIA driver"), "{}", c.summary);
        }
        let c = thp_check(Some(ThpMode::Madvise), "driver-managed", true, true);
        assert!(c.summary.contains("madvise"), "{}", c.summary);
    }

    #[test]
    fn cgroup_statuses() {
        assert_eq!(cgroup_check(CgroupLayout::Unified).status, Status::Ok);
        assert_eq!(cgroup_check(CgroupLayout::Hybrid).status, Status::Warn);
        assert_eq!(cgroup_check(CgroupLayout::Unknown).status, Status::Fail);
    }
}
