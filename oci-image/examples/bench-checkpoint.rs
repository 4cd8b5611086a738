//! Writes a sealed gpusnap checkpoint directory shaped like a real CRIU + GPU checkpoint, for
//! `scripts/bench-transport.sh`: small CRIU images, a few large `pages-*.img`, and GPU memory
//! extents `gpusnap-gpu-*`, all incompressible (so no layer of the image built from it
//! compresses, as with real process and device memory).
//!
//! ```text
//! cargo run --release -p gpusnap-oci-image --example bench-checkpoint -- DIR TOTAL_MIB
//! ```
//!
//! A quarter of TOTAL_MIB goes to 4 `pages-*.img` files, the rest to 3 GPU extents.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use gpusnap_checkpoint::{seal_checkpoint, GpuProcessRecord, GpuSection, Manifest, ProcessRecord};
use gpusnap_criu_bridge::CriuFlags;

/// xorshift64*: fast, deterministic per seed, and incompressible enough for gzip and zstd.
fn fill(out: &Path, bytes: u64, seed: u64) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(4 << 20, File::create(out)?);
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            chunk.copy_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    w.into_inner()?.sync_all()?;
    fs::set_permissions(out, fs::Permissions::from_mode(0o600))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, total_mib] = args.as_slice() else {
        return Err("usage: bench-checkpoint DIR TOTAL_MIB".into());
    };
    let total: u64 = total_mib.parse::<u64>()? << 20;
    let dir = Path::new(dir);
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;

    // The small CRIU images of one process (sizes as CRIU writes them for a Python trainer).
    let small: [(&str, u64); 9] = [
        ("inventory.img", 64),
        ("core-1.img", 3_000),
        ("mm-1.img", 12_000),
        ("pagemap-1.img", 9_000),
        ("files.img", 700),
        ("fdinfo-2.img", 128),
        ("pstree.img", 40),
        ("tty-info.img", 300),
        ("stats-dump", 40),
    ];
    for (i, (name, size)) in small.iter().enumerate() {
        fill(&dir.join(name), *size, 100 + i as u64)?;
    }
    fs::write(
        dir.join("descriptors.json"),
        br#"["/dev/null","pipe:[81234]"]"#,
    )?;
    fs::write(
        dir.join("dump.log"),
        b"(00.120000) Dumping finished successfully\n",
    )?;

    let pages = total / 4;
    for i in 0..4u64 {
        fill(
            &dir.join(format!("pages-{}.img", i + 1)),
            pages / 4,
            200 + i,
        )?;
    }
    let gpu = total - pages;
    let extents = [
        ("gpusnap-gpu-ctx-4242-dev0.bin".to_owned(), 1_500_000u64),
        ("gpusnap-gpu-mem-4242-dev0-000.bin".to_owned(), gpu / 2),
        (
            "gpusnap-gpu-mem-4242-dev0-001.bin".to_owned(),
            gpu - gpu / 2 - 1_500_000,
        ),
    ];
    for (i, (name, size)) in extents.iter().enumerate() {
        fill(&dir.join(name), *size, 300 + i as u64)?;
    }

    let mut m = Manifest::new(
        "bench0123456789abcdef",
        CriuFlags {
            tcp_established: true,
            ..Default::default()
        },
    );
    m.processes.push(ProcessRecord {
        container_pid: Some(1),
        command: Some(vec!["python".into(), "train.py".into()]),
    });
    m.gpu = Some(GpuSection {
        engine: "driver-managed".into(),
        processes: vec![GpuProcessRecord {
            host_pid: 4242,
            devices: vec!["GPU-00000000-0000-0000-0000-000000000000".into()],
            extra: serde_json::Map::new(),
        }],
        extra: serde_json::Map::new(),
    });
    let sealed = seal_checkpoint(dir, m)?;
    println!(
        "{}: {} files, {} bytes",
        dir.display(),
        sealed.images.files.len(),
        sealed.images.total_bytes
    );
    Ok(())
}
