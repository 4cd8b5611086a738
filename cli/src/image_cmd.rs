//! `gpusnap image build|push|pull|sign`: thin wrappers around [`gpusnap_oci_image`].
//!
//! Each subcommand prints a short summary (or, with `--json`, one JSON document on stdout) and
//! fails with the library's error, which names the file, blob or URL involved; integrity
//! failures (a blob whose digest or size does not match) name the blob's digest.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::{ArgGroup, Args, Subcommand};
use gpusnap_checkpoint::layout;
use gpusnap_checkpoint::origin::SignatureCheck;
use gpusnap_oci_image::registry::{
    default_parallel_blobs, DEFAULT_MAX_BLOB_BYTES, DEFAULT_MAX_MANIFEST_BYTES,
};
use gpusnap_oci_image::{
    self as image, BuildOptions, BuiltImage, Credentials, Extracted, ImageError, ImageInfo,
    LayerRole, PullReport, PushReport, RegistryOptions, SignReport, SignatureOptions,
};
use serde::Serialize;

use crate::inspect::human_bytes;
use crate::term;

#[derive(Subcommand)]
pub enum ImageCommand {
    /// Build a combined OCI checkpoint image from a CRI checkpoint archive or checkpoint directory.
    Build(BuildArgs),
    /// Push an OCI checkpoint image (oci-archive or layout), or a checkpoint itself, to a registry.
    Push(PushArgs),
    /// Pull a checkpoint image from a registry: save it, or extract the checkpoint (verified).
    Pull(PullArgs),
    /// Sign an image in a registry, cosign-compatible (key-based, no transparency log).
    Sign(SignArgs),
}

/// How to reach and authenticate to the registry (push, pull, sign).
#[derive(Args, Clone)]
pub struct RegistryArgs {
    /// Talk plain HTTP to the registry (also implied by an http:// reference). Meant for a
    /// loopback or node-local registry only.
    #[arg(long)]
    pub plain_http: bool,
    /// PEM file of CA certificates (a bundle is fine) trusted in addition to the system
    /// roots (repeatable).
    #[arg(long = "ca-file", value_name = "PEM")]
    pub ca_files: Vec<PathBuf>,
    /// docker config.json to take credentials from (auths[REGISTRY].auth)
    /// [default: $DOCKER_CONFIG/config.json, else ~/.docker/config.json].
    #[arg(long, value_name = "CONFIG.json")]
    pub registry_config: Option<PathBuf>,
    /// Refuse any manifest, index or image config larger than this.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_MANIFEST_BYTES)]
    pub max_manifest_bytes: u64,
    /// Refuse any blob (layer) larger than this, whatever its descriptor says; also caps a
    /// gzip layer once decompressed [default: no fixed cap — the blobs must fit in the
    /// destination's free space, checked before the first is fetched, and every byte
    /// unpacked is charged against it].
    #[arg(long, value_name = "BYTES")]
    pub max_blob_bytes: Option<u64>,
    /// Blobs uploaded or downloaded at once (each hashed, written or unpacked on its own
    /// thread while it streams) [default: one per two cores, 4 to 8].
    #[arg(long, value_name = "N", default_value_t = default_parallel_blobs() as u64,
          hide_default_value = true, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub parallel_blobs: u64,
}

impl RegistryArgs {
    fn options(&self) -> RegistryOptions {
        RegistryOptions {
            plain_http: self.plain_http,
            ca_files: self.ca_files.clone(),
            credentials: match &self.registry_config {
                Some(p) => Credentials::DockerConfig(p.clone()),
                None => Credentials::Auto,
            },
            max_manifest_bytes: self.max_manifest_bytes,
            max_blob_bytes: self.max_blob_bytes.unwrap_or(DEFAULT_MAX_BLOB_BYTES),
            parallel_blobs: self.parallel_blobs as usize,
            ..Default::default()
        }
    }
}

