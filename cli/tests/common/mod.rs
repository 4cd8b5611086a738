//! Helpers shared by this crate's integration tests (each test binary uses some of them).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use gpusnap_testkit::fixtures::tree;
use gpusnap_testkit::{describe, paths, Registry};
use serde_json::Value;

/// A private plain-HTTP registry on loopback.
pub fn registry() -> Registry {
    Registry::start().unwrap_or_else(|e| panic!("{e:#}"))
}

/// Runs `gpusnap [--config CONFIG] ARGS` 100 columns wide, without `GPUSNAP_LOG`.
pub fn gpusnap(config: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(paths::binary("gpusnap"));
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(args)
        .env("COLUMNS", "100")
        .env_remove("GPUSNAP_LOG")
        .output()
        .unwrap()
}

/// [`gpusnap`], which must succeed.
pub fn ok(config: Option<&Path>, args: &[&str]) -> Output {
    let out = gpusnap(config, args);
    assert!(out.status.success(), "gpusnap {args:?}: {}", describe(&out));
    out
}

/// The command's stdout, which must be JSON.
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", describe(out)))
}

/// `gpusnap [--config CONFIG] image pull REFERENCE --plain-http --extract DEST EXTRA...`.
pub fn pull_extract(config: Option<&Path>, reference: &str, dest: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "image",
        "pull",
        reference,
        "--plain-http",
        "--extract",
        s(dest),
    ];
    args.extend_from_slice(extra);
    gpusnap(config, &args)
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `got` holds what `want` holds, plus the origin record extract writes.
pub fn assert_same_tree_with_origin(got: &Path, want: &Path) {
    let mut g = tree(got);
    assert!(
        g.remove("gpusnap-origin.json").is_some(),
        "no origin record in {}",
        got.display()
    );
    assert_eq!(g, tree(want), "{} vs {}", got.display(), want.display());
}
