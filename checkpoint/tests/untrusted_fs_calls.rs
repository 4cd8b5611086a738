//! CI check: the code that handles trees from elsewhere (an image, a layer, an archive, a
//! registry, a checkpoint directory) touches them only through `gpusnap_checkpoint::beneath`
//! (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` on a directory
//! descriptor), never through a path call of `std::fs` that follows symlinks.
//!
//! [`UNTRUSTED_MODULES`] declares the modules that handle such trees. In them, every path call
//! of `std::fs` (outside `#[cfg(test)]` code and comments) fails this test, naming file:line,
//! unless [`ALLOWED`] lists it with the reason it is safe: a path gpusnap itself chose, in a
//! directory only root writes, that no image names. A new module that reads from an untrusted
//! tree belongs in the list; a new allowance needs its reason reviewed.

use std::path::{Path, PathBuf};

/// Modules (relative to the workspace root) that handle untrusted trees.
const UNTRUSTED_MODULES: &[&str] = &[
    "checkpoint/src/beneath.rs",
    "checkpoint/src/chunks/mod.rs",
    "checkpoint/src/chunks/assemble.rs",
    "checkpoint/src/origin.rs",
    "checkpoint/src/validate.rs",
    "checkpoint/src/rootfs_diff.rs",
    "oci-image/src/extract.rs",
    "oci-image/src/inspect.rs",
    "oci-image/src/source.rs",
    "shim/src/restore_from.rs",
];

/// Functions of `std::fs` that take a path (matched as `fs::NAME(` written through `std::fs`
/// or a `use std::fs` import — not `rustix::fs::` or `rfs::`, whose calls take descriptors).
const FS_PATH_FNS: &[&str] = &[
    "read",
    "read_to_string",
    "write",
    "metadata",
    "symlink_metadata",
    "read_dir",
    "read_link",
    "rename",
    "copy",
    "remove_file",
    "remove_dir",
    "remove_dir_all",
    "create_dir",
    "create_dir_all",
    "set_permissions",
    "canonicalize",
    "hard_link",
];

/// Other calls that open or look at a path (following symlinks).
const PATH_CALLS: &[&str] = &[
    "File::open",
    "File::create",
    "OpenOptions::new",
    "DirBuilder::new",
    ".exists()",
    ".is_file()",
    ".is_dir()",
    ".metadata()",
    "symlink_metadata(",
    "read_dir(",
];

/// The first path call in one line of code, if any.
fn path_call(code: &str) -> Option<String> {
    for (at, _) in code.match_indices("fs::") {
        let before = &code[..at];
        let through_std = before.ends_with("std::")
            || !(before.ends_with("::")
                || before
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_'));
        if !through_std {
            continue;
        }
        let after = &code[at + 4..];
        if let Some(f) = FS_PATH_FNS.iter().find(|f| {
            after.starts_with(*f)
                && !after[f.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
        }) {
            return Some(format!("fs::{f}"));
        }
    }
    PATH_CALLS
        .iter()
        .find(|c| code.contains(*c))
        .map(|c| c.to_string())
}

/// Reviewed exceptions: (module, a substring of the line, why it is safe).
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "checkpoint/src/beneath.rs",
        "std::fs::File::from(fd)",
        "wraps a descriptor opened beneath the root",
    ),
    (
        "checkpoint/src/beneath.rs",
        "-> io::Result<std::fs::File>",
        "a signature: the file was opened beneath the root",
    ),
    (
        "checkpoint/src/beneath.rs",
        "file: std::fs::File, name: &str",
        "a signature: reads an already opened file",
    ),
    (
        "checkpoint/src/beneath.rs",
        "file.metadata()",
        "fstat of a descriptor opened beneath the root",
    ),
    (
        "checkpoint/src/beneath.rs",
        "std::fs::DirBuilder::new()",
        "create_private_dir: a directory gpusnap names (restore.checkpoint_root, a checkpoint \
         it writes), not one from an image",
    ),
    (
        "checkpoint/src/beneath.rs",
        "std::fs::symlink_metadata(dir)",
        "create_private_dir: refuses that gpusnap's own directory is a symlink",
    ),
    (
        "checkpoint/src/beneath.rs",
        "std::fs::set_permissions(dir",
        "create_private_dir: the directory just checked not to be a symlink",
    ),
    (
        "checkpoint/src/validate.rs",
        ".metadata()",
        "fstat of a file opened beneath the checkpoint directory",
    ),
    (
        "checkpoint/src/beneath.rs",
        "if !meta.is_dir()",
        "create_private_dir: metadata from symlink_metadata of gpusnap's own directory",
    ),
    (
        "oci-image/src/extract.rs",
        "kind.is_dir()",
        "a tar entry type, not a path",
    ),
    (
        "oci-image/src/extract.rs",
        "kind.is_file()",
        "a tar entry type, not a path",
    ),
    (
        "oci-image/src/extract.rs",
        "fs::create_dir_all(&parent)",
        "the destination's parent: a path the operator named, outside the image",
    ),
    (
        "oci-image/src/extract.rs",
        "fs::symlink_metadata(&staging)",
        "the staging directory gpusnap names beside the destination",
    ),
    (
        "oci-image/src/extract.rs",
        "fs::remove_dir_all(&staging)",
        "a leftover staging directory of gpusnap's own naming (remove_dir_all does not follow \
         symlinks inside it)",
    ),
    (
        "oci-image/src/extract.rs",
        "fs::DirBuilder::new()",
        "creates the staging directory itself, beside the destination",
    ),
    (
        "oci-image/src/extract.rs",
        "fs::rename(&staging, &dest)",
        "moves gpusnap's staging directory (a name, not followed) to the operator's destination",
    ),
    (
        "oci-image/src/extract.rs",
        ".metadata()",
        "fstat of a file opened beneath the staging root",
    ),
    (
        "oci-image/src/source.rs",
        "fs::metadata(path)",
        "detect: the build source the operator named on the command line",
    ),
    (
        "oci-image/src/source.rs",
        "meta.is_file()",
        "detect: the build source the operator named",
    ),
    (
        "oci-image/src/source.rs",
        "layout.manifest_path().is_file()",
        "detect: only chooses how to read the source; the walk itself follows nothing",
    ),
    (
        "oci-image/src/source.rs",
        "path.join(CHECKPOINT_DIR).is_dir()",
        "detect: only chooses how to read the source; the walk itself follows nothing",
    ),
    (
        "oci-image/src/source.rs",
        "fs::symlink_metadata(p)",
        "the checkpoint directory the operator named, for its own mode and times",
    ),
    (
        "oci-image/src/source.rs",
        "use std::fs::{self, File}",
        "an import",
    ),
    (
        "oci-image/src/source.rs",
        "File::open(path)",
        "the archive file the operator named, read as one stream",
    ),
    (
        "oci-image/src/source.rs",
        ".metadata()",
        "fstat of a file opened beneath the source directory",
    ),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the checkpoint crate sits in the workspace")
        .to_path_buf()
}

