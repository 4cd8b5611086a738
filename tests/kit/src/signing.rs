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
/// policy and keys are set in `[restore]`, the signing key in `[checkpoint]` (set, or
/// removed when `p` has none), each table made when missing. The shim and
/// gpusnap-runc read the file for each container, so the next container created gets them.
pub fn set_policy(config: &Path, p: &Policy<'_>) -> Result<()> {
    // Edited as TOML: the node's file has other settings in these tables (the installer's
    // `[checkpoint]`, the rig's `[restore]`), which must stay where they are.
    let old = fs::read_to_string(config).unwrap_or_default();
    let mut doc: toml_edit::DocumentMut = old
        .parse()
        .with_context(|| format!("parsing {}", config.display()))?;
    let table = |doc: &mut toml_edit::DocumentMut, name: &str| -> Result<toml_edit::Table> {
        Ok(match doc.remove(name) {
            Some(toml_edit::Item::Table(t)) => t,
            None => toml_edit::Table::new(),
            Some(other) => anyhow::bail!("{name} in {} is not a table: {other}", config.display()),
        })
    };
    let mut restore = table(&mut doc, "restore")?;
    restore.insert("signature_policy", toml_edit::value(p.policy));
    let mut keys = toml_edit::Array::new();
    for k in &p.trusted {
        keys.push(k.display().to_string());
    }
    restore.insert("signature_keys", toml_edit::value(keys));
    doc.insert("restore", toml_edit::Item::Table(restore));
    let mut checkpoint = table(&mut doc, "checkpoint")?;
    checkpoint.remove("signing_key");
    if let Some(k) = p.signing_key {
        checkpoint.insert("signing_key", toml_edit::value(k.display().to_string()));
    }
    if !checkpoint.is_empty() {
        doc.insert("checkpoint", toml_edit::Item::Table(checkpoint));
    }
    fs::write(config, doc.to_string()).with_context(|| format!("writing {}", config.display()))
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
        self.start_pod_with(name, annotations, image, &serde_json::json!({}))
    }

    /// [`CriSigNode::start_pod`] with `security` added to the container's CRI security
    /// context: an object of CRI `LinuxContainerSecurityContext` fields as crictl's JSON spells
    /// them, such as `{"capabilities": {"add_capabilities": ["SYS_ADMIN"]}}`.
    pub fn start_pod_with(
        &self,
        name: &str,
        annotations: &[(&str, &str)],
        image: &str,
        security: &serde_json::Value,
    ) -> Result<Restored> {
        let pod = self
            .crictl
            .run_pod(name, gpusnap_handler(), PidMode::Container, annotations)?;
        self.start_in_full(&pod, image, &[], 0, security)
            .map(|(_, r)| r)
    }

    /// The counter container (attempt `attempt`, with CRI `mounts`) from `image` in the
    /// running pod `pod`, started; its id, and `Restored::Refused` when `crictl start` fails.
    pub fn start_in(
        &self,
        pod: &CrictlPod,
        image: &str,
        mounts: &[serde_json::Value],
        attempt: u32,
    ) -> Result<(String, Restored)> {
        self.start_in_full(pod, image, mounts, attempt, &serde_json::json!({}))
    }

    fn start_in_full(
        &self,
        pod: &CrictlPod,
        image: &str,
        mounts: &[serde_json::Value],
        attempt: u32,
        security: &serde_json::Value,
    ) -> Result<(String, Restored)> {
        let id = self.crictl.create_full(
            pod,
            "counter",
            image,
            &["sh", "-c", COUNTER, &self.run],
            &[],
            mounts,
            attempt,
            security,
        )?;
        let out = self.crictl.run(&["start", &id])?;
        if !out.status.success() {
            let state = self.crictl.state(&id).unwrap_or_default();
            ensure!(
                state != "CONTAINER_RUNNING",
                "crictl start failed but {id} runs: {}",
                out.describe()
            );
            return Ok((id, Restored::Refused(out.stderr_str())));
        }
        let pid = crate::wait::wait_some(Duration::from_secs(30), || {
            self.crictl.pid(&id).ok().filter(|p| *p != 0)
        })
        .with_context(|| format!("no pid for {id} in {}", pod.name))?;
        Ok((
            id.clone(),
            Restored::Runs(Running {
                pod: pod.clone(),
                id,
                pid,
            }),
        ))
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

// ----- replacing parts of a signed checkpoint ----------------------------------------------

/// Media type of the rw layer in a `ctr containers checkpoint --rw` image.
pub const RW_LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Media type of the spec in a `ctr containers checkpoint` image: a protobuf `Any` whose value
/// is the spec's JSON.
pub const SPEC_MEDIA_TYPE: &str = "application/vnd.containerd.container.checkpoint.config.v1+proto";

/// One blob of a `ctr containers checkpoint` image in the rig's content store, replaced for
/// some restores and put back afterwards. containerd reads a blob by its digest's file name
/// without hashing it again, so a replaced blob is what the next restore applies.
pub struct CheckpointBlob {
    path: PathBuf,
    pristine: Vec<u8>,
}

impl CheckpointBlob {
    /// The blob of `image_ref`'s index entry of media type `media_type`.
    pub fn of(rig: &crate::Rig, image_ref: &str, media_type: &str) -> Result<CheckpointBlob> {
        let index = crate::checkpoint::image_index(rig, image_ref)?;
        let digest = index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["mediaType"] == media_type)
            .and_then(|m| m["digest"].as_str())
            .with_context(|| format!("{image_ref} has no {media_type}: {index}"))?
            .to_string();
        let path = crate::checkpoint::blob_path(rig, &digest)?;
        let pristine = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(CheckpointBlob { path, pristine })
    }

    pub fn pristine(&self) -> &[u8] {
        &self.pristine
    }

    pub fn replace(&self, bytes: &[u8]) -> Result<()> {
        crate::checkpoint::write_blob(&self.path, bytes)
    }

    pub fn put_back(&self) -> Result<()> {
        crate::checkpoint::write_blob(&self.path, &self.pristine)
    }
}

