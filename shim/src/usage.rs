//! The shim's own usage. containerd starts the shim with Go-style flags that the
//! containerd-shim crate parses; this clap command only describes them, for `--help`, the man
//! page (`--generate-man DIR`) and shell completions (`--generate-completion SHELL`).

use clap::{Arg, ArgAction, Command};

/// The command line as containerd gives it.
pub fn command() -> Command {
    let flag = |name: &'static str, value: &'static str, help: &'static str| {
        Arg::new(name).long(name).value_name(value).help(help)
    };
    Command::new(env!("CARGO_BIN_NAME"))
        .version(env!("CARGO_PKG_VERSION"))
        .about("containerd shim v2 for the runtime io.containerd.gpusnap.v2")
        .long_about(
            "containerd starts this shim for containers of the runtime io.containerd.gpusnap.v2 \
             (the CRI handler `gpusnap` that `gpusnap install` registers); it is not run by \
             hand. It runs containers through runc and checkpoints and restores them, GPU \
             state included. Its configuration is the file named by the runtime's \
             options.ConfigPath, else $GPUSNAP_CONFIG, else /etc/gpusnap/config.toml. \
             containerd passes the flags with one dash (-namespace NS).",
        )
        .override_usage(
            "containerd-shim-gpusnap-v2 -namespace NS -address ADDR -id ID \
             [-publish-binary BIN] [-bundle DIR] [-debug] start|delete\n       \
             containerd-shim-gpusnap-v2 -v",
        )
        .disable_version_flag(true)
        .arg(
            Arg::new("version")
                .short('v')
                .long("version")
                .action(ArgAction::Version)
                .help("Print the shim's version and runtime type"),
        )
        .arg(flag(
            "namespace",
            "NS",
            "containerd namespace of the container",
        ))
        .arg(flag("address", "ADDR", "containerd's ttrpc address"))
        .arg(flag("id", "ID", "the task's id"))
        .arg(flag(
            "publish-binary",
            "BIN",
            "binary the shim publishes events with",
        ))
        .arg(flag("bundle", "DIR", "the OCI bundle"))
        .arg(flag("socket", "ADDR", "the shim's own socket address"))
        .arg(
            Arg::new("debug")
                .long("debug")
                .action(ArgAction::SetTrue)
                .help("Debug logging"),
        )
        .arg(
            Arg::new("action")
                .value_parser(["start", "delete"])
                .help("start: start a shim and print its address; delete: clean up a task's state"),
        )
        .after_help(
            "Environment:\n  GPUSNAP_CONFIG  gpusnap config file when options.ConfigPath is unset",
        )
}

/// `--help`, `--generate-man DIR` and `--generate-completion SHELL`, which containerd never
/// passes: the exit code, or `None` for containerd's command lines.
pub fn early(args: &[String]) -> Option<i32> {
    match (args.first().map(String::as_str), args.get(1)) {
        (Some("--help" | "-h" | "-help"), _) if args.len() == 1 => {
            println!("{}", command().render_long_help());
            Some(0)
        }
        (Some("--generate-man"), Some(dir)) => {
            Some(match clap_mangen::generate_to(command(), dir) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("--generate-man: {e}");
                    1
                }
            })
        }
        (Some("--generate-completion"), Some(shell)) => match shell.parse::<clap_complete::Shell>()
        {
            Ok(shell) => {
                clap_complete::generate(
                    shell,
                    &mut command(),
                    env!("CARGO_BIN_NAME"),
                    &mut std::io::stdout(),
                );
                Some(0)
            }
            Err(e) => {
                eprintln!("--generate-completion: {e}");
                Some(2)
            }
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn usage_is_consistent() {
        super::command().debug_assert();
    }
}
