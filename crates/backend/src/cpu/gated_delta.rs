//! Gated DeltaNet on CPU: the recurrent state of one sequence (a short-conv window and a
//! `d_k × d_v` matrix per value head, per recurrent layer), the causal conv, and the gated
//! delta rule — one step per token for decode, a chunked parallel form for prefill.
//!
//! Per value head, with decay `a_t = exp(g_t)` and `S` a `[d_k, d_v]` f32 matrix:
//! `S_t = a_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`, `o_t = S_tᵀ q_t`.
//! The chunked form (chunks of `CHUNK` tokens, `G` the in-chunk cumulative sum of g) solves
//! the in-chunk part as a unit-lower-triangular system and touches `S` only three times per
//! chunk (see `chunk`), so prefill costs `O(L·d_k·d_v)` matrix work per chunk instead of a
//! sequential read-modify-write of `S` per token.

use super::simd;
use crate::{BackendError, DeltaNet, HeadMap, RecShape, Result};

/// Tokens per chunk of the parallel form (the value the reference implementations use).
pub const CHUNK: usize = 64;

/// Recurrent state of one sequence, all recurrent layers.
#[derive(Clone, Debug)]
pub struct CpuRec {
    pub shape: RecShape,
    /// Per layer `[kernel − 1, channels]`: the last inputs of the conv, oldest first.
    pub conv: Vec<Vec<f32>>,
    /// Per layer `[n_v_heads, d_k, d_v]`.
    pub state: Vec<Vec<f32>>,
}

fn zeros(n: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| BackendError::OutOfMemory(format!("recurrent state of {n} floats")))?;
    v.resize(n, 0.0);
    Ok(v)
}

impl CpuRec {
    pub fn new(shape: &RecShape) -> Result<Self> {
        if shape.conv_kernel == 0 {
            return Err(BackendError::Shape {
                op: "rec_alloc",
                detail: "conv kernel of 0".into(),
            });
        }
        let conv_len = (shape.conv_kernel - 1) * shape.conv_channels;
        let state_len = shape.n_v_heads * shape.d_k * shape.d_v;
        let mut conv = Vec::with_capacity(shape.n_layers);
        let mut state = Vec::with_capacity(shape.n_layers);
        for _ in 0..shape.n_layers {
            conv.push(zeros(conv_len)?);
            state.push(zeros(state_len)?);
        }
        Ok(CpuRec {
            shape: shape.clone(),
            conv,
            state,
        })
    }

    pub fn reset(&mut self) {
        for v in self.conv.iter_mut().chain(self.state.iter_mut()) {
            v.iter_mut().for_each(|x| *x = 0.0);
        }
    }

    /// Bytes of state per sequence.
    pub fn bytes(&self) -> usize {
        4 * (self.conv.iter().map(Vec::len).sum::<usize>()
            + self.state.iter().map(Vec::len).sum::<usize>())
    }
}

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch's softplus (beta 1, threshold 20).
#[inline]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Causal depthwise conv of `x` (`[rows, ch]`, in place) after the window `win`
/// (`[kernel − 1, ch]`), then SiLU; the window moves to the last `kernel − 1` inputs.
/// `w` is `[ch, kernel]`, oldest tap first.
pub fn conv(win: &mut [f32], x: &mut [f32], rows: usize, ch: usize, w: &[f32], kernel: usize) {
    let hist = kernel - 1;
    // ext = [window; x] : [(hist + rows), ch]
    let mut ext = Vec::with_capacity((hist + rows) * ch);
    ext.extend_from_slice(win);
    ext.extend_from_slice(&x[..rows * ch]);
    // Taps transposed to [kernel, ch] so the inner loop runs over channels.
    let mut wt = vec![0f32; kernel * ch];
    for c in 0..ch {
        for j in 0..kernel {
            wt[j * ch + c] = w[c * kernel + j];
        }
    }
    for t in 0..rows {
        let out = &mut x[t * ch..(t + 1) * ch];
        out.iter_mut().for_each(|v| *v = 0.0);
        for j in 0..kernel {
            let src = &ext[(t + j) * ch..(t + j + 1) * ch];
            let tap = &wt[j * ch..(j + 1) * ch];
            for ((o, s), w) in out.iter_mut().zip(src).zip(tap) {
                *o += s * w;
            }
        }
        out.iter_mut().for_each(|v| *v = silu(*v));
    }
    win.copy_from_slice(&ext[rows * ch..]);
}

