//! `gpusnap-runc`: runc for CRI-O and Podman, with gpusnap's checkpoint manifest and restore
//! checks. See `gpusnap_cli::runc_wrapper`.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    std::process::exit(gpusnap_cli::runc_wrapper::main(args));
}
