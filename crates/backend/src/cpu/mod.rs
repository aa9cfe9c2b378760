//! The CPU backend: packed-weight matmul kernels per format and instruction set (selected
//! once at start-up from the CPU's features), a persistent thread pool, and the float ops
//! of the forward pass (norms, RoPE, GLU, attention over an f16 or q8_0 KV cache).

mod attend_ggml;
mod attention;
pub mod gated_delta;
pub mod kernels;
mod ops;

#[cfg(target_arch = "x86_64")]
mod avx2_panels;
#[cfg(target_arch = "x86_64")]
mod avx2_tiles;
#[cfg(target_arch = "x86_64")]
mod avx512_lanes;
#[cfg(target_arch = "x86_64")]
mod avx512_tiles;
mod tiles;

// Unquantized and legacy 32-weight block formats.
mod float;
mod q4_0;
mod q4_1;
mod q5_0;
mod q5_1;
mod q8_0;
mod q8_1;

// K-quants (256-weight super-blocks) and their Q8_K activations.
mod q2_k;
mod q3_k;
mod q4_k;
mod q5_k;
mod q6_k;
mod q8_k;

// Low-bit formats (issue 5).
mod iq2_xs;
mod iq4_nl;
mod iq4_xs;
mod iq_grid;
mod ptq1_0;
mod q1_0;
mod q2_0;
mod q8_0_wide;
mod tq1_0;
mod tq2_0;
// MLX affine packs (codes, scales, biases in three tensors) and Hadamard-rotated inputs.
pub mod hadamard;
mod mlx_affine;

pub mod pool;
pub mod simd;

use std::sync::Mutex;

use neagari_quant::GgmlType;

use crate::{
    Attn, Backend, BackendError, DeltaNet, GluAct, HostTensor, KvShape, KvType, RecShape, Result,
    Rope, SharedBytes,
};
use gated_delta::CpuRec;
use kernels::{kernel_for, CpuFeatures, MatKernel};
use pool::{SyncPtr, ThreadPool};

/// Options of the CPU backend.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    pub threads: usize,
    /// Use the portable kernels even where SIMD ones exist (tests, debugging).
    pub scalar_only: bool,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: default_threads(),
            scalar_only: false,
        }
    }
}

/// Physical cores are what matter for memory-bound decode; without a reliable count, use
/// the available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

pub struct CpuBackend {
    pool: ThreadPool,
    feats: CpuFeatures,
    scalar_only: bool,
    /// Scratch for quantized activations, reused across matmuls.
    act_scratch: Mutex<Vec<u8>>,
}

impl CpuBackend {
    pub fn new(opts: &CpuOptions) -> Self {
        CpuBackend {
            pool: ThreadPool::new(opts.threads),
            feats: CpuFeatures::detect(),
            scalar_only: opts.scalar_only,
            act_scratch: Mutex::new(Vec::new()),
        }
    }

    pub fn features(&self) -> CpuFeatures {
        self.feats
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }
}

/// f32 activations `[rows, cols]`, row-major.
#[derive(Clone, Debug, Default)]
pub struct CpuBuf {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl CpuBuf {
    fn reshape(&mut self, rows: usize, cols: usize) {
        self.rows = rows;
        self.cols = cols;
        self.data.resize(rows * cols, 0.0);
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A packed matrix `[rows = out, cols = in]` read in place from the file's bytes.
pub struct CpuMat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    bytes: SharedBytes,
    kernel: Option<MatKernel>,
    /// MLX affine codes/scales/biases (then `bytes` is empty and `kernel` is `None`).
    affine: Option<mlx_affine::CpuAffine>,
    /// Input rotation of a Hadamard-rotated matrix.
    rotation: Option<crate::HadamardRotation>,
}

impl CpuMat {
    fn row_bytes_of(&self, r: usize) -> &[u8] {
        &self.bytes.as_slice()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Which kernel implementation multiplies this matrix ("avx512vnni", "avx2", "scalar", or
    /// "none").
    pub fn isa(&self) -> &'static str {
        if let Some(a) = &self.affine {
            return a.isa;
        }
        self.kernel.map(|k| k.isa).unwrap_or("none")
    }
}

/// KV cache of one sequence. Per layer, K and V are `[n_kv_heads, n_ctx, head_dim]` so a
/// head's positions are contiguous; f16 stores 2 bytes per value, q8_0 34 bytes per 32.
pub struct CpuKv {
    shape: KvShape,
    len: usize,
    /// Bytes per stored head vector.
    vec_bytes: usize,
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
    /// Gated DeltaNet state of hybrid models (`rec_alloc`). A snapshot is a `CpuKv` with
    /// this and `len` only.
    rec: Option<CpuRec>,
}

impl CpuKv {
    /// Bytes held: the K and V rows of every layer and the recurrent state.
    pub fn bytes(&self) -> usize {
        let rows: usize = self.k.iter().chain(&self.v).map(Vec::len).sum();
        rows + self.rec_bytes()
    }

