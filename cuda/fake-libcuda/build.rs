//! Builds `src/fake_libcuda.c` into `$OUT_DIR/libcuda.so.1`.
//!
//! The `cc` crate only produces static archives, so it is used here to find the
//! C compiler (honouring `CC`, `CFLAGS` and the target) and the shared object is
//! linked by invoking that compiler directly.

use std::path::PathBuf;

fn main() {
    let source = PathBuf::from("src/fake_libcuda.c");
    println!("cargo:rerun-if-changed={}", source.display());

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let library = out_dir.join("libcuda.so.1");

    let compiler = cc::Build::new()
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .opt_level(1)
        .get_compiler();
    let status = compiler
        .to_command()
        .args([
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libcuda.so.1",
            "-o",
        ])
        .arg(&library)
        .arg(&source)
        .args(["-lpthread", "-ldl"])
        .status()
        .expect("run the C compiler for the fake libcuda");
    assert!(
        status.success(),
        "building the fake libcuda failed: {status}"
    );

    println!(
        "cargo:rustc-env=GPUSNAP_FAKE_LIBCUDA_PATH={}",
        library.display()
    );
}
