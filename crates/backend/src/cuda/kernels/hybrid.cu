// The ops of hybrid (Gated DeltaNet) and MoE models: the causal short conv over the
// recurrent window, the gated delta rule (one kernel for decode and prefill: the state
// stays in registers while the block walks the tokens), gated RMSNorm, sigmoid gating,
// strided column copies and the row gather / scatter-add around MoE experts.
// The numerics follow the CPU backend (cpu/gated_delta.rs).

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch's softplus (beta 1, threshold 20), as the CPU's.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#define CONV_MAXK 16

// Depthwise causal conv of x ([rows, ch], in place) after the window win ([k − 1, ch],
// oldest first), then SiLU; the window moves to the last k − 1 inputs. w is [ch, k], oldest
// tap first. One thread per channel walks the rows, the window in registers.
extern "C" __global__ void ssm_conv(float* x, float* win, const float* w, int rows, int ch,
                                    int k) {
    gdc_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    const int hist = k - 1;
    float h[CONV_MAXK], tap[CONV_MAXK];
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++) {
        h[j] = j < hist ? win[(i64)j * ch + c] : 0.f;
        tap[j] = j < k ? w[(i64)c * k + j] : 0.f;
    }
    for (int t = 0; t < rows; t++) {
        const float xin = x[(i64)t * ch + c];
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < CONV_MAXK; j++)
            if (j < hist) s += h[j] * tap[j];
        s += xin * tap[hist];
        x[(i64)t * ch + c] = silu_f(s);
        // Shift the window by one input.
#pragma unroll
        for (int j = 0; j + 1 < CONV_MAXK; j++)
            if (j + 1 < hist) h[j] = h[j + 1];
        if (hist > 0) {
#pragma unroll
            for (int j = 0; j < CONV_MAXK; j++)
                if (j == hist - 1) h[j] = xin;
        }
    }
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++)
        if (j < hist) win[(i64)j * ch + c] = h[j];
}

// Rows of the state each thread keeps in registers: the block has ceil(d_k / GD_RPT) warps.
#define GD_RPT 8
#define GD_MAXW 32

// Block sum of one value per thread of a [nw][32] layout over the warps: out[lane] = Σ_w v.
// Every thread returns the column total of its lane.
__device__ __forceinline__ float col_sum(float v, float (*red)[32], int nw) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    red[warp][lane] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += red[i][lane];
    __syncthreads();
    return s;
}

