//! docs/architecture.md's crate graph is the workspace's: every arrow it lists is a path
//! dependency of that crate's `Cargo.toml` (a normal one: not dev, not build), every such
//! dependency is listed, and every one is used by the crate's code. Reads `cargo metadata`
//! and the sources; needs no root and runs nothing else. Inside each crate, no two top-level
//! modules import each other, directly or round a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Crate directory (relative to the workspace root, as the doc names it: `shim/`,
/// `tests/kit/`) → the crate directories it depends on.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// One workspace crate as `cargo metadata` describes it.
struct Crate {
    dir: String,
    /// Its library's name in `use` paths (`gpusnap_checkpoint`), if it has a library.
    lib: Option<String>,
    /// The crate's directory on disk.
    path: PathBuf,
    /// Normal path dependencies: (package name, name the code uses it by).
    deps: Vec<(String, String)>,
}

fn crates() -> BTreeMap<String, Crate> {
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("package name"))
        .collect();
    let mut by_name = BTreeMap::new();
    for p in packages {
        let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest_path"));
        let path = manifest.parent().expect("crate directory").to_path_buf();
        let rel = path.strip_prefix(&root).expect("a member below the root");
        let lib = p["targets"].as_array().into_iter().flatten().find_map(|t| {
            let kinds = t["kind"].as_array()?;
            kinds
                .iter()
                .any(|k| matches!(k.as_str(), Some("lib" | "rlib" | "cdylib" | "dylib")))
                .then(|| t["name"].as_str().map(|n| n.replace('-', "_")))?
        });
        let deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            // `kind` is null for a normal dependency ("dev" and "build" otherwise).
            .filter(|d| d["kind"].is_null() && d["path"].is_string())
            .filter_map(|d| {
                let name = d["name"].as_str()?;
                members.contains(name).then(|| {
                    let used_as = d["rename"].as_str().unwrap_or(name).replace('-', "_");
                    (name.to_owned(), used_as)
                })
            })
            .collect();
        by_name.insert(
            p["name"].as_str().expect("package name").to_owned(),
            Crate {
                dir: format!("{}/", rel.display()),
                lib,
                path,
                deps,
            },
        );
    }
    by_name
}

fn graph_of_workspace(crates: &BTreeMap<String, Crate>) -> Graph {
    crates
        .values()
        .map(|c| {
            let deps = c.deps.iter().map(|(n, _)| crates[n].dir.clone()).collect();
            (c.dir.clone(), deps)
        })
        .collect()
}

