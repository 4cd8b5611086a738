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
    "checkpoint/src/follow.rs",
    "checkpoint/src/inventory.rs",
    "checkpoint/src/layout.rs",
    "checkpoint/src/manifest.rs",
    "checkpoint/src/chunks/mod.rs",
    "checkpoint/src/chunks/assemble.rs",
    "checkpoint/src/origin.rs",
    "checkpoint/src/scrub.rs",
    "checkpoint/src/signature.rs",
    "checkpoint/src/node_origin.rs",
    "checkpoint/src/validate.rs",
    "checkpoint/src/rootfs_diff.rs",
    "checkpoint/src/rootfs_diff/stream.rs",
    "checkpoint/src/rootfs_diff/tree.rs",
    "checkpoint/src/writable_layer.rs",
    "cli/src/checkpoint_cmd.rs",
    "cli/src/fsutil.rs",
    "cli/src/image_cmd.rs",
    "cli/src/inspect.rs",
    "oci-image/src/extract.rs",
    "oci-image/src/inspect.rs",
    "oci-image/src/oci_layout.rs",
    "oci-image/src/source.rs",
    "oci-image/src/staging.rs",
    "runc-wrapper/src/args.rs",
    "runc-wrapper/src/checkpoint.rs",
    "runc-wrapper/src/lib.rs",
    "runc-wrapper/src/locate.rs",
    "runc-wrapper/src/main.rs",
    "runc-wrapper/src/repair.rs",
    "runc-wrapper/src/restore.rs",
    "runc-wrapper/src/resume.rs",
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
        "std::fs::File::open(format!(\"/proc/self/fd/{}\", fd.as_raw_fd()))",
        "reopens, through the kernel's magic link of this process, an O_PATH descriptor opened \
         beneath the root and type-checked; the inode is compared after the open",
    ),
    (
        "checkpoint/src/writable_layer.rs",
        "std::fs::read_to_string(\"/proc/self/mountinfo\")",
        "the kernel's mount table of this process, not a path from a checkpoint",
    ),
    (
        "checkpoint/src/writable_layer.rs",
        "mut file: &std::fs::File",
        "a signature: hashes a file opened beneath the merged root or a lower layer",
    ),
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
    (
        "checkpoint/src/follow.rs",
        "file.metadata() else",
        "fstat of a page image opened beneath the checkpoint directory",
    ),
    (
        "checkpoint/src/follow.rs",
        "f.file.metadata()",
        "fstat of a page image opened beneath the checkpoint directory",
    ),
    (
        "checkpoint/src/inventory.rs",
        "let meta = file.metadata()",
        "fstat of a file opened beneath the checkpoint directory",
    ),
    (
        "checkpoint/src/scrub.rs",
        "std::fs::DirBuilder::new()",
        "begin_checkpoint: creates the checkpoint directory the caller named (containerd, CRI, --image-path) when it is missing; nothing inside it is touched by path",
    ),
    (
        "checkpoint/src/signature.rs",
        "let meta = file.metadata()",
        "load_key_pair: fstat of the key file opened O_NOFOLLOW",
    ),
    (
        "checkpoint/src/signature.rs",
        "if !meta.is_file()",
        "load_key_pair: the fstat of the opened key",
    ),
    (
        "checkpoint/src/signature.rs",
        "std::fs::File::open(path)",
        "TrustedKey::load: a public key the node's config names (restore.signature_keys), not a file of a checkpoint",
    ),
    (
        "cli/src/checkpoint_cmd.rs",
        "std::fs::symlink_metadata(path)",
        "the directory or archive the operator named, not followed if a symlink",
    ),
    (
        "cli/src/checkpoint_cmd.rs",
        "if meta.is_file()",
        "the lstat of the operator's path",
    ),
    (
        "cli/src/checkpoint_cmd.rs",
        "if !meta.is_dir()",
        "the lstat of the operator's path",
    ),
    (
        "cli/src/checkpoint_cmd.rs",
        "entry_type().is_file()",
        "a tar entry type, not a path",
    ),
    (
        "cli/src/checkpoint_cmd.rs",
        "file.metadata()?.permissions()",
        "fstat of the archive opened beneath its directory",
    ),
    (
        "cli/src/fsutil.rs",
        "match fs::read(path)",
        "install: the node's own config files (containerd, CRI-O, CRIU, gpusnap), which no image names",
    ),
    (
        "cli/src/fsutil.rs",
        "match fs::metadata(path)",
        "install: the mode of a node config file",
    ),
    (
        "cli/src/fsutil.rs",
        "d.exists()",
        "install: the config directories it creates on the node",
    ),
    (
        "cli/src/fsutil.rs",
        "fs::create_dir(d)",
        "install: the config directories it creates on the node",
    ),
    (
        "cli/src/fsutil.rs",
        "fs::metadata(path).is_ok_and",
        "which/is_executable: binaries on $PATH or named by the operator",
    ),
    (
        "cli/src/image_cmd.rs",
        "p.is_dir())",
        "pull: where to put scratch space, beside the output the operator named",
    ),
    (
        "cli/src/image_cmd.rs",
        "fs::remove_dir_all(&layout_dir)",
        "a failed pull removes the layout directory it made itself (remove_dir_all does not follow symlinks inside it)",
    ),
    (
        "cli/src/image_cmd.rs",
        "fs::remove_file(archive)",
        "a failed pull removes the oci-archive it wrote itself",
    ),
    (
        "cli/src/image_cmd.rs",
        "if path.is_dir() && !is_oci_layout(path)",
        "inspect: the path the operator named; only chooses how to read it",
    ),
    (
        "cli/src/image_cmd.rs",
        "if !path.is_dir() && !path.is_file()",
        "inspect: the path the operator named; only chooses how to read it",
    ),
    (
        "cli/src/inspect.rs",
        "File::open(path)?.read(&mut magic)",
        "the archive file the operator named, read as one stream",
    ),
    (
        "cli/src/inspect.rs",
        "io::BufReader::new(File::open(path)?)",
        "the archive file the operator named, read as one stream",
    ),
    (
        "cli/src/inspect.rs",
        "std::fs::metadata(path).map_err(io_err)",
        "the path the operator named: a directory (then read beneath it) or an archive",
    ),
    (
        "cli/src/inspect.rs",
        "if !meta.is_dir()",
        "the stat of the operator's path",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "match fs::read_dir(path)",
        "prepare_empty_dir: the output directory the operator named, which must be new or empty",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::create_dir_all(path).map_err",
        "prepare_empty_dir: creates the operator's output directory",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::remove_dir_all(&path)",
        "RemoveOnDrop: an output directory gpusnap created (remove_dir_all does not follow symlinks inside it)",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::create_dir_all(&blobs)",
        "LayoutWriter: inside a layout gpusnap writes, in a directory it created or found empty",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::create_dir_all(&tmp)",
        "LayoutWriter: its own scratch directory inside the layout it writes",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "File::create(&path).map_err",
        "LayoutWriter: a scratch file of gpusnap's naming inside the layout it writes",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "if dst.exists()",
        "LayoutWriter: a blob gpusnap wrote itself, named by the digest it computed",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::remove_file(tmp).map_err",
        "LayoutWriter: its own scratch file",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::rename(tmp, &dst)",
        "LayoutWriter: its scratch file to the digest it computed, inside the layout it writes",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "if !dst.exists()",
        "LayoutWriter: a blob gpusnap wrote itself, named by the digest it computed",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::write(&dst, bytes)",
        "LayoutWriter: a JSON blob gpusnap serialised, named by its digest",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::write(&path, bytes)",
        "LayoutWriter: oci-layout and index.json of the layout it writes",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::remove_dir_all(&tmp)",
        "LayoutWriter: its own scratch directory (remove_dir_all does not follow symlinks inside it)",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "File::create(&tmp).map_err",
        "write_oci_archive: a temporary file beside the archive the operator named",
    ),
    (
        "oci-image/src/oci_layout.rs",
        ".metadata()",
        "fstat of a file opened beneath the layout, or of the archive being written",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::rename(&tmp, out)",
        "write_oci_archive: its temporary file onto the archive the operator named",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::remove_file(&tmp)",
        "write_oci_archive: its own temporary file",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "fs::metadata(path).map_err",
        "ImageSource::open: the image the operator named; a layout is then read beneath it",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "if meta.is_dir()",
        "ImageSource::open: the stat of the operator's path",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "File::open(path).map_err",
        "index_tar: the oci-archive the operator named, opened once and read at member offsets",
    ),
    (
        "oci-image/src/oci_layout.rs",
        "kind.is_file()",
        "a tar entry type, not a path",
    ),
    (
        "oci-image/src/staging.rs",
        "std::fs::read(format!(\"/proc/{pid}/stat\"))",
        "the kernel's record of a process (its start time), not a tree from elsewhere",
    ),
    (
        "runc-wrapper/src/lib.rs",
        "if let Ok(mut f) = std::fs::OpenOptions::new()",
        "the caller's --log file (CRI-O's, Podman's, containerd's), appended to as runc does",
    ),
    (
        "runc-wrapper/src/lib.rs",
        "std::fs::OpenOptions::new()",
        "the caller's --log file (CRI-O's, Podman's, containerd's), appended to as runc does",
    ),
    (
        "runc-wrapper/src/locate.rs",
        "path.metadata()",
        "the runc binary the node's config or $PATH names",
    ),
    (
        "runc-wrapper/src/locate.rs",
        "m.is_file() &&",
        "the runc binary the node's config or $PATH names",
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
