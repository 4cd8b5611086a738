//! `gpusnap store ls|du|gc|verify`: the operator's view of the node's blob store
//! ([`gpusnap_node_store`]), and how `gpusnap image push|pull` open it.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use gpusnap_node_store::Store;
use gpusnap_oci_image::NodeStore;
use serde::Serialize;

use crate::inspect::human_bytes;
use crate::term;

#[derive(Subcommand)]
pub enum StoreCommand {
    /// List the blobs in the store, most recently used first, with their references.
    Ls(OutputArgs),
    /// What the store holds: blobs, bytes, what references keep, leftovers.
    Du(OutputArgs),
    /// Hash every blob (damaged ones are dropped first), then remove leftovers of interrupted
    /// pulls (the store's temporary files, and staging directories in restore.checkpoint_root
    /// whose pull is gone), the node's copies of image-volume checkpoints no pod holds and
    /// copies a killed restore left half-made (restore.checkpoint_root/.gpusnap-volumes),
    /// references whose image or checkpoint is gone, and unreferenced blobs (least recently
    /// used first) down to the cap. Waits for running pulls.
    Gc(GcArgs),
    /// Hash every blob and drop those whose bytes are not the blob their name says (damaged
    /// on disk): the next pull needing one downloads it again. Runs beside pulls.
    Verify(OutputArgs),
}

#[derive(Args)]
pub struct OutputArgs {
    /// One JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct GcArgs {
    /// Bring the store down to this many bytes instead of store.max_bytes (0: remove every
    /// unreferenced blob).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub max_bytes: Option<u64>,
    /// Skip hashing the blobs (collect only; a pull still drops a damaged blob it reads).
    #[arg(long)]
    pub no_verify: bool,
    /// One JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

fn parse_size(s: &str) -> Result<u64, gpusnap_config::ByteSizeError> {
    gpusnap_config::parse_bytes(s)
}

/// The node store for `gpusnap image push|pull`: opened (created on first use) when running
/// as root, which owns it; other users push and pull without it.
pub fn node_store(cfg: &gpusnap_config::Config) -> Result<Option<NodeStore>> {
    if !nix::unistd::geteuid().is_root() {
        tracing::debug!("not root: the node store is not used");
        return Ok(None);
    }
    let store = Store::open(&cfg.store.root).with_context(|| {
        format!(
            "opening the node store (store.root = {})",
            cfg.store.root.display()
        )
    })?;
    Ok(Some(NodeStore {
        store: Arc::new(store),
        max_bytes: cfg.store.max_bytes,
    }))
}

pub fn run(config: &Path, cmd: StoreCommand) -> Result<u8> {
    let cfg = gpusnap_config::Config::load(config)
        .with_context(|| format!("reading {}", config.display()))?;
    let store = Store::open(&cfg.store.root)
        .with_context(|| format!("opening the node store {}", cfg.store.root.display()))?;
    match cmd {
        StoreCommand::Ls(a) => {
            let blobs = store.blobs()?;
            if a.json {
                print_json(&blobs)?;
                return Ok(0);
            }
            let mut out = String::new();
            for b in &blobs {
                out.push_str(&format!(
                    "{}  {:>10}  {} ref{}\n",
                    b.id,
                    human_bytes(b.size),
                    b.references,
                    if b.references == 1 { "" } else { "s" }
                ));
            }
            for r in store.refs()? {
                let state = if r.live() {
                    ""
                } else {
                    " (stale: its holder is gone)"
                };
                out.push_str(&term::wrap(
                    "ref ",
                    &format!("{} — {} blobs{state}", r.name, r.blobs.len()),
                    term::width(),
                    4,
                ));
            }
            print!("{out}");
        }
        StoreCommand::Du(a) => {
            let u = store.usage()?;
            #[derive(Serialize)]
            struct Du<'a> {
                root: &'a Path,
                max_bytes: u64,
                #[serde(flatten)]
                usage: &'a gpusnap_node_store::Usage,
            }
            if a.json {
                print_json(&Du {
                    root: store.root(),
                    max_bytes: cfg.store.max_bytes,
                    usage: &u,
                })?;
                return Ok(0);
            }
            println!(
                "{}: {} in {} blobs (cap {}); {} in {} referenced blobs ({} references, {} stale); \
                 {} temporary files ({})",
                store.root().display(),
                human_bytes(u.bytes),
                u.blobs,
                human_bytes(cfg.store.max_bytes),
                human_bytes(u.referenced_bytes),
                u.referenced_blobs,
                u.references,
                u.stale_references,
                u.temporary_files,
                human_bytes(u.temporary_bytes),
            );
        }
        StoreCommand::Gc(a) => {
            let cap = a.max_bytes.unwrap_or(cfg.store.max_bytes);
            // Beside running pulls (a lease), before collection takes the store for itself.
            let verified = if a.no_verify {
                None
            } else {
                Some(store.verify_all(&store.lease()?)?)
            };
            let staging = gpusnap_oci_image::staging::sweep(&cfg.restore.checkpoint_root)
                .with_context(|| {
                    format!(
                        "looking for staging directories of killed pulls in {}",
                        cfg.restore.checkpoint_root.display()
                    )
                })?;
            // Copies of image-volume checkpoints whose pods are gone, and builds whose restore
            // was killed; never one a pod holds or a restore reads.
            let volumes = gpusnap_transaction::volume::sweep(
                &cfg.restore
                    .checkpoint_root
                    .join(gpusnap_transaction::volume::CACHE_DIR),
            );
            let r = store.gc(cap, true)?;
            if a.json {
                #[derive(Serialize)]
                struct Gc<'a> {
                    #[serde(flatten)]
                    gc: &'a gpusnap_node_store::GcReport,
                    /// `None` with `--no-verify`.
                    verified: Option<&'a gpusnap_node_store::VerifyReport>,
                    removed_staging_directories: &'a [std::path::PathBuf],
                    removed_volume_copies: &'a [std::path::PathBuf],
                }
                print_json(&Gc {
                    gc: &r,
                    verified: verified.as_ref(),
                    removed_staging_directories: &staging,
                    removed_volume_copies: &volumes,
                })?;
                return Ok(0);
            }
            if let Some(v) = &verified {
                print!("{}", render_verified(v));
            }
            println!(
                "removed {} blobs ({}), {} temporary files, {} stale references, {} staging \
                 directories of killed pulls, {} image-volume checkpoint copies no pod holds or \
                 a killed restore left; {} left in {} blobs, {} of it referenced (cap {})",
                r.removed_blobs,
                human_bytes(r.freed_bytes),
                r.removed_temporary_files,
                r.removed_references,
                staging.len(),
                volumes.len(),
                human_bytes(r.kept_bytes),
                r.kept_blobs,
                human_bytes(r.referenced_bytes),
                human_bytes(cap),
            );
        }
        StoreCommand::Verify(a) => {
            let v = store.verify_all(&store.lease()?)?;
            if a.json {
                print_json(&v)?;
            } else {
                print!("{}", render_verified(&v));
            }
        }
    }
    Ok(0)
}

fn render_verified(v: &gpusnap_node_store::VerifyReport) -> String {
    let mut out = format!(
        "verified {} blobs ({}); {} damaged, dropped\n",
        v.sound_blobs + v.dropped.len(),
        human_bytes(v.sound_bytes),
        v.dropped.len()
    );
    for d in &v.dropped {
        out.push_str(&format!(
            "dropped {}: its bytes hash to {}; the next pull that needs it downloads it again\n",
            d.id, d.actual
        ));
    }
    out
}

fn print_json<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
