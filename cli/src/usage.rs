//! Man pages and shell completions, generated from the clap command of `gpusnap` (the
//! packaging's `gpusnap --generate-man DIR` and `--generate-completion SHELL`; users have
//! `gpusnap completion SHELL`). The shim and gpusnap-runc answer the same two flags.

use std::ffi::OsString;

/// Handles `--generate-man DIR` and `--generate-completion SHELL` as the whole command line:
/// the exit code, or `None` for every other command line.
pub fn generate(args: &[OsString], cmd: clap::Command) -> Option<u8> {
    let [flag, value] = args else { return None };
    let name = cmd.get_name().to_owned();
    match flag.to_str()? {
        "--generate-man" => Some(match clap_mangen::generate_to(cmd, value) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{name}: --generate-man {}: {e}", value.to_string_lossy());
                1
            }
        }),
        "--generate-completion" => match value.to_str().map(str::parse::<clap_complete::Shell>) {
            Some(Ok(shell)) => {
                let mut cmd = cmd;
                clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
                Some(0)
            }
            _ => {
                eprintln!(
                    "{name}: --generate-completion: unknown shell {:?} (bash, zsh, fish, \
                         elvish, powershell)",
                    value
                );
                Some(2)
            }
        },
        _ => None,
    }
}
