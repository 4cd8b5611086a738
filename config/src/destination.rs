//! Where a node may push its pods' checkpoints: the repository a pod names in
//! `gpusnap.io/checkpoint-to` ([`Destination`]) and the node admin's allowlist of
//! [`DestinationPattern`]s (`checkpoint.allowed_destinations`).
//!
//! The annotation is written by whoever may create pods; the node pushes with its own
//! credentials. So the annotation only *asks*: a destination no pattern allows is refused, and
//! the transport (HTTPS, or plain HTTP) is the pattern's, never the pod's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a `gpusnap.io/checkpoint-to` value or a `checkpoint.allowed_destinations` entry is
/// refused; each message quotes the value and says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error("{len} bytes, longer than any registry and repository name ({max})", max = DESTINATION_MAX_LEN)]
    TooLong { len: usize },
    #[error(
        "{0:?} has a scheme: give REGISTRY/REPOSITORY; whether the registry is reached over \
         HTTPS or plain HTTP is the node's setting (checkpoint.allowed_destinations)"
    )]
    Scheme(String),
    #[error(
        "{0:?} names a digest: give REGISTRY/REPOSITORY; the node tags each checkpoint itself \
         (<container>-<time>-<node> and latest)"
    )]
    Digest(String),
    #[error(
        "{0:?} names no registry: give REGISTRY/REPOSITORY, e.g. \
         registry.example.com/ckpt/trainer"
    )]
    NoRegistry(String),
    #[error(
        "{0:?} has a tag: give REGISTRY/REPOSITORY; the node tags each checkpoint itself \
         (<container>-<time>-<node> and latest)"
    )]
    Tag(String),
    #[error("{0:?} is not a registry host[:port] (e.g. registry.example.com or 10.0.0.5:5000)")]
    Registry(String),
    #[error("{0:?}: expected {rule}", rule = REPOSITORY_RULE)]
    Repository(String),
    #[error("{0:?}: only an http:// prefix (plain HTTP) is accepted; HTTPS needs none")]
    PatternScheme(String),
    #[error("{0:?} names no repository: REGISTRY/REPOSITORY, REGISTRY/PATH/* or REGISTRY/*")]
    PatternNoRepository(String),
    #[error(
        "{0:?}: expected {rule}, with '*' only as the whole last component",
        rule = REPOSITORY_RULE
    )]
    PatternRepository(String),
}

/// The pod annotation naming where a container's checkpoints go: `gpusnap.io/checkpoint-to:
/// REGISTRY/REPOSITORY`, or `gpusnap.io/checkpoint-to.<container>` for one container of a pod
/// with several (it wins over the pod-wide one). It names a destination, not a setting, so the
/// configuration overlay leaves it alone.
pub const CHECKPOINT_TO_ANNOTATION: &str = "gpusnap.io/checkpoint-to";

/// Longest annotation value taken as a destination (a registry host and a repository path).
pub const DESTINATION_MAX_LEN: usize = 255;

/// `gpusnap.io/checkpoint-to` or `gpusnap.io/checkpoint-to.<container>`.
pub fn is_checkpoint_to_annotation(key: &str) -> bool {
    key == CHECKPOINT_TO_ANNOTATION
        || key
            .strip_prefix(CHECKPOINT_TO_ANNOTATION)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// A repository in a registry: `host[:port]/path/to/repo`, no scheme, tag or digest (the node
/// chooses the tags).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    /// `host[:port]`, lowercase.
    pub registry: String,
    /// `/`-separated components of lowercase letters, digits and inner `.`, `_`, `-`.
    pub repository: String,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)
    }
}

/// The registry part: a host name or IPv4 address with an optional port (what docker and
/// containerd accept as a registry host), lowercased.
fn parse_registry(s: &str) -> Result<String, DestinationError> {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    let port_ok = port.is_none_or(|p| {
        !p.is_empty() && p.len() <= 5 && p.chars().all(|c| c.is_ascii_digit()) && p != "0"
    });
    if host_ok && port_ok {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(DestinationError::Registry(s.to_owned()))
    }
}

/// One repository component, as the OCI distribution spec allows them.
fn component_ok(c: &str) -> bool {
    !c.is_empty()
        && c.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
        && c.ends_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
        && c.chars().all(|ch| {
            ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-')
        })
}

