//! The GPU layout of the 1- and 2-bit formats Q1_0 and TQ2_0, made at upload.
//!
//! ggml's blocks are 18 (Q1_0) and 66 (TQ2_0) bytes, so a row is only 2-byte aligned and a
//! GEMV thread took its bits with several 2-byte loads per 32 weights (ncu: 0.85–1.4 TB/s
//! on the H200, against 2–3 TB/s for Q4_K's 16-byte loads). Here each row is cut into
//! groups of 8 blocks; a group is 16 bytes holding the blocks' f16 scales (block `i` of the
//! group at bytes `2i`, zero-padded), then the blocks' bodies of `BODY` bytes, so every body
//! starts 16-byte aligned and a thread takes a whole body (or half of one) in 16-byte
//! loads. The last group of a row holds the `nb mod 8` remaining blocks (same 16-byte
//! header), so a row is `16 · ceil(nb / 8) + BODY · nb` bytes: at most 14 bytes a row more
//! than ggml's (`mat_bytes` counts them). Rows stay contiguous and in order, so a range of
//! rows (an expert's, `matmul_rows`) is still one slice.
//!
//! Bodies:
//! - Q1_0 (128 weights, `BODY` 16): four little-endian 32-bit words, the block's four
//!   32-weight units bit-sliced: weight `4k + i` of unit `j` (`k` 0..7, `i` 0..3) is bit
//!   `8i + j + 4·(k / 4)` of word `k % 4` (ggml: bit `m` of word `j` is weight `32j + m`).
//!   So `word & (0x01010101 << (j + 4·(k / 4)))`, one immediate mask, holds weights
//!   `4k .. 4k + 3` of unit `j` at one bit of bytes 0..3, lined up with the q8_1
//!   activation's word `k` for one `dp4a`, and a unit's eight sums have two scales, 2^j and
//!   2^(j+4) (kernels/vecdot.cuh, `Q_Q1_0R`). A unit a word (its weights at eight bit
//!   positions) took a shift as well before each `dp4a`.
//! - TQ2_0 (256 weights, `BODY` 64): ggml's `qs[64]` unchanged (its codes are already in
//!   `dp4a` order: byte `32c + m`, bits `2l`, is weight `128c + 32l + m`).
//!
//! Q4_K keeps ggml's super-blocks and sizes (d, dmin, 12 scale bytes, then 128 bytes of
//! nibbles), but ggml puts units 2j and 2j + 1 in the low and high nibbles of the same 32
//! bytes, so a one-row GEMV thread loaded 32 bytes for its 16 (and 12 registers a row in
//! flight: `mvq1x4u` took 78). Here unit `s` of a super-block is the 16 bytes at `16 + 16s`,
//! byte `4k + i` holding weight `8k + i` in its low nibble and `8k + 4 + i` in its high one:
//! one 16-byte load a unit, and word `k`'s two nibble halves are the activation's words `2k`
//! and `2k + 1` (the `N` forms of the Q4_K structs: vecdot.cuh `Q_Q4_Kt`, dequant.cuh
//! `F_Q4_Kt`, gemv_rows.cu `R_Q4_Kt` and `B_Q4_Kt`; the same integer sums, so the same bits).
//! Q5_K pairs its nibbles the same way at byte 48 and keeps a unit's 32 fifth bits as one
//! word at `16 + 4s` (bit `8i + m` for weight `4m + i`, so activation word `m`'s are bits `m`
//! of its bytes): Llama 3 8B all-Q5_K tg64 417 → 442 on the H200 (docs/BENCHMARKS.md,
//! session 48). NEAGARI_CUDA_Q5K_PAIR=0 keeps ggml's layout for Q5_K alone.
//!
//! The kernels that read it: kernels/lowbit.cu (`F_Q1_0R`, `F_TQ2_0R`: the f32 GEMV, the
//! embedding, the f16 dequantizer for prefill) and kernels/vecdot.cuh (`Q_Q1_0R`,
//! `Q_TQ2_0R`: the integer GEMV). NEAGARI_CUDA_REPACK=0 keeps ggml's layout and the old
//! kernels (for measuring).