/// Copies every entry of the tar `src` into `b` (names, link targets, modes, owners and times;
/// extended attributes are not carried).
fn copy_tar(src: &[u8], b: &mut tar::Builder<Vec<u8>>) -> Result<()> {
    for e in tar::Archive::new(src).entries()? {
        let mut e = e?;
        let path = e.path()?.into_owned();
        let mut header = e.header().clone();
        match header.entry_type() {
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = e
                    .link_name()?
                    .context("link without a target")?
                    .into_owned();
                b.append_link(&mut header, &path, &target)?;
            }
            _ => {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data)?;
                b.append_data(&mut header, &path, &data[..])?;
            }
        }
    }
    Ok(())
}

/// The layer tar `layer` (gzip or plain, kept so) with one more regular file `name` (0755,
/// root-owned) holding `data`, everything else as it was.
pub fn layer_with_file(layer: &[u8], name: &str, data: &[u8]) -> Result<Vec<u8>> {
    let gzip = layer.starts_with(&[0x1f, 0x8b]);
    let plain = if gzip {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(layer), &mut out)?;
        out
    } else {
        layer.to_vec()
    };
    let mut b = tar::Builder::new(Vec::new());
    copy_tar(&plain, &mut b)?;
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o755);
    h.set_uid(0);
    h.set_gid(0);
    h.set_size(data.len() as u64);
    h.set_mtime(0);
    b.append_data(&mut h, name, data)?;
    let tar = b.into_inner()?;
    if !gzip {
        return Ok(tar);
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar)?;
    Ok(gz.finish()?)
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).context("truncated varint")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    anyhow::bail!("varint too long")
}

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The spec blob of a `ctr containers checkpoint` image (a protobuf `Any`: `type_url` = 1,
/// `value` = 2, the spec's JSON) with its spec changed by `edit`, as long as before: containerd
/// reads the blob by its descriptor's size, so the JSON is padded with spaces (an edit that
/// makes it longer is an error).
pub fn spec_blob_edited(blob: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Result<Vec<u8>> {
    let mut at = 0;
    let mut type_url = Vec::new();
    let mut value = Vec::new();
    while at < blob.len() {
        let key = varint(blob, &mut at)?;
        ensure!(key & 7 == 2, "field {} is not length-delimited", key >> 3);
        let len = varint(blob, &mut at)? as usize;
        let field = blob.get(at..at + len).context("truncated field")?.to_vec();
        at += len;
        match key >> 3 {
            1 => type_url = field,
            2 => value = field,
            other => anyhow::bail!("unexpected field {other} in the spec blob"),
        }
    }
    let mut spec: serde_json::Value = serde_json::from_slice(&value)?;
    edit(&mut spec);
    let original = value.len();
    let mut value = serde_json::to_vec(&spec)?;
    ensure!(
        value.len() <= original,
        "the edited spec is {} bytes longer than the original",
        value.len() - original
    );
    value.resize(original, b' ');
    let mut out = Vec::new();
    for (n, field) in [(1u64, &type_url), (2, &value)] {
        put_varint((n << 3) | 2, &mut out);
        put_varint(field.len() as u64, &mut out);
        out.extend_from_slice(field);
    }
    Ok(out)
}

/// Writes to `out` the checkpoint archive `archive` (a plain tar, as `crictl checkpoint
/// --export` writes it) with `rootfs-diff.tar` given one more file (see [`layer_with_file`]).
pub fn archive_with_diff_file(archive: &Path, out: &Path, name: &str, data: &[u8]) -> Result<()> {
    let bytes = fs::read(archive).with_context(|| format!("reading {}", archive.display()))?;
    let mut b = tar::Builder::new(Vec::new());
    let mut found = false;
    for e in tar::Archive::new(&bytes[..]).entries()? {
        let mut e = e?;
        let path = e.path()?.into_owned();
        let mut header = e.header().clone();
        let mut data_in = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data_in)?;
        let data_out = if path == Path::new("rootfs-diff.tar") {
            found = true;
            layer_with_file(&data_in, name, data)?
        } else {
            data_in
        };
        header.set_size(data_out.len() as u64);
        b.append_data(&mut header, &path, &data_out[..])?;
    }
    ensure!(found, "{} has no rootfs-diff.tar", archive.display());
    fs::write(out, b.into_inner()?).with_context(|| format!("writing {}", out.display()))
}
