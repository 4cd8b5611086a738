//! Running tools: how a caller runs a short-lived program to completion ([`RunTool`]), and
//! spawning helpers that survive a just-written binary.

use std::io;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::Duration;

/// How often a spawn is retried when the binary is busy.
const ETXTBSY_RETRIES: u32 = 5;

/// `Command::spawn`, retried on `ETXTBSY`.
///
/// A binary that was just written (an installer copying criu, a test writing a script) can still
/// be held open for writing by a child that another thread forked but has not yet exec'd; the
/// kernel then refuses to exec it with ETXTBSY for a few milliseconds.
pub(crate) fn spawn(cmd: &mut Command) -> io::Result<Child> {
    let mut attempt = 0;
    loop {
        match cmd.spawn() {
            Err(e) if is_text_busy(&e) && attempt < ETXTBSY_RETRIES => {
                attempt += 1;
                thread::sleep(Duration::from_millis(10 << attempt));
            }
            other => return other,
        }
    }
}

/// `Command::output`, retried on `ETXTBSY` like [`spawn`].
pub(crate) fn output(cmd: &mut Command) -> io::Result<Output> {
    let mut attempt = 0;
    loop {
        match cmd.output() {
            Err(e) if is_text_busy(&e) && attempt < ETXTBSY_RETRIES => {
                attempt += 1;
                thread::sleep(Duration::from_millis(10 << attempt));
            }
            other => return other,
        }
    }
}

fn is_text_busy(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ExecutableFileBusy
}

/// How a caller runs a short-lived program (runc, `criu --version`) to completion, with stdin
/// closed and stdout/stderr captured. The containerd shim reaps every child itself, so it
/// cannot use `Command::output` and supplies its own; everyone else uses [`Direct`].
pub trait RunTool: Sync {
    fn output(&self, cmd: Command) -> io::Result<Output>;
}

/// [`RunTool`] with `std::process`: spawn, wait, collect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Direct;

impl RunTool for Direct {
    fn output(&self, mut cmd: Command) -> io::Result<Output> {
        cmd.stdin(Stdio::null());
        output(&mut cmd)
    }
}
