//! Registering the gpusnap runtime handler in containerd's config, structurally (toml_edit), so
//! comments, ordering and unrelated settings survive byte for byte.
//!
//! # Drop-in or in-place
//!
//! containerd ≥ 2.0 deep-merges `imports`ed files into the main config (containerd PR #9982),
//! so a drop-in holding only `[...runtimes.gpusnap]` adds the handler and leaves every other CRI
//! setting alone; the main file only gains one `imports` entry. containerd 1.x replaces a whole
//! plugin section with the imported one (containerd issue #5837), so a drop-in there would wipe
//! the node's CRI settings: for 1.x, and whenever the containerd release is unknown and the
//! config is version 2, the table is added to the main file instead.

use std::path::{Path, PathBuf};

use toml_edit::{value, Array, DocumentMut, Item, Table};

/// Plugin holding CRI runtimes in config version 3 (containerd 2.x).
pub const CRI_RUNTIME_PLUGIN_V3: &str = "io.containerd.cri.v1.runtime";
/// Plugin holding CRI runtimes in config version 2 (containerd 1.x, still read by 2.x).
pub const CRI_PLUGIN_V2: &str = "io.containerd.grpc.v1.cri";
/// Version-1 configs name the CRI plugin by its short ID.
const CRI_PLUGIN_V1: &str = "cri";

#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("{path} is not valid TOML: {message}")]
    Parse { path: String, message: String },
    #[error(
        "{path}: `{key}` is not a table, so gpusnap cannot add its runtime under it; move that \
         setting into a [table] or register gpusnap by hand (see docs/install.md)"
    )]
    NotATable { path: String, key: String },
    #[error("{path}: `imports` must be an array of file paths, found {found}")]
    BadImports { path: String, found: String },
    #[error("{path}: config version {version} is newer than this gpusnap understands (1 to 4)")]
    UnsupportedVersion { path: String, version: i64 },
}

/// What to register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub handler: String,
    pub runtime_type: String,
    /// Absolute path of `containerd-shim-gpusnap-v2`.
    pub runtime_path: PathBuf,
    /// gpusnap config file, passed as the runtime option `ConfigPath`.
    pub config_path: PathBuf,
    pub pod_annotations: Vec<String>,
}

/// The `version` key; missing means 1, as containerd reads it.
pub fn config_version(doc: &DocumentMut) -> i64 {
    doc.get("version").and_then(Item::as_integer).unwrap_or(1)
}

pub fn parse(text: &str, path: &Path) -> Result<DocumentMut, EditError> {
    text.parse::<DocumentMut>().map_err(|e| EditError::Parse {
        path: path.display().to_string(),
        message: e.to_string().trim().to_owned(),
    })
}

/// The table path of the runtimes map for a config of `version`.
fn runtimes_path(doc: &DocumentMut, version: i64) -> Vec<&'static str> {
    let plugin = match version {
        3.. => CRI_RUNTIME_PLUGIN_V3,
        2 => CRI_PLUGIN_V2,
        // A v1 file that already spells the CRI plugin `cri` must keep doing so: containerd
        // renames `cri` to the full ID while migrating, and two entries would collide.
        _ if doc
            .get("plugins")
            .and_then(|p| p.get(CRI_PLUGIN_V1))
            .is_some() =>
        {
            CRI_PLUGIN_V1
        }
        _ => CRI_PLUGIN_V2,
    };
    vec!["plugins", plugin, "containerd", "runtimes"]
}

/// Walks to (creating as needed) the table at `keys`. New intermediate tables are implicit so
/// they produce no empty `[header]` lines.
fn table_at<'a>(
    doc: &'a mut DocumentMut,
    keys: &[&str],
    file: &Path,
) -> Result<&'a mut Table, EditError> {
    let mut cur: &mut Table = doc.as_table_mut();
    let mut walked = Vec::new();
    for key in keys {
        walked.push(*key);
        if !cur.contains_key(key) {
            let mut t = Table::new();
            t.set_implicit(true);
            cur.insert(key, Item::Table(t));
        }
        cur = cur
            .get_mut(key)
            .and_then(Item::as_table_mut)
            .ok_or_else(|| EditError::NotATable {
                path: file.display().to_string(),
                key: walked.join("."),
            })?;
    }
    Ok(cur)
}

