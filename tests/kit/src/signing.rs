//! Checkpoint signatures in tests: key pairs made the way an operator makes them (openssl),
//! a node's signature settings written into its gpusnap config, and an independent check of a
//! signature with openssl — the same check `cosign verify-blob --key` makes (base64 ASN.1
//! ECDSA-P256 over SHA-256 of the manifest's bytes) — and [`CriSigNode`], a CRI node whose
//! restores either run the checkpointed counter or are refused.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::cmd::OutputExt;
use crate::counter::{check_continues, count_of, wait_count, Count, COUNTER, WARM};
use crate::cri::{gpusnap_handler, CriNode, CriNodeOptions};
use crate::crictl::{Crictl, CrictlPod, PidMode};

/// The checkpoint manifest and its signature, as every door's directory holds them.
pub const MANIFEST: &str = "gpusnap-manifest.json";
pub const SIGNATURE: &str = "gpusnap-manifest.json.sig";

/// An ECDSA P-256 key pair: PKCS#8 private key (0600) and PKIX public key, both PEM.
#[derive(Clone, Debug)]
pub struct KeyPair {
    pub private: PathBuf,
    pub public: PathBuf,
}

fn openssl(args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl")?;
    ensure!(out.status.success(), "openssl {args:?}: {}", out.describe());
    Ok(())
}

fn s(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

/// `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` into `<dir>/<name>.key`,
/// its public key into `<dir>/<name>.pub`.
pub fn keypair(dir: &Path, name: &str) -> Result<KeyPair> {
    let k = KeyPair {
        private: dir.join(format!("{name}.key")),
        public: dir.join(format!("{name}.pub")),
    };
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        s(&k.private)?,
    ])?;
    openssl(&[
        "pkey",
        "-in",
        s(&k.private)?,
        "-pubout",
        "-out",
        s(&k.public)?,
    ])?;
    fs::set_permissions(&k.private, fs::Permissions::from_mode(0o600))?;
    Ok(k)
}

/// A node's signature settings.
#[derive(Clone, Debug, Default)]
pub struct Policy<'a> {
    /// `restore.signature_policy`: "off", "warn" or "require".
    pub policy: &'a str,
    /// `restore.signature_keys`.
    pub trusted: Vec<&'a Path>,
    /// `checkpoint.signing_key`.
    pub signing_key: Option<&'a Path>,
}

/// Rewrites the gpusnap config `config` with `p`'s settings, keeping everything else: the
/// settings' old lines go, the policy and keys go right under `[restore]` (added when
/// missing) and the signing key into a `[checkpoint]` table at the end. The shim and
/// gpusnap-runc read the file for each container, so the next container created gets them.
pub fn set_policy(config: &Path, p: &Policy<'_>) -> Result<()> {
    let old = fs::read_to_string(config).unwrap_or_default();
    let ours = |l: &str| {
        let t = l.trim_start();
        [
            "signature_policy",
            "signature_keys",
            "signing_key",
            "[checkpoint]",
        ]
        .iter()
        .any(|k| t.starts_with(k))
    };
    let keys = p
        .trusted
        .iter()
        .map(|k| format!("{:?}", k.display().to_string()))
        .collect::<Vec<_>>()
        .join(", ");
    let restore = format!(
        "signature_policy = {:?}\nsignature_keys = [{keys}]",
        p.policy
    );
    let mut out = String::new();
    let mut placed = false;
    for line in old.lines().filter(|l| !ours(l)) {
        out.push_str(line);
        out.push('\n');
        if line.trim() == "[restore]" {
            out.push_str(&restore);
            out.push('\n');
            placed = true;
        }
    }
    if !placed {
        out.push_str(&format!("\n[restore]\n{restore}\n"));
    }
    if let Some(k) = p.signing_key {
        out.push_str(&format!(
            "\n[checkpoint]\nsigning_key = {:?}\n",
            k.display().to_string()
        ));
    }
    fs::write(config, out).with_context(|| format!("writing {}", config.display()))
}

/// Checks `signature` (base64, as in `gpusnap-manifest.json.sig`) over the file `manifest`
/// with `public`, through openssl alone: `openssl dgst -sha256 -verify PUB -signature
/// <(base64 -d SIG) MANIFEST`, which is what `cosign verify-blob --key PUB --signature SIG
/// MANIFEST` checks for a key-based signature.
pub fn openssl_verify(public: &Path, signature: &[u8], manifest: &Path) -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let b64 = scratch.path().join("sig.b64");
    let der = scratch.path().join("sig.der");
    fs::write(&b64, signature)?;
    openssl(&["base64", "-d", "-A", "-in", s(&b64)?, "-out", s(&der)?])?;
    openssl(&[
        "dgst",
        "-sha256",
        "-verify",
        s(public)?,
        "-signature",
        s(&der)?,
        s(manifest)?,
    ])
}

