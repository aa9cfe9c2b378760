//! Unquantized element types: F32, F16 (IEEE binary16) and BF16, plus the half-precision
//! scale helpers every block format uses.
//!
//! Elements are little-endian and read from byte slices, since tensor data viewed over an
//! mmap'd file carries no alignment guarantee for `f32`. Conversions follow ggml:
//! f32 → f16 rounds to nearest even (`GGML_FP32_TO_FP16`), f32 → bf16 rounds to nearest even
//! and quiets NaNs (`ggml_compute_fp32_to_bf16`). Tested bit for bit against the `gguf`
//! Python package (tests/fixtures, scripts/quant_reference.py).

/// An f16 stored as two little-endian bytes, widened exactly to f32.
#[inline]
pub fn f16_to_f32(h: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(h).to_f32()
}

/// f32 → f16 bytes, round to nearest even; overflow gives ±inf.
#[inline]
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// A bf16 stored as two little-endian bytes, widened exactly to f32.
#[inline]
pub fn bf16_to_f32(h: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(h) as u32) << 16)
}

/// f32 → bf16 bytes as ggml does it: NaN is forced quiet, everything else rounds to nearest
/// even on the dropped 16 bits (so large finite values may round to ±inf).
#[inline]
pub fn f32_to_bf16(x: f32) -> [u8; 2] {
    let u = x.to_bits();
    let h = if (u & 0x7fff_ffff) > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        // No overflow in u32: the largest input is 0xff80_0000 + 0x8000.
        (u + (0x7fff + ((u >> 16) & 1))) >> 16
    };
    (h as u16).to_le_bytes()
}

/// `out[i] = f32 at src[4i..4i+4]`. `src.len()` must be `4 * out.len()`.
pub fn dequantize_f32(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), 4 * out.len(), "F32 row length");
    for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// `out[i] = f16 at src[2i..2i+2]`. `src.len()` must be `2 * out.len()`.
pub fn dequantize_f16(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), 2 * out.len(), "F16 row length");
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_to_f32([c[0], c[1]]);
    }
}

/// `out[i] = bf16 at src[2i..2i+2]`. `src.len()` must be `2 * out.len()`.
pub fn dequantize_bf16(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), 2 * out.len(), "BF16 row length");
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32([c[0], c[1]]);
    }
}

/// `x[n]` → `out[2n]` f16 bytes.
pub fn quantize_row_f16(x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), 2 * x.len(), "F16 row length");
    for (c, &v) in out.chunks_exact_mut(2).zip(x) {
        c.copy_from_slice(&f32_to_f16(v));
    }
}

/// `x[n]` → `out[2n]` bf16 bytes (ggml rounding).
pub fn quantize_row_bf16(x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), 2 * x.len(), "BF16 row length");
    for (c, &v) in out.chunks_exact_mut(2).zip(x) {
        c.copy_from_slice(&f32_to_bf16(v));
    }
}

/// Reference dot of an F32 weight row (`w[4k]` bytes) with an f32 activation row `a[k]`.
/// Accumulates in f64 so the reference is tighter than any kernel tested against it.
pub fn dot_f32(w: &[u8], a: &[f32]) -> f32 {
    assert_eq!(w.len(), 4 * a.len(), "F32 row length");
    let mut s = 0f64;
    for (c, &y) in w.chunks_exact(4).zip(a) {
        s += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64 * y as f64;
    }
    s as f32
}

/// Reference dot of an F16 weight row (`w[2k]` bytes) with an f32 activation row `a[k]`.
pub fn dot_f16(w: &[u8], a: &[f32]) -> f32 {
    assert_eq!(w.len(), 2 * a.len(), "F16 row length");
    let mut s = 0f64;
    for (c, &y) in w.chunks_exact(2).zip(a) {
        s += f16_to_f32([c[0], c[1]]) as f64 * y as f64;
    }
    s as f32
}

/// Reference dot of a BF16 weight row (`w[2k]` bytes) with an f32 activation row `a[k]`.
pub fn dot_bf16(w: &[u8], a: &[f32]) -> f32 {
    assert_eq!(w.len(), 2 * a.len(), "BF16 row length");
    let mut s = 0f64;
    for (c, &y) in w.chunks_exact(2).zip(a) {
        s += bf16_to_f32([c[0], c[1]]) as f64 * y as f64;
    }
    s as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to the even one (1.0).
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        // 1 + 3·2^-8 ties too, and rounds up to the even 1 + 2^-6.
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)),
            1.0 + 1.0 / 64.0
        );
        // A signalling NaN (quiet bit clear, payload only in the low half) stays a NaN.
        let snan = f32::from_bits(0x7f80_0001);
        assert!(bf16_to_f32(f32_to_bf16(snan)).is_nan());
    }
}
