//! The node agent's checkpoint pushes: when the kubelet's checkpoint API (or any CRI client)
//! writes a checkpoint archive of a container whose pod is annotated `gpusnap.io/checkpoint-to:
//! REGISTRY/REPOSITORY`, the installer DaemonSet's `gpusnap agent run` builds and pushes it to
//! that repository, if the node's `checkpoint.allowed_destinations` allows it, with the node's
//! credentials, signed with the node's key when one is configured, tagged
//! `<container>-<UTC time>-<node>` and `latest`. The archive stays where the kubelet put it.
//!
//! **Why the agent, not the shim.** containerd calls the shim's Checkpoint with a temporary
//! directory (no options for a runtime other than runc.v2) and only afterwards writes
//! `rootfs-diff.tar`, `spec.dump`, `config.dump`, `status.dump` and the archive itself, so the
//! shim never sees a checkpoint a pod could restore from. The archive in the kubelet's
//! directory is the whole checkpoint, and watching that directory works the same for every
//! runtime that writes one. The agent also already holds what a push needs (the registry
//! Secret, the node's signing key, an API token for events), which keeps registry credentials
//! out of the runtime.
//!
//! **What is trusted.** The directory is root-only and written by the node's runtime; still,
//! each archive is read as untrusted input ([`archive`]): opened once beneath the directory,
//! its metadata capped, the checkpoint verified against its sealed manifest by the build. The
//! annotation is the pod author's, so it only *asks* ([`target`]): the admin's allowlist decides,
//! and the transport is the allowlist's.
//!
//! **Reporting.** Every archive gets a status file ([`status`]) that says what became of it;
//! every refusal, failure and push is logged (structured, `tracing`) and, with an API client,
//! becomes an Event on the pod (`CheckpointPushed`, `CheckpointPushRefused`,
//! `CheckpointPushFailed`).
//!
//! **When.** An archive is looked at when its writer closes it (`IN_CLOSE_WRITE`) or it is
//! renamed into the directory (`IN_MOVED_TO`), at start (archives written while no agent ran),
//! and at every rescan; its status record keeps a push from happening twice, across restarts.
//! A failure that may pass (the registry unreachable) is retried with a doubling wait, at most
//! `checkpoint.push_attempts` times, without holding up other archives.

pub mod archive;
pub mod publish;
pub mod status;
pub mod target;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpusnap_checkpoint::beneath;

use crate::kube::{Kube, PodEvent};
use archive::{Archive, ArchiveError, Metadata};
use publish::Failure;
use status::{Record, State, StatusDir};
use target::{Request, Target};

/// Where the kubelet writes checkpoint archives (`<root-dir>/checkpoints`).
pub const KUBELET_CHECKPOINTS: &str = "/var/lib/kubelet/checkpoints";
/// Where the agent keeps its status files by default (the chart mounts /var/lib/gpusnap).
pub const DEFAULT_STATUS_DIR: &str = "/var/lib/gpusnap/checkpoint-push";
/// Event reasons.
pub const REASON_PUSHED: &str = "CheckpointPushed";
pub const REASON_REFUSED: &str = "CheckpointPushRefused";
pub const REASON_FAILED: &str = "CheckpointPushFailed";

/// An archive written less than this long ago is looked at again later: a writer that has
/// not closed it yet (seen at start or in a rescan) brings its `IN_CLOSE_WRITE` by then.
const SETTLE: Duration = Duration::from_secs(2);
/// How often the directory is listed again, in case a notification was lost.
const RESCAN: Duration = Duration::from_secs(300);
/// A config that cannot be read is tried again after this long.
const CONFIG_RETRY: Duration = Duration::from_secs(30);

/// The push half of the node agent.
pub struct PushAgent<'a> {
    /// The watched directory (the kubelet's checkpoint directory).
    pub dir: PathBuf,
    pub status_dir: PathBuf,
    /// The gpusnap config, read for every archive (`checkpoint.*`, `store.*`).
    pub config: PathBuf,
    pub node: String,
    /// Posts events when the agent has an API client.
    pub kube: Option<&'a Kube>,
    /// Set once the agent has put the Secrets' files on the node (the registry credentials,
    /// CAs and signing key the config names): nothing is pushed before.
    pub files_ready: &'a AtomicBool,
}