const REPOSITORY_RULE: &str =
    "repository components of lowercase letters, digits and inner '.', '_', '-'";

impl Destination {
    /// Parses an annotation value. Refuses a scheme, a tag, a digest and anything that is not a
    /// plain `REGISTRY/REPOSITORY`, with the reason.
    pub fn parse(s: &str) -> Result<Destination, DestinationError> {
        if s.len() > DESTINATION_MAX_LEN {
            return Err(DestinationError::TooLong { len: s.len() });
        }
        if s.contains("://") {
            return Err(DestinationError::Scheme(s.to_owned()));
        }
        if s.contains('@') {
            return Err(DestinationError::Digest(s.to_owned()));
        }
        let Some((registry, repository)) = s.split_once('/') else {
            return Err(DestinationError::NoRegistry(s.to_owned()));
        };
        if repository.contains(':') {
            return Err(DestinationError::Tag(s.to_owned()));
        }
        let registry = parse_registry(registry)?;
        if !repository.split('/').all(component_ok) {
            return Err(DestinationError::Repository(s.to_owned()));
        }
        Ok(Destination {
            registry,
            repository: repository.to_owned(),
        })
    }
}

/// What a pattern's path covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Scope {
    /// This one repository.
    Exactly(String),
    /// Every repository beneath this path (`PATH/*`; empty: the whole registry, `REGISTRY/*`).
    Beneath(String),
}

/// An entry of `checkpoint.allowed_destinations`: `[http://]REGISTRY/REPOSITORY` (that
/// repository), `[http://]REGISTRY/PATH/*` (any repository beneath PATH, at any depth) or
/// `[http://]REGISTRY/*` (any repository of the registry). `http://` makes the node push to that
/// registry over plain HTTP (a node-local or loopback registry); without it, HTTPS.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DestinationPattern {
    plain_http: bool,
    registry: String,
    scope: Scope,
}

impl DestinationPattern {
    /// Whether `d` is allowed by this pattern.
    pub fn matches(&self, d: &Destination) -> bool {
        if d.registry != self.registry {
            return false;
        }
        match &self.scope {
            Scope::Exactly(r) => d.repository == *r,
            Scope::Beneath(p) if p.is_empty() => true,
            Scope::Beneath(p) => d
                .repository
                .strip_prefix(p.as_str())
                .is_some_and(|rest| rest.starts_with('/')),
        }
    }

    /// Whether a destination this pattern allows is reached over plain HTTP.
    pub fn plain_http(&self) -> bool {
        self.plain_http
    }
}

/// The first pattern of `patterns` that allows `d` (its transport applies).
pub fn allowed<'a>(
    patterns: &'a [DestinationPattern],
    d: &Destination,
) -> Option<&'a DestinationPattern> {
    patterns.iter().find(|p| p.matches(d))
}

impl FromStr for DestinationPattern {
    type Err = DestinationError;
    fn from_str(s: &str) -> Result<Self, DestinationError> {
        let (plain_http, rest) = match s.strip_prefix("http://") {
            Some(r) => (true, r),
            None if s.contains("://") => return Err(DestinationError::PatternScheme(s.to_owned())),
            None => (false, s),
        };
        let Some((registry, path)) = rest.split_once('/') else {
            return Err(DestinationError::PatternNoRepository(s.to_owned()));
        };
        let registry = parse_registry(registry)?;
        let scope = if path == "*" {
            Scope::Beneath(String::new())
        } else if let Some(prefix) = path.strip_suffix("/*") {
            Scope::Beneath(prefix.to_owned())
        } else {
            Scope::Exactly(path.to_owned())
        };
        let named_ok = match &scope {
            Scope::Beneath(p) if p.is_empty() => true,
            Scope::Exactly(p) | Scope::Beneath(p) => p.split('/').all(component_ok),
        };
        if !named_ok {
            return Err(DestinationError::PatternRepository(s.to_owned()));
        }
        Ok(DestinationPattern {
            plain_http,
            registry,
            scope,
        })
    }
}

