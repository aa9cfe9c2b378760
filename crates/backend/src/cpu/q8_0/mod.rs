//! Q8_0 weights × Q8_0 activations: kernel selection and the portable path, which is the
//! quant crate's reference dot (`neagari_quant::q8_0::dot`) row by row.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;

super::tiles::legacy_format!("Q8_0", q8_0, Q8_0, Q8_0, q8_0, gemm_signed, w_bytes: 34, a_bytes: 34);

/// Portable `QuantizeActFn` for Q8_0: the quant crate's `quantize_row_q8_0_ref`.
///
/// # Panics
/// If `x.len()` is not a multiple of 32 or `out` is not `x.len() / 32 * 34` bytes.
pub(crate) fn quantize_act_scalar(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [neagari_quant::q8_0::BlockQ8_0] = bytemuck::cast_slice_mut(out);
    assert_eq!(x.len(), blocks.len() * 32, "Q8_0 activation row");
    for (b, xs) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let (d, _) = crate::cpu::q8_1::quantize_block_runtime(xs, &mut b.qs);
        b.d = neagari_quant::float::f32_to_f16(d);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::quantize_act as quantize_act_avx2;