/// An archive waiting to be looked at.
#[derive(Debug, Clone, Copy)]
struct Pending {
    due: Instant,
    /// Attempts of its push made so far (by this agent; the record adds earlier agents').
    attempts: u32,
}

/// What is next for an archive.
enum Next {
    Done,
    Later { after: Duration, attempts: u32 },
}

/// What a push attempt's log line and event say about the archive.
struct Who<'m> {
    meta: Option<&'m Metadata>,
}

impl Who<'_> {
    fn pod(&self) -> String {
        self.meta
            .and_then(|m| m.pod.as_ref())
            .map_or_else(|| "-".to_owned(), |p| format!("{}/{}", p.namespace, p.name))
    }

    fn container(&self) -> &str {
        self.meta
            .and_then(|m| m.container.as_deref())
            .unwrap_or("-")
    }
}

fn now_rfc3339() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.replace_nanosecond(0)
        .unwrap_or(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

impl PushAgent<'_> {
    /// Watches the directory until `stop` is set. Errors only when watching cannot start.
    pub fn run(&self, stop: &AtomicBool) -> anyhow::Result<()> {
        use anyhow::Context as _;
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let status = StatusDir::open(&self.status_dir)
            .with_context(|| format!("status directory {}", self.status_dir.display()))?;
        let scratch = self.status_dir.join(".work");
        // What an agent that stopped mid-push staged.
        let _ = std::fs::remove_dir_all(&scratch);
        beneath::create_private_dir(&scratch)
            .with_context(|| format!("scratch directory {}", scratch.display()))?;
        let dir_fd: OwnedFd = beneath::open_root(&self.dir)
            .with_context(|| format!("checkpoint directory {}", self.dir.display()))?;
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        inotify
            .add_watch(
                &self.dir,
                AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO,
            )
            .with_context(|| format!("watching {}", self.dir.display()))?;
        tracing::info!(
            dir = %self.dir.display(),
            status_dir = %self.status_dir.display(),
            node = %self.node,
            "watching for checkpoint archives of pods annotated gpusnap.io/checkpoint-to"
        );
        while !self.files_ready.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut queue: BTreeMap<OsString, Pending> = BTreeMap::new();
        let mut last_scan = Instant::now();
        self.scan(dir_fd.as_fd(), &mut queue);
        while !stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            let wait = queue
                .values()
                .map(|p| p.due.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::MAX)
                .min(Duration::from_millis(500));
            if wait > Duration::ZERO {
                let mut fds = [nix::poll::PollFd::new(
                    inotify.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                let ms = nix::poll::PollTimeout::try_from(wait.as_millis() as i32)
                    .unwrap_or(nix::poll::PollTimeout::MAX);
                let _ = nix::poll::poll(&mut fds, ms);
            }
            let mut overflow = false;
            while let Ok(events) = inotify.read_events() {
                if events.is_empty() {
                    break;
                }
                for e in events {
                    if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                        overflow = true;
                    }
                    if let Some(name) = e.name.filter(|n| is_archive_name(n)) {
                        // Written (again) or renamed in: another archive, with attempts of its
                        // own (its status record tells whether it is the one already seen).
                        queue.insert(
                            name,
                            Pending {
                                due: Instant::now(),
                                attempts: 0,
                            },
                        );
                    }
                }
            }
            if overflow || last_scan.elapsed() >= RESCAN {
                last_scan = Instant::now();
                self.scan(dir_fd.as_fd(), &mut queue);
            }
            let due: Vec<OsString> = queue
                .iter()
                .filter(|(_, p)| p.due <= Instant::now())
                .map(|(n, _)| n.clone())
                .collect();
            for name in due {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Some(p) = queue.remove(&name) else {
                    continue;
                };
                match self.look_at(dir_fd.as_fd(), &status, &scratch, &name, p.attempts) {
                    Next::Done => {}
                    Next::Later { after, attempts } => {
                        queue.insert(
                            name,
                            Pending {
                                due: Instant::now() + after,
                                attempts,
                            },
                        );
                    }
                }
            }
        }
        tracing::info!(dir = %self.dir.display(), "stopped watching for checkpoint archives");
        Ok(())
    }

    /// Queues every archive of the directory (its record decides what happens).
    fn scan(&self, dir: std::os::fd::BorrowedFd<'_>, queue: &mut BTreeMap<OsString, Pending>) {
        match beneath::names(dir) {
            Ok(names) => {
                for n in names.into_iter().filter(|n| is_archive_name(n)) {
                    queue.entry(n).or_insert(Pending {
                        due: Instant::now(),
                        attempts: 0,
                    });
                }
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "listing the checkpoint directory")
            }
        }
    }

    fn record(&self, a: &Archive, meta: Option<&Metadata>, state: State) -> Record {
        Record {
            archive: a.path.clone(),
            identity: a.identity,
            state,
            pod: meta.and_then(|m| m.pod.clone()),
            container: meta.and_then(|m| m.container.clone()),
            node: self.node.clone(),
            updated: now_rfc3339(),
        }
    }

    fn save(&self, status: &StatusDir, a: &Archive, meta: Option<&Metadata>, state: State) {
        let r = self.record(a, meta, state);
        if let Err(e) = status.save(&a.name, &r) {
            tracing::error!(
                archive = %a.path.display(),
                status_dir = %status.path().display(),
                error = %e,
                "cannot write the archive's status file"
            );
        }
    }

    /// An event on the archive's pod, when there is an API client and the pod is known.
    fn event(&self, meta: Option<&Metadata>, warning: bool, reason: &str, message: &str) {
        let (Some(kube), Some(pod)) = (self.kube, meta.and_then(|m| m.pod.as_ref())) else {
            return;
        };
        let ev = PodEvent {
            namespace: &pod.namespace,
            pod: &pod.name,
            pod_uid: pod.uid.as_deref(),
            warning,
            reason,
            message,
            node: &self.node,
        };
        if let Err(e) = kube.post_event(&ev) {
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), reason, error = %e, "cannot post the event");
        }
    }

    /// One look at archive `name`; `attempts`: pushes of it this agent already tried.
    fn look_at(
        &self,
        dir: std::os::fd::BorrowedFd<'_>,
        status: &StatusDir,
        scratch: &Path,
        name: &OsStr,
        attempts: u32,
    ) -> Next {
        let path = self.dir.join(name);
        let a = match Archive::open(dir, &self.dir, name) {
            Ok(Some(a)) => a,
            Ok(None) => return Next::Done,
            Err(e) => {
                tracing::warn!(archive = %path.display(), error = %e, "cannot open the archive");
                return Next::Done;
            }
        };
        let previous = status.load(name).filter(|r| r.identity == a.identity);
        if let Some(r) = previous.as_ref().filter(|r| r.state.is_final()) {
            tracing::debug!(archive = %a.path.display(), state = r.state.name(), "archive already handled");
            return Next::Done;
        }
        let age = a.identity.age();
        if age < SETTLE {
            return Next::Later {
                after: SETTLE - age,
                attempts,
            };
        }
        match a.check_complete() {
            Ok(()) => {}
            Err(e @ ArchiveError::Incomplete { .. }) => {
                let state = State::Incomplete {
                    reason: e.to_string(),
                };
                if previous.as_ref().map(|r| &r.state) != Some(&state) {
                    tracing::info!(archive = %a.path.display(), reason = %e, "archive not complete yet");
                    self.save(status, &a, None, state);
                }
                return Next::Done;
            }
            Err(e) => return self.refuse(status, &a, None, None, e.to_string()),
        }
        let meta = match a.metadata() {
            Ok(m) => m,
            Err(e) => return self.refuse(status, &a, None, None, e.to_string()),
        };
        let cfg = match gpusnap_config::Config::load(&self.config) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(config = %self.config.display(), error = %e, archive = %a.path.display(), "cannot read the gpusnap config; the archive waits");
                return Next::Later {
                    after: CONFIG_RETRY,
                    attempts,
                };
            }
        };
        let mtime = time::OffsetDateTime::from_unix_timestamp_nanos(a.identity.mtime_ns)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let target = match target::request(
            &meta,
            &cfg.checkpoint,
            &self.node,
            mtime,
            &name.to_string_lossy(),
        ) {
            Request::None => {
                tracing::debug!(archive = %a.path.display(), "no gpusnap.io/checkpoint-to: left alone");
                self.save(status, &a, Some(&meta), State::NotRequested);
                return Next::Done;
            }
            Request::Refused {
                destination,
                reason,
            } => {
                return self.refuse(status, &a, Some(&meta), Some(destination), reason);
            }
            Request::Push(t) => t,
        };
        // Attempts an earlier agent made count: a push is tried at most push_attempts times.
        let before = match previous.map(|r| r.state) {
            Some(State::Pushing { attempt, .. } | State::Retrying { attempt, .. }) => {
                attempt.max(attempts)
            }
            _ => attempts,
        };
        self.attempt(status, scratch, &a, &meta, &cfg, &target, before + 1)
    }

    fn refuse(
        &self,
        status: &StatusDir,
        a: &Archive,
        meta: Option<&Metadata>,
        destination: Option<String>,
        reason: String,
    ) -> Next {
        let who = Who { meta };
        tracing::warn!(
            archive = %a.path.display(),
            pod = %who.pod(),
            container = who.container(),
            destination = destination.as_deref().unwrap_or("-"),
            reason = %reason,
            "checkpoint push refused"
        );
        self.event(
            meta,
            true,
            REASON_REFUSED,
            &format!(
                "checkpoint {} not pushed: {reason}",
                a.name.to_string_lossy()
            ),
        );
        self.save(
            status,
            a,
            meta,
            State::Refused {
                destination,
                reason,
            },
        );
        Next::Done
    }

    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &self,
        status: &StatusDir,
        scratch: &Path,
        a: &Archive,
        meta: &Metadata,
        cfg: &gpusnap_config::Config,
        target: &Target,
        attempt: u32,
    ) -> Next {
        let of = cfg.checkpoint.push_attempts;
        let destination = target.destination.to_string();
        let who = Who { meta: Some(meta) };
        if attempt > of {
            let reason = format!(
                "{} attempts made (the last was interrupted when the agent stopped)",
                attempt - 1
            );
            return self.fail(status, a, meta, destination, attempt - 1, reason);
        }
        self.save(
            status,
            a,
            Some(meta),
            State::Pushing {
                destination: destination.clone(),
                attempt,
                of,
            },
        );
        tracing::info!(
            archive = %a.path.display(),
            pod = %who.pod(),
            container = who.container(),
            destination = %destination,
            tags = ?target.tags,
            attempt,
            of,
            "pushing checkpoint"
        );
        let started = Instant::now();
        match publish::publish(a, target, cfg, scratch) {
            Ok(p) => {
                tracing::info!(
                    archive = %a.path.display(),
                    pod = %who.pod(),
                    container = who.container(),
                    destination = %destination,
                    digest = %p.digest,
                    references = ?p.references,
                    signed = p.signed,
                    bytes_uploaded = p.bytes_uploaded,
                    attempt,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "checkpoint pushed"
                );
                self.event(
                    Some(meta),
                    false,
                    REASON_PUSHED,
                    &format!(
                        "checkpoint of container {} pushed to {} ({}{})",
                        who.container(),
                        p.references.join(", "),
                        p.digest,
                        if p.signed { ", signed by the node" } else { "" }
                    ),
                );
                self.save(
                    status,
                    a,
                    Some(meta),
                    State::Pushed {
                        destination,
                        references: p.references,
                        digest: p.digest,
                        signed: p.signed,
                        attempts: attempt,
                        bytes_uploaded: p.bytes_uploaded,
                    },
                );
                Next::Done
            }
            Err((Failure::Interrupted, _)) => {
                // The record says Pushing: the next agent goes on from this attempt.
                tracing::info!(archive = %a.path.display(), attempt, "push interrupted: the agent is stopping");
                Next::Done
            }
            Err((kind, reason)) if kind.retryable() && attempt < of => {
                let after = cfg.checkpoint.push_retry_after(attempt);
                let at = time::OffsetDateTime::now_utc()
                    + time::Duration::seconds(after.as_secs() as i64);
                tracing::warn!(
                    archive = %a.path.display(),
                    pod = %who.pod(),
                    destination = %destination,
                    attempt,
                    of,
                    retry_in_s = after.as_secs(),
                    failure = kind.label(),
                    reason = %reason,
                    "checkpoint push failed; retrying"
                );
                self.save(
                    status,
                    a,
                    Some(meta),
                    State::Retrying {
                        destination,
                        attempt,
                        of,
                        reason: format!("{}: {reason}", kind.label()),
                        next_attempt: rfc3339(at),
                    },
                );
                Next::Later {
                    after,
                    attempts: attempt,
                }
            }
            Err((kind, reason)) => {
                let reason = format!("{}: {reason}", kind.label());
                self.fail(status, a, meta, destination, attempt, reason)
            }
        }
    }

    fn fail(
        &self,
        status: &StatusDir,
        a: &Archive,
        meta: &Metadata,
        destination: String,
        attempts: u32,
        reason: String,
    ) -> Next {
        let who = Who { meta: Some(meta) };
        tracing::error!(
            archive = %a.path.display(),
            pod = %who.pod(),
            container = who.container(),
            destination = %destination,
            attempts,
            reason = %reason,
            "checkpoint push failed"
        );
        self.event(
            Some(meta),
            true,
            REASON_FAILED,
            &format!(
                "checkpoint {} not pushed to {destination} after {attempts} attempt(s): {reason}",
                a.name.to_string_lossy()
            ),
        );
        self.save(
            status,
            a,
            Some(meta),
            State::Failed {
                destination,
                attempts,
                reason,
            },
        );
        Next::Done
    }
}

