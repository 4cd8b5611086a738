//! Keeping CRIU's own cuda plugin out of the CRIU runs gpusnap starts.
//!
//! CRIU ≥ 4 ships `cuda_plugin.so`. When it is in CRIU's plugin directory it acts on every dump
//! and restore: it locks and checkpoints CUDA processes during the dump and restores and
//! unlocks them at the end of the restore. gpusnap does that itself, around CRIU, with its own
//! engines and rollback; both at once fail (the driver reports `CUDA_ERROR_ILLEGAL_STATE` to
//! whichever comes second).
//!
//! How CRIU picks its plugin directory (CRIU 4.2 `criu/plugin.c`, `criu/config.c`): the last
//! `libdir` option among `/etc/criu/default.conf`, `~/.criu/default.conf`, `$CRIU_CONFIG_FILE`
//! and, for runc's RPC requests, runc's CRIU config file (`/etc/criu/runc.conf`, or the file an
//! `org.criu.config` annotation names); else `$CRIU_LIBS_DIR`; else the built-in default
//! (`/usr/lib/criu/`). runc passes its whole environment to CRIU.
//!
//! So gpusnap runs runc with a private plugin directory — every plugin of the directory CRIU
//! would have used ([`plugin_source`]: a default config file's `libdir`, else
//! `CRIU_LIBS_DIR`, else the built-in one), linked in, except the excluded ones — named both by `CRIU_LIBS_DIR` and by
//! a `libdir` line in a private `CRIU_CONFIG_FILE` (which outranks the default config files).
//! Only a `libdir` in runc's CRIU config file still wins; [`runc_config_libdir`] finds it so
//! the caller can refuse before CRIU runs.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// CRIU's built-in plugin directory when it was built without `PLUGINDIR` (as Debian's and
/// setup-env's builds are).
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/criu";
/// CRIU's own default configuration file, read by every CRIU run.
pub const CRIU_DEFAULT_CONFIG: &str = "/etc/criu/default.conf";
/// runc's CRIU configuration file (runc `handleCriuConfigurationFile`).
pub const RUNC_CRIU_CONFIG: &str = "/etc/criu/runc.conf";
/// The OCI annotation that names another CRIU configuration file for runc.
pub const CRIU_CONFIG_ANNOTATION: &str = "org.criu.config";
/// Plugins gpusnap keeps out of its CRIU runs: it performs the CUDA checkpoint itself.
pub const EXCLUDED_PLUGINS: [&str; 1] = ["cuda_plugin.so"];

/// The plugin directory CRIU would use for a run with `criu_libs_dir` (the `CRIU_LIBS_DIR` of
/// its environment), ignoring config files.
pub fn plugin_dir_for(criu_libs_dir: Option<&std::ffi::OsStr>) -> PathBuf {
    criu_libs_dir
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGIN_DIR))
}

/// CRIU's default config files, in the order CRIU reads them (a later `libdir` wins):
/// `/etc/criu/default.conf`, `$HOME/.criu/default.conf`, then `$CRIU_CONFIG_FILE`.
pub fn default_config_files(
    home: Option<&std::ffi::OsStr>,
    criu_config_file: Option<&std::ffi::OsStr>,
) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from(CRIU_DEFAULT_CONFIG)];
    files.extend(home.map(|h| Path::new(h).join(".criu/default.conf")));
    files.extend(
        criu_config_file
            .filter(|f| !f.is_empty())
            .map(PathBuf::from),
    );
    files
}

/// The plugin directory CRIU would use for a run: the last `libdir` among `config_files`
/// (which outranks the environment), else [`plugin_dir_for`] `criu_libs_dir`. gpusnap mirrors
/// this directory, so plugins an operator named in CRIU's own config file keep loading.
pub fn plugin_source(criu_libs_dir: Option<&std::ffi::OsStr>, config_files: &[PathBuf]) -> PathBuf {
    config_files
        .iter()
        .rev()
        .find_map(|f| config_libdir(f))
        .map(|c| c.libdir)
        .unwrap_or_else(|| plugin_dir_for(criu_libs_dir))
}

/// The excluded plugins present in `dir`.
pub fn excluded_in(dir: &Path) -> Vec<PathBuf> {
    EXCLUDED_PLUGINS
        .iter()
        .map(|name| dir.join(name))
        .filter(|p| p.exists())
        .collect()
}

