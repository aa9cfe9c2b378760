//! neagari-quant
