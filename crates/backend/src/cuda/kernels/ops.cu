// The float ops of the forward pass. Numerics follow the CPU backend where it made a
// choice (f64 sum of squares in RMSNorm, GELU of the f16-rounded input rounded to f16,
// RoPE angles by repeated multiplication, q rounded to f16 before q·k).

// RMSNorm over groups of g values; one block per group. In place when x == out. With Q
// (g a multiple of 32, blockDim too) the output is also written as q8_1 (xq, xds: the
// integer GEMV's activation, for the matmul that reads it next).
// With ADD (whole rows only: g = cols), x += y first (rounded to f32 and stored, as the
// separate `add` would) and the norm reads the sum.
template <bool Q, bool ADD = false>
__device__ __forceinline__ void rms_norm_impl(const float* x, const float* w, float* out, int g,
                                              float eps, i8* xq, float2* xds,
                                              const float* y = nullptr, float* xs = nullptr) {
    const i64 base = (i64)blockIdx.x * g;
    // The first V values of each thread stay in registers, their loads issued together: a
    // loop of dependent load-use rounds made a 4096-wide row take 18.7 µs (ncu, H200).
    constexpr int V = 8;
    float xv[V];
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        xv[k] = i < g ? x[base + i] : 0.f;
        if (ADD && i < g) {
            xv[k] += y[base + i];
            xs[base + i] = xv[k];
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) s += (double)xv[k] * (double)xv[k];
    for (int i = threadIdx.x + V * blockDim.x; i < g; i += blockDim.x) {
        float f = x[base + i];
        if (ADD) {
            f += y[base + i];
            xs[base + i] = f;
        }
        const double v = f;
        s += v * v;
    }
    __shared__ double part[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    const float mean = (float)(part[0] / (double)g);
    const float scale = 1.0f / sqrtf(mean + eps);
    // A warp's lanes hold one whole unit (with Q, g and blockDim are multiples of 32).
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < g) {
            const float v = xv[k] * scale * w[i];
            out[base + i] = v;
            if (Q) q8_1_warp(v, xq, xds, (base + i) >> 5, threadIdx.x & 31);
        }
    }
    // In place, these reads follow only writes to the cached part: no overlap. With ADD,
    // x holds the sum by now (this thread wrote it).
    for (int i = threadIdx.x + V * blockDim.x; i < g; i += blockDim.x) {
        const float v = x[base + i] * scale * w[i];
        out[base + i] = v;
        if (Q) q8_1_warp(v, xq, xds, (base + i) >> 5, threadIdx.x & 31);
    }
}

extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int g,
                                    float eps) {
    rms_norm_impl<false>(x, w, out, g, eps, nullptr, nullptr);
}

extern "C" __global__ void rms_norm_q(const float* x, const float* w, float* out, int g,
                                      float eps, i8* xq, float2* xds) {
    rms_norm_impl<true>(x, w, out, g, eps, xq, xds);
}

// x += y, then out = rms_norm(x) (and its q8_1 with Q): one block per row of g values.
extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float* out,
                                        int g, float eps) {
    rms_norm_impl<false, true>(x, w, out, g, eps, nullptr, nullptr, y, x);
}

extern "C" __global__ void add_rms_norm_q(float* x, const float* y, const float* w, float* out,
                                          int g, float eps, i8* xq, float2* xds) {
    rms_norm_impl<true, true>(x, w, out, g, eps, xq, xds, y, x);
}

extern "C" __global__ void add(float* x, const float* y, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" __global__ void add_bias(float* x, const float* b, int cols, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % cols];
}

extern "C" __global__ void softcap(float* x, float cap, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

__device__ __forceinline__ float silu_mul(float v, float u) { return v / (1.0f + expf(-v)) * u; }

__device__ __forceinline__ float gelu_mul(float v, float u) {
    if (v <= -10.0f) return 0.0f;
    if (v >= 10.0f) return v * u;
    const float xh = h2f(f2h(v));
    const float t = tanhf(0.7978846f * xh * (1.0f + 0.044715f * xh * xh));
    return h2f(f2h(0.5f * xh * (1.0f + t))) * u;
}

extern "C" __global__ void glu_silu(float* g, const float* u, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_mul(g[i], u[i]);
}

extern "C" __global__ void glu_gelu(float* g, const float* u, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = gelu_mul(g[i], u[i]);
}

// The same, also writing the product as q8_1 (n a multiple of 32, so a warp is all in or
// all out).
extern "C" __global__ void glu_silu_q(float* g, const float* u, i64 n, i8* xq, float2* xds) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float r = silu_mul(g[i], u[i]);
    g[i] = r;
    q8_1_warp(r, xq, xds, i >> 5, threadIdx.x & 31);
}

