// The ops of hybrid (Gated DeltaNet) and MoE models: the causal short conv over the
// recurrent window, the gated delta rule (one kernel for decode and prefill: the state
// stays in registers while the block walks the tokens), gated RMSNorm, sigmoid gating,
// strided column copies and the row gather / scatter-add around MoE experts.
// The numerics follow the CPU backend (cpu/gated_delta.rs).

// silu_f, sigmoid_f, softplus_f: common.cuh.

#define CONV_MAXK 16

// Depthwise causal conv of x ([rows, ch], in place) after the window win ([k − 1, ch],
// oldest first), then SiLU; the window moves to the last k − 1 inputs. w is [ch, k], oldest
// tap first. One thread per channel walks the rows, the window in registers. The taps and
// the window (written by this layer's conv a step ago, not by the kernel before) are read
// before the wait, and the inputs 8 rows at a time before any is used: read one by one
// after each store, the 27B's 8-row verify conv (10,240 channels) waited on 8 loads in a
// row.
#define CONV_ROWS 8
extern "C" __global__ void ssm_conv(float* x, float* win, const float* w, int rows, int ch,
                                    int k) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int hist = k - 1;
    const bool in = c < ch;
    float h[CONV_MAXK], tap[CONV_MAXK];
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++) {
        h[j] = in && j < hist ? win[(i64)j * ch + c] : 0.f;
        tap[j] = in && j < hist ? w[(i64)c * k + j] : 0.f;
    }
    // The newest input's tap (a register, not an indexed one).
    const float tk = in ? w[(i64)c * k + hist] : 0.f;
    gdc_wait();
    if (!in) return;
    for (int t0 = 0; t0 < rows; t0 += CONV_ROWS) {
        float xin[CONV_ROWS];
#pragma unroll
        for (int i = 0; i < CONV_ROWS; i++)
            xin[i] = t0 + i < rows ? x[(i64)(t0 + i) * ch + c] : 0.f;
#pragma unroll
        for (int i = 0; i < CONV_ROWS; i++) {
            if (t0 + i >= rows) break;
            float s = 0.f;
#pragma unroll
            for (int j = 0; j < CONV_MAXK; j++)
                if (j < hist) s += h[j] * tap[j];
            s += xin[i] * tk;
            x[(i64)(t0 + i) * ch + c] = silu_f(s);
            // Shift the window by one input.
#pragma unroll
            for (int j = 0; j + 1 < CONV_MAXK; j++)
                if (j + 1 < hist) h[j] = h[j + 1];
            if (hist > 0) {
#pragma unroll
                for (int j = 0; j < CONV_MAXK; j++)
                    if (j == hist - 1) h[j] = xin[i];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++)
        if (j < hist) win[(i64)j * ch + c] = h[j];
}

// The recurrent state of a head is stored [d_v, d_k] (a state column's d_k rows
// contiguous): a warp owns GD_CPW columns and lane l keeps rows l + 32·r (r < GD_ROWS) of
// each, so a warp reads 128 bytes a load and every sum over the rows is a warp shuffle: no
// block-wide barrier inside the recurrence. d_k, d_v ≤ 32·GD_ROWS (the host checks).
#define GD_ROWS 4
#define GD_CPW 4

// One delta-rule step on a warp's columns: with the lane's L2-normed k and q rows (q also
// by 1/√d_k) and the columns' v, p_c = Σ_i k_i s_ic, δ_c = β (v_c − decay·p_c),
// s_ic ← decay·s_ic + k_i δ_c, o_c = Σ_i q_i s_ic (in every lane). Rows past d_k hold k =
// q = s = 0 and columns past d_v v = s = 0, so they stay 0 and add nothing.
template <int C>
__device__ __forceinline__ void delta_cols(float (&s)[GD_ROWS][C], const float (&k)[GD_ROWS],
                                           const float (&q)[GD_ROWS], const float (&v)[C],
                                           float decay, float bt, float (&o)[C]) {
    float p[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        p[c] = 0.f;
#pragma unroll
        for (int r = 0; r < GD_ROWS; r++) p[c] += k[r] * s[r][c];
    }
#pragma unroll
    for (int c = 0; c < C; c++) p[c] = warp_sum(p[c]);
#pragma unroll
    for (int c = 0; c < C; c++) {
        const float d = bt * (v[c] - decay * p[c]);
        float oc = 0.f;
#pragma unroll
        for (int r = 0; r < GD_ROWS; r++) {
            s[r][c] = decay * s[r][c] + k[r] * d;
            oc += q[r] * s[r][c];
        }
        o[c] = oc;
    }
#pragma unroll
    for (int c = 0; c < C; c++) o[c] = warp_sum(o[c]);
}

// L2-normalises a lane's rows of q and k over the warp (q also by 1/√d_k), in place.
__device__ __forceinline__ void l2_norm_qk(float (&q)[GD_ROWS], float (&k)[GD_ROWS], int dk) {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int r = 0; r < GD_ROWS; r++) {
        sq += q[r] * q[r];
        sk += k[r] * k[r];
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float iq = (1.0f / sqrtf((float)dk)) / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
#pragma unroll
    for (int r = 0; r < GD_ROWS; r++) {
        q[r] *= iq;
        k[r] *= ik;
    }
}

// Loads (or stores) a warp's columns j0 + c of a head's state S ([d_v, d_k]).
template <int C>
__device__ __forceinline__ void state_load(float (&s)[GD_ROWS][C], const float* S, int j0, int dk,
                                           int dv) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < GD_ROWS; r++)
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int i = lane + 32 * r, j = j0 + c;
            s[r][c] = (i < dk && j < dv) ? S[(i64)j * dk + i] : 0.f;
        }
}
template <int C>
__device__ __forceinline__ void state_store(const float (&s)[GD_ROWS][C], float* S, int j0, int dk,
                                            int dv) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < GD_ROWS; r++)
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int i = lane + 32 * r, j = j0 + c;
            if (i < dk && j < dv) S[(i64)j * dk + i] = s[r][c];
        }
}