/// `x ← x · rsqrt(Σx² + 1e−6) · scale`.
fn l2_norm(x: &mut [f32], scale: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = scale / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// One head's inputs for a run of `n` tokens, head-major and contiguous.
pub struct HeadInputs<'a> {
    /// `[n, d_k]`, L2-normalised and scaled by `1/√d_k`.
    pub q: &'a [f32],
    /// `[n, d_k]`, L2-normalised.
    pub k: &'a [f32],
    /// `[n, d_v]`.
    pub v: &'a [f32],
    /// `[n]` log-decays (≤ 0).
    pub g: &'a [f32],
    /// `[n]` write strengths in (0, 1).
    pub beta: &'a [f32],
}

/// One token: `S ← exp(g)·S; δ = β(v − Sᵀk); S ← S + k δᵀ; o = Sᵀq`.
pub fn step(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, o: &mut [f32]) {
    let (dk, dv) = (k.len(), v.len());
    let decay = g.exp();
    let mut delta = vec![0f32; dv];
    for kk in 0..dk {
        simd::axpy(&mut delta, k[kk], &s[kk * dv..(kk + 1) * dv]);
    }
    for (d, vv) in delta.iter_mut().zip(v) {
        *d = beta * (vv - decay * *d);
    }
    o.iter_mut().for_each(|x| *x = 0.0);
    for kk in 0..dk {
        let row = &mut s[kk * dv..(kk + 1) * dv];
        row.iter_mut().for_each(|x| *x *= decay);
        simd::axpy(row, k[kk], &delta);
        simd::axpy(o, q[kk], row);
    }
}

/// Tokens `t0..t0 + l` (l ≤ CHUNK) of one head in the parallel form. With `G` the
/// cumulative log-decay inside the chunk and `D_ij = exp(G_i − G_j)` (j ≤ i):
///   `A_ij = −β_i D_ij k_i·k_j` (j < i), `(I − A) U = β v`, `(I − A) W = β exp(G) k`,
///   `V' = U − W S`, `o_i = exp(G_i) Sᵀq_i + Σ_{j≤i} D_ij (q_i·k_j) V'_j`,
///   `S ← exp(G_L) S + Σ_j exp(G_L − G_j) k_j V'_jᵀ`.
fn chunk(
    s: &mut [f32],
    inp: &HeadInputs,
    t0: usize,
    l: usize,
    dk: usize,
    dv: usize,
    o: &mut [f32],
) {
    let q = &inp.q[t0 * dk..(t0 + l) * dk];
    let k = &inp.k[t0 * dk..(t0 + l) * dk];
    let v = &inp.v[t0 * dv..(t0 + l) * dv];
    let beta = &inp.beta[t0..t0 + l];
    let mut gc = [0f32; CHUNK];
    let mut acc = 0f32;
    for (c, g) in gc.iter_mut().zip(&inp.g[t0..t0 + l]) {
        acc += g;
        *c = acc;
    }
    let ki = |i: usize| &k[i * dk..(i + 1) * dk];
    let qi = |i: usize| &q[i * dk..(i + 1) * dk];
    // u: [l, dv] (becomes V'), w: [l, dk]; solved row by row (forward substitution).
    let mut u = vec![0f32; l * dv];
    let mut w = vec![0f32; l * dk];
    let mut a = vec![0f32; l];
    for i in 0..l {
        for j in 0..i {
            a[j] = -beta[i] * (gc[i] - gc[j]).exp() * simd::dot(ki(i), ki(j));
        }
        let (done_u, row_u) = u.split_at_mut(i * dv);
        let row_u = &mut row_u[..dv];
        for (x, vv) in row_u.iter_mut().zip(&v[i * dv..(i + 1) * dv]) {
            *x = beta[i] * vv;
        }
        let (done_w, row_w) = w.split_at_mut(i * dk);
        let row_w = &mut row_w[..dk];
        let eg = beta[i] * gc[i].exp();
        for (x, kk) in row_w.iter_mut().zip(ki(i)) {
            *x = eg * kk;
        }
        for j in 0..i {
            simd::axpy(row_u, a[j], &done_u[j * dv..(j + 1) * dv]);
            simd::axpy(row_w, a[j], &done_w[j * dk..(j + 1) * dk]);
        }
    }
    // V' = U − W S
    for i in 0..l {
        let row_u = &mut u[i * dv..(i + 1) * dv];
        for kk in 0..dk {
            simd::axpy(row_u, -w[i * dk + kk], &s[kk * dv..(kk + 1) * dv]);
        }
    }
    // Outputs against the state at the chunk start, then the in-chunk part.
    for i in 0..l {
        let oi = &mut o[i * dv..(i + 1) * dv];
        oi.iter_mut().for_each(|x| *x = 0.0);
        let eg = gc[i].exp();
        for kk in 0..dk {
            simd::axpy(oi, eg * qi(i)[kk], &s[kk * dv..(kk + 1) * dv]);
        }
        for j in 0..=i {
            let c = (gc[i] - gc[j]).exp() * simd::dot(qi(i), ki(j));
            simd::axpy(oi, c, &u[j * dv..(j + 1) * dv]);
        }
    }
    // State to the chunk end.
    let gl = gc[l - 1];
    let egl = gl.exp();
    let mut kd = vec![0f32; l];
    for kk in 0..dk {
        for j in 0..l {
            kd[j] = (gl - gc[j]).exp() * ki(j)[kk];
        }
        let row = &mut s[kk * dv..(kk + 1) * dv];
        row.iter_mut().for_each(|x| *x *= egl);
        for j in 0..l {
            simd::axpy(row, kd[j], &u[j * dv..(j + 1) * dv]);
        }
    }
}

