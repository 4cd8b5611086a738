//! gpusnap-runc's own usage: `--help` prints it before runc's help, and the man page and shell
//! completions are generated from it (`--generate-man DIR`, `--generate-completion SHELL`).
//! The wrapper parses runc's command line itself (runc's flags, Go style); this clap command
//! only describes it.

use clap::{Arg, ArgAction, Command};

/// runc's subcommands, with what gpusnap-runc does with each.
const SUBCOMMANDS: &[(&str, &str)] = &[
    (
        "checkpoint",
        "gpusnap's checkpoint transaction: CUDA processes locked and checkpointed, runc \
         checkpoint with the same arguments, the images sealed with the gpusnap manifest",
    ),
    (
        "restore",
        "verifies the images (manifest, digests, signature policy, CRIU images bounded by the \
         bundle's spec) before CRIU runs, then runc restore and the GPU restore",
    ),
    (
        "resume",
        "runc resume, then finishes a checkpoint of a container its caller had frozen",
    ),
    (
        "create",
        "runc create (exec); a spec annotated gpusnap.io/restore-from[-volume] is restored \
         instead and held frozen until start",
    ),
    ("run", "runc run (exec)"),
    (
        "start",
        "runc start (exec); thaws a container restored at create",
    ),
    ("exec", "runc exec (exec)"),
    (
        "kill",
        "runc kill (exec); kills a container restored at create that has not started",
    ),
    (
        "delete",
        "runc delete (exec), after killing a container restored at create that has not started",
    ),
    (
        "state",
        "runc state (exec); a container restored at create shows created until start",
    ),
    ("list", "runc list (exec)"),
    ("ps", "runc ps (exec)"),
    ("pause", "runc pause (exec)"),
    ("events", "runc events (exec)"),
    ("update", "runc update (exec)"),
    ("spec", "runc spec (exec)"),
    ("features", "runc features (exec)"),
];

/// The command line as gpusnap-runc documents it.
pub fn command() -> Command {
    let mut cmd = Command::new("gpusnap-runc")
        .version(env!("CARGO_PKG_VERSION"))
        .about("runc for CRI-O and Podman, with gpusnap's checkpoint and restore")
        .long_about(
            "gpusnap-runc takes runc's command line. `checkpoint`, `restore` and `resume` run \
             gpusnap's transactions around the real runc, as does a `create` whose spec carries \
             gpusnap.io/restore-from or gpusnap.io/restore-from-volume (the container is \
             restored there and held frozen, shown as created, until `start`); every other \
             subcommand is handed to runc with exec, so its output, signals and exit code are \
             runc's. A checkpoint \
             image is checked before CRIU restores it: an incomplete, damaged, unsigned (when \
             the policy requires signatures) or out-of-bounds one is refused with the reason.",
        )
        .override_usage("gpusnap-runc [RUNC GLOBAL OPTIONS] COMMAND [OPTIONS] [ARGS]")
        .disable_help_subcommand(true)
        .disable_version_flag(true)
        .disable_help_flag(true)
        .arg(
            Arg::new("help")
                .short('h')
                .long("help")
                .action(ArgAction::Help)
                .help("Print gpusnap-runc's usage, then runc's help"),
        )
        .arg(
            Arg::new("version")
                .short('v')
                .long("version")
                .action(ArgAction::Version)
                .help("Print runc's version lines, then gpusnap-runc's"),
        )
        .arg(
            Arg::new("root")
                .long("root")
                .value_name("DIR")
                .help("runc's state root (passed to runc)"),
        )
        .arg(
            Arg::new("log")
                .long("log")
                .value_name("FILE")
                .help("runc's log file; gpusnap-runc's refusals are written there too"),
        )
        .arg(
            Arg::new("log-format")
                .long("log-format")
                .value_name("text|json")
                .help("Format of the log file"),
        )
        .arg(
            Arg::new("systemd-cgroup")
                .long("systemd-cgroup")
                .action(ArgAction::SetTrue)
                .help("runc's systemd cgroup manager (passed to runc)"),
        )
        .arg(
            Arg::new("criu")
                .long("criu")
                .value_name("PATH")
                .help("The CRIU binary (passed to runc)"),
        )
        .arg(
            Arg::new("rootless")
                .long("rootless")
                .value_name("true|false|auto")
                .help("runc's rootless mode (passed to runc)"),
        )
        .arg(
            Arg::new("debug")
                .long("debug")
                .action(ArgAction::SetTrue)
                .help("runc's debug logging (passed to runc)"),
        )
        .after_help(
            "Environment:\n  GPUSNAP_CONFIG  gpusnap config file [default: /etc/gpusnap/config.toml]\n  \
             GPUSNAP_RUNC    the real runc [default: runc.binary of the config]\n  \
             GPUSNAP_LOG     gpusnap-runc's log filter on stderr, e.g. debug\n\n\
             runc's own options and subcommands follow (gpusnap-runc accepts all of them).",
        );
    for (name, about) in SUBCOMMANDS {
        cmd = cmd.subcommand(
            Command::new(*name)
                .about(*about)
                .disable_help_flag(true)
                .arg(
                    Arg::new("args")
                        .num_args(0..)
                        .trailing_var_arg(true)
                        .allow_hyphen_values(true)
                        .value_name("RUNC ARGS")
                        .help("runc's options and arguments for this subcommand"),
                ),
        );
    }
    cmd
}

/// What `main` does with the first argument: `--help`/`-h` alone prints this usage first;
/// `--generate-man DIR` and `--generate-completion SHELL` write the packaging's files.
pub enum Early {
    /// Print the usage, then go on (runc's help follows).
    Help,
    /// Done: the exit code.
    Exit(i32),
    /// Not ours: hand the command line to the wrapper.
    Run,
}

pub fn early(args: &[std::ffi::OsString]) -> Early {
    let first = args.first().and_then(|a| a.to_str());
    match (first, args.get(1).and_then(|a| a.to_str())) {
        (Some("--help" | "-h" | "-help"), _) if args.len() == 1 => Early::Help,
        (Some("--generate-man"), Some(dir)) => {
            Early::Exit(report(clap_mangen::generate_to(command(), dir)))
        }
        (Some("--generate-completion"), Some(shell)) => match shell.parse::<clap_complete::Shell>()
        {
            Ok(shell) => {
                clap_complete::generate(
                    shell,
                    &mut command(),
                    "gpusnap-runc",
                    &mut std::io::stdout(),
                );
                Early::Exit(0)
            }
            Err(e) => {
                eprintln!("gpusnap-runc: --generate-completion: {e}");
                Early::Exit(2)
            }
        },
        _ => Early::Run,
    }
}

fn report(r: std::io::Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gpusnap-runc: --generate-man: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn usage_is_consistent() {
        super::command().debug_assert();
    }
}
