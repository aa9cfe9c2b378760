//! Quantizing a model into a new GGUF: the driver behind `neagari quantize`.
//!
//! Input is "a list of named tensors + metadata" ([`QuantizeInput`]): today built from a
//! GGUF ([`QuantizeInput::from_gguf`]), later from an HF safetensors checkpoint whose
//! tensors carry GGUF names and f32/f16/bf16 bytes. [`plan`] decides every tensor's type
//! with llama.cpp's rules (`quantize/rules.rs`) and knows the exact output size before a
//! byte is written; [`write`] streams the file through `GgufWriter`, a slab of rows at a
//! time, the rows of each slab split across threads. Each row is dequantized to f32 and
//! quantized with `neagari_quant::quantize_row` — ggml's `_ref` quantizers, the ones
//! llama.cpp's quantizer calls when it has no importance matrix — so a type added to the
//! quant crate is available here without changes.

pub mod rules;

use std::io::Write;
use std::sync::Mutex;

use neagari_formats::{Gguf, GgufError, GgufWriter, Metadata, Value};
use neagari_quant::{dequantize_row, quantize_row, GgmlType, QuantError};

pub use rules::{FileType, ModelFacts, TypeParams};

/// `general.quantization_version` as ggml writes it (GGML_QNT_VERSION).
pub const QUANTIZATION_VERSION: u32 = 2;

/// Split-file keys llama.cpp drops from a quantized output (it writes one file).
const SPLIT_KEYS: &[&str] = &["split.no", "split.count", "split.tensors.count"];

/// Rows kept in memory per slab are capped so the f32 copy and output of one slab stay
/// near this many bytes, whatever the tensor's size.
const SLAB_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tensor {tensor}: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: QuantError,
    },
    #[error("no quantizer for {ty} in this build (tensor {tensor}); types with one: {available}")]
    NoQuantizer {
        ty: GgmlType,
        tensor: String,
        available: String,
    },
    #[error("tensor {tensor} is stored as {ty}, which cannot be dequantized")]
    NoDequantizer { tensor: String, ty: GgmlType },
    #[error(
        "tensor {tensor} is already quantized ({ty}); requantizing loses accuracy, pass \
         --allow-requantize to do it anyway"
    )]
    Requantize { tensor: String, ty: GgmlType },
    #[error(
        "{ftype} puts tensor {tensor} in {ty}, which llama.cpp only makes with an importance \
         matrix; neagari quantize has none yet"
    )]
    NeedsImatrix {
        ftype: FileType,
        tensor: String,
        ty: GgmlType,
    },
    #[error("tensor {tensor}: {got} bytes of data, {want} expected for {ty} {dims:?}")]
    BadTensor {
        tensor: String,
        ty: GgmlType,
        dims: Vec<u64>,
        got: usize,
        want: u64,
    },
    #[error("metadata: {0}")]
    Metadata(String),
}

/// One input tensor: GGUF name, ggml `ne` dims, stored type and its bytes.
#[derive(Clone, Debug)]
pub struct SourceTensor<'a> {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: &'a [u8],
}

impl SourceTensor<'_> {
    fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }

    fn rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

/// What a quantization reads: the metadata to carry over and the tensors.
#[derive(Clone, Debug)]
pub struct QuantizeInput<'a> {
    pub metadata: Metadata,
    pub tensors: Vec<SourceTensor<'a>>,
}

impl<'a> QuantizeInput<'a> {
    pub fn from_gguf(g: &'a Gguf) -> Self {
        QuantizeInput {
            metadata: g.metadata().clone(),
            tensors: g
                .tensors()
                .iter()
                .map(|t| SourceTensor {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                    ty: t.ty,
                    data: g.tensor_data(t),
                })
                .collect(),
        }
    }

    /// The hyper-parameters llama.cpp's type rules look at.
    pub fn facts(&self) -> Result<ModelFacts, QuantizeError> {
        let m = &self.metadata;
        let arch = m
            .get_str("general.architecture")
            .map_err(|e| QuantizeError::Metadata(e.to_string()))?
            .to_string();
        // head counts may be per-layer arrays; the rules use layer 0's.
        let first = |key: &str| -> usize {
            match m.get(&format!("{arch}.{key}")) {
                Some(Value::Array(_)) => m
                    .get_u32_array(&format!("{arch}.{key}"))
                    .ok()
                    .and_then(|a| a.first().copied())
                    .unwrap_or(0) as usize,
                Some(v) => v.as_int().unwrap_or(0).max(0) as usize,
                None => 0,
            }
        };
        let n_head = first("attention.head_count");
        let n_head_kv = match first("attention.head_count_kv") {
            0 => n_head,
            n => n,
        };
        Ok(ModelFacts {
            n_layer: first("block_count"),
            n_head,
            n_head_kv,
            n_expert: first("expert_count"),
            arch,
        })
    }
}

/// Knobs of one quantization.
#[derive(Clone, Debug)]
pub struct QuantizeParams {
    pub types: TypeParams,
    /// Quantize tensors that are already quantized (dequantized to f32 first).
    pub allow_requantize: bool,
}

