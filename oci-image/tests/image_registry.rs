//! Push / pull round trips against a real OCI distribution registry (Debian's
//! `docker-registry`, i.e. distribution 2.8) on loopback, plain HTTP.

use std::fs;
use std::path::Path;
use std::process::Command;

use gpusnap_oci_image::{self as image, ImageError, LayerRole, RegistryOptions};
use gpusnap_testkit::cmd::run_ok;
use gpusnap_testkit::fixtures::*;
use gpusnap_testkit::paths::find_tool;
use gpusnap_testkit::registry::{free_tcp_port, Registry};
use gpusnap_testkit::signing::{keypair, KeyPair};
use serde_json::Value;

fn opts() -> RegistryOptions {
    RegistryOptions::default()
}

/// Checks every blob file of a layout against its name, independently of the crate.
fn assert_layout_blobs_verified(layout: &Path) -> usize {
    let mut n = 0;
    for e in fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert_eq!(sha256_file(&e.path()), format!("sha256:{name}"));
        n += 1;
    }
    n
}

#[test]
fn push_then_pull_round_trips_and_skips_blobs_the_registry_has() {
    let reg = registry();
    let fx = fixture();
    let archive = fx.work.path().join("image.oci.tar");
    let built = build_unchunked(&fx.archive, None, Some(&archive));
    let reference = reg.url("gpusnap/trainer:v1");

    let first = image::push(&archive, &reference, &opts()).unwrap();
    assert_eq!(first.digest, built.index_digest);
    // config + 6 layers, all new.
    assert_eq!(first.uploaded.len(), 7, "{first:?}");
    assert!(first.skipped.is_empty());
    assert!(first.uploaded.contains(&built.config_digest));
    for l in &built.layers {
        assert!(first.uploaded.contains(&l.descriptor.digest));
    }
    // Layers plus the (small) config.
    assert!(
        first.bytes_uploaded > built.total_layer_bytes
            && first.bytes_uploaded < built.total_layer_bytes + 64 * 1024,
        "{first:?}"
    );
    // Again: every blob answered by HEAD, nothing uploaded.
    let again = image::push(&archive, &reference, &opts()).unwrap();
    assert!(again.uploaded.is_empty(), "{again:?}");
    assert_eq!(again.skipped.len(), 7);

    // Pull into a fresh layout: every blob verified, same target digest, same annotations.
    let pulled = fx.work.path().join("pulled");
    let report = image::pull(&reference, &pulled, &opts()).unwrap();
    assert_eq!(report.digest, built.index_digest);
    assert_eq!(report.media_type, "application/vnd.oci.image.index.v1+json");
    // index + manifest + config + 6 layers.
    assert_eq!(report.blobs, 9);
    assert_eq!(assert_layout_blobs_verified(&pulled), 9);
    let index_json = read_json(&pulled.join("index.json"));
    assert_eq!(
        index_json["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("127.0.0.1:{}/gpusnap/trainer:v1", reg.port())
    );
    let info = image::inspect(&pulled).unwrap();
    assert_eq!(info.manifest_digest, built.manifest_digest);
    assert_eq!(info.manifest_annotations, built.annotations);
    assert_eq!(info.layers, built.layers);
    assert_eq!(info.gpusnap_manifest.as_ref(), Some(&fx.manifest));

    // Extract equals the original archive tree, byte for byte.
    let dest = fx.work.path().join("restored");
    let out = image::extract(&pulled, &dest).unwrap();
    // The origin record extract adds names the image manifest every layer was checked against.
    let origin = read_json(&dest.join("gpusnap-origin.json"));
    assert_eq!(origin["manifest_digest"], built.manifest_digest.as_str());
    assert_eq!(origin["signature"]["status"], "not-checked");
    fs::remove_file(dest.join("gpusnap-origin.json")).unwrap();
    assert_same_tree(&dest, &fx.archive_root);
    gpusnap_checkpoint::validate_for_restore(&out.checkpoint_dir).unwrap();

    // A second image of the same checkpoint (built from the bare directory) shares its GPU
    // extent layers with the first: the registry already has them, so they are not re-sent.
    let cp_image = fx.work.path().join("cp.oci.tar");
    build_unchunked(&fx.checkpoint_dir, None, Some(&cp_image));
    let second = image::push(&cp_image, &reg.url("gpusnap/trainer:cp-only"), &opts()).unwrap();
    for l in built
        .layers
        .iter()
        .filter(|l| l.role == LayerRole::GpuExtent)
    {
        assert!(
            second.skipped.contains(&l.descriptor.digest),
            "GPU extent {} re-uploaded: {second:?}",
            l.descriptor.digest
        );
    }

    // skopeo, an independent client, reads what we pushed.
    if let Some(skopeo) = find_tool("skopeo") {
        let out = run_ok(Command::new(skopeo).args([
            "inspect",
            "--tls-verify=false",
            &format!("docker://127.0.0.1:{}/gpusnap/trainer:v1", reg.port()),
        ]));
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["Digest"], built.index_digest.as_str());
        assert_eq!(v["Layers"].as_array().unwrap().len(), 6);
    } else {
        panic!("skopeo not found: run scripts/setup-env.sh (needs skopeo)");
    }
}

