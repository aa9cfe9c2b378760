//! GGUF v3 writer that streams tensor data.
//!
//! The header and tensor-info table are computed from the declared metadata and tensor
//! shapes alone, written first, and then each tensor's bytes are streamed in declaration
//! order, so a quantizer never holds more than the tensor (or chunk) it is producing.
//! Layout matches the `gguf` Python package's writer byte for byte: key/values in insertion
//! order, tensors packed in declaration order, each padded with zeros to the alignment.

use std::collections::HashSet;
use std::io::Write;

use neagari_quant::GgmlType;

use super::{
    align_up, alignment_of, tensor_n_bytes, TensorInfo, ALIGNMENT_KEY, GGUF_MAGIC, MAX_ARRAY_DEPTH,
};
use crate::error::GgufError;
use crate::value::{Array, Metadata, Value};

/// Version written; v3 is v2 plus big-endian support, and this writer is little-endian.
const VERSION: u32 = 3;

/// Collects metadata and tensor declarations, then writes the header with [`Self::start`].
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Metadata,
    /// (name, ne dims, type, n_bytes); offsets are assigned in `start` once the alignment
    /// is final.
    tensors: Vec<(String, Vec<u64>, GgmlType, u64)>,
    names: HashSet<String>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata key; keys are written in the order added. A repeated key is an error.
    pub fn add(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        let value = value.into();
        if let Value::Array(a) = &value {
            if array_depth(a) > MAX_ARRAY_DEPTH {
                // The reader would refuse the file.
                return Err(GgufError::NestingTooDeep {
                    max: MAX_ARRAY_DEPTH,
                    offset: 0,
                });
            }
        }
        self.metadata.insert(key, value)
    }

    /// Sets `general.alignment` (written as u32, like llama.cpp and gguf-py).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment(alignment.into()));
        }
        self.add(ALIGNMENT_KEY, alignment)
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Declares a tensor (dims in ggml `ne` order); its data is streamed later, in
    /// declaration order. Returns its exact byte size.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
    ) -> Result<u64, GgufError> {
        let name = name.into();
        let n_bytes = tensor_n_bytes(&name, dims, ty)?;
        if !self.names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor(name));
        }
        self.tensors.push((name, dims.to_vec(), ty, n_bytes));
        Ok(n_bytes)
    }

    /// Tensor infos as they will be written (offsets relative to the data section).
    pub fn tensor_infos(&self) -> Result<Vec<TensorInfo>, GgufError> {
        let alignment = alignment_of(&self.metadata)?;
        let mut offset = 0u64;
        let mut out = Vec::with_capacity(self.tensors.len());
        for (name, dims, ty, n_bytes) in &self.tensors {
            out.push(TensorInfo {
                name: name.clone(),
                ty: *ty,
                dims: dims.clone(),
                offset,
                n_bytes: *n_bytes,
            });
            offset = offset
                .checked_add(*n_bytes)
                .and_then(|o| align_up(o, alignment))
                .ok_or_else(|| GgufError::DimsOverflow {
                    tensor: name.clone(),
                    dims: dims.clone(),
                })?;
        }
        Ok(out)
    }

    /// Writes magic, version, counts, metadata, tensor infos and the padding before the
    /// data section; returns the writer that takes the tensor data. Wrap a file in a
    /// `BufWriter`: writes are not buffered here.
    pub fn start<W: Write>(self, mut w: W) -> Result<GgufDataWriter<W>, GgufError> {
        let alignment = alignment_of(&self.metadata)?;
        let tensors = self.tensor_infos()?;

        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            put_str(&mut head, key);
            head.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut head, value);
        }
        for t in &tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&t.offset.to_le_bytes());
        }
        let data_offset =
            align_up(head.len() as u64, alignment).ok_or(GgufError::BadAlignment(alignment))?;
        head.resize(data_offset as usize, 0);
        w.write_all(&head).map_err(GgufError::Write)?;

        Ok(GgufDataWriter {
            w,
            tensors,
            alignment,
            current: 0,
            written: 0,
        })
    }
}

