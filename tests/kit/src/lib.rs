//! `gpusnap-tests`: a test rig that drives a **real** containerd (no mocks).
//!
//! The rig needs what `scripts/setup-env.sh` installs under `/opt/gpusnap-rig`
//! (containerd 2.x, ctr, containerd-shim-runc-v2, CRIU 4.x and the OCI test
//! images) plus Debian's `runc`, and it must run as root.
//!
//! Each [`Rig`] owns a private containerd: its own root/state directories,
//! socket, config and containerd namespace under a fresh temporary directory,
//! so rigs in parallel test threads never see each other. Dropping a rig kills
//! its tasks, stops containerd, kills shims left behind, unmounts what was
//! mounted under its directory and removes it.
//!
//! ```no_run
//! use gpusnap_testkit::{Rig, Runtime};
//! let rig = Rig::start_for(Runtime::RuncV2)?;
//! let out = rig.run(Runtime::RuncV2, "hello", &["echo", "hi"])?;
//! assert_eq!(out.stdout, b"hi\n");
//! # anyhow::Ok(())
//! ```
//!
//! # Where the gpusnap shim comes from
//! containerd turns the runtime name `io.containerd.gpusnap.v2` into the binary
//! name `containerd-shim-gpusnap-v2` and looks it up on its `PATH`. The rig finds
//! the binary (see [`locate_gpusnap_shim`]), links it into `<rig>/bin` and starts
//! containerd with `PATH=<rig>/bin:/opt/gpusnap-rig/bin:<system PATH>`, so the shim
//! is found by containerd and `runc` (run by either shim) finds CRIU 4.x.
//! Search order:
//! 1. `$GPUSNAP_SHIM_BIN` (an explicit path; an error if it does not exist);
//! 2. next to the running test binary's profile directory
//!    (`<target-dir>/<profile>/containerd-shim-gpusnap-v2`, which follows
//!    `CARGO_TARGET_DIR` and `--release`);
//! 3. `<workspace>/target/debug/containerd-shim-gpusnap-v2`.

pub mod checkpoint;
pub mod cmd;
pub mod cri;
pub mod paths;
pub mod pty;
pub mod rig;
pub mod scenario;
pub mod wait;

pub use cmd::{OutputExt, Spawned};
pub use paths::{locate_gpusnap_shim, rig_prefix};
pub use rig::{ExecOpts, Rig, RigOptions, RunOpts, Runtime, TaskInfo, TaskState};
pub use wait::{wait_for, wait_until};