#[derive(Args)]
pub struct SignArgs {
    /// The image: REGISTRY/REPOSITORY:TAG (the digest it points at now is signed) or
    /// ...@sha256:DIGEST.
    pub reference: String,
    /// Private key: PKCS#8 PEM, or cosign's encrypted cosign.key (password in $COSIGN_PASSWORD).
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// One JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// How a checkpoint becomes an image: `gpusnap image build`, and `push` of a checkpoint.
#[derive(Args)]
pub struct ImageShapeArgs {
    /// Container name for the engines' checkpoint annotations [default: from config.dump /
    /// spec.dump, else the manifest's container id].
    #[arg(long, value_name = "NAME")]
    pub container_name: Option<String>,
    /// Extra annotation on the image index and manifest (repeatable).
    #[arg(long = "annotation", value_name = "KEY=VALUE", value_parser = parse_annotation)]
    pub annotations: Vec<(String, String)>,
    /// Do not re-hash the checkpoint against its sealed gpusnap manifest while building.
    #[arg(long)]
    pub no_verify: bool,
    /// The classic layout: page images whole in the CRIU-images layer, one layer per GPU
    /// extent, no chunks [default: chunked, which every gpusnap restore door assembles].
    #[arg(long)]
    pub classic: bool,
}

impl ImageShapeArgs {
    /// Build options for these flags, encrypting for `recipients` (`--encrypt-recipient`).
    fn options(&self, recipients: &[String]) -> Result<BuildOptions> {
        Ok(BuildOptions {
            container_name: self.container_name.clone(),
            verify_checkpoint: !self.no_verify,
            annotations: self.annotations.iter().cloned().collect(),
            chunking: (!self.classic).then(image::Chunking::default),
            encrypt_to: if recipients.is_empty() {
                None
            } else {
                Some(image::crypt::recipients(recipients)?)
            },
            ..BuildOptions::default()
        })
    }

