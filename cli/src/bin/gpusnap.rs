//! `gpusnap`: install the runtime on a node, check the node, inspect checkpoints.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::{Args, CommandFactory as _, Parser, Subcommand};
use gpusnap_cli::checkpoint_cmd::{self, CheckpointCommand};
use gpusnap_cli::image_cmd::{self, ImageCommand};
use gpusnap_cli::inspect::{self, Verify};
use gpusnap_cli::install::{
    self, ContainerdMode, ContainerdTarget, CriuTarget, InstallOptions, NetworkLock,
};
use gpusnap_cli::{doctor, fsutil, host, kube, term};

#[derive(Parser)]
#[command(
    name = "gpusnap",
    version,
    about = "GPU-aware container checkpoint/restore: node tools"
)]
struct Cli {
    /// gpusnap config file (read by the shim and gpusnap-runc, which honour $GPUSNAP_CONFIG
    /// alike).
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = gpusnap_config::CONFIG_ENV,
        default_value = gpusnap_config::DEFAULT_CONFIG_PATH
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Register the gpusnap runtime with containerd, CRI-O and Podman (idempotent, revertible).
    Install(InstallArgs),
    /// Revert exactly what `gpusnap install` changed.
    Uninstall(UninstallArgs),
    /// Check this node: kernel, cgroups, runc, containerd, CRIU, NVIDIA driver, config.
    Doctor(DoctorArgs),
    /// Summarise a checkpoint directory, CRI checkpoint archive or OCI checkpoint image and
    /// check it is restorable.
    Inspect(InspectArgs),
    /// A checkpoint's own signature (gpusnap-manifest.json.sig): sign or verify a checkpoint
    /// directory or archive.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Combined OCI checkpoint images: build, push to and pull from a registry.
    #[command(subcommand)]
    Image(ImageCommand),
    /// The node's blob store (shared by every pull): list, usage, garbage collection.
    #[command(subcommand)]
    Store(gpusnap_cli::store_cmd::StoreCommand),
    /// The gpusnap config file: print the defaults, or check a file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// What the installer DaemonSet's container runs (the Helm chart and the installer image):
    /// install and keep installed, readiness, uninstall on SIGTERM.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Print a shell completion script, e.g. `gpusnap completion bash >
    /// /etc/bash_completion.d/gpusnap` (the .deb and the installer image ship them).
    Completion {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print a config file with every setting at its default.
    Default,
    /// Validate the file given with --config; errors name the setting.
    Check,
}

#[derive(Args)]
struct InstallArgs {
    /// Print a unified diff of what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// containerd's main config file.
    #[arg(long, value_name = "PATH")]
    containerd_config: Option<PathBuf>,
    /// Drop-in file for drop-in mode [default: <containerd config dir>/conf.d/99-gpusnap.toml].
    #[arg(long, value_name = "PATH")]
    containerd_dropin: Option<PathBuf>,
    /// How to register with containerd.
    #[arg(long, value_enum, default_value = "auto")]
    containerd_mode: ContainerdMode,
    /// containerd binary, asked for its release to choose the mode.
    #[arg(long, value_name = "PATH", default_value = "containerd")]
    containerd_bin: PathBuf,
    /// Do not touch containerd's config.
    #[arg(long)]
    skip_containerd: bool,
    /// CRI-O drop-in directory [default: /etc/crio/crio.conf.d when CRI-O is installed].
    #[arg(long, value_name = "DIR")]
    crio_dropin_dir: Option<PathBuf>,
    /// Do not write the CRI-O drop-in.
    #[arg(long)]
    skip_crio: bool,
    /// runc's state root for containers of the CRI-O handler.
    #[arg(long, value_name = "DIR", default_value = install::crio::RUNTIME_ROOT)]
    crio_runtime_root: PathBuf,
    /// containers.conf file registering gpusnap-runc with Podman; an existing file keeps its
    /// other settings [default: /etc/containers/containers.conf.d/90-gpusnap.conf when Podman
    /// is installed].
    #[arg(long, value_name = "PATH")]
    podman_conf: Option<PathBuf>,
    /// Do not register gpusnap-runc with Podman.
    #[arg(long)]
    skip_podman: bool,
    /// containerd-shim-gpusnap-v2 [default: next to this binary, else on PATH, else /usr/local/bin].
    #[arg(long, value_name = "PATH")]
    shim_path: Option<PathBuf>,
    /// gpusnap-runc, for CRI-O [default: next to this binary, else on PATH, else /usr/local/bin].
    #[arg(long, value_name = "PATH")]
    runc_wrapper_path: Option<PathBuf>,
    /// Install this file as the gpusnap config (validated first; e.g. from a ConfigMap).
    #[arg(long, value_name = "PATH")]
    config_from: Option<PathBuf>,
    /// CRIU config file runc passes to CRIU.
    #[arg(long, value_name = "PATH", default_value = "/etc/criu/runc.conf")]
    criu_config: PathBuf,
    /// Whether to make CRIU lock the network with nftables.
    #[arg(long, value_enum, default_value = "auto")]
    criu_network_lock: NetworkLock,
    #[command(flatten)]
    common: StateArgs,
}

#[derive(Subcommand)]
enum AgentCommand {
    /// Copy the binaries and key files onto the node, `gpusnap install`, restart the runtime
    /// when its config changed, run `gpusnap doctor` on the node and report readiness (a ready
    /// file, the node label gpusnap.io/ready=true); every --recheck-seconds. On SIGTERM: the
    /// label off and the runtime registration reverted; everything gpusnap put on the node
    /// when the DaemonSet is being deleted.
    Run(Box<AgentRunArgs>),
    /// Readiness probe: the last round found the node ready and containerd still lists the
    /// gpusnap handler.
    Probe(AgentProbeArgs),
    /// The chart's pre-delete hook: delete the installer DaemonSet in the foreground (each pod
    /// then uninstalls gpusnap from its node) and take the label off its nodes.
    UninstallRelease(UninstallReleaseArgs),
    /// What the agent did with each checkpoint archive of this node (`agent run
    /// --checkpoint-dir`): pushed where, with which digest and tags; refused or failed, and why.
    PushStatus(PushStatusArgs),
}

#[derive(Args)]
struct PushStatusArgs {
    /// The agent's status directory.
    #[arg(long, value_name = "DIR", default_value = gpusnap_cli::checkpoint_push::DEFAULT_STATUS_DIR)]
    status_dir: PathBuf,
    /// One JSON document (the records, newest first) instead of lines.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AgentRunArgs {
    #[command(flatten)]
    install: InstallArgs,
    /// Directory holding the binaries to put on the node (the image's /opt/gpusnap/bin).
    #[arg(long, value_name = "DIR")]
    source_dir: Option<PathBuf>,
    /// The node's directory for the binaries (mounted at the same path).
    #[arg(long, value_name = "DIR", default_value = "/usr/local/bin")]
    bin_dir: PathBuf,
    /// Put a file on the node (a Secret's entry): SRC:DEST:MODE[:DIRMODE], octal modes,
    /// root-owned, replaced only when it changed (repeatable).
    #[arg(long = "put", value_name = "SRC:DEST:MODE[:DIRMODE]")]
    put: Vec<install::agent::PutFile>,
    /// The node's mount namespace (with hostPID: /proc/1/ns/mnt): doctor and the restart
    /// commands run there, on the node's own files; without it they run here.
    #[arg(long, value_name = "PATH")]
    host_mount_ns: Option<PathBuf>,
    /// containerd's socket, which doctor asks for the handler.
    #[arg(long, value_name = "PATH", default_value = gpusnap_cli::cri::CONTAINERD_SOCKET)]
    containerd_socket: PathBuf,
    /// The readiness probe's file.
    #[arg(long, value_name = "PATH", default_value = "/run/gpusnap-agent/ready")]
    ready_file: PathBuf,
    /// Seconds between rounds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    recheck_seconds: u64,
    /// This pod's node, labelled gpusnap.io/ready (the downward API's spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node_name: Option<String>,
    /// This pod's DaemonSet as NAMESPACE/NAME: when it is being deleted, SIGTERM uninstalls
    /// everything (else it keeps the config, keys and binaries for the next pod).
    #[arg(long, value_name = "NS/NAME")]
    daemonset: Option<String>,
    /// The service account's token and CA (for the node label and the pods' events).
    #[arg(long, value_name = "DIR", default_value = kube::SERVICE_ACCOUNT_DIR)]
    service_account_dir: PathBuf,
    /// Watch this directory for the kubelet's checkpoint archives (its <root-dir>/checkpoints,
    /// e.g. /var/lib/kubelet/checkpoints) and push those of pods annotated
    /// gpusnap.io/checkpoint-to: REGISTRY/REPOSITORY to the destinations the config's
    /// checkpoint.allowed_destinations allows. Without it: no pushes.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Where the pushes keep one status file per archive (`gpusnap agent push-status` reads
    /// them).
    #[arg(long, value_name = "DIR", default_value = gpusnap_cli::checkpoint_push::DEFAULT_STATUS_DIR)]
    push_status_dir: PathBuf,
}

#[derive(Args)]
struct AgentProbeArgs {
    /// The agent's ready file.
    #[arg(long, value_name = "PATH", default_value = "/run/gpusnap-agent/ready")]
    ready_file: PathBuf,
    /// containerd's socket, asked for the handler; omit on nodes without containerd.
    #[arg(long, value_name = "PATH")]
    containerd_socket: Option<PathBuf>,
}

#[derive(Args)]
struct UninstallReleaseArgs {
    /// The installer DaemonSet as NAMESPACE/NAME.
    #[arg(long, value_name = "NS/NAME")]
    daemonset: String,
    /// How long its pods may take to uninstall.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    timeout_seconds: u64,
    /// The service account's token and CA.
    #[arg(long, value_name = "DIR", default_value = kube::SERVICE_ACCOUNT_DIR)]
    service_account_dir: PathBuf,
}

#[derive(Args)]
struct StateArgs {
    /// Where install records what it changed.
    #[arg(long, value_name = "PATH", default_value = install::DEFAULT_STATE_FILE)]
    state_file: PathBuf,
    /// Run this shell command when containerd's config changed (e.g. `systemctl restart containerd`).
    #[arg(long, value_name = "CMD")]
    restart_containerd_cmd: Option<String>,
    /// Run this shell command when CRI-O's config changed (e.g. `systemctl restart crio`).
    #[arg(long, value_name = "CMD")]
    restart_crio_cmd: Option<String>,
}

#[derive(Args)]
struct UninstallArgs {
    /// Print a unified diff of what would be reverted, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also revert files that changed since install (their later edits are lost).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    common: StateArgs,
}

#[derive(Args)]
struct DoctorArgs {
    /// One JSON document instead of lines.
    #[arg(long)]
    json: bool,
    /// CUDA driver library to probe [default: cuda.library from the config].
    #[arg(long, value_name = "PATH")]
    cuda_library: Option<PathBuf>,
    /// containerd binary (whether this is a containerd node).
    #[arg(long, value_name = "PATH", default_value = "containerd")]
    containerd_bin: PathBuf,
    /// containerd's socket: doctor asks containerd there whether it runs and has loaded the
    /// gpusnap handler (k3s and RKE2: /run/k3s/containerd/containerd.sock).
    #[arg(long, value_name = "PATH", default_value = gpusnap_cli::cri::CONTAINERD_SOCKET)]
    containerd_socket: PathBuf,
}

#[derive(Args)]
struct InspectArgs {
    /// Checkpoint directory, extracted CRI archive, CRI checkpoint archive (.tar), or OCI
    /// checkpoint image (oci-archive .tar or layout directory).
    path: PathBuf,
    /// One JSON document instead of the summary.
    #[arg(long)]
    json: bool,
    /// Read the manifest only; do not check the image files.
    #[arg(long, conflicts_with = "sizes_only")]
    no_verify: bool,
    /// Check presence and sizes but not digests (fast on large checkpoints).
    #[arg(long)]
    sizes_only: bool,
    /// Private key (PEM, root-owned 0600) that opens an encrypted image's gpusnap manifest, in
    /// addition to the config's restore.decryption_keys (repeatable).
    #[arg(long = "decryption-key", value_name = "KEY.pem")]
    decryption_keys: Vec<PathBuf>,
}

fn main() -> ExitCode {
    // The agent's checkpoint pushes log what they do (an operator reads it with kubectl logs).
    gpusnap_cli::logging::init("GPUSNAP_LOG", "warn,gpusnap_cli::checkpoint_push=info");
    // The packaging's man pages and completions (packaging/gen-docs.sh), from this command.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = gpusnap_cli::usage::generate(&args, Cli::command()) {
        return ExitCode::from(code);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Install(a) => cmd_install(&cli.config, a),
        Command::Uninstall(a) => cmd_uninstall(a),
        Command::Doctor(a) => cmd_doctor(&cli.config, a),
        Command::Inspect(a) => cmd_inspect(&cli.config, a),
        Command::Image(c) => image_cmd::run(&cli.config, c),
        Command::Store(c) => gpusnap_cli::store_cmd::run(&cli.config, c),
        Command::Checkpoint(c) => checkpoint_cmd::run(&cli.config, c),
        Command::Config(ConfigCommand::Default) => {
            print!("{}", install::default_config_text());
            Ok(0)
        }
        Command::Config(ConfigCommand::Check) => cmd_config_check(&cli.config),
        Command::Agent(c) => cmd_agent(&cli.config, c),
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "gpusnap",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let text = format!("{e:#}");
            eprintln!("gpusnap: {text}");
            if let Some(hint) = gpusnap_cli::hints::for_error(&text) {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The standard system path, searched for runc and CRIU when this shell's PATH lacks them.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

/// `name` next to this executable (a package installs them together), else on PATH, else in
/// /usr/local/bin where the docs and the DaemonSet put it.
fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .filter(|p| fsutil::is_executable(p))
        .or_else(|| fsutil::which(name))
        .map(absolute)
        .unwrap_or_else(|| Path::new("/usr/local/bin").join(name))
}

/// The install options for these flags, and notes on what was skipped and why.
fn install_options(config: &Path, a: &InstallArgs) -> (InstallOptions, Vec<String>) {
    let mut notes = Vec::new();
    let containerd = if a.skip_containerd {
        None
    } else {
        let explicit = a.containerd_config.is_some();
        let cfg = absolute(
            a.containerd_config
                .clone()
                .unwrap_or_else(|| PathBuf::from("/etc/containerd/config.toml")),
        );
        let bin = fsutil::which(&a.containerd_bin.to_string_lossy());
        let present =
            explicit || cfg.exists() || cfg.parent().is_some_and(Path::exists) || bin.is_some();
        if present {
            let dropin = a
                .containerd_dropin
                .clone()
                .map(absolute)
                .unwrap_or_else(|| {
                    cfg.parent()
                        .unwrap_or(Path::new("/etc/containerd"))
                        .join("conf.d/99-gpusnap.toml")
                });
            Some(ContainerdTarget {
                config: cfg,
                dropin,
                mode: a.containerd_mode,
                release: bin.as_deref().and_then(host::containerd_release),
            })
        } else {
            notes.push(
                "containerd not found: skipped (pass --containerd-config to force)".to_owned(),
            );
            None
        }
    };
    let crio_dropin = if a.skip_crio {
        None
    } else {
        match &a.crio_dropin_dir {
            Some(d) => Some(absolute(d.clone()).join(install::crio::DROPIN_NAME)),
            None if Path::new("/etc/crio").exists() || fsutil::which("crio").is_some() => {
                Some(Path::new("/etc/crio/crio.conf.d").join(install::crio::DROPIN_NAME))
            }
            None => {
                notes.push("CRI-O not found: skipped (pass --crio-dropin-dir to force)".to_owned());
                None
            }
        }
    };
    let podman_conf = if a.skip_podman {
        None
    } else {
        match &a.podman_conf {
            Some(p) => Some(absolute(p.clone())),
            None if Path::new("/etc/containers").exists() || fsutil::which("podman").is_some() => {
                Some(Path::new(install::podman::DROPIN_DIR).join(install::podman::DROPIN_NAME))
            }
            None => {
                notes.push("Podman not found: skipped (pass --podman-conf to force)".to_owned());
                None
            }
        }
    };
    let gpusnap_config = gpusnap_config::Config::load(config).unwrap_or_default();
    let criu_dir_path = gpusnap_criu_bridge::RuncGlobal {
        criu_dir: gpusnap_config.criu.binary_dir.clone(),
        ..Default::default()
    }
    .effective_search_path();
    let criu_bin = gpusnap_criu_bridge::find_in_path("criu", &criu_dir_path);
    // Absolute paths for a new gpusnap config: this shell's PATH, then the system path (what
    // gpusnap-runc searches when its caller gives none).
    let search = |name: &str| {
        std::env::var_os("PATH")
            .and_then(|p| gpusnap_criu_bridge::find_in_path(name, &p))
            .or_else(|| gpusnap_criu_bridge::find_in_path(name, OsStr::new(SYSTEM_PATH)))
            .map(absolute)
    };
    let found = install::FoundTools {
        runc: search("runc"),
        criu_dir: criu_bin
            .clone()
            .or_else(|| search("criu"))
            .map(absolute)
            .and_then(|c| c.parent().map(Path::to_path_buf)),
    };
    let criu = Some(CriuTarget {
        config: absolute(a.criu_config.clone()),
        lock: a.criu_network_lock,
        facts: install::criu_conf::probe(criu_bin.as_deref()),
    });
    let opts = InstallOptions {
        containerd,
        crio_dropin,
        crio_runtime_root: absolute(a.crio_runtime_root.clone()),
        podman_conf,
        criu,
        shim_path: a
            .shim_path
            .clone()
            .map(absolute)
            .unwrap_or_else(|| sibling_binary(gpusnap_cli::SHIM_BINARY)),
        runc_wrapper_path: a
            .runc_wrapper_path
            .clone()
            .map(absolute)
            .unwrap_or_else(|| sibling_binary(gpusnap_cli::RUNC_WRAPPER_BINARY)),
        config_path: absolute(config.to_path_buf()),
        config_from: a.config_from.clone().map(absolute),
        found,
    };
    (opts, notes)
}

fn cmd_install(config: &Path, a: InstallArgs) -> Result<u8> {
    let (opts, notes) = install_options(config, &a);
    let plan = install::plan(&opts)?;
    for n in notes.iter().chain(&plan.notes) {
        eprintln!("note: {n}");
    }
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    if a.dry_run {
        if plan.is_empty() {
            eprintln!("gpusnap install --dry-run: nothing would change");
        }
        print!("{}", plan.diff());
        return Ok(0);
    }
    if plan.is_empty() {
        println!("gpusnap install: already installed, nothing changed");
        return Ok(0);
    }
    let applied = install::apply(&plan, &a.common.state_file)?;
    for c in &plan.changes {
        println!("changed {}: {}", c.path.display(), c.summary);
    }
    println!(
        "recorded in {} (`gpusnap uninstall` reverts it)",
        a.common.state_file.display()
    );
    restart(&a.common, &applied.components)?;
    Ok(0)
}

fn restart(
    args: &StateArgs,
    components: &std::collections::BTreeSet<install::Component>,
) -> Result<()> {
    for (component, cmd, hint) in [
        (
            install::Component::Containerd,
            &args.restart_containerd_cmd,
            "systemctl restart containerd",
        ),
        (
            install::Component::Crio,
            &args.restart_crio_cmd,
            "systemctl restart crio",
        ),
    ] {
        if !components.contains(&component) {
            continue;
        }
        match cmd {
            Some(cmd) => {
                println!("running: {cmd}");
                let status = std::process::Command::new("sh")
                    .args(["-c", cmd])
                    .status()
                    .with_context(|| format!("running `{cmd}`"))?;
                if !status.success() {
                    bail!(
                        "`{cmd}` failed ({status}); restart {} by hand",
                        component.as_str()
                    );
                }
            }
            None => println!("restart {} to load the change: {hint}", component.as_str()),
        }
    }
    Ok(())
}

fn cmd_uninstall(a: UninstallArgs) -> Result<u8> {
    let plan = install::plan_uninstall(&a.common.state_file, a.force)?;
    if plan.nothing_installed() {
        println!(
            "gpusnap uninstall: nothing to do ({} does not exist)",
            a.common.state_file.display()
        );
        return Ok(0);
    }
    for (path, why) in &plan.kept {
        eprintln!("kept {}: {why}", path.display());
    }
    if a.dry_run {
        print!("{}", plan.diff());
        return Ok(0);
    }
    install::apply_uninstall(&plan, &a.common.state_file)?;
    for c in &plan.reverts {
        println!("{} {}", c.summary, c.path.display());
    }
    restart(&a.common, &plan.components())?;
    Ok(u8::from(!plan.kept.is_empty()))
}

fn cmd_doctor(config: &Path, a: DoctorArgs) -> Result<u8> {
    let report = doctor::run(&doctor::DoctorOptions {
        config_path: config.to_path_buf(),
        cuda_library: a.cuda_library,
        containerd_bin: a.containerd_bin,
        containerd_socket: a.containerd_socket,
    });
    if a.json {
        let v = serde_json::json!({
            "checks": report.checks,
            "summary": {
                "ok": report.count(doctor::Status::Ok),
                "warn": report.count(doctor::Status::Warn),
                "fail": report.count(doctor::Status::Fail),
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", report.render(term::width()));
    }
    Ok(report.exit_code() as u8)
}

fn cmd_config_check(config: &Path) -> Result<u8> {
    if !config.exists() {
        bail!("{} does not exist", config.display());
    }
    gpusnap_config::Config::load(config)?;
    println!("{}: valid", config.display());
    Ok(0)
}

fn cmd_inspect(config: &Path, a: InspectArgs) -> Result<u8> {
    let verify = if a.no_verify {
        Verify::None
    } else if a.sizes_only {
        Verify::Sizes
    } else {
        Verify::Full
    };
    // An OCI checkpoint image: described from its metadata (layers are verified on extract).
    if let Some(mut info) = image_cmd::try_inspect_image(&a.path, &Default::default())? {
        // An encrypted image: the node's keys, and any given, open its gpusnap manifest. They
        // are read only then (root-owned files: plain images inspect without them).
        if info.encryption.is_some() && info.gpusnap_manifest.is_none() {
            let cfg = gpusnap_config::Config::load(config)
                .with_context(|| format!("reading {}", config.display()))?;
            let mut keys = cfg.restore.decryption_keys.clone();
            keys.extend(a.decryption_keys.iter().cloned());
            if !keys.is_empty() {
                let decryption = gpusnap_oci_image::crypt::Decryption::load(&keys)?;
                if let Some(opened) = image_cmd::try_inspect_image(&a.path, &decryption)? {
                    info = opened;
                }
            }
        }
        if a.json {
            println!("{}", serde_json::to_string_pretty(&info)?);
        } else {
            print!("{}", image_cmd::render_image(&info, term::width()));
        }
        return Ok(u8::from(info.gpusnap_manifest.is_none()));
    }
    let insp = inspect::inspect_path(&a.path, verify)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&insp.to_json())?);
    } else {
        print!("{}", inspect::render(&insp, term::width()));
    }
    // Non-zero when restore would refuse it, so scripts can gate on it.
    Ok(u8::from(matches!(
        insp.validation,
        inspect::Validation::Refused { .. }
    )))
}

fn split_daemonset(s: &str) -> Result<(String, String)> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => bail!("--daemonset {s:?}: expected NAMESPACE/NAME"),
    }
}