/// The name of the private plugin directory (or its config file) that process `pid` made
/// ([`PluginDir::prepare`]): `criu-plugins-<pid>-<n>` and `criu-plugins-<pid>-<n>.conf`. A
/// runtime killed mid-transaction never dropped them; whoever repairs after it removes them.
pub fn is_plugin_dir_of(name: &std::ffi::OsStr, pid: u32) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    let name = name.strip_suffix(".conf").unwrap_or(name);
    name.strip_prefix(&format!("criu-plugins-{pid}-"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A private plugin directory for one transaction; removed when dropped.
#[derive(Debug)]
pub struct PluginDir {
    dir: PathBuf,
    config: PathBuf,
    /// Plugins of the source directory linked in.
    pub kept: Vec<String>,
    /// Plugins of the source directory left out.
    pub excluded: Vec<String>,
}

impl PluginDir {
    /// Mirrors `source` (the directory CRIU would load plugins from; it may not exist) into
    /// a fresh directory under `parent`, without [`EXCLUDED_PLUGINS`], and writes the
    /// config file that names it. `inherited_config` is the caller's `$CRIU_CONFIG_FILE`,
    /// whose options are carried over.
    pub fn prepare(
        parent: &Path,
        source: &Path,
        inherited_config: Option<&Path>,
    ) -> io::Result<PluginDir> {
        fs::create_dir_all(parent)?;
        let mut n = 0u32;
        let (dir, name) = loop {
            let name = format!("criu-plugins-{}-{n}", std::process::id());
            match fs::create_dir(parent.join(&name)) {
                Ok(()) => break (parent.join(&name), name),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e),
            }
        };
        let mut guard = PluginDir {
            config: parent.join(format!("{name}.conf")),
            dir,
            kept: Vec::new(),
            excluded: Vec::new(),
        };
        if let Ok(entries) = fs::read_dir(source) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // CRIU loads exactly the names that end in ".so".
                if !name.ends_with(".so") {
                    continue;
                }
                if EXCLUDED_PLUGINS.contains(&name.as_str()) {
                    guard.excluded.push(name);
                    continue;
                }
                std::os::unix::fs::symlink(e.path(), guard.dir.join(&name))?;
                guard.kept.push(name);
            }
        }
        guard.kept.sort();
        let mut conf = inherited_config
            .and_then(|p| fs::read_to_string(p).ok())
            .unwrap_or_default();
        if !conf.is_empty() && !conf.ends_with('\n') {
            conf.push('\n');
        }
        conf.push_str(&format!(
            "# written by gpusnap: CRIU's own cuda plugin stays out\nlibdir {}\n",
            guard.dir.display()
        ));
        fs::write(&guard.config, conf)?;
        Ok(guard)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The environment that points CRIU (through runc) at this directory.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            ("CRIU_LIBS_DIR".into(), self.dir.clone().into_os_string()),
            (
                "CRIU_CONFIG_FILE".into(),
                self.config.clone().into_os_string(),
            ),
        ]
    }
}

impl Drop for PluginDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_file(&self.config);
    }
}

/// A `libdir` set in runc's CRIU config file, which outranks everything gpusnap can set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigLibdir {
    pub file: PathBuf,
    pub libdir: PathBuf,
}

/// runc's CRIU config file for a container: the `org.criu.config` annotation's file (none when
/// it is empty), else `/etc/criu/runc.conf` when it exists.
pub fn runc_config_file(annotation: Option<&str>, default_file: &Path) -> Option<PathBuf> {
    match annotation {
        Some("") => None,
        Some(file) => Some(PathBuf::from(file)),
        None => default_file.exists().then(|| default_file.to_path_buf()),
    }
}

/// The last `libdir` option in a CRIU config file (options are long option names without
/// `--`, one per line, value after a space or `=`).
pub fn config_libdir(file: &Path) -> Option<ConfigLibdir> {
    // CRIU config files are a few lines; a huge one is not a config file.
    let meta = fs::metadata(file).ok()?;
    if meta.len() > 1 << 20 {
        return None;
    }
    let text = fs::read_to_string(file).ok()?;
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("--").unwrap_or(line);
            let (key, value) = line
                .split_once(|c: char| c == '=' || c.is_whitespace())
                .unwrap_or((line, ""));
            (key == "libdir" || key == "L").then(|| value.trim().trim_matches('"').to_string())
        })
        .rfind(|v| !v.is_empty())
        .map(|libdir| ConfigLibdir {
            file: file.to_path_buf(),
            libdir: PathBuf::from(libdir),
        })
}

