//! `gpusnap install` / `gpusnap uninstall`.
//!
//! Install computes a [`Plan`] (the full new content of every file it would touch), which
//! `--dry-run` prints as a diff and [`apply`] writes. Before writing anything, the original
//! content of each file is saved in the [`state`] file, so [`plan_uninstall`] can restore it
//! byte for byte. Files whose content already matches the plan are not touched, so a second
//! install changes nothing.

pub mod agent;
pub mod containerd;
pub mod crio;
pub mod criu_conf;
pub mod diff;
pub mod podman;
pub mod state;

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use gpusnap_config::{Config, ConfigError};

use crate::fsutil;
use crate::host::Release;
pub use containerd::{EditError, Registration};
pub use criu_conf::{Facts as CriuFacts, NetworkLock};
pub use state::{Component, InstallState, StateError, DEFAULT_STATE_FILE};

/// How the runtime is registered with containerd (see [`containerd`] for why).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ContainerdMode {
    /// Drop-in for containerd ≥ 2.0 or config version 3; the main file otherwise.
    Auto,
    /// A drop-in file plus an `imports` entry in the main file (containerd ≥ 2.0 only).
    DropIn,
    /// The runtime table is added to the main file.
    InPlace,
    /// `--containerd-config` is a k3s/RKE2 config template (`config.toml.tmpl`,
    /// `config-v3.toml.tmpl`), which k3s renders into config.toml at each start: the table
    /// is appended to the template. Chosen by `auto` for a file named `*.tmpl`.
    Template,
}

#[derive(Debug, Clone)]
pub struct ContainerdTarget {
    /// containerd's main config file.
    pub config: PathBuf,
    /// Where the drop-in goes in drop-in mode.
    pub dropin: PathBuf,
    pub mode: ContainerdMode,
    /// containerd's release, when known (`containerd --version`).
    pub release: Option<Release>,
}

#[derive(Debug, Clone)]
pub struct CriuTarget {
    pub config: PathBuf,
    pub lock: NetworkLock,
    pub facts: CriuFacts,
}

#[derive(Debug, Clone)]
pub struct InstallOptions {
    pub containerd: Option<ContainerdTarget>,
    /// Full path of the CRI-O drop-in file.
    pub crio_dropin: Option<PathBuf>,
    /// runc's state root for the CRI-O handler.
    pub crio_runtime_root: PathBuf,
    /// The containers.conf file (usually a drop-in) that registers gpusnap-runc with Podman.
    pub podman_conf: Option<PathBuf>,
    pub criu: Option<CriuTarget>,
    pub shim_path: PathBuf,
    pub runc_wrapper_path: PathBuf,
    /// The gpusnap config file the shim and wrapper read.
    pub config_path: PathBuf,
    /// Install this file's content as the gpusnap config (validated first).
    pub config_from: Option<PathBuf>,
    /// runc and CRIU as found on this node, written as absolute paths into a new gpusnap
    /// config: callers such as Podman run gpusnap-runc with no `PATH`.
    pub found: FoundTools,
}

/// Absolute paths found on the node at install time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FoundTools {
    pub runc: Option<PathBuf>,
    /// The directory holding `criu`.
    pub criu_dir: Option<PathBuf>,
}