/// The file `name` inside the `checkpoint/` directory of a (plain, gzip or zstd) checkpoint
/// archive, if there.
pub fn archive_checkpoint_file(archive: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let bytes = fs::read(archive).with_context(|| format!("reading {}", archive.display()))?;
    let raw = match bytes.get(..4) {
        Some([0x28, 0xb5, 0x2f, 0xfd]) => zstd_decode(archive)?,
        Some([0x1f, 0x8b, ..]) => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(
                &mut flate2::read::MultiGzDecoder::new(&bytes[..]),
                &mut out,
            )?;
            out
        }
        _ => bytes,
    };
    let wanted = format!("checkpoint/{name}");
    for e in tar::Archive::new(&raw[..]).entries()? {
        let mut e = e?;
        if e.path()?.to_string_lossy().trim_start_matches("./") == wanted {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data)?;
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// zstd through the `zstd` tool (the kit has no zstd crate; Podman's hosts have the tool).
fn zstd_decode(path: &Path) -> Result<Vec<u8>> {
    let out = Command::new("zstd")
        .args(["-d", "-c", "-q"])
        .arg(path)
        .output()
        .context("running zstd -d")?;
    ensure!(
        out.status.success(),
        "zstd -d {}: {}",
        path.display(),
        out.describe()
    );
    Ok(out.stdout)
}

/// A CRI node (a kit [`CriNode`]) driven with crictl for signature tests: counters in pods of
/// their own, `crictl checkpoint --export`, and restores into new pods that either run the
/// checkpointed process or are refused at `crictl start`. crictl's pods go before the node.
pub struct CriSigNode {
    pub crictl: Crictl,
    pub node: CriNode,
    /// The base image (in a registry the node pulls from), already pulled.
    pub busybox: String,
    /// The run token every counter this node starts carries.
    pub run: String,
}

/// A counter running in a pod of its own.
#[derive(Clone, Debug)]
pub struct Running {
    pub pod: CrictlPod,
    pub id: String,
    pub pid: u32,
}

/// What a restore into a new pod came to.
#[derive(Debug)]
pub enum Restored {
    Runs(Running),
    /// `crictl start` failed with this error; the container is left created, not running.
    Refused(String),
}

impl Restored {
    pub fn running(self) -> Result<Running> {
        match self {
            Restored::Runs(r) => Ok(r),
            Restored::Refused(e) => anyhow::bail!("the restore was refused: {e}"),
        }
    }

    pub fn refusal(self) -> Result<String> {
        match self {
            Restored::Refused(e) => Ok(e),
            Restored::Runs(r) => {
                anyhow::bail!("restored and running (pod {}), not refused", r.pod.name)
            }
        }
    }
}

impl CriSigNode {
    /// A node pulling `busybox` from `registry_host` over plain HTTP, with `p`'s settings.
    pub fn start(registry_host: &str, busybox: &str, p: &Policy<'_>) -> Result<CriSigNode> {
        let n = CriSigNode::start_with_config(registry_host, busybox, "")?;
        set_policy(n.node.config_path(), p)?;
        Ok(n)
    }

    /// A node pulling `busybox` from `registry_host` over plain HTTP, with `gpusnap_config`
    /// appended to its gpusnap config (as [`CriNodeOptions::gpusnap_config`]).
    pub fn start_with_config(
        registry_host: &str,
        busybox: &str,
        gpusnap_config: &str,
    ) -> Result<CriSigNode> {
        let node = CriNode::start(CriNodeOptions {
            registry_host: Some(registry_host.to_string()),
            gpusnap_config: gpusnap_config.to_string(),
            ..Default::default()
        })?;
        let crictl = Crictl::for_node(&node)?;
        crictl.ok(&["pull", busybox])?;
        Ok(CriSigNode {
            crictl,
            node,
            busybox: busybox.to_string(),
            run: crate::counter::run_token(),
        })
    }

    /// Pod `name` (gpusnap handler, `annotations`) with a counter container from `image`,
    /// started. `Ok(Restored::Refused)` when `crictl start` fails.
    pub fn start_pod(
        &self,
        name: &str,
        annotations: &[(&str, &str)],
        image: &str,
    ) -> Result<Restored> {
        let pod = self
            .crictl
            .run_pod(name, gpusnap_handler(), PidMode::Container, annotations)?;
        let id = self.crictl.create(
            &pod,
            "counter",
            image,
            &["sh", "-c", COUNTER, &self.run],
            &[],
        )?;
        let out = self.crictl.run(&["start", &id])?;
        if !out.status.success() {
            let state = self.crictl.state(&id).unwrap_or_default();
            ensure!(
                state != "CONTAINER_RUNNING",
                "crictl start failed but {id} runs: {}",
                out.describe()
            );
            return Ok(Restored::Refused(out.stderr_str()));
        }
        let pid = crate::wait::wait_some(Duration::from_secs(30), || {
            self.crictl.pid(&id).ok().filter(|p| *p != 0)
        })
        .with_context(|| format!("no pid for {id} in {name}"))?;
        Ok(Restored::Runs(Running { pod, id, pid }))
    }

    /// A fresh counter, counted past [`WARM`].
    pub fn run_counter(&self, name: &str) -> Result<Running> {
        let r = self
            .start_pod(name, &[], &self.busybox.clone())?
            .running()?;
        wait_count(&self.run, name, WARM, || count_of(r.pid))?;
        Ok(r)
    }

    /// `crictl checkpoint --export=ARCHIVE` (the container keeps running); the count read
    /// just before.
    pub fn checkpoint(&self, r: &Running, archive: &Path) -> Result<Count> {
        let before = wait_count(&self.run, &r.pod.name, 0, || count_of(r.pid))?;
        self.crictl.checkpoint_export(&r.id, archive)?;
        ensure!(archive.is_file(), "no archive at {}", archive.display());
        Ok(before)
    }

    /// A restore of `image` (an archive path or a checkpoint image) in new pod `name`; when it
    /// runs, it must be the checkpointed process going on.
    pub fn restore(
        &self,
        name: &str,
        image: &str,
        annotations: &[(&str, &str)],
        checkpointed: &Count,
    ) -> Result<Restored> {
        let r = self.start_pod(name, annotations, image)?;
        if let Restored::Runs(w) = &r {
            check_continues(name, checkpointed, || count_of(w.pid))?;
        }
        Ok(r)
    }
}