use neagari_quant::GgmlType;

/// Blocks a group: the 16-byte scale header holds 8 f16.
const GROUP: usize = 8;

/// The repacked shape of a format: ggml's block bytes, the offset of its f16 scale in the
/// block, where its body starts and how long it is.
#[derive(Clone, Copy)]
struct Shape {
    block: usize,
    scale_at: usize,
    body_at: usize,
    body: usize,
    /// Q1_0: the body's bits are bit-sliced by unit (module docs).
    permute: bool,
}

fn shape(ty: GgmlType) -> Option<Shape> {
    match ty {
        GgmlType::Q1_0 => Some(Shape {
            block: 18,
            scale_at: 0,
            body_at: 2,
            body: 16,
            permute: true,
        }),
        GgmlType::TQ2_0 => Some(Shape {
            block: 66,
            scale_at: 64,
            body_at: 0,
            body: 64,
            permute: false,
        }),
        _ => None,
    }
}

/// Whether the format has a repacked GPU layout.
pub(super) fn repacked(ty: GgmlType) -> bool {
    shape(ty).is_some()
}

/// Bytes of a repacked row of `nb` blocks.
fn row_bytes_of(s: Shape, nb: usize) -> usize {
    16 * nb.div_ceil(GROUP) + s.body * nb
}

/// `LUT[v]`: the bits of byte 0 of a ggml word at their repacked places (bit `t` is weight
/// `t`, `k = t / 4`, `j = t % 4`, to bit `8j + k`). Byte `b` of the word (weights `8b + t`,
/// `k = 2b + t / 4`) lands 2b bits higher.
const fn spread_lut() -> [u32; 256] {
    let mut lut = [0u32; 256];
    let mut v = 0;
    while v < 256 {
        let mut t = 0;
        while t < 8 {
            if (v >> t) & 1 != 0 {
                lut[v] |= 1 << (8 * (t % 4) + t / 4);
            }
            t += 1;
        }
        v += 1;
    }
    lut
}

static SPREAD: [u32; 256] = spread_lut();

/// A Q1_0 word (ggml's bit order: bit `4k + i` is weight `4k + i` of its unit) with weight
/// `4k + i` at bit `8i + k`.
fn permute_word(w: u32) -> u32 {
    let b = w.to_le_bytes();
    SPREAD[b[0] as usize]
        | (SPREAD[b[1] as usize] << 2)
        | (SPREAD[b[2] as usize] << 4)
        | (SPREAD[b[3] as usize] << 6)
}

/// The inverse of [`permute_word`].
#[cfg(test)]
fn unpermute_word(w: u32) -> u32 {
    let mut o = 0u32;
    for i in 0..32 {
        let (k, j) = (i / 4, i % 4);
        o |= ((w >> (8 * j + k)) & 1) << i;
    }
    o
}

/// The four little-endian words of a 16-byte body.
fn words4(body: &[u8]) -> [u32; 4] {
    std::array::from_fn(|j| {
        u32::from_le_bytes([
            body[4 * j],
            body[4 * j + 1],
            body[4 * j + 2],
            body[4 * j + 3],
        ])
    })
}

/// Bits `q` and `q + 4` of word `j`'s bytes to bits `j` and `j + 4` of word `q`'s (`j`,
/// `q` 0..3): its own inverse.
fn transpose_bits(w: [u32; 4]) -> [u32; 4] {
    std::array::from_fn(|q| {
        (0..4).fold(0, |v, j| {
            v | (((w[j] >> q) & 0x0101_0101) << j) | (((w[j] >> (q + 4)) & 0x0101_0101) << (j + 4))
        })
    })
}

