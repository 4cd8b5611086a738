//! `gpusnap-runc`: a runc-compatible binary for CRI-O and Podman.
//!
//! Every subcommand except `checkpoint`, `restore` and `resume` is handed to the real runc
//! with `exec`, so signals, stdio and exit codes are runc's own. `checkpoint` and `restore`
//! convert runc's command line into a request of the same checkpoint and restore transactions
//! the containerd shim runs (`gpusnap_transaction`), and map its error once onto an exit code;
//! `resume` finishes what a checkpoint of a container its caller had frozen left to do.
//! `create` of a container whose spec carries `gpusnap.io/restore-from[-volume]` restores it
//! instead and holds it frozen until `start` ([`create`], [`held`]); `state`, `start`, `kill`
//! and `delete` go to runc unchanged unless they name such a held container.
//!
//! Callers do not always give a `PATH` (Podman runs `kill` and `delete` with none), so runc
//! and CRIU are found from the configuration and the standard system locations
//! ([`locate`]).

mod args;
mod checkpoint;
mod create;
mod guard;
mod held;
mod locate;
mod repair;
mod restore;
mod resume;

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use gpusnap_config::Config;
use gpusnap_criu_bridge::RuncGlobal;
use gpusnap_transaction::{Error as TransactionError, Refusal};

pub use args::{Invocation, Parsed};
pub use locate::{resolve_runc, SYSTEM_PATH};

/// Overrides the runc binary (else `runc.binary` from the gpusnap config).
pub const RUNC_ENV: &str = "GPUSNAP_RUNC";
/// Overrides the gpusnap config path.
pub const CONFIG_ENV: &str = "GPUSNAP_CONFIG";
/// Log filter for the wrapper's own diagnostics (stderr), e.g. `GPUSNAP_LOG=debug`.
pub const LOG_ENV: &str = "GPUSNAP_LOG";
/// Where the transactions put scratch files (CRIU's private plugin directory).
pub const SCRATCH_DIR: &str = "/run/gpusnap-runc";
/// runc's state root when the caller names none (runc's default for root).
pub const DEFAULT_RUNC_ROOT: &str = "/run/runc";

/// Exit code when the wrapper itself refuses (as runc: 1 for any failure).
pub const EXIT_REFUSED: i32 = 1;
/// Exit code when runc cannot be started at all (as a shell would report).
pub const EXIT_NO_RUNC: i32 = 127;

/// Everything a subcommand needs.
#[derive(Debug)]
pub struct Context {
    pub inv: Invocation,
    pub config: Config,
    /// Where `config` was read from: a container's `gpusnap.io/` annotations layer over it
    /// ([`Context::config_for`]).
    pub config_path: PathBuf,
    /// The real runc.
    pub runc: PathBuf,
    /// `PATH` for runc: the caller's (or the system path when it gave none), with
    /// `criu.binary_dir` in front so runc runs the intended CRIU.
    pub path_env: OsString,
}

impl Context {
    /// The configuration for the container of `bundle`: the file, overlaid by the
    /// `gpusnap.io/` annotations of its runtime spec as the shim overlays a pod's
    /// (`container_config`). Refused with a message naming the setting or the spec.
    pub fn config_for(
        &self,
        bundle: &Path,
    ) -> Result<Config, gpusnap_transaction::container_config::ContainerConfigError> {
        gpusnap_transaction::container_config::for_bundle(&self.config_path, &self.config, bundle)
    }

    /// A command running the real runc with `args`.
    pub fn runc_command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new(&self.runc);
        cmd.args(args).env("PATH", &self.path_env);
        cmd
    }

    /// Replaces this process with runc and the original arguments. Returns only on failure.
    pub fn exec_runc(&self) -> i32 {
        let err = self.runc_command(&self.inv.args).exec();
        self.fail(&format!("cannot run {}: {err}", self.runc.display()));
        EXIT_NO_RUNC
    }

    /// runc's global flags as the caller gave them, for the commands the transactions build.
    pub fn global(&self) -> RuncGlobal {
        let g = &self.inv.global;
        let mut extra = Vec::new();
        if let Some(r) = g.value(&["rootless"]) {
            extra.push(OsString::from(format!("--rootless={r}")));
        }
        if g.is_set(&["debug"]) {
            extra.push("--debug".into());
        }
        RuncGlobal {
            binary: self.runc.clone(),
            root: g.value(&["root"]).map(PathBuf::from),
            log: self.inv.log_file(),
            log_format: g.value(&["log-format"]).map(str::to_string),
            systemd_cgroup: g.is_set(&["systemd-cgroup"]),
            criu: self.inv.criu_path(),
            criu_dir: None,
            env: vec![("PATH".into(), self.path_env.clone())],
            extra,
        }
    }

    /// runc's state directory of container `id` (`<root>/<id>`).
    pub fn state_dir(&self, id: &str) -> PathBuf {
        self.inv
            .global
            .value(&["root"])
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNC_ROOT))
            .join(id)
    }

    /// Reports a failure where the caller looks, once: one plain line on stderr, and an entry
    /// in runc's `--log` file when the caller asked for one (conmon and CRI-O read errors from
    /// there), as runc itself does.
    pub fn fail(&self, message: &str) {
        let message = message.replace('\n', "; ");
        eprintln!("gpusnap-runc: {message}");
        if let Some(log) = self.inv.log_file() {
            append_log(&log, self.inv.log_json(), &message);
        }
    }

    /// Reports a transaction's failure and returns the exit code for it.
    pub fn fail_with(&self, e: &TransactionError) -> i32 {
        self.fail(&e.to_string());
        exit_code_of(e)
    }
}

