//! Running a command on a fresh pseudo-terminal (for `ctr run --tty`, which insists
//! that its own stdin is a terminal).

use std::ffi::CStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Output of a command run on a pty: everything it wrote to the terminal (stdout and
/// stderr interleaved, with the terminal's `\r\n` line endings).
#[derive(Debug)]
pub struct PtyOutput {
    pub status: ExitStatus,
    pub output: Vec<u8>,
    /// When each read from the terminal arrived, and the length of `output` after it: what
    /// the command had drawn by then.
    pub arrivals: Vec<(Instant, usize)>,
}

impl PtyOutput {
    /// The terminal output as text with `\r` removed.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).replace('\r', "")
    }
}

fn open_pty() -> Result<(OwnedFd, File)> {
    // SAFETY: plain libc calls on fds we own; every fd is opened O_CLOEXEC so that a
    // concurrent fork in another test thread cannot inherit (and keep open) our pty.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 {
            return Err(std::io::Error::last_os_error()).context("posix_openpt");
        }
        let master = OwnedFd::from_raw_fd(master);
        use std::os::fd::AsRawFd;
        if libc::grantpt(master.as_raw_fd()) != 0 || libc::unlockpt(master.as_raw_fd()) != 0 {
            return Err(std::io::Error::last_os_error()).context("grantpt/unlockpt");
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) != 0 {
            return Err(std::io::Error::last_os_error()).context("ptsname_r");
        }
        let ws = libc::winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws);
        let slave = libc::open(
            CStr::from_ptr(name.as_ptr()).as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if slave < 0 {
            return Err(std::io::Error::last_os_error()).context("open pty slave");
        }
        Ok((master, File::from_raw_fd(slave)))
    }
}

/// Run `cmd` with stdin/stdout/stderr on a new pty that is its controlling terminal
/// (new session). Returns its exit status and everything written to the terminal.
pub fn run_in_pty(mut cmd: Command, timeout: Duration) -> Result<PtyOutput> {
    let desc = crate::cmd::describe_command(&cmd);
    let (master, slave) = open_pty()?;
    cmd.stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawning `{desc}` on a pty"))?;
    // Drop our copies of the slave (moved into `cmd`) so EOF/EIO arrives when the child exits.
    drop(cmd);
    let mut reader = File::from(master);
    let collector = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut arrivals = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    arrivals.push((Instant::now(), out.len()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break, // EIO: all slave ends closed
            }
        }
        (out, arrivals)
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{desc}` (on a pty) did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (output, arrivals) = collector
        .join()
        .map_err(|_| anyhow::anyhow!("pty reader panicked"))?;
    Ok(PtyOutput {
        status,
        output,
        arrivals,
    })
}