    /// The flags given, by name (refused when the source is already an image).
    fn given(&self) -> Vec<&'static str> {
        [
            ("--container-name", self.container_name.is_some()),
            ("--annotation", !self.annotations.is_empty()),
            ("--no-verify", self.no_verify),
            ("--classic", self.classic),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect()
    }
}

#[derive(Args)]
#[command(group(ArgGroup::new("outputs").required(true).multiple(true).args(["output", "layout"])))]
pub struct BuildArgs {
    /// CRI checkpoint archive (.tar, as kubelet writes it), its extracted tree, or a gpusnap
    /// checkpoint directory.
    pub source: PathBuf,
    /// Image name recorded in the image (e.g. registry.example.com/ckpt/trainer:v1)
    /// [default: localhost/gpusnap-checkpoint/<container name>:latest].
    #[arg(long, short = 't', value_name = "NAME")]
    pub tag: Option<String>,
    /// Write an oci-archive tar here (replaced if it exists).
    #[arg(long, short = 'o', value_name = "OCI-ARCHIVE.tar")]
    pub output: Option<PathBuf>,
    /// Write an OCI image layout directory here (must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    pub layout: Option<PathBuf>,
    #[command(flatten)]
    pub shape: ImageShapeArgs,
    /// Encrypt every layer (ocicrypt format, as skopeo/buildah/imgcrypt read it) for this
    /// recipient: jwe:PUBLIC-KEY.pem, RSA or EC (repeatable: any one recipient's key opens it).
    #[arg(long = "encrypt-recipient", value_name = "jwe:PUBKEY.pem")]
    pub encrypt_recipients: Vec<String>,
    /// One JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct PushArgs {
    /// oci-archive tar or OCI image layout directory (what `gpusnap image build` wrote); or a
    /// checkpoint (gpusnap checkpoint directory, CRI checkpoint archive or its tree), built as
    /// `gpusnap image build` would and pushed straight from its files, with no copy of it.
    pub image: PathBuf,
    /// Destination: [http://]REGISTRY/REPOSITORY:TAG.
    pub reference: String,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Sign the pushed image with this private key (as `gpusnap image sign` does).
    #[arg(long, value_name = "KEY")]
    pub sign_key: Option<PathBuf>,
    /// Which image to push when the layout holds several (its name in index.json).
    #[arg(long, value_name = "NAME")]
    pub image_name: Option<String>,
    /// Push the image with every layer encrypted for this recipient (jwe:PUBKEY.pem,
    /// repeatable); IMAGE must be a layout directory (left unencrypted) or a checkpoint.
    #[arg(long = "encrypt-recipient", value_name = "jwe:PUBKEY.pem")]
    pub encrypt_recipients: Vec<String>,
    /// With a checkpoint as IMAGE, how it becomes one (as `gpusnap image build` takes them).
    #[command(flatten)]
    pub shape: ImageShapeArgs,
    /// One JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
#[command(group(ArgGroup::new("destination").required(true).multiple(true).args(["output", "layout", "extract"])))]
pub struct PullArgs {
    /// Source: [http://]REGISTRY/REPOSITORY:TAG or ...@sha256:DIGEST.
    pub reference: String,
    /// Save the image as an oci-archive tar (replaced if it exists).
    #[arg(long, short = 'o', value_name = "OCI-ARCHIVE.tar")]
    pub output: Option<PathBuf>,
    /// Save the image as an OCI image layout directory (must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    pub layout: Option<PathBuf>,
    /// Extract the checkpoint (every layer digest verified) into DIR, which must not exist or
    /// be empty. A bare NAME (no '/') means <restore.checkpoint_root>/NAME from the config,
    /// where the pod annotation `gpusnap.io/restore-from: NAME` finds it.
    #[arg(long, value_name = "DIR|NAME")]
    pub extract: Option<String>,
    /// Private key (PEM, root-owned 0600) for encrypted images, in addition to the config's
    /// restore.decryption_keys (repeatable).
    #[arg(long = "decryption-key", value_name = "KEY.pem")]
    pub decryption_keys: Vec<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// One JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// An `--annotation` value that is not `KEY=VALUE`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not KEY=VALUE")]
struct NotKeyValue(String);

fn parse_annotation(s: &str) -> Result<(String, String), NotKeyValue> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(NotKeyValue(s.to_owned())),
    }
}

/// Runs one `gpusnap image` subcommand; `config` is the gpusnap config file (for
/// `restore.checkpoint_root`). Returns the exit code.
pub fn run(config: &Path, cmd: ImageCommand) -> Result<u8> {
    match cmd {
        ImageCommand::Build(a) => cmd_build(a),
        ImageCommand::Push(a) => cmd_push(config, a),
        ImageCommand::Pull(a) => cmd_pull(config, a),
        ImageCommand::Sign(a) => cmd_sign(a),
    }
}

fn print_json<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn rows(rows: &[(&str, String)]) -> String {
    let width = term::width();
    let mut out = String::new();
    for (label, value) in rows {
        out.push_str(&term::wrap(&format!("{label:<11} "), value, width, 12));
    }
    out
}

fn layer_summary(layers: &[image::LayerInfo]) -> String {
    let mut by_role: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for l in layers {
        let e = by_role.entry(l.role.as_str()).or_default();
        e.0 += 1;
        e.1 += l.descriptor.size;
    }
    by_role
        .iter()
        .map(|(role, (n, bytes))| {
            if *n == 1 {
                format!("{role} {}", human_bytes(*bytes))
            } else {
                format!("{n}× {role} {}", human_bytes(*bytes))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn cmd_build(a: BuildArgs) -> Result<u8> {
    let opts = BuildOptions {
        layout_dir: a.layout.clone(),
        archive_path: a.output.clone(),
        image_name: a.tag.clone(),
        ..a.shape.options(&a.encrypt_recipients)?
    };
    let progress = crate::progress::BuildProgress::start();
    let built = image::build(&a.source, &opts)
        .with_context(|| format!("gpusnap image build {}", a.source.display()))?;
    drop(progress);
    if a.json {
        print_json(&built)?;
    } else {
        print!("{}", render_built(&built, &a.source, !a.shape.no_verify));
    }
    Ok(0)
}

fn render_built(b: &BuiltImage, source: &Path, verified: bool) -> String {
    let mut r = vec![
        ("Image", b.image_name.clone()),
        (
            "Source",
            format!(
                "{} ({}){}",
                source.display(),
                b.source_layout.as_str(),
                if verified {
                    ", verified against the sealed manifest"
                } else {
                    ", NOT verified (--no-verify)"
                }
            ),
        ),
        ("Container", b.container_name.clone()),
        ("Digest", b.index_digest.to_string()),
        (
            "Layers",
            format!(
                "{} ({}): {}",
                b.layers.len(),
                human_bytes(b.total_layer_bytes),
                layer_summary(&b.layers)
            ),
        ),
    ];
    if let Some(c) = &b.chunks {
        r.push((
            "Chunks",
            format!(
                "{} files, {} chunks ({} distinct): {} stored for {} in {} packs",
                c.files,
                c.chunks,
                c.distinct_chunks,
                human_bytes(c.stored_bytes),
                human_bytes(c.logical_bytes),
                c.packs
            ),
        ));
    }
    if let Some(p) = &b.archive_path {
        r.push(("Archive", p.display().to_string()));
    }
    if let Some(p) = &b.layout_dir {
        r.push(("Layout", p.display().to_string()));
    }
    let mut out = rows(&r);
    let src = b.archive_path.as_ref().or(b.layout_dir.as_ref());
    if let Some(src) = src {
        out.push_str(&format!(
            "next: gpusnap image push {} {}\n",
            src.display(),
            b.image_name
        ));
    }
    out
}

fn cmd_push(config: &Path, a: PushArgs) -> Result<u8> {
    let cfg = gpusnap_config::Config::load(config)
        .with_context(|| format!("reading {}", config.display()))?;
    let (progress, line) = crate::progress::ProgressLine::start("uploaded");
    let opts = RegistryOptions {
        image_name: a.image_name.clone(),
        sign_key: a.sign_key.clone(),
        store: crate::store_cmd::node_store(&cfg)?,
        progress,
        ..a.registry.options()
    };
    if !image::is_image(&a.image)
        .with_context(|| format!("gpusnap image push {}", a.image.display()))?
    {
        return push_checkpoint(a, &opts);
    }
    if let Some(flag) = a.shape.given().first() {
        bail!(
            "{flag} applies when IMAGE is a checkpoint; {} is already an image (give it to \
             `gpusnap image build` instead)",
            a.image.display()
        );
    }
    // Encrypting on push: an encrypted copy of the layout beside it, pushed, then removed.
    let scratch;
    let source = if a.encrypt_recipients.is_empty() {
        a.image.clone()
    } else {
        let recipients = image::crypt::recipients(&a.encrypt_recipients)?;
        let parent = a
            .image
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        scratch = tempfile::Builder::new()
            .prefix(".gpusnap-encrypt-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a scratch directory in {}", parent.display()))?;
        let dest = scratch.path().join("layout");
        image::crypt::encrypt_copy(&a.image, &dest, &recipients)
            .with_context(|| format!("encrypting {}", a.image.display()))?;
        dest
    };
    let report = image::push(&source, &a.reference, &opts)
        .with_context(|| format!("gpusnap image push {} {}", a.image.display(), a.reference))?;
    drop(line);
    if a.json {
        print_json(&report)?;
    } else {
        print!("{}", render_push(&report));
    }
    Ok(0)
}

/// `gpusnap image push CHECKPOINT REF`: built and pushed in one go; the packs are read from
/// the checkpoint's files as they upload, the small blobs staged in a scratch directory beside
/// it (removed afterwards).
fn push_checkpoint(a: PushArgs, opts: &RegistryOptions) -> Result<u8> {
    let build = a.shape.options(&a.encrypt_recipients)?;
    let parent = a
        .image
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let scratch = tempfile::Builder::new()
        .prefix(".gpusnap-push-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a scratch directory in {}", parent.display()))?;
    let layout = scratch.path().join("layout");
    let (built, report) = image::push_checkpoint(&a.image, &layout, &a.reference, &build, opts)
        .with_context(|| format!("gpusnap image push {} {}", a.image.display(), a.reference))?;
    if a.json {
        #[derive(Serialize)]
        struct Both<'a> {
            #[serde(flatten)]
            push: &'a PushReport,
            built: &'a BuiltImage,
        }
        print_json(&Both {
            push: &report,
            built: &built,
        })?;
    } else {
        print!(
            "{}{}",
            render_built(&built, &a.image, !a.shape.no_verify),
            render_push(&report)
        );
    }
    Ok(0)
}

fn render_push(p: &PushReport) -> String {
    let mut out = rows(&[
        ("Pushed", p.reference.clone()),
        ("Digest", format!("{} ({})", p.digest, p.media_type)),
        (
            "Blobs",
            crate::progress::transfer_line("uploaded", &p.transfer),
        ),
    ]);
    if let Some(sig) = &p.signature {
        out.push_str(&render_sign(sig));
    }
    out
}

fn cmd_sign(a: SignArgs) -> Result<u8> {
    let report = image::sign(&a.reference, &a.key, &a.registry.options())
        .with_context(|| format!("gpusnap image sign {}", a.reference))?;
    if a.json {
        print_json(&report)?;
    } else {
        print!("{}", render_sign(&report));
    }
    Ok(0)
}

fn render_sign(s: &SignReport) -> String {
    rows(&[
        (
            "Signed",
            format!(
                "{} ({}{})",
                s.digest,
                s.reference,
                if s.pinned {
                    ""
                } else {
                    ", the digest its tag pointed at now"
                }
            ),
        ),
        (
            "Signature",
            format!(
                "{} with {} ({} signature(s) there now)",
                s.signature_reference,
                s.key.display(),
                s.signatures
            ),
        ),
    ])
}

/// What `gpusnap image pull` did, for `--json`.
#[derive(Debug, Serialize)]
pub struct PullOutput {
    pub pull: PullReport,
    /// What was verified, in one sentence ([`PullReport::verification`]).
    pub verification: String,
    /// The oci-archive written with `-o`.
    pub archive: Option<PathBuf>,
    /// The layout kept with `--layout`.
    pub layout: Option<PathBuf>,
    /// The checkpoint extracted with `--extract`.
    pub extracted: Option<Extracted>,
    /// The `gpusnap.io/restore-from` value that restores the extracted checkpoint, when it
    /// lies directly under `restore.checkpoint_root`.
    pub restore_from: Option<String>,
}

/// `--extract` argument → (destination, checkpoint root). A bare name resolves under the
/// configured `restore.checkpoint_root`; anything with a '/' is a path.
fn extract_dest(cfg: &gpusnap_config::Config, arg: &str) -> Result<(PathBuf, PathBuf)> {
    let root = cfg.restore.checkpoint_root.clone();
    if arg.contains('/') {
        // The root only tells whether to print the annotation.
        return Ok((PathBuf::from(arg), root));
    }
    if !layout::is_checkpoint_name(arg) {
        bail!(
            "--extract {arg:?}: not a checkpoint name (letters, digits, '.', '_', '-', not \
             .gpusnap-*) nor a path; give a name to extract under {} or a path containing '/'",
            root.display()
        );
    }
    Ok((root.join(arg), root))
}

/// While a pull runs, SIGINT and SIGTERM only ask it to stop ([`image::interrupt`]): it then
/// fails like any other error, and its staging directories and scratch files are removed. A
/// second signal, or a pull that does not stop within 30 s, ends the process (status 130).
fn catch_interrupts() {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    // Blocked in this thread before any other starts, so every thread inherits the mask and
    // only the waiter below receives them.
    if nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None).is_err() {
        return;
    }
    std::thread::spawn(move || {
        if let Ok(sig) = set.wait() {
            eprintln!("gpusnap: {sig}: stopping the pull and removing what it wrote");
            image::interrupt::request();
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let second = std::thread::spawn(move || {
                let _ = set.wait();
                let _ = tx.send(());
            });
            drop(second);
            let _ = rx.recv_timeout(std::time::Duration::from_secs(30));
            std::process::exit(130);
        }
    });
}

fn is_interrupted(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<ImageError>(),
            Some(ImageError::Interrupted)
        )
    })
}

