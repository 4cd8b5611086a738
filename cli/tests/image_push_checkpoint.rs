//! `gpusnap image push CHECKPOINT REF`: a checkpoint pushed straight from its files, through a
//! real `docker-registry` on loopback. The image is the one `gpusnap image build` + `push`
//! would make (same digest), its packs are never written anywhere, a second push moves
//! nothing, nothing is left beside the checkpoint, the pull extracts the checkpoint byte for
//! byte, a checkpoint that no longer matches its sealed manifest is refused before anything
//! reaches the registry, and an encrypted push leaves only ocicrypt layers there, opened by the
//! key's holder alone.

use std::fs;
use std::path::Path;

use gpusnap_testkit::describe;
use gpusnap_testkit::fixtures::{fixture, tree, GPU_EXTENTS};
use serde_json::Value;

mod common;
use common::{gpusnap, json, ok, pull_extract, registry, s};

/// `image build --layout` of `source` under `tag`, then the index digest it built.
fn built_digest(source: &Path, layout: &Path, tag: &str) -> String {
    let out = ok(
        None,
        &[
            "image",
            "build",
            s(source),
            "--tag",
            tag,
            "--layout",
            s(layout),
            "--json",
        ],
    );
    json(&out)["index_digest"].as_str().unwrap().to_owned()
}

fn push(source: &Path, reference: &str) -> Value {
    json(&ok(
        None,
        &[
            "image",
            "push",
            s(source),
            reference,
            "--plain-http",
            "--json",
        ],
    ))
}

/// The chunked files extracted at `got` are `want`'s, and the tree is restorable.
fn assert_extracted(what: &str, got: &Path, want: &Path) {
    for name in ["pages-1.img", GPU_EXTENTS[0], GPU_EXTENTS[1]] {
        assert_eq!(
            fs::read(got.join(name)).unwrap(),
            fs::read(want.join(name)).unwrap(),
            "{what}: {name}"
        );
    }
    gpusnap_checkpoint::validate_for_restore(got).unwrap();
}

fn scratch_left(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".gpusnap-push-"))
        .collect()
}

