//! The workload the front-door tests share: a shell counter carrying the test's run token and
//! a random process token, and the checks that a restored process is the checkpointed one and
//! keeps counting.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

/// The workload, run as `sh -c COUNTER <run token>` ([`counter_command`]): `$0` is the run
/// token the test drew ([`run_token`]), so a count proves which test's container it came from;
/// a random process token drawn at start is kept in shell memory. Writes `"<run>:<process>
/// <n>"` to /tmp/count ten times a second. A restored process goes on with the same tokens
/// from where it was; a fresh start draws a new process token and starts from 1. Each round
/// overwrites the file in place (`1<>` does not truncate) with one write of fixed width, as
/// [`crate::bundle::COUNTER`] does: a dump never leaves the file empty, and its size never
/// changes (CRIU refuses to restore an open file whose size differs from the dump's).
pub const COUNTER: &str = "tok=\"$0:$(cat /proc/sys/kernel/random/uuid)\"; i=0; \
     while true; do i=$((i+1)); printf '%s %010d\\n' \"$tok\" $i 1<>/tmp/count; sleep 0.1; done";
/// The file the counter writes, inside its container.
pub const COUNT_FILE: &str = "/tmp/count";

/// How far the counter gets before a checkpoint: a restart could not pass for a continuation.
pub const WARM: u64 = 10;

/// A fresh run token: random, no `:` or space, unique to one test's container.
pub fn run_token() -> String {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_default();
    let hex: String = uuid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    format!("run{hex}")
}

/// `sh -c COUNTER <run>`.
pub fn counter_command(run: &str) -> Vec<String> {
    ["sh", "-c", COUNTER, run].map(String::from).to_vec()
}

/// The counter as one script with `run` in place of `$0`, for callers that run
/// `/bin/sh -c <script>` without further arguments.
pub fn counter_script(run: &str) -> String {
    COUNTER.replace("$0", run)
}

/// The counter's last report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Count {
    /// `<run>:<process>`.
    pub token: String,
    pub n: u64,
}

impl Count {
    /// The run token the test started the counter with.
    pub fn run(&self) -> &str {
        self.token.split_once(':').map_or("", |(run, _)| run)
    }
}

/// `"<run>:<process> <n>"` as the counter writes it.
pub fn parse_count(text: &str) -> Option<Count> {
    let (token, n) = text.trim().split_once(' ')?;
    Some(Count {
        token: token.to_string(),
        n: n.parse().ok()?,
    })
}

/// Waits (30 s at most) until `read` gives a count of at least `min` of the counter started
/// with run token `run`; a count of another run (another test's container, or a counter
/// started without this run's token) is an error at once.
pub fn wait_count(
    run: &str,
    what: &str,
    min: u64,
    mut read: impl FnMut() -> Option<Count>,
) -> Result<Count> {
    let mut last = None;
    let mut foreign = None;
    let got = crate::wait::wait_some(Duration::from_secs(30), || {
        let c = read();
        if let Some(c) = &c {
            if c.run() != run {
                foreign = Some(c.clone());
                return Some(c.clone());
            }
            last = Some(c.clone());
        }
        c.filter(|c| c.n >= min)
    });
    if let Some(f) = foreign {
        bail!(
            "the counter of {what} belongs to another run ({f:?}); this test started it with \
             run token {run}"
        );
    }
    got.with_context(|| format!("the counter of {what} did not reach {min}; last read {last:?}"))
}

/// The restored workload is the checkpointed process: same token, counting on from at least
/// the value it had at the checkpoint, and it keeps counting.
pub fn check_continues(
    what: &str,
    checkpointed: &Count,
    mut read: impl FnMut() -> Option<Count>,
) -> Result<Count> {
    let now = wait_count(checkpointed.run(), what, 0, &mut read)?;
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
    let later = wait_count(checkpointed.run(), what, now.n + 3, &mut read)?;
    ensure!(
        later.token == checkpointed.token,
        "{what} restarted after the restore"
    );
    Ok(later)
}

/// The counter in a file (`None` while absent).
pub fn count_in_file(path: &Path) -> Option<Count> {
    parse_count(&std::fs::read_to_string(path).ok()?)
}

/// The counter of the container whose init is host pid `pid`, read through its root.
pub fn count_of(pid: u32) -> Option<Count> {
    count_in_file(Path::new(&format!("/proc/{pid}/root/tmp/count")))
}

/// Pauses a container at a moment when none of its processes holds `path` (a path inside the
/// container) open, for a checkpoint whose restore gets the image's rootfs afresh (`ctr`
/// without `--rw`, a node-local `ctr tasks checkpoint`): a dump that catches the counter inside
/// its write records the file as open, and CRIU cannot reopen it where the rootfs lacks it.
/// `procs` gives the container's init pid and every pid in it. Resume it after the checkpoint
/// (`ctr tasks checkpoint` leaves a paused task paused).
pub fn pause_holding_no(
    path: &str,
    pause: &dyn Fn() -> Result<()>,
    resume: &dyn Fn() -> Result<()>,
    procs: &dyn Fn() -> Result<(u32, Vec<u32>)>,
) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let file_id = |m: std::fs::Metadata| (m.dev(), m.ino());
    for _ in 0..100 {
        pause()?;
        let (init, pids) = procs()?;
        // Compared by device and inode: an fd's link text is a host path.
        let target = std::fs::metadata(format!("/proc/{init}/root{path}"))
            .ok()
            .map(file_id);
        let held = target.is_some_and(|target| {
            pids.iter().any(|p| {
                std::fs::read_dir(format!("/proc/{p}/fd"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| file_id(m) == target))
            })
        });
        if !held {
            return Ok(());
        }
        resume()?;
        std::thread::sleep(Duration::from_millis(7));
    }
    bail!("{path} was held open at each of 100 pauses")
}

/// A shell workload holding about 45 MB of `seq` text twice, compared with each other and with
/// the first length every 0.2 s without a fork (a forked subshell would share the memory
/// copy-on-write); `/tmp/state` says `ROUND ok` or `ROUND bad`. A zero-filled area reads as two
/// empty strings, so memory a restore failed to write shows as `bad`.
pub const MEMORY_HOLDER: &str = "X=$(seq 1 6000000); Y=\"$X\"; L=${#X}; i=0; \
    while :; do i=$((i+1)); \
    if [ \"$X\" = \"$Y\" ] && [ ${#X} -eq $L ]; then echo \"$i ok\" > /tmp/state; \
    else echo \"$i bad\" > /tmp/state; fi; sleep 0.2; done";

/// Where [`MEMORY_HOLDER`] writes its state.
pub const MEMORY_STATE_FILE: &str = "/tmp/state";

/// [`MEMORY_HOLDER`]'s state line: (round, whether the copies matched).
pub fn parse_memory_state(line: &str) -> Option<(u64, bool)> {
    let mut it = line.split_whitespace();
    let n = it.next()?.parse().ok()?;
    Some((n, it.next()? == "ok"))
}
