//! Content-defined splitting (FastCDC 2020) of a stream into chunks.

use std::io::{self, Read};

use super::MAX_CHUNK_BYTES;

/// Chunk sizes outside FastCDC's bounds or ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "chunk sizes min {min}, avg {avg}, max {max}: need even sizes with \
     {min_min} ≤ min ≤ {min_max}, {avg_min} ≤ avg ≤ {avg_max}, \
     {max_min} ≤ max ≤ {max_max}, min ≤ avg ≤ max",
    min_min = fastcdc::v2020::MINIMUM_MIN,
    min_max = fastcdc::v2020::MINIMUM_MAX,
    avg_min = fastcdc::v2020::AVERAGE_MIN,
    avg_max = fastcdc::v2020::AVERAGE_MAX,
    max_min = fastcdc::v2020::MAXIMUM_MIN,
    max_max = MAX_CHUNK_BYTES
)]
pub struct ChunkParamsError {
    pub min: usize,
    pub avg: usize,
    pub max: usize,
}

/// FastCDC's minimum, average and maximum chunk sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ChunkParams {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

impl ChunkParams {
    /// 256 KiB / 1 MiB / 4 MiB. On the fleet shape (seeded weights shared by replicas, a zero
    /// region, a changing state; `examples/chunk_sizes.rs`, figures in
    /// docs/measurements/chunk-sizes.md) changes come in regions, not scattered bytes, so dedup
    /// is decided at region edges: what a smaller chunk saves there is a few chunks' worth per
    /// edge, while the chunk count — tar headers, list entries, opens at assembly — grows 4× for
    /// every halving. 1 MiB keeps an 8 GiB checkpoint at ~8k chunks (a ~600 KiB list).
    pub const DEFAULT: ChunkParams = ChunkParams {
        min: 256 << 10,
        avg: 1 << 20,
        max: 4 << 20,
    };

    /// Within FastCDC's bounds (and ours: [`MAX_CHUNK_BYTES`]), ordered, even.
    pub fn check(&self) -> Result<(), ChunkParamsError> {
        use fastcdc::v2020::{AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MIN, MINIMUM_MAX, MINIMUM_MIN};
        let (min, avg, max) = (self.min as usize, self.avg as usize, self.max as usize);
        let ok = (MINIMUM_MIN..=MINIMUM_MAX).contains(&min)
            && (AVERAGE_MIN..=AVERAGE_MAX).contains(&avg)
            && (MAXIMUM_MIN..=MAX_CHUNK_BYTES as usize).contains(&max)
            && min <= avg
            && avg <= max
            && min % 2 == 0
            && avg % 2 == 0
            && max % 2 == 0;
        if ok {
            Ok(())
        } else {
            Err(ChunkParamsError { min, avg, max })
        }
    }
}

/// Splits everything `reader` yields into content-defined chunks, calling `each` with every
/// chunk in order; returns the bytes read. `params` must pass [`ChunkParams::check`].
pub fn split(
    reader: &mut dyn Read,
    params: ChunkParams,
    each: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<u64> {
    use fastcdc::v2020::{cut, select_masks, Normalization};
    let (min, avg, max) = (
        params.min as usize,
        params.avg as usize,
        params.max as usize,
    );
    let (mask_s, mask_l) = select_masks(avg, Normalization::Level1);
    // Two maxima: a cut is searched only with a full maximum ahead (or at the end), so the
    // buffer's edge never makes a boundary; the tail is moved down once per maximum.
    let mut buf = vec![0u8; 2 * max];
    let (mut start, mut end, mut eof, mut total) = (0usize, 0usize, false, 0u64);
    loop {
        if !eof && end - start < max {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
            while end < buf.len() {
                match reader.read(&mut buf[end..]) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => end += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if start == end {
            return Ok(total);
        }
        let window = &buf[start..end.min(start + max)];
        let (_, len) = cut(
            window,
            min,
            avg,
            max,
            mask_s,
            mask_l,
            mask_s << 1,
            mask_l << 1,
        );
        let len = len.clamp(1, window.len());
        each(&window[..len])?;
        start += len;
        total += len as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::super::noise;
    use super::*;

    fn chunks(data: &[u8], p: ChunkParams, piece: usize) -> Vec<Vec<u8>> {
        // A reader that hands out `piece` bytes at a time: boundaries must not depend on it.
        struct Dribble<'a>(&'a [u8], usize);
        impl Read for Dribble<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(b.len()).min(self.1);
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut out = Vec::new();
        let n = split(&mut Dribble(data, piece), p, &mut |c| {
            out.push(c.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(n, data.len() as u64);
        out
    }

    #[test]
    fn boundaries_follow_content_not_reads_and_realign_after_a_change() {
        let p = ChunkParams {
            min: 1024,
            avg: 4096,
            max: 16384,
        };
        p.check().unwrap();
        let data = noise(300_000, 7);
        let a = chunks(&data, p, 1 << 20);
        assert_eq!(a, chunks(&data, p, 777), "read sizes moved a boundary");
        assert!(a.len() > 20, "{} chunks", a.len());
        assert!(a.iter().all(|c| c.len() <= 16384));
        assert_eq!(a.concat(), data);
        // A different prefix: later chunks are the same again.
        let mut other = noise(5_000, 9);
        other.extend_from_slice(&data[100_000..]);
        let b = chunks(&other, p, 4096);
        let shared = b.iter().filter(|c| a.contains(c)).count();
        assert!(shared * 10 >= b.len() * 8, "{shared} of {} shared", b.len());
        // Zeros: maximum-size chunks, all the same.
        let z = chunks(&vec![0u8; 100_000], p, 1 << 16);
        assert!(z[..z.len() - 1]
            .iter()
            .all(|c| c.len() == 16384 && c == &z[0]));
        assert!(chunks(&[], p, 10).is_empty());
    }

    #[test]
    fn params_are_checked() {
        ChunkParams::DEFAULT.check().unwrap();
        for bad in [
            ChunkParams {
                min: 4,
                avg: 4096,
                max: 16384,
            },
            ChunkParams {
                min: 8192,
                avg: 4096,
                max: 16384,
            },
            ChunkParams {
                min: 1024,
                avg: 4096,
                max: 32 << 20,
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
