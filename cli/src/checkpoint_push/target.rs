//! Where an archive goes, if anywhere: the pod's `gpusnap.io/checkpoint-to` annotation (the
//! container's own `gpusnap.io/checkpoint-to.<container>` first), checked against the node's
//! `checkpoint.allowed_destinations`; the tags the image gets; the annotations that say where
//! it came from.

use std::collections::BTreeMap;

use gpusnap_config::{CheckpointConfig, Destination, CHECKPOINT_TO_ANNOTATION};
use time::OffsetDateTime;

use super::archive::Metadata;

/// The stable tag every push also moves: the newest checkpoint pushed to the repository.
pub const STABLE_TAG: &str = "latest";
/// Longest OCI tag.
const TAG_MAX: usize = 128;

/// Annotation keys the agent adds to the image index and manifest.
pub mod keys {
    pub const POD_NAMESPACE: &str = "io.gpusnap.checkpoint.pod.namespace";
    pub const POD_NAME: &str = "io.gpusnap.checkpoint.pod.name";
    pub const POD_UID: &str = "io.gpusnap.checkpoint.pod.uid";
    pub const CONTAINER: &str = "io.gpusnap.checkpoint.container";
    pub const NODE: &str = "io.gpusnap.checkpoint.node";
    /// When the checkpoint was taken, RFC 3339, UTC.
    pub const TIME: &str = "io.gpusnap.checkpoint.time";
    /// The archive's file name in the kubelet's checkpoint directory.
    pub const ARCHIVE: &str = "io.gpusnap.checkpoint.archive";
}

/// A push the node allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub destination: Destination,
    /// The allowing pattern's transport.
    pub plain_http: bool,
    /// `<container>-<UTC time>-<node>` first (unique to this checkpoint), then [`STABLE_TAG`].
    pub tags: Vec<String>,
    pub annotations: BTreeMap<String, String>,
}

impl Target {
    /// `[http://]REGISTRY/REPOSITORY:TAG`.
    pub fn reference(&self, tag: &str) -> String {
        format!(
            "{}{}:{tag}",
            if self.plain_http { "http://" } else { "" },
            self.destination
        )
    }
}

/// What the archive's pod asked for, and what the node makes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// No `gpusnap.io/checkpoint-to`: the archive is left alone.
    None,
    /// Asked for, and refused (the reason names the annotation and what to do).
    Refused {
        destination: String,
        reason: String,
    },
    Push(Target),
}

/// The annotation that applies to `container`, and its value.
fn asked(meta: &Metadata) -> Option<(String, &str)> {
    let own = meta
        .container
        .as_ref()
        .map(|c| format!("{CHECKPOINT_TO_ANNOTATION}.{c}"));
    own.and_then(|k| meta.annotations.get(&k).map(|v| (k, v.as_str())))
        .or_else(|| {
            meta.annotations
                .get(CHECKPOINT_TO_ANNOTATION)
                .map(|v| (CHECKPOINT_TO_ANNOTATION.to_owned(), v.as_str()))
        })
}

