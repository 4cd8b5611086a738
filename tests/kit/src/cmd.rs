//! Running external commands with deadlines and captured output.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Convenience accessors for [`std::process::Output`].
pub trait OutputExt {
    /// Exit code; `None` if the process was killed by a signal.
    fn code(&self) -> Option<i32>;
    /// stdout, lossily decoded.
    fn stdout_str(&self) -> String;
    /// stderr, lossily decoded.
    fn stderr_str(&self) -> String;
    /// One-line-ish description for assertion messages.
    fn describe(&self) -> String;
}

impl OutputExt for Output {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }
    fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    fn describe(&self) -> String {
        format!(
            "status={} stdout={:?} stderr={:?}",
            self.status,
            truncate(&self.stdout_str(), 2000),
            truncate(&self.stderr_str(), 2000)
        )
    }
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…[{} more bytes]", &s[..cut], s.len() - cut)
}

/// Describe a command line for error messages.
pub fn describe_command(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn reader_thread<R: Read + Send + 'static>(mut r: R, buf: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match r.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    })
}

/// A spawned child whose stdout/stderr are collected in the background while it runs.
pub struct Spawned {
    child: Child,
    desc: String,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    exited: Arc<AtomicBool>,
    status: Option<ExitStatus>,
}

/// Decides when a child's stdin may be closed (see [`Spawned::spawn_gated`]).
pub type StdinGate = Box<dyn FnMut() -> bool + Send>;

/// Longest time a stdin gate is polled before stdin is closed anyway.
const GATE_LIMIT: Duration = Duration::from_secs(60);

impl Spawned {
    /// Spawn `cmd` with piped stdout/stderr. With `stdin = Some(bytes)` the bytes are
    /// written to the child's stdin, which is then closed; with `None` stdin is /dev/null.
    pub fn spawn(cmd: Command, stdin: Option<Vec<u8>>) -> Result<Spawned> {
        match stdin {
            Some(bytes) => Spawned::spawn_inner(cmd, Some((bytes, None))),
            None => Spawned::spawn_inner(cmd, None),
        }
    }

    /// Like [`Spawned::spawn`] with stdin bytes, but stdin is only closed (EOF) once
    /// `gate()` returns true (polled every 20 ms after all bytes were written), or the
    /// child exited, or 60 s passed.
    ///
    /// Why: ctr (2.x) asks the shim to close the container's stdin (`CloseIO`) when it
    /// reads EOF from its own stdin, but only if the task already exists at that moment;
    /// an EOF read earlier is lost and the container never sees EOF. Gating the EOF on
    /// "the task/process is running" avoids that race in ctr.
    pub fn spawn_gated(cmd: Command, stdin: Vec<u8>, gate: StdinGate) -> Result<Spawned> {
        Spawned::spawn_inner(cmd, Some((stdin, Some(gate))))
    }

    fn spawn_inner(
        mut cmd: Command,
        stdin: Option<(Vec<u8>, Option<StdinGate>)>,
    ) -> Result<Spawned> {
        let desc = describe_command(&cmd);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = cmd.spawn().with_context(|| format!("spawning `{desc}`"))?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            reader_thread(child.stdout.take().expect("piped stdout"), stdout.clone()),
            reader_thread(child.stderr.take().expect("piped stderr"), stderr.clone()),
        ];
        let exited = Arc::new(AtomicBool::new(false));
        let writer = match stdin {
            Some((bytes, gate)) => {
                let mut w = child.stdin.take().expect("piped stdin");
                let exited = exited.clone();
                Some(std::thread::spawn(move || {
                    // EPIPE is fine: the child may not read all of it.
                    let _ = w.write_all(&bytes);
                    if let Some(mut gate) = gate {
                        let start = Instant::now();
                        while !exited.load(Ordering::SeqCst)
                            && start.elapsed() < GATE_LIMIT
                            && !gate()
                        {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                    drop(w);
                }))
            }
            None => None,
        };
        Ok(Spawned {
            child,
            desc,
            stdout,
            stderr,
            readers,
            writer,
            exited,
            status: None,
        })
    }

    /// Process id of the child.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// stdout collected so far.
    pub fn stdout_so_far(&self) -> Vec<u8> {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// stderr collected so far.
    pub fn stderr_so_far(&self) -> Vec<u8> {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `Some(status)` once the child has exited.
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Send a signal to the child (not to the container!).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on the pid of our own (not yet reaped) child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// Wait for exit (killing the child at the deadline) and return everything it printed.
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<Output> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.try_status()? {
                self.exited.store(true, Ordering::SeqCst);
                break st;
            }
            if Instant::now() >= deadline {
                self.exited.store(true, Ordering::SeqCst);
                let _ = self.child.kill();
                let _ = self.child.wait();
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                bail!(
                    "`{}` did not finish within {:?}; stdout so far: {:?}; stderr so far: {:?}",
                    self.desc,
                    timeout,
                    truncate(&String::from_utf8_lossy(&self.stdout_so_far()), 2000),
                    truncate(&String::from_utf8_lossy(&self.stderr_so_far()), 2000)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The pipes close when the child (and anything that inherited them) is gone.
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        Ok(Output {
            status,
            stdout: self.stdout_so_far(),
            stderr: self.stderr_so_far(),
        })
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.exited.store(true, Ordering::SeqCst);
        if self.status.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Run `cmd` to completion (at most `timeout`), feeding `stdin` if given.
pub fn run_with_timeout(cmd: Command, stdin: Option<Vec<u8>>, timeout: Duration) -> Result<Output> {
    Spawned::spawn(cmd, stdin)?.wait_timeout(timeout)
}

// ----- plain helpers for tests that run one command and look at its output ------------------

static UNIQUE_SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A name unique to this test process and call: `<prefix>-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        UNIQUE_SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// Whether the test runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the test (never skips it) when it does not run as root.
pub fn require_root() {
    assert!(
        is_root(),
        "this test runs containers, runc, CRIU or containerd: run it as root (CI does)"
    );
}

/// Runs a test body that needs root ([`require_root`]); an error fails the test with its
/// whole chain of causes.
pub fn check(f: impl FnOnce() -> Result<()>) {
    require_root();
    if let Err(e) = f() {
        panic!("{e:#}");
    }
}

/// Bytes as text, lossily.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Status and both streams of `out`, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// Runs `program args...` to completion with stdin closed; panics only when it cannot start.
pub fn run<I, S>(program: impl AsRef<std::ffi::OsStr>, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(program.as_ref())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {:?}: {e}", program.as_ref()))
}

/// Runs `cmd` (stdin closed), panicking with its output unless it succeeds; returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", describe(&out));
    text(&out.stdout)
}

/// `out`'s stdout, trimmed, if `program args` (which it is the output of) succeeded; otherwise
/// an error naming the command, with both streams.
pub fn trimmed_stdout_ok<S: AsRef<std::ffi::OsStr>>(
    program: &str,
    args: &[S],
    out: &Output,
) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.iter()
                .map(|a| a.as_ref().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            describe(out)
        );
    }
    Ok(text(&out.stdout).trim().to_string())
}

/// [`gpusnap`] `args`, which must succeed; its stdout.
pub fn gpusnap_ok(args: &[&str]) -> Result<String> {
    let out = gpusnap(args);
    anyhow::ensure!(
        out.status.success(),
        "`gpusnap {}` failed: {}",
        args.join(" "),
        describe(&out)
    );
    Ok(text(&out.stdout))
}

/// Runs the workspace's `gpusnap` CLI (found by [`crate::paths::binary`]) with `args`, stdin
/// closed.
pub fn gpusnap<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    run(crate::paths::binary("gpusnap"), args)
}