/// The highest document position of any table under `table`.
fn max_position(table: &Table) -> Option<usize> {
    table
        .iter()
        .filter_map(|(_, item)| item.as_table())
        .map(|t| t.position().max(max_position(t)))
        .max()
        .flatten()
}

/// Sets `table[key] = v` only when it differs, so an unchanged value keeps its formatting.
fn set_str(table: &mut Table, key: &str, v: &str) {
    if table.get(key).and_then(Item::as_str) != Some(v) {
        table.insert(key, value(v));
    }
}

/// Adds (or updates) the runtime table in `text` and returns the new text. Existing keys of an
/// existing `gpusnap` table that gpusnap does not manage are kept.
pub fn register_in_place(text: &str, file: &Path, reg: &Registration) -> Result<String, EditError> {
    let mut doc = parse(text, file)?;
    let version = config_version(&doc);
    // Version 4 (containerd 2.2+) moved server settings into plugins; CRI's runtimes are
    // where version 3 has them.
    if version > 4 {
        return Err(EditError::UnsupportedVersion {
            path: file.display().to_string(),
            version,
        });
    }
    let path = runtimes_path(&doc, version);
    // New tables go after everything else, so the change is one block at the end of the file.
    let next = max_position(doc.as_table()).map_or(0, |p| p + 1);
    let runtimes = table_at(&mut doc, &path, file)?;
    let is_new = !runtimes.contains_key(&reg.handler);
    if is_new {
        let mut t = Table::new();
        t.set_position(next);
        runtimes.insert(&reg.handler, Item::Table(t));
    }
    let rt = runtimes
        .get_mut(&reg.handler)
        .and_then(Item::as_table_mut)
        .ok_or_else(|| EditError::NotATable {
            path: file.display().to_string(),
            key: format!("{}.{}", path.join("."), reg.handler),
        })?;
    // An inline or dotted table would render the new keys in odd places; a header is clearer.
    rt.set_implicit(false);
    set_str(rt, "runtime_type", &reg.runtime_type);
    set_str(rt, "runtime_path", &reg.runtime_path.to_string_lossy());
    ensure_strings(rt, "pod_annotations", &reg.pod_annotations, file)?;
    if !rt.contains_key("options") {
        let mut t = Table::new();
        t.set_position(rt.position().unwrap_or(next) + 1);
        rt.insert("options", Item::Table(t));
    }
    let opts = rt
        .get_mut("options")
        .and_then(Item::as_table_mut)
        .ok_or_else(|| EditError::NotATable {
            path: file.display().to_string(),
            key: format!("{}.{}.options", path.join("."), reg.handler),
        })?;
    set_str(opts, "ConfigPath", &reg.config_path.to_string_lossy());
    Ok(doc.to_string())
}

/// Makes sure the array `key` contains every string in `wanted`, appending missing ones.
fn ensure_strings(
    table: &mut Table,
    key: &str,
    wanted: &[String],
    file: &Path,
) -> Result<(), EditError> {
    match table.get_mut(key) {
        None => {
            let mut arr = Array::new();
            for w in wanted {
                arr.push(w.as_str());
            }
            table.insert(key, value(arr));
        }
        Some(item) => {
            let arr = item.as_array_mut().ok_or_else(|| EditError::NotATable {
                path: file.display().to_string(),
                key: key.to_owned(),
            })?;
            for w in wanted {
                if !arr.iter().any(|v| v.as_str() == Some(w)) {
                    arr.push(w.as_str());
                }
            }
        }
    }
    Ok(())
}

/// The drop-in file for a main config of `version`.
pub fn dropin_text(version: i64, reg: &Registration, dropin: &Path) -> Result<String, EditError> {
    let seed = format!(
        "# Written by `gpusnap install` (gpusnap {}): registers the `{}` runtime handler for CRI.\n\
         # `gpusnap uninstall` removes this file again. gpusnap's own settings live in {}.\n\
         version = {}\n",
        crate::VERSION,
        reg.handler,
        reg.config_path.display(),
        version.max(2)
    );
    register_in_place(&seed, dropin, reg)
}

/// First line of the block gpusnap appends to a k3s/RKE2 config template.
pub const TEMPLATE_BEGIN: &str =
    "# gpusnap: begin (written by `gpusnap install`; `gpusnap uninstall` removes it)";
/// Last line of that block.
pub const TEMPLATE_END: &str = "# gpusnap: end";