extern "C" __global__ void glu_gelu_q(float* g, const float* u, i64 n, i8* xq, float2* xds) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float r = gelu_mul(g[i], u[i]);
    g[i] = r;
    q8_1_warp(r, xq, xds, i >> 5, threadIdx.x & 31);
}

// x [rows, cols] f32 → dst [rows, kp] f16, zero past cols.
extern "C" __global__ void to_f16(const float* x, u16* dst, int rows, int cols, int kp) {
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)rows * kp) return;
    const int r = (int)(t / kp), c = (int)(t % kp);
    dst[t] = c < cols ? f2h(x[(i64)r * cols + c]) : (u16)0;
}

// RoPE. Grid: (rows, blocks over the (head, pair)s); a thread per pair. theta_scale, c0, c1 and mscale_yarn come
// from the host so they round exactly as the CPU's.
// `posp`, when set, holds the position instead of pos0 (a replayed CUDA graph's step).
extern "C" __global__ void rope(float* x, int cols, int head_dim, int dims, int pos0, int neox,
                                float theta_scale, float freq_scale, float ext_factor,
                                float attn_factor, float c0, float c1, float mscale_yarn,
                                const float* ff, const int* posp) {
    if (posp) pos0 = *posp;
    const int r = blockIdx.x;
    const int half = dims / 2;
    const int n_heads = cols / head_dim;
    for (int t = blockIdx.y * blockDim.x + threadIdx.x; t < n_heads * half;
         t += gridDim.y * blockDim.x) {
        const int h = t / half, i = t % half;
        float theta = (float)(pos0 + r);
        for (int k = 0; k < i; k++) theta *= theta_scale;
        const float f = ff ? ff[i] : 1.0f;
        const float extrap = theta / f;
        const float interp = freq_scale * extrap;
        float th = interp, ms = attn_factor;
        if (ext_factor != 0.0f) {
            const float y = ((float)i - c0) / fmaxf(c1 - c0, 0.001f);
            const float ramp = 1.0f - fminf(fmaxf(y, 0.0f), 1.0f);
            const float mix = ramp * ext_factor;
            th = interp * (1.0f - mix) + extrap * mix;
            ms *= mscale_yarn;
        }
        const float c = cosf(th) * ms, s = sinf(th) * ms;
        float* hp = x + (i64)r * cols + (i64)h * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = hp[a], x1 = hp[b];
        hp[a] = x0 * c - x1 * s;
        hp[b] = x0 * s + x1 * c;
    }
}

// Store k, v ([rows, nkv·hd] f32) as f16 at positions pos0.. of one layer's cache
// ([nkv, n_ctx, hd] each).
extern "C" __global__ void kv_store(const float* k, const float* v, u16* kc, u16* vc, int rows,
                                    int nkv, int hd, int n_ctx, int pos0, const int* posp) {
    if (posp) pos0 = *posp;
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 n = (i64)rows * nkv * hd;
    if (t >= n) return;
    const int d = (int)(t % hd);
    const int h = (int)((t / hd) % nkv);
    const int r = (int)(t / ((i64)hd * nkv));
    const i64 dst = ((i64)h * n_ctx + pos0 + r) * hd + d;
    kc[dst] = f2h(k[t]);
    vc[dst] = f2h(v[t]);
}

#define ATT_WARPS 4
#define ATT_MAXD 8  // head_dim ≤ 256

