//! Errors of the GGUF reader, writer and metadata getters.
//!
//! Every way a file can be malformed has its own variant carrying the byte offset or the
//! tensor / key it concerns, so a bad download can be told apart from an unsupported model.

use std::path::PathBuf;

use neagari_quant::GgmlType;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing GGUF failed: {0}")]
    Write(#[source] std::io::Error),

    // --- container structure ---
    #[error("not a GGUF file: magic bytes {0:02x?} (expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error(
        "GGUF version field {0:#010x} looks byte-swapped: the file was written for the other \
         endianness"
    )]
    ByteSwapped(u32),
    #[error("GGUF version {0} is not supported (only versions 2 and 3 are)")]
    UnsupportedVersion(u32),
    #[error("file truncated reading {what} at offset {offset}: need {need} bytes, {have} left")]
    Truncated {
        what: &'static str,
        offset: u64,
        need: u64,
        have: u64,
    },
    #[error(
        "{what} count {count} at offset {offset} cannot fit in the {have} bytes left \
         (truncated or corrupt file)"
    )]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
        have: u64,
    },
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    InvalidUtf8 { what: &'static str, offset: u64 },
    #[error("invalid bool byte {value} at offset {offset} (must be 0 or 1)")]
    InvalidBool { value: u8, offset: u64 },
    #[error("unknown metadata value type {id} at offset {offset}")]
    UnknownValueType { id: u32, offset: u64 },
    #[error("metadata arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep { max: usize, offset: u64 },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("general.alignment = {0} is not a non-zero power of two")]
    BadAlignment(u64),

    // --- tensor infos ---
    #[error("tensor {tensor:?} has {n_dims} dimensions (at most 4 are allowed)")]
    TooManyDims { tensor: String, n_dims: u32 },
    #[error("tensor {tensor:?}: dimensions {dims:?} overflow the element count or byte size")]
    DimsOverflow { tensor: String, dims: Vec<u64> },
    #[error("tensor {tensor:?} has unknown ggml type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },
    #[error(
        "tensor {tensor:?}: row length {ne0} is not a multiple of the {ty} block size {block}"
    )]
    RaggedRow {
        tensor: String,
        ty: GgmlType,
        ne0: u64,
        block: usize,
    },
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor {tensor:?}: data bytes [{start}, {end}) lie outside the file of {file_size} bytes"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u128,
        end: u128,
        file_size: u64,
    },

    // --- typed metadata getters ---
    #[error("metadata key {0:?} not found")]
    MissingKey(String),
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {key:?}: value {value} does not fit in {expected}")]
    OutOfRange {
        key: String,
        value: String,
        expected: &'static str,
    },

    // --- writer ---
    #[error("tensor {tensor:?}: {got} bytes of data given, {expected} declared")]
    DataSizeMismatch {
        tensor: String,
        expected: u64,
        got: u64,
    },
    #[error("tensor data written after the last declared tensor ({got} extra bytes)")]
    TooMuchData { got: u64 },
    #[error("GGUF writer finished before the data of tensor {0:?} was complete")]
    MissingData(String),
}
