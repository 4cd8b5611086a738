//! Encrypted checkpoint images at the front doors (issue 22): a TLS registry with credentials
//! and the flags `gpusnap` and skopeo need to reach it ([`TlsRegistry`]); the images a registry
//! operator could serve in place of an encrypted one, every digest recomputed
//! ([`tamper_ciphertext`], [`swap_wrapped_keys`]); the refusals every door must make
//! ([`Refusal`]); and the check that a refused pull left nothing behind ([`NothingLeft`]).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::fixtures::{oci_blob_path, sha256_bytes, sha256_file};
use crate::registry::{Registry, RegistrySetup};

/// The annotation holding a layer's wrapped keys (ocicrypt's JWE scheme).
pub const WRAPPED_KEYS: &str = "org.opencontainers.image.enc.keys.jwe";

/// A registry serving HTTPS (its own CA) with Basic authentication, and the files a client
/// needs for it: the CA, a docker config with the credentials, a cert directory for skopeo.
pub struct TlsRegistry {
    pub reg: Registry,
    docker_config: PathBuf,
    certs: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsRegistry {
    pub fn start() -> Result<TlsRegistry> {
        let reg = Registry::start_with(RegistrySetup::secure())?;
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-tls-client-")
            .tempdir()?;
        let certs = dir.path().join("certs");
        fs::create_dir(&certs)?;
        let ca = reg.ca_file().context("a TLS registry has a CA")?;
        fs::copy(&ca, certs.join("ca.crt"))?;
        let docker_config = reg.write_docker_config(&dir.path().join("docker"))?;
        Ok(TlsRegistry {
            reg,
            docker_config,
            certs,
            _dir: dir,
        })
    }

    /// `REGISTRY/REPO:TAG` (HTTPS, no scheme).
    pub fn image(&self, repo_tag: &str) -> String {
        self.reg.image(repo_tag)
    }

    /// `--ca-file CA --registry-config DOCKER-CONFIG`, for `gpusnap image push|pull`.
    pub fn gpusnap_args(&self) -> Vec<String> {
        let ca = self.reg.ca_file().expect("a TLS registry has a CA");
        vec![
            "--ca-file".into(),
            ca.display().to_string(),
            "--registry-config".into(),
            self.docker_config.display().to_string(),
        ]
    }

    /// skopeo's `--{src,dest}-cert-dir` for this registry.
    pub fn cert_dir(&self) -> &Path {
        &self.certs
    }

    /// `USER:PASSWORD`, skopeo's `--{src,dest}-creds`.
    pub fn creds(&self) -> String {
        let (user, pass) = self
            .reg
            .credentials()
            .expect("a secure registry has a user");
        format!("{user}:{pass}")
    }
}

fn read_json(p: &Path) -> Result<Value> {
    serde_json::from_slice(&fs::read(p).with_context(|| format!("reading {}", p.display()))?)
        .with_context(|| format!("parsing {}", p.display()))
}

fn write_blob(layout: &Path, bytes: &[u8]) -> Result<(String, u64)> {
    let digest = sha256_bytes(bytes);
    fs::write(oci_blob_path(layout, &digest), bytes)?;
    Ok((digest, bytes.len() as u64))
}

/// Rewrites `desc`'s document (an index or a manifest) beneath `layout` with `edit` applied
/// to the image manifest it leads to, and points `desc` at the new blob.
fn rewrite(
    layout: &Path,
    desc: &mut Value,
    edit: &mut dyn FnMut(&mut Value) -> Result<()>,
) -> Result<()> {
    let digest = desc["digest"].as_str().context("descriptor digest")?;
    let mut doc = read_json(&oci_blob_path(layout, digest))?;
    if doc.get("layers").is_some() {
        edit(&mut doc)?;
    } else {
        rewrite(layout, &mut doc["manifests"][0], edit)?;
    }
    let (digest, size) = write_blob(layout, &serde_json::to_vec(&doc)?)?;
    desc["digest"] = digest.into();
    desc["size"] = size.into();
    Ok(())
}

/// Changes the image manifest of an OCI layout (index.json → [image index →] manifest) with
/// `edit` and recomputes every digest up the chain, as whoever controls a registry can.
pub fn rewrite_manifest(
    layout: &Path,
    mut edit: impl FnMut(&mut Value) -> Result<()>,
) -> Result<()> {
    let path = layout.join("index.json");
    let mut top = read_json(&path)?;
    rewrite(layout, &mut top["manifests"][0], &mut edit)?;
    fs::write(&path, serde_json::to_vec(&top)?)?;
    Ok(())
}

/// The image manifest of an OCI layout (through an image index if there is one).
pub fn image_manifest(layout: &Path) -> Result<Value> {
    let mut desc = read_json(&layout.join("index.json"))?["manifests"][0].clone();
    loop {
        let d = desc["digest"].as_str().context("descriptor digest")?;
        let doc = read_json(&oci_blob_path(layout, d))?;
        if doc.get("layers").is_some() {
            return Ok(doc);
        }
        desc = doc["manifests"][0].clone();
    }
}

/// Two layers of `manifest` with different blobs (identical layers share one ciphertext and
/// key, so a swap between them would change nothing): the first and the last such.
fn two_distinct_layers(manifest: &Value) -> Result<(usize, usize)> {
    let layers = manifest["layers"].as_array().context("layers")?;
    let last = layers.len().checked_sub(1).context("no layers")?;
    let first = (0..last)
        .find(|&i| layers[i]["digest"] != layers[last]["digest"])
        .context("every layer is the same blob")?;
    Ok((first, last))
}

/// One byte in the middle of the last layer's ciphertext flipped, the layer's digest (and
/// everything above it) recomputed: only the layer's HMAC can tell.
pub fn tamper_ciphertext(layout: &Path) -> Result<()> {
    rewrite_manifest(layout, |m| {
        let (_, last) = two_distinct_layers(m)?;
        let layer = &mut m["layers"][last];
        let digest = layer["digest"].as_str().context("layer digest")?;
        let mut bytes = fs::read(oci_blob_path(layout, digest))?;
        ensure!(!bytes.is_empty(), "empty layer blob");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x20;
        let (digest, _) = write_blob(layout, &bytes)?;
        layer["digest"] = digest.into();
        Ok(())
    })
}

/// The wrapped keys of two layers with different blobs swapped: each key still opens for the
/// node's key, but belongs to the other layer.
pub fn swap_wrapped_keys(layout: &Path) -> Result<()> {
    rewrite_manifest(layout, |m| {
        let (a, b) = two_distinct_layers(m)?;
        let ka = m["layers"][a]["annotations"][WRAPPED_KEYS].take();
        let kb = m["layers"][b]["annotations"][WRAPPED_KEYS].take();
        ensure!(
            ka.is_string() && kb.is_string(),
            "layers without wrapped keys"
        );
        ensure!(ka != kb, "layers {a} and {b} share their wrapped key");
        m["layers"][a]["annotations"][WRAPPED_KEYS] = kb;
        m["layers"][b]["annotations"][WRAPPED_KEYS] = ka;
        Ok(())
    })
}

/// The refusals every door that decrypts must make, leaving nothing behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Only a key the image was not encrypted for is configured.
    WrongKey,
    /// No decryption key is configured.
    MissingKey,
    /// The ciphertext of a layer changed, digests recomputed.
    TamperedCiphertext,
    /// Two layers' wrapped keys swapped, digests recomputed.
    SwappedWrappedKey,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::WrongKey,
        Refusal::MissingKey,
        Refusal::TamperedCiphertext,
        Refusal::SwappedWrappedKey,
    ];

    /// A name for tags and directories.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::WrongKey => "wrong-key",
            Refusal::MissingKey => "missing-key",
            Refusal::TamperedCiphertext => "tampered",
            Refusal::SwappedWrappedKey => "swapped",
        }
    }

    /// Whether the image itself is altered (else the node's keys are).
    pub fn alters_image(self) -> bool {
        matches!(
            self,
            Refusal::TamperedCiphertext | Refusal::SwappedWrappedKey
        )
    }

    /// Alters the encrypted layout at `layout` as this refusal needs (nothing for the key
    /// refusals).
    pub fn alter(self, layout: &Path) -> Result<()> {
        match self {
            Refusal::TamperedCiphertext => tamper_ciphertext(layout),
            Refusal::SwappedWrappedKey => swap_wrapped_keys(layout),
            Refusal::WrongKey | Refusal::MissingKey => Ok(()),
        }
    }

    /// Checks the refusal's message: one `encrypted for` line naming the recipients (`alg key
    /// kid`) and what was wrong with the keys, or the integrity failure; `image` must be named.
    pub fn check_message(self, err: &str, image: &str, recipient_kid: &str) -> Result<()> {
        ensure!(
            err.contains(image),
            "the refusal does not name {image}: {err}"
        );
        let says: &[&str] = match self {
            Refusal::WrongKey => &["encrypted for", "none of the configured keys opens it"],
            Refusal::MissingKey => &["encrypted for", "no decryption key is configured"],
            Refusal::TamperedCiphertext | Refusal::SwappedWrappedKey => &[
                "encrypted layer refused",
                "HMAC over the ciphertext does not match",
            ],
        };
        for s in says {
            ensure!(
                err.contains(s),
                "{self:?}: the refusal does not say {s:?}: {err}"
            );
        }
        if !self.alters_image() {
            ensure!(
                err.contains(recipient_kid),
                "{self:?}: the refusal does not name the key that would open it ({recipient_kid}): {err}"
            );
            ensure!(
                err.matches("encrypted for").count() == 1,
                "{self:?}: one line, not one per layer: {err}"
            );
        }
        Ok(())
    }
}