fn cmd_pull(config: &Path, a: PullArgs) -> Result<u8> {
    // The node's signature policy applies to every pull, whatever it is pulled for.
    let cfg = gpusnap_config::Config::load(config)
        .with_context(|| format!("reading {}", config.display()))?;
    catch_interrupts();
    match pull_with(&cfg, a) {
        Err(e) if is_interrupted(&e) => {
            eprintln!("gpusnap: {e:#}");
            Ok(130)
        }
        other => other,
    }
}

fn pull_with(cfg: &gpusnap_config::Config, a: PullArgs) -> Result<u8> {
    let extract = match &a.extract {
        Some(arg) => Some(extract_dest(cfg, arg)?),
        None => None,
    };
    if let Some((dest, root)) = &extract {
        if dest.parent() == Some(root.as_path()) {
            // Checkpoints hold process memory: the root is readable by root only.
            gpusnap_checkpoint::beneath::create_private_dir(root)
                .with_context(|| format!("creating checkpoint root {}", root.display()))?;
        }
    }
    let (progress, line) = crate::progress::ProgressLine::start("downloaded");
    let opts = RegistryOptions {
        signatures: SignatureOptions {
            policy: cfg.restore.signature_policy,
            keys: cfg.restore.signature_keys.clone(),
            // Extracting: under `require` the checkpoint's own signature may vouch for an image
            // the registry has no signature for; it is verified before the checkpoint is put in
            // place.
            directory_may_vouch: extract.is_some(),
        },
        store: crate::store_cmd::node_store(cfg)?,
        progress,
        decryption: if extract.is_some() {
            let mut keys = cfg.restore.decryption_keys.clone();
            keys.extend(a.decryption_keys.iter().cloned());
            image::crypt::Decryption::load(&keys)?
        } else {
            Default::default()
        },
        ..a.registry.options()
    };
    if let (Some((dest, root)), None, None) = (&extract, &a.output, &a.layout) {
        // Only the checkpoint is wanted: each layer is unpacked as it downloads, with no
        // layout written and read back in between.
        let (report, ex) = image::pull_extract(&a.reference, dest, &opts).with_context(|| {
            format!(
                "gpusnap image pull {} --extract {}",
                a.reference,
                dest.display()
            )
        })?;
        drop(line);
        let restore_from = if dest.parent() == Some(root.as_path()) {
            dest.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .filter(|n| layout::is_checkpoint_name(n))
        } else {
            None
        };
        let out = PullOutput {
            verification: report.verification(),
            pull: report,
            archive: None,
            layout: None,
            extracted: Some(ex),
            restore_from,
        };
        if a.json {
            print_json(&out)?;
        } else {
            print!("{}", render_pull(&out));
        }
        return Ok(0);
    }
    // Pull into the kept layout, or a scratch one next to where the result goes.
    let scratch_parent = a
        .output
        .as_deref()
        .or(extract.as_ref().map(|(d, _)| d.as_path()))
        .and_then(Path::parent)
        .filter(|p| !p.as_os_str().is_empty() && p.is_dir())
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let scratch;
    let layout_dir = match &a.layout {
        Some(l) => l.clone(),
        None => {
            // Named and locked like a pull's staging directory: if this pull is killed, the
            // next one (or `gpusnap store gc`) removes it.
            scratch = image::staging::scratch(&scratch_parent).with_context(|| {
                format!(
                    "creating a scratch directory in {}",
                    scratch_parent.display()
                )
            })?;
            scratch.path().join("layout")
        }
    };
    let report = image::pull(&a.reference, &layout_dir, &opts)
        .with_context(|| format!("gpusnap image pull {}", a.reference))?;
    drop(line);
    let mut out = PullOutput {
        verification: report.verification(),
        pull: report,
        archive: None,
        layout: a.layout.clone(),
        extracted: None,
        restore_from: None,
    };
    let result = (|| -> Result<()> {
        if let Some(archive) = &a.output {
            pack_layout(&layout_dir, archive)
                .with_context(|| format!("writing oci-archive {}", archive.display()))?;
            out.archive = Some(archive.clone());
        }
        if let Some((dest, root)) = &extract {
            let seed = image::OriginSeed {
                source: out.pull.reference.clone(),
                pinned: out.pull.pinned,
                signature: out.pull.signature.clone(),
            };
            let limits = image::ExtractOptions {
                max_layer_bytes: opts.max_blob_bytes,
                decryption: opts.decryption.clone(),
                directory_signature: opts.signatures.directory_requirement(&out.pull.signature),
            };
            let ex = image::extract_with(&layout_dir, None, dest, &seed, &limits)
                .with_context(|| format!("extracting {} into {}", a.reference, dest.display()))?;
            out.pull.signature = ex.signature.clone();
            if dest.parent() == Some(root.as_path()) {
                out.restore_from = dest
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .filter(|n| layout::is_checkpoint_name(n));
            }
            out.extracted = Some(ex);
        }
        Ok(())
    })();
    if let Err(e) = result {
        // A kept layout that was made for this pull goes too: a failed pull leaves nothing.
        if a.layout.is_some() {
            let _ = fs::remove_dir_all(&layout_dir);
        }
        if let Some(archive) = out.archive.as_ref() {
            let _ = fs::remove_file(archive);
        }
        return Err(e);
    }
    if a.json {
        print_json(&out)?;
    } else {
        print!("{}", render_pull(&out));
    }
    Ok(0)
}