impl fmt::Display for DestinationPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.plain_http {
            f.write_str("http://")?;
        }
        match &self.scope {
            Scope::Exactly(r) => write!(f, "{}/{r}", self.registry),
            Scope::Beneath(p) if p.is_empty() => write!(f, "{}/*", self.registry),
            Scope::Beneath(p) => write!(f, "{}/{p}/*", self.registry),
        }
    }
}

impl TryFrom<String> for DestinationPattern {
    type Error = DestinationError;
    fn try_from(s: String) -> Result<Self, DestinationError> {
        s.parse()
    }
}

impl From<DestinationPattern> for String {
    fn from(p: DestinationPattern) -> String {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Destination {
        Destination::parse(s).unwrap()
    }

    fn p(s: &str) -> DestinationPattern {
        s.parse().unwrap()
    }

    #[test]
    fn destinations_are_plain_repositories() {
        let x = d("Registry.Example.com:5000/ckpt/trainer");
        assert_eq!(x.registry, "registry.example.com:5000");
        assert_eq!(x.repository, "ckpt/trainer");
        assert_eq!(x.to_string(), "registry.example.com:5000/ckpt/trainer");
        for bad in [
            "trainer",
            "https://r.example.com/ckpt",
            "r.example.com/ckpt:v1",
            "r.example.com/ckpt@sha256:00",
            "r.example.com/Ckpt",
            "r.example.com/ckpt//x",
            "r.example.com/../x",
            "r.example.com/ckpt/-x",
            "/ckpt",
            "r_x.com/ckpt",
            "r.example.com:0/ckpt",
            "r.example.com:http/ckpt",
            "r.example.com/",
        ] {
            assert!(Destination::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(Destination::parse(&format!("r.io/{}", "a".repeat(300))).is_err());
    }

    #[test]
    fn patterns_match_what_they_name_and_nothing_else() {
        let repo = p("registry.example.com/ckpt/trainer");
        assert!(repo.matches(&d("registry.example.com/ckpt/trainer")));
        assert!(!repo.matches(&d("registry.example.com/ckpt/trainer/x")));
        assert!(!repo.matches(&d("registry.example.com/ckpt/trainer2")));
        let beneath = p("registry.example.com/ckpt/*");
        assert!(beneath.matches(&d("registry.example.com/ckpt/trainer")));
        assert!(beneath.matches(&d("registry.example.com/ckpt/a/b")));
        assert!(!beneath.matches(&d("registry.example.com/ckpt")));
        assert!(!beneath.matches(&d("registry.example.com/ckptx/a")));
        assert!(!beneath.matches(&d("other.example.com/ckpt/trainer")));
        assert!(!beneath.matches(&d("registry.example.com:443/ckpt/trainer")));
        let all = p("http://127.0.0.1:5000/*");
        assert!(all.plain_http());
        assert!(all.matches(&d("127.0.0.1:5000/x")));
        assert!(!all.matches(&d("127.0.0.1:5001/x")));
        assert!(p("REGISTRY.example.com/ckpt/*").matches(&d("registry.example.com/ckpt/t")));
        let list = [p("a.io/x"), p("http://b.io/*")];
        assert_eq!(allowed(&list, &d("b.io/y")), Some(&list[1]));
        assert_eq!(allowed(&list, &d("a.io/y")), None);
        assert_eq!(allowed(&[], &d("a.io/x")), None);
    }

    #[test]
    fn patterns_refuse_wildcards_elsewhere_and_other_schemes() {
        for bad in [
            "*",
            "*/ckpt",
            "r.io",
            "r.io/ck*",
            "r.io/*/x",
            "r.io/ckpt/**",
            "https://r.io/x",
            "ftp://r.io/x",
            "r.io/",
        ] {
            assert!(bad.parse::<DestinationPattern>().is_err(), "{bad} accepted");
        }
        for good in [
            "r.io/x",
            "r.io/x/*",
            "r.io/*",
            "http://10.0.0.1:5000/ckpt/*",
        ] {
            assert_eq!(p(good).to_string(), good);
        }
    }

    #[test]
    fn checkpoint_to_annotations() {
        assert!(is_checkpoint_to_annotation("gpusnap.io/checkpoint-to"));
        assert!(is_checkpoint_to_annotation("gpusnap.io/checkpoint-to.main"));
        assert!(!is_checkpoint_to_annotation("gpusnap.io/checkpoint-toast"));
    }
}
