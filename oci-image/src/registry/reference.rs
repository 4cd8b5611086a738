//! Registry image references: `[http://]host[:port]/repo/path[:tag][@sha256:...]`.
//!
//! The registry host is always explicit (no implicit Docker Hub): a checkpoint image pushed by
//! mistake to a public default registry would leak process memory.

use std::fmt;

use super::super::digest::Digest;
use super::super::error::ImageError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Talk plain HTTP (insecure registry) rather than HTTPS.
    pub plain_http: bool,
    /// `host[:port]`.
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses `s`. An `http://` prefix selects plain HTTP, `https://` HTTPS; without a scheme,
    /// `plain_http` decides.
    pub fn parse(s: &str, plain_http: bool) -> Result<Reference, ImageError> {
        let bad = |reason: &str| ImageError::invalid("image reference", s, reason);
        let (plain_http, rest) = if let Some(r) = s.strip_prefix("http://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("https://") {
            (false, r)
        } else if s.contains("://") {
            return Err(bad("only http:// and https:// are supported"));
        } else {
            (plain_http, s)
        };
        let Some((registry, path)) = rest.split_once('/') else {
            return Err(bad(
                "name the registry explicitly, e.g. 127.0.0.1:5000/gpusnap/ckpt:v1",
            ));
        };
        if registry.is_empty()
            || !registry
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        {
            return Err(bad("the registry must be host[:port]"));
        }
        let (name_tag, digest) = match path.split_once('@') {
            Some((n, d)) => (n, Some(Digest::parse(d)?)),
            None => (path, None),
        };
        let (repository, tag) = match name_tag.rsplit_once(':') {
            Some((r, t)) => (r, Some(t)),
            None => (name_tag, None),
        };
        if repository.is_empty()
            || repository.split('/').any(|c| {
                c.is_empty()
                    || !c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
                    || !c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
                    || !c.chars().all(|ch| {
                        ch.is_ascii_lowercase()
                            || ch.is_ascii_digit()
                            || matches!(ch, '.' | '_' | '-')
                    })
            })
        {
            return Err(bad(
                "repository components use lowercase letters, digits and inner '.', '_', '-'",
            ));
        }
        if let Some(t) = tag {
            if t.is_empty()
                || t.len() > 128
                || t.starts_with(['.', '-'])
                || !t
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            {
                return Err(bad(
                    "a tag uses letters, digits, '_', '.', '-' (at most 128)",
                ));
            }
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_owned()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_owned()),
        };
        Ok(Reference {
            plain_http,
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag,
            digest,
        })
    }

    /// `http://host:port` or `https://host:port`.
    pub fn base_url(&self) -> String {
        format!(
            "{}://{}",
            if self.plain_http { "http" } else { "https" },
            self.registry
        )
    }

    /// What goes after `/manifests/`: the digest when given, else the tag.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_owned(),
        }
    }

    /// `host/repo:tag` (or `@digest`): the image's name in a pulled layout.
    pub fn name(&self) -> String {
        let mut s = format!("{}/{}", self.registry, self.repository);
        if let Some(t) = &self.tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push('@');
            s.push_str(d.as_str());
        }
        s
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.plain_http {
            f.write_str("http://")?;
        }
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forms() {
        let r = Reference::parse("http://127.0.0.1:5000/gpusnap/ckpt:v1", false).unwrap();
        assert!(r.plain_http);
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "gpusnap/ckpt");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.base_url(), "http://127.0.0.1:5000");
        assert_eq!(r.manifest_ref(), "v1");
        assert_eq!(r.name(), "127.0.0.1:5000/gpusnap/ckpt:v1");

        let r = Reference::parse("localhost:5000/a", true).unwrap();
        assert!(r.plain_http);
        assert_eq!(r.tag.as_deref(), Some("latest"));

        let d = Digest::of(b"x");
        let r = Reference::parse(&format!("reg.example/a/b@{d}"), false).unwrap();
        assert!(!r.plain_http);
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_ref(), d.to_string());
    }

    #[test]
    fn rejects_bad() {
        for s in [
            "busybox",
            "ftp://x/y",
            "host/UPPER",
            "host/a:b c",
            "host//a",
            "host/a@sha256:00",
            "http:///a",
        ] {
            assert!(Reference::parse(s, true).is_err(), "{s}");
        }
    }
}