// Full block sum (every thread gets it).
__device__ __forceinline__ float block_sum(float v, float* red, int nw) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += red[i];
    __syncthreads();
    return s;
}

// One token's q, k rows of key head kh (this lane's), v of columns j0 + c, α and β of head h.
struct GdIn {
    float q[GD_ROWS], k[GD_ROWS], v[GD_CPW], a, b;
};
__device__ __forceinline__ void gd_load(GdIn& in, const float* row, const float* alpha,
                                        const float* beta, int h, int kh, int j0, int dk, int dv,
                                        int key_dim) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < GD_ROWS; r++) {
        const int i = lane + 32 * r;
        in.q[r] = i < dk ? row[kh * dk + i] : 0.f;
        in.k[r] = i < dk ? row[key_dim + kh * dk + i] : 0.f;
    }
#pragma unroll
    for (int c = 0; c < GD_CPW; c++)
        in.v[c] = j0 + c < dv ? row[2 * key_dim + h * dv + j0 + c] : 0.f;
    in.a = alpha[h];
    in.b = beta[h];
}

// The gated delta rule of one value head over n tokens, continuing its state S ([d_v, d_k]
// f32, in place). Grid: (n_v, ceil(d_v / (GD_CPW·warps))); a warp owns GD_CPW columns and
// walks the tokens with the next token's inputs in flight. Per token: q, k of the head's
// key head are L2-normalised (q also by 1/√d_k), g = a_neg·softplus(alpha + dt_bias),
// β = sigmoid(beta), then
//   δ = β (v − exp(g) Sᵀk);  S ← exp(g) S + k δᵀ;  o = Sᵀq.
// qkv rows are [q n_k·d_k | k n_k·d_k | v n_v·d_v]; out is [n, n_v·d_v].
extern "C" __global__ void __launch_bounds__(256)
    gated_delta(const float* qkv, const float* alpha, const float* beta, const float* a_neg,
                const float* dt_bias, float* state, float* out, int n, int nk, int nv, int dk,
                int dv, int tiled) {
    gdc_wait();
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = (blockIdx.y * (blockDim.x >> 5) + warp) * GD_CPW;
    if (j0 >= dv) return;
    const int kh = tiled ? h % nk : h / max(nv / nk, 1);
    const int key_dim = nk * dk;
    const int cols = 2 * key_dim + nv * dv;
    float* S = state + (i64)h * dk * dv;
    const float an = a_neg[h], dtb = dt_bias[h];

    float s[GD_ROWS][GD_CPW];
    state_load(s, S, j0, dk, dv);
    GdIn cur, nxt;
    gd_load(cur, qkv, alpha, beta, h, kh, j0, dk, dv, key_dim);
    for (int t = 0; t < n; t++) {
        if (t + 1 < n)
            gd_load(nxt, qkv + (i64)(t + 1) * cols, alpha + (i64)(t + 1) * nv,
                    beta + (i64)(t + 1) * nv, h, kh, j0, dk, dv, key_dim);
        l2_norm_qk(cur.q, cur.k, dk);
        const float decay = expf(an * softplus_f(cur.a + dtb)), bt = sigmoid_f(cur.b);
        float o[GD_CPW];
        delta_cols(s, cur.k, cur.q, cur.v, decay, bt, o);
#pragma unroll
        for (int c = 0; c < GD_CPW; c++)
            if (lane == c && j0 + c < dv) out[(i64)t * nv * dv + (i64)h * dv + j0 + c] = o[c];
        cur = nxt;
    }
    state_store(s, S, j0, dk, dv);
}