/// Streams tensor data after the header, in declaration order, padding after each tensor.
pub struct GgufDataWriter<W: Write> {
    w: W,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Index of the tensor being written.
    current: usize,
    /// Bytes of `tensors[current]` written so far.
    written: u64,
}

impl<W: Write> GgufDataWriter<W> {
    /// The tensor whose bytes come next, if any.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.current)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Writes the whole data of the next tensor; `data.len()` must equal its `n_bytes`
    /// (an empty slice for a tensor with a zero dimension).
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), GgufError> {
        let Some(t) = self.tensors.get(self.current) else {
            return Err(GgufError::TooMuchData {
                got: data.len() as u64,
            });
        };
        if self.written != 0 || data.len() as u64 != t.n_bytes {
            return Err(GgufError::DataSizeMismatch {
                tensor: t.name.clone(),
                expected: t.n_bytes - self.written,
                got: data.len() as u64,
            });
        }
        self.w.write_all(data).map_err(GgufError::Write)?;
        self.written = t.n_bytes;
        self.close_if_complete()
    }

    /// Writes part of the current tensor's data; once its `n_bytes` are in, the padding is
    /// written and the next tensor begins. A chunk must not run past the current tensor.
    /// Zero-byte tensors are stepped over.
    pub fn write_chunk(&mut self, data: &[u8]) -> Result<(), GgufError> {
        if data.is_empty() {
            return Ok(());
        }
        self.skip_empty()?;
        let Some(t) = self.tensors.get(self.current) else {
            return Err(GgufError::TooMuchData {
                got: data.len() as u64,
            });
        };
        let left = t.n_bytes - self.written;
        if data.len() as u64 > left {
            return Err(GgufError::DataSizeMismatch {
                tensor: t.name.clone(),
                expected: left,
                got: data.len() as u64,
            });
        }
        self.w.write_all(data).map_err(GgufError::Write)?;
        self.written += data.len() as u64;
        self.close_if_complete()
    }

    /// After the current tensor's last byte: pads to the alignment and moves on.
    fn close_if_complete(&mut self) -> Result<(), GgufError> {
        let Some(t) = self.tensors.get(self.current) else {
            return Ok(());
        };
        if self.written < t.n_bytes {
            return Ok(());
        }
        // n_bytes fits usize (checked at declaration); the padding is < alignment.
        let padded = align_up(t.n_bytes, self.alignment).unwrap_or(t.n_bytes);
        let pad = (padded - t.n_bytes) as usize;
        if pad > 0 {
            self.w
                .write_all(&vec![0u8; pad])
                .map_err(GgufError::Write)?;
        }
        self.current += 1;
        self.written = 0;
        Ok(())
    }

    /// Steps over zero-byte tensors at the current position (they need no data).
    fn skip_empty(&mut self) -> Result<(), GgufError> {
        while self
            .tensors
            .get(self.current)
            .is_some_and(|t| t.n_bytes == 0)
        {
            self.close_if_complete()?;
        }
        Ok(())
    }

    /// Checks that every tensor's data was written, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        self.skip_empty()?;
        if let Some(t) = self.tensors.get(self.current) {
            return Err(GgufError::MissingData(t.name.clone()));
        }
        self.w.flush().map_err(GgufError::Write)?;
        Ok(self.w)
    }
}

/// 1 for a flat array, 2 for an array of flat arrays, ...
fn array_depth(a: &Array) -> usize {
    match a {
        Array::Array(v) => 1 + v.iter().map(array_depth).max().unwrap_or(0),
        _ => 1,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Payload of a value, without its type tag.
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Element type, count, then the elements; an inner array of a nested array is written
/// the same way (its own element type and count, no extra tag).
fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], enc: fn(T) -> [u8; N]) {
        for &x in v {
            out.extend_from_slice(&enc(x));
        }
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
    }
}