// Flash-decoding: block (head, row, split) runs an online softmax over its share of the
// visible positions, one position per warp at a time (lanes own dims lane + 32j), then
// merges its warps. With nsplit == 1 it writes the output; otherwise a partial
// (max, sum, acc[hd]) that att_combine merges.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    attention(const float* q, const u16* kc, const u16* vc, float* out, float* part, int nh,
              int nkv, int hd, int n_ctx, int pos0, float scale, int window, float softcap,
              int nsplit, const int* posp) {
    if (posp) pos0 = *posp;
    const int h = blockIdx.x, r = blockIdx.y, sp = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = h / (nh / nkv);
    const int p = pos0 + r;
    const int lo = window > 0 ? max(0, p + 1 - window) : 0;
    const int n_pos = p + 1 - lo;
    const int per = (n_pos + nsplit - 1) / nsplit;
    const int t0 = lo + sp * per, t1 = min(p + 1, t0 + per);

    float qv[ATT_MAXD], acc[ATT_MAXD];
    const float* qr = q + (i64)r * nh * hd + (i64)h * hd;
#pragma unroll
    for (int j = 0; j < ATT_MAXD; j++) {
        const int d = lane + 32 * j;
        qv[j] = d < hd ? h2f(f2h(qr[d])) : 0.f;
        acc[j] = 0.f;
    }
    const u16* kb = kc + (i64)kh * n_ctx * hd;
    const u16* vb = vc + (i64)kh * n_ctx * hd;
    float m = NEG_INF, l = 0.f;
    for (int t = t0 + warp; t < t1; t += ATT_WARPS) {
        const u16* kt = kb + (i64)t * hd;
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < ATT_MAXD; j++) {
            const int d = lane + 32 * j;
            if (d < hd) s += qv[j] * h2f(kt[d]);
        }
        s = warp_sum(s) * scale;
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), pw = expf(s - mn);
        l = l * corr + pw;
        const u16* vt = vb + (i64)t * hd;
#pragma unroll
        for (int j = 0; j < ATT_MAXD; j++) {
            const int d = lane + 32 * j;
            if (d < hd) acc[j] = acc[j] * corr + pw * h2f(vt[d]);
        }
        m = mn;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][32 * ATT_MAXD];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATT_MAXD; j++) sacc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    float M = NEG_INF;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.f;
    float f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm[w] == NEG_INF ? 0.f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) a += sacc[w][d] * f[w];
        if (nsplit == 1) {
            out[(i64)r * nh * hd + (i64)h * hd + d] = a / L;
        } else {
            float* pp = part + (((i64)r * nh + h) * nsplit + sp) * (hd + 2);
            pp[2 + d] = a;
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
        }
    }
}

// Merge the nsplit partials of each (row, head). Grid: (nh, rows).
extern "C" __global__ void att_combine(const float* part, float* out, int nh, int hd,
                                       int nsplit) {
    const int h = blockIdx.x, r = blockIdx.y;
    const float* pp = part + ((i64)r * nh + h) * nsplit * (hd + 2);
    float M = NEG_INF;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, pp[s * (hd + 2)]);
    float L = 0.f;
    for (int s = 0; s < nsplit; s++) {
        const float ms = pp[s * (hd + 2)];
        if (ms != NEG_INF) L += pp[s * (hd + 2) + 1] * expf(ms - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < nsplit; s++) {
            const float ms = pp[s * (hd + 2)];
            if (ms != NEG_INF) a += pp[s * (hd + 2) + 2 + d] * expf(ms - M);
        }
        out[(i64)r * nh * hd + (i64)h * hd + d] = a / L;
    }
}

// Greedy pick of each row: the highest value, the lowest index among equals, NaN ignored
// (-1 while none is seen; a row of NaNs gives 0). Grid: rows; 1,024 threads.
__device__ __forceinline__ void amax_merge(float& v, int& i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

extern "C" __global__ void argmax_rows(const float* x, int cols, unsigned* out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* row = x + (i64)blockIdx.x * cols;
    float v = 0.0f;
    int i = -1;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float y = row[c];
        if (!isnan(y)) amax_merge(v, i, y, c);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_down_sync(0xffffffffu, v, o);
        const int i2 = __shfl_down_sync(0xffffffffu, i, o);
        amax_merge(v, i, v2, i2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        v = lane < nw ? sv[lane] : 0.0f;
        i = lane < nw ? si[lane] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_down_sync(0xffffffffu, v, o);
            const int i2 = __shfl_down_sync(0xffffffffu, i, o);
            amax_merge(v, i, v2, i2);
        }
        if (lane == 0) out[blockIdx.x] = i < 0 ? 0u : (unsigned)i;
    }
}
