//! CRIU's image messages, generated at build time from CRIU 4.2.1's own `images/*.proto`
//! (`build.rs`). Every `string` is `bytes` here (see `build.rs` for why).
#![allow(clippy::all, missing_docs, rust_2018_idioms)]

include!(concat!(env!("OUT_DIR"), "/_.rs"));

/// The encoded `FileDescriptorSet` of those files (strings as bytes, as the types).
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/criu-4.2.1.fds"));
