//! Named points where a test build stops, so that a fault-injection test can SIGKILL the
//! runtime (or runc, or CRIU) at exactly that phase.
//!
//! Compiled in only with the `failpoints` feature (the workspace's test builds enable it
//! through `gpusnap-tests`' dev-dependency; release and package builds do not), and inert
//! even then unless `GPUSNAP_FAILPOINTS` names a directory: a point `NAME` then stops when
//! `<dir>/arm-NAME` exists (the test creates it, so one containerd serves every case), writes
//! the process's pid to `<dir>/reached-NAME` and blocks until it is killed. An arm file that
//! holds `sleep SECONDS` makes the point wait that long and go on instead (a phase that takes
//! too long, for the deadline's tests).

/// Before the CRIU dump (the container is frozen already when `exit` was asked for).
pub const BEFORE_DUMP: &str = "checkpoint-before-dump";
/// After the dump, before the image is sealed.
pub const BEFORE_SEAL: &str = "checkpoint-before-seal";
/// The image is sealed; the container is not yet killed (`exit`).
pub const AFTER_SEAL: &str = "checkpoint-after-seal";
/// Before `runc restore` runs.
pub const BEFORE_RESTORE: &str = "restore-before-criu";
/// `runc restore` returned and the container runs; the GPU state is not yet restored and the
/// caller not yet told.
pub const AFTER_CRIU: &str = "restore-after-criu";

/// Mid-copy of an image volume's checkpoint onto the node: after a file was copied (or the
/// chunked files assembled), before the next.
pub const VOLUME_COPYING: &str = "restore-volume-copying";

/// The point at the end of a restore phase: `restore-after-<phase>` (`restore-after-validate`,
/// ...), before the deadline is checked.
pub fn after_phase(phase: crate::deadline::Phase) -> String {
    format!("restore-after-{phase}")
}

/// Stops here when the test asked for `name` (see the module docs); otherwise returns at once.
#[cfg(feature = "failpoints")]
pub fn reached(name: &str) {
    let Some(dir) = std::env::var_os("GPUSNAP_FAILPOINTS").map(std::path::PathBuf::from) else {
        return;
    };
    let Ok(arm) = std::fs::read_to_string(dir.join(format!("arm-{name}"))) else {
        return;
    };
    if let Some(secs) = arm.trim().strip_prefix("sleep ") {
        let secs: f64 = secs.trim().parse().unwrap_or(0.0);
        tracing::warn!(failpoint = name, secs, "failpoint reached: sleeping");
        std::thread::sleep(std::time::Duration::from_secs_f64(secs.max(0.0)));
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
