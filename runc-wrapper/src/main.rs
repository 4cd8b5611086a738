//! `gpusnap-runc`: runc for CRI-O and Podman, with gpusnap's checkpoint and restore
//! transactions. See the `gpusnap_runc` library.

mod usage;

use std::io::Write as _;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match usage::early(&args) {
        usage::Early::Exit(code) => std::process::exit(code),
        usage::Early::Help => {
            // Ours first, then runc's (the wrapper execs `runc --help`).
            let mut out = std::io::stdout();
            let _ = write!(out, "{}\n\n", usage::command().render_help());
            let _ = out.flush();
        }
        usage::Early::Run => {}
    }
    std::process::exit(gpusnap_runc::main(args));
}