/// The config version of a k3s/RKE2 template at `template`: that of the config.toml k3s
/// rendered from it beside it, else the template's name (`config-v3.toml.tmpl` is for
/// containerd 2.x's version 3, `config.toml.tmpl` for version 2).
pub fn template_version(template: &Path, rendered: Option<&str>) -> i64 {
    if let Some(v) = rendered.and_then(|t| t.parse::<DocumentMut>().ok()) {
        return config_version(&v);
    }
    let name = template
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    if name.is_some_and(|n| n.contains("-v3")) {
        3
    } else {
        2
    }
}

/// A k3s/RKE2 containerd config template (a Go template k3s renders into config.toml at each
/// start, so edits of config.toml itself are lost) with the runtime table: appended between
/// [`TEMPLATE_BEGIN`] and [`TEMPLATE_END`] (replaced there on a later install). A new template
/// starts with `{{ template "base" . }}`, k3s's own configuration, so the node keeps it.
pub fn template_text(
    existing: Option<&str>,
    version: i64,
    reg: &Registration,
    file: &Path,
) -> Result<String, EditError> {
    let seed = format!("version = {version}\n");
    let table = register_in_place(&seed, file, reg)?;
    let table = table.strip_prefix(&seed).unwrap_or(&table).trim_start();
    let block = format!("{TEMPLATE_BEGIN}\n{table}{TEMPLATE_END}\n");
    let base = match existing {
        None => "{{ template \"base\" . }}\n".to_owned(),
        Some(text) => match (text.find(TEMPLATE_BEGIN), text.find(TEMPLATE_END)) {
            (Some(b), Some(e)) if e > b => {
                let after = text[e + TEMPLATE_END.len()..].trim_start_matches('\n');
                let mut kept = text[..b].to_owned();
                kept.push_str(after);
                kept
            }
            _ => text.to_owned(),
        },
    };
    // One blank line between what was there and the block, however often it is replaced.
    let mut out = base.trim_end_matches('\n').to_owned();
    out.push_str("\n\n");
    out.push_str(&block);
    Ok(out)
}

/// Adds `dropin` to the main config's `imports` unless an existing entry (exact path, relative
/// path or glob) already loads it. Returns the new text.
pub fn ensure_import(text: &str, file: &Path, dropin: &Path) -> Result<String, EditError> {
    let mut doc = parse(text, file)?;
    let base = file.parent().unwrap_or(Path::new("/"));
    match doc.get_mut("imports") {
        None => {
            let mut arr = Array::new();
            arr.push(dropin.to_string_lossy().as_ref());
            doc.insert("imports", value(arr));
        }
        Some(item) => {
            let Some(arr) = item.as_array_mut() else {
                return Err(EditError::BadImports {
                    path: file.display().to_string(),
                    found: item.to_string().trim().to_owned(),
                });
            };
            let covered = arr
                .iter()
                .filter_map(|v| v.as_str())
                .any(|entry| import_matches(base, entry, dropin));
            if !covered {
                arr.push(dropin.to_string_lossy().as_ref());
            }
        }
    }
    Ok(doc.to_string())
}

/// Whether containerd would load `target` for the import entry `entry` (containerd's
/// `resolveImports`: relative to the main file's directory; `*` means glob).
pub fn import_matches(base: &Path, entry: &str, target: &Path) -> bool {
    let resolved = if Path::new(entry).is_absolute() {
        PathBuf::from(entry)
    } else {
        base.join(entry)
    };
    let resolved = clean(&resolved);
    let target = clean(target);
    if entry.contains('*') {
        glob_match(&resolved.to_string_lossy(), &target.to_string_lossy())
    } else {
        resolved == target
    }
}

/// Lexical `filepath.Clean` for absolute paths: drop `.`, resolve `..`.
fn clean(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `filepath.Match` for `*` and `?` (neither crosses `/`). Character classes are treated as
/// not matching, so gpusnap adds its explicit import; importing a file twice is harmless
/// (containerd skips files it already loaded).
fn glob_match(pattern: &str, name: &str) -> bool {
    if pattern.contains('[') {
        return false;
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    fn rec(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len())
                .take_while(|&i| i == 0 || n[i - 1] != '/')
                .any(|i| rec(&p[1..], &n[i..])),
            Some('?') => n.first().is_some_and(|c| *c != '/') && rec(&p[1..], &n[1..]),
            Some(c) => n.first() == Some(c) && rec(&p[1..], &n[1..]),
        }
    }
    rec(&p, &n)
}

