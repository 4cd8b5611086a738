//! The node agent's checkpoint pushes in tests: [`NodeAgent`] runs `gpusnap agent run
//! --checkpoint-dir DIR` the way the installer DaemonSet runs it (the same command, with its
//! node paths under a scratch directory and every runtime registration skipped, so it changes
//! nothing of the machine), and reads its status files and log; [`FakeApi`] answers the
//! Kubernetes API calls it makes (the node label, the pods' events) on loopback and records
//! them.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::paths;

/// The token the fake API server accepts.
pub const TOKEN: &str = "test-token";

/// A request the fake API server received.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    pub method: String,
    pub path: String,
    pub body: Value,
}

/// A Kubernetes API server that answers every authorised request with `201 {}` and records it:
/// plain HTTP on 127.0.0.1 (the agent's `GPUSNAP_KUBE_API`), one request per connection.
pub struct FakeApi {
    port: u16,
    requests: Arc<Mutex<Vec<ApiRequest>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The service account directory the agent reads (token, and a CA it never uses over
    /// plain HTTP but must parse).
    sa_dir: tempfile::TempDir,
}

fn serve(mut stream: TcpStream, requests: &Mutex<Vec<ApiRequest>>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut length = 0usize;
    let mut authorised = false;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            length = v.parse().unwrap_or(0);
        }
        if k.eq_ignore_ascii_case("authorization") && v == format!("Bearer {TOKEN}") {
            authorised = true;
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    reader.read_exact(&mut body)?;
    let (status, answer) = if authorised {
        requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ApiRequest {
                method,
                path,
                body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            });
        ("201 Created", "{}")
    } else {
        ("401 Unauthorized", r#"{"kind":"Status","code":401}"#)
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{answer}",
        answer.len()
    )?;
    stream.flush()
}

impl FakeApi {
    /// Starts it; `ca` is any PEM certificate (the service account's `ca.crt`).
    pub fn start(ca: &Path) -> Result<FakeApi> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the fake API server")?;
        let port = listener.local_addr()?.port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let sa_dir = tempfile::Builder::new().prefix("gpusnap-sa-").tempdir()?;
        fs::write(sa_dir.path().join("token"), TOKEN)?;
        fs::copy(ca, sa_dir.path().join("ca.crt"))?;
        let (r, s) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    let _ = serve(stream, &r);
                }
            }
        });
        Ok(FakeApi {
            port,
            requests,
            stop,
            thread: Some(thread),
            sa_dir,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn service_account_dir(&self) -> &Path {
        self.sa_dir.path()
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The core/v1 Events posted so far.
    pub fn events(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .map(|r| r.body)
            .collect()
    }

    /// Waits (up to `timeout`) for an event with `reason` about pod `name`.
    pub fn wait_event(&self, name: &str, reason: &str, timeout: Duration) -> Result<Value> {
        crate::wait::wait_some(timeout, || {
            self.events()
                .into_iter()
                .find(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        })
        .with_context(|| {
            format!(
                "no {reason} event for pod {name}; events: {}",
                serde_json::to_string_pretty(&self.events()).unwrap_or_default()
            )
        })
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How [`NodeAgent::start`] runs the agent.
pub struct AgentSetup<'a> {
    /// The directory it watches (standing in for /var/lib/kubelet/checkpoints).
    pub checkpoint_dir: &'a Path,
    /// The gpusnap config it installs and pushes with (`--config-from`).
    pub config: String,
    /// `--node-name` (the downward API's `spec.nodeName` in the chart).
    pub node: &'a str,
    /// The API server it posts events to; none: no token, no events.
    pub api: Option<&'a FakeApi>,
}

/// `gpusnap agent run` as the DaemonSet runs it, with its node paths in a scratch directory.
/// Stopped with SIGTERM (by pid) when dropped, as the kubelet stops the pod.
pub struct NodeAgent {
    child: Mutex<Option<Child>>,
    dir: PathBuf,
    log: PathBuf,
}

impl NodeAgent {
    pub fn start(setup: &AgentSetup<'_>, dir: &Path) -> Result<NodeAgent> {
        fs::create_dir_all(dir)?;
        let source = dir.join("config-source.toml");
        fs::write(&source, &setup.config)?;
        // One log per start: a restarted agent's lines are its own.
        let log = dir.join(format!("{}.log", crate::cmd::unique("agent")));
        let file = fs::File::options().create(true).append(true).open(&log)?;
        let s = |p: PathBuf| p.display().to_string();
        let mut cmd = Command::new(paths::binary("gpusnap"));
        cmd.arg("--config")
            .arg(dir.join("etc/config.toml"))
            .args(["agent", "run"])
            .arg(format!("--config-from={}", source.display()))
            .args(["--skip-containerd", "--skip-crio", "--skip-podman"])
            .arg(format!(
                "--criu-config={}",
                s(dir.join("etc/criu/runc.conf"))
            ))
            .arg(format!(
                "--state-file={}",
                s(dir.join("state/install.json"))
            ))
            .arg(format!("--bin-dir={}", s(dir.join("bin"))))
            .arg(format!("--ready-file={}", s(dir.join("run/ready"))))
            .arg(format!("--node-name={}", setup.node))
            .arg(format!(
                "--checkpoint-dir={}",
                setup.checkpoint_dir.display()
            ))
            .arg(format!("--push-status-dir={}", s(dir.join("status"))))
            .arg("--recheck-seconds=3600")
            // debug: the agent says when it finds an archive already handled.
            .env("GPUSNAP_LOG", "warn,gpusnap_cli::checkpoint_push=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        match setup.api {
            Some(api) => {
                cmd.env("GPUSNAP_KUBE_API", api.url()).arg(format!(
                    "--service-account-dir={}",
                    api.service_account_dir().display()
                ));
            }
            None => {
                cmd.arg(format!("--service-account-dir={}", s(dir.join("no-sa"))));
            }
        }
        let child = cmd.spawn().context("starting gpusnap agent run")?;
        let agent = NodeAgent {
            child: Mutex::new(Some(child)),
            dir: dir.to_path_buf(),
            log,
        };
        agent.wait_log("watching for checkpoint archives", Duration::from_secs(60))?;
        Ok(agent)
    }

    /// What the agent wrote so far (stdout and stderr).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for `text` in the log; fails early when the agent exits.
    pub fn wait_log(&self, text: &str, timeout: Duration) -> Result<()> {
        let found =
            crate::wait::wait_until(timeout, || self.log().contains(text) || !self.running());
        ensure!(
            found && self.log().contains(text),
            "the agent did not log {text:?}{}:\n{}",
            if self.running() { "" } else { " (it exited)" },
            self.log()
        );
        Ok(())
    }

    fn running(&self) -> bool {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// The status directory (`--push-status-dir`).
    pub fn status_dir(&self) -> PathBuf {
        self.dir.join("status")
    }

    /// The status record of archive `name`, if any.
    pub fn status(&self, name: &str) -> Option<Value> {
        let text = fs::read_to_string(self.status_dir().join(format!("{name}.json"))).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Waits (up to `timeout`) until the record of `name` is in `state`; fails as soon as it
    /// reaches another final state or the agent exits.
    pub fn wait_state(&self, name: &str, state: &str, timeout: Duration) -> Result<Value> {
        const FINAL: [&str; 4] = ["pushed", "refused", "failed", "not-requested"];
        let mut last = Value::Null;
        crate::wait::wait_until(timeout, || {
            if let Some(r) = self.status(name) {
                last = r;
            }
            let s = last["state"].as_str().unwrap_or_default();
            s == state || FINAL.contains(&s) || !self.running()
        });
        ensure!(
            last["state"] == state,
            "archive {name}: status {} while waiting for {state:?}{}; agent log:\n{}",
            serde_json::to_string_pretty(&last).unwrap_or_default(),
            if self.running() {
                ""
            } else {
                " (the agent exited)"
            },
            self.log()
        );
        Ok(last)
    }

    /// SIGTERM, as the kubelet stops the pod; waits for it to exit (60 s, then SIGKILL) and
    /// fails unless it exits 0.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        // Only the agent this helper started, by its pid.
        kill(child.id(), libc::SIGTERM);
        let exited = crate::wait::wait_until(Duration::from_secs(60), || {
            child.try_wait().ok().flatten().is_some()
        });
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the agent did not stop within 60 s of SIGTERM:\n{}",
                self.log()
            );
        }
        let status = child.wait()?;
        ensure!(
            status.success(),
            "the agent exited with {status} on SIGTERM:\n{}",
            self.log()
        );
        Ok(())
    }
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid this process spawned and has not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("{e:#}");
        }
    }
}