// x = x · rsqrt(mean(x²) + eps) · w · silu(z) over groups of g values; one block per group.
extern "C" __global__ void rms_norm_gated(float* x, const float* w, const float* z, int g,
                                          float eps) {
    gdc_wait();
    const i64 base = (i64)blockIdx.x * g;
    __shared__ float red1[32];
    float ss = 0.f;
    for (int i = threadIdx.x; i < g; i += blockDim.x) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = block_sum(ss, red1, blockDim.x >> 5);
    const float inv = 1.0f / sqrtf(ss / (float)g + eps);
    for (int i = threadIdx.x; i < g; i += blockDim.x)
        x[base + i] = x[base + i] * inv * w[i] * silu_f(z[base + i]);
}

// The same, also writing the result as q8_1 (g and blockDim multiples of 32, so each warp
// holds whole 32-value units) for the GEMV that reads it next.
extern "C" __global__ void rms_norm_gated_q(float* x, const float* w, const float* z, int g,
                                            float eps, i8* xq, float2* xds) {
    gdc_wait();
    const i64 base = (i64)blockIdx.x * g;
    __shared__ float red1[32];
    float ss = 0.f;
    for (int i = threadIdx.x; i < g; i += blockDim.x) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = block_sum(ss, red1, blockDim.x >> 5);
    const float inv = 1.0f / sqrtf(ss / (float)g + eps);
    for (int i = threadIdx.x; i < g; i += blockDim.x) {
        const float v = x[base + i] * inv * w[i] * silu_f(z[base + i]);
        x[base + i] = v;
        q8_1_warp(v, xq, xds, (base + i) >> 5, threadIdx.x & 31);
    }
}

extern "C" __global__ void mul_sigmoid(float* x, const float* g, i64 n) {
    gdc_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= sigmoid_f(g[i]);
}

// dst[r, b·width + i] = src[r, col0 + b·stride + i]; one thread per dst value.
extern "C" __global__ void copy_cols(const float* src, float* dst, int rows, int src_cols,
                                     int col0, int width, int stride, int n_blocks) {
    gdc_wait();
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const int dc = n_blocks * width;
    if (t >= (i64)rows * dc) return;
    const int r = (int)(t / dc), c = (int)(t % dc);
    const int b = c / width, i = c % width;
    dst[t] = src[(i64)r * src_cols + col0 + (i64)b * stride + i];
}

// dst[i, :] = src[ids[i], :]; one thread per dst value.
extern "C" __global__ void gather_rows(const float* src, const u32* ids, float* dst, int n,
                                       int cols) {
    gdc_wait();
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)n * cols) return;
    const int i = (int)(t / cols), c = (int)(t % cols);
    dst[t] = src[(i64)ids[i] * cols + c];
}

