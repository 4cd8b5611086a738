//! Registry credentials: a docker `config.json` (`auths[host].auth`), or given explicitly.
//!
//! The file is parsed here rather than through `docker-credential-*` helpers: a helper named
//! by `credsStore`/`credHelpers` is a program found on `PATH`, and running one as root from a
//! node agent because a config file says so is not something gpusnap does. Entries that only
//! a helper can answer, and OAuth identity tokens (which need an exchange this client does
//! not do), are reported in the hint that an authentication failure prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;

use super::super::error::ImageError;

/// Where registry credentials come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; anonymous when neither
    /// exists or it has no entry for the registry.
    #[default]
    Auto,
    /// This docker `config.json` (it must exist).
    DockerConfig(PathBuf),
    /// No credentials.
    Anonymous,
    /// A user name and password (or token) given directly.
    Basic { username: String, password: String },
}

/// A docker config file is a few KiB; refuse anything absurd.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

#[derive(serde::Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
}

#[derive(serde::Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// The `auths` key as a bare `host[:port]`: `https://host/v1/` and `host` name the same one.
fn normalize_key(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// The default docker config path: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
pub fn default_docker_config() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// The credentials for `registry` (`host[:port]`) and a line saying where they came from.
pub(crate) fn resolve(
    creds: &Credentials,
    registry: &str,
) -> Result<(RegistryAuth, String), ImageError> {
    match creds {
        Credentials::Anonymous => Ok((RegistryAuth::Anonymous, "none (anonymous)".into())),
        Credentials::Basic { username, .. } if username.is_empty() => Err(ImageError::invalid(
            "registry credentials",
            "",
            "empty user name",
        )),
        Credentials::Basic { username, password } => Ok((
            RegistryAuth::Basic(username.clone(), password.clone()),
            format!("user {username:?}, given explicitly"),
        )),
        Credentials::DockerConfig(path) => from_file(path, registry, true),
        Credentials::Auto => match default_docker_config() {
            Some(path) => from_file(&path, registry, false),
            None => Ok((
                RegistryAuth::Anonymous,
                "none: no $DOCKER_CONFIG or $HOME to find a docker config.json in".into(),
            )),
        },
    }
}

fn from_file(
    path: &Path,
    registry: &str,
    must_exist: bool,
) -> Result<(RegistryAuth, String), ImageError> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
            return Ok((
                RegistryAuth::Anonymous,
                format!("none: {} does not exist (anonymous)", path.display()),
            ))
        }
        Err(e) => return Err(ImageError::io("reading", path)(e)),
    };
    let mut text = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(ImageError::io("reading", path))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ImageError::malformed(
            "docker config",
            path.display().to_string(),
            "larger than 1 MiB",
        ));
    }
    let config: DockerConfig = serde_json::from_slice(&text)
        .map_err(|e| ImageError::malformed("docker config", path.display().to_string(), e))?;
    parse_entry(&config, path, registry)
}

fn parse_entry(
    config: &DockerConfig,
    path: &Path,
    registry: &str,
) -> Result<(RegistryAuth, String), ImageError> {
    let shown = path.display();
    let entry = config
        .auths
        .iter()
        .find(|(k, _)| normalize_key(k) == registry)
        .map(|(_, v)| v);
    let bad = |reason: String| {
        ImageError::malformed(
            "docker config",
            shown.to_string(),
            format!("auths[{registry:?}]: {reason}"),
        )
    };
    if let Some(e) = entry {
        if let Some(encoded) = e.auth.as_deref().filter(|a| !a.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|err| bad(format!("auth is not base64 ({err})")))?;
            let text = String::from_utf8(decoded).map_err(|_| bad("auth is not UTF-8".into()))?;
            let (user, pass) = text
                .split_once(':')
                .ok_or_else(|| bad("auth is not base64 of user:password".into()))?;
            return Ok((
                RegistryAuth::Basic(user.to_owned(), pass.to_owned()),
                format!("user {user:?} from {shown}"),
            ));
        }
        if let (Some(u), Some(p)) = (&e.username, &e.password) {
            return Ok((
                RegistryAuth::Basic(u.clone(), p.clone()),
                format!("user {u:?} from {shown}"),
            ));
        }
        if e.identity_token.is_some() {
            return Ok((
                RegistryAuth::Anonymous,
                format!(
                    "none: {shown} has only an identity token for {registry}, which gpusnap \
                     cannot exchange; add an auth entry (docker login with a password or \
                     access token)"
                ),
            ));
        }
    }
    let helper = config
        .cred_helpers
        .iter()
        .find(|(k, _)| normalize_key(k) == registry)
        .map(|(_, v)| v)
        .or(config.creds_store.as_ref());
    let hint = match helper {
        Some(h) => format!(
            "none: {shown} leaves {registry} to the credential helper docker-credential-{h}, \
             which gpusnap does not run; put an auth entry for it in a config file for gpusnap \
             (--registry-config)"
        ),
        None => format!("none: {shown} has no auths entry for {registry} (anonymous)"),
    };
    Ok((RegistryAuth::Anonymous, hint))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str, registry: &str) -> Result<(RegistryAuth, String), ImageError> {
        let c: DockerConfig = serde_json::from_str(json).unwrap();
        parse_entry(&c, Path::new("/x/config.json"), registry)
    }

    #[test]
    fn auth_entries() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3:cret");
        let json = format!(
            r#"{{"auths":{{"https://reg.example:5000/v1/":{{"auth":"{b64}"}},
                "other:1":{{"username":"bob","password":"pw"}},
                "tok:1":{{"identitytoken":"xyz"}}}},
               "credHelpers":{{"helped:1":"ecr-login"}}}}"#
        );
        match parse(&json, "reg.example:5000").unwrap() {
            (RegistryAuth::Basic(u, p), hint) => {
                assert_eq!((u.as_str(), p.as_str()), ("alice", "s3:cret"));
                assert!(hint.contains("alice"), "{hint}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&json, "other:1").unwrap().0,
            RegistryAuth::Basic(u, _) if u == "bob"
        ));
        let (a, hint) = parse(&json, "tok:1").unwrap();
        assert!(matches!(a, RegistryAuth::Anonymous) && hint.contains("identity token"));
        let (a, hint) = parse(&json, "helped:1").unwrap();
        assert!(
            matches!(a, RegistryAuth::Anonymous) && hint.contains("ecr-login"),
            "{hint}"
        );
        let (a, hint) = parse(&json, "unknown:1").unwrap();
        assert!(matches!(a, RegistryAuth::Anonymous) && hint.contains("no auths entry"));
        assert!(parse(r#"{"auths":{"h:1":{"auth":"!!"}}}"#, "h:1").is_err());
    }

    #[test]
    fn missing_files() {
        let gone = Path::new("/nonexistent/gpusnap/config.json");
        assert!(from_file(gone, "h:1", true).is_err());
        assert!(matches!(
            from_file(gone, "h:1", false).unwrap().0,
            RegistryAuth::Anonymous
        ));
    }
}