    /// Bytes of recurrent state (0 without).
    pub fn rec_bytes(&self) -> usize {
        self.rec.as_ref().map_or(0, CpuRec::bytes)
    }

    fn offset(&self, head: usize, pos: usize) -> usize {
        (head * self.shape.n_ctx + pos) * self.vec_bytes
    }
}

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

impl Backend for CpuBackend {
    type Buf = CpuBuf;
    type Mat = CpuMat;
    type Vector = Vec<f32>;
    type Kv = CpuKv;

    fn name(&self) -> String {
        let isa = if self.scalar_only {
            "scalar"
        } else if self.feats.has_avx512vnni() {
            // Decode GEMVs of the legacy formats; everything else runs the AVX2 kernels.
            "avx2+avx512vnni"
        } else if self.feats.has_avx2() {
            "avx2"
        } else {
            "scalar"
        };
        format!("cpu ({} threads, {isa})", self.pool.n_threads())
    }

    fn load_mat(&self, t: &HostTensor) -> Result<CpuMat> {
        let (rows, cols) = match t.shape.as_slice() {
            [r, c] => (*r, *c),
            [c] => (1, *c),
            s => {
                return Err(shape_err(
                    "load_mat",
                    format!("{}: expected 2-D, got {s:?}", t.name),
                ))
            }
        };
        let row_bytes = t.ty.row_bytes(cols).ok_or_else(|| {
            shape_err(
                "load_mat",
                format!("{}: row of {cols} is not whole {} blocks", t.name, t.ty),
            )
        })?;
        if row_bytes * rows != t.bytes.len() {
            return Err(shape_err(
                "load_mat",
                format!(
                    "{}: {} bytes for {rows}x{cols} {}",
                    t.name,
                    t.bytes.len(),
                    t.ty
                ),
            ));
        }
        Ok(CpuMat {
            ty: t.ty,
            rows,
            cols,
            row_bytes,
            bytes: t.bytes.clone(),
            kernel: kernel_for(t.ty, &self.feats, self.scalar_only),
            affine: None,
            rotation: None,
        })
    }

    fn load_weight(&self, w: &crate::WeightDesc) -> Result<CpuMat> {
        let mut m = match &w.data {
            crate::WeightData::Ggml(t) => self.load_mat(t)?,
            crate::WeightData::MlxAffine(a) => {
                let (rows, cols) = match w.shape.as_slice() {
                    [r, c] => (*r, *c),
                    s => {
                        return Err(shape_err(
                            "load_weight",
                            format!("{}: expected 2-D, got {s:?}", w.name),
                        ))
                    }
                };
                let aff = mlx_affine::CpuAffine::new(
                    a,
                    &w.name,
                    rows,
                    cols,
                    &self.feats,
                    self.scalar_only,
                )?;
                CpuMat {
                    // Not a ggml type: the bytes are MLX codes; `affine` describes them.
                    ty: GgmlType::I32,
                    rows,
                    cols,
                    row_bytes: 0,
                    bytes: SharedBytes::from_vec(Vec::new()),
                    kernel: None,
                    affine: Some(aff),
                    rotation: None,
                }
            }
        };
        if let Some(r) = &w.rotation {
            hadamard::check(r, m.cols)
                .map_err(|e| shape_err("load_weight", format!("{}: {e}", w.name)))?;
            m.rotation = Some(r.clone());
        }
        Ok(m)
    }