#[test]
fn pulling_a_tampered_blob_fails_with_a_digest_mismatch() {
    let reg = registry();
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    let built = build_layout(&fx.archive, &layout);
    let reference = reg.url("gpusnap/trainer:tampered");
    image::push(&layout, &reference, &opts()).unwrap();

    // Corrupt the second GPU extent in the registry's own storage (same size).
    let extent = gpu_extent(&built, 1);
    let data = reg.blob_data(extent.as_str());
    assert!(
        data.is_file(),
        "registry layout changed? {}",
        data.display()
    );
    flip_byte(&data);

    let dest = fx.work.path().join("pulled");
    let err = image::pull(&reference, &dest, &opts()).unwrap_err();
    match &err {
        ImageError::DigestMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &extent);
            assert_ne!(actual, &extent);
        }
        other => panic!("expected a digest mismatch, got: {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(extent.as_str()), "{msg}");
    assert!(msg.contains("corrupt") && msg.contains("tampered"), "{msg}");
    assert!(!dest.exists(), "a failed pull leaves no layout behind");

    // A truncated blob in the registry is refused too.
    let config = reg.blob_data(built.config_digest.as_str());
    let bytes = fs::read(&config).unwrap();
    fs::write(&config, &bytes[..bytes.len() / 2]).unwrap();
    let err = image::pull(&reference, &dest, &opts()).unwrap_err();
    assert_size_mismatch(&err, &built.config_digest);
    assert!(!dest.exists());
}

#[test]
fn plain_http_is_explicit_and_registry_errors_are_reported() {
    let reg = registry();
    let fx = fixture();
    let layout = fx.work.path().join("layout");
    build_layout(&fx.checkpoint_dir, &layout);
    // Without http:// (and without plain_http) the client speaks TLS, which a plain-HTTP
    // registry does not: the handshake fails, nothing falls back to plain HTTP.
    let bare = format!("127.0.0.1:{}/gpusnap/x:y", reg.port());
    let err = image::push(&layout, &bare, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::Transport { .. }), "{err}");
    // ...and allowed when asked for.
    image::push(
        &layout,
        &bare,
        &RegistryOptions {
            plain_http: true,
            ..opts()
        },
    )
    .unwrap();
    // A missing tag: the registry's own error code comes through.
    let err = image::pull(
        &reg.url("gpusnap/x:missing"),
        &fx.work.path().join("p"),
        &opts(),
    )
    .unwrap_err();
    match &err {
        ImageError::Registry { status, code, .. } => {
            assert_eq!(*status, 404);
            assert_eq!(code.as_deref(), Some("MANIFEST_UNKNOWN"), "{err}");
        }
        other => panic!("{other}"),
    }
    // Nothing listening.
    let dead = format!("http://127.0.0.1:{}/gpusnap/x:y", free_tcp_port().unwrap());
    let err = image::pull(&dead, &fx.work.path().join("q"), &opts()).unwrap_err();
    assert!(matches!(err, ImageError::Transport { .. }), "{err}");
    assert!(!fx.work.path().join("q").exists());
}

// ---- TLS + htpasswd registry, credentials from a docker config, signatures ------------------