#[cfg(test)]
mod template_tests {
    use super::*;

    fn reg() -> Registration {
        Registration {
            handler: "gpusnap".into(),
            runtime_type: "io.containerd.gpusnap.v2".into(),
            runtime_path: "/usr/local/bin/containerd-shim-gpusnap-v2".into(),
            config_path: "/etc/gpusnap/config.toml".into(),
            pod_annotations: vec!["gpusnap.io/*".into()],
        }
    }

    #[test]
    fn a_new_template_keeps_k3s_base_and_a_second_install_replaces_the_block() {
        let f = Path::new("/x/config-v3.toml.tmpl");
        assert_eq!(template_version(f, None), 3);
        assert_eq!(template_version(Path::new("/x/config.toml.tmpl"), None), 2);
        assert_eq!(template_version(f, Some("version = 2\n")), 2);
        let t = template_text(None, 3, &reg(), f).unwrap();
        assert!(t.starts_with("{{ template \"base\" . }}\n"), "{t}");
        assert!(
            t.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gpusnap]"),
            "{t}"
        );
        assert_eq!(template_text(Some(&t), 3, &reg(), f).unwrap(), t);
        let user = "{{ template \"base\" . }}\n[plugins.x]\n  y = 1\n";
        let t2 = template_text(Some(user), 2, &reg(), f).unwrap();
        assert!(t2.starts_with(user), "{t2}");
        assert!(t2.contains("io.containerd.grpc.v1.cri"), "{t2}");
        assert_eq!(template_text(Some(&t2), 2, &reg(), f).unwrap(), t2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> Registration {
        Registration {
            handler: "gpusnap".into(),
            runtime_type: "io.containerd.gpusnap.v2".into(),
            runtime_path: "/usr/bin/containerd-shim-gpusnap-v2".into(),
            config_path: "/etc/gpusnap/config.toml".into(),
            pod_annotations: vec!["gpusnap.io/*".into()],
        }
    }

    const V2: &str = r#"# site config
version = 2
root = "/var/lib/containerd"   # keep

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
"#;

    #[test]
    fn v2_in_place_appends_only() {
        let out = register_in_place(V2, Path::new("/etc/containerd/config.toml"), &reg()).unwrap();
        assert!(
            out.starts_with(V2),
            "original text must be kept verbatim:\n{out}"
        );
        let added = &out[V2.len()..];
        assert!(
            added.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpusnap]"),
            "{added}"
        );
        assert!(
            added.contains("runtime_type = \"io.containerd.gpusnap.v2\""),
            "{added}"
        );
        assert!(
            added.contains("pod_annotations = [\"gpusnap.io/*\"]"),
            "{added}"
        );
        assert!(
            added.contains("ConfigPath = \"/etc/gpusnap/config.toml\""),
            "{added}"
        );
        // Idempotent.
        let again = register_in_place(&out, Path::new("/x"), &reg()).unwrap();
        assert_eq!(again, out);
    }

