//! Dot products between client deltas: all FedOMG's solver needs (docs/algorithms.md §2).
//!
//! Rows are the round's held deltas ([`Delta`]: f32, or f16 widened a tile at a time into f32
//! buffers; widening is exact, so an f16 row gives the bits its f32 copy would).
//! [`cross_dots`] computes a block of new rows against earlier rows. It is written so that the
//! value of one pair's dot product never depends on how the work was blocked or how many
//! threads ran it:
//!
//! - products are summed in f32 over eight lanes (element `k` into lane `k mod 8`) within a
//!   chunk of [`CHUNK`] elements, the lanes are reduced in a fixed order and the chunk's sum is
//!   added in f64;
//! - chunk sums are added in index order within a segment of [`SEGMENT`] elements, and segment
//!   sums in index order. Threads take whole segments.
//!
//! So the Gram matrix is the same bit for bit whether an update arrived first or last, which
//! keeps a seeded run reproducible. No fused multiply-add is used, so x86-64 with or without
//! AVX2 and ARM64 give the same numbers too.

use std::ops::Range;

use super::delta::{Delta, WIDEN_CHUNK};

/// Elements summed in f32 before the partial sum moves to f64.
pub const CHUNK: usize = 256;
/// Elements per unit of work given to a thread.
pub const SEGMENT: usize = 1 << 16;
/// Elements of each row kept hot in cache while all earlier rows stream past.
const TILE: usize = 4096;
const LANES: usize = 8;

/// `out[i][j] = rows[new.start + i] · rows[prev.start + j]`, row-major `new.len() × prev.len()`,
/// using up to `threads` threads. All rows have the same length.
pub fn cross_dots(
    rows: &[Delta<'_>],
    new: Range<usize>,
    prev: Range<usize>,
    threads: usize,
) -> Vec<f64> {
    let (r, p) = (new.len(), prev.len());
    assert!(new.end <= rows.len() && prev.end <= rows.len());
    if r == 0 || p == 0 {
        return vec![0.0; r * p];
    }
    let m = rows[new.start].len();
    assert!(rows.iter().all(|row| row.len() == m), "rows of one length");
    let segments = m.div_ceil(SEGMENT).max(1);
    let threads = threads.clamp(1, segments);
    let per_thread = segments.div_ceil(threads);
    // partial[s] holds segment s's sums for every pair.
    let mut partial = vec![0f64; segments * r * p];
    let seg_sums = |seg_range: Range<usize>, out: &mut [f64]| {
        for (s, out) in seg_range.zip(out.chunks_mut(r * p)) {
            let lo = s * SEGMENT;
            let hi = ((s + 1) * SEGMENT).min(m);
            segment_dots(rows, &new, &prev, lo..hi, out);
        }
    };
    if threads == 1 {
        seg_sums(0..segments, &mut partial);
    } else {
        std::thread::scope(|scope| {
            for (t, out) in partial.chunks_mut(per_thread * r * p).enumerate() {
                let range = t * per_thread..((t + 1) * per_thread).min(segments);
                scope.spawn(move || seg_sums(range, out));
            }
        });
    }
    let mut out = vec![0f64; r * p];
    for seg in partial.chunks(r * p) {
        for (o, v) in out.iter_mut().zip(seg) {
            *o += v;
        }
    }
    out
}

/// A tile of several rows as f32 slices: borrowed from f32 rows, widened into `buf` from f16
/// rows.
fn tile_rows<'a>(
    rows: &[Delta<'a>],
    which: Range<usize>,
    tile: &Range<usize>,
    buf: &'a mut Vec<f32>,
) -> Vec<&'a [f32]> {
    let len = tile.len();
    let halves = rows[which.clone()]
        .iter()
        .filter(|r| matches!(r, Delta::F16(_)))
        .count();
    buf.resize(halves * len, 0.0);
    let mut spare: &'a mut [f32] = &mut buf[..];
    rows[which]
        .iter()
        .map(|row| match row {
            Delta::F32(v) => &v[tile.clone()],
            Delta::F16(_) => {
                let (dst, rest) = std::mem::take(&mut spare).split_at_mut(len);
                row.slice(tile.clone()).widen_into(dst);
                spare = rest;
                &*dst
            }
        })
        .collect()
}