use gpusnap_checkpoint::origin::SignatureCheck;
use gpusnap_config::SignaturePolicy;
use gpusnap_oci_image::{Credentials, Digest, SignatureOptions};
use gpusnap_testkit::registry::RegistrySetup;
use std::path::PathBuf;

mod common;
use common::{
    assert_digest_mismatch, assert_size_mismatch, build_layout, build_unchunked, entries,
    gpu_extent, registry,
};

fn secure_registry() -> Registry {
    Registry::start_with(RegistrySetup::secure()).unwrap_or_else(|e| panic!("{e:#}"))
}

/// CA file and docker config of a secure registry.
fn secure_opts(reg: &Registry, dir: &Path) -> RegistryOptions {
    RegistryOptions {
        ca_files: vec![reg.ca_file().unwrap()],
        credentials: Credentials::DockerConfig(
            reg.write_docker_config(&dir.join("docker")).unwrap(),
        ),
        ..opts()
    }
}

#[test]
fn tls_and_htpasswd_registry_push_pull_by_tag_and_digest_extract() {
    let reg = secure_registry();
    let fx = fixture();
    let w = fx.work.path();
    let layout = w.join("layout");
    let built = build_layout(&fx.archive, &layout);
    let o = secure_opts(&reg, w);
    let tag = reg.image("gpusnap/secure:v1");

    // No CA: the registry's certificate is not trusted; nothing falls back to plain HTTP.
    let err = image::push(
        &layout,
        &tag,
        &RegistryOptions {
            ca_files: vec![],
            ..o.clone()
        },
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ImageError::Transport { .. }), "{msg}");
    assert!(
        msg.to_lowercase().contains("certificate") || msg.contains("UnknownIssuer"),
        "{msg}"
    );
    // No credentials: 401, and the message says where credentials were looked for.
    let err = image::push(
        &layout,
        &tag,
        &RegistryOptions {
            credentials: Credentials::Anonymous,
            ..o.clone()
        },
    )
    .unwrap_err();
    assert_auth_refused(&err);
    // Wrong password.
    let err = image::push(
        &layout,
        &tag,
        &RegistryOptions {
            credentials: Credentials::Basic {
                username: "gpusnap".into(),
                password: "wrong".into(),
            },
            ..o.clone()
        },
    )
    .unwrap_err();
    assert_auth_refused(&err);

    // With the CA (a bundle: an unrelated certificate first) and the docker config.
    let bundle = w.join("bundle.pem");
    let other = tempfile::tempdir().unwrap();
    gpusnap_testkit::registry::make_test_ca(other.path()).unwrap();
    let mut pem = fs::read(other.path().join("ca.crt")).unwrap();
    pem.extend(fs::read(reg.ca_file().unwrap()).unwrap());
    fs::write(&bundle, pem).unwrap();
    let o = RegistryOptions {
        ca_files: vec![bundle],
        ..o
    };
    let pushed = image::push(&layout, &tag, &o).unwrap();
    assert_eq!(pushed.digest, built.index_digest);
    assert_eq!(pushed.uploaded.len(), 7);

    // Pull by tag: says the tag was resolved, not pinned.
    let by_tag = w.join("by-tag");
    let report = image::pull(&tag, &by_tag, &o).unwrap();
    assert_eq!(report.digest, built.index_digest);
    assert!(!report.pinned);
    assert_eq!(report.manifests, vec![built.manifest_digest.clone()]);
    assert_eq!(report.signature, SignatureCheck::NotChecked);
    assert!(
        report.verification().contains("not pinned"),
        "{}",
        report.verification()
    );
    assert_eq!(assert_layout_blobs_verified(&by_tag), 9);

    // Pull by digest: pinned.
    let by_digest = w.join("by-digest");
    let pinned = reg.image(&format!("gpusnap/secure@{}", built.index_digest));
    let report = image::pull(&pinned, &by_digest, &o).unwrap();
    assert!(report.pinned);
    assert!(report.verification().contains("named by the reference"));

    // Extract: equals the archive, and the origin record says what was checked.
    let dest = w.join("restored");
    let seed = image::OriginSeed {
        source: pinned.clone(),
        pinned: true,
        signature: report.signature.clone(),
    };
    let ex = image::extract_as(&by_digest, None, &dest, &seed).unwrap();
    let origin = read_json(&dest.join("gpusnap-origin.json"));
    assert_eq!(origin["manifest_digest"], built.manifest_digest.as_str());
    assert_eq!(origin["pinned"], true);
    assert_eq!(origin["source"], pinned.as_str());
    assert_eq!(
        origin["rootfs_diff"]["sha256"],
        sha256_file(&fx.archive_root.join("rootfs-diff.tar"))
            .strip_prefix("sha256:")
            .unwrap()
    );
    fs::remove_file(dest.join("gpusnap-origin.json")).unwrap();
    assert_same_tree(&dest, &fx.archive_root);
    gpusnap_checkpoint::validate_for_restore(&ex.checkpoint_dir).unwrap();

    // skopeo reads what we pushed, with the same CA and credentials.
    let skopeo = find_tool("skopeo").expect("skopeo (scripts/setup-env.sh)");
    let (certs, creds) = skopeo_auth(&reg, w);
    let out = run_ok(Command::new(skopeo).args([
        "inspect",
        "--cert-dir",
        certs.to_str().unwrap(),
        "--creds",
        &creds,
        &format!("docker://{tag}"),
    ]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["Digest"], built.index_digest.as_str());
}

