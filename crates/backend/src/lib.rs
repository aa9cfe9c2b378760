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
    /// A cache with recurrent state cannot drop positions: restore a snapshot or start over.
    #[error("cannot rewind recurrent state from {from} to {to} positions")]
    CannotRewind { from: usize, to: usize },
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

    /// A view of `self[off..off + len]`; `None` if out of bounds.
    pub fn slice(&self, off: usize, len: usize) -> Option<Self> {
        if off.checked_add(len)? > self.len {
            return None;
        }
        Some(SharedBytes {
            owner: self.owner.clone(),
            start: self.start + off,
            len,
        })
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

/// MLX affine codes with their per-group scales and biases (`w = s·q + β`), three tensors
/// of a safetensors pack that together make one matrix (see `neagari_quant::mlx_affine`).
#[derive(Clone)]
pub struct AffineTensor {
    pub layout: neagari_quant::mlx_affine::AffineLayout,
    pub scale_type: neagari_quant::mlx_affine::ScaleType,
    /// `[out, in·bits/8]` bytes: each row's codes, LSB-first bit stream.
    pub codes: SharedBytes,
    /// `[out, in/group]` in `scale_type`.
    pub scales: SharedBytes,
    /// `[out, in/group]` in `scale_type`.
    pub biases: SharedBytes,
}

/// A blockwise Hadamard rotation of a matrix's input (PrismML's `prism.hadamard`): the
/// stored rows are `r' = H(s ⊙ r)` with `H` the normalized Sylvester Hadamard of `block`
/// applied to each block of the row. A matmul rotates its input the same way
/// (`r'·(H(s ⊙ x)) = r·x`, as `H` is symmetric orthogonal and `s² = 1`); an embedding
/// lookup undoes it on the row (`r = s ⊙ H r'`).
#[derive(Clone, Debug, PartialEq)]
pub struct HadamardRotation {
    /// Power of two dividing the input width.
    pub block: usize,
    /// `[in]`, each ±1.
    pub signs: Arc<[f32]>,
}

/// What a matrix is made of: one GGUF-typed tensor, or an MLX affine triple.
#[derive(Clone)]
pub enum WeightData {
    Ggml(HostTensor),
    MlxAffine(AffineTensor),
}

/// A matrix as a source describes it to `Backend::load_weight`.
#[derive(Clone)]
pub struct WeightDesc {
    pub name: String,
    /// `[out, in]` (logical, whatever the packing).
    pub shape: Vec<usize>,
    pub data: WeightData,
    pub rotation: Option<HadamardRotation>,
}

impl From<HostTensor> for WeightDesc {
    fn from(t: HostTensor) -> Self {
        WeightDesc {
            name: t.name.clone(),
            shape: t.shape.clone(),
            data: WeightData::Ggml(t),
            rotation: None,
        }
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

/// What an attention layer does to q and k before the attention (`Backend::attention_block`):
/// per-head RMSNorm (each where its weight is given), then RoPE.
#[derive(Clone, Copy, Debug)]
pub struct QkPrep<'a, V> {
    pub q_norm: Option<&'a V>,
    pub k_norm: Option<&'a V>,
    pub eps: f32,
    pub rope_q: &'a Rope,
    pub rope_k: &'a Rope,
    /// Llama 3.1's `rope_freqs`.
    pub freq_factors: Option<&'a V>,
}

/// `Backend::attention_block` as the separate ops (the default, and a device backend's path
/// where its fused form does not apply).
#[allow(clippy::too_many_arguments)]
pub fn attention_block_ops<B: Backend + ?Sized>(
    be: &B,
    kv: &mut B::Kv,
    layer: usize,
    pos0: usize,
    q: &mut B::Buf,
    gated: bool,
    k: &mut B::Buf,
    v: &B::Buf,
    prep: &QkPrep<B::Vector>,
    attn: &Attn,
    out: &mut B::Buf,
) -> Result<()> {
    let (hd, nh) = (attn.head_dim, attn.n_heads);
    let (rows, _) = be.buf_shape(q);
    let mut parts = None;
    if gated {
        let mut qq = be.buf(rows, nh * hd)?; // [rows, n_heads·hd]
        be.copy_cols(q, 0, hd, 2 * hd, nh, &mut qq)?;
        let mut g = be.buf(rows, nh * hd)?; // [rows, n_heads·hd]
        be.copy_cols(q, hd, hd, 2 * hd, nh, &mut g)?;
        parts = Some((qq, g));
    }
    let qr = match parts.as_mut() {
        Some((qq, _)) => qq,
        None => q,
    };
    be.qk_norm_rope(
        qr,
        k,
        prep.q_norm,
        prep.k_norm,
        prep.eps,
        hd,
        pos0,
        prep.rope_q,
        prep.rope_k,
        prep.freq_factors,
    )?;
    be.attention(kv, layer, pos0, qr, k, v, attn, out)?;
    if let Some((_, g)) = &parts {
        be.mul_sigmoid(out, g)?;
    }
    Ok(())
}

impl Attn {
    /// Checks an `attention` call's operands (`[rows, cols]` of q, k, v) against this layer
    /// and the cache it writes (`layer` of `kv`, positions `pos0..pos0 + rows`): the one
    /// shape contract every backend enforces before touching memory.
    pub fn check(
        &self,
        kv: &KvShape,
        layer: usize,
        pos0: usize,
        q: (usize, usize),
        k: (usize, usize),
        v: (usize, usize),
    ) -> Result<()> {
        let (nh, nkv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let rows = q.0;
        if layer >= kv.n_layers
            || nkv != kv.n_kv_heads
            || hd != kv.head_dim
            || nkv == 0
            || nh % nkv != 0
            || q.1 != nh * hd
            || k.1 != nkv * hd
            || v.1 != nkv * hd
            || k.0 != rows
            || v.0 != rows
        {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!(
                    "q {}x{}, k {}x{}, heads {nh}/{nkv}x{hd}",
                    q.0, q.1, k.0, k.1
                ),
            });
        }
        if pos0 + rows > kv.n_ctx {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!("positions up to {} > n_ctx {}", pos0 + rows, kv.n_ctx),
            });
        }
        Ok(())
    }
}

