//! GGUF container: reading (here) and writing (`gguf/writer.rs`).
//!
//! Owns the byte layout of GGUF versions 2 and 3 (little-endian only): the header, the
//! metadata key/values, the tensor-info table, alignment, and zero-copy views of tensor
//! data over a memory map. Facts from ggml `docs/gguf.md` and `src/gguf.cpp`; the
//! reference this is tested against is the `gguf` Python package.
//!
//! Every length and count read from the file is checked against the bytes left before it
//! is used, so no input can make the reader allocate beyond a small multiple of the file
//! size, index out of bounds or panic.

mod q2_0_layout;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use neagari_quant::GgmlType;

use crate::error::GgufError;
use crate::value::{Array, Metadata, Value, ValueType};

pub use writer::{GgufDataWriter, GgufWriter};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";
pub const ARCHITECTURE_KEY: &str = "general.architecture";
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Nested metadata arrays deeper than this are refused: each level costs only 12 bytes of
/// file, so without a bound a small file could exhaust the stack of a recursive reader.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// One entry of the tensor-info table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml `ne` order: `dims[0]` is the contiguous axis (the reverse of a NumPy shape).
    pub dims: Vec<u64>,
    /// Byte offset of the data from the start of the data section, as stored in the file.
    pub offset: u64,
    /// Exact byte size of the data: `row_bytes(ne[0]) × ne[1] × ne[2] × ne[3]`.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (1 for a zero-dimensional tensor).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Elements per row: `ne[0]`.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: `ne[1] × ne[2] × ne[3]`.
    pub fn rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes of one row (`nb[1]`).
    pub fn row_bytes(&self) -> u64 {
        let info = self.ty.info();
        (self.row_len() / info.block as u64).saturating_mul(info.bytes as u64)
    }

    /// `ne[0..4]` with missing dimensions set to 1.
    pub fn ne(&self) -> [u64; MAX_DIMS] {
        let mut ne = [1u64; MAX_DIMS];
        for (slot, &d) in ne.iter_mut().zip(&self.dims) {
            *slot = d;
        }
        ne
    }
}

/// Everything in a GGUF file before the tensor data, parsed and validated.
#[derive(Clone, Debug)]
pub struct GgufHeader {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    tensor_info_offset: u64,
    data_offset: u64,
    file_size: u64,
}

impl GgufHeader {
    /// Parses the start of a file. `bytes` must reach at least the end of the tensor-info
    /// table; `file_size` is the length of the whole file, against which every tensor's data
    /// range is checked. Reading only a prefix lets a caller inspect a file without having
    /// all of it (e.g. a partial download).
    pub fn parse(bytes: &[u8], file_size: u64) -> Result<Self, GgufError> {
        let visible = usize::try_from(file_size).map_or(bytes.len(), |n| n.min(bytes.len()));
        let mut r = Reader {
            buf: &bytes[..visible],
            pos: 0,
        };

        let magic = r.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            let mut m = [0u8; 4];
            m.copy_from_slice(magic);
            return Err(GgufError::BadMagic(m));
        }
        let version = r.u32("version")?;
        // ggml treats a version whose low half is zero as written by a machine of the other
        // endianness: every real version is small.
        if version & 0xFFFF == 0 {
            return Err(GgufError::ByteSwapped(version));
        }
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = r.u64("tensor count")?;
        let kv_count = r.u64("metadata count")?;