/// Decides where the archive of `meta` goes. `archive_time` stands in for the checkpoint time
/// when `config.dump` gives none; `archive_name` is recorded on the image.
pub fn request(
    meta: &Metadata,
    cfg: &CheckpointConfig,
    node: &str,
    archive_time: OffsetDateTime,
    archive_name: &str,
) -> Request {
    let Some((key, value)) = asked(meta) else {
        return Request::None;
    };
    let shown: String = value
        .chars()
        .take(gpusnap_config::DESTINATION_MAX_LEN)
        .collect();
    let destination = match Destination::parse(value.trim()) {
        Ok(d) => d,
        Err(why) => {
            return Request::Refused {
                destination: shown,
                reason: format!("annotation {key}: {why}"),
            }
        }
    };
    let Some(pattern) = gpusnap_config::allowed(&cfg.allowed_destinations, &destination) else {
        let allowed = if cfg.allowed_destinations.is_empty() {
            "none: checkpoint.allowed_destinations is empty".to_owned()
        } else {
            cfg.allowed_destinations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Request::Refused {
            destination: destination.to_string(),
            reason: format!(
                "annotation {key}: {destination} is not a destination this node may push to \
                 (allowed: {allowed}); nothing was pushed — ask the cluster admin to add it to \
                 checkpoint.allowed_destinations, or name an allowed one"
            ),
        };
    };
    let when = meta
        .checkpointed_at
        .unwrap_or(archive_time)
        .to_offset(time::UtcOffset::UTC);
    let container = meta.container.as_deref().unwrap_or("container");
    let mut annotations = BTreeMap::new();
    if let Some(pod) = &meta.pod {
        annotations.insert(keys::POD_NAMESPACE.into(), pod.namespace.clone());
        annotations.insert(keys::POD_NAME.into(), pod.name.clone());
        if let Some(uid) = &pod.uid {
            annotations.insert(keys::POD_UID.into(), uid.clone());
        }
    }
    annotations.insert(keys::CONTAINER.into(), container.to_owned());
    annotations.insert(keys::NODE.into(), node.to_owned());
    annotations.insert(keys::TIME.into(), rfc3339(when));
    annotations.insert(keys::ARCHIVE.into(), archive_name.to_owned());
    Request::Push(Target {
        destination,
        plain_http: pattern.plain_http(),
        tags: vec![unique_tag(container, when, node), STABLE_TAG.to_owned()],
        annotations,
    })
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Characters a tag may hold; anything else becomes `-`.
fn tag_chars(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `<container>-<YYYYMMDDTHHMMSSZ>-<node>`: what `kubectl get pod -o wide` shows of the pod (its
/// container and node) and when, in the characters and length (128) an OCI tag allows; the
/// node's name is shortened when it does not fit.
pub fn unique_tag(container: &str, when: OffsetDateTime, node: &str) -> String {
    let when = when.to_offset(time::UtcOffset::UTC);
    let stamp = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        when.year(),
        u8::from(when.month()),
        when.day(),
        when.hour(),
        when.minute(),
        when.second()
    );
    let mut container = tag_chars(container);
    if !container.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
        container.insert(0, '_');
    }
    container.truncate(63);
    let room = TAG_MAX - container.len() - stamp.len() - 2;
    let mut node = tag_chars(node);
    node.truncate(room);
    let node = node.trim_end_matches(['-', '.']);
    if node.is_empty() {
        format!("{container}-{stamp}")
    } else {
        format!("{container}-{stamp}-{node}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::archive::PodRef;
    use super::*;

    fn meta(annotations: &[(&str, &str)]) -> Metadata {
        Metadata {
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            pod: Some(PodRef {
                namespace: "ml".into(),
                name: "trainer-0".into(),
                uid: Some("u-1".into()),
            }),
            container: Some("main".into()),
            checkpointed_at: Some(time::macros::datetime!(2026-12-02 14:30:53 +01:00)),
        }
    }

    fn allowing(patterns: &[&str]) -> CheckpointConfig {
        CheckpointConfig {
            allowed_destinations: patterns.iter().map(|p| p.parse().unwrap()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_allowed_destination_gets_both_tags_and_the_pod_on_the_image() {
        let m = meta(&[(
            "gpusnap.io/checkpoint-to",
            "registry.example.com/ckpt/trainer",
        )]);
        let t0 = OffsetDateTime::UNIX_EPOCH;
        let Request::Push(t) = request(
            &m,
            &allowing(&["registry.example.com/ckpt/*"]),
            "node-a",
            t0,
            "a.tar",
        ) else {
            panic!("not pushed")
        };
        assert_eq!(t.tags, ["main-20261202T133053Z-node-a", "latest"]);
        assert!(!t.plain_http);
        assert_eq!(
            t.reference("latest"),
            "registry.example.com/ckpt/trainer:latest"
        );
        assert_eq!(t.annotations[keys::POD_NAME], "trainer-0");
        assert_eq!(t.annotations[keys::POD_UID], "u-1");
        assert_eq!(t.annotations[keys::TIME], "2026-12-02T13:30:53Z");
        assert_eq!(t.annotations[keys::NODE], "node-a");
        let Request::Push(t) = request(
            &m,
            &allowing(&["http://registry.example.com/*"]),
            "n",
            t0,
            "a.tar",
        ) else {
            panic!("not pushed")
        };
        assert!(t.plain_http);
        assert_eq!(
            t.reference("x"),
            "http://registry.example.com/ckpt/trainer:x"
        );
    }

    #[test]
    fn the_container_annotation_wins_and_none_means_none() {
        let m = meta(&[
            ("gpusnap.io/checkpoint-to", "r.io/ckpt/pod"),
            ("gpusnap.io/checkpoint-to.main", "r.io/ckpt/main"),
            ("gpusnap.io/checkpoint-to.side", "r.io/ckpt/side"),
        ]);
        let Request::Push(t) = request(
            &m,
            &allowing(&["r.io/*"]),
            "n",
            OffsetDateTime::UNIX_EPOCH,
            "a",
        ) else {
            panic!()
        };
        assert_eq!(t.destination.repository, "ckpt/main");
        assert_eq!(
            request(
                &meta(&[("other", "x")]),
                &allowing(&["r.io/*"]),
                "n",
                OffsetDateTime::UNIX_EPOCH,
                "a"
            ),
            Request::None
        );
    }

    #[test]
    fn refusals_say_why() {
        let t0 = OffsetDateTime::UNIX_EPOCH;
        let m = meta(&[("gpusnap.io/checkpoint-to", "evil.example.com/loot")]);
        let Request::Refused {
            reason,
            destination,
        } = request(
            &m,
            &allowing(&["registry.example.com/ckpt/*"]),
            "n",
            t0,
            "a",
        )
        else {
            panic!()
        };
        assert_eq!(destination, "evil.example.com/loot");
        assert!(
            reason.contains("not a destination this node may push to"),
            "{reason}"
        );
        assert!(reason.contains("registry.example.com/ckpt/*"), "{reason}");
        let Request::Refused { reason, .. } =
            request(&m, &CheckpointConfig::default(), "n", t0, "a")
        else {
            panic!()
        };
        assert!(
            reason.contains("checkpoint.allowed_destinations is empty"),
            "{reason}"
        );
        let m = meta(&[(
            "gpusnap.io/checkpoint-to",
            "http://registry.example.com/ckpt/x",
        )]);
        let Request::Refused { reason, .. } =
            request(&m, &allowing(&["registry.example.com/*"]), "n", t0, "a")
        else {
            panic!()
        };
        assert!(reason.contains("scheme"), "{reason}");
    }

    #[test]
    fn tags_are_valid_and_bounded() {
        let t = time::macros::datetime!(2026-01-02 03:04:05 UTC);
        assert_eq!(
            unique_tag("main", t, "gpu-7.example.com"),
            "main-20260102T030405Z-gpu-7.example.com"
        );
        let long = unique_tag(&"c".repeat(63), t, &"n".repeat(253));
        assert_eq!(long.len(), 128);
        assert_eq!(unique_tag("main", t, "...."), "main-20260102T030405Z");
        assert_eq!(unique_tag("-x y", t, "n"), "_-x-y-20260102T030405Z-n");
        for tag in [long, unique_tag("a", t, "é")] {
            assert!(tag.len() <= 128);
            assert!(tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'));
            assert!(
                tag.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
                "{tag}"
            );
        }
    }
}
