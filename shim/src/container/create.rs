//! Create: the container's configuration, its rootfs, and either `runc create` or, for a task
//! created from a checkpoint (containerd's, or one the pod's annotations ask for), a restore
//! pending until Start.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use containerd_shim::{asynchronous::io::Stdio, protos::api::Mount};
use gpusnap_transaction::bundle_spec::{BundleSpec, SpecAtCreate};
use tokio::sync::Mutex;

use super::{
    rootfs::{mount_rootfs, unmount_rootfs},
    runc_failure,
    stdio_setup::{read_pid, StdioSetup},
    Container, Live, OomHook,
};
use crate::{
    errors::*,
    options::RuntimeSettings,
    process::Process,
    state::{InitState, PendingRestore},
};

/// What Create asks for, in the shim's terms.
pub struct CreateSpec<'a> {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: &'a [Mount],
    pub stdio: Stdio,
    pub settings: RuntimeSettings,
    /// containerd's checkpoint to restore at Start (`ctr run --checkpoint`, CRI restore).
    pub checkpoint: Option<PathBuf>,
    pub parent_checkpoint: Option<PathBuf>,
    pub on_oom: OomHook,
}

impl Container {
    pub async fn create(req: CreateSpec<'_>) -> Result<Self> {
        let CreateSpec {
            id,
            bundle,
            rootfs,
            stdio,
            settings,
            checkpoint,
            parent_checkpoint,
            on_oom,
        } = req;
        settings.save(&bundle).map_err(|e| {
            internal(format!(
                "write runtime settings into bundle {}: {e}",
                bundle.display()
            ))
        })?;
        let runc = Arc::new(settings.runc(&bundle).map_err(|e| {
            failed_precondition(format!(
                "runc binary {:?} is not usable ({e}); install runc or set BinaryName in the runtime options",
                settings.runc_binary
            ))
        })?);
        // Read once, as the transaction reads it (`SpecAtCreate`: a spec the types refuse
        // keeps its annotations; an unreadable one has none and runc refuses it).
        let SpecAtCreate {
            typed: spec,
            annotations,
        } = SpecAtCreate::read(&bundle);
        let config = load_config(&settings, &annotations)?;
        if spec.as_ref().is_some_and(BundleSpec::has_nvidia_devices) {
            gpusnap_transaction::gpu::prewarm_driver(&config.cuda.library);
        }
        let mounted = mount_rootfs(&bundle, rootfs)?;
        let unmount = || {
            if mounted {
                unmount_rootfs(&bundle);
            }
        };
        let restore = match checkpoint {
            // A pod can ask to start from a node-local checkpoint (restore_from.rs) or from a
            // checkpoint image it mounts as an image volume, both resolved by the transaction.
            None => crate::restore_from::pending_restore(spec.as_ref(), &annotations, &config)
                .map_err(|e| invalid_argument(e.to_string()))
                .inspect_err(|_| unmount())?,
            Some(image) => Some(PendingRestore {
                image,
                parent: parent_checkpoint,
                rootfs_diff: None,
                // containerd passes only the directory (`ctr`, CRI): its own signature decides.
                signature_evidence: Default::default(),
                volume: None,
            }),
        };
        let mut init = Process::new("", stdio);
        let state = match restore {
            Some(r) => InitState::CreatedFromCheckpoint(r),
            None => {
                if let Err(e) = runc_create(&id, &bundle, &settings, &runc, &mut init).await {
                    unmount();
                    return Err(e);
                }
                InitState::Created
            }
        };
        let c = Container {
            id,
            bundle,
            settings,
            config,
            runc,
            on_oom,
            live: Mutex::new(Live {
                state,
                init,
                execs: HashMap::new(),
                rootfs_mounted: mounted,
                deferred_init_exit: None,
                oom: None,
                kill_all_on_exit: !spec.as_ref().is_some_and(BundleSpec::has_own_pid_namespace),
            }),
        };
        {
            let mut live = c.live.lock().await;
            if matches!(live.state, InitState::Created) {
                // The cgroup exists from `runc create`: count OOM kills from now, so a
                // workload killed right after start is reported too.
                c.watch_oom(&mut live);
            }
        }
        Ok(c)
    }

    /// The image volume a restore pending from Create copies its checkpoint from: the node's
    /// cache of copies and the volume's mount.
    pub fn pending_volume(&mut self) -> Option<(PathBuf, PathBuf)> {
        match &self.live.get_mut().state {
            InitState::CreatedFromCheckpoint(PendingRestore {
                volume: Some(v), ..
            }) => Some((v.cache.clone(), v.mount.clone())),
            _ => None,
        }
    }
}

/// `runc create` of the init, with its stdio.
async fn runc_create(
    id: &str,
    bundle: &Path,
    settings: &RuntimeSettings,
    runc: &runc::Runc,
    init: &mut Process,
) -> Result<()> {
    let setup = StdioSetup::new(init)?;
    let pid_file = bundle.join("init.pid");
    let opts = runc::options::CreateOpts {
        io: Some(setup.pipes.clone()),
        pid_file: Some(pid_file.clone()),
        console_socket: setup.console_path(),
        no_pivot: settings.no_pivot_root,
        no_new_keyring: settings.no_new_keyring,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    if let Err(e) = runc.create(id, bundle, Some(&opts)).await {
        setup.abandon(init).await;
        return Err(runc_failure(bundle, "runc create", &e));
    }
    init.pid = read_pid(&pid_file)?;
    setup.finish(init).await?;
    tracing::info!(
        id,
        pid = init.pid,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "container created"
    );
    Ok(())
}

/// gpusnap's configuration for this container: the file (CRI's ConfigPath, else
/// `$GPUSNAP_CONFIG`, else the default path), overlaid by the container's `gpusnap.io/`
/// annotations. Invalid settings fail Create with the message naming the setting.
fn load_config(
    settings: &RuntimeSettings,
    annotations: &HashMap<String, String>,
) -> Result<gpusnap_config::Config> {
    let path = settings
        .config_path
        .clone()
        .or_else(|| std::env::var_os("GPUSNAP_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(gpusnap_config::DEFAULT_CONFIG_PATH));
    gpusnap_transaction::container_config::for_container(&path, annotations)
        .map_err(|e| invalid_argument(e.to_string()))
}
