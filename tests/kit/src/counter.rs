//! The workload the front-door tests share: a shell counter with a random token, and the
//! checks that a restored process is the checkpointed one and keeps counting.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

/// The workload: a random token kept in shell memory and a counter, written to /tmp/count ten
/// times a second. A restored process goes on with the same token from where it was; a fresh
/// start draws a new token and starts from 1.
pub const COUNTER: &str = "tok=$(cat /proc/sys/kernel/random/uuid); i=0; \
     while true; do i=$((i+1)); echo \"$tok $i\" > /tmp/count; sleep 0.1; done";
/// How far the counter gets before a checkpoint: a restart could not pass for a continuation.
pub const WARM: u64 = 10;

/// The counter's last report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Count {
    pub token: String,
    pub n: u64,
}

/// `"<token> <n>"` as the counter writes it.
pub fn parse_count(text: &str) -> Option<Count> {
    let (token, n) = text.trim().split_once(' ')?;
    Some(Count {
        token: token.to_string(),
        n: n.parse().ok()?,
    })
}

/// Waits (30 s at most) until `read` gives a count of at least `min`.
pub fn wait_count(what: &str, min: u64, mut read: impl FnMut() -> Option<Count>) -> Result<Count> {
    let mut last = None;
    crate::wait::wait_some(Duration::from_secs(30), || {
        let c = read();
        if c.is_some() {
            last.clone_from(&c);
        }
        c.filter(|c| c.n >= min)
    })
    .with_context(|| format!("the counter of {what} did not reach {min}; last read {last:?}"))
}

/// The restored workload is the checkpointed process: same token, counting on from at least
/// the value it had at the checkpoint, and it keeps counting.
pub fn check_continues(
    what: &str,
    checkpointed: &Count,
    mut read: impl FnMut() -> Option<Count>,
) -> Result<Count> {
    let now = wait_count(what, 0, &mut read)?;
    ensure!(
        now.token == checkpointed.token,
        "{what} runs a new process (token {}, checkpointed {})",
        now.token,
        checkpointed.token
    );
    ensure!(
        now.n >= checkpointed.n,
        "{what} counts from {}, below the checkpointed {}",
        now.n,
        checkpointed.n
    );
    let later = wait_count(what, now.n + 3, &mut read)?;
    ensure!(
        later.token == checkpointed.token,
        "{what} restarted after the restore"
    );
    Ok(later)
}

/// The counter in a file (`None` while absent or caught between truncate and write).
pub fn count_in_file(path: &Path) -> Option<Count> {
    parse_count(&std::fs::read_to_string(path).ok()?)
}

/// The counter of the container whose init is host pid `pid`, read through its root.
pub fn count_of(pid: u32) -> Option<Count> {
    count_in_file(Path::new(&format!("/proc/{pid}/root/tmp/count")))
}