/// Checks a `scatter_add_rows` call (`rows.len()` rows of `[src_rows, src_cols]` scaled by
/// `scale` into rows of `[dst_rows, dst_cols]`): the contract every backend enforces first.
pub fn check_scatter_add_rows(
    rows: &[u32],
    scale: &[f32],
    (src_rows, src_cols): (usize, usize),
    (dst_rows, dst_cols): (usize, usize),
) -> Result<()> {
    if rows.len() != src_rows
        || scale.len() != rows.len()
        || src_cols != dst_cols
        || rows.iter().any(|&r| r as usize >= dst_rows)
    {
        return Err(BackendError::Shape {
            op: "scatter_add_rows",
            detail: format!(
                "{} rows of {src_rows}x{src_cols} into {dst_rows}x{dst_cols}",
                rows.len()
            ),
        });
    }
    Ok(())
}

/// Checks a `kv_commit` to `new_len` on a cache of `n_ctx` positions.
pub fn check_kv_commit(new_len: usize, n_ctx: usize) -> Result<()> {
    if new_len > n_ctx {
        return Err(BackendError::Shape {
            op: "kv_commit",
            detail: format!("{new_len} > n_ctx {n_ctx}"),
        });
    }
    Ok(())
}

/// Checks a `kv_restore`: the snapshot (`snap_len`, its cache shape and recurrent-state
/// shape) was taken of this cache (`kv_len`, …) and is not ahead of it.
pub fn check_kv_restore<R: PartialEq>(
    (kv_len, kv_shape, kv_rec): (usize, &KvShape, Option<&R>),
    (snap_len, snap_shape, snap_rec): (usize, &KvShape, Option<&R>),
) -> Result<()> {
    if snap_len > kv_len || snap_shape != kv_shape || kv_rec != snap_rec {
        return Err(BackendError::Shape {
            op: "kv_restore",
            detail: format!("snapshot at {snap_len} of a different cache (now at {kv_len})"),
        });
    }
    Ok(())
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    /// Exact f32 (reference tests; no f16 rounding of q, K, V or the softmax weights).
    F32,
}

