//! Keys for encrypted checkpoint images (ocicrypt JWE), made with the openssl CLI as an
//! operator would make them.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};

/// The key types the tests use. `EcSec1` is `openssl ecparam -genkey` output ("EC PRIVATE
/// KEY"), which gpusnap reads but skopeo 1.9 does not; the others are PKCS#8 (`genpkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    EcP256,
    EcSec1P384,
    Rsa2048,
}

/// Generates a key pair in `dir`: (`<name>.key`, root-owned 0600; `<name>.pub.pem`).
pub fn key_pair(dir: &Path, name: &str, kind: KeyKind) -> Result<(PathBuf, PathBuf)> {
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub.pem"));
    let gen: &[&str] = match kind {
        KeyKind::EcP256 => &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ],
        KeyKind::EcSec1P384 => &["ecparam", "-genkey", "-noout", "-name", "secp384r1"],
        KeyKind::Rsa2048 => &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ],
    };
    let run = |args: &[&str], out: &Path| -> Result<()> {
        let st = Command::new("openssl")
            .args(args)
            .arg("-out")
            .arg(out)
            .status()
            .context("running openssl")?;
        ensure!(st.success(), "openssl {args:?} failed");
        Ok(())
    };
    run(gen, &private)?;
    let private_str = private.to_str().context("key path is not UTF-8")?;
    run(&["pkey", "-pubout", "-in", private_str], &public)?;
    fs::set_permissions(&private, fs::Permissions::from_mode(0o600))?;
    Ok((private, public))
}

/// `jwe:<public key>`, as `--encrypt-recipient` and skopeo's `--encryption-key` take it.
pub fn recipient(public: &Path) -> String {
    format!("jwe:{}", public.display())
}