        // A key/value is at least an empty key (8), a type (4) and a one-byte value.
        let n_kv = r.count(kv_count, 8 + 4 + 1, "metadata")?;
        let mut metadata = Metadata::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty_at = r.offset();
            let id = r.u32("metadata value type")?;
            let ty =
                ValueType::from_id(id).ok_or(GgufError::UnknownValueType { id, offset: ty_at })?;
            let value = read_value(&mut r, ty, 0)?;
            metadata.insert(key, value)?;
        }
        let alignment = alignment_of(&metadata)?;

        let tensor_info_offset = r.offset();
        // A tensor info is at least an empty name (8), n_dims (4), type (4), offset (8).
        let n_tensors = r.count(tensor_count, 8 + 4 + 4 + 8, "tensor info")?;
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let t = read_tensor_info(&mut r, alignment)?;
            if tensor_index.contains_key(&t.name) {
                return Err(GgufError::DuplicateTensor(t.name));
            }
            tensor_index.insert(t.name.clone(), i);
            tensors.push(t);
        }

        let data_offset =
            align_up(r.offset(), alignment).ok_or(GgufError::BadAlignment(alignment))?;
        q2_0_layout::resolve(&mut tensors, file_size.saturating_sub(data_offset));
        for t in &tensors {
            let start = u128::from(data_offset) + u128::from(t.offset);
            let end = start + u128::from(t.n_bytes);
            if end > u128::from(file_size) {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start,
                    end,
                    file_size,
                });
            }
        }

        Ok(GgufHeader {
            version,
            metadata,
            tensors,
            tensor_index,
            alignment,
            tensor_info_offset,
            data_offset,
            file_size,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// `general.architecture`, e.g. `gemma3`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.metadata.get_str(ARCHITECTURE_KEY)
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// File offset of the tensor-info table (the end of the metadata).
    pub fn tensor_info_offset(&self) -> u64 {
        self.tensor_info_offset
    }

    /// File offset of the data section; tensor offsets are relative to it.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// File offset of a tensor's first data byte.
    pub fn tensor_file_offset(&self, t: &TensorInfo) -> u64 {
        self.data_offset.saturating_add(t.offset)
    }

    // Typed getters of `Metadata`, here so callers need not go through `metadata()`.

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.metadata.get_u32(key)
    }
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.metadata.get_u64(key)
    }
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.metadata.get_i32(key)
    }
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.metadata.get_i64(key)
    }
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.metadata.get_f32(key)
    }
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.metadata.get_f64(key)
    }
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.metadata.get_bool(key)
    }
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.metadata.get_str(key)
    }
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        self.metadata.get_array(key)
    }
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        self.metadata.get_str_array(key)
    }
    pub fn get_f32_array(&self, key: &str) -> Result<std::borrow::Cow<'_, [f32]>, GgufError> {
        self.metadata.get_f32_array(key)
    }
    pub fn get_i32_array(&self, key: &str) -> Result<std::borrow::Cow<'_, [i32]>, GgufError> {
        self.metadata.get_i32_array(key)
    }
    pub fn get_u32_array(&self, key: &str) -> Result<std::borrow::Cow<'_, [u32]>, GgufError> {
        self.metadata.get_u32_array(key)
    }
}

/// The bytes a `Gguf` views: a read-only memory map of the file, or a buffer in memory.
enum Storage {
    Mmap(memmap2::Mmap),
    Shared(Arc<[u8]>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Shared(b) => b,
        }
    }
}

/// An open GGUF file: its validated header plus zero-copy access to tensor data.
///
/// Derefs to [`GgufHeader`] for metadata and tensor infos.
pub struct Gguf {
    storage: Storage,
    header: GgufHeader,
}

impl Gguf {
    /// Memory-maps and parses a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only and private to this process; if another process
        // truncates or rewrites the file while it is mapped, reads may fault or see new bytes
        // — the same contract every mmap-based model loader accepts.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::with_storage(Storage::Mmap(map))
    }

    /// Parses a file held in memory (tests, embedded models, downloads in progress).
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> Result<Self, GgufError> {
        Self::with_storage(Storage::Shared(bytes.into()))
    }

    fn with_storage(storage: Storage) -> Result<Self, GgufError> {
        let bytes = storage.bytes();
        let header = GgufHeader::parse(bytes, bytes.len() as u64)?;
        Ok(Gguf { storage, header })
    }

    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// A tensor's data, exactly `t.n_bytes` long, borrowed from the file.
    ///
    /// `t` must come from this file's `tensors()`; an info from elsewhere whose range does
    /// not lie inside this file gives an empty slice. The slice is aligned to `alignment()`
    /// relative to the file start (the map itself is page-aligned).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = self.header.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) => usize::try_from(s)
                .ok()
                .zip(usize::try_from(e).ok())
                .and_then(|(s, e)| self.bytes().get(s..e))
                .unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Data of the tensor called `name`.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        self.header.tensor(name).map(|t| self.tensor_data(t))
    }
}

impl Deref for Gguf {
    type Target = GgufHeader;
    fn deref(&self) -> &GgufHeader {
        &self.header
    }
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("file_size", &self.header.file_size)
            .field("version", &self.header.version)
            .field("n_kv", &self.header.metadata.len())
            .field("n_tensors", &self.header.tensors.len())
            .finish()
    }
}

/// `general.alignment` (any integer type), or the default; must be a power of two.
pub(crate) fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    if !metadata.contains_key(ALIGNMENT_KEY) {
        return Ok(DEFAULT_ALIGNMENT);
    }
    let a = metadata.get_u64(ALIGNMENT_KEY)?;
    if a.is_power_of_two() {
        Ok(a)
    } else {
        Err(GgufError::BadAlignment(a))
    }
}

pub(crate) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? & !(alignment - 1))
}

