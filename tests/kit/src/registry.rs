//! [`Registry`]: a private OCI distribution registry (Debian's `docker-registry`, i.e.
//! distribution 2.8) on `127.0.0.1:<free port>`, with filesystem storage in a temporary
//! directory: plain HTTP ([`Registry::start`]), or HTTPS with a CA made for it and htpasswd
//! (Basic) authentication ([`Registry::start_with`], [`RegistrySetup::secure`]). The only registry launcher of the test kit: CRI pulls from it (see
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
    tls: bool,
    credentials: Option<(String, String)>,
}

/// How [`Registry::start_with`] sets the registry up.
#[derive(Debug, Clone, Default)]
pub struct RegistrySetup {
    /// Serve HTTPS with a server certificate for `127.0.0.1` and `localhost`, signed by a CA
    /// made for this registry alone ([`Registry::ca_file`]).
    pub tls: bool,
    /// Require HTTP Basic authentication (htpasswd, bcrypt) with this user and password.
    pub htpasswd: Option<(String, String)>,
}

impl RegistrySetup {
    /// TLS and a user `gpusnap` with a random password.
    pub fn secure() -> RegistrySetup {
        RegistrySetup {
            tls: true,
            htpasswd: Some(("gpusnap".into(), format!("pw-{}", crate::cmd::unique("")))),
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running openssl (Debian package openssl)")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A CA (`ca.crt`, `ca.key`) and a server certificate for 127.0.0.1/localhost signed by it
/// (`server.crt`, `server.key`) in `dir`.
pub fn make_test_ca(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=gpusnap test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    )?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    )?;
    fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    )
}

impl Registry {
    /// Plain HTTP, anonymous.
    pub fn start() -> Result<Registry> {
        Self::start_with(RegistrySetup::default())
    }

    pub fn start_with(setup: RegistrySetup) -> Result<Registry> {
        ensure!(
            paths::is_executable(Path::new(REGISTRY_BIN)),
            "{REGISTRY_BIN} missing: run scripts/setup-env.sh (Debian package docker-registry)"
        );
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-registry-")
            .tempdir()?;
        let port = free_tcp_port()?;
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("storage").display()
        );
        if setup.tls {
            make_test_ca(dir.path())?;
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("server.crt").display(),
                dir.path().join("server.key").display()
            ));
        }
        if let Some((user, password)) = &setup.htpasswd {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .context("running htpasswd (Debian package apache2-utils)")?;
            ensure!(out.status.success(), "htpasswd failed");
            fs::write(dir.path().join("htpasswd"), &out.stdout)?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: gpusnap-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
        }
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
        let r = Registry {
            dir,
            child,
            port,
            tls: setup.tls,
            credentials: setup.htpasswd,
        };
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
    /// `http://127.0.0.1:<port>/<repo:tag>` (`https://` for a TLS registry).
    pub fn url(&self, repo_tag: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.image(repo_tag))
    }

    /// The CA that signed a TLS registry's certificate (PEM).
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.path().join("ca.crt"))
    }

    /// The htpasswd user and password.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// A docker `config.json` in `dir` with this registry's credentials
    /// (`auths["127.0.0.1:<port>"].auth`), as `docker login` writes it.
    pub fn write_docker_config(&self, dir: &Path) -> Result<PathBuf> {
        let (user, password) = self
            .credentials()
            .context("the registry has no htpasswd user")?;
        fs::create_dir_all(dir)?;
        let path = dir.join("config.json");
        let auth = base64_encode(format!("{user}:{password}").as_bytes());
        fs::write(
            &path,
            serde_json::to_vec_pretty(&serde_json::json!({
                "auths": { self.host(): { "auth": auth } }
            }))?,
        )?;
        Ok(path)
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

/// Standard base64 with padding (what docker's `auth` field holds).
pub fn base64_encode(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_tcp_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