impl std::fmt::Display for KvType {
    /// The name `--kv-type` takes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::F32 => "f32",
        })
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "f32" => Ok(KvType::F32),
            _ => Err(format!(
                "unknown KV cache type '{s}' (expected f16, q8_0 or f32)"
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

/// Shape of the recurrent (Gated DeltaNet) state of one sequence, all recurrent layers:
/// per layer a conv window `[conv_kernel − 1, conv_channels]` and a matrix state
/// `[n_v_heads, d_k, d_v]`, both f32.
#[derive(Clone, Debug, PartialEq)]
pub struct RecShape {
    pub n_layers: usize,
    pub conv_channels: usize,
    pub conv_kernel: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
}

/// Which key head a value head reads when there are more value heads than key heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadMap {
    /// v head h uses k head `h / (n_v / n_k)` (HF order, qwen3next GGUFs).
    Grouped,
    /// v head h uses k head `h % n_k` (qwen35/qwen35moe GGUFs: llama.cpp reorders V heads).
    Tiled,
}

/// One Gated DeltaNet layer's head geometry. The input `qkv` rows are
/// `[q n_k·d_k | k n_k·d_k | v n_v·d_v]` after the short conv.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNet {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub map: HeadMap,
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

    /// Free and total bytes of the memory that weights and caches are allocated from where
    /// the backend has its own (a GPU's), for planning the context; None for host memory.
    fn device_memory(&self) -> Option<(u64, u64)> {
        None
    }

    fn load_mat(&self, t: &HostTensor) -> Result<Self::Mat>;
    fn load_vector(&self, t: &HostTensor) -> Result<Self::Vector>;
    /// Loads a matrix of any layout a source can describe (MLX affine packs, rotated
    /// inputs). Backends without such kernels keep this default, which takes plain GGUF
    /// tensors and refuses the rest by name.
    fn load_weight(&self, w: &WeightDesc) -> Result<Self::Mat> {
        match (&w.data, &w.rotation) {
            (WeightData::Ggml(t), None) => self.load_mat(t),
            _ => Err(BackendError::Other(format!(
                "{}: the {} backend has no kernel for MLX affine or Hadamard-rotated weights",
                w.name,
                self.name()
            ))),
        }
    }

    /// Bytes the matrix occupies where it lives (for memory reports).
    fn mat_bytes(&self, m: &Self::Mat) -> usize;

    fn buf(&self, rows: usize, cols: usize) -> Result<Self::Buf>;
    fn buf_shape(&self, b: &Self::Buf) -> (usize, usize);
    /// Upload `host[rows * cols]`; the buffer is reshaped to `[rows, cols]`.
    fn write(&self, dst: &mut Self::Buf, host: &[f32], rows: usize, cols: usize) -> Result<()>;
    /// Download rows `[row0, row0 + n)` into `host[n * cols]`.
    fn read(&self, src: &Self::Buf, row0: usize, n: usize, host: &mut [f32]) -> Result<()>;
    /// The greedy pick of each row: the index of the highest value, the lowest among equals,
    /// NaN ignored (0 for a row of NaNs). The default reads the rows back; a device backend
    /// reduces on the device and brings back only the ids.
    fn argmax(&self, x: &Self::Buf) -> Result<Vec<u32>> {
        let (rows, cols) = self.buf_shape(x);
        let mut host = vec![0f32; rows * cols];
        self.read(x, 0, rows, &mut host)?;
        Ok(host.chunks(cols.max(1)).map(argmax_host).collect())
    }

    /// The `k` best of each row as (index, value), highest first, the lowest index among
    /// equals, NaN left out (fewer where the row has fewer), after `pen` has changed the
    /// listed values of every row: top-k sampling's candidates, from which the rest of the
    /// sampling chain is run on the host. The default reads the rows back; a device backend
    /// selects on the device and brings back only the k pairs (and may leave the penalized
    /// values in `x`).
    fn top_k(&self, x: &Self::Buf, k: usize, pen: &Penalties) -> Result<Vec<Vec<(u32, f32)>>> {
        let (rows, cols) = self.buf_shape(x);
        let mut host = vec![0f32; rows * cols];
        self.read(x, 0, rows, &mut host)?;
        Ok(top_k_rows_host(&mut host, cols, k, pen))
    }

    /// The last row of `x` as the candidates of a sampling chain without a top-k: the `k`
    /// best after `pen` as `top_k` gives them, with the row's largest value and Σ exp(v −
    /// max) over its values that are not NaN, where `enough(top, max, sum)` says those
    /// settle the draw; else the whole row after `pen`. The default reads the row back and
    /// returns it whole; a device backend selects and sums on the device and reads the
    /// row back only where `enough` says no.
    fn candidates(
        &self,
        x: &Self::Buf,
        k: usize,
        pen: &Penalties,
        enough: &Settles<'_>,
    ) -> Result<Candidates> {
        let _ = (k, enough);
        let (rows, cols) = self.buf_shape(x);
        let mut row = vec![0f32; cols];
        if rows > 0 {
            self.read(x, rows - 1, 1, &mut row)?;
        }
        pen.apply(&mut row);
        Ok(Candidates::All(row))
    }

    /// Brackets a decode step: `tokens` (one, or a few: the verify forward of a speculative
    /// block) at positions from `kv_len(kv)`. Between `step_begin` and `step_end` the
    /// model's calls are the same every step of that many tokens, so a device backend may
    /// record them once and replay the recording (CUDA graphs). The defaults do nothing.
    /// `step_end` is called whether the step succeeded or not.
    fn step_begin(&self, _kv: &Self::Kv, _tokens: &[u32]) -> Result<()> {
        Ok(())
    }
    fn step_end(&self) {}

    /// `dst[0, :] = src[row, :]`, dst reshaped to `[1, cols]`.
    fn copy_row(&self, src: &Self::Buf, row: usize, dst: &mut Self::Buf) -> Result<()>;

    /// `out[i, :] = table[ids[i], :] * scale`, dequantized.
    fn embed(&self, table: &Self::Mat, ids: &[u32], scale: f32, out: &mut Self::Buf) -> Result<()>;
    /// `out[r, :] = W · x[r, :]` for every row r.
    fn matmul(&self, w: &Self::Mat, x: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// `outs[i][r, :] = ws[i] · x[r, :]`: several matrices that read one input (q/k/v,
    /// gate/up). The default runs `matmul` on each; a device backend may run them as one
    /// launch, which also keeps the GPU busy through a matrix of a few rows.
    fn matmul_multi(
        &self,
        ws: &[&Self::Mat],
        x: &Self::Buf,
        outs: &mut [&mut Self::Buf],
    ) -> Result<()> {
        if ws.len() != outs.len() {
            return Err(BackendError::Shape {
                op: "matmul_multi",
                detail: format!("{} matrices, {} outputs", ws.len(), outs.len()),
            });
        }
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, x, o)?;
        }
        Ok(())
    }
    /// A model calls this at load for each group of matrices it will pass to one
    /// `matmul_multi`, so a device backend can build what that group needs (the CUDA
    /// backend: the kernels of a group of two weight formats) before the first reply.
    fn prepare_multi(&self, _ws: &[&Self::Mat]) -> Result<()> {
        Ok(())
    }
    /// A model file's weight formats, before its matrices load: a backend that builds
    /// kernels per format (CUDA, by NVRTC on a first run) may build them all at once.
    fn prepare_formats(&self, _types: &[GgmlType]) -> Result<()> {
        Ok(())
    }
    /// A hint that the next GEMV reads `ws` (in this order): a device backend may have the
    /// small kernel before it (the residual add and norm, the GLU, the DeltaNet step) ask
    /// its cache for their first bytes. Results do not depend on it.
    fn prefetch(&self, _ws: &[&Self::Mat]) -> Result<()> {
        Ok(())
    }
    /// A hint that the next `delta_net` reads recurrent layer `layer`'s state in `kv`: a
    /// device backend may have the GEMV before it (the layer's input projections) ask its
    /// cache for it. Results do not depend on it.
    fn prefetch_rec(&self, _kv: &Self::Kv, _layer: usize) -> Result<()> {
        Ok(())
    }
    /// `x += y`, then `out = rms_norm(x, w)`: a residual add and the norm that reads the
    /// sum, which a device backend may fuse.
    fn add_rms_norm(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        self.add(x, y)?;
        self.rms_norm(x, w, eps, out)
    }
    /// `add_rms_norm(x, y, w, eps, out)`, then `matmul_multi(ws, out, outs)`: the norm and the
    /// projections that read it in one call, so a device backend may finish the norm inside
    /// the GEMVs (the CUDA backend for a decode row of Q4_K). `out` is written either way.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm_matmul(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Buf,
        ws: &[&Self::Mat],
        outs: &mut [&mut Self::Buf],
    ) -> Result<()> {
        self.add_rms_norm(x, y, w, eps, out)?;
        self.matmul_multi(ws, out, outs)
    }
    /// `add_rms_norm(x, y, w, eps, out)`, `prefetch(next)` (the matrices the GEMV after the
    /// GLU reads), then `matmul_glu(gate, up, out, act, g, u)`, as `add_rms_norm_matmul`.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm_matmul_glu(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Buf,
        (gate, up, next): (&Self::Mat, &Self::Mat, &[&Self::Mat]),
        act: GluAct,
        g: &mut Self::Buf,
        u: &mut Self::Buf,
    ) -> Result<()> {
        self.add_rms_norm(x, y, w, eps, out)?;
        self.prefetch(next)?;
        self.matmul_glu(gate, up, out, act, g, u)
    }
    /// `y = rms_norm(y, w_y)` in place, then `add_rms_norm(x, y, w, out)`: Gemma's post-norm
    /// of a block's output, the residual add and the next norm (whole rows).
    fn norm_add_rms_norm(
        &self,
        x: &mut Self::Buf,
        y: &mut Self::Buf,
        w_y: &Self::Vector,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        self.rms_norm_inplace(y, w_y, eps)?;
        self.add_rms_norm(x, y, w, eps, out)
    }
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
    /// `g = act(W_gate · x) ⊙ (W_up · x)`, `u` = W_up · x (scratch): a gated MLP's
    /// projections and its GLU, which a device backend may run as one launch.
    fn matmul_glu(
        &self,
        gate: &Self::Mat,
        up: &Self::Mat,
        x: &Self::Buf,
        act: GluAct,
        g: &mut Self::Buf,
        u: &mut Self::Buf,
    ) -> Result<()> {
        self.matmul_multi(&[gate, up], x, &mut [&mut *g, &mut *u])?;
        self.glu(g, u, act)
    }
    /// The attention input: per-head RMSNorm of q and k (each when its weight is given),
    /// then RoPE of q with `rope_q` and of k with `rope_k` (`rope` on each), in one call
    /// that a device backend may run as one launch.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        q_norm: Option<&Self::Vector>,
        k_norm: Option<&Self::Vector>,
        eps: f32,
        head_dim: usize,
        pos0: usize,
        rope_q: &Rope,
        rope_k: &Rope,
        freq_factors: Option<&Self::Vector>,
    ) -> Result<()> {
        if let Some(w) = q_norm {
            self.rms_norm_inplace(q, w, eps)?;
        }
        if let Some(w) = k_norm {
            self.rms_norm_inplace(k, w, eps)?;
        }
        self.rope(q, head_dim, pos0, rope_q, freq_factors)?;
        self.rope(k, head_dim, pos0, rope_k, freq_factors)
    }
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
    /// One attention layer from its raw projections: q `[rows, n_heads·hd]`, or with `gated`
    /// `[rows, n_heads·2hd]` (each head's query, then its output gate); k, v `[rows,
    /// n_kv·hd]`. `qk_norm_rope` of the queries and k (k in place; q too where not gated),
    /// `attention` into `out` (`[rows, n_heads·hd]`), then with `gated` out ·= sigmoid(gate).
    /// A device backend may run it in fewer launches.
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        pos0: usize,
        q: &mut Self::Buf,
        gated: bool,
        k: &mut Self::Buf,
        v: &Self::Buf,
        prep: &QkPrep<Self::Vector>,
        attn: &Attn,
        out: &mut Self::Buf,
    ) -> Result<()> {
        attention_block_ops(self, kv, layer, pos0, q, gated, k, v, prep, attn, out)
    }
    /// Record that positions `..new_len` are now valid (after all layers stored them).
    fn kv_commit(&self, kv: &mut Self::Kv, new_len: usize) -> Result<()>;

    // ---- Hybrid (Gated DeltaNet) and MoE models. The defaults report "not implemented" so
    // a backend can add them when it needs those models.

    /// Gives the cache zeroed recurrent state. From then on `kv_truncate` can only go to 0
    /// (a reset) or stay put; `kv_snapshot`/`kv_restore` roll back instead.
    fn rec_alloc(&self, _kv: &mut Self::Kv, _shape: &RecShape) -> Result<()> {
        Err(not_implemented("rec_alloc", self))
    }
    /// A copy of what a later `kv_restore` needs to return to this point: the position and
    /// the recurrent state (attention entries are append-only, a truncate restores them).
    fn kv_snapshot(&self, _kv: &Self::Kv) -> Result<Self::Kv> {
        Err(not_implemented("kv_snapshot", self))
    }
    /// Returns `kv` to a snapshot taken from it at a position ≤ its current one.
    fn kv_restore(&self, _kv: &mut Self::Kv, _snap: &Self::Kv) -> Result<()> {
        Err(not_implemented("kv_restore", self))
    }
    /// Depthwise causal conv over the rows of `x` (`[rows, channels]`, in place) continuing
    /// recurrent layer `layer`'s window, then SiLU. `w` is `[channels, kernel]` (oldest tap
    /// first). The window advances by `rows`.
    fn ssm_conv(
        &self,
        _kv: &mut Self::Kv,
        _layer: usize,
        _x: &mut Self::Buf,
        _w: &Self::Vector,
    ) -> Result<()> {
        Err(not_implemented("ssm_conv", self))
    }
    /// The gated delta rule of recurrent layer `layer` over the rows of `qkv`, continuing its
    /// state: q, k L2-normalised (q also by `1/√d_k`), decay `g = a_neg ⊙ softplus(alpha + dt_bias)`,
    /// `β = sigmoid(beta)`; `out` is `[rows, n_v·d_v]`. `alpha`, `beta` are `[rows, n_v]`,
    /// `a_neg` (= −exp(A_log)) and `dt_bias` are `[n_v]`. Prefill uses a chunked form.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta(
        &self,
        _kv: &mut Self::Kv,
        _layer: usize,
        _qkv: &Self::Buf,
        _alpha: &Self::Buf,
        _beta: &Self::Buf,
        _a_neg: &Self::Vector,
        _dt_bias: &Self::Vector,
        _net: &DeltaNet,
        _out: &mut Self::Buf,
    ) -> Result<()> {
        Err(not_implemented("gated_delta", self))
    }
    /// `x = RMS(x) ⊙ w ⊙ silu(z)` over groups of `w.len()` values (gated RMSNorm).
    fn rms_norm_gated(
        &self,
        _x: &mut Self::Buf,
        _w: &Self::Vector,
        _z: &Self::Buf,
        _eps: f32,
    ) -> Result<()> {
        Err(not_implemented("rms_norm_gated", self))
    }
    /// A Gated DeltaNet layer between its projections and `ssm_out`: `ssm_conv` of `qkv`
    /// with `conv`, `gated_delta` into `out`, then `rms_norm_gated(out, norm, z, eps)`.
    /// `qkv` is left in an unspecified state. A device backend may run a decode row as one
    /// kernel.
    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        qkv: &mut Self::Buf,
        conv: &Self::Vector,
        alpha: &Self::Buf,
        beta: &Self::Buf,
        a_neg: &Self::Vector,
        dt_bias: &Self::Vector,
        net: &DeltaNet,
        norm: &Self::Vector,
        z: &Self::Buf,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        self.ssm_conv(kv, layer, qkv, conv)?;
        self.gated_delta(kv, layer, qkv, alpha, beta, a_neg, dt_bias, net, out)?;
        self.rms_norm_gated(out, norm, z, eps)
    }
    /// `x *= sigmoid(gate)` elementwise (same shape).
    fn mul_sigmoid(&self, _x: &mut Self::Buf, _gate: &Self::Buf) -> Result<()> {
        Err(not_implemented("mul_sigmoid", self))
    }
    /// Strided column copy: `dst[r, b·width + i] = src[r, col0 + b·stride + i]` for
    /// `b < n_blocks`, `i < width`; dst is reshaped to `[rows, n_blocks·width]`.
    fn copy_cols(
        &self,
        _src: &Self::Buf,
        _col0: usize,
        _width: usize,
        _stride: usize,
        _n_blocks: usize,
        _dst: &mut Self::Buf,
    ) -> Result<()> {
        Err(not_implemented("copy_cols", self))
    }
    /// `out[r, :] = W[row0 .. row0 + n_rows] · x[r, :]`: one expert of a stacked expert
    /// tensor, multiplied in its packed format.
    fn matmul_rows(
        &self,
        _w: &Self::Mat,
        _row0: usize,
        _n_rows: usize,
        _x: &Self::Buf,
        _out: &mut Self::Buf,
    ) -> Result<()> {
        Err(not_implemented("matmul_rows", self))
    }
    /// `dst[i, :] = src[rows[i], :]`.
    fn gather_rows(&self, _src: &Self::Buf, _rows: &[u32], _dst: &mut Self::Buf) -> Result<()> {
        Err(not_implemented("gather_rows", self))
    }
    /// `dst[rows[i], :] += scale[i] · src[i, :]`.
    fn scatter_add_rows(
        &self,
        _dst: &mut Self::Buf,
        _rows: &[u32],
        _scale: &[f32],
        _src: &Self::Buf,
    ) -> Result<()> {
        Err(not_implemented("scatter_add_rows", self))
    }
}

