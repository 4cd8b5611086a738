//! `gpusnap-runc`: a runc-compatible binary for CRI-O and Podman.
//!
//! Every subcommand except `checkpoint` and `restore` is handed to the real runc with `exec`,
//! so signals, stdio and exit codes are runc's own. `checkpoint` runs runc with the same
//! arguments between gpusnap's preparation (CRIU probe, clean image directory, GPU lock) and
//! its seal (the manifest that marks the image complete). `restore` refuses an incomplete,
//! foreign or damaged image before CRIU runs, then execs runc (CPU-only images) or runs it and
//! restores the GPU state (GPU images).

mod args;
mod checkpoint;
pub mod gpu;
mod restore;

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use gpusnap_config::Config;

pub use args::{Invocation, Parsed};

/// Overrides the runc binary (else `runc.binary` from the gpusnap config).
pub const RUNC_ENV: &str = "GPUSNAP_RUNC";
/// Overrides the gpusnap config path.
pub const CONFIG_ENV: &str = "GPUSNAP_CONFIG";
/// Log filter for the wrapper's own messages (stderr), e.g. `GPUSNAP_LOG=debug`.
pub const LOG_ENV: &str = "GPUSNAP_LOG";

/// Exit code when the wrapper itself refuses (as runc: 1 for any failure).
pub const EXIT_REFUSED: i32 = 1;
/// Exit code when runc cannot be started at all (as a shell would report).
pub const EXIT_NO_RUNC: i32 = 127;

/// Everything a subcommand needs.
#[derive(Debug)]
pub struct Context {
    pub inv: Invocation,
    pub config: Config,
    /// The real runc.
    pub runc: PathBuf,
    /// `PATH` for runc, with `criu.binary_dir` in front so runc runs the intended CRIU.
    pub path_env: OsString,
}

impl Context {
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

    /// runc with the original arguments as a child; stdio is inherited.
    pub fn run_runc(&self) -> std::io::Result<ExitStatus> {
        self.runc_command(&self.inv.args).status()
    }

    /// A helper call (`state`, `ps`, `kill`) with the caller's container selection flags;
    /// output captured.
    pub fn runc_helper(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        let mut full = self.inv.selection_args();
        full.extend(args.iter().map(OsString::from));
        self.runc_command(full).stdin(Stdio::null()).output()
    }

    /// `runc state <id>` → (bundle, init pid). `None` when runc does not know the container.
    pub fn state(&self, id: &str) -> Option<(PathBuf, i32)> {
        let out = self.runc_helper(&["state", id]).ok()?;
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some((
            PathBuf::from(v.get("bundle")?.as_str()?),
            i32::try_from(v.get("pid")?.as_i64()?).ok()?,
        ))
    }

    /// `runc ps --format json <id>`: every pid of the container.
    pub fn pids(&self, id: &str) -> Vec<i32> {
        self.runc_helper(&["ps", "--format", "json", id])
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| serde_json::from_slice::<Vec<i32>>(&o.stdout).ok())
            .unwrap_or_default()
    }

    /// Reports a failure where the caller looks: stderr, and runc's `--log` file in runc's
    /// JSON format when the caller asked for one (conmon and CRI-O read errors from there).
    pub fn fail(&self, message: &str) {
        tracing::error!(%message, "gpusnap-runc");
        eprintln!("gpusnap-runc: {message}");
        if let Some(log) = self.inv.log_file() {
            append_log(&log, self.inv.log_json(), message);
        }
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

/// Resolves the real runc: `$GPUSNAP_RUNC`, else `runc.binary`, looked up on PATH. Refuses to
/// resolve to this very binary (installed as `runc`), which would recurse forever.
pub fn resolve_runc(config: &Config) -> Result<PathBuf, String> {
    let name = std::env::var_os(RUNC_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| config.runc.binary.clone());
    let path = crate::fsutil::which(&name.to_string_lossy()).ok_or_else(|| {
        format!(
            "runc `{}` not found on PATH: install runc or set runc.binary in the gpusnap config \
             (or {RUNC_ENV})",
            name.display()
        )
    })?;
    let me = std::env::current_exe().and_then(|p| p.canonicalize()).ok();
    if me.is_some() && path.canonicalize().ok() == me {
        return Err(format!(
            "runc resolves to {} itself; set runc.binary (or {RUNC_ENV}) to the real runc",
            path.display()
        ));
    }
    Ok(path)
}

/// Entry point; returns the exit code for the paths that do not exec.
pub fn main(args: Vec<OsString>) -> i32 {
    crate::logging::init(LOG_ENV, "warn");
    let inv = Invocation::parse(args);
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
    let runc = match resolve_runc(&config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpusnap-runc: {e}");
            return EXIT_NO_RUNC;
        }
    };
    let path_env = gpusnap_criu_bridge::RuncGlobal {
        criu_dir: config.criu.binary_dir.clone(),
        ..Default::default()
    }
    .effective_search_path();
    let ctx = Context {
        inv,
        config,
        runc,
        path_env,
    };
    match ctx.inv.command().map(|c| c.to_string_lossy().into_owned()) {
        None if ctx.inv.global.is_set(&["version", "v"]) => version(&ctx),
        Some(c) if c == "checkpoint" => checkpoint::run(&ctx),
        Some(c) if c == "restore" => restore::run(&ctx),
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
    println!("gpusnap-runc: {}", crate::VERSION);
    exit_code(out.status)
}