/// One output tensor: where it comes from and what it becomes.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    /// Index into `QuantizeInput::tensors`.
    pub src: usize,
    pub name: String,
    pub dims: Vec<u64>,
    pub from: GgmlType,
    pub to: GgmlType,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Every tensor's type and the output's exact size, decided before anything is written.
#[derive(Clone, Debug)]
pub struct Plan {
    pub ftype: FileType,
    /// In llama.cpp's order.
    pub tensors: Vec<TensorPlan>,
    /// Tensors whose row width forced a fallback type.
    pub n_fallback: usize,
    /// Exact size of the file `write` produces.
    pub file_bytes: u64,
    pub elements: u64,
    writer: GgufWriter,
}

impl Plan {
    pub fn bytes_in(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes_in).sum()
    }

    pub fn bytes_out(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes_out).sum()
    }

    /// Bits per weight of the tensor data.
    pub fn bpw(&self) -> f64 {
        self.bytes_out() as f64 * 8.0 / self.elements.max(1) as f64
    }
}

/// Whether `ty` has a quantizer in this build (asks the quant crate with one block).
pub fn has_quantizer(ty: GgmlType) -> bool {
    let i = ty.info();
    let mut out = vec![0u8; i.bytes];
    quantize_row(ty, &vec![0.0; i.block], &mut out).is_ok()
}

fn has_dequantizer(ty: GgmlType) -> bool {
    let i = ty.info();
    let mut out = vec![0f32; i.block];
    dequantize_row(ty, &vec![0u8; i.bytes], &mut out).is_ok()
}

fn quantizable_types() -> String {
    (0..64)
        .filter_map(GgmlType::from_id)
        .filter(|&t| t.info().block > 1 && has_quantizer(t))
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The output metadata: the input's keys in order, file type and quantization version
/// set, split keys dropped.
fn output_metadata(input: &Metadata, ftype: FileType) -> Result<Metadata, GgufError> {
    let mut m = Metadata::new();
    for (k, v) in input.iter() {
        match k {
            "general.file_type" => m.insert(k, ftype.id())?,
            "general.quantization_version" => m.insert(k, QUANTIZATION_VERSION)?,
            k if SPLIT_KEYS.contains(&k) => {}
            _ => m.insert(k, v.clone())?,
        }
    }
    if !m.contains_key("general.quantization_version") {
        m.insert("general.quantization_version", QUANTIZATION_VERSION)?;
    }
    if !m.contains_key("general.file_type") {
        m.insert("general.file_type", ftype.id())?;
    }
    Ok(m)
}

/// Decides every tensor's type and the output layout; refuses, before any work, a type
/// without a quantizer, an input type without a dequantizer, and requantization unless
/// allowed.
pub fn plan(input: &QuantizeInput, params: &QuantizeParams) -> Result<Plan, QuantizeError> {
    let facts = input.facts()?;
    let tp = &params.types;
    let mut order: Vec<usize> = (0..input.tensors.len()).collect();
    order.sort_by(|&a, &b| rules::llama_cpp_order(&input.tensors[a].name, &input.tensors[b].name));

    let mut chooser =
        rules::TypeChooser::new(&facts, tp, input.tensors.iter().map(|t| t.name.as_str()));
    let metadata = output_metadata(&input.metadata, tp.ftype)?;
    let mut writer = GgufWriter::new();
    for (k, v) in metadata.iter() {
        writer.add(k, v.clone())?;
    }
    let mut tensors = Vec::with_capacity(order.len());
    let mut elements = 0u64;
    for i in order {
        let t = &input.tensors[i];
        let to = chooser.choose(&t.name, &t.dims, t.ty);
        let want =
            t.ty.row_bytes(t.row_len())
                .map(|b| b as u64 * t.rows() as u64);
        if want != Some(t.data.len() as u64) {
            return Err(QuantizeError::BadTensor {
                tensor: t.name.clone(),
                ty: t.ty,
                dims: t.dims.clone(),
                got: t.data.len(),
                want: want.unwrap_or(0),
            });
        }
        if to != t.ty {
            if t.ty.info().block > 1 && !params.allow_requantize {
                return Err(QuantizeError::Requantize {
                    tensor: t.name.clone(),
                    ty: t.ty,
                });
            }
            if rules::requires_imatrix(&t.name, to, tp.ftype) {
                return Err(QuantizeError::NeedsImatrix {
                    ftype: tp.ftype,
                    tensor: t.name.clone(),
                    ty: to,
                });
            }
            if !has_dequantizer(t.ty) {
                return Err(QuantizeError::NoDequantizer {
                    tensor: t.name.clone(),
                    ty: t.ty,
                });
            }
            if !has_quantizer(to) {
                return Err(QuantizeError::NoQuantizer {
                    ty: to,
                    tensor: t.name.clone(),
                    available: quantizable_types(),
                });
            }
        }
        let bytes_out = writer.add_tensor(t.name.clone(), &t.dims, to)?;
        elements += t.dims.iter().product::<u64>();
        tensors.push(TensorPlan {
            src: i,
            name: t.name.clone(),
            dims: t.dims.clone(),
            from: t.ty,
            to,
            bytes_in: t.data.len() as u64,
            bytes_out,
        });
    }
    // The header's size is known only once encoded: encode it into a byte counter.
    let infos = writer.tensor_infos()?;
    let mut head = CountingWriter {
        inner: std::io::sink(),
        n: 0,
    };
    drop(writer.clone().start(&mut head)?);
    let alignment = writer_alignment(&metadata);
    let data = infos
        .last()
        .map(|t| (t.offset + t.n_bytes).div_ceil(alignment) * alignment)
        .unwrap_or(0);
    Ok(Plan {
        ftype: tp.ftype,
        tensors,
        n_fallback: chooser.n_fallback,
        file_bytes: head.n + data,
        elements,
        writer,
    })
}

fn writer_alignment(m: &Metadata) -> u64 {
    m.get_u32("general.alignment").map_or(32, u64::from).max(1)
}

/// Progress of `write`: input bytes consumed of the total, and the tensor at work.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub done: u64,
    pub total: u64,
    pub tensor: &'a str,
}