#[test]
fn a_checkpoint_pushes_straight_from_its_files() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();

    for (what, source, repo) in [
        ("checkpoint directory", &fx.checkpoint_dir, "ckpt/direct:v1"),
        ("CRI checkpoint archive", &fx.archive, "ckpt/archive:v1"),
    ] {
        let reference = reg.image(repo);
        let want = built_digest(
            source,
            &w.join(format!("layout-{}", repo.replace(['/', ':'], "-"))),
            &reference,
        );
        let pushed = push(source, &reference);
        assert_eq!(
            pushed["digest"].as_str(),
            Some(want.as_str()),
            "{what}: {pushed}"
        );
        assert!(
            pushed["built"]["chunks"]["packs"].as_u64().unwrap() >= 1,
            "{what}: {pushed}"
        );
        assert!(
            pushed["bytes_uploaded"].as_u64().unwrap() > 0,
            "{what}: {pushed}"
        );
        assert_eq!(
            pushed["built"]["layout_dir"],
            Value::Null,
            "{what}: {pushed}"
        );
        assert!(
            scratch_left(source.parent().unwrap()).is_empty(),
            "{what}: scratch left"
        );

        // Everything is in the registry now: pushed again, nothing moves.
        let again = push(source, &reference);
        assert_eq!(again["digest"], pushed["digest"], "{what}");
        assert_eq!(again["bytes_uploaded"].as_u64(), Some(0), "{what}: {again}");

        let dest = w.join(format!("pulled-{}", repo.replace(['/', ':'], "-")));
        let out = pull_extract(None, &reference, &dest, &[]);
        assert!(out.status.success(), "{what}: pull: {}", describe(&out));
        // A CRI archive's image extracts to its tree: the checkpoint under checkpoint/.
        let dest = match dest.join("checkpoint") {
            cp if cp.is_dir() => cp,
            _ => dest,
        };
        assert_extracted(what, &dest, &fx.checkpoint_dir);
    }

    // The human summary names the build and the push.
    let out = ok(
        None,
        &[
            "image",
            "push",
            s(&fx.checkpoint_dir),
            &reg.image("ckpt/direct:v2"),
            "--plain-http",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Chunks") && text.contains("Pushed"), "{text}");
    assert!(!text.contains("Layout"), "{text}");
}

#[test]
fn a_checkpoint_that_no_longer_matches_its_manifest_is_not_pushed() {
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let cp = w.join("copy/checkpoint");
    fs::create_dir_all(&cp).unwrap();
    for (name, _) in tree(&fx.checkpoint_dir) {
        let to = cp.join(&name);
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(fx.checkpoint_dir.join(&name), &to).unwrap();
    }
    let page = cp.join("pages-1.img");
    let mut bytes = fs::read(&page).unwrap();
    bytes[100] ^= 0xff;
    fs::write(&page, bytes).unwrap();

    let reference = reg.image("ckpt/tampered:v1");
    let out = gpusnap(None, &["image", "push", s(&cp), &reference, "--plain-http"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "pushed: {}", describe(&out));
    assert!(err.contains("pages-1.img"), "{}", describe(&out));
    assert!(
        scratch_left(cp.parent().unwrap()).is_empty(),
        "scratch left"
    );
    // Nothing under that name reached the registry.
    let pulled = gpusnap(
        None,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--layout",
            s(&w.join("nothing")),
        ],
    );
    assert!(
        !pulled.status.success(),
        "the tag exists: {}",
        describe(&pulled)
    );

    // Build-only flags on an image are refused, naming the flag.
    let layout = w.join("layout");
    built_digest(&fx.checkpoint_dir, &layout, "localhost/ckpt/x:v1");
    let out = gpusnap(
        None,
        &[
            "image",
            "push",
            s(&layout),
            &reference,
            "--plain-http",
            "--classic",
        ],
    );
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--classic applies when IMAGE is a checkpoint"),
        "{}",
        describe(&out)
    );
}

/// Encrypted straight from the checkpoint: every layer in ocicrypt's format at the registry,
/// nothing readable without the key, and the key's holder extracts the checkpoint byte for byte.
#[test]
fn a_checkpoint_pushes_encrypted_straight_from_its_files() {
    use gpusnap_testkit::ocicrypt::{key_pair, KeyKind};
    let reg = registry();
    let fx = fixture();
    let w = fx.work.path();
    let (key, public) = key_pair(w, "node", KeyKind::EcP256).unwrap();
    let reference = reg.image("ckpt/sealed:v1");
    let recipient = format!("jwe:{}", s(&public));
    let pushed = json(&ok(
        None,
        &[
            "image",
            "push",
            s(&fx.checkpoint_dir),
            &reference,
            "--plain-http",
            "--encrypt-recipient",
            &recipient,
            "--json",
        ],
    ));
    assert!(
        scratch_left(fx.archive_root.as_path()).is_empty(),
        "scratch left"
    );
    let layers = pushed["built"]["layers"].as_array().unwrap();
    assert!(!layers.is_empty(), "{pushed}");
    for l in layers {
        let mt = l["descriptor"]["mediaType"].as_str().unwrap();
        assert!(mt.ends_with("+encrypted"), "a plain layer was pushed: {l}");
    }

    let without = w.join("without/dest");
    let out = pull_extract(None, &reference, &without, &[]);
    assert!(
        !out.status.success(),
        "extracted without the key: {}",
        describe(&out)
    );
    assert!(!without.exists(), "left {}", without.display());

    let dest = w.join("with/dest");
    let out = pull_extract(None, &reference, &dest, &["--decryption-key", s(&key)]);
    assert!(
        out.status.success(),
        "pull with the key: {}",
        describe(&out)
    );
    assert_extracted("encrypted", &dest, &fx.checkpoint_dir);
}
