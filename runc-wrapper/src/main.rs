//! `gpusnap-runc`: runc for CRI-O and Podman, with gpusnap's checkpoint and restore
//! transactions. See the `gpusnap_runc` library.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    std::process::exit(gpusnap_runc::main(args));
}