/// The one mapping of a transaction error onto an exit code: runc's own code when runc failed,
/// else 1 (runc's code for any failure).
pub fn exit_code_of(e: &TransactionError) -> i32 {
    match e {
        TransactionError::Refused {
            reason: Refusal::InvalidRequest | Refusal::Precondition | Refusal::Busy,
            ..
        } => EXIT_REFUSED,
        TransactionError::Failed { runc_exit, .. } => runc_exit.unwrap_or(EXIT_REFUSED),
    }
}

fn append_log(path: &Path, json: bool, message: &str) {
    let time = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let line = if json {
        serde_json::json!({"level": "error", "msg": format!("gpusnap-runc: {message}"), "time": time})
            .to_string()
    } else {
        format!(
            "time=\"{time}\" level=error msg=\"gpusnap-runc: {}\"",
            message.replace('"', "'")
        )
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// runc's exit status as our exit code (signals as a shell reports them).
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Diagnostics filtered by `$GPUSNAP_LOG` go where runc's own go: into the caller's `--log`
/// file (JSON lines with `--log-format json`), so that stderr carries nothing but the one error
/// line; containerd-shim-runc-v2 reports the first line of the runtime's output as the error,
/// and conmon/CRI-O pass stderr on verbatim. Without `--log`, stderr, with colours only on a
/// terminal.
fn init_logging(log_file: Option<&Path>, json: bool) {
    use std::sync::Mutex;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
    };
    let file = log_file.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
    });
    let _ = match (file, json) {
        (Some(f), true) => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter())
            .with_writer(Mutex::new(f))
            .with_target(false)
            .try_init(),
        (Some(f), false) => tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_writer(Mutex::new(f))
            .with_ansi(false)
            .with_target(false)
            .try_init(),
        (None, _) => tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .try_init(),
    };
}

/// Entry point; returns the exit code for the paths that do not exec.
pub fn main(mut args: Vec<OsString>) -> i32 {
    // A restore's guard (`guard.rs`): started by `restore` itself, never by a caller.
    let guard = guard::take_guard_arg(&mut args);
    let inv = Invocation::parse(args);
    init_logging(inv.log_file().as_deref(), inv.log_json());
    let config_path = std::env::var_os(CONFIG_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(gpusnap_config::DEFAULT_CONFIG_PATH));
    let config = match Config::load(&config_path) {
        Ok(c) => c,
        Err(e) => {
            // Fail closed: a wrong runc binary or CRIU path must not be guessed around.
            eprintln!("gpusnap-runc: {e}");
            return EXIT_REFUSED;
        }
    };
    let path_env =
        locate::runc_path_env(std::env::var_os("PATH"), config.criu.binary_dir.as_deref());
    // The transactions probe CRIU on this process's PATH; a caller that gave none (Podman's
    // kill and delete, any `env -i`) would have them find no CRIU at all. Set before any
    // thread starts.
    std::env::set_var("PATH", &path_env);
    let runc = match resolve_runc(&config, &path_env) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpusnap-runc: {e}");
            return EXIT_NO_RUNC;
        }
    };
    let ctx = Context {
        inv,
        config,
        config_path,
        runc,
        path_env,
    };
    if guard {
        return guard::run(&ctx);
    }
    repair::interrupted_operations(&ctx);
    match ctx.inv.command().map(|c| c.to_string_lossy().into_owned()) {
        None if ctx.inv.global.is_set(&["version", "v"]) => version(&ctx),
        Some(c) if c == "checkpoint" => checkpoint::run(&ctx),
        Some(c) if c == "restore" => restore::run(&ctx),
        Some(c) if c == "resume" => resume::run(&ctx),
        // A container restored at `create` and held until `start` (`create.rs`, `held.rs`).
        Some(c) if c == "create" => create::run(&ctx),
        Some(c) if c == "state" => held::state(&ctx),
        Some(c) if c == "start" => held::start(&ctx),
        Some(c) if c == "kill" => held::kill(&ctx),
        Some(c) if c == "delete" => held::delete(&ctx),
        _ => ctx.exec_runc(),
    }
}

/// `--version`: runc's own lines first (callers parse `runc version X`), then gpusnap's.
fn version(ctx: &Context) -> i32 {
    let out = match ctx
        .runc_command(&ctx.inv.args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            ctx.fail(&format!("cannot run {}: {e}", ctx.runc.display()));
            return EXIT_NO_RUNC;
        }
    };
    let _ = std::io::stdout().write_all(&out.stdout);
    let _ = std::io::stderr().write_all(&out.stderr);
    println!("gpusnap-runc: {}", env!("CARGO_PKG_VERSION"));
    exit_code(out.status)
}