#[test]
fn failed_pulls_fail_cleanly_and_leave_nothing() {
    let reg = secure_registry();
    let fx = fixture();
    let w = fx.work.path();
    let layout = w.join("layout");
    let built = build_layout(&fx.archive, &layout);
    let o = secure_opts(&reg, w);
    let tag = reg.image("gpusnap/bad:v1");
    image::push(&layout, &tag, &o).unwrap();
    let out = w.join("out");
    fs::create_dir_all(&out).unwrap();
    let dest = out.join("pulled");
    let check_nothing_left = |what: &str| {
        assert!(!dest.exists(), "{what}: {} exists", dest.display());
        assert!(entries(&out).is_empty(), "{what}: left {:?}", entries(&out));
    };

    // A digest the registry does not have.
    let wrong = reg.image(&format!("gpusnap/bad@{}", Digest::of(b"not this image")));
    let err = image::pull(&wrong, &dest, &o).unwrap_err();
    assert!(
        matches!(&err, ImageError::Registry { status: 404, .. }),
        "{err}"
    );
    check_nothing_left("wrong digest");

    // A manifest over the cap (the index is about 2 KiB).
    let err = image::pull(
        &tag,
        &dest,
        &RegistryOptions {
            max_manifest_bytes: 256,
            ..o.clone()
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, ImageError::TooLarge { limit: 256, .. }),
        "{err}"
    );
    check_nothing_left("manifest over the cap");

    // A blob over the global cap: refused from its descriptor, before a byte is read.
    let err = image::pull(
        &tag,
        &dest,
        &RegistryOptions {
            max_blob_bytes: 1 << 20,
            ..o.clone()
        },
    )
    .unwrap_err();
    assert!(matches!(&err, ImageError::TooLarge { .. }), "{err}");
    check_nothing_left("blob over the cap");

    // The registry serves a layer longer than its descriptor (bytes appended in storage).
    let extent = gpu_extent(&built, 0);
    let data = reg.blob_data(extent.as_str());
    let original = fs::read(&data).unwrap();
    let mut longer = original.clone();
    longer.extend_from_slice(&[0u8; 4096]);
    fs::write(&data, &longer).unwrap();
    let err = image::pull(&tag, &dest, &o).unwrap_err();
    assert_size_mismatch(&err, &extent);
    check_nothing_left("oversized blob");

    // Same size, different bytes: the digest check while streaming refuses it.
    let mut flipped = original.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0xff;
    fs::write(&data, &flipped).unwrap();
    let err = image::pull(&tag, &dest, &o).unwrap_err();
    assert_digest_mismatch(&err, &extent);
    check_nothing_left("tampered blob");
    fs::write(&data, &original).unwrap();

    // The index itself altered in storage: a pull by digest refuses the bytes it gets.
    let index_data = reg.blob_data(built.index_digest.as_str());
    let index_bytes = fs::read(&index_data).unwrap();
    // Same length, still valid JSON (the registry parses what it serves): one annotation
    // value changed.
    let text = String::from_utf8(index_bytes.clone()).unwrap();
    assert!(text.contains("trainer"), "{text}");
    let altered = text.replacen("trainer", "trainex", 1).into_bytes();
    fs::write(&index_data, &altered).unwrap();
    let pinned = reg.image(&format!("gpusnap/bad@{}", built.index_digest));
    let err = image::pull(&pinned, &dest, &o).unwrap_err();
    assert_digest_mismatch(&err, &built.index_digest);
    check_nothing_left("tampered index");
    fs::write(&index_data, &index_bytes).unwrap();

    // And after all that, the same pull works.
    let report = image::pull(&tag, &dest, &o).unwrap();
    assert_eq!(report.digest, built.index_digest);
    assert_eq!(entries(&out), vec!["pulled".to_owned()]);
}