    fn load_vector(&self, t: &HostTensor) -> Result<Vec<f32>> {
        let n = t.n_elements();
        let mut out = vec![0f32; n];
        neagari_quant::dequantize_row(t.ty, t.bytes.as_slice(), &mut out)?;
        Ok(out)
    }

    fn mat_bytes(&self, m: &CpuMat) -> usize {
        m.bytes.len() + m.affine.as_ref().map_or(0, |a| a.bytes())
    }

    fn buf(&self, rows: usize, cols: usize) -> Result<CpuBuf> {
        Ok(CpuBuf {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        })
    }

    fn buf_shape(&self, b: &CpuBuf) -> (usize, usize) {
        (b.rows, b.cols)
    }

    fn write(&self, dst: &mut CpuBuf, host: &[f32], rows: usize, cols: usize) -> Result<()> {
        if host.len() != rows * cols {
            return Err(shape_err(
                "write",
                format!("{} values for {rows}x{cols}", host.len()),
            ));
        }
        dst.reshape(rows, cols);
        dst.data.copy_from_slice(host);
        Ok(())
    }

    fn read(&self, src: &CpuBuf, row0: usize, n: usize, host: &mut [f32]) -> Result<()> {
        if row0 + n > src.rows || host.len() != n * src.cols {
            return Err(shape_err(
                "read",
                format!("rows {row0}+{n} of {}", src.rows),
            ));
        }
        host.copy_from_slice(&src.data[row0 * src.cols..(row0 + n) * src.cols]);
        Ok(())
    }

    fn copy_row(&self, src: &CpuBuf, row: usize, dst: &mut CpuBuf) -> Result<()> {
        if row >= src.rows {
            return Err(shape_err("copy_row", format!("row {row} of {}", src.rows)));
        }
        dst.reshape(1, src.cols);
        dst.data.copy_from_slice(src.row(row));
        Ok(())
    }