fn render_pull(o: &PullOutput) -> String {
    let mut r = vec![
        ("Pulled", o.pull.reference.clone()),
        (
            "Digest",
            format!("{} ({})", o.pull.digest, o.pull.media_type),
        ),
        (
            "Blobs",
            format!(
                "{} ({}); {}",
                o.pull.blobs,
                human_bytes(o.pull.bytes),
                crate::progress::transfer_line("downloaded", &o.pull.transfer)
            ),
        ),
        ("Verified", o.verification.clone()),
        (
            "Signature",
            match &o.pull.signature {
                SignatureCheck::Verified { key } => format!("verified with {key}"),
                SignatureCheck::NotChecked => {
                    "not checked (restore.signature_policy = off)".to_owned()
                }
                SignatureCheck::Missing { reason } => {
                    format!("MISSING ({reason}); kept because restore.signature_policy = warn")
                }
                SignatureCheck::DirectoryVerified { key, registry } => format!(
                    "the checkpoint's own signature verified with {key} (no registry signature: \
                     {registry})"
                ),
            },
        ),
    ];
    if let Some(p) = &o.archive {
        r.push(("Archive", p.display().to_string()));
    }
    if let Some(p) = &o.layout {
        r.push(("Layout", p.display().to_string()));
    }
    if let Some(e) = &o.extracted {
        r.push((
            "Checkpoint",
            format!(
                "{} ({}, container {}, {} files)",
                e.checkpoint_dir.display(),
                e.source_layout.as_str(),
                e.gpusnap_manifest.container_id,
                e.gpusnap_manifest.images.files.len()
            ),
        ));
    }
    let mut out = rows(&r);
    if let Some(name) = &o.restore_from {
        out.push_str(&format!(
            "restore it in a pod with the annotation  gpusnap.io/restore-from: {name}\n"
        ));
    }
    out
}

