//! Named points where a test build stops, so that a fault-injection test can SIGKILL the
//! runtime (or runc, or CRIU) at exactly that phase.
//!
//! Compiled in only with the `failpoints` feature (the workspace's test builds enable it
//! through `gpusnap-tests`' dev-dependency; release and package builds do not), and inert
//! even then unless `GPUSNAP_FAILPOINTS` names a directory: a point `NAME` then stops when
//! `<dir>/arm-NAME` exists (the test creates it, so one containerd serves every case), writes
//! the process's pid to `<dir>/reached-NAME` and blocks until it is killed.

/// Before the CRIU dump (the container is frozen already when `exit` was asked for).
pub const BEFORE_DUMP: &str = "checkpoint-before-dump";
/// After the dump, before the image is sealed.
pub const BEFORE_SEAL: &str = "checkpoint-before-seal";
/// The image is sealed; the container is not yet killed (`exit`).
pub const AFTER_SEAL: &str = "checkpoint-after-seal";
/// Before `runc restore` runs.
pub const BEFORE_RESTORE: &str = "restore-before-criu";

/// Stops here when the test asked for `name` (see the module docs); otherwise returns at once.
#[cfg(feature = "failpoints")]
pub fn reached(name: &str) {
    let Some(dir) = std::env::var_os("GPUSNAP_FAILPOINTS").map(std::path::PathBuf::from) else {
        return;
    };
    if !dir.join(format!("arm-{name}")).exists() {
        return;
    }
    let tmp = dir.join(format!(".reached-{name}.{}", std::process::id()));
    if std::fs::write(&tmp, std::process::id().to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(format!("reached-{name}")));
    }
    tracing::warn!(failpoint = name, "failpoint reached: waiting to be killed");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn reached(_name: &str) {}