    fn embed(&self, table: &CpuMat, ids: &[u32], scale: f32, out: &mut CpuBuf) -> Result<()> {
        out.reshape(ids.len(), table.cols);
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= table.rows {
                return Err(shape_err(
                    "embed",
                    format!("token id {id} ≥ vocab {}", table.rows),
                ));
            }
            let dst = &mut out.data[i * table.cols..(i + 1) * table.cols];
            match &table.affine {
                Some(a) => a.dequantize_row(id, table.cols, dst)?,
                None => neagari_quant::dequantize_row(table.ty, table.row_bytes_of(id), dst)?,
            }
            if let Some(r) = &table.rotation {
                hadamard::unrotate_row(dst, r);
            }
            if scale != 1.0 {
                dst.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn matmul(&self, w: &CpuMat, x: &CpuBuf, out: &mut CpuBuf) -> Result<()> {
        if x.cols != w.cols {
            return Err(shape_err(
                "matmul",
                format!("x has {} cols, W is {}x{}", x.cols, w.rows, w.cols),
            ));
        }
        let rotated;
        let x = match &w.rotation {
            Some(r) => {
                let mut xr = x.clone(); // [rows, in], rotated like the stored weight rows
                for row in xr.data.chunks_exact_mut(xr.cols) {
                    hadamard::rotate_input(row, r);
                }
                rotated = xr;
                &rotated
            }
            None => x,
        };
        if let Some(a) = &w.affine {
            out.reshape(x.rows, w.rows);
            a.matmul(&self.pool, w.rows, w.cols, &x.data, x.rows, &mut out.data);
            return Ok(());
        }
        let kern = w.kernel.ok_or(BackendError::NoKernel {
            op: "matmul",
            device: "cpu",
            ty: w.ty,
        })?;
        out.reshape(x.rows, w.rows);
        let k = w.cols;
        let na = x.rows;
        let act_row = kern.act.row_bytes(k);
        let mut scratch = self.act_scratch.lock().unwrap_or_else(|e| e.into_inner());
        scratch.resize(act_row * na, 0);
        // Quantize the activation rows once; they are reused by every weight row.
        {
            let sp = SyncPtr(scratch.as_mut_ptr());
            let quant = kern.quantize_act;
            let xs = &x.data;
            let n_tasks = if na >= 4 { na } else { 1 };
            self.pool.run(n_tasks, |t| {
                let rows = if n_tasks == 1 { 0..na } else { t..t + 1 };
                for r in rows {
                    // SAFETY: each task writes only activation row r's bytes.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(sp.get().add(r * act_row), act_row)
                    };
                    quant(&xs[r * k..(r + 1) * k], dst);
                }
            });
        }
        let act: &[u8] = &scratch;
        // Split the weight rows into chunks; many chunks per thread balance the load.
        let n_out = w.rows;
        let threads = self.pool.n_threads();
        let chunk = chunk_rows(n_out, threads, na);
        let n_chunks = n_out.div_ceil(chunk);
        let op = SyncPtr(out.data.as_mut_ptr());
        let wb = w.bytes.as_slice();
        let rb = w.row_bytes;
        let gemm = kern.gemm;
        let out_len = out.data.len();
        self.pool.run(n_chunks, |c| {
            let j0 = c * chunk;
            let nw = chunk.min(n_out - j0);
            // SAFETY: chunk c writes only columns j0..j0+nw of every output row; the view
            // starts at column j0 and the kernel indexes i * n_out + j with j < nw.
            let dst = unsafe { std::slice::from_raw_parts_mut(op.get().add(j0), out_len - j0) };
            gemm(k, &wb[j0 * rb..(j0 + nw) * rb], nw, act, na, dst, n_out);
        });
        Ok(())
    }

    fn rms_norm(&self, x: &CpuBuf, w: &Vec<f32>, eps: f32, out: &mut CpuBuf) -> Result<()> {
        out.reshape(x.rows, x.cols);
        out.data.copy_from_slice(&x.data);
        self.rms_norm_inplace(out, w, eps)
    }

    fn rms_norm_inplace(&self, x: &mut CpuBuf, w: &Vec<f32>, eps: f32) -> Result<()> {
        let g = w.len();
        if g == 0 || !x.cols.is_multiple_of(g) {
            return Err(shape_err(
                "rms_norm",
                format!("{} cols, weight of {g}", x.cols),
            ));
        }
        self.par_chunks(&mut x.data, g, |_, chunk| {
            for group in chunk.chunks_exact_mut(g) {
                ops::rms_norm(group, w, eps);
            }
        });
        Ok(())
    }

    fn add(&self, x: &mut CpuBuf, y: &CpuBuf) -> Result<()> {
        if x.data.len() != y.data.len() {
            return Err(shape_err(
                "add",
                format!("{}x{} + {}x{}", x.rows, x.cols, y.rows, y.cols),
            ));
        }
        let y = &y.data;
        self.par_chunks(&mut x.data, 1, |u0, chunk| {
            for (a, b) in chunk.iter_mut().zip(&y[u0..]) {
                *a += b;
            }
        });
        Ok(())
    }

    fn add_bias(&self, x: &mut CpuBuf, b: &Vec<f32>) -> Result<()> {
        if b.len() != x.cols {
            return Err(shape_err(
                "add_bias",
                format!("{} cols, bias of {}", x.cols, b.len()),
            ));
        }
        for row in x.data.chunks_exact_mut(x.cols) {
            for (a, c) in row.iter_mut().zip(b) {
                *a += c;
            }
        }
        Ok(())
    }

    fn glu(&self, gate: &mut CpuBuf, up: &CpuBuf, act: GluAct) -> Result<()> {
        if gate.data.len() != up.data.len() {
            return Err(shape_err(
                "glu",
                format!("{} vs {} values", gate.data.len(), up.data.len()),
            ));
        }
        let up = &up.data;
        self.par_chunks(&mut gate.data, 1, |u0, chunk| {
            let up = &up[u0..u0 + chunk.len()];
            match act {
                GluAct::Silu => ops::swiglu(chunk, up),
                GluAct::GeluTanh => ops::geglu(chunk, up),
            }
        });
        Ok(())
    }

    fn softcap(&self, x: &mut CpuBuf, cap: f32) -> Result<()> {
        for v in x.data.iter_mut() {
            *v = cap * (*v / cap).tanh();
        }
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CpuBuf,
        head_dim: usize,
        pos0: usize,
        rope: &Rope,
        freq_factors: Option<&Vec<f32>>,
    ) -> Result<()> {
        if head_dim == 0
            || !x.cols.is_multiple_of(head_dim)
            || rope.dims > head_dim
            || !rope.dims.is_multiple_of(2)
        {
            return Err(shape_err(
                "rope",
                format!("{} cols, head_dim {head_dim}, dims {}", x.cols, rope.dims),
            ));
        }
        if let Some(ff) = freq_factors {
            if ff.len() < rope.dims / 2 {
                return Err(shape_err(
                    "rope",
                    format!("{} freq factors for {} dims", ff.len(), rope.dims),
                ));
            }
        }
        let ff = freq_factors.map(|v| v.as_slice());
        let cols = x.cols;
        self.par_chunks(&mut x.data, cols, |r0, chunk| {
            let mut cache = vec![0f32; rope.dims];
            for (r, row) in chunk.chunks_exact_mut(cols).enumerate() {
                ops::rope_cache(rope, (pos0 + r0 + r) as f32, ff, &mut cache);
                for head in row.chunks_exact_mut(head_dim) {
                    ops::rope_apply(head, &cache, rope.dims, rope.neox);
                }
            }
        });
        Ok(())
    }

    fn kv_alloc(&self, s: &KvShape) -> Result<CpuKv> {
        let vec_bytes = match s.ty {
            KvType::F16 => s.head_dim * 2,
            KvType::F32 => s.head_dim * 4,
            KvType::Q8_0 => {
                if !s.head_dim.is_multiple_of(32) {
                    return Err(shape_err(
                        "kv_alloc",
                        format!("q8_0 KV needs head_dim % 32 == 0, got {}", s.head_dim),
                    ));
                }
                s.head_dim / 32 * 34
            }
        };
        let per_layer = s
            .n_kv_heads
            .checked_mul(s.n_ctx)
            .and_then(|v| v.checked_mul(vec_bytes))
            .ok_or_else(|| BackendError::OutOfMemory("KV cache size overflows".into()))?;
        let alloc = |n: usize| -> Result<Vec<u8>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n)
                .map_err(|_| BackendError::OutOfMemory(format!("KV cache layer of {n} bytes")))?;
            v.resize(n, 0);
            Ok(v)
        };
        let mut k = Vec::with_capacity(s.n_layers);
        let mut v = Vec::with_capacity(s.n_layers);
        for _ in 0..s.n_layers {
            k.push(alloc(per_layer)?);
            v.push(alloc(per_layer)?);
        }
        Ok(CpuKv {
            shape: s.clone(),
            len: 0,
            vec_bytes,
            k,
            v,
            rec: None,
        })
    }