/// Packs an OCI layout directory into an oci-archive tar (`oci-layout` and `index.json`
/// first), written beside `archive` and renamed into place. The layout's files are opened
/// beneath it as regular files, never through a symlink.
fn pack_layout(layout: &Path, archive: &Path) -> Result<()> {
    use gpusnap_checkpoint::beneath;
    use std::os::fd::AsFd;
    let parent = archive
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".gpusnap-oci-")
        .tempfile_in(parent)
        .with_context(|| format!("creating a temporary file in {}", parent.display()))?;
    let root =
        beneath::open_root(layout).with_context(|| format!("opening {}", layout.display()))?;
    {
        let mut b = tar::Builder::new(std::io::BufWriter::new(tmp.as_file()));
        b.mode(tar::HeaderMode::Deterministic);
        let append = |b: &mut tar::Builder<_>, name: &str| -> Result<()> {
            let mut f = beneath::open_file(root.as_fd(), Path::new(name))
                .with_context(|| format!("opening {}", layout.join(name).display()))?;
            b.append_file(name, &mut f)?;
            Ok(())
        };
        for name in ["oci-layout", "index.json"] {
            append(&mut b, name)?;
        }
        let blobs = beneath::open_dir(root.as_fd(), Path::new("blobs"))
            .with_context(|| format!("opening {}", layout.join("blobs").display()))?;
        for alg in beneath::names(blobs.as_fd())? {
            let alg_name = alg.to_string_lossy().into_owned();
            let dir = beneath::open_dir(blobs.as_fd(), Path::new(&alg)).with_context(|| {
                format!("opening {}", layout.join("blobs").join(&alg).display())
            })?;
            for f in beneath::names(dir.as_fd())? {
                append(&mut b, &format!("blobs/{alg_name}/{}", f.to_string_lossy()))?;
            }
        }
        b.into_inner()?.flush()?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(archive)?;
    Ok(())
}