/// The arrows listed in docs/architecture.md: the `text` block after the heading
/// "### Crate dependencies", one crate a line: `dir/  → a/, b/` or `dir/  (none)`.
fn graph_of_doc(doc: &str) -> Graph {
    let section = doc
        .split("\n### Crate dependencies\n")
        .nth(1)
        .expect("docs/architecture.md has a section \"### Crate dependencies\"");
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the section holds a ```text block of arrows");
    let mut graph = Graph::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (from, to) = match line.split_once('→') {
            Some((from, to)) => (from.trim(), to.trim()),
            None => {
                let (from, none) = line
                    .trim()
                    .split_once(char::is_whitespace)
                    .unwrap_or((line.trim(), ""));
                assert_eq!(none.trim(), "(none)", "unreadable line {line:?}");
                (from, "")
            }
        };
        let deps = to
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_owned)
            .collect();
        assert!(
            graph.insert(from.to_owned(), deps).is_none(),
            "{from} is listed twice"
        );
    }
    graph
}

/// What one graph has that the other lacks, one line each.
fn difference(doc: &Graph, code: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (from, deps) in code {
        match doc.get(from) {
            None => out.push(format!("{from} is a workspace crate the doc does not list")),
            Some(listed) => {
                for d in deps.difference(listed) {
                    out.push(format!("{from} → {d} is in Cargo.toml but not in the doc"));
                }
                for d in listed.difference(deps) {
                    out.push(format!("{from} → {d} is in the doc but not in Cargo.toml"));
                }
            }
        }
    }
    for from in doc.keys().filter(|f| !code.contains_key(*f)) {
        out.push(format!("{from} is in the doc but is no workspace crate"));
    }
    out
}

#[test]
fn the_documented_crate_graph_is_the_workspaces() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/architecture.md"))
        .expect("reading docs/architecture.md");
    let diff = difference(&graph_of_doc(&doc), &graph_of_workspace(&crates()));
    assert!(
        diff.is_empty(),
        "docs/architecture.md's crate dependencies differ from the workspace's \
         (cargo metadata):\n  {}",
        diff.join("\n  ")
    );
}

/// Every `.rs` file below `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_workspace_dependency_is_used() {
    let crates = crates();
    let mut unused = Vec::new();
    for c in crates.values() {
        // A crate's own code: src/ and its build script (a nested crate such as
        // cuda/fake-libcuda lies beside src/, not in it).
        let mut files = vec![c.path.join("build.rs")];
        sources(&c.path.join("src"), &mut files);
        let text: String = files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .collect();
        for (name, used_as) in &c.deps {
            // A dependency used only for its library (not, say, a binary built beside).
            if crates[name].lib.is_some() && !text.contains(used_as.as_str()) {
                unused.push(format!(
                    "{} depends on {name} but never names {used_as}",
                    c.dir
                ));
            }
        }
    }
    assert!(
        unused.is_empty(),
        "unused workspace dependencies (remove them from Cargo.toml):\n  {}",
        unused.join("\n  ")
    );
}

/// The top-level modules of `src/` a source names through `crate::` (`crate::a::b`,
/// `crate::{a, b::c}`), in its code before its first `#[cfg(test)]` (tests may reach anywhere).
fn crate_modules_named(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `gpusnap_crate::`, not this crate
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The names at depth 1 of the group: `{a, b::{c, d}, e}` names a, b and e.
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.insert(ident(&item));
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let mut circles = Vec::new();
    for c in crates().values() {
        let src = c.path.join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        // Top-level module → the top-level modules its files name.
        let mut graph: Graph = BTreeMap::new();
        for f in &files {
            let rel = f.strip_prefix(&src).expect("below src/");
            let first = rel.components().next().expect("a path");
            let module = first.as_os_str().to_string_lossy();
            let module = module.strip_suffix(".rs").unwrap_or(&module).to_owned();
            // The crate roots and the binaries are not modules of the library.
            if matches!(module.as_str(), "lib" | "main" | "bin") {
                continue;
            }
            let text = std::fs::read_to_string(f).expect("reading a source");
            let named = crate_modules_named(&text);
            let entry = graph.entry(module.clone()).or_default();
            entry.extend(named.into_iter().filter(|m| {
                *m != module && (src.join(format!("{m}.rs")).is_file() || src.join(m).is_dir())
            }));
        }
        let reaches = |from: &str, to: &str| -> bool {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from.to_owned()];
            while let Some(m) = todo.pop() {
                if m == to {
                    return true;
                }
                if seen.insert(m.clone()) {
                    todo.extend(graph.get(&m).into_iter().flatten().cloned());
                }
            }
            false
        };
        for (from, tos) in &graph {
            for to in tos {
                if reaches(to, from) {
                    circles.push(format!("{}src: {from} → {to} → … → {from}", c.dir));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles between a crate's top-level modules (move what both need into a \
         module below them):\n  {}",
        circles.join("\n  ")
    );
}

#[test]
fn the_circle_check_reads_crate_paths_and_groups() {
    let text = "use crate::{a, b::{c, d}, self};\nuse other_crate::x;\nfn f() { crate::e::g(); }\n\
                // crate::commented\n#[cfg(test)]\nmod tests { use crate::t; }\n";
    let named = crate_modules_named(text);
    assert_eq!(
        named,
        BTreeSet::from(["a", "b", "e"].map(String::from)),
        "{named:?}"
    );
}

#[test]
fn the_parser_reads_arrows_and_leaves() {
    let doc =
        "x\n### Crate dependencies\n\ntext\n```text\na/   → b/, c/\nb/   (none)\n\nc/ → b/\n```\n";
    let g = graph_of_doc(doc);
    assert_eq!(g["a/"], BTreeSet::from(["b/".to_owned(), "c/".to_owned()]));
    assert!(g["b/"].is_empty());
    assert_eq!(g["c/"], BTreeSet::from(["b/".to_owned()]));
    let code: Graph = [
        ("a/".to_owned(), BTreeSet::from(["b/".to_owned()])),
        ("b/".to_owned(), BTreeSet::new()),
        ("d/".to_owned(), BTreeSet::new()),
    ]
    .into();
    let diff = difference(&g, &code);
    assert_eq!(
        diff,
        [
            "a/ → c/ is in the doc but not in Cargo.toml",
            "d/ is a workspace crate the doc does not list",
            "c/ is in the doc but is no workspace crate",
        ]
    );
}