// One delta-rule step on this thread's rows of a state column (rows warp + nw·r, r <
// GD_RPT): with the L2-normed k (ks·ik) and q (qs·iq), δ = β·(v − decay·Σ_i s_i k_i), then
// s ← decay·s + k·δ; returns the column's output Σ_i q_i s_i (both sums over the block).
__device__ __forceinline__ float delta_rule_step(float (&s)[GD_RPT], const float* ks,
                                                 const float* qs, float ik, float iq,
                                                 float decay, float bt, float v,
                                                 float (*red)[32], int nw, int warp, int dk) {
    float p = 0.f;
#pragma unroll
    for (int r = 0; r < GD_RPT; r++) {
        const int i = warp + nw * r;
        if (i < dk) p += ks[i] * ik * s[r];
    }
    const float sk_col = col_sum(p, red, nw);
    const float delta = bt * (v - decay * sk_col);
    float o = 0.f;
#pragma unroll
    for (int r = 0; r < GD_RPT; r++) {
        const int i = warp + nw * r;
        if (i < dk) {
            s[r] = decay * s[r] + ks[i] * ik * delta;
            o += qs[i] * iq * s[r];
        }
    }
    return col_sum(o, red, nw);
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

// The gated delta rule of one value head over n tokens, continuing its state S
// ([d_k, d_v] f32, in place). Grid: (n_v, ceil(d_v / 32)); block: 32 × nw threads, lane =
// column of the tile, warp w keeps rows w + nw·r (r < GD_RPT) of those columns in
// registers. Per token: q, k of the head's key head are L2-normalised (q also by
// 1/√d_k), g = a_neg·softplus(alpha + dt_bias), β = sigmoid(beta), then
//   δ = β (v − exp(g) Sᵀk);  S ← exp(g) S + k δᵀ;  o = Sᵀq.
// qkv rows are [q n_k·d_k | k n_k·d_k | v n_v·d_v]; out is [n, n_v·d_v].
extern "C" __global__ void __launch_bounds__(1024)
    gated_delta(const float* qkv, const float* alpha, const float* beta, const float* a_neg,
                const float* dt_bias, float* state, float* out, int n, int nk, int nv, int dk,
                int dv, int tiled) {
    gdc_wait();
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    const int j = blockIdx.y * 32 + lane;
    const bool col = j < dv;
    const int kh = tiled ? h % nk : h / max(nv / nk, 1);
    const int key_dim = nk * dk;
    const int cols = 2 * key_dim + nv * dv;
    float* S = state + (i64)h * dk * dv;

    __shared__ float qs[GD_RPT * GD_MAXW], ks[GD_RPT * GD_MAXW];
    __shared__ float red[GD_MAXW][32];
    __shared__ float red1[GD_MAXW];

    float s[GD_RPT];
#pragma unroll
    for (int r = 0; r < GD_RPT; r++) {
        const int i = warp + nw * r;
        s[r] = (col && i < dk) ? S[(i64)i * dv + j] : 0.f;
    }
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < n; t++) {
        const float* row = qkv + (i64)t * cols;
        // q, k of the key head into shared memory, with their squared norms.
        float sq = 0.f, sk = 0.f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            const float a = row[kh * dk + i], b = row[key_dim + kh * dk + i];
            qs[i] = a;
            ks[i] = b;
            sq += a * a;
            sk += b * b;
        }
        sq = block_sum(sq, red1, nw);
        sk = block_sum(sk, red1, nw);
        const float iq = qscale / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        const float g = a_neg[h] * softplus_f(alpha[(i64)t * nv + h] + dt_bias[h]);
        const float bt = sigmoid_f(beta[(i64)t * nv + h]);
        const float decay = expf(g);
        const float v = col ? row[2 * key_dim + h * dv + j] : 0.f;
        const float o = delta_rule_step(s, ks, qs, ik, iq, decay, bt, v, red, nw, warp, dk);
        if (col && warp == 0) out[(i64)t * nv * dv + (i64)h * dv + j] = o;
    }
#pragma unroll
    for (int r = 0; r < GD_RPT; r++) {
        const int i = warp + nw * r;
        if (col && i < dk) S[(i64)i * dv + j] = s[r];
    }
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