/// One segment's sums for all pairs, tiled so the new rows stay in cache.
fn segment_dots(
    rows: &[Delta<'_>],
    new: &Range<usize>,
    prev: &Range<usize>,
    seg: Range<usize>,
    out: &mut [f64],
) {
    let p = prev.len();
    let (mut new_buf, mut prev_buf) = (Vec::new(), Vec::new());
    let mut tile_start = seg.start;
    while tile_start < seg.end {
        let tile = tile_start..(tile_start + TILE).min(seg.end);
        let new_rows = tile_rows(rows, new.clone(), &tile, &mut new_buf);
        let mut j = prev.start;
        while j < prev.end {
            let pj = (prev.end - j).min(2);
            let b = tile_rows(rows, j..j + pj, &tile, &mut prev_buf);
            let mut i = 0;
            while i < new_rows.len() {
                let ri = (new_rows.len() - i).min(4);
                let sums = block(&new_rows[i..i + ri], &b);
                for (di, srow) in sums.iter().enumerate().take(ri) {
                    for (dj, s) in srow.iter().enumerate().take(pj) {
                        out[(i + di) * p + (j - prev.start + dj)] += s;
                    }
                }
                i += ri;
            }
            j += pj;
        }
        tile_start = tile.end;
    }
}

/// Sums (chunk sums added in f64, in chunk order) for up to 4×2 pairs of equal-length
/// slices. Full 4×2 blocks use the AVX2 kernel when the CPU has it; it computes exactly what
/// [`micro`] computes (same lanes, same order, multiply then add), only eight lanes at a time.
fn block(a: &[&[f32]], b: &[&[f32]]) -> [[f64; 2]; 4] {
    #[cfg(target_arch = "x86_64")]
    if a.len() == 4 && b.len() == 2 && std::arch::is_x86_feature_detected!("avx2") {
        return avx2::block42([a[0], a[1], a[2], a[3]], [b[0], b[1]]);
    }
    micro(a, b)
}

/// The workspace's only unsafe code: unaligned vector loads inside bounds checked up front.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };

    use super::{CHUNK, LANES, reduce};

    /// 4×2 dot products; the caller has checked that the CPU supports AVX2.
    pub(super) fn block42(a: [&[f32]; 4], b: [&[f32]; 2]) -> [[f64; 2]; 4] {
        let len = a[0].len();
        assert!(a.iter().chain(&b).all(|s| s.len() == len), "equal lengths");
        // SAFETY: AVX2 is present (checked by the caller); every load below reads 8 floats at
        // an offset k with k + 8 <= len, inside all six slices (lengths checked above).
        unsafe { kernel(a, b) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn kernel(a: [&[f32]; 4], b: [&[f32]; 2]) -> [[f64; 2]; 4] {
        let len = a[0].len();
        let mut out = [[0f64; 2]; 4];
        let mut start = 0;
        while start < len {
            let end = (start + CHUNK).min(len);
            let full = start + (end - start) / LANES * LANES;
            let mut acc: [[__m256; 2]; 4] = [[_mm256_setzero_ps(); 2]; 4];
            let mut k = start;
            while k < full {
                // SAFETY: k + 8 <= full <= len, see block42.
                let (b0, b1) = unsafe {
                    (
                        _mm256_loadu_ps(b[0].as_ptr().add(k)),
                        _mm256_loadu_ps(b[1].as_ptr().add(k)),
                    )
                };
                for r in 0..4 {
                    // SAFETY: as above.
                    let x = unsafe { _mm256_loadu_ps(a[r].as_ptr().add(k)) };
                    acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(x, b0));
                    acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(x, b1));
                }
                k += LANES;
            }
            for r in 0..4 {
                for q in 0..2 {
                    let mut lanes = [0f32; LANES];
                    // SAFETY: `lanes` holds 8 floats.
                    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][q]) };
                    for k in full..end {
                        lanes[k - full] += a[r][k] * b[q][k];
                    }
                    out[r][q] += reduce(lanes);
                }
            }
            start = end;
        }
        out
    }
}

#[inline(always)]
fn micro(a: &[&[f32]], b: &[&[f32]]) -> [[f64; 2]; 4] {
    let len = a[0].len();
    let mut out = [[0f64; 2]; 4];
    let mut start = 0;
    while start < len {
        let end = (start + CHUNK).min(len);
        for (r, ar) in a.iter().enumerate().take(4) {
            for (q, bq) in b.iter().enumerate().take(2) {
                out[r][q] += chunk_dot(&ar[start..end], &bq[start..end]);
            }
        }
        start = end;
    }
    out
}

/// One chunk's dot product: element `k` into f32 lane `k mod 8`, lanes reduced in f64 in a
/// fixed order. Chunks start at multiples of 8, so the lane of an element is fixed.
#[inline(always)]
fn chunk_dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f32; LANES];
    let (xs, xr) = a.as_chunks::<LANES>();
    let (ys, yr) = b.as_chunks::<LANES>();
    for (x, y) in xs.iter().zip(ys) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in xr.iter().zip(yr).enumerate() {
        acc[l] += x * y;
    }
    reduce(acc)
}