/// One file's change: its full content before and after (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    pub component: Component,
    pub before: Option<String>,
    pub after: Option<String>,
    /// Mode for a file that is (re)created; `None` keeps the existing file's mode.
    pub mode: Option<u32>,
    /// One line for the operator.
    pub summary: String,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// What was decided and why (printed with the result).
    pub notes: Vec<String>,
    /// Things that will not work until the operator acts.
    pub warnings: Vec<String>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Unified diff of every change.
    pub fn diff(&self) -> String {
        self.changes
            .iter()
            .map(|c| diff::unified(&c.path, c.before.as_deref(), c.after.as_deref()))
            .collect()
    }

    /// Components whose daemons must re-read their config.
    pub fn components(&self) -> BTreeSet<Component> {
        self.changes.iter().map(|c| c.component).collect()
    }

    fn push(&mut self, change: Change) {
        if change.before != change.after {
            self.changes.push(change);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Edit(#[from] EditError),
    #[error("gpusnap config {}: {error}", path.display())]
    Config {
        path: PathBuf,
        error: Box<ConfigError>,
    },
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{what} must be an absolute path, got {}", path.display())]
    NotAbsolute { what: &'static str, path: PathBuf },
    #[error("{0}")]
    Refused(String),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_path_buf();
    move |source| InstallError::Io {
        action,
        path,
        source,
    }
}

fn read(path: &Path) -> Result<Option<String>, InstallError> {
    fsutil::read_optional(path).map_err(io_err("reading", path))
}

fn absolute(what: &'static str, path: &Path) -> Result<(), InstallError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(InstallError::NotAbsolute {
            what,
            path: path.to_path_buf(),
        })
    }
}

/// The gpusnap config with every setting at its default, with what it does, so operators see
/// what they can change. Optional settings are shown commented out.
pub fn default_config_text() -> String {
    config_text(&FoundTools::default())
}