// One decode token of a Gated DeltaNet layer in one launch: ssm_conv, gated_delta and
// rms_norm_gated (with its q8_1 for ssm_out when xq is set), with each op's arithmetic in
// its order, so the results are those of the three kernels above.
// Grid and block as gated_delta's: block (h, y) convolves what it reads itself (the q, k
// channels of its key head, its 32 v channels) from the raw qkv row (not written). Its v
// channels' window is its own to move; a key head's q, k window is read by every block of
// the heads on it, so the last of those to arrive (cnt[kh]) moves it. The norm spans the
// head's d_v outputs over gridDim.y blocks: each writes its columns of out, and the last
// to arrive (cnt[nk + h]) normalizes the head. Counters go back to 0 for the next call.
// qkv [2·nk·dk + nv·dv]; win [kc − 1, that] (oldest first); cw [that, kc]; z, out [nv·dv].
extern "C" __global__ void __launch_bounds__(1024)
    delta_step(const float* qkv, float* win, const float* cw, int kc, const float* alpha,
               const float* beta, const float* a_neg, const float* dt_bias, float* state,
               float* out, int nk, int nv, int dk, int dv, int tiled, const float* nwt,
               const float* z, float eps, i8* xq, float2* xds, u32* cnt) {
    gdc_wait();
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    const int j = blockIdx.y * 32 + lane;
    const bool col = j < dv;
    const int kh = tiled ? h % nk : h / max(nv / nk, 1);
    const int key_dim = nk * dk;
    const int cols = 2 * key_dim + nv * dv;
    const int hist = kc - 1;
    float* S = state + (i64)h * dk * dv;

    __shared__ float qs[GD_RPT * GD_MAXW], ks[GD_RPT * GD_MAXW];
    __shared__ float red[GD_MAXW][32];
    __shared__ float red1[GD_MAXW];
    __shared__ int last;

    // ssm_conv of channel c: the window, then the new input, then SiLU.
    auto conv = [&](int c) {
        float s = 0.f;
        for (int t = 0; t < hist; t++) s += win[(i64)t * cols + c] * cw[(i64)c * kc + t];
        s += qkv[c] * cw[(i64)c * kc + hist];
        return silu_f(s);
    };
    // Moves channel c's window by the new input.
    auto shift = [&](int c) {
        for (int t = 0; t + 1 < hist; t++) win[(i64)t * cols + c] = win[(i64)(t + 1) * cols + c];
        if (hist > 0) win[(i64)(hist - 1) * cols + c] = qkv[c];
    };

    float s[GD_RPT];
#pragma unroll
    for (int r = 0; r < GD_RPT; r++) {
        const int i = warp + nw * r;
        s[r] = (col && i < dk) ? S[(i64)i * dv + j] : 0.f;
    }
    const float qscale = 1.0f / sqrtf((float)dk);
    const int cv = 2 * key_dim + h * dv + j;
    const float v = col ? conv(cv) : 0.f;
    float sq = 0.f, sk = 0.f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float a = conv(kh * dk + i), b = conv(key_dim + kh * dk + i);
        qs[i] = a;
        ks[i] = b;
        sq += a * a;
        sk += b * b;
    }
    sq = block_sum(sq, red1, nw);
    // Every thread of the block has read the window by now.
    if (col && warp == 0) shift(cv);
    if (threadIdx.x == 0) last = atomicAdd(cnt + kh, 1u) == (u32)(nv / nk * gridDim.y) - 1;
    sk = block_sum(sk, red1, nw);
    if (last) {
        for (int i = threadIdx.x; i < 2 * dk; i += blockDim.x)
            shift(i < dk ? kh * dk + i : key_dim + kh * dk + i - dk);
        if (threadIdx.x == 0) cnt[kh] = 0;
    }
    const float iq = qscale / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
    const float g = a_neg[h] * softplus_f(alpha[h] + dt_bias[h]);
    const float bt = sigmoid_f(beta[h]);
    const float decay = expf(g);
    const float o = delta_rule_step(s, ks, qs, ik, iq, decay, bt, v, red, nw, warp, dk);
    const i64 base = (i64)h * dv;
    if (col && warp == 0) out[base + j] = o;
#pragma unroll
    for (int r = 0; r < GD_RPT; r++) {
        const int i = warp + nw * r;
        if (col && i < dk) S[(i64)i * dv + j] = s[r];
    }
    // The gated norm of the head, by the last of its blocks.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt + nk + h, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile float* ov = out;
    // rms_norm_gated's block of bd threads, bd/32 virtual warps walked by this block's.
    const int bd = min(256, (dv + 31) / 32 * 32), vnw = bd >> 5;
    for (int vw = warp; vw < vnw; vw += nw) {
        float ss = 0.f;
        for (int i = vw * 32 + lane; i < dv; i += bd) {
            const float x = ov[base + i];
            ss += x * x;
        }
        ss = warp_sum(ss);
        if (lane == 0) red1[vw] = ss;
    }
    __syncthreads();
    float ss = 0.f;
    for (int i = 0; i < vnw; i++) ss += red1[i];
    const float inv = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int vw = warp; vw < vnw; vw += nw)
        for (int i = vw * 32 + lane; i < dv; i += bd) {
            const float x = ov[base + i] * inv * nwt[i] * silu_f(z[base + i]);
            out[base + i] = x;
            if (xq) q8_1_warp(x, xq, xds, (base + i) >> 5, lane);
        }
    if (threadIdx.x == 0) cnt[nk + h] = 0;
}