/// Index of the highest value, the lowest among equals, NaN ignored; 0 when there is none
/// (the sampler's greedy rule).
pub fn argmax_host(v: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in v.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// `Backend::candidates`'s test: whether a row's k best (index, value) with its largest
/// value and Σ exp(v − max) settle the draw.
pub type Settles<'a> = dyn Fn(&[(u32, f32)], f32, f32) -> bool + 'a;

/// What `Backend::candidates` brings back of a row of logits.
#[derive(Clone, Debug, PartialEq)]
pub enum Candidates {
    /// The k best (index, value) after the penalties, highest first, the lowest index among
    /// equals, NaN left out (fewer where the row has fewer); the row's largest value that is
    /// not NaN, and Σ exp(v − max) over those values (−∞ and 0 for a row of NaNs).
    Top {
        top: Vec<(u32, f32)>,
        max: f32,
        sum: f32,
    },
    /// The whole row after the penalties.
    All(Vec<f32>),
}

/// `Candidates::Top`'s max and sum of a row on the host (f32, in index order, as the
/// sampler's softmax sums).
pub fn softmax_sum_host(v: &[f32]) -> (f32, f32) {
    let max = v
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum = v
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| (x - max).exp())
        .sum();
    (max, sum)
}

/// Repetition penalties as llama.cpp's `penalties` sampler applies them to a row of logits
/// before top-k: each listed token's logit l becomes `(l ≤ 0 ? l · repeat : l / repeat) −
/// sub` (sub = count · frequency + presence). Empty: nothing changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Penalties {
    pub repeat: f32,
    /// (token, sub), each token once.
    pub tokens: Vec<(u32, f32)>,
}