/// The gpusnap config written when none exists: [`default_config_text`] with runc and CRIU at
/// the absolute paths found on the node, so no caller's `PATH` decides which binaries run.
pub fn config_text(found: &FoundTools) -> String {
    let d = Config::default();
    let q = |s: &str| toml_edit::Value::from(s).to_string();
    format!(
        "# gpusnap configuration, written by `gpusnap install` (gpusnap {version}).\n\
         # Every setting is shown at its default. `gpusnap doctor` checks this file; the shim and\n\
         # gpusnap-runc read it for each container (pods may override storage and timeouts with\n\
         # gpusnap.io/ annotations).\n\
         \n\
         [storage]\n\
         # How GPU memory reaches the checkpoint: \"driver-managed\" (the driver copies it into\n\
         # the process, CRIU dumps it) or \"posix\" (gpusnap streams it to files; CUDA 13.4+).\n\
         engine = {engine}\n\
         # posix engine: pinned host buffers per GPU (1-8) and the size of each (1 MiB-256 MiB,\n\
         # a multiple of 4096; count x size at most 1 GiB per GPU).\n\
         transfer_buffer_count = {count}\n\
         transfer_chunk_bytes = {chunk}\n\
         \n\
         [cuda]\n\
         # Upper bound for one driver lock/checkpoint/restore call (1-3600).\n\
         max_operation_seconds = {max_op}\n\
         # How long to wait for in-flight CUDA work before locking; 0 waits forever.\n\
         lock_timeout_ms = {lock}\n\
         # Total time a restore (CRIU plus GPU) may take.\n\
         restore_budget_seconds = {budget}\n\
         # The CUDA driver library: a soname or an absolute path.\n\
         library = {library}\n\
         \n\
         [runc]\n\
         # The real runc (a name on PATH or an absolute path).\n\
         binary = {runc}\n\
         # runc's state root for containerd containers (the namespace is appended).\n\
         root = {root}\n\
         systemd_cgroup = {systemd}\n\
         \n\
         [criu]\n\
         # Directory holding the criu runc should run (prepended to runc's PATH).\n\
         {criu_dir}\n\
         # Raise the minimum CRIU version (default: 3.16 for CPU, 4.1 for GPU containers).\n\
         # min_version = \"4.1\"\n\
         \n\
         [restore]\n\
         # Node-local checkpoints a pod may restore from (gpusnap.io/restore-from names one).\n\
         checkpoint_root = {checkpoint_root}\n\
         # CRIU permissions every restore gets (tcp-established, ext-unix-sk, shell-job,\n\
         # file-locks). Never taken from the image.\n\
         criu_flags = []\n\
         # Checkpoints must carry a signature by one of signature_keys (their own\n\
         # gpusnap-manifest.json.sig, or a cosign image signature checked at pull) before they\n\
         # are pulled onto the node or restored through any door: off, warn, require.\n\
         signature_policy = \"off\"\n\
         signature_keys = []\n\
         # Private keys (PEM, root-owned, 0600) that open encrypted checkpoint images on\n\
         # `gpusnap image pull --extract`.\n\
         decryption_keys = []\n\
         # The largest a rootfs diff may be once decompressed (headers, padding, content).\n\
         max_rootfs_diff_bytes = \"64GiB\"\n\
         # The most entries (files, directories, links, whiteouts) a rootfs diff may hold.\n\
         max_rootfs_diff_entries = 100000\n\
         # The most the node's copies of image-volume checkpoints\n\
         # (checkpoint_root/.gpusnap-volumes) may hold together.\n\
         max_volume_bytes = \"256GiB\"\n\
         # How long CRIU may take to restore before it and what it restored are killed;\n\
         # 0 = 120 s plus 1 s per 32 MiB of images.\n\
         deadline_seconds = 0\n\
         # Private anonymous memory areas of at least this size (the device memory the\n\
         # driver-managed engine stages) are written in by gpusnap from every core while CRIU\n\
         # leaves the tasks stopped; with an image volume, page images of at least this size\n\
         # are read from its chunks instead of copied. 0 = CRIU writes every page and every\n\
         # file is copied. Not `gpusnap-runc restore`.\n\
         page_fill_min_bytes = \"16MiB\"\n\
         \n\
         [checkpoint]\n\
         # Sign every checkpoint this node takes (gpusnap-manifest.json.sig) with this private\n\
         # key: PKCS#8 PEM, ECDSA P-256, root-owned, mode 0600.\n\
         # signing_key = \"/etc/gpusnap/signing.key\"\n\
         # Where the node agent (`gpusnap agent run --checkpoint-dir`) may push the kubelet's\n\
         # checkpoint archives of pods annotated gpusnap.io/checkpoint-to: REGISTRY/REPOSITORY,\n\
         # REGISTRY/PATH/* or REGISTRY/*; http:// first for a plain-HTTP registry. Empty: nowhere.\n\
         allowed_destinations = []\n\
         # Its registry credentials (a docker config.json; default $DOCKER_CONFIG/config.json)\n\
         # and CAs trusted besides the system roots.\n\
         # registry_config = \"/etc/gpusnap/registry/config.json\"\n\
         registry_ca_files = []\n\
         # Tries of a push the registry did not answer (1-20), the first wait between two (1-600\n\
         # seconds), doubling each time.\n\
         push_attempts = {push_attempts}\n\
         push_retry_seconds = {push_retry}\n\
         \n\
         [store]\n\
         # The node's blob store, shared by every `gpusnap image pull` run as root (0700): a\n\
         # pull downloads only the blobs the node lacks.\n\
         root = {store_root}\n\
         # Garbage collection removes unreferenced blobs, least recently used first, down to this.\n\
         max_bytes = \"100GiB\"\n",
        version = crate::VERSION,
        engine = q(d.storage.engine.as_str()),
        count = d.storage.transfer_buffer_count,
        chunk = d.storage.transfer_chunk_bytes,
        max_op = d.cuda.max_operation_seconds,
        lock = d.cuda.lock_timeout_ms,
        budget = d.cuda.restore_budget_seconds,
        library = q(&d.cuda.library),
        runc = q(&found
            .runc
            .as_deref()
            .unwrap_or(&d.runc.binary)
            .to_string_lossy()),
        criu_dir = match &found.criu_dir {
            Some(dir) => format!("binary_dir = {}", q(&dir.to_string_lossy())),
            None => "# binary_dir = \"/usr/local/sbin\"".to_owned(),
        },
        root = q(&d.runc.root.to_string_lossy()),
        systemd = d.runc.systemd_cgroup,
        checkpoint_root = q(&d.restore.checkpoint_root.to_string_lossy()),
        store_root = q(&d.store.root.to_string_lossy()),
        push_attempts = d.checkpoint.push_attempts,
        push_retry = d.checkpoint.push_retry_seconds,
    )
}

