//! Driver initialisation started early on its own thread.
//!
//! On restore, loading libcuda and `cuInit` take hundreds of milliseconds on
//! real hosts. They do not depend on CRIU, so the caller starts them first and
//! joins them once CRIU has restored the process tree.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Driver, DriverConfig, LoadError};

/// A driver being loaded on a background thread.
#[derive(Debug)]
pub struct PendingDriver {
    state: Pending,
    started: Instant,
}

#[derive(Debug)]
enum Pending {
    Running(mpsc::Receiver<Result<Arc<Driver>, LoadError>>),
    NotStarted(LoadError),
}

impl PendingDriver {
    /// Starts `Driver::load(config)` on a thread named `gpusnap-cuda-init`.
    pub fn spawn(config: DriverConfig) -> Self {
        Self::spawn_with(move || Driver::load(&config).map(Arc::new))
    }

    /// Starts `load` (e.g. a cached load) on a thread named `gpusnap-cuda-init`.
    pub fn spawn_with(
        load: impl FnOnce() -> Result<Arc<Driver>, LoadError> + Send + 'static,
    ) -> Self {
        let started = Instant::now();
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("gpusnap-cuda-init".into())
            .spawn(move || {
                // The receiver may be gone if the caller gave up; nothing to do then.
                let _ = tx.send(load());
            });
        let state = match spawned {
            Ok(_) => Pending::Running(rx),
            Err(e) => Pending::NotStarted(LoadError::Thread {
                reason: e.to_string(),
            }),
        };
        Self { state, started }
    }

    /// Waits at most `limit` for the load to finish. Returns the driver and how
    /// long this call blocked (0 when initialisation fully overlapped).
    pub fn join(self, limit: Duration) -> Result<(Arc<Driver>, Duration), LoadError> {
        let waiting = Instant::now();
        let rx = match self.state {
            Pending::Running(rx) => rx,
            Pending::NotStarted(e) => return Err(e),
        };
        match rx.recv_timeout(limit) {
            Ok(Ok(driver)) => {
                let waited = waiting.elapsed();
                tracing::debug!(
                    waited_ms = waited.as_secs_f64() * 1e3,
                    since_start_ms = self.started.elapsed().as_secs_f64() * 1e3,
                    "CUDA driver initialisation joined"
                );
                Ok((driver, waited))
            }
            Ok(Err(e)) => Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(LoadError::InitTimeout {
                waited_ms: waiting.elapsed().as_millis() as u64,
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(LoadError::Thread {
                reason: "the initialisation thread exited without a result (it panicked)".into(),
            }),
        }
    }
}

/// Either a driver already at hand or one still loading.
#[derive(Debug)]
pub enum ReadyOrPending {
    Ready(Arc<Driver>),
    Pending(PendingDriver),
}

impl From<PendingDriver> for ReadyOrPending {
    fn from(p: PendingDriver) -> Self {
        Self::Pending(p)
    }
}

impl From<Arc<Driver>> for ReadyOrPending {
    fn from(d: Arc<Driver>) -> Self {
        Self::Ready(d)
    }
}

impl ReadyOrPending {
    /// See [`PendingDriver::join`].
    pub fn join(self, limit: Duration) -> Result<(Arc<Driver>, Duration), LoadError> {
        match self {
            Self::Ready(d) => Ok((d, Duration::ZERO)),
            Self::Pending(p) => p.join(limit),
        }
    }
}