impl Penalties {
    /// The host's form (the reference for a device's): tokens past the row are skipped.
    pub fn apply(&self, logits: &mut [f32]) {
        for &(tok, sub) in &self.tokens {
            if let Some(l) = logits.get_mut(tok as usize) {
                if *l <= 0.0 {
                    *l *= self.repeat;
                } else {
                    *l /= self.repeat;
                }
                *l -= sub;
            }
        }
    }
}

/// The `k` best values of `v` as (index, value): highest first, the lowest index among
/// equals (−0 equals +0), NaN left out. One compare against the k-th best for most values.
pub fn top_k_host(v: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for (i, &x) in v.iter().enumerate() {
        // Indices rise, so a value equal to the k-th best does not beat it; NaN fails too.
        if best.len() == k && !best.last().is_some_and(|l| x > l.1) || x.is_nan() {
            continue;
        }
        // After every kept value at least as high.
        let j = best.partition_point(|&(_, y)| y >= x);
        best.insert(j, (i as u32, x));
        best.truncate(k);
    }
    best
}

/// `Backend::top_k` of rows `[rows, cols]` read back to the host (penalized in place).
pub fn top_k_rows_host(
    host: &mut [f32],
    cols: usize,
    k: usize,
    pen: &Penalties,
) -> Vec<Vec<(u32, f32)>> {
    host.chunks_mut(cols.max(1))
        .map(|r| {
            pen.apply(r);
            top_k_host(r, k)
        })
        .collect()
}