/// Works out every file change; reads the node but writes nothing.
pub fn plan(opts: &InstallOptions) -> Result<Plan, InstallError> {
    absolute("--shim-path", &opts.shim_path)?;
    absolute("--config", &opts.config_path)?;
    let mut plan = Plan::default();
    plan_gpusnap_config(opts, &mut plan)?;
    if let Some(target) = &opts.containerd {
        plan_containerd(opts, target, &mut plan)?;
        if !fsutil::is_executable(&opts.shim_path) {
            plan.warnings.push(format!(
                "{} is not an executable file yet: containerd cannot start gpusnap pods until \
                 it is installed there",
                opts.shim_path.display()
            ));
        }
    }
    if let Some(dropin) = &opts.crio_dropin {
        absolute("--runc-wrapper-path", &opts.runc_wrapper_path)?;
        absolute("--crio-runtime-root", &opts.crio_runtime_root)?;
        let before = read(dropin)?;
        plan.push(Change {
            path: dropin.clone(),
            component: Component::Crio,
            after: Some(crio::dropin_text(&crio::Handler {
                name: crate::HANDLER,
                wrapper: &opts.runc_wrapper_path,
                config: &opts.config_path,
                runtime_root: &opts.crio_runtime_root,
            })),
            before,
            mode: Some(0o644),
            summary: format!(
                "CRI-O runtime handler `{}` → {}",
                crate::HANDLER,
                opts.runc_wrapper_path.display()
            ),
        });
        if !fsutil::is_executable(&opts.runc_wrapper_path) {
            plan.warnings.push(format!(
                "{} is not an executable file yet: CRI-O cannot start gpusnap pods until it is \
                 installed there",
                opts.runc_wrapper_path.display()
            ));
        }
    }
    if let Some(conf) = &opts.podman_conf {
        absolute("--runc-wrapper-path", &opts.runc_wrapper_path)?;
        absolute("--podman-conf", conf)?;
        let before = read(conf)?;
        let config_env = (opts.config_path != Path::new(gpusnap_config::DEFAULT_CONFIG_PATH))
            .then(|| format!("GPUSNAP_CONFIG={}", opts.config_path.display()));
        plan.push(Change {
            path: conf.clone(),
            component: Component::Podman,
            after: Some(podman::register(
                before.as_deref(),
                conf,
                crate::HANDLER,
                &opts.runc_wrapper_path,
                config_env.as_deref(),
            )?),
            before,
            mode: Some(0o644),
            summary: format!(
                "Podman runtime `{}` → {}",
                crate::HANDLER,
                opts.runc_wrapper_path.display()
            ),
        });
        if !fsutil::is_executable(&opts.runc_wrapper_path) {
            plan.warnings.push(format!(
                "{} is not an executable file yet: `podman run --runtime {}` fails until it is \
                 installed there",
                opts.runc_wrapper_path.display(),
                crate::HANDLER
            ));
        }
    }
    if let Some(criu) = &opts.criu {
        match criu_conf::decide(criu.lock, criu.facts) {
            Ok(None) => {}
            Ok(Some(lock)) => {
                let before = read(&criu.config)?;
                let after = criu_conf::with_network_lock(before.as_deref(), lock);
                plan.push(Change {
                    path: criu.config.clone(),
                    component: Component::Criu,
                    after: Some(after),
                    before,
                    mode: Some(0o644),
                    summary: format!("CRIU network lock via {lock}"),
                });
            }
            Err(warning) => plan.warnings.push(warning),
        }
    }
    Ok(plan)
}