/// True if `path` is an OCI image layout directory (has `oci-layout`, a regular file beneath
/// it: a symlink named so does not make one).
pub fn is_oci_layout(path: &Path) -> bool {
    use gpusnap_checkpoint::beneath;
    use std::os::fd::AsFd;
    beneath::open_root(path)
        .and_then(|fd| beneath::stat_at(fd.as_fd(), std::ffi::OsStr::new("oci-layout")))
        .is_ok_and(|st| {
            st.is_some_and(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
            })
        })
}

/// `gpusnap inspect` of an OCI image: `Ok(None)` when `path` is not one (a checkpoint
/// directory, CRI archive, ...), so the caller falls back to the checkpoint inspection. The
/// keys open an encrypted image's gpusnap-manifest layer.
pub fn try_inspect_image(
    path: &Path,
    decryption: &image::crypt::Decryption,
) -> Result<Option<ImageInfo>> {
    if path.is_dir() && !is_oci_layout(path) {
        return Ok(None);
    }
    if !path.is_dir() && !path.is_file() {
        return Ok(None);
    }
    match image::inspect_with(path, None, decryption) {
        Ok(info) => Ok(Some(info)),
        Err(image::ImageError::NotAnImage { .. }) => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context(format!("inspecting {}", path.display()))),
    }
}