// dst[ids[i], :] += scale[i] · src[i, :]. One thread per column walks the rows in order,
// so repeated ids add up without races.
extern "C" __global__ void scatter_add_rows(float* dst, const u32* ids, const float* scale,
                                            const float* src, int n, int cols) {
    gdc_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int i = 0; i < n; i++) dst[(i64)ids[i] * cols + c] += scale[i] * src[(i64)i * cols + c];
}

// The arrival of a block of `delta_rows` once its outputs are written: whether it is the
// last block of its head h (cnt[nk + h]; nb blocks a head).
__device__ __forceinline__ void dr_arrive(u32* cnt, int h, int nk, int nb, int& last_h) {
    if (threadIdx.x == 0) last_h = nb == 1 || atomicAdd(cnt + nk + h, 1u) == (u32)nb - 1;
    __syncthreads();
}

// A Gated DeltaNet layer's 1..DR_MAXN tokens (a decode step, or the verify forward of a
// speculative block) in one launch: ssm_conv, gated_delta and rms_norm_gated (with its
// q8_1 for ssm_out when xq is set). Grid (nb, n_v): a head's d_v state columns are split
// over nb blocks, DR_CPW columns a warp; with `clu` the nb blocks of a head are a cluster.
// What the kernel before (the qkv / z GEMV) does not write — the state, the conv windows
// and taps — is read before gdc_wait.
//   1. The block convolves the channels it reads (its key head's q, k and its columns' v),
//      a thread a channel, every token into shared memory in ssm_conv's order; a v
//      channel's new window is stored at once (no other block reads it), a q, k channel's
//      kept in shared memory: every block of the heads on the key head reads that window,
//      so the last of them to count (cnt[kh], counted once the block's reads are done, its
//      atomic's latency under the steps below) stores it at its end.
//   2. A warp a token L2-normalises q and k (l2_norm_qk's order) in shared memory, and
//      keeps their dot product.
//   3. Each warp walks the tokens with its state columns in registers: lane 8c + g holds
//      column c's rows 32m + 4g + e (m, e < 4), so a column's sums are 16 products in the
//      lane and three shuffles, and lane g keeps token g's output (DR_MAXN = 8 lanes).
//      The output comes from the old state (o = decay·q·s + (q·k)·δ); sums in another
//      order than gated_delta's.
//   4. With nb = 1 the block's raw outputs are its head's. With a cluster, each block sums
//      its columns' squares per token, reads the other blocks' sums from their shared
//      memory (in rank order) and normalizes its own columns, where they are, in registers
//      (and writes their q8_1, its columns whole 32-value units). Otherwise the last of the
//      head's blocks to arrive (cnt[nk + h]) normalizes every token's row after the others'
//      raw outputs went through L2 (a warp a row). Sums of squares in another order than
//      rms_norm_gated's. Counters go back to 0. The cluster against the last block, 27B,
//      one-token / 8-row greedy step (H200, same call): Q1_0 3.458 → 3.410 / 5.688 →
//      5.581 ms, Q4_K 6.056 → 6.020 / 9.510 → 9.381.
// ncu, 27B, 8 tokens: 24.2 µs when a warp held rows l + 32r of four columns (every column
// sum a 32-lane reduction, and q, k normalised by every warp inside its chain); alone in
// `bench --profile` 19.8 → 17.2 µs, the 8-row Q1_0 step 6.055 → 5.943 ms (H200).
// qkv [n, 2·nk·dk + nv·dv]; win [kc − 1, that] (oldest first); cw [that, kc];
// alpha, beta [n, nv]; z, out [n, nv·dv]. kc ≤ DR_MAXK; d_k, d_v ≤ 32·GD_ROWS with d_k a
// multiple of 4 (the host checks).
#define DR_MAXN 8
// a[u] ← a[u + B] where sh is set (indices known at compile time: registers, not memory).
template <int B, int N>
__device__ __forceinline__ void shift_down(float (&a)[N], bool sh) {
#pragma unroll
    for (int u = 0; u + B < N; u++) a[u] = sh ? a[u + B] : a[u];
}
// The largest conv kernel: the conv loops run to it unrolled, so a channel's window and
// tap loads are in flight together.
#define DR_MAXK 4
// Channels a thread convolves at once (the 27B's blocks of 256 threads have 2·128 + 32).
#define DR_CPT 3
// State columns a warp owns: 32 lanes, 8 a column.
#define DR_CPW 4
extern "C" __global__ void __launch_bounds__(512, 1)
    delta_rows(const float* qkv, float* win, const float* cw, int kc, const float* alpha,
               const float* beta, const float* a_neg, const float* dt_bias, float* state,
               float* out, int n, int nk, int nv, int dk, int dv, int tiled, const float* nwt,
               const float* z, float eps, i8* xq, float2* xds, u32* cnt, int clu, Pf pf) {
    const int h = blockIdx.y, nb = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    // The block's first state column, the warp's, and the block's columns.
    const int jb = blockIdx.x * nw * DR_CPW, j0 = jb + warp * DR_CPW;
    const int ncol = min(nw * DR_CPW, dv - jb);
    const int kh = tiled ? h % nk : h / max(nv / nk, 1);
    const int key_dim = nk * dk;
    const int cols = 2 * key_dim + nv * dv;
    const int hist = kc - 1;
    const i64 vd = (i64)nv * dv, base = (i64)h * dv;
    float* S = state + (i64)h * dk * dv;
    // Per token, the convolved channels the block reads: q [0, dk), k [dk, 2·dk), the
    // block's v columns [2·dk, 2·dk + ncol).
    __shared__ __align__(16) float xs[DR_MAXN][3 * 32 * GD_ROWS];
    // The key head's q, k windows after the n inputs, stored by its last block.
    __shared__ float qkw[DR_MAXK - 1][2 * 32 * GD_ROWS];
    __shared__ float dec[DR_MAXN], bts[DR_MAXN];
    __shared__ float qks[DR_MAXN];  // token t's q·k (normed q, k)
    __shared__ int last_k, last_h;
    // With a cluster: per token, the warps' and the block's sums of squares, the row's
    // 1 / rms, the block's normalized columns.
    __shared__ float wsq[DR_MAXN][16], bsq[DR_MAXN], inv_rms[DR_MAXN];
    __shared__ float ys[DR_MAXN][16 * DR_CPW];

    // Local channel lc's column in qkv.
    auto chan = [&](int lc) {
        return lc < dk ? kh * dk + lc
               : lc < 2 * dk ? key_dim + kh * dk + lc - dk
                             : 2 * key_dim + h * dv + jb + lc - 2 * dk;
    };

    // The lane's state column and its rows 32m + 4g + e: s[m][e] (four float4 loads).
    const int cl = lane >> 3, g = lane & 7, j = j0 + cl;
    float s[GD_ROWS][4];
#pragma unroll
    for (int m = 0; m < GD_ROWS; m++) {
        const int i = 32 * m + 4 * g;
        const float4 x = i < dk && j < dv ? *(const float4*)(S + (i64)j * dk + i)
                                          : make_float4(0.f, 0.f, 0.f, 0.f);
        s[m][0] = x.x, s[m][1] = x.y, s[m][2] = x.z, s[m][3] = x.w;
    }
    const float an = a_neg[h], dtb = dt_bias[h];
    // The conv, right-aligned: e holds the window then the inputs, taps before the
    // kernel's start are 0, so every index is known at compile time. Channels
    // g0 + i·blockDim (i < DR_CPT) a pass; the first pass's windows and taps (not written
    // by the kernel before) are asked for before the wait.
    const int nch = 2 * dk + ncol, pad = DR_MAXK - kc;
    float e[DR_CPT][DR_MAXK - 1 + DR_MAXN], tp[DR_CPT][DR_MAXK];
    auto load_win = [&](int g0) {
#pragma unroll
        for (int i = 0; i < DR_CPT; i++) {
            const int lc = g0 + i * blockDim.x;
            if (lc >= nch) break;
            const int c = chan(lc);
#pragma unroll
            for (int m = 0; m < DR_MAXK - 1; m++)
                e[i][m] = m >= pad ? win[(i64)(m - pad) * cols + c] : 0.f;
#pragma unroll
            for (int u = 0; u < DR_MAXK; u++)
                tp[i][u] = u >= pad ? cw[(i64)c * kc + u - pad] : 0.f;
        }
    };
    load_win(threadIdx.x);

    pf_issue(pf);
    gdc_wait();
    if (threadIdx.x < n) {
        const int t = threadIdx.x;
        dec[t] = expf(an * softplus_f(alpha[(i64)t * nv + h] + dtb));
        bts[t] = sigmoid_f(beta[(i64)t * nv + h]);
    }
    for (int g0 = threadIdx.x; g0 < nch; g0 += DR_CPT * blockDim.x) {
        if (g0 != threadIdx.x) load_win(g0);
#pragma unroll
        for (int i = 0; i < DR_CPT; i++) {
            const int lc = g0 + i * blockDim.x;
            if (lc >= nch) break;
            const int c = chan(lc);
#pragma unroll
            for (int t = 0; t < DR_MAXN; t++)
                e[i][DR_MAXK - 1 + t] = t < n ? qkv[(i64)t * cols + c] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < DR_CPT; i++) {
            const int lc = g0 + i * blockDim.x;
            if (lc >= nch) break;
#pragma unroll
            for (int t = 0; t < DR_MAXN; t++) {
                if (t >= n) break;
                float acc = 0.f;
#pragma unroll
                for (int u = 0; u < DR_MAXK; u++)
                    if (u >= pad) acc += e[i][t + u] * tp[i][u];
                xs[t][lc] = silu_f(acc);
            }
            // The window after the inputs, the last hist of window then inputs: e[pad + n + m],
            // shifted down by pad + n a bit at a time (an index not known at compile time
            // would put e in local memory).
            float nwv[DR_MAXK - 1 + DR_MAXN];
#pragma unroll
            for (int u = 0; u < DR_MAXK - 1 + DR_MAXN; u++) nwv[u] = e[i][u];
            const int sh = pad + n;  // < 2⁴
            shift_down<1>(nwv, sh & 1);
            shift_down<2>(nwv, sh & 2);
            shift_down<4>(nwv, sh & 4);
            shift_down<8>(nwv, sh & 8);
            const int c = chan(lc);
#pragma unroll
            for (int m = 0; m < DR_MAXK - 1; m++) {
                if (m >= hist) break;
                if (lc < 2 * dk) qkw[m][lc] = nwv[m];
                else win[(i64)m * cols + c] = nwv[m];
            }
        }
    }
    __syncthreads();
    // The block's reads of the key head's windows are done: count it (the old count is
    // first used at the end). With a cluster, after its first barrier: the release arrive
    // (MEMBAR.ALL.GPU) would wait for the atomic's round trip.
    u32 k_seen = 0;
    if (threadIdx.x == 0 && !clu) k_seen = atomicAdd(cnt + kh, 1u);
    // q and k of token t L2-normalised by warp t (q also by 1/√d_k).
    for (int t = warp; t < n; t += nw) {
        float q[GD_ROWS], k[GD_ROWS];
#pragma unroll
        for (int r = 0; r < GD_ROWS; r++) {
            const int i = lane + 32 * r;
            q[r] = i < dk ? xs[t][i] : 0.f;
            k[r] = i < dk ? xs[t][dk + i] : 0.f;
        }
        l2_norm_qk(q, k, dk);
#pragma unroll
        for (int r = 0; r < GD_ROWS; r++) {
            const int i = lane + 32 * r;
            if (i < dk) xs[t][i] = q[r], xs[t][dk + i] = k[r];
        }
        float qk = 0.f;
#pragma unroll
        for (int r = 0; r < GD_ROWS; r++) qk += q[r] * k[r];
        qk = warp_sum(qk);
        if (lane == 0) qks[t] = qk;
    }
    __syncthreads();

    // The delta rule per token: p = Σ_i k_i s_i, δ = β (v − decay·p), s_i ← decay·s_i + k_i δ,
    // o = Σ_i q_i s_i (of the new s). Rows past d_k hold k = q = s = 0 and columns past d_v
    // v = s = 0.
    const int jl = warp * DR_CPW + cl;
    const bool jin = j < dv;
    // With a cluster, the lane's (token g, column j) gate and norm weight, asked for now.
    const bool mine = g < n && jin;
    const i64 at = (i64)g * vd + base + j;
    const float zv = clu && mine ? z[at] : 0.f, wv = clu && mine ? nwt[j] : 0.f;
    float oo = 0.f;  // token g's output of column j
    for (int t = 0; t < n; t++) {
        float q[GD_ROWS][4], k[GD_ROWS][4];
#pragma unroll
        for (int m = 0; m < GD_ROWS; m++) {
            const int i = 32 * m + 4 * g;
            const float4 a = i < dk ? *(const float4*)&xs[t][i] : make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 b =
                i < dk ? *(const float4*)&xs[t][dk + i] : make_float4(0.f, 0.f, 0.f, 0.f);
            q[m][0] = a.x, q[m][1] = a.y, q[m][2] = a.z, q[m][3] = a.w;
            k[m][0] = b.x, k[m][1] = b.y, k[m][2] = b.z, k[m][3] = b.w;
        }
        const float v = jin ? xs[t][2 * dk + jl] : 0.f;
        const float decay = dec[t], bt = bts[t];
        // o = q·s after the update = decay·(q·s before) + (q·k)·δ: both sums over the old
        // state, reduced side by side, so a token's chain has one shuffle round, not two
        // (27B Q1_0 8-row greedy step 5.072 / 5.071 → 5.055 / 5.067 ms, H100, session 64).
        float pm[GD_ROWS], am[GD_ROWS];
#pragma unroll
        for (int m = 0; m < GD_ROWS; m++) {
            pm[m] = 0.f, am[m] = 0.f;
#pragma unroll
            for (int x = 0; x < 4; x++) {
                pm[m] += k[m][x] * s[m][x];
                am[m] += q[m][x] * s[m][x];
            }
        }
        float p = (pm[0] + pm[1]) + (pm[2] + pm[3]), a = (am[0] + am[1]) + (am[2] + am[3]);
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) {
            p += __shfl_xor_sync(0xffffffffu, p, o);
            a += __shfl_xor_sync(0xffffffffu, a, o);
        }
        const float d = bt * (v - decay * p);
#pragma unroll
        for (int m = 0; m < GD_ROWS; m++) {
#pragma unroll
            for (int x = 0; x < 4; x++) s[m][x] = decay * s[m][x] + k[m][x] * d;
        }
        if (g == t) oo = __fmaf_rn(decay, a, qks[t] * d);
    }
    if (clu) {
#if __CUDA_ARCH__ >= 900
        // Token g's squares over the warp's columns (lanes 8c + g), then the block's.
        float sq = mine ? oo * oo : 0.f;
        sq += __shfl_xor_sync(0xffffffffu, sq, 8);
        sq += __shfl_xor_sync(0xffffffffu, sq, 16);
        if (lane < DR_MAXN) wsq[lane][warp] = sq;
        __syncthreads();
        if (threadIdx.x < n) {
            float b = 0.f;
            for (int w = 0; w < nw; w++) b += wsq[threadIdx.x][w];
            bsq[threadIdx.x] = b;
        }
        // Every block's bsq is written and visible cluster-wide after this.
        cluster_sync();
        if (threadIdx.x == 0) k_seen = atomicAdd(cnt + kh, 1u);
        if (threadIdx.x < n) {
            float b[8];
#pragma unroll
            for (int r = 0; r < 8; r++) b[r] = r < nb ? ld_cluster(&bsq[threadIdx.x], r) : 0.f;
            float tot = 0.f;
#pragma unroll
            for (int r = 0; r < 8; r++) tot += b[r];
            inv_rms[threadIdx.x] = 1.0f / sqrtf(tot / (float)dv + eps);
        }
        // No block leaves while another still reads its bsq: arrive here, wait at the end.
        // Relaxed: the reads of the others' bsq are done (inv_rms holds their sum).
        cluster_arrive_relaxed();
        __syncthreads();
        if (mine) {
            const float y = oo * inv_rms[g] * wv * silu_f(zv);
            out[at] = y;
            ys[g][jl] = y;
        }
        if (xq) {
            __syncthreads();
            // Token t's 32-value unit c of the block's columns, a warp each.
            const int units = ncol >> 5;
            for (int p = warp; p < n * units; p += nw) {
                const int t = p / units, c = p - t * units;
                q8_1_warp(ys[t][32 * c + lane], xq, xds,
                          ((i64)t * vd + base + jb + 32 * c) >> 5, lane);
            }
        }
        // The state last: cluster_sync's release arrive waited for every store in flight
        // (ERRBAR, 8–12% of the warps' samples when the state went before it; ncu, 27B).
#pragma unroll
        for (int m = 0; m < GD_ROWS; m++) {
            const int i = 32 * m + 4 * g;
            if (i < dk && jin)
                *(float4*)(S + (i64)j * dk + i) =
                    make_float4(s[m][0], s[m][1], s[m][2], s[m][3]);
        }
        if (threadIdx.x == 0) last_k = k_seen == (u32)(nv / nk * nb) - 1;
        __syncthreads();
        cluster_wait();
        if (!last_k) return;
        for (int lc = threadIdx.x; lc < 2 * dk; lc += blockDim.x) {
            const int c = chan(lc);
            for (int m = 0; m < hist; m++) win[(i64)m * cols + c] = qkw[m][lc];
        }
        if (threadIdx.x == 0) cnt[kh] = 0;
        return;
#endif
    }
    if (g < n && jin) out[(i64)g * vd + base + j] = oo;
    // The raw outputs are visible to the head's last block (the state is stored after the
    // arrive: the fence would wait on those stores too).
    __threadfence();
    if (threadIdx.x == 0) last_k = k_seen == (u32)(nv / nk * nb) - 1;
    __syncthreads();
    dr_arrive(cnt, h, nk, nb, last_h);
    if (last_h) {
        __threadfence();
        const volatile float* ov = out;
        // The gated norm of token t's row, a warp a row.
        for (int t = warp; t < n; t += nw) {
            const i64 row = (i64)t * vd + base;
            float x[GD_ROWS], zr[GD_ROWS], wr[GD_ROWS], sq = 0.f;
#pragma unroll
            for (int r = 0; r < GD_ROWS; r++) {
                const int jj = lane + 32 * r;
                x[r] = jj < dv ? ov[row + jj] : 0.f;
                zr[r] = jj < dv ? z[row + jj] : 0.f;
                wr[r] = jj < dv ? nwt[jj] : 0.f;
            }
#pragma unroll
            for (int r = 0; r < GD_ROWS; r++) sq += x[r] * x[r];
            sq = warp_sum(sq);
            const float inv = 1.0f / sqrtf(sq / (float)dv + eps);
#pragma unroll
            for (int r = 0; r < GD_ROWS; r++) {
                const int jj = lane + 32 * r;
                if (jj - lane >= dv) break;
                const bool in = jj < dv;
                const float y = in ? x[r] * inv * wr[r] * silu_f(zr[r]) : 0.f;
                if (in) out[row + jj] = y;
                if (xq) q8_1_warp(y, xq, xds, (row + jj) >> 5, lane);
            }
        }
        if (threadIdx.x == 0 && nb > 1) cnt[nk + h] = 0;
    }
#pragma unroll
    for (int m = 0; m < GD_ROWS; m++) {
        const int i = 32 * m + 4 * g;
        if (i < dk && jin)
            *(float4*)(S + (i64)j * dk + i) = make_float4(s[m][0], s[m][1], s[m][2], s[m][3]);
    }
    if (!last_k) return;
    for (int lc = threadIdx.x; lc < 2 * dk; lc += blockDim.x) {
        const int c = chan(lc);
        for (int m = 0; m < hist; m++) win[(i64)m * cols + c] = qkw[m][lc];
    }
    if (threadIdx.x == 0) cnt[kh] = 0;
}
