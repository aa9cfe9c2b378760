//! Row dispatch for the grid i-quants (IQ1_S .. IQ3_S), chained from `lowbit`.

use crate::{blocks, GgmlType, QuantError};
use crate::{iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs};

pub(crate) fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    match ty {
        GgmlType::IQ2_XXS => iq2_xxs::dequantize(blocks(src)?, out),
        GgmlType::IQ2_XS => iq2_xs::dequantize(blocks(src)?, out),
        GgmlType::IQ2_S => iq2_s::dequantize(blocks(src)?, out),
        GgmlType::IQ3_XXS => iq3_xxs::dequantize(blocks(src)?, out),
        GgmlType::IQ3_S => iq3_s::dequantize(blocks(src)?, out),
        GgmlType::IQ1_S => iq1_s::dequantize(blocks(src)?, out),
        GgmlType::IQ1_M => iq1_m::dequantize(blocks(src)?, out),
        _ => return Err(QuantError::Unsupported(ty.name().to_string())),
    }
    Ok(())
}