/// `err` is the registry refusing the client's credentials (none, or wrong ones).
fn assert_auth_refused(err: &ImageError) {
    assert!(
        matches!(
            err,
            ImageError::AuthRequired { .. } | ImageError::AuthFailed { .. }
        ),
        "{err}"
    );
}

/// skopeo's cert directory (the registry's CA) under `dir` and its `USER:PASSWORD`.
fn skopeo_auth(reg: &Registry, dir: &Path) -> (PathBuf, String) {
    let certs = dir.join("skopeo-certs");
    fs::create_dir_all(&certs).unwrap();
    fs::copy(reg.ca_file().unwrap(), certs.join("ca.crt")).unwrap();
    let (user, password) = reg.credentials().unwrap();
    (certs, format!("{user}:{password}"))
}

/// `err` refuses an image for want of a trusted signature, saying `says`.
fn assert_signature_required(err: &ImageError, says: &str) {
    assert!(matches!(err, ImageError::SignatureRequired { .. }), "{err}");
    assert!(err.to_string().contains(says), "{err}");
}

#[test]
fn signatures_require_warn_off() {
    let reg = secure_registry();
    let fx = fixture();
    let w = fx.work.path();
    let layout = w.join("layout");
    let built = build_layout(&fx.checkpoint_dir, &layout);
    let KeyPair {
        private: key,
        public,
    } = keypair(w, "signer").unwrap();
    let other_public = keypair(w, "other").unwrap().public;
    let o = secure_opts(&reg, w);
    let signed = reg.image("gpusnap/signed:v1");
    let unsigned = reg.image("gpusnap/unsigned:v1");

    // Push with --sign-key: the cosign tag appears beside the image.
    let pushed = image::push(
        &layout,
        &signed,
        &RegistryOptions {
            sign_key: Some(key.clone()),
            ..o.clone()
        },
    )
    .unwrap();
    let sig = pushed.signature.as_ref().unwrap();
    assert_eq!(sig.digest, built.index_digest);
    assert!(sig.signature_reference.ends_with(&format!(
        "gpusnap/signed:sha256-{}.sig",
        built.index_digest.hex()
    )));
    image::push(&layout, &unsigned, &o).unwrap();

    let with = |policy, keys: Vec<PathBuf>| RegistryOptions {
        signatures: SignatureOptions {
            policy,
            keys,
            ..Default::default()
        },
        ..o.clone()
    };
    let out = w.join("out");
    fs::create_dir_all(&out).unwrap();

    // require + the right key: verified, recorded.
    let report = image::pull(
        &signed,
        &out.join("a"),
        &with(SignaturePolicy::Require, vec![public.clone()]),
    )
    .unwrap();
    assert_eq!(
        report.signature,
        SignatureCheck::Verified {
            key: public.display().to_string()
        }
    );
    assert!(
        report.verification().contains("signed"),
        "{}",
        report.verification()
    );
    let dest = w.join("extracted");
    let seed = image::OriginSeed {
        source: signed.clone(),
        pinned: report.pinned,
        signature: report.signature.clone(),
    };
    image::extract_as(&out.join("a"), None, &dest, &seed).unwrap();
    let origin = read_json(&dest.join("gpusnap-origin.json"));
    assert_eq!(origin["signature"]["status"], "verified");
    assert_eq!(origin["signature"]["key"], public.to_str().unwrap());

    // require + unsigned: refused, nothing on disk.
    let err = image::pull(
        &unsigned,
        &out.join("b"),
        &with(SignaturePolicy::Require, vec![public.clone()]),
    )
    .unwrap_err();
    assert_signature_required(&err, "no signature");
    // require + a key that did not sign it: refused.
    let err = image::pull(
        &signed,
        &out.join("b"),
        &with(SignaturePolicy::Require, vec![other_public.clone()]),
    )
    .unwrap_err();
    assert_signature_required(&err, "none by a trusted key");
    assert_eq!(entries(&out), vec!["a".to_owned()]);

    // warn: proceeds, records why.
    let report = image::pull(
        &unsigned,
        &out.join("c"),
        &with(SignaturePolicy::Warn, vec![public.clone()]),
    )
    .unwrap();
    assert!(
        matches!(&report.signature, SignatureCheck::Missing { reason } if reason.contains("no signature")),
        "{:?}",
        report.signature
    );
    // off: not checked.
    let report = image::pull(
        &unsigned,
        &out.join("d"),
        &with(SignaturePolicy::Off, vec![]),
    )
    .unwrap();
    assert_eq!(report.signature, SignatureCheck::NotChecked);

    // A second key signs the same image: both signatures are kept, either key verifies.
    let KeyPair {
        private: key2,
        public: public2,
    } = keypair(w, "second").unwrap();
    let second = image::sign(&signed, &key2, &o).unwrap();
    assert_eq!(second.signatures, 2);
    assert!(!second.pinned);
    for k in [&public, &public2] {
        let dir = out.join(format!("k-{}", k.file_name().unwrap().to_string_lossy()));
        let r = image::pull(
            &signed,
            &dir,
            &with(
                SignaturePolicy::Require,
                vec![other_public.clone(), k.clone()],
            ),
        )
        .unwrap();
        assert_eq!(
            r.signature,
            SignatureCheck::Verified {
                key: k.display().to_string()
            }
        );
    }

    // A valid signature of another image, replayed under this image's .sig tag, is refused:
    // the payload names the digest it was made for.
    let cri = w.join("cri-layout");
    let cri_built = build_layout(&fx.archive, &cri);
    let replay = reg.image("gpusnap/replay:v1");
    image::push(&cri, &replay, &o).unwrap();
    let signed_other = reg.image("gpusnap/replay:signed");
    image::push(
        &layout,
        &signed_other,
        &RegistryOptions {
            sign_key: Some(key.clone()),
            ..o.clone()
        },
    )
    .unwrap();
    let skopeo = find_tool("skopeo").expect("skopeo (scripts/setup-env.sh)");
    let (certs, creds) = skopeo_auth(&reg, w);
    run_ok(Command::new(skopeo).args([
        "copy",
        "--src-cert-dir",
        certs.to_str().unwrap(),
        "--dest-cert-dir",
        certs.to_str().unwrap(),
        "--src-creds",
        &creds,
        "--dest-creds",
        &creds,
        &format!(
            "docker://{}",
            reg.image(&format!(
                "gpusnap/replay:sha256-{}.sig",
                built.index_digest.hex()
            ))
        ),
        &format!(
            "docker://{}",
            reg.image(&format!(
                "gpusnap/replay:sha256-{}.sig",
                cri_built.index_digest.hex()
            ))
        ),
    ]));
    let err = image::pull(
        &replay,
        &out.join("f"),
        &with(SignaturePolicy::Require, vec![public.clone()]),
    )
    .unwrap_err();
    assert_signature_required(&err, &format!("for {}", built.index_digest));

    // An encrypted cosign.key (scrypt + secretbox, as `cosign generate-key-pair` writes it).
    let pair = sigstore::crypto::SigningScheme::ECDSA_P256_SHA256_ASN1
        .create_signer()
        .unwrap()
        .to_sigstore_keypair()
        .unwrap();
    let cosign_key = w.join("cosign.key");
    let cosign_pub = w.join("cosign.pub");
    fs::write(
        &cosign_key,
        pair.private_key_to_encrypted_pem(b"hunter2")
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    fs::write(&cosign_pub, pair.public_key_to_pem().unwrap()).unwrap();
    let err = image::sign(&unsigned, &cosign_key, &o).unwrap_err();
    assert!(err.to_string().contains("COSIGN_PASSWORD"), "{err}");
    std::env::set_var("COSIGN_PASSWORD", "hunter2");
    let unsigned_pinned = reg.image(&format!("gpusnap/unsigned@{}", built.index_digest));
    let s = image::sign(&unsigned_pinned, &cosign_key, &o).unwrap();
    assert!(s.pinned);
    std::env::remove_var("COSIGN_PASSWORD");
    let r = image::pull(
        &unsigned,
        &out.join("e"),
        &with(SignaturePolicy::Require, vec![cosign_pub.clone()]),
    )
    .unwrap();
    assert_eq!(
        r.signature,
        SignatureCheck::Verified {
            key: cosign_pub.display().to_string()
        }
    );
}

/// A minimal registry that answers every blob request with a redirect to `/storage/<hex>`,
/// where it serves `tamper(blob)`. Plain HTTP/1.1, one request per connection.
fn redirecting_registry(
    manifest: Vec<u8>,
    blobs: Vec<(Digest, Vec<u8>)>,
) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(64) {
            let Ok(mut conn) = conn else { break };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                    break;
                }
            }
            let path = line.split(' ').nth(1).unwrap_or("").to_owned();
            seen.lock().unwrap().push(path.clone());
            let respond =
                |conn: &mut std::net::TcpStream, status: &str, headers: &str, body: &[u8]| {
                    let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
                    body.len()
                );
                    let _ = conn.write_all(body);
                };
            if path == "/v2/" {
                respond(&mut conn, "200 OK", "", b"{}");
            } else if path.contains("/manifests/") {
                respond(
                    &mut conn,
                    "200 OK",
                    "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n",
                    &manifest,
                );
            } else if let Some(d) = path.split("/blobs/").nth(1) {
                respond(
                    &mut conn,
                    "307 Temporary Redirect",
                    &format!("Location: /storage/{}\r\n", d.trim_start_matches("sha256:")),
                    b"",
                );
            } else if let Some(hex) = path.strip_prefix("/storage/") {
                match blobs.iter().find(|(d, _)| d.hex() == hex) {
                    Some((_, bytes)) => respond(&mut conn, "200 OK", "", bytes),
                    None => respond(&mut conn, "404 Not Found", "", b""),
                }
            } else {
                respond(&mut conn, "404 Not Found", "", b"");
            }
        }
    });
    (port, log)
}