    fn kv_len(&self, kv: &CpuKv) -> usize {
        kv.len
    }

    fn kv_capacity(&self, kv: &CpuKv) -> usize {
        kv.shape.n_ctx
    }

    fn kv_truncate(&self, kv: &mut CpuKv, len: usize) -> Result<()> {
        if let Some(rec) = kv.rec.as_mut() {
            if len == 0 {
                rec.reset();
            } else if len < kv.len {
                return Err(BackendError::CannotRewind {
                    from: kv.len,
                    to: len,
                });
            }
        }
        kv.len = kv.len.min(len);
        Ok(())
    }

    fn kv_commit(&self, kv: &mut CpuKv, new_len: usize) -> Result<()> {
        crate::check_kv_commit(new_len, kv.shape.n_ctx)?;
        kv.len = new_len;
        Ok(())
    }

    fn attention(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        pos0: usize,
        q: &CpuBuf,
        k: &CpuBuf,
        v: &CpuBuf,
        attn: &Attn,
        out: &mut CpuBuf,
    ) -> Result<()> {
        attention::attention(&self.pool, kv, layer, pos0, q, k, v, attn, out)
    }

    fn rec_alloc(&self, kv: &mut CpuKv, shape: &RecShape) -> Result<()> {
        kv.rec = Some(CpuRec::new(shape)?);
        Ok(())
    }

