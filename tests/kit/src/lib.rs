//! `gpusnap-testkit`: the one test kit of the workspace. Every crate's tests use it (as a
//! dev-dependency) instead of launchers and helpers of their own:
//!
//! - [`Rig`] ([`rig`]): a private, real containerd driven through `ctr` (no mocks); [`CriNode`]
//!   ([`cri`]) plays a Kubernetes node on top of one; [`containerd`] is the containerd process
//!   both run on, also usable alone with a config of a test's own;
//! - [`Registry`] ([`registry`]): a private OCI registry on loopback;
//! - [`push_agent`]: the node agent's checkpoint pushes (`gpusnap agent run --checkpoint-dir`)
//!   run as the installer DaemonSet runs them, and a fake Kubernetes API for its events;
//! - [`BusyboxContainer`] ([`bundle`]): a runc-level busybox container for runc, CRIU and
//!   `gpusnap-runc` tests;
//! - [`fixtures`]: a sealed checkpoint directory, a CRI checkpoint archive around it, tree
//!   snapshots and digest helpers;
//! - [`rootfs_diff`]: rootfs diffs of a chosen number of entries;
//! - [`cmd`], [`wait`]: running commands and polling; [`paths`]: where the rig's tools and the
//!   workspace's binaries are ([`paths::binary`]);
//! - [`gpu`]: the CUDA driver double at a chosen version and storage engine, the driver calls
//!   a checkpoint and a restore must make, and checks of a checkpoint's GPU state;
//! - [`checkpoint`], [`scenario`]: checkpoint/restore helpers for `ctr` scenarios and the
//!   both-runtimes harness ([`scenario_tests!`]).
//!
//! # The containerd rig
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
//! Search order (the same for every binary of the workspace, see [`paths::locate_binary`]):
//! 1. `$GPUSNAP_SHIM_BIN` (an explicit path; an error if it does not exist);
//! 2. next to the running test binary's profile directory
//!    (`<target-dir>/<profile>/containerd-shim-gpusnap-v2`, which follows
//!    `CARGO_TARGET_DIR` and `--release`);
//! 3. `<workspace>/target/debug/containerd-shim-gpusnap-v2`.

pub mod allowlist;
pub mod beneath;
pub mod bundle;
pub mod busybox_registry;
pub mod can_fail;
pub mod checkpoint;
pub mod cmd;
pub mod containerd;
pub mod counter;
pub mod cri;
pub mod crictl;
pub mod crio;
pub mod crypt_doors;
pub mod faults;
pub mod fixtures;
pub mod gpu;
pub mod hand_layout;
pub mod ocicrypt;
pub mod paths;
pub mod podman;
pub mod privilege;
pub mod pty;
pub mod push_agent;
pub mod refused_restore;
pub mod registry;
pub mod rig;
pub mod rootfs_diff;
pub mod runc_gpu;
pub mod scenario;
pub mod seccomp;
pub mod signing;
pub mod wait;

pub use bundle::{BusyboxContainer, COUNTER};
pub use cmd::{describe, gpusnap, require_root, run, text, unique, OutputExt, Spawned};
pub use containerd::Containerd;
pub use cri::{CriNode, CriNodeOptions};
pub use paths::{binary, locate_gpusnap_shim, rig_bin_dir, rig_prefix};
pub use registry::Registry;
pub use rig::{ExecOpts, Rig, RigOptions, RunOpts, Runtime, TaskInfo, TaskState};
pub use wait::{wait_for, wait_some, wait_until};
