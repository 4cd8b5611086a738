//! Chooses chunk sizes by measurement on the fleet shape of issue 21: device memory that is
//! "weights" from a fixed seed (the same in every replica), a zero "KV cache", and a small
//! state that differs per replica and per checkpoint.
//!
//! ```text
//! cargo run -p gpusnap-checkpoint --release --example chunk_sizes [MiB of weights, default 256]
//! ```
//!
//! For each candidate (min, avg, max) it prints the chunks of replica A, the bytes A stores
//! (distinct chunks), the bytes replica B adds on top of A, and the splitting and SHA-256
//! speed. Printed, not asserted.

use std::collections::HashSet;
use std::time::Instant;

use gpusnap_checkpoint::chunks::{split, ChunkDigest, ChunkParams};

fn noise(out: &mut Vec<u8>, n: usize, seed: u64) {
    let mut x = seed | 1;
    out.reserve(n);
    for _ in 0..n / 8 {
        // xorshift64*: fast, deterministic, incompressible enough for CDC.
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
}

/// Weights (W MiB, seed 1), zeros (W/2), state (W/10, seed per replica), in that order, as the
/// driver double lays allocations out in a GPU extent.
fn replica(weights_mib: usize, state_seed: u64) -> Vec<u8> {
    let mib = 1 << 20;
    let mut v = Vec::new();
    noise(&mut v, weights_mib * mib, 1);
    v.resize(v.len() + weights_mib / 2 * mib, 0);
    noise(&mut v, (weights_mib / 10).max(1) * mib, state_seed);
    v
}

fn main() {
    let weights_mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(256);
    let a = replica(weights_mib, 100);
    let b = replica(weights_mib, 200);
    let mib = |n: u64| n as f64 / (1 << 20) as f64;
    println!(
        "replica: {:.0} MiB ({weights_mib} weights, {} zeros, {} state)",
        mib(a.len() as u64),
        weights_mib / 2,
        (weights_mib / 10).max(1)
    );
    println!(
        "{:>22} {:>8} {:>12} {:>12} {:>10} {:>10}",
        "min/avg/max KiB", "chunks", "A stores MiB", "B adds MiB", "cut MB/s", "sha MB/s"
    );
    for (min, avg, max) in [
        (16u32, 64u32, 256u32),
        (64, 256, 1024),
        (256, 1024, 4096),
        (512, 2048, 8192),
        (1024, 4096, 16384),
    ] {
        let p = ChunkParams {
            min: min << 10,
            avg: avg << 10,
            max: max << 10,
        };
        let mut chunks_a: Vec<(ChunkDigest, usize)> = Vec::new();
        let mut cut_time = std::time::Duration::ZERO;
        let mut sha_time = std::time::Duration::ZERO;
        let t = Instant::now();
        let mut lens = Vec::new();
        split(&mut a.as_slice(), p, &mut |c| {
            lens.push(c.len());
            Ok(())
        })
        .expect("in memory");
        cut_time += t.elapsed();
        let mut off = 0;
        let t = Instant::now();
        for l in &lens {
            chunks_a.push((ChunkDigest::of(&a[off..off + l]), *l));
            off += l;
        }
        sha_time += t.elapsed();
        let mut stored: HashSet<ChunkDigest> = HashSet::new();
        let a_bytes: u64 = chunks_a
            .iter()
            .filter(|(d, _)| stored.insert(*d))
            .map(|(_, l)| *l as u64)
            .sum();
        let mut b_bytes = 0u64;
        split(&mut b.as_slice(), p, &mut |c| {
            if stored.insert(ChunkDigest::of(c)) {
                b_bytes += c.len() as u64;
            }
            Ok(())
        })
        .expect("in memory");
        let rate = |d: std::time::Duration| a.len() as f64 / d.as_secs_f64() / 1e6;
        println!(
            "{:>22} {:>8} {:>12.1} {:>12.1} {:>10.0} {:>10.0}",
            format!("{min}/{avg}/{max}"),
            chunks_a.len(),
            mib(a_bytes),
            mib(b_bytes),
            rate(cut_time),
            rate(sha_time)
        );
    }
}
