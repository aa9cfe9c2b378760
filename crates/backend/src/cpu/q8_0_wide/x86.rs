//! x86 drivers of the wide-block Q8_0 formats: the micro-kernel contract and the walk over
//! the output, compiled once for AVX2 + FMA + F16C and once with AVX-512 F/BW/VL/VNNI.

use super::{shape, with_acts, WideActs, WideFormat};
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

/// A register-tile micro-kernel: dots of one weight row with `NA` repacked activation rows.
pub(crate) trait WideMicro {
    /// Weights per block.
    const BLOCK: usize;
    /// Bytes per weight block.
    const BYTES: usize;

    /// `out[i * stride] = dot(weight row, activation row i)` for `i < NA`. The weight row
    /// (`nb` blocks) starts at `w`; activation row `i` has its quants at `qs + i·k`, its
    /// lane scales at `dl + i·k/4` and its lane sums at `sa + i·k/4`.
    ///
    /// Implementations are `#[inline(always)]` without `#[target_feature]`, compiled inside
    /// the driver of their instruction set.
    ///
    /// # Safety
    /// Only callable from a function with the micro-kernel's features enabled; every
    /// pointer above must be valid for the lengths named.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        nb: usize,
        qs: *const i8,
        dl: *const f32,
        sa: *const i32,
        k: usize,
        out: *mut f32,
        stride: usize,
    );

    /// Decode: `out[r] = dot(weight row r, activation row 0)` for `r < 4`, weight rows
    /// `wrb` bytes apart starting at `w` (other arguments as in `tile`). By default four
    /// one-row tiles; a micro-kernel overrides it where sharing the activation loads and
    /// the horizontal sums between rows pays.
    ///
    /// # Safety
    /// As `tile`, for the four weight rows and four output cells.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn rows4(
        w: *const u8,
        wrb: usize,
        nb: usize,
        qs: *const i8,
        dl: *const f32,
        sa: *const i32,
        k: usize,
        out: *mut f32,
    ) {
        for r in 0..4 {
            // SAFETY: forwarded contract, one row at a time.
            unsafe { Self::tile::<1>(w.add(r * wrb), nb, qs, dl, sa, k, out.add(r), 1) }
        }
    }
}

/// Activation rows per tile in prefill.
const TILE_ROWS: usize = 4;

/// How far ahead of the decode kernel the weight rows are prefetched: one 4 KiB page. The
/// hardware prefetchers stop at page boundaries of the mmap'd file, and a Q1_0 page holds
/// only ~14 rows of 2048 weights. Measured on the 6-layer Q1_0 bench model, 1 thread,
/// alternating: 4 KiB +8–13 % tok/s over none; 1 KiB +5–10 %; 16–32 KiB no better
/// (while the same kernel on a heap buffer gained nothing from any distance).
const PF_BYTES: usize = 4096;

/// Walks the output: decode streams the weight rows through the one-row kernel; prefill
/// takes tiles of up to `TILE_ROWS` activation rows per weight row.
///
/// # Safety
/// The micro-kernel's features are enabled in the caller; the buffers passed `shape`.
#[inline(always)]
unsafe fn body<M: WideMicro>(
    x: &WideActs,
    w: &[u8],
    nw: usize,
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    let k = x.k;
    let wrb = k / M::BLOCK * M::BYTES;
    let (wp, op) = (w.as_ptr(), out.as_mut_ptr());
    let (qs, dl, sa) = (x.qs.as_ptr(), x.dl.as_ptr(), x.sa.as_ptr());
    let nb = wrb / M::BYTES;
    // SAFETY (whole body): rows j < nw of `wrb` bytes, activation rows i < na and output
    // cells i * stride + j lie inside the buffers `shape` measured.
    unsafe {
        if na == 1 {
            // Decode streams the rows once, four at a time where the micro-kernel shares
            // the activation loads and the final reductions between rows. The weights
            // ahead are prefetched (see `PF_BYTES`).
            let mut j = 0;
            let end = nw * wrb;
            let mut pf = 0;
            while j + 4 <= nw {
                let want = ((j + 4) * wrb + PF_BYTES).min(end);
                while pf < want {
                    _mm_prefetch::<_MM_HINT_T0>(wp.add(pf) as *const i8);
                    pf += 64;
                }
                M::rows4(wp.add(j * wrb), wrb, nb, qs, dl, sa, k, op.add(j));
                j += 4;
            }
            while j < nw {
                M::tile::<1>(wp.add(j * wrb), nb, qs, dl, sa, k, op.add(j), stride);
                j += 1;
            }
            return;
        }
        for j in 0..nw {
            let wj = wp.add(j * wrb);
            let mut i0 = 0;
            while i0 < na {
                let cn = TILE_ROWS.min(na - i0);
                let (q, d, s) = (qs.add(i0 * k), dl.add(i0 * k / 4), sa.add(i0 * k / 4));
                let o = op.add(i0 * stride + j);
                match cn {
                    1 => M::tile::<1>(wj, nb, q, d, s, k, o, stride),
                    2 => M::tile::<2>(wj, nb, q, d, s, k, o, stride),
                    3 => M::tile::<3>(wj, nb, q, d, s, k, o, stride),
                    _ => M::tile::<4>(wj, nb, q, d, s, k, o, stride),
                }
                i0 += cn;
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<M: WideMicro>(
    x: &WideActs,
    w: &[u8],
    nw: usize,
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: forwarded contract; this function enables the features the body needs.
    unsafe { body::<M>(x, w, nw, na, out, stride) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_avx512vnni<M: WideMicro>(
    x: &WideActs,
    w: &[u8],
    nw: usize,
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: forwarded contract; this function enables the features the body needs.
    unsafe { body::<M>(x, w, nw, na, out, stride) }
}

/// `GemmFn` of format `F` with its AVX2 micro-kernel `M`.
///
/// # Panics
/// On a broken `GemmFn` contract, or on a CPU without AVX2/FMA/F16C.
pub(crate) fn gemm_avx2<F: WideFormat, M: WideMicro>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let s = shape::<F>(k, w, nw, a, na, out, out_stride);
    assert!(
        crate::cpu::avx2_tiles::available(),
        "AVX2 kernel called on a CPU without AVX2/FMA/F16C"
    );
    let w = &w[..nw * s.wrb];
    debug_assert_eq!((F::BLOCK, F::BYTES), (M::BLOCK, M::BYTES));
    with_acts(a, na, k, F::PERM, |x| {
        // SAFETY: features checked just above; operands checked by `shape`.
        unsafe { run_avx2::<M>(x, w, nw, na, out, out_stride) }
    })
}

/// `GemmFn` of format `F` with its AVX-512 VNNI micro-kernel `M`.
///
/// # Panics
/// On a broken `GemmFn` contract, or on a CPU without AVX-512 F/BW/VL/VNNI.
pub(crate) fn gemm_avx512vnni<F: WideFormat, M: WideMicro>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let s = shape::<F>(k, w, nw, a, na, out, out_stride);
    assert!(
        crate::cpu::avx512_tiles::available(),
        "AVX-512 VNNI kernel called on a CPU without AVX-512 F/BW/VL/VNNI"
    );
    let w = &w[..nw * s.wrb];
    debug_assert_eq!((F::BLOCK, F::BYTES), (M::BLOCK, M::BYTES));
    with_acts(a, na, k, F::PERM, |x| {
        // SAFETY: features checked just above; operands checked by `shape`.
        unsafe { run_avx512vnni::<M>(x, w, nw, na, out, out_stride) }
    })
}