/// Lanes to f64, added in a fixed order.
#[inline(always)]
fn reduce(lanes: [f32; LANES]) -> f64 {
    let l = lanes.map(f64::from);
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// `Σ_u coef_u · rows[u]` in f64, element by element in row order, using up to `threads`
/// threads (each element is summed by one thread, in the same order, whatever the count).
pub fn weighted_sum(rows: &[Delta<'_>], coef: &[f64], threads: usize) -> Vec<f64> {
    assert_eq!(rows.len(), coef.len());
    let m = rows.first().map_or(0, Delta::len);
    let mut out = vec![0f64; m];
    if m == 0 {
        return out;
    }
    let threads = threads.clamp(1, m.div_ceil(SEGMENT).max(1));
    let span = m.div_ceil(threads);
    let fill = |offset: usize, out: &mut [f64]| {
        let mut buf = Vec::new();
        for (row, &c) in rows.iter().zip(coef) {
            for (k, out) in out.chunks_mut(WIDEN_CHUNK).enumerate() {
                let start = offset + k * WIDEN_CHUNK;
                let src = row.f32_range(start..start + out.len(), &mut buf);
                for (o, d) in out.iter_mut().zip(src) {
                    *o += c * *d as f64;
                }
            }
        }
    };
    if threads == 1 {
        fill(0, &mut out);
    } else {
        std::thread::scope(|scope| {
            for (t, part) in out.chunks_mut(span).enumerate() {
                scope.spawn(move || fill(t * span, part));
            }
        });
    }
    out
}

/// Threads worth using for aggregation on this machine.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn views(x: &[f32], m: usize) -> Vec<Delta<'_>> {
        x.chunks(m).map(Delta::F32).collect()
    }

    fn naive(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    fn rows(n: usize, m: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n * m)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    #[test]
    fn cross_dots_match_f64_dot_products() {
        let (n, m) = (7, 3 * SEGMENT / 2 + 13);
        let x = rows(n, m, 1);
        let got = cross_dots(&views(&x, m), 3..7, 0..7, 2);
        for i in 3..7 {
            for j in 0..7 {
                let want = naive(&x[i * m..(i + 1) * m], &x[j * m..(j + 1) * m]);
                let g = got[(i - 3) * 7 + j];
                assert!(
                    (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{i},{j}: {g} vs {want}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn a_pair_gets_the_same_bits_however_it_is_blocked(
            n in 2usize..9, m in 1usize..3000, seed in 0u64..1000, threads in 1usize..4,
            split in 1usize..8,
        ) {
            let x = rows(n, m, seed);
            let split = split.min(n - 1);
            // All at once versus two blocks, different thread counts, reversed roles.
            let x = views(&x, m);
            let all = cross_dots(&x, 0..n, 0..n, 1);
            let first = cross_dots(&x, 0..split, 0..n, threads);
            let second = cross_dots(&x, split..n, 0..n, threads);
            for i in 0..n {
                for j in 0..n {
                    let blocked = if i < split { first[i * n + j] } else { second[(i - split) * n + j] };
                    prop_assert_eq!(all[i * n + j].to_bits(), blocked.to_bits());
                    prop_assert_eq!(all[i * n + j].to_bits(), all[j * n + i].to_bits());
                }
            }
        }
    }

    #[test]
    fn weighted_sum_is_the_same_with_any_thread_count() {
        let (n, m) = (5, 2 * SEGMENT + 5);
        let x = rows(n, m, 9);
        let all = views(&x, m);
        let rows = [all[4], all[0], all[2]];
        let coef = [0.5, -1.25, 2.0];
        let one = weighted_sum(&rows, &coef, 1);
        let three = weighted_sum(&rows, &coef, 3);
        assert_eq!(one, three);
        let k = SEGMENT + 1;
        let want = 0.5 * x[4 * m + k] as f64 - 1.25 * x[k] as f64 + 2.0 * x[2 * m + k] as f64;
        assert!((one[k] - want).abs() < 1e-12);
    }

    #[test]
    fn f16_rows_give_the_bits_of_their_f32_copies_mixed_or_not() {
        use half::f16;
        let (n, m) = (7, SEGMENT + 4_099);
        let halves: Vec<f16> = rows(n, m, 5).iter().map(|v| f16::from_f32(*v)).collect();
        let widened: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
        let f32s = views(&widened, m);
        // Rows 0, 2, 4 and 6 in f16, the others in f32.
        let mixed: Vec<Delta<'_>> = (0..n)
            .map(|i| match i % 2 {
                0 => Delta::F16(&halves[i * m..(i + 1) * m]),
                _ => f32s[i],
            })
            .collect();
        let all_f16: Vec<Delta<'_>> = halves.chunks(m).map(Delta::F16).collect();
        let want = cross_dots(&f32s, 2..7, 0..7, 2);
        let coef: Vec<f64> = (0..n).map(|i| 0.25 * i as f64 - 0.5).collect();
        let want_sum = weighted_sum(&f32s, &coef, 2);
        for rows in [&mixed, &all_f16] {
            let got = cross_dots(rows, 2..7, 0..7, 2);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits())
            );
            let sum = weighted_sum(rows, &coef, 2);
            assert!(
                sum.iter()
                    .zip(&want_sum)
                    .all(|(g, w)| g.to_bits() == w.to_bits())
            );
        }
    }
}