    #[test]
    fn v3_uses_the_runtime_plugin_and_no_empty_headers() {
        let out = register_in_place("version = 3\n", Path::new("/c.toml"), &reg()).unwrap();
        assert!(
            out.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gpusnap]"),
            "{out}"
        );
        assert!(!out.contains("[plugins]"), "{out}");
        assert!(
            !out.contains("[plugins.\"io.containerd.cri.v1.runtime\"]\n"),
            "{out}"
        );
        let doc: DocumentMut = out.parse().unwrap();
        assert_eq!(
            doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["gpusnap"]
                ["options"]["ConfigPath"]
                .as_str(),
            Some("/etc/gpusnap/config.toml")
        );
    }

    #[test]
    fn existing_gpusnap_table_is_updated_not_duplicated() {
        let text = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap]\n  runtime_type = \"old\"\n  snapshotter = \"overlayfs\" # mine\n  pod_annotations = [\"example.com/x\"]\n";
        let out = register_in_place(text, Path::new("/c"), &reg()).unwrap();
        assert_eq!(out.matches("runtimes.gpusnap]").count(), 1, "{out}");
        assert!(out.contains("snapshotter = \"overlayfs\" # mine"), "{out}");
        assert!(
            out.contains("[\"example.com/x\", \"gpusnap.io/*\"]"),
            "{out}"
        );
        assert!(
            out.contains("runtime_type = \"io.containerd.gpusnap.v2\""),
            "{out}"
        );
    }

    #[test]
    fn v1_config_keeps_the_short_plugin_name() {
        let text = "[plugins.cri.containerd]\n  snapshotter = \"overlayfs\"\n";
        let out = register_in_place(text, Path::new("/c"), &reg()).unwrap();
        assert!(
            out.contains("[plugins.cri.containerd.runtimes.gpusnap]"),
            "{out}"
        );
    }

    #[test]
    fn non_table_is_reported_with_its_key() {
        let err =
            register_in_place("version = 2\nplugins = 3\n", Path::new("/c"), &reg()).unwrap_err();
        assert!(
            err.to_string().contains("`plugins` is not a table"),
            "{err}"
        );
        let err = register_in_place("version = 5\n", Path::new("/c"), &reg()).unwrap_err();
        assert!(matches!(
            err,
            EditError::UnsupportedVersion { version: 5, .. }
        ));
        let v4 = register_in_place("version = 4\n", Path::new("/c"), &reg()).unwrap();
        assert!(v4.contains(CRI_RUNTIME_PLUGIN_V3), "{v4}");
        let err = register_in_place("version = [", Path::new("/c"), &reg()).unwrap_err();
        assert!(matches!(err, EditError::Parse { .. }), "{err}");
    }

    #[test]
    fn imports_added_once_and_globs_respected() {
        let main = Path::new("/etc/containerd/config.toml");
        let dropin = Path::new("/etc/containerd/conf.d/99-gpusnap.toml");
        let out = ensure_import(
            "version = 3\n# hi\n\n[debug]\n  level = \"info\"\n",
            main,
            dropin,
        )
        .unwrap();
        assert_eq!(
            out,
            "version = 3\nimports = [\"/etc/containerd/conf.d/99-gpusnap.toml\"]\n# hi\n\n[debug]\n  level = \"info\"\n"
        );
        assert_eq!(ensure_import(&out, main, dropin).unwrap(), out);
        let globbed = "version = 3\nimports = [\"conf.d/*.toml\"]\n";
        assert_eq!(ensure_import(globbed, main, dropin).unwrap(), globbed);
        let other = "version = 3\nimports = [\"/etc/other.toml\"] # site\n";
        assert_eq!(
            ensure_import(other, main, dropin).unwrap(),
            "version = 3\nimports = [\"/etc/other.toml\", \"/etc/containerd/conf.d/99-gpusnap.toml\"] # site\n"
        );
        assert!(matches!(
            ensure_import("imports = \"x\"\n", main, dropin),
            Err(EditError::BadImports { .. })
        ));
    }

    #[test]
    fn glob_rules() {
        let base = Path::new("/etc/containerd");
        let t = Path::new("/etc/containerd/conf.d/99-gpusnap.toml");
        assert!(import_matches(base, "/etc/containerd/conf.d/*.toml", t));
        assert!(import_matches(base, "./conf.d/99-gpusnap.toml", t));
        assert!(import_matches(base, "/etc/containerd/conf.d/9?-*.toml", t));
        // containerd globs only when the entry has a `*`; `?` alone is a literal name.
        assert!(!import_matches(
            base,
            "/etc/containerd/conf.d/??-gpusnap.toml",
            t
        ));
        assert!(
            !import_matches(base, "/etc/containerd/*.toml", t),
            "* must not cross /"
        );
        assert!(!import_matches(base, "/etc/containerd/conf.d/*.conf", t));
        assert!(!import_matches(
            base,
            "/etc/containerd/conf.d/[0-9]*.toml",
            t
        ));
    }

    #[test]
    fn dropin_matches_main_version() {
        let d = dropin_text(2, &reg(), Path::new("/d.toml")).unwrap();
        assert!(d.contains("version = 2\n"), "{d}");
        assert!(d.contains("io.containerd.grpc.v1.cri"), "{d}");
        let d = dropin_text(3, &reg(), Path::new("/d.toml")).unwrap();
        assert!(
            d.contains("version = 3\n") && d.contains(CRI_RUNTIME_PLUGIN_V3),
            "{d}"
        );
        assert!(d.starts_with("# Written by `gpusnap install`"), "{d}");
    }
}