/// All tokens of one head: one step per token when `n == 1` or `!chunked`, else the
/// chunked form. `o` is `[n, d_v]`.
pub fn head(
    s: &mut [f32],
    inp: &HeadInputs,
    n: usize,
    dk: usize,
    dv: usize,
    chunked: bool,
    o: &mut [f32],
) {
    if n == 1 || !chunked {
        for t in 0..n {
            step(
                s,
                &inp.q[t * dk..(t + 1) * dk],
                &inp.k[t * dk..(t + 1) * dk],
                &inp.v[t * dv..(t + 1) * dv],
                inp.g[t],
                inp.beta[t],
                &mut o[t * dv..(t + 1) * dv],
            );
        }
        return;
    }
    let mut t0 = 0;
    while t0 < n {
        let l = CHUNK.min(n - t0);
        chunk(s, inp, t0, l, dk, dv, &mut o[t0 * dv..(t0 + l) * dv]);
        t0 += l;
    }
}

/// Host-side preparation of a run: per key head normalised q and k (`[n_k][n, d_k]`), per
/// value head v (`[n_v][n, d_v]`), g and β (`[n_v][n]`).
pub struct Prepared {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
pub fn prepare(
    net: &DeltaNet,
    n: usize,
    qkv: &[f32],
    alpha: &[f32],
    beta_in: &[f32],
    a_neg: &[f32],
    dt_bias: &[f32],
) -> Prepared {
    let (nk, nv, dk, dv) = (net.n_k_heads, net.n_v_heads, net.d_k, net.d_v);
    let key_dim = nk * dk;
    let cols = 2 * key_dim + nv * dv;
    let qscale = 1.0 / (dk as f32).sqrt();
    let mut q = vec![0f32; nk * n * dk];
    let mut k = vec![0f32; nk * n * dk];
    let mut v = vec![0f32; nv * n * dv];
    let mut g = vec![0f32; nv * n];
    let mut beta = vec![0f32; nv * n];
    for t in 0..n {
        let row = &qkv[t * cols..(t + 1) * cols];
        for h in 0..nk {
            let dq = &mut q[(h * n + t) * dk..(h * n + t + 1) * dk];
            dq.copy_from_slice(&row[h * dk..(h + 1) * dk]);
            l2_norm(dq, qscale);
            let dkk = &mut k[(h * n + t) * dk..(h * n + t + 1) * dk];
            dkk.copy_from_slice(&row[key_dim + h * dk..key_dim + (h + 1) * dk]);
            l2_norm(dkk, 1.0);
        }
        for h in 0..nv {
            v[(h * n + t) * dv..(h * n + t + 1) * dv]
                .copy_from_slice(&row[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv]);
            g[h * n + t] = a_neg[h] * softplus(alpha[t * nv + h] + dt_bias[h]);
            beta[h * n + t] = sigmoid(beta_in[t * nv + h]);
        }
    }
    Prepared { q, k, v, g, beta }
}

/// The key head value head `h` reads.
pub fn key_head(net: &DeltaNet, h: usize) -> usize {
    match net.map {
        HeadMap::Grouped => h / (net.n_v_heads / net.n_k_heads).max(1),
        HeadMap::Tiled => h % net.n_k_heads,
    }
}

/// `x = RMS(x) · w · silu(z)` over one group.
pub fn rms_norm_gated(x: &mut [f32], w: &[f32], z: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((v, g), zz) in x.iter_mut().zip(w).zip(z) {
        *v = *v * inv * g * silu(*zz);
    }
}

pub fn sigmoid_mul(x: &mut [f32], gate: &[f32]) {
    for (v, g) in x.iter_mut().zip(gate) {
        *v *= sigmoid(*g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The chunked form equals token-by-token recurrence, across chunk boundaries and
    /// starting from a non-zero state.
    #[test]
    fn chunked_equals_recurrent() {
        let (n, dk, dv) = (150, 16, 8);
        let mut seed = 7u64;
        let mut q: Vec<f32> = (0..n * dk).map(|_| lcg(&mut seed)).collect();
        let mut k: Vec<f32> = (0..n * dk).map(|_| lcg(&mut seed)).collect();
        for t in 0..n {
            l2_norm(&mut q[t * dk..(t + 1) * dk], 0.25);
            l2_norm(&mut k[t * dk..(t + 1) * dk], 1.0);
        }
        let v: Vec<f32> = (0..n * dv).map(|_| lcg(&mut seed)).collect();
        let g: Vec<f32> = (0..n).map(|_| -0.5 * (lcg(&mut seed) + 1.0)).collect();
        let beta: Vec<f32> = (0..n).map(|_| sigmoid(2.0 * lcg(&mut seed))).collect();
        let s0: Vec<f32> = (0..dk * dv).map(|_| lcg(&mut seed)).collect();
        let inp = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let (mut s1, mut s2) = (s0.clone(), s0.clone());
        let (mut o1, mut o2) = (vec![0f32; n * dv], vec![0f32; n * dv]);
        head(&mut s1, &inp, n, dk, dv, false, &mut o1);
        head(&mut s2, &inp, n, dk, dv, true, &mut o2);
        let max = o1.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (a, b) in o1.iter().zip(&o2).chain(s1.iter().zip(&s2)) {
            assert!((a - b).abs() <= 1e-5 * max.max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn conv_continues_its_window() {
        let (ch, kernel, rows) = (3, 4, 5);
        let mut seed = 3u64;
        let w: Vec<f32> = (0..ch * kernel).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..rows * ch).map(|_| lcg(&mut seed)).collect();
        let mut whole = x.clone();
        let mut win = vec![0f32; (kernel - 1) * ch];
        conv(&mut win, &mut whole, rows, ch, &w, kernel);
        // Same inputs one row at a time.
        let mut win2 = vec![0f32; (kernel - 1) * ch];
        for t in 0..rows {
            let mut r = x[t * ch..(t + 1) * ch].to_vec();
            conv(&mut win2, &mut r, 1, ch, &w, kernel);
            assert_eq!(r, whole[t * ch..(t + 1) * ch]);
        }
        assert_eq!(win, win2);
        // Row 0 sees only the last tap: silu(w[c, K-1] · x[0, c]).
        for c in 0..ch {
            assert!((whole[c] - silu(w[c * kernel + kernel - 1] * x[c])).abs() < 1e-6);
        }
    }
}
