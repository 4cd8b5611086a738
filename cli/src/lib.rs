//! gpusnap's operator tools.
//!
//! `gpusnap`: [`install`] (register the runtime with containerd, CRI-O and Podman, revertibly),
//! [`doctor`] (what this node can and cannot do), [`inspect`] (what a checkpoint holds and
//! whether it would be restored), [`image_cmd`] (`gpusnap image build|push|pull`: OCI
//! checkpoint images in a registry) and [`checkpoint_cmd`] (`gpusnap checkpoint sign|verify`:
//! a checkpoint's own signature; [`adopt`]: `gpusnap checkpoint adopt`, a checkpoint made
//! this node's for restores by pod annotation). [`checkpoint_push`] is the node agent's half that
//! pushes the kubelet's checkpoint archives of pods annotated `gpusnap.io/checkpoint-to`.

pub mod adopt;
pub mod checkpoint_cmd;
pub mod checkpoint_push;
pub mod cri;
pub mod doctor;
pub mod fsutil;
pub mod hints;
pub mod host;
pub mod image_cmd;
pub mod inspect;
pub mod install;
pub mod kube;
pub mod logging;
pub mod progress;
pub mod store_cmd;
pub mod term;
pub mod usage;

/// gpusnap's version, shown by `--version` and recorded in install state.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The CRI runtime handler name (`RuntimeClass.handler`) gpusnap registers.
pub const HANDLER: &str = "gpusnap";
/// containerd runtime type of the gpusnap shim.
pub const RUNTIME_TYPE: &str = "io.containerd.gpusnap.v2";
/// Binary containerd derives from [`RUNTIME_TYPE`].
pub const SHIM_BINARY: &str = "containerd-shim-gpusnap-v2";
/// The runc wrapper for CRI-O and Podman.
pub const RUNC_WRAPPER_BINARY: &str = "gpusnap-runc";
/// Pod annotations CRI copies into the OCI spec for the gpusnap runtime.
pub const POD_ANNOTATIONS: &str = "gpusnap.io/*";