#[test]
fn redirected_blobs_are_held_to_their_digest() {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let layer = vec![7u8; 10_000];
    let (cd, ld) = (Digest::of(&config), Digest::of(&layer));
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd.to_string(), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld.to_string(), "size": layer.len(),
                    "urls": ["http://127.0.0.1:1/never-fetched"]}],
    }))
    .unwrap();
    let w = tempfile::tempdir().unwrap();

    // Honest storage behind the redirect: the pull works, through the redirect.
    let (port, log) = redirecting_registry(
        manifest.clone(),
        vec![(cd.clone(), config.clone()), (ld.clone(), layer.clone())],
    );
    let reference = format!("http://127.0.0.1:{port}/r/x:v1");
    let report = image::pull(&reference, &w.path().join("ok"), &opts()).unwrap();
    assert_eq!(report.blobs, 3);
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|p| p.starts_with("/storage/")));

    // Storage serving other bytes of the same length: refused by digest.
    let mut bad = layer.clone();
    bad[5000] ^= 1;
    let (port, _) = redirecting_registry(
        manifest.clone(),
        vec![(cd.clone(), config.clone()), (ld.clone(), bad)],
    );
    let dest = w.path().join("bad");
    let err = image::pull(&format!("http://127.0.0.1:{port}/r/x:v1"), &dest, &opts()).unwrap_err();
    assert_digest_mismatch(&err, &ld);
    assert!(!dest.exists());

    // Storage serving more bytes: refused by size.
    let mut long = layer.clone();
    long.extend_from_slice(b"more");
    let (port, _) = redirecting_registry(manifest, vec![(cd, config), (ld.clone(), long)]);
    let err = image::pull(&format!("http://127.0.0.1:{port}/r/x:v1"), &dest, &opts()).unwrap_err();
    assert_size_mismatch(&err, &ld);
    assert!(!dest.exists());
    assert_eq!(entries(w.path()), vec!["ok".to_owned()]);
}