fn plan_gpusnap_config(opts: &InstallOptions, plan: &mut Plan) -> Result<(), InstallError> {
    let before = read(&opts.config_path)?;
    let after = match &opts.config_from {
        Some(src) => {
            let text = read(src)?.ok_or_else(|| InstallError::Io {
                action: "reading",
                path: src.clone(),
                source: io::Error::from(io::ErrorKind::NotFound),
            })?;
            // Refuse before writing: a bad value would otherwise fail every pod on the node.
            Config::from_toml_str(&text).map_err(|error| InstallError::Config {
                path: src.clone(),
                error: Box::new(error),
            })?;
            text
        }
        None => match &before {
            Some(existing) => {
                Config::from_toml_str(existing).map_err(|error| InstallError::Config {
                    path: opts.config_path.clone(),
                    error: Box::new(error),
                })?;
                return Ok(());
            }
            None => config_text(&opts.found),
        },
    };
    plan.push(Change {
        path: opts.config_path.clone(),
        component: Component::Gpusnap,
        summary: match (&before, &opts.config_from) {
            (_, Some(src)) => format!("gpusnap config from {}", src.display()),
            (Some(_), None) => "gpusnap config replaced".to_owned(),
            (None, None) => "gpusnap config created with defaults".to_owned(),
        },
        after: Some(after),
        before,
        mode: Some(0o644),
    });
    Ok(())
}

/// Chooses drop-in or in-place.
pub fn resolve_mode(
    requested: ContainerdMode,
    version: i64,
    release: Option<Release>,
) -> Result<ContainerdMode, InstallError> {
    let v1_daemon = release.is_some_and(|r| r.major < 2);
    match requested {
        ContainerdMode::InPlace | ContainerdMode::Template => Ok(ContainerdMode::InPlace),
        ContainerdMode::DropIn if v1_daemon => Err(InstallError::Refused(format!(
            "containerd {} replaces a whole plugin section with an imported one, so a drop-in \
             would drop this node's CRI settings; use --containerd-mode in-place",
            release.map(|r| r.to_string()).unwrap_or_default()
        ))),
        ContainerdMode::DropIn if version < 2 => Err(InstallError::Refused(
            "a drop-in needs a main config of version 2 or 3 (containerd refuses a drop-in newer \
             than the main file); use --containerd-mode in-place or migrate the config with \
             `containerd config migrate`"
                .to_owned(),
        )),
        ContainerdMode::DropIn => Ok(ContainerdMode::DropIn),
        ContainerdMode::Auto => Ok(
            if version >= 3 || (version == 2 && release.is_some_and(|r| r.major >= 2)) {
                ContainerdMode::DropIn
            } else {
                ContainerdMode::InPlace
            },
        ),
    }
}

