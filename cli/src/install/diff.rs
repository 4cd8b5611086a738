//! Unified diffs for `--dry-run`.

use std::path::Path;

/// `diff -u` style text for `path` going from `before` to `after` (`None`: absent).
pub fn unified(path: &Path, before: Option<&str>, after: Option<&str>) -> String {
    let shown = path.display().to_string();
    let (old_name, new_name) = match (before, after) {
        (None, _) => ("/dev/null".to_owned(), shown),
        (_, None) => (shown, "/dev/null".to_owned()),
        _ => (shown.clone(), shown),
    };
    let old = before.unwrap_or_default();
    let new = after.unwrap_or_default();
    let diff = similar::TextDiff::from_lines(old, new);
    let mut out = diff
        .unified_diff()
        .context_radius(3)
        .header(&old_name, &new_name)
        .to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_headers_and_lines() {
        let d = unified(Path::new("/etc/c.toml"), Some("a\nb\n"), Some("a\nb\nc\n"));
        assert!(d.starts_with("--- /etc/c.toml\n+++ /etc/c.toml\n"), "{d}");
        assert!(d.contains("\n+c\n"), "{d}");
        let created = unified(Path::new("/n"), None, Some("x\n"));
        assert!(created.starts_with("--- /dev/null\n+++ /n\n"), "{created}");
        let removed = unified(Path::new("/n"), Some("x\n"), None);
        assert!(
            removed.contains("+++ /dev/null") && removed.contains("-x"),
            "{removed}"
        );
        assert_eq!(unified(Path::new("/s"), Some("same\n"), Some("same\n")), "");
    }
}