    fn kv_snapshot(&self, kv: &CpuKv) -> Result<CpuKv> {
        Ok(CpuKv {
            shape: kv.shape.clone(),
            len: kv.len,
            vec_bytes: kv.vec_bytes,
            k: Vec::new(),
            v: Vec::new(),
            rec: kv.rec.clone(),
        })
    }

    fn kv_restore(&self, kv: &mut CpuKv, snap: &CpuKv) -> Result<()> {
        crate::check_kv_restore(
            (kv.len, &kv.shape, kv.rec.as_ref().map(|r| &r.shape)),
            (snap.len, &snap.shape, snap.rec.as_ref().map(|r| &r.shape)),
        )?;
        kv.len = snap.len;
        if let (Some(dst), Some(src)) = (kv.rec.as_mut(), snap.rec.as_ref()) {
            for (d, s) in dst.conv.iter_mut().zip(&src.conv) {
                d.copy_from_slice(s);
            }
            for (d, s) in dst.state.iter_mut().zip(&src.state) {
                d.copy_from_slice(s);
            }
        }
        Ok(())
    }

    fn ssm_conv(&self, kv: &mut CpuKv, layer: usize, x: &mut CpuBuf, w: &Vec<f32>) -> Result<()> {
        let rec = kv
            .rec
            .as_mut()
            .ok_or_else(|| shape_err("ssm_conv", "cache has no recurrent state".into()))?;
        let (ch, kernel) = (rec.shape.conv_channels, rec.shape.conv_kernel);
        if layer >= rec.shape.n_layers || x.cols != ch || w.len() != ch * kernel {
            return Err(shape_err(
                "ssm_conv",
                format!(
                    "layer {layer}, x {}x{}, w {} for {ch}x{kernel}",
                    x.rows,
                    x.cols,
                    w.len()
                ),
            ));
        }
        gated_delta::conv(&mut rec.conv[layer], &mut x.data, x.rows, ch, w, kernel);
        Ok(())
    }