fn plan_containerd(
    opts: &InstallOptions,
    t: &ContainerdTarget,
    plan: &mut Plan,
) -> Result<(), InstallError> {
    absolute("--containerd-config", &t.config)?;
    let reg = Registration {
        handler: crate::HANDLER.to_owned(),
        runtime_type: crate::RUNTIME_TYPE.to_owned(),
        runtime_path: opts.shim_path.clone(),
        config_path: opts.config_path.clone(),
        pod_annotations: vec![crate::POD_ANNOTATIONS.to_owned()],
    };
    let before = read(&t.config)?;
    let is_template = t.mode == ContainerdMode::Template
        || (t.mode == ContainerdMode::Auto && t.config.extension().is_some_and(|e| e == "tmpl"));
    if is_template {
        let rendered = t.config.parent().map(|d| d.join("config.toml"));
        let rendered = match &rendered {
            Some(r) => read(r)?,
            None => None,
        };
        let version = containerd::template_version(&t.config, rendered.as_deref());
        plan.push(Change {
            path: t.config.clone(),
            component: Component::Containerd,
            after: Some(containerd::template_text(
                before.as_deref(),
                version,
                &reg,
                &t.config,
            )?),
            before,
            mode: Some(0o644),
            summary: format!(
                "containerd runtime `{}` (in the template {})",
                reg.handler,
                t.config.display()
            ),
        });
        plan.notes.push(format!(
            "config template {} (config version {version}): k3s and RKE2 render it into \
             config.toml when they start",
            t.config.display()
        ));
        return Ok(());
    }
    let version = match &before {
        Some(text) => containerd::config_version(&containerd::parse(text, &t.config)?),
        None if t.release.is_some_and(|r| r.major < 2) => 2,
        None => 3,
    };
    let mode = resolve_mode(t.mode, version, t.release)?;
    let daemon = t
        .release
        .map(|r| format!("containerd {r}"))
        .unwrap_or_else(|| "containerd (release unknown)".to_owned());
    // A new main file: containerd ≥ 2.2's built-in default imports conf.d/*.toml, and writing a
    // main file must not lose that for other drop-ins.
    let conf_d = t.config.parent().map(|d| d.join("conf.d"));
    let fresh_main = || {
        let mut s = format!(
            "# Created by `gpusnap install`; `gpusnap uninstall` removes it again.\nversion = {version}\n"
        );
        if mode == ContainerdMode::DropIn && t.dropin.parent() == conf_d.as_deref() {
            if let Some(d) = &conf_d {
                s.push_str(&format!(
                    "imports = [{}]\n",
                    toml_edit::Value::from(d.join("*.toml").to_string_lossy().as_ref())
                ));
            }
        }
        s
    };
    match mode {
        ContainerdMode::DropIn => {
            absolute("--containerd-dropin", &t.dropin)?;
            let dropin_before = read(&t.dropin)?;
            plan.push(Change {
                path: t.dropin.clone(),
                component: Component::Containerd,
                after: Some(containerd::dropin_text(version, &reg, &t.dropin)?),
                before: dropin_before,
                mode: Some(0o644),
                summary: format!("containerd runtime `{}` (drop-in)", reg.handler),
            });
            let main_text = before.clone().unwrap_or_else(fresh_main);
            plan.push(Change {
                path: t.config.clone(),
                component: Component::Containerd,
                after: Some(containerd::ensure_import(&main_text, &t.config, &t.dropin)?),
                before,
                mode: Some(0o644),
                summary: format!("containerd imports {}", t.dropin.display()),
            });
            plan.notes.push(format!(
                "{daemon}, config version {version}: registered through the drop-in {} \
                 (containerd ≥ 2.0 merges imported plugin settings key by key)",
                t.dropin.display()
            ));
        }
        ContainerdMode::InPlace | ContainerdMode::Auto | ContainerdMode::Template => {
            let main_text = before.clone().unwrap_or_else(fresh_main);
            plan.push(Change {
                path: t.config.clone(),
                component: Component::Containerd,
                after: Some(containerd::register_in_place(&main_text, &t.config, &reg)?),
                before,
                mode: Some(0o644),
                summary: format!(
                    "containerd runtime `{}` (in {})",
                    reg.handler,
                    t.config.display()
                ),
            });
            plan.notes.push(format!(
                "{daemon}, config version {version}: registered in {} itself (containerd 1.x \
                 would let a drop-in replace the whole CRI section)",
                t.config.display()
            ));
        }
    }
    Ok(())
}

/// What [`apply`] did.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub written: Vec<PathBuf>,
    pub components: BTreeSet<Component>,
}

/// Writes the plan, recording originals in `state_file` first. An empty plan writes nothing,
/// the state file included.
pub fn apply(plan: &Plan, state_file: &Path) -> Result<Applied, InstallError> {
    if plan.is_empty() {
        return Ok(Applied::default());
    }
    let mut state = InstallState::load(state_file)?.unwrap_or_default();
    state.gpusnap_version = crate::VERSION.to_owned();
    for c in &plan.changes {
        let after = c.after.as_deref().unwrap_or_default();
        let sha = fsutil::sha256_hex(after.as_bytes());
        match state.record_mut(&c.path) {
            // Keep the first original: that is what uninstall must return to.
            Some(rec) => rec.installed_sha256 = sha,
            None => state.files.push(state::FileRecord {
                path: c.path.clone(),
                component: c.component,
                original: c.before.clone(),
                original_mode: fsutil::mode_of(&c.path).map_err(io_err("reading", &c.path))?,
                installed_sha256: sha,
            }),
        }
    }
    // Directories are created before the state is saved so the state names them.
    for c in &plan.changes {
        if let Some(dir) = c.path.parent() {
            let made = fsutil::create_dirs(dir).map_err(io_err("creating", dir))?;
            state.created_dirs.extend(made);
        }
    }
    state.save(state_file)?;
    let mut applied = Applied::default();
    for c in &plan.changes {
        let after = c.after.as_deref().unwrap_or_default();
        let mode = match fsutil::mode_of(&c.path).map_err(io_err("reading", &c.path))? {
            Some(existing) => existing,
            None => c.mode.unwrap_or(0o644),
        };
        fsutil::write_atomically(&c.path, after.as_bytes(), mode)
            .map_err(io_err("writing", &c.path))?;
        tracing::info!(path = %c.path.display(), component = c.component.as_str(), "written");
        applied.written.push(c.path.clone());
        applied.components.insert(c.component);
    }
    Ok(applied)
}

