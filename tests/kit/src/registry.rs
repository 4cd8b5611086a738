//! [`Registry`]: a private OCI distribution registry (Debian's `docker-registry`, i.e.
//! distribution 2.8) on `127.0.0.1:<free port>`, plain HTTP, with filesystem storage in a
//! temporary directory. The only registry launcher of the test kit: CRI pulls from it (see
//! [`write_plain_http_hosts`]), `gpusnap image push|pull` and the `gpusnap_oci_image` client
//! talk to it, and tests reach into its storage to damage blobs.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use crate::paths;
use crate::wait::wait_until;

/// Where Debian's package installs the registry.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A private registry: own config, own storage, own port (a system instance, if any, is
/// irrelevant). Killed, by its pid, and its directory removed when dropped.
pub struct Registry {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

impl Registry {
    pub fn start() -> Result<Registry> {
        ensure!(
            paths::is_executable(Path::new(REGISTRY_BIN)),
            "{REGISTRY_BIN} missing: run scripts/setup-env.sh (Debian package docker-registry)"
        );
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-registry-")
            .tempdir()?;
        let port = free_tcp_port()?;
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("storage").display()
        );
        fs::write(dir.path().join("config.yml"), config)?;
        let log = File::create(dir.path().join("registry.log"))?;
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry")?;
        let r = Registry { dir, child, port };
        if !wait_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) {
            bail!(
                "registry not listening on 127.0.0.1:{port} after 30s:\n{}",
                r.log_text()
            );
        }
        Ok(r)
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The image reference CRI pulls, and `gpusnap image push|pull --plain-http` takes:
    /// `127.0.0.1:<port>/<repo:tag>` (no scheme).
    pub fn image(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.host())
    }

    /// The reference with its scheme, which needs no `--plain-http`:
    /// `http://127.0.0.1:<port>/<repo:tag>`.
    pub fn url(&self, repo_tag: &str) -> String {
        format!("http://{}", self.image(repo_tag))
    }

    /// The registry's private directory (config, log, storage).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Root of the filesystem storage driver.
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Where the filesystem driver keeps the bytes of blob `digest` (`sha256:<hex>`).
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest
            .strip_prefix("sha256:")
            .unwrap_or_else(|| panic!("not a sha256 digest: {digest:?}"));
        self.storage_dir()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The registry's own log.
    pub fn log_text(&self) -> String {
        fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Only the registry this helper started, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `<dir>/<host>/hosts.toml` telling containerd to talk plain HTTP to `host` (`ip:port`).
pub fn write_plain_http_hosts(dir: &Path, host: &str) -> Result<()> {
    let d = dir.join(host);
    fs::create_dir_all(&d)?;
    fs::write(
        d.join("hosts.toml"),
        format!(
            "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )?;
    Ok(())
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_tcp_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