/// Checks a tensor's geometry and returns its byte size; shared with the writer.
pub(crate) fn tensor_n_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let overflow = || GgufError::DimsOverflow {
        tensor: name.to_string(),
        dims: dims.to_vec(),
    };
    if dims.len() > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name.to_string(),
            n_dims: u32::try_from(dims.len()).unwrap_or(u32::MAX),
        });
    }
    // ggml stores ne as int64: the element count must fit in i64.
    let mut n: u64 = 1;
    for &d in dims {
        n = n
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(overflow)?;
    }
    let info = ty.info();
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % info.block as u64 != 0 {
        return Err(GgufError::RaggedRow {
            tensor: name.to_string(),
            ty,
            ne0,
            block: info.block,
        });
    }
    // Not bounded by n when ne[0] = 0, so checked separately.
    let rows = dims
        .iter()
        .skip(1)
        .try_fold(1u64, |acc, &d| {
            acc.checked_mul(d).filter(|&r| r <= i64::MAX as u64)
        })
        .ok_or_else(overflow)?;
    (ne0 / info.block as u64)
        .checked_mul(info.bytes as u64)
        .and_then(|row| row.checked_mul(rows))
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or_else(overflow)
}

fn read_tensor_info(r: &mut Reader<'_>, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = r.string("tensor name")?;
    let n_dims = r.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            n_dims,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(r.u64("tensor dimension")?);
    }
    let id = r.u32("tensor type")?;
    let offset = r.u64("tensor data offset")?;
    let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.clone(),
        id,
    })?;
    let n_bytes = tensor_n_bytes(&name, &dims, ty)?;
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor {
            tensor: name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        ty,
        dims,
        offset,
        n_bytes,
    })
}

fn read_value(r: &mut Reader<'_>, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
    Ok(match ty {
        ValueType::U8 => Value::U8(r.u8("u8 value")?),
        ValueType::I8 => Value::I8(r.u8("i8 value")? as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(r.array("u16 value")?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(r.array("i16 value")?)),
        ValueType::U32 => Value::U32(r.u32("u32 value")?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(r.array("i32 value")?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(r.array("f32 value")?)),
        ValueType::Bool => Value::Bool(r.bool("bool value")?),
        ValueType::String => Value::String(r.string("string value")?),
        ValueType::Array => Value::Array(read_array(r, depth)?),
        ValueType::U64 => Value::U64(r.u64("u64 value")?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(r.array("i64 value")?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(r.array("f64 value")?)),
    })
}

/// Decodes `n` fixed-width little-endian elements of `N` bytes each.
fn fixed<const N: usize, T>(
    r: &mut Reader<'_>,
    n: usize,
    what: &'static str,
    decode: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    // `count` already checked n × N ≤ bytes left, so this cannot overflow.
    let bytes = r.take(n as u64 * N as u64, what)?;
    Ok(bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            decode(a)
        })
        .collect())
}

fn read_array(r: &mut Reader<'_>, depth: usize) -> Result<Array, GgufError> {
    let at = r.offset();
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            max: MAX_ARRAY_DEPTH,
            offset: at,
        });
    }
    let id = r.u32("array element type")?;
    let ty = ValueType::from_id(id).ok_or(GgufError::UnknownValueType { id, offset: at })?;
    let raw_count = r.u64("array length")?;
    let n = r.count(raw_count, ty.min_size() as u64, "array element")?;
    Ok(match ty {
        ValueType::U8 => Array::U8(fixed(r, n, "u8 array", u8::from_le_bytes)?),
        ValueType::I8 => Array::I8(fixed(r, n, "i8 array", i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(fixed(r, n, "u16 array", u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(r, n, "i16 array", i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(r, n, "u32 array", u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(r, n, "i32 array", i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(r, n, "f32 array", f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(r, n, "u64 array", u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(r, n, "i64 array", i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(r, n, "f64 array", f64::from_le_bytes)?),
        ValueType::Bool => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(r.bool("bool array")?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(r.string("string array element")?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(r, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

/// Bounds-checked little-endian cursor over the file bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let have = self.left();
        if n > have {
            return Err(GgufError::Truncated {
                what,
                offset: self.offset(),
                need: n,
                have,
            });
        }
        // n ≤ bytes left, so it fits in usize and the slice is in bounds.
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn bool(&mut self, what: &'static str) -> Result<bool, GgufError> {
        let offset = self.offset();
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufError::InvalidBool { value, offset }),
        }
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let offset = self.offset();
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| GgufError::InvalidUtf8 { what, offset })
    }

    /// A count of items each at least `min_size` bytes long, refused unless that many could
    /// fit in the bytes left — the bound on every allocation made from file contents.
    fn count(&self, count: u64, min_size: u64, what: &'static str) -> Result<usize, GgufError> {
        let have = self.left();
        if count > have / min_size {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                offset: self.offset().saturating_sub(8),
                have,
            });
        }
        // count ≤ bytes left ≤ usize::MAX.
        Ok(count as usize)
    }
}