    fn gated_delta(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        qkv: &CpuBuf,
        alpha: &CpuBuf,
        beta: &CpuBuf,
        a_neg: &Vec<f32>,
        dt_bias: &Vec<f32>,
        net: &DeltaNet,
        out: &mut CpuBuf,
    ) -> Result<()> {
        let rec = kv
            .rec
            .as_mut()
            .ok_or_else(|| shape_err("gated_delta", "cache has no recurrent state".into()))?;
        let (nk, nv, dk, dv) = (net.n_k_heads, net.n_v_heads, net.d_k, net.d_v);
        let n = qkv.rows;
        if layer >= rec.shape.n_layers
            || nk == 0
            || nv % nk != 0
            || rec.shape.n_v_heads != nv
            || rec.shape.d_k != dk
            || rec.shape.d_v != dv
            || qkv.cols != 2 * nk * dk + nv * dv
            || alpha.rows != n
            || beta.rows != n
            || alpha.cols != nv
            || beta.cols != nv
            || a_neg.len() != nv
            || dt_bias.len() != nv
        {
            return Err(shape_err(
                "gated_delta",
                format!(
                    "qkv {}x{}, heads {nk}/{nv} of {dk}/{dv}",
                    qkv.rows, qkv.cols
                ),
            ));
        }
        let p = gated_delta::prepare(net, n, &qkv.data, &alpha.data, &beta.data, a_neg, dt_bias);
        out.reshape(n, nv * dv);
        let op = SyncPtr(out.data.as_mut_ptr());
        let sp = SyncPtr(rec.state[layer].as_mut_ptr());
        let out_cols = nv * dv;
        self.pool.run(nv, |h| {
            let kh = gated_delta::key_head(net, h);
            // SAFETY: task h owns value head h's `[d_k, d_v]` block of the layer's state.
            let s = unsafe { std::slice::from_raw_parts_mut(sp.get().add(h * dk * dv), dk * dv) };
            let inp = gated_delta::HeadInputs {
                q: &p.q[kh * n * dk..(kh + 1) * n * dk],
                k: &p.k[kh * n * dk..(kh + 1) * n * dk],
                v: &p.v[h * n * dv..(h + 1) * n * dv],
                g: &p.g[h * n..(h + 1) * n],
                beta: &p.beta[h * n..(h + 1) * n],
            };
            let mut o = vec![0f32; n * dv];
            gated_delta::head(s, &inp, n, dk, dv, true, &mut o);
            for t in 0..n {
                // SAFETY: task h writes only columns h·d_v .. (h+1)·d_v of each row.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(op.get().add(t * out_cols + h * dv), dv)
                };
                dst.copy_from_slice(&o[t * dv..(t + 1) * dv]);
            }
        });
        Ok(())
    }

    fn rms_norm_gated(&self, x: &mut CpuBuf, w: &Vec<f32>, z: &CpuBuf, eps: f32) -> Result<()> {
        let g = w.len();
        if g == 0 || !x.cols.is_multiple_of(g) || z.data.len() != x.data.len() {
            return Err(shape_err(
                "rms_norm_gated",
                format!(
                    "x {}x{}, z {}x{}, weight of {g}",
                    x.rows, x.cols, z.rows, z.cols
                ),
            ));
        }
        for (xg, zg) in x.data.chunks_exact_mut(g).zip(z.data.chunks_exact(g)) {
            gated_delta::rms_norm_gated(xg, w, zg, eps);
        }
        Ok(())
    }

    fn mul_sigmoid(&self, x: &mut CpuBuf, gate: &CpuBuf) -> Result<()> {
        if x.data.len() != gate.data.len() {
            return Err(shape_err(
                "mul_sigmoid",
                format!("{}x{} vs {}x{}", x.rows, x.cols, gate.rows, gate.cols),
            ));
        }
        gated_delta::sigmoid_mul(&mut x.data, &gate.data);
        Ok(())
    }

    fn copy_cols(
        &self,
        src: &CpuBuf,
        col0: usize,
        width: usize,
        stride: usize,
        n_blocks: usize,
        dst: &mut CpuBuf,
    ) -> Result<()> {
        if n_blocks == 0 || col0 + (n_blocks - 1) * stride + width > src.cols {
            return Err(shape_err(
                "copy_cols",
                format!(
                    "{n_blocks} blocks of {width} from {col0} step {stride} in {}",
                    src.cols
                ),
            ));
        }
        let cols = n_blocks * width;
        dst.reshape(src.rows, cols);
        for r in 0..src.rows {
            let s = src.row(r);
            let d = &mut dst.data[r * cols..(r + 1) * cols];
            for b in 0..n_blocks {
                let from = col0 + b * stride;
                d[b * width..(b + 1) * width].copy_from_slice(&s[from..from + width]);
            }
        }
        Ok(())
    }