/// `kid` of a PEM public key as gpusnap names recipients: `sha256:<hex>` of its
/// SubjectPublicKeyInfo (DER), computed here with the openssl CLI.
pub fn key_fingerprint(public_pem: &Path) -> Result<String> {
    let der = public_pem.with_extension("der");
    let out = std::process::Command::new("openssl")
        .args(["pkey", "-pubin", "-outform", "DER", "-in"])
        .arg(public_pem)
        .arg("-out")
        .arg(&der)
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "openssl pkey: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kid = sha256_file(&der);
    fs::remove_file(&der)?;
    Ok(kid)
}

/// What a checkpoint root and a node store held before a pull that must be refused; after
/// it, [`NothingLeft::check`] says it left nothing: no destination, no staging directory in
/// the root, no reference, no temporary file in the store, and every blob the store holds is
/// the content of its name (verified; the next collection removes those nothing references).
pub struct NothingLeft {
    root: PathBuf,
    store: PathBuf,
    root_entries: BTreeSet<OsString>,
    refs: BTreeSet<OsString>,
}

fn names(dir: &Path) -> Result<BTreeSet<OsString>> {
    match fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(e) => Err(e).with_context(|| format!("listing {}", dir.display())),
    }
}

impl NothingLeft {
    pub fn before(root: &Path, store: &Path) -> Result<NothingLeft> {
        Ok(NothingLeft {
            root: root.to_owned(),
            store: store.to_owned(),
            root_entries: names(root)?,
            refs: names(&store.join("refs"))?,
        })
    }

    pub fn check(&self, what: &str, dest: &Path) -> Result<()> {
        ensure!(!dest.exists(), "{what}: {} exists", dest.display());
        let now = names(&self.root)?;
        ensure!(
            now == self.root_entries,
            "{what}: {} held {:?}, now {:?}",
            self.root.display(),
            self.root_entries,
            now
        );
        let refs = names(&self.store.join("refs"))?;
        ensure!(
            refs == self.refs,
            "{what}: the store's references changed: {:?} → {refs:?}",
            self.refs
        );
        let tmp = names(&self.store.join("tmp"))?;
        ensure!(
            tmp.is_empty(),
            "{what}: the store keeps temporary files {tmp:?}"
        );
        for name in names(&self.store.join("blobs"))? {
            let path = self.store.join("blobs").join(&name);
            let want = format!("sha256:{}", name.to_string_lossy());
            let got = sha256_file(&path);
            ensure!(
                got == want,
                "{what}: store blob {} holds {got}",
                path.display()
            );
        }
        Ok(())
    }
}
