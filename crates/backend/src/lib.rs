//! Devices and the ops the models call on them. `cpu` is always present; `cuda` arrives
//! behind the same trait. Models never look inside a buffer: they hand buffers and packed
//! weights back to the backend, so a device-resident implementation needs no model change.
//!
//! Shapes: an activation buffer is `[rows, cols]` f32, row-major, one row per token of the
//! batch. A matrix is `[out, in]` as in HF (`y = W x`), stored as `out` packed rows of `in`
//! values in its GGUF type (ggml's `ne = [in, out]`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use std::sync::Arc;

use neagari_quant::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{op}: no {device} kernel for weights of type {ty}")]
    NoKernel {
        op: &'static str,
        device: &'static str,
        ty: GgmlType,
    },
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{0}")]
    Quant(#[from] neagari_quant::QuantError),
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// Bytes that live as long as their owner (an mmap'd file, an owned vector).
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// A view of `owner[start..start + len]`; `None` if the range is out of bounds.
    pub fn new(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<Self> {
        let end = start.checked_add(len)?;
        if end > (*owner).as_ref().len() {
            return None;
        }
        Some(SharedBytes { owner, start, len })
    }

    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        SharedBytes {
            owner: Arc::new(v),
            start: 0,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A host tensor as read from a file: packed bytes, type and shape in HF order
/// (`[out, in]` for a matrix, `[n]` for a vector).
#[derive(Clone)]
pub struct HostTensor {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<usize>,
    pub bytes: SharedBytes,
}

impl HostTensor {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The nonlinearity of a gated MLP: `down(act(gate) * up)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluAct {
    /// SwiGLU: silu(x) = x * sigmoid(x).
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

/// Rotary position embedding of one layer, with ggml's parameters (ggml_rope_ext): the
/// angle of pair i at position p is `p · freq_scale · base^(−2i/dims)`, blended with the
/// unscaled angle by YaRN's ramp when `ext_factor` ≠ 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Dimensions rotated per head (≤ head_dim; the rest pass through).
    pub dims: usize,
    pub base: f32,
    /// 1 / (linear or YaRN scaling factor); 1.0 = none.
    pub freq_scale: f32,
    /// NeoX pairing (i, i + dims/2) when true; GPT-J/llama pairing (2i, 2i+1) when false.
    pub neox: bool,
    /// YaRN extrapolation mix (0 = off).
    pub ext_factor: f32,
    /// Magnitude scale of cos/sin (YaRN's attention factor; 1.0 = none).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Training context the scaling refers to.
    pub n_ctx_orig: usize,
}

impl Rope {
    /// Plain RoPE without scaling.
    pub fn plain(dims: usize, base: f32, neox: bool) -> Self {
        Rope {
            dims,
            base,
            freq_scale: 1.0,
            neox,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
        }
    }
}

/// Attention of one layer over its KV cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attn {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    /// Only the last `window` positions are visible (sliding-window layers).
    pub window: Option<usize>,
    /// `cap * tanh(s / cap)` on the scores (Gemma 2 style), when set.
    pub softcap: Option<f32>,
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            _ => Err(format!(
                "unknown KV cache type '{s}' (expected f16 or q8_0)"
            )),
        }
    }
}

/// Shape of the KV cache of one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct KvShape {
    pub n_layers: usize,
    pub n_ctx: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ty: KvType,
}

/// The ops a model's forward pass needs. Buffers and weights are opaque: a device backend
/// keeps them in device memory and nothing here touches host memory except `read`/`write`.
pub trait Backend: Send + Sync + 'static {
    /// f32 activations `[rows, cols]`.
    type Buf: Send;
    /// A packed weight matrix `[out, in]` (or an embedding table `[vocab, dim]`).
    type Mat: Send + Sync;
    /// A small f32 parameter vector (norm weights, biases).
    type Vector: Send + Sync;
    /// The KV cache of one sequence, all layers.
    type Kv: Send;

    fn name(&self) -> String;

    fn load_mat(&self, t: &HostTensor) -> Result<Self::Mat>;
    fn load_vector(&self, t: &HostTensor) -> Result<Self::Vector>;
    /// Bytes the matrix occupies where it lives (for memory reports).
    fn mat_bytes(&self, m: &Self::Mat) -> usize;

    fn buf(&self, rows: usize, cols: usize) -> Result<Self::Buf>;
    fn buf_shape(&self, b: &Self::Buf) -> (usize, usize);
    /// Upload `host[rows * cols]`; the buffer is reshaped to `[rows, cols]`.
    fn write(&self, dst: &mut Self::Buf, host: &[f32], rows: usize, cols: usize) -> Result<()>;
    /// Download rows `[row0, row0 + n)` into `host[n * cols]`.
    fn read(&self, src: &Self::Buf, row0: usize, n: usize, host: &mut [f32]) -> Result<()>;
    /// `dst[0, :] = src[row, :]`, dst reshaped to `[1, cols]`.
    fn copy_row(&self, src: &Self::Buf, row: usize, dst: &mut Self::Buf) -> Result<()>;

    /// `out[i, :] = table[ids[i], :] * scale`, dequantized.
    fn embed(&self, table: &Self::Mat, ids: &[u32], scale: f32, out: &mut Self::Buf) -> Result<()>;
    /// `out[r, :] = W · x[r, :]` for every row r.
    fn matmul(&self, w: &Self::Mat, x: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// RMSNorm over groups of `w.len()` values: each row of `x` is split into groups of the
    /// weight's length (1 group = whole row; `n_heads` groups = per-head q/k norm).
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// In place version of `rms_norm`.
    fn rms_norm_inplace(&self, x: &mut Self::Buf, w: &Self::Vector, eps: f32) -> Result<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<()>;
    /// `x[r, :] += b` for every row.
    fn add_bias(&self, x: &mut Self::Buf, b: &Self::Vector) -> Result<()>;
    /// `gate = act(gate) * up`, in place in `gate`.
    fn glu(&self, gate: &mut Self::Buf, up: &Self::Buf, act: GluAct) -> Result<()>;
    /// `x = cap * tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Buf, cap: f32) -> Result<()>;
    /// Rotate each head of each row; row r sits at position `pos0 + r`. `freq_factors`
    /// (`[dims / 2]`, Llama 3.1's `rope_freqs`) divide the angle of each pair.
    fn rope(
        &self,
        x: &mut Self::Buf,
        head_dim: usize,
        pos0: usize,
        rope: &Rope,
        freq_factors: Option<&Self::Vector>,
    ) -> Result<()>;

    fn kv_alloc(&self, shape: &KvShape) -> Result<Self::Kv>;
    /// Positions currently stored (the next token's position).
    fn kv_len(&self, kv: &Self::Kv) -> usize;
    /// Positions the cache can hold.
    fn kv_capacity(&self, kv: &Self::Kv) -> usize;
    /// Forget positions `>= len` (a new turn that diverges, a rejected draft).
    fn kv_truncate(&self, kv: &mut Self::Kv, len: usize) -> Result<()>;
    /// Store `k`, `v` (`[rows, n_kv_heads * head_dim]`) of layer `layer` at positions
    /// `pos0..pos0 + rows`, then causal attention of `q` (`[rows, n_heads * head_dim]`)
    /// over positions `..= pos0 + r` into `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        pos0: usize,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        attn: &Attn,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Record that positions `..new_len` are now valid (after all layers stored them).
    fn kv_commit(&self, kv: &mut Self::Kv, new_len: usize) -> Result<()>;
}
