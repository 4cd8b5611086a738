//! Generates the CRIU image types from CRIU 4.2.1's own `images/*.proto` (pure Rust: `protox`
//! parses them, `prost-build` writes the code; no `protoc`), and embeds their
//! `FileDescriptorSet` for the allowlist's schema walk (`src/schema.rs`).
//!
//! The `.proto` files are CRIU's, not ours: they are not in this repository.
//! `scripts/setup-env.sh` installs them (from the CRIU source tarball it already fetches) in
//! [`DEFAULT_DIR`]; `GPUSNAP_CRIU_PROTO_DIR` points elsewhere. Every file is checked against
//! `proto/criu-4.2.1.sha256` (ours), so the model is built from exactly the format it was
//! written for: a newer CRIU's protos, with fields the model has no rule for, do not build.
//!
//! Every `string` field is generated as `bytes`: CRIU writes paths and labels from C, where
//! protobuf-c does not require UTF-8, and the reader must not fail (or differ from CRIU) on a
//! name that is not UTF-8. The wire format of the two is the same.

use std::path::{Path, PathBuf};

use prost::Message;
use prost_types::field_descriptor_proto::Type;
use prost_types::DescriptorProto;
use sha2::{Digest, Sha256};

const DEFAULT_DIR: &str = "/opt/gpusnap-rig/criu-proto/4.2.1";
const DIR_VAR: &str = "GPUSNAP_CRIU_PROTO_DIR";
const SUMS: &str = "proto/criu-4.2.1.sha256";
const NOT_IMAGES: [&str; 2] = ["rpc.proto", "img-streamer.proto"];

fn main() {
    println!("cargo:rerun-if-env-changed={DIR_VAR}");
    println!("cargo:rerun-if-changed={SUMS}");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = PathBuf::from(std::env::var_os(DIR_VAR).unwrap_or_else(|| DEFAULT_DIR.into()));
    println!("cargo:rerun-if-changed={}", dir.display());
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo"));
    let protos = verified(&dir, &manifest_dir.join(SUMS));

    let mut compiler = protox::Compiler::new([&dir]).unwrap_or_else(|e| fail(&dir, &e));
    compiler.include_imports(true).include_source_info(false);
    compiler
        .open_files(&protos)
        .unwrap_or_else(|e| fail(&dir, &e));
    let mut set = compiler.file_descriptor_set();
    for file in &mut set.file {
        file.message_type.iter_mut().for_each(strings_as_bytes);
    }

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo"));
    std::fs::write(out.join("criu-4.2.1.fds"), set.encode_to_vec()).expect("write the descriptors");
    prost_build::Config::new()
        .out_dir(&out)
        .compile_fds(set)
        .expect("generate the CRIU image types");
}

/// The `.proto` files the sums list, each checked; panics with what to do when one is missing
/// or differs.
fn verified(dir: &Path, sums: &Path) -> Vec<String> {
    let list = std::fs::read_to_string(sums).expect("read the committed proto sums");
    let mut protos = Vec::new();
    for line in list.lines().filter(|l| !l.trim().is_empty()) {
        let (want, name) = line.split_once("  ").expect("sha256sum format");
        let path = dir.join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            fail(dir, &format!("cannot read {}: {e}", path.display()));
        });
        let found = format!("{:x}", Sha256::digest(&bytes));
        if found != want {
            fail(
                dir,
                &format!(
                    "{} is not CRIU 4.2.1's (sha256 {found}, expected {want}); the allowlist \
                     models 4.2.1's image format exactly",
                    path.display()
                ),
            );
        }
        // Not image formats: CRIU's RPC protocol and its image streamer's.
        if name.ends_with(".proto") && !NOT_IMAGES.contains(&name) {
            protos.push(name.to_owned());
        }
    }
    protos
}

fn fail(dir: &Path, why: &dyn std::fmt::Display) -> ! {
    panic!(
        "\n\ncriu-images needs CRIU 4.2.1's image format (images/*.proto) in {} to generate its \
         types: {why}.\nRun scripts/setup-env.sh (it installs them there), or extract images/ \
         from CRIU 4.2.1's source tarball and set {DIR_VAR} to that directory.\n\n",
        dir.display()
    )
}

fn strings_as_bytes(message: &mut DescriptorProto) {
    for field in &mut message.field {
        if field.r#type() == Type::String {
            field.set_type(Type::Bytes);
        }
    }
    message.nested_type.iter_mut().for_each(strings_as_bytes);
}