fn not_implemented<B: Backend + ?Sized>(op: &str, be: &B) -> BackendError {
    BackendError::Other(format!("{op} is not implemented on {}", be.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_host_order() {
        let v = [1.0, f32::NAN, 3.0, 3.0, -1.0, f32::INFINITY, 0.0, -0.0];
        assert_eq!(
            top_k_host(&v, 4),
            vec![(5, f32::INFINITY), (2, 3.0), (3, 3.0), (0, 1.0)]
        );
        // −0 ties +0: the lower index first.
        assert_eq!(top_k_host(&v, 6)[4..], [(6, 0.0), (7, -0.0)]);
        assert_eq!(top_k_host(&v, 100).len(), 7);
        assert!(top_k_host(&v, 0).is_empty());
    }

    #[test]
    fn scatter_add_rows_contract() {
        let ok = check_scatter_add_rows(&[0, 3, 3], &[1.0; 3], (3, 8), (4, 8));
        assert!(ok.is_ok());
        for (rows, scale, src, dst) in [
            (&[0u32, 4][..], &[1.0f32; 2][..], (2, 8), (4, 8)), // row past dst
            (&[0, 1], &[1.0; 3], (2, 8), (4, 8)),               // scale count
            (&[0, 1], &[1.0; 2], (3, 8), (4, 8)),               // src row count
            (&[0, 1], &[1.0; 2], (2, 8), (4, 7)),               // widths differ
        ] {
            let e = check_scatter_add_rows(rows, scale, src, dst).unwrap_err();
            assert!(matches!(
                e,
                BackendError::Shape {
                    op: "scatter_add_rows",
                    ..
                }
            ));
        }
    }
    #[test]
    fn kv_commit_and_restore_contracts() {
        assert!(check_kv_commit(16, 16).is_ok());
        assert!(check_kv_commit(17, 16).is_err());
        let a = KvShape {
            n_layers: 2,
            n_kv_heads: 1,
            head_dim: 8,
            n_ctx: 16,
            ty: KvType::F16,
        };
        let b = KvShape {
            n_ctx: 32,
            ..a.clone()
        };
        let ok = check_kv_restore::<u8>((5, &a, None), (3, &a, None));
        assert!(ok.is_ok());
        assert!(check_kv_restore((5, &a, Some(&1)), (5, &a, Some(&1))).is_ok());
        for e in [
            check_kv_restore::<u8>((5, &a, None), (6, &a, None)), // ahead of the cache
            check_kv_restore::<u8>((5, &a, None), (3, &b, None)), // another shape
            check_kv_restore((5, &a, Some(&1)), (3, &a, None)),   // state missing
            check_kv_restore((5, &a, Some(&1)), (3, &a, Some(&2))), // other state shape
        ] {
            assert!(matches!(
                e,
                Err(BackendError::Shape {
                    op: "kv_restore",
                    ..
                })
            ));
        }
    }
}