/// The terminal summary of an OCI checkpoint image.
pub fn render_image(i: &ImageInfo, width: usize) -> String {
    let mut r: Vec<(&str, String)> = vec![(
        "Image",
        format!(
            "{} (OCI image{})",
            i.location,
            i.image_name
                .as_deref()
                .map(|n| format!(" {n}"))
                .unwrap_or_default()
        ),
    )];
    if let Some(d) = &i.index_digest {
        r.push(("Digest", d.to_string()));
    }
    r.push(("Manifest", i.manifest_digest.to_string()));
    r.push((
        "Platform",
        format!(
            "{}/{}{}",
            i.os,
            i.architecture,
            i.created
                .as_deref()
                .map(|c| format!(", created {c}"))
                .unwrap_or_default()
        ),
    ));
    r.push((
        "Checkpoint",
        match &i.checkpoint_name {
            Some(n) => format!(
                "container {n}{}",
                i.source_layout
                    .map(|l| format!(" ({})", l.as_str()))
                    .unwrap_or_default()
            ),
            None => "none: neither containerd nor CRI-O treats this image as a checkpoint".into(),
        },
    ));
    r.push((
        "Layers",
        format!(
            "{} ({}): {}",
            i.layers.len(),
            human_bytes(i.total_layer_bytes),
            layer_summary(&i.layers)
        ),
    ));
    let gpu: Vec<String> = i
        .layers
        .iter()
        .filter(|l| l.role == LayerRole::GpuExtent)
        .map(|l| {
            format!(
                "{} {}",
                l.gpu_extent.as_deref().unwrap_or("?"),
                human_bytes(l.descriptor.size)
            )
        })
        .collect();
    if !gpu.is_empty() {
        r.push(("GPU", gpu.join(", ")));
    }
    if let Some(e) = &i.encryption {
        r.push((
            "Encrypted",
            format!(
                "{} of {} layers (ocicrypt), for {} recipient(s): {}",
                e.encrypted_layers,
                i.layers.len(),
                e.recipients.len(),
                e.recipients.join(", ")
            ),
        ));
    }
    match &i.gpusnap_manifest {
        Some(m) => {
            r.push((
                "Container",
                format!(
                    "{} (checkpointed {} by gpusnap {}, {} files, {})",
                    m.container_id,
                    m.created_at,
                    m.gpusnap_version,
                    m.images.files.len(),
                    human_bytes(m.images.total_bytes)
                ),
            ));
            r.push((
                "Validation",
                "image metadata verified; layer digests are verified on pull/extract".into(),
            ));
        }
        None => r.push((
            "Validation",
            match i.encryption.as_ref().map(|e| &e.manifest_layer) {
                Some(image::ManifestLayer::Sealed { reason }) => format!(
                    "NOT VERIFIED: the gpusnap manifest is in an encrypted layer that no given \
                     key opens ({reason}); pass --decryption-key KEY.pem or set \
                     restore.decryption_keys"
                ),
                _ => "REFUSED: no gpusnap manifest in the image; gpusnap cannot restore it".into(),
            },
        )),
    }
    let mut out = String::new();
    for (label, value) in r {
        out.push_str(&term::wrap(&format!("{label:<11} "), &value, width, 12));
    }
    out
}
