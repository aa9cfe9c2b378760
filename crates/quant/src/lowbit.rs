//! Row-level dispatch for the low-bit formats (1-bit, ternary, 2-bit group formats and the
//! i-quants), kept apart from `lib.rs` so that file only chains into it, as it does for the
//! K-quants in `k_common`.

use crate::{blocks, blocks_mut, GgmlType, QuantError};
use crate::{iq4_nl, iq4_xs, pq2_0, ptq1_0, q1_0, q2_0, tq1_0, tq2_0};

/// Dequantizes a checked row of a low-bit type; `None` if `ty` is not one.
pub(crate) fn dequantize_row(
    ty: GgmlType,
    src: &[u8],
    out: &mut [f32],
) -> Option<Result<(), QuantError>> {
    if !is_lowbit(ty) {
        return None;
    }
    let mut run = || -> Result<(), QuantError> {
        match ty {
            GgmlType::Q1_0 => q1_0::dequantize(blocks(src)?, out),
            GgmlType::Q2_0 => q2_0::dequantize(blocks(src)?, out),
            GgmlType::PQ2_0 => pq2_0::dequantize(blocks(src)?, out),
            GgmlType::TQ1_0 => tq1_0::dequantize(blocks(src)?, out),
            GgmlType::TQ2_0 => tq2_0::dequantize(blocks(src)?, out),
            GgmlType::PTQ1_0 => ptq1_0::dequantize(blocks(src)?, out),
            GgmlType::IQ4_NL => iq4_nl::dequantize(blocks(src)?, out),
            GgmlType::IQ4_XS => iq4_xs::dequantize(blocks(src)?, out),
            _ => return crate::iq_dispatch::dequantize_row(ty, src, out),
        }
        Ok(())
    };
    Some(run())
}

/// Quantizes a checked row into a low-bit type with ggml's reference quantizer; `None` if
/// `ty` is not a low-bit type with a quantizer here.
pub(crate) fn quantize_row(
    ty: GgmlType,
    x: &[f32],
    out: &mut [u8],
) -> Option<Result<(), QuantError>> {
    let mut run = || -> Result<(), QuantError> {
        match ty {
            GgmlType::Q1_0 => q1_0::quantize_row(x, blocks_mut(out)?),
            GgmlType::Q2_0 => q2_0::quantize_row(x, blocks_mut(out)?),
            GgmlType::PQ2_0 => pq2_0::quantize_row(x, blocks_mut(out)?),
            GgmlType::TQ1_0 => tq1_0::quantize_row(x, blocks_mut(out)?),
            GgmlType::TQ2_0 => tq2_0::quantize_row(x, blocks_mut(out)?),
            GgmlType::PTQ1_0 => ptq1_0::quantize_row(x, blocks_mut(out)?),
            _ => return Err(QuantError::Unsupported(ty.name().to_string())),
        }
        Ok(())
    };
    matches!(
        ty,
        GgmlType::Q1_0
            | GgmlType::Q2_0
            | GgmlType::PQ2_0
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0
            | GgmlType::PTQ1_0
    )
    .then(&mut run)
}

fn is_lowbit(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q1_0 | Q2_0
            | PQ2_0
            | TQ1_0
            | TQ2_0
            | PTQ1_0
            | IQ4_NL
            | IQ4_XS
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
    )
}
