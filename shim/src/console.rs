//! The console socket: runc creates the container's pseudo-terminal and sends its master
//! side back over a unix socket (SCM_RIGHTS), as `--console-socket` specifies.

use std::{
    fs::File,
    io::IoSliceMut,
    os::fd::{FromRawFd, RawFd},
    path::{Path, PathBuf},
};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::net::UnixListener;

pub struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl ConsoleSocket {
    pub fn new() -> std::io::Result<Self> {
        // Socket paths are limited to 108 bytes, so keep it short and under /tmp.
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-pty")
            .tempdir_in("/tmp")?;
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path)?;
        Ok(Self {
            listener,
            path,
            _dir: dir,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for runc to connect and send the terminal master.
    pub async fn receive_master(&self) -> std::io::Result<File> {
        let (stream, _) = self.listener.accept().await?;
        let std_stream = stream.into_std()?;
        std_stream.set_nonblocking(false)?;
        tokio::task::spawn_blocking(move || -> std::io::Result<File> {
            use std::os::fd::AsRawFd;
            let mut buf = [0u8; 4096];
            let mut iov = [IoSliceMut::new(&mut buf)];
            let mut cmsg = nix::cmsg_space!([RawFd; 1]);
            let msg = recvmsg::<()>(
                std_stream.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::empty(),
            )
            .map_err(std::io::Error::from)?;
            for c in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    if let Some(fd) = fds.first() {
                        // SAFETY: the kernel just installed this descriptor for us via SCM_RIGHTS;
                        // nothing else owns it.
                        return Ok(unsafe { File::from_raw_fd(*fd) });
                    }
                }
            }
            Err(std::io::Error::other(
                "runc sent no terminal over the console socket",
            ))
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// Sets the terminal size (TIOCSWINSZ) on the master side.
pub fn resize(master: &impl std::os::fd::AsFd, width: u32, height: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let ws = libc::winsize {
        ws_row: height as u16,
        ws_col: width as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct we own for the duration of the call.
    let rc = unsafe { libc::ioctl(master.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