/// A Q1_0 body (`body`: ggml's four words, word `j` unit `j`) bit-sliced into `out` (module
/// docs): each unit's word permuted (weight `4k + i` at bit `8i + k`), then bits `k % 4 +
/// 4·(k / 4)` of unit `j`'s bytes to bits `j + 4·(k / 4)` of word `k % 4`'s.
fn slice_body(body: &[u8], out: &mut [u8]) {
    let w = transpose_bits(words4(body).map(permute_word));
    for (o, v) in out.chunks_exact_mut(4).zip(w) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// The inverse of [`slice_body`].
#[cfg(test)]
fn unslice_body(body: &[u8], out: &mut [u8]) {
    let w = transpose_bits(words4(body)).map(unpermute_word);
    for (o, v) in out.chunks_exact_mut(4).zip(w) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// Repacks one row of `nb` ggml blocks (`src`) into `dst` (its repacked bytes, zeroed).
fn repack_row(s: Shape, src: &[u8], dst: &mut [u8]) {
    for (b, blk) in src.chunks_exact(s.block).enumerate() {
        let g = (b / GROUP) * (16 + GROUP * s.body);
        let i = b % GROUP;
        dst[g + 2 * i..g + 2 * i + 2].copy_from_slice(&blk[s.scale_at..s.scale_at + 2]);
        let body = &blk[s.body_at..s.body_at + s.body];
        let out = &mut dst[g + 16 + s.body * i..g + 16 + s.body * (i + 1)];
        if s.permute {
            slice_body(body, out);
        } else {
            out.copy_from_slice(body);
        }
    }
}

/// `rows` rows of ggml blocks (`src`, `row_in` bytes each) in the repacked layout, and its
/// row size; `None` for a format without one.
pub(super) fn repack_rows(
    ty: GgmlType,
    src: &[u8],
    rows: usize,
    row_in: usize,
) -> Option<(Vec<u8>, usize)> {
    if paired(ty) {
        let f = if ty == GgmlType::Q4_K {
            pair_q4_k
        } else {
            pair_q5_k
        };
        return Some((split_rows(src, rows, row_in, row_in, f), row_in));
    }
    let s = shape(ty)?;
    let rb = row_bytes_of(s, row_in / s.block);
    Some((
        split_rows(src, rows, row_in, rb, |r, d| repack_row(s, r, d)),
        rb,
    ))
}

/// Q4_K's super-blocks with each unit's 32 nibbles paired (module docs), `src` and `dst`
/// whole super-blocks of the same length.
fn pair_q4_k(src: &[u8], dst: &mut [u8]) {
    for (o, b) in dst
        .chunks_exact_mut(Q4K_BLOCK)
        .zip(src.chunks_exact(Q4K_BLOCK))
    {
        o[..16].copy_from_slice(&b[..16]);
        pair_nibbles(&b[16..], &mut o[16..]);
    }
}

/// A K-quant super-block's 128 bytes of nibbles (`qs`, ggml's order) into `out` with each
/// unit's paired (module docs). ggml: weight i of unit s is nibble s % 2 of byte
/// 32·(s / 2) + i, so word k of that run, shifted and masked, holds weights 4k..4k + 3 in
/// its bytes' low nibbles; the unit's output word k pairs words 2k (low) and 2k + 1 (high).
fn pair_nibbles(qs: &[u8], out: &mut [u8]) {
    for s in 0..8 {
        let run = &qs[32 * (s / 2)..][..32];
        let n = |k: usize| {
            let w =
                u32::from_le_bytes([run[4 * k], run[4 * k + 1], run[4 * k + 2], run[4 * k + 3]]);
            (w >> (4 * (s % 2))) & 0x0F0F_0F0F
        };
        for k in 0..4 {
            let v = n(2 * k) | (n(2 * k + 1) << 4);
            out[16 * s + 4 * k..][..4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Bytes of a Q4_K super-block (d, dmin, 12 scale bytes, 128 of nibbles).
const Q4K_BLOCK: usize = 144;

/// Bytes of a Q5_K super-block (Q4_K's head, 32 bytes of fifth bits, 128 of nibbles).
const Q5K_BLOCK: usize = 176;

/// Whether format `ty` is uploaded with its units' nibbles paired (module docs): Q4_K and
/// Q5_K (NEAGARI_CUDA_Q5K_PAIR=0 not Q5_K, for measuring).
pub(super) fn paired(ty: GgmlType) -> bool {
    match ty {
        GgmlType::Q4_K => true,
        GgmlType::Q5_K => super::knob_on("NEAGARI_CUDA_Q5K_PAIR"),
        _ => false,
    }
}

/// Q5_K's super-blocks with each unit's nibbles paired as Q4_K's and its 32 fifth bits in
/// one word at `16 + 4s` (bit `8i + m` the fifth bit of weight `4m + i`), `src` and `dst`
/// whole super-blocks of the same length.
fn pair_q5_k(src: &[u8], dst: &mut [u8]) {
    for (o, b) in dst
        .chunks_exact_mut(Q5K_BLOCK)
        .zip(src.chunks_exact(Q5K_BLOCK))
    {
        o[..16].copy_from_slice(&b[..16]);
        for s in 0..8 {
            // ggml: weight l of unit s has its fifth bit at bit s of qh byte l.
            let mut h = 0u32;
            for l in 0..32 {
                h |= u32::from((b[16 + l] >> s) & 1) << (8 * (l % 4) + l / 4);
            }
            o[16 + 4 * s..][..4].copy_from_slice(&h.to_le_bytes());
        }
        pair_nibbles(&b[48..], &mut o[48..]);
    }
}

/// `rows` rows of `row_in` bytes (`src`) through `f` into rows of `rb` bytes (zeroed first).
/// Large matrices are split over threads (a 27B-shaped Q1_0 file is 3.8 GB of words).
fn split_rows(
    src: &[u8],
    rows: usize,
    row_in: usize,
    rb: usize,
    f: impl Fn(&[u8], &mut [u8]) + Sync,
) -> Vec<u8> {
    let mut out = vec![0u8; rb * rows];
    if rows == 0 || rb == 0 {
        return out;
    }
    let threads = if src.len() < (16 << 20) {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
    };
    let per = rows.div_ceil(threads);
    let f = &f;
    std::thread::scope(|sc| {
        for (dst, srcs) in out.chunks_mut(per * rb).zip(src.chunks(per * row_in)) {
            sc.spawn(move || {
                for (d, r) in dst.chunks_exact_mut(rb).zip(srcs.chunks_exact(row_in)) {
                    f(r, d);
                }
            });
        }
    });
    out
}

/// The inverse of [`repack_rows`]: ggml's bytes of `rows` repacked rows of `cols` weights.
#[cfg(test)]
fn unpack_rows(ty: GgmlType, src: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let s = shape(ty).expect("a repacked format");
    let row_in = ty.row_bytes(cols).expect("whole blocks");
    let nb = row_in / s.block;
    let rb = row_bytes_of(s, nb);
    let mut out = vec![0u8; row_in * rows];
    for (d, r) in out.chunks_exact_mut(row_in).zip(src.chunks_exact(rb)) {
        for (b, blk) in d.chunks_exact_mut(s.block).enumerate() {
            let g = (b / GROUP) * (16 + GROUP * s.body);
            let i = b % GROUP;
            blk[s.scale_at..s.scale_at + 2].copy_from_slice(&r[g + 2 * i..g + 2 * i + 2]);
            let body = &r[g + 16 + s.body * i..g + 16 + s.body * (i + 1)];
            let o = &mut blk[s.body_at..s.body_at + s.body];
            if s.permute {
                unslice_body(body, o);
            } else {
                o.copy_from_slice(body);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use neagari_quant::dequantize_row;

    /// `n` deterministic bytes (xorshift).
    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// `n` deterministic bytes of Q4_K / Q5_K super-blocks of `block` bytes, d and dmin
    /// f16s in [2^-8, 2^7).
    fn random_k_rows(n: usize, block: usize, seed: u64) -> Vec<u8> {
        let mut src = random_bytes(n, seed);
        for blk in src.chunks_exact_mut(block) {
            blk[1] = 0x1C + (blk[1] % 0x1C);
            blk[3] = 0x1C + (blk[3] % 0x1C);
        }
        src
    }

    /// Unit s's scale d·sc and min dmin·m of a Q4_K / Q5_K super-block (ggml's 6-bit
    /// scales, dequant.cuh's scale_min_k4).
    fn unit_scale_min(gb: &[u8], s: usize) -> (f32, f32) {
        let (sc, m) = if s < 4 {
            (gb[4 + s] & 63, gb[8 + s] & 63)
        } else {
            (
                (gb[8 + s] & 0xF) | ((gb[s] >> 6) << 4),
                (gb[8 + s] >> 4) | ((gb[4 + s] >> 6) << 4),
            )
        };
        let d = half::f16::from_le_bytes([gb[0], gb[1]]).to_f32();
        let dmin = half::f16::from_le_bytes([gb[2], gb[3]]).to_f32();
        (d * sc as f32, dmin * m as f32)
    }

    /// Deterministic rows, with f16 scales kept finite.
    fn random_rows(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let s = shape(ty).unwrap();
        let mut bytes = random_bytes(rows * ty.row_bytes(cols).unwrap(), seed);
        for blk in bytes.chunks_exact_mut(s.block) {
            // An f16 in [2^-8, 2^7): exponent bits 7..21.
            blk[s.scale_at + 1] = 0x1C + (blk[s.scale_at + 1] % 0x1C);
        }
        bytes
    }

    /// The weights of repacked rows read the way the kernels' decoders read them
    /// (kernels/lowbit.cu `F_Q1_0R::unit`, `F_TQ2_0R::unit`).
    fn decode_repacked(ty: GgmlType, src: &[u8], rows: usize, cols: usize) -> Vec<f32> {
        let s = shape(ty).unwrap();
        let rb = row_bytes_of(s, cols / (if ty == GgmlType::Q1_0 { 128 } else { 256 }));
        let mut out = vec![0f32; rows * cols];
        let stride = 16 + GROUP * s.body;
        for r in 0..rows {
            let row = &src[r * rb..(r + 1) * rb];
            for n in 0..cols {
                let (b, e) = match ty {
                    GgmlType::Q1_0 => (n / 128, n % 128),
                    _ => (n / 256, n % 256),
                };
                let (g, i) = (b >> 3, b & 7);
                let d = half::f16::from_le_bytes([
                    row[g * stride + 2 * i],
                    row[g * stride + 2 * i + 1],
                ])
                .to_f32();
                let body = &row[g * stride + 16 + s.body * i..];
                let word = |at: usize| {
                    u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]])
                };
                out[r * cols + n] = if ty == GgmlType::Q1_0 {
                    // Weight 4k + i of unit j: bit 8i + j + 4·(k / 4) of word k % 4.
                    let (j, k, i) = (e / 32, (e % 32) / 4, e % 4);
                    let bit = (word(4 * (k % 4)) >> (8 * i + j + 4 * (k / 4))) & 1;
                    if bit != 0 {
                        d
                    } else {
                        -d
                    }
                } else {
                    // Weight 128c + 32l + m: word (32c + m) / 4, byte m % 4, bits 2l.
                    let (c, l, m) = (e / 128, (e % 128) / 32, e % 32);
                    let code = (word(32 * c + 4 * (m / 4)) >> (8 * (m % 4) + 2 * l)) & 3;
                    (code as i32 - 1) as f32 * d
                };
            }
        }
        out
    }

    #[test]
    fn repack_round_trips_and_decodes_like_ggml() {
        for ty in [GgmlType::Q1_0, GgmlType::TQ2_0] {
            let block = if ty == GgmlType::Q1_0 { 128 } else { 256 };
            // Whole groups, ragged last groups, a single block, a row under one group.
            for (rows, nb) in [(3usize, 8usize), (5, 13), (2, 1), (4, 6), (7, 40), (1, 17)] {
                let cols = nb * block;
                let row_in = ty.row_bytes(cols).unwrap();
                let src = random_rows(ty, rows, cols, (rows * 1000 + nb) as u64);
                let (rp, rb) = repack_rows(ty, &src, rows, row_in).unwrap();
                assert_eq!(rb % 16, 0, "{ty} rows stay 16-byte aligned");
                assert_eq!(rp.len(), rb * rows);
                assert!(rb - row_in <= 14, "{ty}: {rb} bytes for {row_in}");
                assert_eq!(unpack_rows(ty, &rp, rows, cols), src, "{ty} {rows}x{cols}");
                let mut want = vec![0f32; rows * cols];
                for r in 0..rows {
                    dequantize_row(
                        ty,
                        &src[r * row_in..(r + 1) * row_in],
                        &mut want[r * cols..(r + 1) * cols],
                    )
                    .unwrap();
                }
                let got = decode_repacked(ty, &rp, rows, cols);
                assert!(got == want, "{ty} {rows}x{cols}: decoded weights differ");
            }
        }
    }

    /// Each super-block `b` of row `r` of a paired K-quant (`rp`, rows as long as ggml's in
    /// `src`) beside ggml's and ggml's dequantized weights of it: `check(r, b, paired, ggml,
    /// want)`. The 16-byte head (d, dmin, scale bytes) is ggml's.
    fn each_paired_block(
        ty: GgmlType,
        block: usize,
        (src, rp): (&[u8], &[u8]),
        (rows, cols): (usize, usize),
        mut check: impl FnMut(usize, usize, &[u8], &[u8], &[f32]),
    ) {
        let row_in = ty.row_bytes(cols).unwrap();
        for r in 0..rows {
            let (g, p) = (&src[r * row_in..][..row_in], &rp[r * row_in..][..row_in]);
            let mut want = vec![0f32; cols];
            dequantize_row(ty, g, &mut want).unwrap();
            for (b, (pb, gb)) in p.chunks_exact(block).zip(g.chunks_exact(block)).enumerate() {
                assert_eq!(pb[..16], gb[..16], "the head is ggml's");
                check(r, b, pb, gb, &want[256 * b..][..256]);
            }
        }
    }

    #[test]
    fn q4_k_units_pair_their_nibbles() {
        let ty = GgmlType::Q4_K;
        let (rows, cols) = (3usize, 256 * 5);
        let row_in = ty.row_bytes(cols).unwrap();
        let src = random_k_rows(rows * row_in, Q4K_BLOCK, 0x9E37_79B9_7F4A_7C15);
        let (rp, rb) = repack_rows(ty, &src, rows, row_in).unwrap();
        assert_eq!((rb, rp.len()), (row_in, src.len()));
        each_paired_block(
            ty,
            Q4K_BLOCK,
            (&src, &rp),
            (rows, cols),
            |r, b, pb, gb, want| {
                for s in 0..8 {
                    // dequant.cuh F_Q4_Kt<true>::unit: word k's low nibbles are weights 8k..,
                    // its high ones 8k + 4.. (the scale and min as ggml's).
                    let (d, dm) = unit_scale_min(gb, s);
                    for k in 0..4 {
                        for i in 0..4 {
                            let v = pb[16 + 16 * s + 4 * k + i];
                            for (n, q) in [(8 * k + i, v & 0xF), (8 * k + 4 + i, v >> 4)] {
                                let got = d * q as f32 - dm;
                                assert_eq!(
                                    got,
                                    want[32 * s + n],
                                    "row {r} block {b} unit {s} weight {n}"
                                );
                            }
                        }
                    }
                }
            },
        );
    }

    #[test]
    fn q5_k_units_pair_their_nibbles_and_fifth_bits() {
        let ty = GgmlType::Q5_K;
        let (rows, cols) = (2usize, 256 * 3);
        let row_in = ty.row_bytes(cols).unwrap();
        let src = random_k_rows(rows * row_in, Q5K_BLOCK, 0x2545_F491_4F6C_DD1D);
        let mut rp = vec![0u8; src.len()];
        pair_q5_k(&src, &mut rp);
        each_paired_block(
            ty,
            Q5K_BLOCK,
            (&src, &rp),
            (rows, cols),
            |r, b, pb, gb, want| {
                for s in 0..8 {
                    let (d, dm) = unit_scale_min(gb, s);
                    let h = u32::from_le_bytes(pb[16 + 4 * s..][..4].try_into().unwrap());
                    // dequant.cuh F_Q5_Kt<true>::unit: weight l = 8k + 4·hi + i is nibble hi
                    // of qs byte 4k + i, its fifth bit is bit 8i + l / 4 of the unit's word.
                    for l in 0..32 {
                        let (k, hi, i) = (l / 8, (l / 4) % 2, l % 4);
                        let q = (pb[48 + 16 * s + 4 * k + i] >> (4 * hi)) & 0xF;
                        let q = u32::from(q) + (((h >> (8 * i + l / 4)) & 1) << 4);
                        let got = d * q as f32 - dm;
                        assert_eq!(
                            got,
                            want[32 * s + l],
                            "row {r} block {b} unit {s} weight {l}"
                        );
                    }
                }
            },
        );
    }

    #[test]
    fn slicing_lines_weights_up_with_activation_words() {
        // Every single-bit body: weight 4k + i of unit j must sit at bit 8i + j + 4·(k / 4)
        // of word k % 4, so that word & (0x01010101 << (j + 4·(k / 4))) has it in byte i.
        for n in 0..128 {
            let mut body = [0u8; 16];
            body[n / 8] = 1 << (n % 8);
            let mut sliced = [0u8; 16];
            slice_body(&body, &mut sliced);
            let (j, k, i) = (n / 32, (n % 32) / 4, n % 4);
            let word = |q: usize| u32::from_le_bytes(sliced[4 * q..][..4].try_into().unwrap());
            for q in 0..4 {
                let want = if q == k % 4 {
                    1 << (8 * i + j + 4 * (k / 4))
                } else {
                    0
                };
                assert_eq!(word(q), want, "weight {n}, word {q}");
            }
            assert_eq!(
                word(k % 4) & (0x0101_0101 << (j + 4 * (k / 4))),
                1 << (8 * i + j + 4 * (k / 4))
            );
            let mut back = [0u8; 16];
            unslice_body(&sliced, &mut back);
            assert_eq!(back, body, "weight {n}");
        }
    }

    #[test]
    fn large_matrices_split_over_threads_the_same() {
        // 16 MiB and more goes to several threads; the split must not change a byte.
        let ty = GgmlType::Q1_0;
        let (rows, cols) = (1000usize, 128 * 944);
        let row_in = ty.row_bytes(cols).unwrap();
        let src = random_rows(ty, rows, cols, 7);
        assert!(src.len() >= 16 << 20);
        let (rp, rb) = repack_rows(ty, &src, rows, row_in).unwrap();
        let s = shape(ty).unwrap();
        let mut one = vec![0u8; rb];
        for r in [0, 1, 499, 500, 998, 999] {
            one.fill(0);
            repack_row(s, &src[r * row_in..(r + 1) * row_in], &mut one);
            assert!(one[..] == rp[r * rb..(r + 1) * rb], "row {r}");
        }
    }
}