/// Streams the quantized file into `out` following `plan`; `progress` is called after each
/// slab of rows. Returns the bytes written.
pub fn write<W: Write>(
    input: &QuantizeInput,
    plan: Plan,
    out: W,
    threads: usize,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<u64, QuantizeError> {
    let total = plan.bytes_in();
    let mut done = 0u64;
    let mut dw = plan.writer.start(CountingWriter { inner: out, n: 0 })?;
    for tp in &plan.tensors {
        // A plan made from another input would index past these tensors' bytes.
        let t = match input.tensors.get(tp.src) {
            Some(t) if t.name == tp.name && t.data.len() as u64 == tp.bytes_in => t,
            _ => {
                return Err(QuantizeError::Metadata(format!(
                    "the plan does not belong to this input (tensor {})",
                    tp.name
                )))
            }
        };
        if tp.to == tp.from {
            dw.write_tensor(t.data)?;
            done += tp.bytes_in;
            progress(Progress {
                done,
                total,
                tensor: &tp.name,
            });
            continue;
        }
        let n = t.row_len();
        let rows = t.rows();
        let src_row = tp.from.row_bytes(n).unwrap_or(0);
        let dst_row = tp.to.row_bytes(n).unwrap_or(0);
        let per_row = dst_row + n * 4;
        let slab_rows = (SLAB_BYTES / per_row.max(1)).clamp(1, rows.max(1));
        let mut buf = vec![0u8; slab_rows * dst_row];
        let mut r0 = 0;
        while r0 < rows {
            let nr = slab_rows.min(rows - r0);
            let src = &t.data[r0 * src_row..(r0 + nr) * src_row];
            let dst = &mut buf[..nr * dst_row];
            quantize_rows(tp, src, src_row, dst, n, threads)?;
            dw.write_chunk(dst)?;
            done += (nr * src_row) as u64;
            progress(Progress {
                done,
                total,
                tensor: &tp.name,
            });
            r0 += nr;
        }
    }
    let w = dw.finish()?;
    Ok(w.n)
}

/// Quantizes `src` (rows of `n` values of `tp.from`) into `dst` (rows of `tp.to`), in
/// chunks of rows that `threads` workers take from a shared queue.
fn quantize_rows(
    tp: &TensorPlan,
    src: &[u8],
    src_row: usize,
    dst: &mut [u8],
    n: usize,
    threads: usize,
) -> Result<(), QuantizeError> {
    let dst_row = tp.to.row_bytes(n).unwrap_or(0).max(1);
    // At least ~16k values per chunk (llama.cpp's min_chunk_size) so a chunk is worth a
    // trip to the queue.
    let chunk_rows = (16384 / n.max(1)).max(1);
    let chunks: Vec<(usize, &mut [u8])> =
        dst.chunks_mut(chunk_rows * dst_row).enumerate().collect();
    let workers = threads.clamp(1, chunks.len().max(1));
    let queue = Mutex::new(chunks.into_iter());
    let failed = Mutex::new(None::<QuantizeError>);
    let work = || {
        let mut row = vec![0f32; n]; // [n] one dequantized row
        loop {
            let item = match queue.lock() {
                Ok(mut q) => q.next(),
                Err(_) => return,
            };
            let Some((ci, out)) = item else { return };
            for (k, orow) in out.chunks_exact_mut(dst_row).enumerate() {
                let r = ci * chunk_rows + k;
                let s = &src[r * src_row..(r + 1) * src_row];
                let res = dequantize_row(tp.from, s, &mut row)
                    .and_then(|()| quantize_row(tp.to, &row, orow));
                if let Err(e) = res {
                    if let Ok(mut f) = failed.lock() {
                        f.get_or_insert(QuantizeError::Quant {
                            tensor: tp.name.clone(),
                            source: e,
                        });
                    }
                    return;
                }
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..workers {
            s.spawn(work);
        }
        work();
    });
    match failed.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Counts the bytes passed through to the sink.
struct CountingWriter<W: Write> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