/// What uninstall would do.
#[derive(Debug, Clone, Default)]
pub struct UninstallPlan {
    pub reverts: Vec<Change>,
    /// Files left as they are, with the reason.
    pub kept: Vec<(PathBuf, String)>,
    /// Files of components the caller keeps installed ([`UninstallPlan::keep_components`]):
    /// not reverted, and still recorded for a later uninstall.
    pub retained: Vec<PathBuf>,
    state: Option<InstallState>,
}

impl UninstallPlan {
    pub fn nothing_installed(&self) -> bool {
        self.state.is_none()
    }

    pub fn diff(&self) -> String {
        self.reverts
            .iter()
            .map(|c| diff::unified(&c.path, c.before.as_deref(), c.after.as_deref()))
            .collect()
    }

    pub fn components(&self) -> BTreeSet<Component> {
        self.reverts.iter().map(|c| c.component).collect()
    }

    /// Reverts nothing of `keep`: the installer pod's SIGTERM takes the runtime registration
    /// back and keeps the node's gpusnap config, which the next pod (an upgrade) installs
    /// again unchanged.
    pub fn keep_components(&mut self, keep: &[Component]) {
        let Some(state) = &self.state else { return };
        self.retained = state
            .files
            .iter()
            .filter(|f| keep.contains(&f.component))
            .map(|f| f.path.clone())
            .collect();
        self.reverts.retain(|c| !keep.contains(&c.component));
        self.kept.retain(|(p, _)| !self.retained.contains(p));
    }
}

/// Reads the state and decides, file by file, what to restore. A file changed since install is
/// kept (and named) unless `force`.
pub fn plan_uninstall(state_file: &Path, force: bool) -> Result<UninstallPlan, InstallError> {
    let Some(state) = InstallState::load(state_file)? else {
        return Ok(UninstallPlan::default());
    };
    let mut plan = UninstallPlan::default();
    for rec in state.files.iter().rev() {
        let current = read(&rec.path)?;
        let untouched = current
            .as_deref()
            .is_some_and(|c| fsutil::sha256_hex(c.as_bytes()) == rec.installed_sha256);
        if current == rec.original {
            continue;
        }
        if !untouched && !force {
            let why = if current.is_none() {
                "deleted since gpusnap installed it"
            } else {
                "changed since gpusnap installed it"
            };
            plan.kept.push((
                rec.path.clone(),
                format!("{why}; left as is (rerun with --force to restore the original anyway)"),
            ));
            continue;
        }
        plan.reverts.push(Change {
            path: rec.path.clone(),
            component: rec.component,
            summary: if rec.original.is_some() {
                "restored".to_owned()
            } else {
                "removed".to_owned()
            },
            before: current,
            after: rec.original.clone(),
            mode: rec.original_mode,
        });
    }
    plan.state = Some(state);
    Ok(plan)
}