    fn matmul_rows(
        &self,
        w: &CpuMat,
        row0: usize,
        n_rows: usize,
        x: &CpuBuf,
        out: &mut CpuBuf,
    ) -> Result<()> {
        if row0 + n_rows > w.rows {
            return Err(shape_err(
                "matmul_rows",
                format!("rows {row0}+{n_rows} of {}", w.rows),
            ));
        }
        if w.affine.is_some() {
            // Per-expert rows of MLX packs (stacked MoE experts) are not wired yet.
            return Err(shape_err(
                "matmul_rows",
                "row views of MLX affine matrices are not supported".into(),
            ));
        }
        // A view of the rows: the same bytes, fewer rows, the same kernel.
        let bytes = w
            .bytes
            .slice(row0 * w.row_bytes, n_rows * w.row_bytes)
            .ok_or_else(|| shape_err("matmul_rows", "row range outside the matrix".into()))?;
        let view = CpuMat {
            ty: w.ty,
            rows: n_rows,
            cols: w.cols,
            row_bytes: w.row_bytes,
            bytes,
            kernel: w.kernel,
            affine: None,
            rotation: w.rotation.clone(),
        };
        self.matmul(&view, x, out)
    }

    fn gather_rows(&self, src: &CpuBuf, rows: &[u32], dst: &mut CpuBuf) -> Result<()> {
        if rows.iter().any(|&r| r as usize >= src.rows) {
            return Err(shape_err("gather_rows", format!("row beyond {}", src.rows)));
        }
        dst.reshape(rows.len(), src.cols);
        for (i, &r) in rows.iter().enumerate() {
            dst.data[i * src.cols..(i + 1) * src.cols].copy_from_slice(src.row(r as usize));
        }
        Ok(())
    }

    fn scatter_add_rows(
        &self,
        dst: &mut CpuBuf,
        rows: &[u32],
        scale: &[f32],
        src: &CpuBuf,
    ) -> Result<()> {
        crate::check_scatter_add_rows(rows, scale, (src.rows, src.cols), (dst.rows, dst.cols))?;
        let c = dst.cols;
        for (i, (&r, &a)) in rows.iter().zip(scale).enumerate() {
            simd::axpy(
                &mut dst.data[r as usize * c..(r as usize + 1) * c],
                a,
                src.row(i),
            );
        }
        Ok(())
    }
}

/// Values from which the row-wise float ops (norms, RoPE, GLU, residual adds) split their
/// rows across the pool: a prefill's (hundreds of rows) would otherwise run on one thread
/// while the other waits; a decode step's (one row) stays inline.
const PAR_MIN_VALUES: usize = 16 * 1024;

impl CpuBackend {
    /// Runs `f(u0, chunk)` over disjoint chunks of `data` of whole units of `unit` values
    /// (`u0`: the index of the chunk's first unit, i.e. its first value is
    /// `data[u0 · unit]`), across the pool when `data` has `PAR_MIN_VALUES` values, else
    /// once over all of it. Each unit is computed the same way either way.
    fn par_chunks(&self, data: &mut [f32], unit: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
        let threads = self.pool.n_threads();
        let units = data.len() / unit.max(1);
        if threads == 1 || data.len() < PAR_MIN_VALUES || units < 2 || units * unit != data.len() {
            return f(0, data);
        }
        let per = units.div_ceil(2 * threads);
        let n_tasks = units.div_ceil(per);
        let ptr = SyncPtr(data.as_mut_ptr());
        self.pool.run(n_tasks, |t| {
            let (u0, u1) = (t * per, ((t + 1) * per).min(units));
            // SAFETY: task t alone touches units u0..u1 ≤ units of data.
            let chunk = unsafe {
                std::slice::from_raw_parts_mut(ptr.get().add(u0 * unit), (u1 - u0) * unit)
            };
            f(u0, chunk);
        });
    }
}

/// Weight rows per task: enough work per task to amortise the dispatch, enough tasks to
/// balance the threads (more for prefill, where a task is more expensive).
fn chunk_rows(n_out: usize, threads: usize, na: usize) -> usize {
    let target_tasks = threads * if na > 1 { 8 } else { 4 };
    let c = n_out.div_ceil(target_tasks.max(1));
    // Multiples of 4 suit 4-row micro-kernels; prefill's AVX-512 kernels take 16 weight
    // rows per tile (a 40-row chunk would run 16 + 16 + 16 rows for 40).
    let m = if na > 1 { 16 } else { 4 };
    c.div_ceil(m).max(1) * m
}
