//! Polling helpers: prefer these over fixed sleeps.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Poll `f` until it returns true or `timeout` passes; returns whether it became true.
/// Polls quickly at first (10 ms), backing off to 100 ms.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Poll `f` until it yields `Ok(Some(v))`; errors from `f` are retried until the
/// deadline. The error names `what` and the last value/error seen.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let mut last = String::from("(never polled)");
    let ok = wait_until(timeout, || match f() {
        Ok(Some(_)) => true,
        Ok(None) => {
            last = "condition not met".into();
            false
        }
        Err(e) => {
            last = format!("{e:#}");
            false
        }
    });
    if ok {
        // Re-poll once to hand out the value (conditions here are monotonic).
        if let Ok(Some(v)) = f() {
            return Ok(v);
        }
    }
    bail!("timed out after {timeout:?} waiting for {what}; last: {last}")
}

/// Polls `f` until it yields `Some` (returned) or `timeout` passes (`None`). The value is the
/// one `f` returned, not a second poll, so it suits values that change between polls.
pub fn wait_some<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let mut got = None;
    wait_until(timeout, || {
        got = f();
        got.is_some()
    });
    got
}