fn cmd_agent(config: &Path, c: AgentCommand) -> Result<u8> {
    match c {
        AgentCommand::Probe(a) => Ok(install::agent::probe(
            &a.ready_file,
            a.containerd_socket.as_deref(),
        )),
        AgentCommand::PushStatus(a) => {
            gpusnap_cli::checkpoint_push::print_status(&a.status_dir, a.json)
        }
        AgentCommand::UninstallRelease(a) => {
            let (ns, name) = split_daemonset(&a.daemonset)?;
            let kube = kube::Kube::in_cluster(&a.service_account_dir)?;
            Ok(install::agent::uninstall_release(
                &kube,
                &ns,
                &name,
                std::time::Duration::from_secs(a.timeout_seconds),
            ))
        }
        AgentCommand::Run(mut a) => {
            // The registration names the binaries where the agent puts them on the node.
            let bin_dir = absolute(a.bin_dir.clone());
            a.install
                .shim_path
                .get_or_insert_with(|| bin_dir.join(gpusnap_cli::SHIM_BINARY));
            a.install
                .runc_wrapper_path
                .get_or_insert_with(|| bin_dir.join(gpusnap_cli::RUNC_WRAPPER_BINARY));
            let (opts, notes) = install_options(config, &a.install);
            for n in notes {
                println!("gpusnap agent: note: {n}");
            }
            let command = |c: &Option<String>| {
                c.as_deref()
                    .map(install::agent::split_command)
                    .transpose()
                    .map_err(anyhow::Error::msg)
            };
            let kube = match kube::Kube::in_cluster(&a.service_account_dir) {
                Ok(k) => Some(k),
                Err(e) => {
                    println!("gpusnap agent: {e}: no node label, and SIGTERM keeps the config");
                    None
                }
            };
            let agent = install::agent::Agent {
                install: opts,
                state_file: a.install.common.state_file.clone(),
                restart_containerd: command(&a.install.common.restart_containerd_cmd)?,
                restart_crio: command(&a.install.common.restart_crio_cmd)?,
                source_dir: a.source_dir,
                bin_dir,
                files: a.put,
                host_mount_ns: a.host_mount_ns,
                containerd_socket: a.containerd_socket,
                ready_file: a.ready_file,
                recheck: std::time::Duration::from_secs(a.recheck_seconds),
                node_name: a.node_name,
                daemonset: a.daemonset.as_deref().map(split_daemonset).transpose()?,
                kube,
                push: a.checkpoint_dir.map(|d| install::agent::PushWatch {
                    checkpoint_dir: absolute(d),
                    status_dir: absolute(a.push_status_dir.clone()),
                }),
            };
            Ok(agent.run())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command and every argument says what it is: `--help`, the man pages and the
    /// completions are generated from these descriptions.
    #[test]
    fn every_command_and_argument_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() && !path.ends_with(" help") {
                missing.push(format!("{path}: no description"));
            }
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path}: argument {id} has no description"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &path, missing);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn config_comes_from_the_environment_unless_given() {
        let cli = Cli::try_parse_from(["gpusnap", "config", "check"]).unwrap();
        let from_env = std::env::var_os(gpusnap_config::CONFIG_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(gpusnap_config::DEFAULT_CONFIG_PATH));
        assert_eq!(cli.config, from_env);
        let cli =
            Cli::try_parse_from(["gpusnap", "--config", "/x.toml", "config", "check"]).unwrap();
        assert_eq!(cli.config, PathBuf::from("/x.toml"));
    }
}