/// A name the kubelet (`checkpoint-….tar`) or `crictl checkpoint --export` would give an
/// archive; hidden names are a writer's temporary files.
fn is_archive_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    b.ends_with(b".tar") && !b.starts_with(b".")
}

/// `gpusnap agent push-status`: the status records, newest first.
pub fn print_status(status_dir: &Path, json: bool) -> anyhow::Result<u8> {
    use anyhow::Context as _;
    if !status_dir.exists() {
        anyhow::bail!(
            "{} does not exist: the agent has not watched for checkpoints on this node",
            status_dir.display()
        );
    }
    let dir =
        StatusDir::open(status_dir).with_context(|| format!("reading {}", status_dir.display()))?;
    let records = dir.all()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(0);
    }
    if records.is_empty() {
        println!("no checkpoint archives seen yet ({})", status_dir.display());
    }
    for r in &records {
        let name = r.archive.file_name().map_or_else(
            || r.archive.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let pod = r
            .pod
            .as_ref()
            .map_or_else(String::new, |p| format!(" pod {}/{}", p.namespace, p.name));
        let what = match &r.state {
            State::NotRequested => "no gpusnap.io/checkpoint-to annotation".to_owned(),
            State::Incomplete { reason } | State::Refused { reason, .. } => reason.clone(),
            State::Pushing {
                destination,
                attempt,
                of,
            } => format!("{destination}: attempt {attempt} of {of} running"),
            State::Retrying {
                destination,
                attempt,
                of,
                reason,
                next_attempt,
            } => format!(
                "{destination}: attempt {attempt} of {of} failed ({reason}); next at {next_attempt}"
            ),
            State::Pushed {
                references,
                digest,
                signed,
                ..
            } => format!(
                "{} {digest}{}",
                references.join(" "),
                if *signed { " (signed)" } else { "" }
            ),
            State::Failed {
                destination,
                attempts,
                reason,
            } => format!("{destination}: {attempts} attempt(s): {reason}"),
        };
        println!("{} {name}{pod}: {} — {what}", r.updated, r.state.name());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names() {
        assert!(is_archive_name(OsStr::new(
            "checkpoint-p_ns-c-2026-12-02T13:30:53Z.tar"
        )));
        assert!(!is_archive_name(OsStr::new(".partial.tar")));
        assert!(!is_archive_name(OsStr::new("notes.txt")));
    }
}