/// Restores and removes files, removes directories install created (when empty), and deletes
/// the state file unless something had to be kept.
pub fn apply_uninstall(plan: &UninstallPlan, state_file: &Path) -> Result<(), InstallError> {
    let Some(state) = &plan.state else {
        return Ok(());
    };
    for c in &plan.reverts {
        match &c.after {
            Some(original) => {
                let mode = c.mode.unwrap_or(0o644);
                fsutil::write_atomically(&c.path, original.as_bytes(), mode)
                    .map_err(io_err("restoring", &c.path))?;
            }
            None => match fs::remove_file(&c.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_err("removing", &c.path)(e))
                }
                _ => {}
            },
        }
        tracing::info!(path = %c.path.display(), action = %c.summary, "uninstalled");
    }
    for dir in state.created_dirs.iter().rev() {
        // Only empty directories go: anything else in them is not ours to delete.
        let _ = fs::remove_dir(dir);
    }
    if !plan.retained.is_empty() {
        let mut left = state.clone();
        left.files.retain(|f| {
            plan.retained.contains(&f.path) || plan.kept.iter().any(|(p, _)| *p == f.path)
        });
        left.created_dirs.retain(|d| d.exists());
        left.save(state_file)?;
        return Ok(());
    }
    if plan.kept.is_empty() {
        match fs::remove_file(state_file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_err("removing", state_file)(e))
            }
            _ => {}
        }
    } else {
        let mut left = state.clone();
        left.files
            .retain(|f| plan.kept.iter().any(|(p, _)| *p == f.path));
        left.save(state_file)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(major: u32) -> Option<Release> {
        Some(Release {
            major,
            minor: 0,
            patch: 0,
        })
    }

    #[test]
    fn mode_resolution() {
        use ContainerdMode::*;
        assert_eq!(resolve_mode(Auto, 3, None).unwrap(), DropIn);
        assert_eq!(resolve_mode(Auto, 2, rel(2)).unwrap(), DropIn);
        assert_eq!(resolve_mode(Auto, 2, rel(1)).unwrap(), InPlace);
        assert_eq!(resolve_mode(Auto, 2, None).unwrap(), InPlace);
        assert_eq!(resolve_mode(Auto, 1, rel(2)).unwrap(), InPlace);
        assert!(resolve_mode(DropIn, 2, rel(1)).is_err());
        assert!(resolve_mode(DropIn, 1, None).is_err());
        assert_eq!(resolve_mode(InPlace, 3, rel(2)).unwrap(), InPlace);
    }

    /// Every setting the config crate serialises appears in `text` (so a new setting cannot be
    /// forgotten here).
    pub(crate) fn assert_every_default_key_shown(text: &str) {
        let defaults: toml_edit::DocumentMut = Config::default().to_toml_string().parse().unwrap();
        for (table, item) in defaults.iter() {
            let shown = format!("[{table}]");
            assert!(text.contains(&shown), "{shown} missing from\n{text}");
            for (key, _) in item.as_table().into_iter().flat_map(|t| t.iter()) {
                assert!(
                    text.contains(&format!("\n{key} = ")),
                    "{table}.{key} missing from\n{text}"
                );
            }
        }
    }

    #[test]
    fn installed_config_names_runc_and_criu_absolutely() {
        let found = FoundTools {
            runc: Some("/usr/sbin/runc".into()),
            criu_dir: Some("/usr/local/bin".into()),
        };
        let c = Config::from_toml_str(&config_text(&found)).unwrap();
        assert_eq!(c.runc.binary, Path::new("/usr/sbin/runc"));
        assert_eq!(
            c.criu.binary_dir.as_deref(),
            Some(Path::new("/usr/local/bin"))
        );
        assert_every_default_key_shown(&config_text(&found));
    }

    #[test]
    fn default_config_is_valid_and_complete() {
        let text = default_config_text();
        let parsed = Config::from_toml_str(&text).unwrap();
        assert_eq!(parsed, Config::default());
        assert_every_default_key_shown(&text);
        for key in [
            "[storage]",
            "[cuda]",
            "[runc]",
            "[criu]",
            "[restore]",
            "restore_budget_seconds",
            "# binary_dir = ",
            "# min_version = ",
        ] {
            assert!(text.contains(key), "{key} missing from\n{text}");
        }
        // The commented examples are valid values too.
        let uncommented = text
            .replace("# binary_dir = ", "binary_dir = ")
            .replace("# min_version = ", "min_version = ");
        let c = Config::from_toml_str(&uncommented).unwrap();
        assert_eq!(
            c.criu.min_version.map(|v| v.to_string()),
            Some("4.1.0".into())
        );
    }
}