/// An excluded plugin that would still run because runc's CRIU config file sets `libdir`.
pub fn runc_config_libdir(annotation: Option<&str>, default_file: &Path) -> Option<ConfigLibdir> {
    let file = runc_config_file(annotation, default_file)?;
    config_libdir(&file).filter(|c| !excluded_in(&c.libdir).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dir_keeps_other_plugins_and_leaves_the_cuda_plugin_out() {
        let src = tempfile::tempdir().unwrap();
        for f in [
            "cuda_plugin.so",
            "amdgpu_plugin.so",
            "inet.so",
            "README",
            "x.so.1",
        ] {
            fs::write(src.path().join(f), b"").unwrap();
        }
        let run = tempfile::tempdir().unwrap();
        let inherited = run.path().join("site.conf");
        fs::write(&inherited, "tcp-established").unwrap();
        let dir = PluginDir::prepare(run.path(), src.path(), Some(&inherited)).unwrap();
        assert_eq!(dir.kept, ["amdgpu_plugin.so", "inet.so"]);
        assert_eq!(dir.excluded, ["cuda_plugin.so"]);
        assert!(dir.path().join("inet.so").exists());
        assert!(!dir.path().join("cuda_plugin.so").exists());
        let env = dir.env();
        let conf = PathBuf::from(&env[1].1);
        let text = fs::read_to_string(&conf).unwrap();
        assert!(text.starts_with("tcp-established\n"), "{text}");
        assert_eq!(config_libdir(&conf).unwrap().libdir, dir.path());
        let path = dir.path().to_path_buf();
        let me = std::process::id();
        assert!(is_plugin_dir_of(path.file_name().unwrap(), me));
        assert!(is_plugin_dir_of(conf.file_name().unwrap(), me));
        assert!(!is_plugin_dir_of(path.file_name().unwrap(), me + 1));
        assert!(!is_plugin_dir_of(
            std::ffi::OsStr::new("criu-plugins-1-x"),
            1
        ));
        drop(dir);
        assert!(!path.exists() && !conf.exists());
    }

    #[test]
    fn missing_source_gives_an_empty_directory() {
        let run = tempfile::tempdir().unwrap();
        let dir = PluginDir::prepare(run.path(), Path::new("/nonexistent/criu"), None).unwrap();
        assert!(dir.kept.is_empty() && dir.excluded.is_empty());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn runc_config_libdir_is_found_only_when_it_holds_an_excluded_plugin() {
        let root = tempfile::tempdir().unwrap();
        let plugins = root.path().join("plugins");
        fs::create_dir(&plugins).unwrap();
        let conf = root.path().join("runc.conf");
        fs::write(
            &conf,
            format!(
                "tcp-established\nlibdir /elsewhere\n--libdir={}\n",
                plugins.display()
            ),
        )
        .unwrap();
        assert_eq!(config_libdir(&conf).unwrap().libdir, plugins);
        assert_eq!(
            runc_config_libdir(None, &conf),
            None,
            "no cuda plugin there"
        );
        fs::write(plugins.join("cuda_plugin.so"), b"").unwrap();
        assert_eq!(runc_config_libdir(None, &conf).unwrap().libdir, plugins);
        assert_eq!(
            runc_config_libdir(Some(""), &conf),
            None,
            "annotation: no file"
        );
        assert_eq!(
            runc_config_file(None, &root.path().join("absent")),
            None,
            "no runc.conf"
        );
    }

    #[test]
    fn plugin_source_follows_the_last_config_libdir_then_the_environment() {
        let root = tempfile::tempdir().unwrap();
        let (etc, user) = (root.path().join("etc.conf"), root.path().join("user.conf"));
        let env = Some(std::ffi::OsStr::new("/env"));
        assert_eq!(
            plugin_source(env, &[etc.clone(), user.clone()]),
            Path::new("/env")
        );
        fs::write(&etc, "libdir /etc-plugins\n").unwrap();
        assert_eq!(
            plugin_source(env, &[etc.clone(), user.clone()]),
            Path::new("/etc-plugins")
        );
        fs::write(&user, "tcp-established\n--libdir=/user-plugins\n").unwrap();
        assert_eq!(
            plugin_source(None, &[etc, user]),
            Path::new("/user-plugins")
        );
        let files = default_config_files(Some("/root".as_ref()), Some("/x.conf".as_ref()));
        assert_eq!(
            files,
            [
                PathBuf::from(CRIU_DEFAULT_CONFIG),
                PathBuf::from("/root/.criu/default.conf"),
                PathBuf::from("/x.conf")
            ]
        );
    }

    #[test]
    fn plugin_dir_follows_the_environment() {
        assert_eq!(plugin_dir_for(None), Path::new(DEFAULT_PLUGIN_DIR));
        assert_eq!(
            plugin_dir_for(Some(std::ffi::OsStr::new("/x"))),
            Path::new("/x")
        );
    }
}
