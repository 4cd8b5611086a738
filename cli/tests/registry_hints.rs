//! A registry spoken to in the wrong scheme: `gpusnap image pull` says which flag to change
//! instead of only the TLS library's words ("received corrupt message of type
//! InvalidContentType") or the registry's.

mod common;

use common::{gpusnap, s};
use gpusnap_testkit::registry::{Registry, RegistrySetup};
use gpusnap_testkit::{describe, text};

#[test]
fn https_to_a_plain_http_registry_says_plain_http() {
    let reg = common::registry();
    let dest = tempfile::tempdir().unwrap();
    let reference = format!("127.0.0.1:{}/ckpt/none:v1", reg.port());
    let out = gpusnap(
        None,
        &[
            "image",
            "pull",
            &reference,
            "--extract",
            s(&dest.path().join("x")),
        ],
    );
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        err.contains("hint:") && err.contains("--plain-http"),
        "{}",
        describe(&out)
    );
}

#[test]
fn plain_http_to_an_https_registry_says_drop_plain_http() {
    let reg = Registry::start_with(RegistrySetup {
        tls: true,
        htpasswd: None,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let dest = tempfile::tempdir().unwrap();
    let reference = format!("127.0.0.1:{}/ckpt/none:v1", reg.port());
    let out = gpusnap(
        None,
        &[
            "image",
            "pull",
            &reference,
            "--plain-http",
            "--extract",
            s(&dest.path().join("x")),
        ],
    );
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        err.contains("hint:") && err.contains("HTTPS") && err.contains("--ca-file"),
        "{}",
        describe(&out)
    );
}
