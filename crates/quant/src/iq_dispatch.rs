//! Row dispatch for the grid i-quants (IQ1_S .. IQ3_S); filled in as each format lands.

use crate::{GgmlType, QuantError};

pub(crate) fn dequantize_row(
    ty: GgmlType,
    _src: &[u8],
    _out: &mut [f32],
) -> Result<(), QuantError> {
    Err(QuantError::Unsupported(ty.name().to_string()))
}
