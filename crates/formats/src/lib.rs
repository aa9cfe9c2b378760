//! neagari-formats: readers and writers of weight containers (GGUF today; safetensors and
//! MLX packs later). Parses and validates metadata and tensor tables and hands out
//! zero-copy views of tensor bytes over a memory map; does no math on the weights.

pub mod error;
pub mod gguf;
pub mod safetensors;
pub mod value;

pub use error::GgufError;
pub use gguf::{Gguf, GgufDataWriter, GgufHeader, GgufWriter, TensorInfo};
pub use neagari_quant::GgmlType;
pub use value::{Array, Element, Metadata, Value, ValueType};
