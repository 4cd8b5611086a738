//! Registering `gpusnap-runc` with Podman: `[engine.runtimes] gpusnap = ["/abs/gpusnap-runc"]`
//! in a containers.conf file, edited structurally (toml_edit) so an operator's own file keeps
//! its comments and settings.
//!
//! Podman reads `/etc/containers/containers.conf.d/*.conf` after containers.conf, so the
//! default target is a drop-in of gpusnap's own; `--podman-conf` may name any containers.conf
//! (Podman reads only the file in `CONTAINERS_CONF` when that is set).
//!
//! The runtime path must be absolute: Podman looks a runtime name up on its own `PATH` when it
//! starts, but runs the runtime's `kill` and `delete` with no `PATH` at all. gpusnap-runc
//! finds runc from the gpusnap config and the standard system path for those calls.
//!
//! A gpusnap config outside the default location reaches gpusnap-runc through the
//! environment: `engine.env` (Podman's own, inherited by `checkpoint`) and
//! `engine.conmon_env_vars` (conmon's, inherited by `create` and `restore`). The latter
//! replaces Podman's default list, so it carries the standard `PATH` too.

use std::path::Path;

use toml_edit::{value, Array, Item, Table};

use super::containerd::{parse, EditError};

/// Drop-in name under `/etc/containers/containers.conf.d` (read in lexical order).
pub const DROPIN_NAME: &str = "90-gpusnap.conf";
/// Where Podman reads drop-ins by default.
pub const DROPIN_DIR: &str = "/etc/containers/containers.conf.d";

/// What conmon's environment is without `conmon_env_vars` (containers.conf's default).
pub const CONMON_DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const HEADER: &str = "# Written by `gpusnap install`: the `gpusnap` OCI runtime for Podman \
                      (`podman run --runtime gpusnap`).\n# `gpusnap uninstall` removes it again.\n";

/// `existing` (a containers.conf, or `None` for a new drop-in) with the runtime `handler`
/// registered as `wrapper`; `config_env` (`GPUSNAP_CONFIG=...`) is added to Podman's and
/// conmon's environment when the gpusnap config is not at its default location.
pub fn register(
    existing: Option<&str>,
    path: &Path,
    handler: &str,
    wrapper: &Path,
    config_env: Option<&str>,
) -> Result<String, EditError> {
    let mut doc = parse(existing.unwrap_or_default(), path)?;
    let engine = table_at(doc.as_table_mut(), "engine", path)?;
    let runtimes = table_at(engine, "runtimes", path)?;
    let mut paths = Array::new();
    paths.push(wrapper.to_string_lossy().as_ref());
    runtimes.insert(handler, value(paths));
    if let Some(env) = config_env {
        let engine = table_at(doc.as_table_mut(), "engine", path)?;
        add_env(engine, "env", env, None, path)?;
        add_env(
            engine,
            "conmon_env_vars",
            env,
            Some(CONMON_DEFAULT_PATH),
            path,
        )?;
    }
    Ok(match existing {
        Some(_) => doc.to_string(),
        // A new drop-in starts with a header saying where it came from.
        None => format!("{HEADER}\n{doc}"),
    })
}

/// The table `key` of `parent`, created (as a `[table]`, not inline) when absent.
fn table_at<'a>(parent: &'a mut Table, key: &str, path: &Path) -> Result<&'a mut Table, EditError> {
    let item = parent.entry(key).or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    item.as_table_mut().ok_or_else(|| EditError::NotATable {
        path: path.display().to_string(),
        key: key.to_owned(),
    })
}

/// Sets `NAME=value` in the string array `key` (replacing an earlier `NAME=`); a new array
/// starts with `first`.
fn add_env(
    engine: &mut Table,
    key: &str,
    entry: &str,
    first: Option<&str>,
    path: &Path,
) -> Result<(), EditError> {
    let name = entry.split('=').next().unwrap_or(entry);
    let item = engine.entry(key).or_insert_with(|| {
        let mut a = Array::new();
        if let Some(f) = first {
            a.push(f);
        }
        value(a)
    });
    let arr = item.as_array_mut().ok_or_else(|| EditError::NotATable {
        path: path.display().to_string(),
        key: format!("engine.{key}"),
    })?;
    arr.retain(|v| v.as_str().is_none_or(|s| s.split('=').next() != Some(name)));
    arr.push(entry);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> toml_edit::DocumentMut {
        text.parse().unwrap()
    }

    #[test]
    fn new_dropin_holds_the_absolute_runtime_only() {
        let text = register(
            None,
            Path::new("/etc/containers/containers.conf.d/90-gpusnap.conf"),
            "gpusnap",
            Path::new("/usr/local/bin/gpusnap-runc"),
            None,
        )
        .unwrap();
        assert!(text.starts_with("# Written by `gpusnap install`"), "{text}");
        let d = doc(&text);
        let rt = d["engine"]["runtimes"]["gpusnap"].as_array().unwrap();
        assert_eq!(
            rt.get(0).unwrap().as_str(),
            Some("/usr/local/bin/gpusnap-runc")
        );
        assert!(d["engine"].get("env").is_none(), "{text}");
        assert!(text.contains("[engine.runtimes]"), "{text}");
    }

    #[test]
    fn existing_file_keeps_its_settings_and_gets_the_config_env() {
        let original = "# site settings\n[containers]\nnetns = \"none\"\n\n[engine]\n\
                        cgroup_manager = \"cgroupfs\"\nenv = [\"A=1\", \"GPUSNAP_CONFIG=/old\"]\n";
        let text = register(
            Some(original),
            Path::new("/x/containers.conf"),
            "gpusnap",
            Path::new("/opt/g/gpusnap-runc"),
            Some("GPUSNAP_CONFIG=/x/gpusnap.toml"),
        )
        .unwrap();
        assert!(
            text.starts_with("# site settings\n[containers]\nnetns = \"none\"\n"),
            "{text}"
        );
        let d = doc(&text);
        assert_eq!(d["engine"]["cgroup_manager"].as_str(), Some("cgroupfs"));
        let strings = |key: &str| -> Vec<String> {
            d["engine"][key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(strings("env"), ["A=1", "GPUSNAP_CONFIG=/x/gpusnap.toml"]);
        assert_eq!(
            strings("conmon_env_vars"),
            [CONMON_DEFAULT_PATH, "GPUSNAP_CONFIG=/x/gpusnap.toml"]
        );
        assert_eq!(
            d["engine"]["runtimes"]["gpusnap"]
                .as_array()
                .unwrap()
                .get(0)
                .unwrap()
                .as_str(),
            Some("/opt/g/gpusnap-runc")
        );
        // A second registration changes nothing.
        let again = register(
            Some(&text),
            Path::new("/x/containers.conf"),
            "gpusnap",
            Path::new("/opt/g/gpusnap-runc"),
            Some("GPUSNAP_CONFIG=/x/gpusnap.toml"),
        )
        .unwrap();
        assert_eq!(again, text);
    }

    #[test]
    fn engine_that_is_not_a_table_is_refused() {
        let err = register(
            Some("engine = 3\n"),
            Path::new("/x/c.conf"),
            "gpusnap",
            Path::new("/g"),
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("engine"), "{err}");
    }
}
