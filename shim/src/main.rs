//! `containerd-shim-gpusnap-v2`: a containerd shim v2 that runs containers through runc and
//! checkpoints/restores them (CPU state through CRIU; GPU state through gpusnap's engines).

mod checkpoint;
mod console;
mod container;
mod containers;
mod errors;
mod events;
mod oom;
mod options;
mod process;
mod reaper;
mod restore_from;
mod service;
mod state;
mod stats;
mod stdio;
mod task;
mod usage;

/// The runtime type containerd uses to find this binary (`containerd-shim-gpusnap-v2`).
pub const RUNTIME_ID: &str = "io.containerd.gpusnap.v2";

#[tokio::main]
async fn main() {
    // Flags of the operator's, which containerd never passes (the shim crate refuses them).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = usage::early(&args) {
        std::process::exit(code);
    }
    // containerd asks `-v` to learn the shim version; the shim crate handles every other flag.
    if std::env::args()
        .skip(1)
        .any(|a| a == "-v" || a == "--version")
    {
        println!(
            "{}:\n  Version: {}\n  Runtime: {}",
            env!("CARGO_BIN_NAME"),
            env!("CARGO_PKG_VERSION"),
            RUNTIME_ID
        );
        return;
    }
    containerd_shim::asynchronous::run::<service::Service>(RUNTIME_ID, None).await;
}
