//! Progress on a terminal counts bytes where they move: `gpusnap image build` what it wrote
//! (the kernel's count of this process's writes), at least the image it produced;
//! `gpusnap image push` what the connection took, never far ahead of what the registry has
//! received. Off a terminal nothing is drawn. (Pull progress: store_cli.rs.)

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpusnap_testkit::fixtures::fixture;
use gpusnap_testkit::{describe, paths, pty};

/// `12.50 KiB` -> bytes.
fn bytes(text: &str) -> f64 {
    let mut it = text.split_whitespace();
    let n: f64 = it.next().unwrap().parse().unwrap();
    let unit = it.next().unwrap();
    n * match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        u => panic!("unit {u}"),
    }
}

#[test]
fn build_progress_counts_the_bytes_written() {
    let fx = fixture();
    let out_path = fx.work.path().join("image.oci.tar");
    let mut cmd = Command::new(paths::binary("gpusnap"));
    cmd.args(["image", "build"])
        .arg(&fx.archive)
        .arg("-o")
        .arg(&out_path)
        .env_remove("GPUSNAP_CONFIG");
    let out = pty::run_in_pty(cmd, Duration::from_secs(120)).unwrap();
    let text = out.text();
    assert!(out.status.success(), "{text}");
    let line = text
        .rsplit("built ")
        .next()
        .filter(|_| text.contains("built "))
        .unwrap_or_else(|| panic!("no build progress on a terminal: {text}"));
    let written = line.split(" written").next().unwrap();
    // `⠁ 35.12 KiB`: drop the spinner.
    let written = written.split_once(' ').map_or(written, |(_, rest)| rest);
    let archive = std::fs::metadata(&out_path).unwrap().len() as f64;
    assert!(
        bytes(written) >= archive,
        "counted {written} written, but the archive alone is {archive} bytes: {text}"
    );

    // Off a terminal: the summary only.
    let out = Command::new(paths::binary("gpusnap"))
        .args(["image", "build"])
        .arg(&fx.archive)
        .arg("-o")
        .arg(fx.work.path().join("again.oci.tar"))
        .env_remove("GPUSNAP_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("written"),
        "{}",
        describe(&out)
    );
}

/// A proxy to `upstream` that passes what the client sends at about 4 MiB/s through a small
/// receive buffer, recording when it had passed how many bytes.
/// When the proxy had passed how many bytes, in order.
type Passed = Arc<Mutex<Vec<(Instant, u64)>>>;

fn throttling_proxy(upstream: u16) -> (u16, Passed) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log = Arc::new(Mutex::new(vec![(Instant::now(), 0u64)]));
    let l = log.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let size: libc::c_int = 128 << 10;
            // SAFETY: setsockopt on a descriptor this test owns, with a c_int of its size.
            unsafe {
                libc::setsockopt(
                    client.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                return;
            };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let l = l.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = c_in.read(&mut buf) {
                    if n == 0 || s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    let mut log = l.lock().unwrap();
                    let total = log.last().unwrap().1 + n as u64;
                    log.push((Instant::now(), total));
                    drop(log);
                    // Rate limiting, not synchronisation: 64 KiB per 16 ms.
                    std::thread::sleep(Duration::from_millis(16));
                }
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_in, &mut c_out);
            });
        }
    });
    (port, log)
}

#[test]
fn push_progress_counts_what_the_connection_took() {
    let reg = common::registry();
    let fx = fixture();
    // 40 MiB of pages that do not compress, resealed.
    let pages = fx.checkpoint_dir.join("pages-1.img");
    std::fs::write(&pages, gpusnap_testkit::fixtures::noise(40 << 20, 77)).unwrap();
    std::fs::set_permissions(&pages, std::fs::Permissions::from_mode(0o600)).unwrap();
    gpusnap_checkpoint::seal_checkpoint(&fx.checkpoint_dir, fx.manifest.clone()).unwrap();
    let (port, received) = throttling_proxy(reg.port());
    let mut cmd = Command::new(paths::binary("gpusnap"));
    cmd.args(["image", "push"])
        .arg(&fx.archive_root)
        .arg(format!("127.0.0.1:{port}/ckpt/big:v1"))
        .args(["--plain-http", "--classic", "--parallel-blobs", "1"])
        .env_remove("GPUSNAP_CONFIG");
    let out = pty::run_in_pty(cmd, Duration::from_secs(300)).unwrap();
    let text = out.text();
    assert!(out.status.success(), "{text}");
    let received = received.lock().unwrap().clone();
    let received_at = |t: Instant| {
        received
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .unwrap()
            .1
    };
    let mut start = 0;
    let mut shown_max = 0.0f64;
    let mut checked = 0;
    let mut ahead_max = f64::MIN;
    for (at, end) in &out.arrivals {
        let chunk = String::from_utf8_lossy(&out.output[start..*end]).replace('\r', "");
        start = *end;
        for draw in chunk.split("uploaded [").skip(1) {
            let Some(shown) = draw.split_once("] ").and_then(|(_, r)| r.split_once('/')) else {
                continue;
            };
            let shown = bytes(shown.0);
            shown_max = shown_max.max(shown);
            // What the registry had by the time the terminal got this drawing, plus what the
            // sockets between hold (the client's send buffer, at most 4 MiB with Linux's
            // default tcp_wmem, the proxy's small receive buffer) and the piece the connection
            // holds (4 MiB): 8.4 MiB at most, measured. Counting a piece when it was read from
            // the file put the 16 MiB of the upload queue ahead as well.
            let had = received_at(*at) as f64;
            ahead_max = ahead_max.max(shown - had);
            assert!(
                shown <= had + (14 << 20) as f64,
                "the bar showed {shown} bytes uploaded when the registry had {had}: {text}"
            );
            checked += 1;
        }
    }
    println!("{checked} drawings; the bar at most {ahead_max:.0} bytes ahead of the registry");
    assert!(
        checked > 10,
        "too few drawings to judge ({checked}): {text}"
    );
    assert!(
        shown_max >= (30 << 20) as f64,
        "the bar never got near the end: {text}"
    );
}
