//! The `Backend` trait on the GPU: each op's shape checks and its launch, or a call into the
//! file that owns the op (matmul.rs, norm.rs, attention.rs, fused.rs, hybrid.rs, graph.rs).

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;

use neagari_quant::GgmlType;

use super::modules::{self, fmt_module, fmt_structs};
use super::{
    attention, cfg1, drv, graph, prefetch, shape_err, CudaBackend, CudaBuf, CudaKv, CudaMat,
    CudaVector,
};
use crate::{
    Attn, Backend, BackendError, DeltaNet, GluAct, HostTensor, KvShape, KvType, Penalties, QkPrep,
    RecShape, Result, Rope,
};

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Mat = CudaMat;
    type Vector = CudaVector;
    type Kv = CudaKv;

    fn device_memory(&self) -> Option<(u64, u64)> {
        self.mem_info().ok().map(|(f, t)| (f as u64, t as u64))
    }

    fn name(&self) -> String {
        format!(
            "cuda:{} ({}, {}, {} SMs{})",
            self.ctx.ordinal(),
            self.name,
            self.arch,
            self.n_sm,
            if self.blas.is_some() { ", cuBLAS" } else { "" }
        )
    }

    fn load_mat(&self, t: &HostTensor) -> Result<CudaMat> {
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
        let k = self.fmt_kernels(t.ty)?;
        let (bytes, row_bytes) = Self::pack_rows(t, rows, cols, self.repack)?;
        let data = self
            .stream
            .clone_htod(&bytes)
            .map_err(|e| BackendError::OutOfMemory(format!("{}: {e:?}", t.name)))?;
        Ok(CudaMat {
            ty: t.ty,
            rows,
            cols,
            row_bytes,
            data,
            k,
        })
    }

    fn load_vector(&self, t: &HostTensor) -> Result<CudaVector> {
        let n = t.n_elements();
        let mut host = vec![0f32; n];
        neagari_quant::dequantize_row(t.ty, t.bytes.as_slice(), &mut host)?;
        let data = self.stream.clone_htod(&host).map_err(drv)?;
        Ok(CudaVector { data, len: n })
    }

    fn mat_bytes(&self, m: &CudaMat) -> usize {
        m.row_bytes * m.rows
    }

    fn buf(&self, rows: usize, cols: usize) -> Result<CudaBuf> {
        let (data, lent) = self.lend(rows * cols)?;
        Ok(CudaBuf {
            data: ManuallyDrop::new(data),
            rows,
            cols,
            lent,
        })
    }

    fn buf_shape(&self, b: &CudaBuf) -> (usize, usize) {
        (b.rows, b.cols)
    }

    fn write(&self, dst: &mut CudaBuf, host: &[f32], rows: usize, cols: usize) -> Result<()> {
        if host.len() != rows * cols {
            return Err(shape_err(
                "write",
                format!("{} values for {rows}x{cols}", host.len()),
            ));
        }
        self.reshape(dst, rows, cols)?;
        if host.is_empty() {
            return Ok(());
        }
        if matches!(self.step_mode(), graph::CAPTURE | graph::REPLAY) {
            return Err(BackendError::Other(
                "cuda graph: a host upload inside a recorded decode step".into(),
            ));
        }
        self.bump();
        let mut view = dst.data.slice_mut(0..host.len());
        self.stream.memcpy_htod(host, &mut view).map_err(drv)
    }

    fn read(&self, src: &CudaBuf, row0: usize, n: usize, host: &mut [f32]) -> Result<()> {
        if row0 + n > src.rows || host.len() != n * src.cols {
            return Err(shape_err(
                "read",
                format!("rows {row0}+{n} of {}", src.rows),
            ));
        }
        if host.is_empty() {
            return Ok(());
        }
        self.step_finish()?;
        let view = src.data.slice(row0 * src.cols..(row0 + n) * src.cols);
        self.stream.memcpy_dtoh(&view, host).map_err(drv)?;
        self.synchronize()
    }

    fn argmax(&self, x: &CudaBuf) -> Result<Vec<u32>> {
        self.argmax_impl(x)
    }

    fn top_k(&self, x: &CudaBuf, k: usize, pen: &Penalties) -> Result<Vec<Vec<(u32, f32)>>> {
        self.top_k_impl(x, k, pen)
    }

    fn candidates(
        &self,
        x: &CudaBuf,
        k: usize,
        pen: &Penalties,
        enough: &crate::Settles<'_>,
    ) -> Result<crate::Candidates> {
        self.candidates_impl(x, k, pen, enough)
    }

    fn step_begin(&self, kv: &CudaKv, tokens: &[u32]) -> Result<()> {
        self.step_begin_impl(kv, tokens)
    }

    fn step_end(&self) {
        self.step_end_impl()
    }

    fn copy_row(&self, src: &CudaBuf, row: usize, dst: &mut CudaBuf) -> Result<()> {
        if row >= src.rows {
            return Err(shape_err("copy_row", format!("row {row} of {}", src.rows)));
        }
        self.reshape(dst, 1, src.cols)?;
        self.bump();
        self.launches.fetch_add(1, Ordering::Relaxed);
        if self.replaying() {
            return Ok(());
        }
        let view = src.data.slice(row * src.cols..(row + 1) * src.cols);
        let mut d = dst.data.slice_mut(0..src.cols);
        self.stream.memcpy_dtod(&view, &mut d).map_err(drv)
    }

    fn embed(&self, table: &CudaMat, ids: &[u32], scale: f32, out: &mut CudaBuf) -> Result<()> {
        self.embed_op(table, ids, scale, out)
    }

    fn matmul(&self, w: &CudaMat, x: &CudaBuf, out: &mut CudaBuf) -> Result<()> {
        self.matmul_op(w, x, out)
    }

    fn matmul_multi(&self, ws: &[&CudaMat], x: &CudaBuf, outs: &mut [&mut CudaBuf]) -> Result<()> {
        self.matmul_multi_op(ws, x, outs)
    }

    fn prepare_multi(&self, ws: &[&CudaMat]) -> Result<()> {
        self.prepare_pair(ws)
    }

    fn prepare_formats(&self, types: &[GgmlType]) -> Result<()> {
        // Each format's module in the layout load_mat will upload; formats without kernels
        // are left to load_mat's error.
        let jobs = types
            .iter()
            .filter_map(|&ty| fmt_structs(ty, self.repack, self.mvr_k16))
            .map(|n| fmt_module(&n))
            .collect();
        modules::compile_parallel(&self.arch, jobs)
    }

    fn prefetch(&self, ws: &[&CudaMat]) -> Result<()> {
        self.prefetch_op(ws);
        Ok(())
    }

    fn prefetch_rec(&self, kv: &CudaKv, layer: usize) -> Result<()> {
        self.hy_prefetch_rec(kv, layer);
        Ok(())
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.add_rms_norm_op(x, y, w, eps, out)
    }

    fn add_rms_norm_matmul(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
        ws: &[&CudaMat],
        outs: &mut [&mut CudaBuf],
    ) -> Result<()> {
        if self.norm_matmul_op(x, y, w, eps, out, ws, outs)? {
            return Ok(());
        }
        self.add_rms_norm_op(x, y, w, eps, out)?;
        self.matmul_multi_op(ws, out, outs)
    }

    fn add_rms_norm_matmul_glu(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
        (gate, up, next): (&CudaMat, &CudaMat, &[&CudaMat]),
        act: GluAct,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
    ) -> Result<()> {
        // Where `matmul_glu` would run the GEMVs and the GLU kernel apart: the norm inside
        // the GEMVs, then the GLU (the hint for the GEMV after it).
        if self.glu_apart(gate, up, x.rows)
            && self.norm_matmul_op(x, y, w, eps, out, &[gate, up], &mut [&mut *g, &mut *u])?
        {
            self.prefetch_op(next);
            return self.glu(g, u, act);
        }
        // Where one launch takes gate, up and the GLU (3–8 rows' `mvrtg_4`, one row's
        // `mvsg_R`): the norm inside it, where its knob is on.
        if self.norm_glu_op(x, y, w, eps, out, (gate, up), act, g, u)? {
            self.prefetch_op(next);
            return Ok(());
        }
        self.add_rms_norm_op(x, y, w, eps, out)?;
        self.prefetch_op(next);
        self.matmul_glu_op(gate, up, out, act, g, u)
    }

    fn norm_add_rms_norm(
        &self,
        x: &mut CudaBuf,
        y: &mut CudaBuf,
        w_y: &CudaVector,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.norm_add_rms_norm_op(x, y, w_y, w, eps, out)
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaVector, eps: f32, out: &mut CudaBuf) -> Result<()> {
        self.reshape(out, x.rows, x.cols)?;
        let op = self.dptr(&out.data);
        self.rms_norm_into(x, w, eps, op)
    }

    fn rms_norm_inplace(&self, x: &mut CudaBuf, w: &CudaVector, eps: f32) -> Result<()> {
        let op = self.dptr(&x.data);
        self.rms_norm_into(x, w, eps, op)
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf) -> Result<()> {
        if x.rows * x.cols != y.rows * y.cols {
            return Err(shape_err(
                "add",
                format!("{}x{} + {}x{}", x.rows, x.cols, y.rows, y.cols),
            ));
        }
        self.elementwise(&self.ops.add, x, Some(y))
    }

    fn add_bias(&self, x: &mut CudaBuf, b: &CudaVector) -> Result<()> {
        if b.len != x.cols {
            return Err(shape_err(
                "add_bias",
                format!("{} cols, bias of {}", x.cols, b.len),
            ));
        }
        let n = (x.rows * x.cols) as i64;
        let (xp, bp) = (self.dptr(&x.data), self.dptr(&b.data));
        let cols_i = x.cols as i32;
        launch!(
            self,
            &self.ops.add_bias,
            cfg1(n as usize, 256),
            &xp,
            &bp,
            &cols_i,
            &n
        )
    }

    fn glu(&self, gate: &mut CudaBuf, up: &CudaBuf, act: GluAct) -> Result<()> {
        if gate.rows * gate.cols != up.rows * up.cols {
            return Err(shape_err(
                "glu",
                format!("{} vs {} values", gate.rows * gate.cols, up.rows * up.cols),
            ));
        }
        if Self::fuse_q8_1(gate.rows, gate.cols) {
            // The down projection's q8_1 input, written by the same kernel.
            let f = match act {
                GluAct::Silu => &self.ops.glu_silu_q,
                GluAct::GeluTanh => &self.ops.glu_gelu_q,
            };
            let n = (gate.rows * gate.cols) as i64;
            let (gp, upp) = (self.dptr(&gate.data), self.dptr(&up.data));
            let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (qp, dsp) = self.xq_reserve(&mut sc, gate.rows, gate.cols / 32)?;
            let pf = self.take_pf(prefetch::PfSite::Glu, gate.rows);
            launch!(
                self,
                f,
                cfg1(n as usize, 256),
                &gp,
                &upp,
                &n,
                &qp,
                &dsp,
                &pf
            )?;
            sc.xq_key = Some((gp, gate.rows, gate.cols, self.gen.load(Ordering::Relaxed)));
            return Ok(());
        }
        let f = match act {
            GluAct::Silu => &self.ops.glu_silu,
            GluAct::GeluTanh => &self.ops.glu_gelu,
        };
        self.elementwise(f, gate, Some(up))
    }

    fn matmul_glu(
        &self,
        gate: &CudaMat,
        up: &CudaMat,
        x: &CudaBuf,
        act: GluAct,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
    ) -> Result<()> {
        self.matmul_glu_op(gate, up, x, act, g, u)
    }

    fn qk_norm_rope(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        q_norm: Option<&CudaVector>,
        k_norm: Option<&CudaVector>,
        eps: f32,
        head_dim: usize,
        pos0: usize,
        rope_q: &Rope,
        rope_k: &Rope,
        freq_factors: Option<&CudaVector>,
    ) -> Result<()> {
        self.qk_norm_rope_op(
            q,
            k,
            q_norm,
            k_norm,
            eps,
            head_dim,
            pos0,
            rope_q,
            rope_k,
            freq_factors,
        )
    }

    fn softcap(&self, x: &mut CudaBuf, cap: f32) -> Result<()> {
        let n = (x.rows * x.cols) as i64;
        let xp = self.dptr(&x.data);
        launch!(
            self,
            &self.ops.softcap,
            cfg1(n as usize, 256),
            &xp,
            &cap,
            &n
        )
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        head_dim: usize,
        pos0: usize,
        rope: &Rope,
        freq_factors: Option<&CudaVector>,
    ) -> Result<()> {
        self.rope_op(x, head_dim, pos0, rope, freq_factors)
    }

    fn kv_alloc(&self, s: &KvShape) -> Result<CudaKv> {
        match s.ty {
            KvType::F16 => {}
            KvType::Q8_0 if s.head_dim.is_multiple_of(32) => {}
            KvType::Q8_0 => {
                return Err(shape_err(
                    "kv_alloc",
                    format!("q8_0 KV needs head_dim % 32 == 0, got {}", s.head_dim),
                ))
            }
            KvType::F32 => {
                return Err(BackendError::Other(
                    "the CUDA backend keeps an f16 or q8_0 KV cache (asked for f32)".into(),
                ))
            }
        }
        if s.head_dim > 256 {
            return Err(shape_err(
                "kv_alloc",
                format!("head_dim {} > 256", s.head_dim),
            ));
        }
        let bytes = attention::kv_layer_bytes(s)
            .and_then(|b| b.checked_mul(s.n_layers))
            .ok_or_else(|| BackendError::OutOfMemory("KV cache size overflows".into()))?;
        let alloc = || {
            self.stream
                .alloc_zeros::<u16>((bytes / 2).max(1))
                .map_err(|e| {
                    BackendError::OutOfMemory(format!("KV cache of {} MiB: {e:?}", bytes >> 20))
                })
        };
        Ok(CudaKv {
            shape: s.clone(),
            len: 0,
            k: alloc()?,
            v: alloc()?,
            rec: None,
            id: graph::next_kv_id(),
        })
    }

    fn kv_len(&self, kv: &CudaKv) -> usize {
        kv.len
    }

    fn kv_capacity(&self, kv: &CudaKv) -> usize {
        kv.shape.n_ctx
    }

    fn kv_truncate(&self, kv: &mut CudaKv, len: usize) -> Result<()> {
        self.hy_truncate(kv, len)?;
        kv.len = kv.len.min(len);
        Ok(())
    }

    fn kv_commit(&self, kv: &mut CudaKv, new_len: usize) -> Result<()> {
        crate::check_kv_commit(new_len, kv.shape.n_ctx)?;
        kv.len = new_len;
        Ok(())
    }

    fn attention(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        pos0: usize,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        attn: &Attn,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.attention_launch(kv, layer, pos0, q, k, v, attn, out, true, 0)
    }

    fn attention_block(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        pos0: usize,
        q: &mut CudaBuf,
        gated: bool,
        k: &mut CudaBuf,
        v: &CudaBuf,
        prep: &QkPrep<CudaVector>,
        attn: &Attn,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.attention_block_op(kv, layer, pos0, q, gated, k, v, prep, attn, out)
    }

    fn rec_alloc(&self, kv: &mut CudaKv, shape: &RecShape) -> Result<()> {
        self.hy_rec_alloc(kv, shape)
    }

    fn kv_snapshot(&self, kv: &CudaKv) -> Result<CudaKv> {
        self.hy_snapshot(kv)
    }

    fn kv_restore(&self, kv: &mut CudaKv, snap: &CudaKv) -> Result<()> {
        self.hy_restore(kv, snap)
    }

    fn ssm_conv(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        x: &mut CudaBuf,
        w: &CudaVector,
    ) -> Result<()> {
        self.hy_ssm_conv(kv, layer, x, w)
    }

    fn gated_delta(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        qkv: &CudaBuf,
        alpha: &CudaBuf,
        beta: &CudaBuf,
        a_neg: &CudaVector,
        dt_bias: &CudaVector,
        net: &DeltaNet,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.hy_gated_delta(kv, layer, qkv, alpha, beta, a_neg, dt_bias, net, out)
    }

    fn rms_norm_gated(&self, x: &mut CudaBuf, w: &CudaVector, z: &CudaBuf, eps: f32) -> Result<()> {
        self.hy_rms_norm_gated(x, w, z, eps)
    }

    fn delta_net(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        qkv: &mut CudaBuf,
        conv: &CudaVector,
        alpha: &CudaBuf,
        beta: &CudaBuf,
        a_neg: &CudaVector,
        dt_bias: &CudaVector,
        net: &DeltaNet,
        norm: &CudaVector,
        z: &CudaBuf,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.hy_delta_net(
            kv, layer, qkv, conv, alpha, beta, a_neg, dt_bias, net, norm, z, eps, out,
        )
    }

    fn mul_sigmoid(&self, x: &mut CudaBuf, gate: &CudaBuf) -> Result<()> {
        self.hy_mul_sigmoid(x, gate)
    }

    fn copy_cols(
        &self,
        src: &CudaBuf,
        col0: usize,
        width: usize,
        stride: usize,
        n_blocks: usize,
        dst: &mut CudaBuf,
    ) -> Result<()> {
        self.hy_copy_cols(src, col0, width, stride, n_blocks, dst)
    }

    fn matmul_rows(
        &self,
        w: &CudaMat,
        row0: usize,
        n_rows: usize,
        x: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.hy_matmul_rows(w, row0, n_rows, x, out)
    }

    fn gather_rows(&self, src: &CudaBuf, rows: &[u32], dst: &mut CudaBuf) -> Result<()> {
        self.hy_gather_rows(src, rows, dst)
    }

    fn scatter_add_rows(
        &self,
        dst: &mut CudaBuf,
        rows: &[u32],
        scale: &[f32],
        src: &CudaBuf,
    ) -> Result<()> {
        self.hy_scatter_add_rows(dst, rows, scale, src)
    }
}