/// A path call found in `module` at `line` (1-based).
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    module: String,
    line: usize,
    text: String,
    call: String,
}

/// The path calls in `source` (the text of `module`) that [`ALLOWED`] does not cover; code
/// from a top-level `#[cfg(test)] mod` on, and comments, are not scanned.
fn scan(module: &str, source: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    let lines: Vec<&str> = source.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        // The module's test module ends what is scanned.
        if line.starts_with("#[cfg(test)]")
            && lines
                .get(i + 1)
                .is_some_and(|next| next.starts_with("mod "))
        {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        let Some(call) = path_call(code) else {
            continue;
        };
        let allowed = ALLOWED
            .iter()
            .any(|(m, needle, _)| *m == module && code.contains(needle));
        if !allowed {
            out.push(Violation {
                module: module.to_owned(),
                line: i + 1,
                text: line.trim().to_owned(),
                call,
            });
        }
    }
    out
}

#[test]
fn untrusted_tree_code_makes_no_path_calls() {
    let root = workspace();
    let mut violations = Vec::new();
    for module in UNTRUSTED_MODULES {
        let text = std::fs::read_to_string(root.join(module))
            .unwrap_or_else(|e| panic!("{module}: {e} (a declared module was moved?)"));
        violations.extend(scan(module, &text));
    }
    let report: Vec<String> = violations
        .iter()
        .map(|v| {
            format!(
                "{}:{}: `{}` in `{}` — go through gpusnap_checkpoint::beneath (a directory \
                 descriptor), or add a reviewed entry to ALLOWED saying why the path is trusted",
                v.module, v.line, v.call, v.text
            )
        })
        .collect();
    assert!(report.is_empty(), "\n{}", report.join("\n"));
}

#[test]
fn every_allowance_still_matches_a_line() {
    // A stale allowance would let a later call through unreviewed.
    let root = workspace();
    for (module, needle, why) in ALLOWED {
        let text = std::fs::read_to_string(root.join(module)).unwrap();
        assert!(
            text.lines().any(|l| l.contains(needle)),
            "ALLOWED entry ({module}, {needle:?}: {why}) matches no line any more; remove it"
        );
        assert!(
            UNTRUSTED_MODULES.contains(module),
            "{module} is not declared"
        );
    }
}

#[test]
fn a_planted_violation_fails_the_check() {
    let root = workspace();
    let module = "oci-image/src/extract.rs";
    let mut text = std::fs::read_to_string(root.join(module)).unwrap();
    assert!(scan(module, &text).is_empty(), "the module itself is clean");
    // Planted before the test module, where production code is.
    let at = text.find("#[cfg(test)]").unwrap_or(text.len());
    let planted = "fn planted(p: &Path) -> Vec<u8> { std::fs::read(p.join(\"x\")).unwrap() }\n";
    text.insert_str(at, planted);
    let line = text[..at].lines().count() + 1;
    let found = scan(module, &text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].line, line);
    assert_eq!(found[0].call, "fs::read");
    // Each kind of call is caught, and a comment or test code is not scanned.
    for call in [
        "File::open(p)",
        "fs::rename(a, b)",
        "std::fs::remove_dir_all(p)",
        "x.exists()",
        "OpenOptions::new()",
    ] {
        assert_eq!(
            scan(module, &format!("let _ = {call};\n")).len(),
            1,
            "{call}"
        );
    }
    // Descriptor calls are not path calls.
    for call in [
        "rfs::renameat(d, a, d, b)",
        "rustix::fs::readlinkat(d, n, v)",
    ] {
        assert!(
            scan(module, &format!("let _ = {call};\n")).is_empty(),
            "{call}"
        );
    }
    assert!(scan(module, "// std::fs::read(p)\n").is_empty());
    assert!(scan(module, "#[cfg(test)]\nmod tests { std::fs::read(p); }\n").is_empty());
}
