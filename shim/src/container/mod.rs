//! A container the shim runs, and every operation on it: like containerd-shim-runc-v2's
//! `runc/container.go`, the Task service finds the container and calls it; the container asks
//! its init's state ([`InitState`]) whether the operation may happen, runs runc, and records
//! the result. Each operation lives in the module named for it; the Task service publishes
//! the events.
//!
//! The container's live part (init state, processes) is behind its own lock, held only
//! between runc calls, never across one: a long checkpoint or restore leaves State, Pids and
//! exit handling free to run, and a second checkpoint is refused by the state, not queued.

mod checkpoint;
mod create;
mod delete;
mod exec;
mod exit;
mod kill;
mod pause;
mod query;
mod restore;
mod rootfs;
mod start;
mod stdio_setup;

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use gpusnap_criu_bridge::classify_runc_error;
use tokio::sync::{Mutex, MutexGuard};

pub use create::CreateSpec;
pub use exit::{Exit, ExitOutcome};
pub use query::{PidInfo, ProcessView};
pub use rootfs::unmount_rootfs;

use crate::{
    errors::*, oom::OomWatch, options::RuntimeSettings, process::Process, state::InitState,
};

/// What the container calls when the kernel OOM-kills one of its processes (the Task service
/// publishes TaskOOM).
pub type OomHook = Arc<dyn Fn() + Send + Sync>;

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    settings: RuntimeSettings,
    config: gpusnap_config::Config,
    runc: Arc<runc::Runc>,
    on_oom: OomHook,
    live: Mutex<Live>,
}

/// The part of a container that operations change.
struct Live {
    /// The init's lifecycle; [`InitState`] holds every transition.
    state: InitState,
    /// The init's pid, stdio and exit.
    init: Process,
    execs: HashMap<String, Process>,
    rootfs_mounted: bool,
    /// Exit status of init, held back while execs still run so that their exits reach
    /// containerd first.
    deferred_init_exit: Option<i32>,
    oom: Option<OomWatch>,
    /// The container shares a PID namespace (pod, host, another container): when its init
    /// exits, its other processes are killed before the exit is reported.
    kill_all_on_exit: bool,
}

impl Live {
    fn process(&self, exec_id: &str) -> Option<&Process> {
        if exec_id.is_empty() {
            Some(&self.init)
        } else {
            self.execs.get(exec_id)
        }
    }

    fn running_execs(&self) -> usize {
        self.execs.values().filter(|p| p.is_alive()).count()
    }
}

/// The last error runc wrote to its JSON log, which says what went wrong far better than
/// its exit status.
fn runc_log_error(bundle: &std::path::Path) -> Option<String> {
    gpusnap_criu_bridge::runc_log_error(&RuntimeSettings::runc_log(bundle))
}

/// runc's failure of `action`, as NotFound when runc says the container is gone.
fn runc_failure(bundle: &std::path::Path, action: &str, err: &runc::error::Error) -> Error {
    let detail = runc_log_error(bundle).unwrap_or_else(|| runc_error_text(err));
    let msg = format!("{action}: {detail}");
    if classify_runc_error(&detail).is_not_found() {
        not_found(msg)
    } else {
        internal(msg)
    }
}

impl Container {
    async fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().await
    }

    /// The init's pid (0 before it exists).
    pub async fn init_pid(&self) -> u32 {
        self.live().await.init.pid as u32
    }

    /// Counts OOM kills in the init's cgroup from now on.
    fn watch_oom(&self, live: &mut Live) {
        let hook = self.on_oom.clone();
        live.oom = crate::oom::watch(live.init.pid as u32, move || hook());
    }

    /// The runc command line (global flags) this container's runc client uses, for the
    /// checkpoint and restore transactions.
    fn runc_global(&self) -> gpusnap_criu_bridge::RuncGlobal {
        gpusnap_criu_bridge::RuncGlobal {
            binary: PathBuf::from(&self.settings.runc_binary),
            root: Some(self.settings.runc_root.clone()),
            log: Some(RuntimeSettings::runc_log(&self.bundle)),
            systemd_cgroup: self.settings.systemd_cgroup,
            criu_dir: self.config.criu.binary_dir.clone(),
            ..Default::default()
        }
    }

    /// runc's failure of `action`, as NotFound when runc says the container is gone.
    fn runc_failure(&self, action: &str, err: &runc::error::Error) -> Error {
        runc_failure(&self.bundle, action, err)
    }

    fn exec_not_found(&self, exec_id: &str) -> Error {
        not_found(format!("exec {exec_id} not found in container {}", self.id))
    }

    fn not_running(&self) -> Error {
        failed_precondition(format!("container {} is not running", self.id))
    }

    /// Reconciles the state with the cgroup, when something other than this shim froze or
    /// thawed it.
    fn reconcile_frozen(live: &mut Live) {
        if let Some(frozen) = gpusnap_transaction::cgroup::frozen(live.init.pid as u32) {
            live.state.reconcile(frozen);
        }
    }
}
