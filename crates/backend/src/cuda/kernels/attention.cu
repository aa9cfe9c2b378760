// RoPE, the KV-cache store (f16 or q8_0), attention (flash-decoding, per query head or
// grouped per kv head, and the merge of its splits) and the fused attention input
// (`qk_norm_rope`): the host side is attention.rs and fused.rs. Compiled as one module with
// ops.cu (modules.rs `OPS`).

// RoPE. Grid: (rows, blocks over the (head, pair)s); a thread per pair. theta_scale, c0, c1 and mscale_yarn come
// from the host so they round exactly as the CPU's.
// `posp`, when set, holds the position instead of pos0 (a replayed CUDA graph's step).
extern "C" __global__ void rope(float* x, int cols, int head_dim, int dims, int pos0, int neox,
                                float theta_scale, float freq_scale, float ext_factor,
                                float attn_factor, float c0, float c1, float mscale_yarn,
                                const float* ff, const int* posp) {
    gdc_wait();
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

// A layer's q8_0 cache (KvType::Q8_0; attention.rs `kv_layer_bytes`): the codes of every
// kv head, [nkv, n_ctx, hd] i8, then their scales, [nkv, n_ctx, hd/32] f16 — ggml's q8_0
// blocks split into two planes so that key rows stay 16-byte loads.
__device__ __forceinline__ u16* kv_q8_scales(const u8* c, int nkv, int n_ctx, int hd) {
    return (u16*)(c + (i64)nkv * n_ctx * hd);
}

// Value x of dim d of head h at position pos into a layer's q8_0 cache c, by a warp whose
// 32 lanes hold the 32 values of d's block (lane = d % 32): the CPU's `kv_store` (ggml's
// q8_0: scale = max|x| / 127 kept as f16, code = round(x / scale) from the unrounded scale;
// a NaN counts 0 in the max and codes 0).
__device__ __forceinline__ void kv_q8_put(u8* c, int nkv, int n_ctx, int hd, int h, int pos,
                                          int d, float x) {
    const float amax = warp_max(fmaxf(0.f, fabsf(x)));
    const float sc = amax / 127.0f;
    const float inv = sc != 0.f ? 1.0f / sc : 0.f;
    const i64 row = (i64)h * n_ctx + pos;
    c[row * hd + d] = (u8)(i8)(int)roundf(x * inv);
    if ((d & 31) == 0) kv_q8_scales(c, nkv, n_ctx, hd)[row * (hd >> 5) + (d >> 5)] = f2h(sc);
}

// Value x of dim d of head h at position pos into a layer's cache c: f16, or q8_0 (Q8; by a
// warp holding d's block, as `kv_q8_put`).
template <bool Q8>
__device__ __forceinline__ void kv_put(u8* c, int nkv, int n_ctx, int hd, int h, int pos, int d,
                                       float x) {
    if constexpr (Q8) {
        kv_q8_put(c, nkv, n_ctx, hd, h, pos, d, x);
    } else {
        ((u16*)c)[((i64)h * n_ctx + pos) * hd + d] = f2h(x);
    }
}

// Store k, v ([rows, nkv·hd] f32) at positions pos0.. of one layer's cache: f16 rows
// ([nkv, n_ctx, hd] each), or q8_0 (hd a multiple of 32, so a warp is one block).
template <bool Q8>
__device__ __forceinline__ void kv_store_rows(const float* k, const float* v, u8* kc, u8* vc,
                                              int rows, int nkv, int hd, int n_ctx, int pos0) {
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 n = (i64)rows * nkv * hd;
    if (t >= n) return;
    const int d = (int)(t % hd);
    const int h = (int)((t / hd) % nkv);
    const int r = (int)(t / ((i64)hd * nkv));
    kv_put<Q8>(kc, nkv, n_ctx, hd, h, pos0 + r, d, k[t]);
    kv_put<Q8>(vc, nkv, n_ctx, hd, h, pos0 + r, d, v[t]);
}

extern "C" __global__ void kv_store(const float* k, const float* v, u8* kc, u8* vc, int rows,
                                    int nkv, int hd, int n_ctx, int pos0, const int* posp) {
    gdc_wait();
    if (posp) pos0 = *posp;
    kv_store_rows<false>(k, v, kc, vc, rows, nkv, hd, n_ctx, pos0);
}

extern "C" __global__ void kv_store_q8(const float* k, const float* v, u8* kc, u8* vc,
                                       int rows, int nkv, int hd, int n_ctx, int pos0,
                                       const int* posp) {
    gdc_wait();
    if (posp) pos0 = *posp;
    kv_store_rows<true>(k, v, kc, vc, rows, nkv, hd, n_ctx, pos0);
}

// RoPE and the per-head norms of `qk_norm_rope`, every constant from the host (fused.rs
// `QkArgs`, the same layout) so they round exactly as the CPU's.
struct QkArgs {
    const float* wq;  // q's per-head norm weight (null: no norm)
    const float* wk;
    const float* ff;    // Llama 3.1's frequency factors (null: none)
    const int* posp;    // the step's position when set (a replayed CUDA graph), else pos0
    float eps, theta_scale, freq_scale, ext_factor, attn_q, attn_k, c0, c1, mscale_yarn;
    int dims, neox, pos0;
};

// The angle of rotated pair i at position pos, as `rope` computes it (repeated products).
__device__ __forceinline__ float rope_theta(const QkArgs& a, int i, int pos) {
    float theta = (float)pos;
    for (int j = 0; j < i; j++) theta *= a.theta_scale;
    const float f = a.ff ? a.ff[i] : 1.0f;
    const float extrap = theta / f;
    const float interp = a.freq_scale * extrap;
    if (a.ext_factor == 0.0f) return interp;
    const float y = ((float)i - a.c0) / fmaxf(a.c1 - a.c0, 0.001f);
    const float ramp = 1.0f - fminf(fmaxf(y, 0.0f), 1.0f);
    const float mix = ramp * a.ext_factor;
    return interp * (1.0f - mix) + extrap * mix;
}

// cos and sin of every rotated pair's angle at position pos into rc, rs (shared, dims/2
// each), by the block's threads. Reads only the host's constants and the frequency
// factors (weights), so a kernel may run it before its gdc_wait(), off the critical path.
__device__ __forceinline__ void rope_table(const QkArgs& a, int pos, float* rc, float* rs) {
    for (int i = threadIdx.x; i < a.dims / 2; i += blockDim.x) {
        const float th = rope_theta(a, i, pos);
        rc[i] = cosf(th);
        rs[i] = sinf(th);
    }
}

// One head of hd ≤ 1024 values in shared memory (hs), in place: RMS-normed by w (none where
// null), then its first a.dims values rotated by the `rope_table` rc, rs with attention
// factor at. Any block size of whole warps: the sum of squares follows rms_norm's order for
// a block of ceil32(hd) threads, a value each (a warp of 32 values, a butterfly, then one
// warp over the warps' parts), so the results are the separate ops' bits. Starts and ends
// with the block's barrier.
__device__ __forceinline__ void norm_rope_head(float* hs, int hd, const float* w, float at,
                                               const QkArgs& a, const float* rc,
                                               const float* rs) {
    __shared__ double part[32];
    __shared__ float scale;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int nvw = (hd + 31) >> 5;
    __syncthreads();
    if (w) {
        for (int vw = warp; vw < nvw; vw += nw) {
            const int i = vw * 32 + lane;
            const float x = i < hd ? hs[i] : 0.f;
            double s = (double)x * (double)x;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) part[vw] = s;
        }
        __syncthreads();
        if (warp == 0) {
            double t = lane < nvw ? part[lane] : 0.0;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            const float mean = (float)(t / (double)hd);
            if (lane == 0) scale = 1.0f / sqrtf(mean + a.eps);
        }
        __syncthreads();
        for (int i = tid; i < hd; i += blockDim.x) hs[i] = hs[i] * scale * w[i];
        __syncthreads();
    }
    const int half = a.dims / 2;
    float ms = at;
    if (a.ext_factor != 0.0f) ms *= a.mscale_yarn;
    for (int i = tid; i < half; i += blockDim.x) {
        const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
        const float c = rc[i] * ms, s = rs[i] * ms;
        const float x0 = hs[ia], x1 = hs[ib];
        hs[ia] = x0 * c - x1 * s;
        hs[ib] = x0 * s + x1 * c;
    }
    __syncthreads();
}

#define ATT_WARPS 4
#define ATT_MAXD 8  // head_dim ≤ 256
// Value rows a warp loads at once.
#define ATT_VB 8

// q[0..8) · the eight halves of k8.
__device__ __forceinline__ float dot8(const float* q, uint4 k8) {
    const float4 qa = *(const float4*)q, qb = *(const float4*)(q + 4);
    return qa.x * h2f((u16)(k8.x & 0xffff)) + qa.y * h2f((u16)(k8.x >> 16)) +
           qa.z * h2f((u16)(k8.y & 0xffff)) + qa.w * h2f((u16)(k8.y >> 16)) +
           qb.x * h2f((u16)(k8.z & 0xffff)) + qb.y * h2f((u16)(k8.z >> 16)) +
           qb.z * h2f((u16)(k8.w & 0xffff)) + qb.w * h2f((u16)(k8.w >> 16));
}

// The f16 key row kt (hd a multiple of KB) dotted with q (sq): KB/8 16-byte loads asked for
// before the first is used, then added in order (as one load at a time would).
template <int KB>
__device__ __forceinline__ float att_dot(const float* sq, const u16* kt, int hd) {
    float a = 0.f;
    for (int d = 0; d < hd; d += KB) {
        uint4 k8[KB / 8];
#pragma unroll
        for (int j = 0; j < KB / 8; j++) k8[j] = *(const uint4*)(kt + d + 8 * j);
#pragma unroll
        for (int j = 0; j < KB / 8; j++) a += dot8(sq + d + 8 * j, k8[j]);
    }
    return a;
}

// acc[0..VD) += the tile's value rows tb .. tb + nt (dims d0 .. d0 + VD of each, VD = hd/32,
// one load of 2·VD bytes) weighted by lane u's pw; ATT_VB rows' loads in flight at once.
// Rows past the tile's end re-read its last row (never an unwritten one) with weight 0 (pw
// is 0 past t1).
template <int VD>
__device__ __forceinline__ void att_values(const u16* vb, int tb, int nt, int hd, int d0,
                                           float pw, float (&acc)[ATT_MAXD]) {
    for (int u0 = 0; u0 < nt; u0 += ATT_VB) {
        u32 w[ATT_VB][(VD + 1) / 2];
#pragma unroll
        for (int j = 0; j < ATT_VB; j++) {
            const u16* p = vb + (i64)(tb + min(u0 + j, nt - 1)) * hd + d0;
            if constexpr (VD == 8) {
                const uint4 v = *(const uint4*)p;
                w[j][0] = v.x, w[j][1] = v.y, w[j][2] = v.z, w[j][3] = v.w;
            } else if constexpr (VD == 4) {
                const uint2 v = *(const uint2*)p;
                w[j][0] = v.x, w[j][1] = v.y;
            } else if constexpr (VD == 2) {
                w[j][0] = *(const u32*)p;
            } else {
                w[j][0] = *p;
            }
        }
#pragma unroll
        for (int j = 0; j < ATT_VB; j++) {
            const float pu = __shfl_sync(0xffffffffu, pw, u0 + j);
#pragma unroll
            for (int e = 0; e < VD; e++)
                acc[e] += pu * h2f((u16)(e & 1 ? w[j][e / 2] >> 16 : w[j][e / 2] & 0xffff));
        }
    }
}

// q[0..16) · the sixteen i8 codes of k16.
__device__ __forceinline__ float dot16_i8(const float* q, uint4 k16) {
    const u32 w[4] = {k16.x, k16.y, k16.z, k16.w};
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) a += q[j] * (float)(i8)(w[j >> 2] >> (8 * (j & 3)));
    return a;
}

// The q8_0 key row (codes kt, scales ks; hd a multiple of KB, KB a multiple of 32) dotted
// with q (sq): each 32-value block's code sum times its scale; KB/16 code loads and KB/32
// scales asked for before the first is used.
template <int KB>
__device__ __forceinline__ float att_dot_q8(const float* sq, const u8* kt, const u16* ks,
                                            int hd) {
    float a = 0.f;
    for (int d = 0; d < hd; d += KB) {
        uint4 k16[KB / 16];
        u16 sc[KB / 32];
#pragma unroll
        for (int j = 0; j < KB / 16; j++) k16[j] = *(const uint4*)(kt + d + 16 * j);
#pragma unroll
        for (int j = 0; j < KB / 32; j++) sc[j] = ks[(d >> 5) + j];
#pragma unroll
        for (int j = 0; j < KB / 32; j++)
            a += (dot16_i8(sq + d + 32 * j, k16[2 * j]) +
                  dot16_i8(sq + d + 32 * j + 16, k16[2 * j + 1])) *
                 h2f(sc[j]);
    }
    return a;
}

// att_values over a q8_0 cache (codes vb, scales vs; hd = 32·VD): a lane's VD codes of a
// row (one load) and the scale of their block, ATT_VB rows in flight at once.
template <int VD>
__device__ __forceinline__ void att_values_q8(const u8* vb, const u16* vs, int tb, int nt,
                                              int hd, int d0, float pw,
                                              float (&acc)[ATT_MAXD]) {
    for (int u0 = 0; u0 < nt; u0 += ATT_VB) {
        u32 w[ATT_VB][(VD + 3) / 4];
        u16 sc[ATT_VB];
#pragma unroll
        for (int j = 0; j < ATT_VB; j++) {
            const i64 row = tb + min(u0 + j, nt - 1);
            const u8* p = vb + row * hd + d0;
            if constexpr (VD == 8) {
                const uint2 v = *(const uint2*)p;
                w[j][0] = v.x, w[j][1] = v.y;
            } else if constexpr (VD == 4) {
                w[j][0] = *(const u32*)p;
            } else if constexpr (VD == 2) {
                w[j][0] = *(const u16*)p;
            } else {
                w[j][0] = *p;
            }
            sc[j] = vs[row * (hd >> 5) + (d0 >> 5)];
        }
#pragma unroll
        for (int j = 0; j < ATT_VB; j++) {
            const float pu = __shfl_sync(0xffffffffu, pw, u0 + j) * h2f(sc[j]);
#pragma unroll
            for (int e = 0; e < VD; e++)
                acc[e] += pu * (float)(i8)(w[j][e / 4] >> (8 * (e & 3)));
        }
    }
}

// One kv head's cache rows: f16 (k, v: [n_ctx, hd] halves) or q8_0 (k, v: [n_ctx, hd]
// codes; ks, vs: [n_ctx, hd/32] f16 scales).
struct KvRows {
    const u8* k;
    const u8* v;
    const u16* ks;
    const u16* vs;
};

template <bool Q8>
__device__ __forceinline__ KvRows kv_rows(const u8* kc, const u8* vc, int kh, int nkv,
                                          int n_ctx, int hd) {
    KvRows r;
    const i64 at = (i64)kh * n_ctx * hd;
    if constexpr (Q8) {
        r.k = kc + at;
        r.v = vc + at;
        r.ks = kv_q8_scales(kc, nkv, n_ctx, hd) + at / 32;
        r.vs = kv_q8_scales(vc, nkv, n_ctx, hd) + at / 32;
    } else {
        r.k = kc + 2 * at;
        r.v = vc + 2 * at;
        r.ks = r.vs = nullptr;
    }
    return r;
}

// An output value times sigmoid(its gate), as mul_sigmoid (hybrid.cu) computes it, where a
// gated layer's gate (heads g_hs apart in each row) is set.
__device__ __forceinline__ float gated(float x, const float* gate, int g_hs, int nh, int r,
                                       int h, int d) {
    if (!gate) return x;
    x *= 1.0f / (1.0f + expf(-gate[(i64)r * nh * g_hs + (i64)h * g_hs + d]));
    return x;
}

// Value d of query head h of row r from a block's merged (max M, sum L, weighted sum a):
// the output (gated, and as q8_1 where xq is set: the warp holds 32 consecutive values of
// the head) when the positions are not split, else the split's partial for att_combine.
__device__ __forceinline__ void att_emit(float a, float M, float L, float* out, float* part,
                                         int r, int h, int d, int sp, int nh, int hd, int nsplit,
                                         const float* gate, int g_hs, i8* xq, float2* xds,
                                         int lane) {
    if (nsplit == 1) {
        const i64 i = (i64)r * nh * hd + (i64)h * hd + d;
        const float o = gated(a / L, gate, g_hs, nh, r, h, d);
        out[i] = o;
        if (xq) q8_1_warp(o, xq, xds, i >> 5, lane);
    } else {
        float* pp = part + (((i64)r * nh + h) * nsplit + sp) * (hd + 2);
        pp[2 + d] = a;
        if (d == 0) {
            pp[0] = M;
            pp[1] = L;
        }
    }
}

// Flash-decoding: block (head, row, split) runs an online softmax over its share of the
// visible positions in tiles of 32 positions a warp: lane i scores position tile + i (its
// own key row, 16-byte loads, q from shared memory), the tile's max and sum are one warp
// reduction each, then the lanes, each owning hd/32 consecutive dims, add the 32 value
// rows. One position a warp at a time (a dot product, five shuffles and the exps between
// one key load and the next) made a decode attention of 128 positions ~20 µs a block on
// the H200, a quarter of a Gemma 3 270M step (tg128 1,144 → 1,294 tok/s with the tiles,
// 27B Q1_0 240.4 → 247.3, same call). Then the block merges its warps. With
// nsplit == 1 it writes the output; otherwise a partial (max, sum, acc[hd]) that
// att_combine merges. With gate set the output is gated. With xq set (hd a multiple of 32)
// the output is also written as q8_1, the output projection's input (a warp writes 32
// consecutive values of one head: one unit).
// The block's query head is in sq (shared, f16-rounded, zero past hd), positions t0..t1 of
// its kv head's cache rows kb, vb are visible to it.
// Q8: the rows are q8_0 (`KvRows`), hd a multiple of 32.
template <bool Q8>
__device__ __forceinline__ void attention_tiles(const float* sq, KvRows kr, float* out,
                                                float* part, int h, int r, int sp, int t0,
                                                int t1, int nh, int hd, float scale,
                                                float softcap, int nsplit, const float* gate,
                                                int g_hs, i8* xq, float2* xds) {
    const u16* kb = (const u16*)kr.k;
    const u16* vb = (const u16*)kr.v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Lane l owns dims l·vd .. l·vd + vd of the value rows (vd = hd/32 rounded up).
    const int vd = (hd + 31) >> 5, d0 = lane * vd;
    const bool vec = (hd & 7) == 0;  // key rows 16-byte aligned: 8 halves a load
    float acc[ATT_MAXD];
#pragma unroll
    for (int j = 0; j < ATT_MAXD; j++) acc[j] = 0.f;
    float m = NEG_INF, l = 0.f;
    for (int tb = t0 + warp * 32; tb < t1; tb += ATT_WARPS * 32) {
        const int t = tb + lane;
        float s = NEG_INF;
        if (t < t1) {
            const u16* kt = kb + (i64)t * hd;
            float a = 0.f;
            // Key loads asked for KB/8 at a time before the first is used: one at a time
            // (or the two ptxas paired) the 256-dim dot was 16 L2 round trips in a row
            // (with the value rows 8 at once: Gemma 3 270M shape tg128 1,345 → 1,666,
            // `attention` alone 14.8 → 9.8 µs; H200).
            if constexpr (Q8) {
                const u8* kq = kr.k + (i64)t * hd;
                const u16* ks = kr.ks + (i64)t * (hd >> 5);
                if (hd % 128 == 0) {
                    a = att_dot_q8<128>(sq, kq, ks, hd);
                } else if (hd % 64 == 0) {
                    a = att_dot_q8<64>(sq, kq, ks, hd);
                } else {
                    a = att_dot_q8<32>(sq, kq, ks, hd);
                }
            } else if (hd % 128 == 0) {
                a = att_dot<128>(sq, kt, hd);
            } else if (hd % 64 == 0) {
                a = att_dot<64>(sq, kt, hd);
            } else if (vec) {
                for (int d = 0; d < hd; d += 8) a += dot8(sq + d, *(const uint4*)(kt + d));
            } else {
                for (int d = 0; d < hd; d++) a += sq[d] * h2f(kt[d]);
            }
            s = a * scale;
            if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        }
        // Lane 0's position is always visible, so the tile's max is finite.
        const float mn = fmaxf(m, warp_max(s));
        const float corr = expf(m - mn);
        const float pw = t < t1 ? expf(s - mn) : 0.f;
        l = l * corr + warp_sum(pw);
#pragma unroll
        for (int j = 0; j < ATT_MAXD; j++) acc[j] *= corr;
        const int nt = min(32, t1 - tb);
        // A lane's vd = hd/32 value dims of ATT_VB rows in flight at once (one at a time,
        // a tile's 32 rows were as many L2 round trips in a row).
        if constexpr (Q8) {
            if (hd == 256) {
                att_values_q8<8>(kr.v, kr.vs, tb, nt, hd, d0, pw, acc);
            } else if (hd == 128) {
                att_values_q8<4>(kr.v, kr.vs, tb, nt, hd, d0, pw, acc);
            } else if (hd == 64) {
                att_values_q8<2>(kr.v, kr.vs, tb, nt, hd, d0, pw, acc);
            } else if (hd == 32) {
                att_values_q8<1>(kr.v, kr.vs, tb, nt, hd, d0, pw, acc);
            } else {
                // hd = 32·vd: a lane's vd dims lie in block lane·vd / 32 or the next.
                for (int u = 0; u < nt; u++) {
                    const float pu = __shfl_sync(0xffffffffu, pw, u);
                    const i64 row = tb + u;
                    const u8* vt = kr.v + row * hd;
                    const u16* st = kr.vs + row * (hd >> 5);
#pragma unroll
                    for (int j = 0; j < ATT_MAXD; j++)
                        if (j < vd)
                            acc[j] += pu * ((float)(i8)vt[d0 + j] * h2f(st[(d0 + j) >> 5]));
                }
            }
        } else if (hd == 256) {
            att_values<8>(vb, tb, nt, hd, d0, pw, acc);
        } else if (hd == 128) {
            att_values<4>(vb, tb, nt, hd, d0, pw, acc);
        } else if (hd == 64) {
            att_values<2>(vb, tb, nt, hd, d0, pw, acc);
        } else if (hd == 32) {
            att_values<1>(vb, tb, nt, hd, d0, pw, acc);
        } else {
            for (int u = 0; u < nt; u++) {
                const float pu = __shfl_sync(0xffffffffu, pw, u);
                const u16* vt = vb + (i64)(tb + u) * hd;
#pragma unroll
                for (int j = 0; j < ATT_MAXD; j++)
                    if (j < vd && d0 + j < hd) acc[j] += pu * h2f(vt[d0 + j]);
            }
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
    for (int j = 0; j < ATT_MAXD; j++)
        if (j < vd && d0 + j < hd) sacc[warp][d0 + j] = acc[j];
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
        att_emit(a, M, L, out, part, r, h, d, sp, nh, hd, nsplit, gate, g_hs, xq, xds, lane);
    }
}

// The visible positions of block (row r, split sp): [*t0, *t1).
__device__ __forceinline__ void att_range(int p, int window, int nsplit, int sp, int* t0,
                                          int* t1) {
    const int lo = window > 0 ? max(0, p + 1 - window) : 0;
    const int per = (p + 1 - lo + nsplit - 1) / nsplit;
    *t0 = lo + sp * per;
    *t1 = min(p + 1, *t0 + per);
}

// Ask L2 for the cache rows [t0, t1) of one kv head (k and v): positions before this
// step's, which no kernel of the step writes, so this may run before gdc_wait().
template <bool Q8>
__device__ __forceinline__ void att_prefetch(KvRows kr, int t0, int t1, int hd) {
    if (t1 <= t0) return;
    const i64 n = (i64)(t1 - t0) * hd, eb = Q8 ? 1 : 2;
    gdc_prefetch(kr.k + t0 * hd * eb, n * eb);
    gdc_prefetch(kr.v + t0 * hd * eb, n * eb);
    if constexpr (Q8) {
        gdc_prefetch((const u8*)(kr.ks + (i64)t0 * (hd >> 5)), n / 16);
        gdc_prefetch((const u8*)(kr.vs + (i64)t0 * (hd >> 5)), n / 16);
    }
}

// What a block of either attention kernel does before its wait: its positions [t0, t1)
// (split sp of row r's visible ones) and kv head kh's rows, asked of L2.
template <bool Q8>
__device__ __forceinline__ KvRows att_begin(const u8* kc, const u8* vc, int kh, int nkv,
                                            int n_ctx, int hd, int pos0, int r, int window,
                                            int nsplit, int sp, int* t0, int* t1) {
    att_range(pos0 + r, window, nsplit, sp, t0, t1);
    const KvRows kr = kv_rows<Q8>(kc, vc, kh, nkv, n_ctx, hd);
    att_prefetch<Q8>(kr, *t0, min(*t1, pos0), hd);
    return kr;
}

// The parameters of every attention kernel (the host launches any of them with the same
// arguments).
#define ATT_PARAMS                                                                         \
    const float *q, const u8 *kc, const u8 *vc, float *out, float *part, int nh, int nkv,  \
        int hd, int n_ctx, int pos0, float scale, int window, float softcap, int nsplit,   \
        const int *posp, const float *gate, int g_hs, i8 *xq, float2 *xds

// The attention kernel over one layer's cache kc, vc: f16, or q8_0 (`kv_q8_put`).
#define ATTENTION_KERNEL(NAME, Q8)                                                            \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) NAME(ATT_PARAMS) {           \
        /* The host uploads the step's position before the step's first kernel. */           \
        if (posp) pos0 = *posp;                                                               \
        const int h = blockIdx.x, r = blockIdx.y, sp = blockIdx.z;                            \
        int t0, t1;                                                                           \
        const KvRows kr = att_begin<Q8>(kc, vc, h / (nh / nkv), nkv, n_ctx, hd, pos0, r,      \
                                        window, nsplit, sp, &t0, &t1);                        \
        gdc_wait();                                                                           \
        /* q rounded to f16, as the CPU does before q·k; zero past hd (the wide loads). */    \
        __shared__ __align__(16) float sq[32 * ATT_MAXD];                                     \
        const float* qr = q + (i64)r * nh * hd + (i64)h * hd;                                 \
        for (int d = threadIdx.x; d < 32 * ATT_MAXD; d += blockDim.x)                         \
            sq[d] = d < hd ? h2f(f2h(qr[d])) : 0.f;                                           \
        __syncthreads();                                                                      \
        attention_tiles<Q8>(sq, kr, out, part, h, r, sp, t0, t1, nh, hd, scale, softcap,      \
                            nsplit, gate, g_hs, xq, xds);                                     \
    }

ATTENTION_KERNEL(attention, false)
ATTENTION_KERNEL(attention_q8, true)

// Grouped-query attention: block (kv head kh, row r, split sp) runs the G query heads that
// share kv head kh (h = kh·G + j) over the same positions, so each key and value row is
// loaded once for all G; `attention` loads it once per query head (at depth 8192 the 27B's
// six heads a kv head read ~200 MB a layer). The tiles of `attention_tiles`: lane i scores
// position tile + i against the G queries (sq: [G, HD] in shared memory, f16-rounded),
// then the lanes, HD/32 dims each, add the 32 value rows into G accumulators. HD = 32·VD.
template <bool Q8, int G, int VD>
__device__ __forceinline__ void attention_group(const float* sq, KvRows kr, float* out,
                                                float* part, int kh, int r, int sp, int t0,
                                                int t1, int nh, float scale, float softcap,
                                                int nsplit, const float* gate, int g_hs,
                                                i8* xq, float2* xds) {
    constexpr int HD = 32 * VD;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d0 = lane * VD;
    float acc[G][VD], m[G], l[G];
#pragma unroll
    for (int j = 0; j < G; j++) {
        m[j] = NEG_INF;
        l[j] = 0.f;
#pragma unroll
        for (int e = 0; e < VD; e++) acc[j][e] = 0.f;
    }
    for (int tb = t0 + warp * 32; tb < t1; tb += ATT_WARPS * 32) {
        const int t = tb + lane;
        float s[G];
#pragma unroll
        for (int j = 0; j < G; j++) s[j] = 0.f;
        if (t < t1) {
            // 64 values a round, their loads asked for before the first is used.
#pragma unroll 1
            for (int d = 0; d < HD; d += 64) {
                float kf[64];
                if constexpr (Q8) {
                    const u8* kt = kr.k + (i64)t * HD + d;
                    const u16* ks = kr.ks + (i64)t * VD + (d >> 5);
                    uint4 k16[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) k16[i] = *(const uint4*)(kt + 16 * i);
                    const float sa = h2f(ks[0]), sb = h2f(ks[1]);
#pragma unroll
                    for (int i = 0; i < 64; i++) {
                        const uint4 w = k16[i >> 4];
                        const u32 x = (i & 15) < 4 ? w.x : (i & 15) < 8 ? w.y : (i & 15) < 12 ? w.z : w.w;
                        kf[i] = (float)(i8)(x >> (8 * (i & 3))) * (i < 32 ? sa : sb);
                    }
                } else {
                    const u16* kt = (const u16*)kr.k + (i64)t * HD + d;
                    uint4 k8[8];
#pragma unroll
                    for (int i = 0; i < 8; i++) k8[i] = *(const uint4*)(kt + 8 * i);
#pragma unroll
                    for (int i = 0; i < 64; i++) {
                        const uint4 w = k8[i >> 3];
                        const u32 x = (i & 7) < 2 ? w.x : (i & 7) < 4 ? w.y : (i & 7) < 6 ? w.z : w.w;
                        kf[i] = h2f((u16)(i & 1 ? x >> 16 : x & 0xffff));
                    }
                }
#pragma unroll
                for (int j = 0; j < G; j++) {
                    const float4* qv = (const float4*)(sq + j * HD + d);
#pragma unroll
                    for (int i = 0; i < 16; i++) {
                        const float4 qq = qv[i];
                        s[j] += qq.x * kf[4 * i] + qq.y * kf[4 * i + 1] + qq.z * kf[4 * i + 2] +
                                qq.w * kf[4 * i + 3];
                    }
                }
            }
        }
        float pw[G];
#pragma unroll
        for (int j = 0; j < G; j++) {
            float sc = NEG_INF;
            if (t < t1) {
                sc = s[j] * scale;
                if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
            }
            // Lane 0's position is always visible, so the tile's max is finite.
            const float mn = fmaxf(m[j], warp_max(sc));
            const float corr = expf(m[j] - mn);
            pw[j] = t < t1 ? expf(sc - mn) : 0.f;
            l[j] = l[j] * corr + warp_sum(pw[j]);
#pragma unroll
            for (int e = 0; e < VD; e++) acc[j][e] *= corr;
            m[j] = mn;
        }
        const int nt = min(32, t1 - tb);
        for (int u0 = 0; u0 < nt; u0 += ATT_VB) {
            float vf[ATT_VB][VD];
#pragma unroll
            for (int i = 0; i < ATT_VB; i++) {
                // Rows past the tile's end re-read its last row with weight 0.
                const i64 row = tb + min(u0 + i, nt - 1);
                if constexpr (Q8) {
                    const u8* p = kr.v + row * HD + d0;
                    u32 w[(VD + 3) / 4];
                    if constexpr (VD == 8) {
                        const uint2 v = *(const uint2*)p;
                        w[0] = v.x, w[1] = v.y;
                    } else if constexpr (VD == 4) {
                        w[0] = *(const u32*)p;
                    } else {
                        w[0] = *(const u16*)p;
                    }
                    const float sc = h2f(kr.vs[row * VD + (d0 >> 5)]);
#pragma unroll
                    for (int e = 0; e < VD; e++)
                        vf[i][e] = (float)(i8)(w[e / 4] >> (8 * (e & 3))) * sc;
                } else {
                    const u16* p = (const u16*)kr.v + row * HD + d0;
                    u32 w[VD / 2];
                    if constexpr (VD == 8) {
                        const uint4 v = *(const uint4*)p;
                        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
                    } else if constexpr (VD == 4) {
                        const uint2 v = *(const uint2*)p;
                        w[0] = v.x, w[1] = v.y;
                    } else {
                        w[0] = *(const u32*)p;
                    }
#pragma unroll
                    for (int e = 0; e < VD; e++)
                        vf[i][e] = h2f((u16)(e & 1 ? w[e / 2] >> 16 : w[e / 2] & 0xffff));
                }
            }
#pragma unroll
            for (int i = 0; i < ATT_VB; i++) {
#pragma unroll
                for (int j = 0; j < G; j++) {
                    const float pu = __shfl_sync(0xffffffffu, pw[j], u0 + i);
#pragma unroll
                    for (int e = 0; e < VD; e++) acc[j][e] += pu * vf[i][e];
                }
            }
        }
    }
    // The warps' partial softmaxes merged, as attention_tiles does, for each query head.
    __shared__ float sm[ATT_WARPS][G], sl[ATT_WARPS][G];
    __shared__ float sacc[ATT_WARPS][G][HD];
#pragma unroll
    for (int j = 0; j < G; j++) {
        if (lane == 0) {
            sm[warp][j] = m[j];
            sl[warp][j] = l[j];
        }
#pragma unroll
        for (int e = 0; e < VD; e++) sacc[warp][j][d0 + e] = acc[j][e];
    }
    __syncthreads();
    // A warp's 32 consecutive values are one q8_1 unit of one head (G·HD is a multiple of
    // the block's 128 threads).
    for (int x = threadIdx.x; x < G * HD; x += blockDim.x) {
        const int j = x / HD, d = x % HD, h = kh * G + j;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w][j]);
        float L = 0.f, a = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            const float f = sm[w][j] == NEG_INF ? 0.f : expf(sm[w][j] - M);
            L += sl[w][j] * f;
            a += sacc[w][j][d] * f;
        }
        att_emit(a, M, L, out, part, r, h, d, sp, nh, HD, nsplit, gate, g_hs, xq, xds, lane);
    }
}

// The grouped kernels: grid (nkv, rows, nsplit), G = nh / nkv query heads a block, head
// size 32·VD; the arguments of `attention`.
#define ATTENTION_GROUP_KERNEL(NAME, Q8, G, VD)                                               \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) NAME(ATT_PARAMS) {           \
        if (posp) pos0 = *posp;                                                               \
        const int kh = blockIdx.x, r = blockIdx.y, sp = blockIdx.z;                           \
        int t0, t1;                                                                           \
        const KvRows kr = att_begin<Q8>(kc, vc, kh, nkv, n_ctx, 32 * VD, pos0, r, window,     \
                                        nsplit, sp, &t0, &t1);                                \
        gdc_wait();                                                                           \
        __shared__ __align__(16) float sq[G * 32 * VD];                                       \
        const float* qr = q + (i64)r * nh * (32 * VD) + (i64)kh * G * (32 * VD);              \
        for (int d = threadIdx.x; d < G * 32 * VD; d += blockDim.x) sq[d] = h2f(f2h(qr[d]));  \
        __syncthreads();                                                                      \
        attention_group<Q8, G, VD>(sq, kr, out, part, kh, r, sp, t0, t1, nh, scale, softcap,  \
                                   nsplit, gate, g_hs, xq, xds);                              \
    }

#define ATTENTION_GROUP_KERNELS(G)                            \
    ATTENTION_GROUP_KERNEL(att_g##G##_d64, false, G, 2)       \
    ATTENTION_GROUP_KERNEL(att_g##G##_d128, false, G, 4)      \
    ATTENTION_GROUP_KERNEL(att_g##G##_d256, false, G, 8)      \
    ATTENTION_GROUP_KERNEL(att_g##G##_d64_q8, true, G, 2)     \
    ATTENTION_GROUP_KERNEL(att_g##G##_d128_q8, true, G, 4)    \
    ATTENTION_GROUP_KERNEL(att_g##G##_d256_q8, true, G, 8)
ATTENTION_GROUP_KERNELS(2)
ATTENTION_GROUP_KERNELS(4)
ATTENTION_GROUP_KERNELS(6)
ATTENTION_GROUP_KERNELS(8)

// Merge the nsplit (≤ 128) partials of each (row, head). Grid: (nh, rows). xq as
// `attention`. The splits' weights exp(m_s − M) once, by the first warp, into shared
// memory; then each thread's sum over the splits has its loads in flight eight at a time
// (a loop of one dependent load a split made 128 splits ~60 µs).
extern "C" __global__ void att_combine(const float* part, float* out, int nh, int hd,
                                       int nsplit, const float* gate, int g_hs, i8* xq,
                                       float2* xds) {
    gdc_wait();
    const int h = blockIdx.x, r = blockIdx.y, lane = threadIdx.x & 31;
    const i64 ps = hd + 2;
    const float* pp = part + ((i64)r * nh + h) * nsplit * ps;
    __shared__ float fs[128];
    __shared__ float sL;
    if (threadIdx.x < 32) {
        float M = NEG_INF;
        for (int s = lane; s < nsplit; s += 32) M = fmaxf(M, pp[s * ps]);
        M = warp_max(M);
        float L = 0.f;
        for (int s = lane; s < nsplit; s += 32) {
            const float ms = pp[s * ps];
            const float f = ms == NEG_INF ? 0.f : expf(ms - M);
            fs[s] = f;
            L += pp[s * ps + 1] * f;
        }
        L = warp_sum(L);
        if (lane == 0) sL = L;
    }
    __syncthreads();
    const float L = sL;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
#pragma unroll 8
        for (int s = 0; s < nsplit; s++) a += pp[s * ps + 2 + d] * fs[s];
        const i64 i = (i64)r * nh * hd + (i64)h * hd + d;
        const float o = gated(a / L, gate, g_hs, nh, r, h, d);
        out[i] = o;
        if (xq) q8_1_warp(o, xq, xds, i >> 5, lane);
    }
}

// The attention input in one launch: each head of q and k RMS-normed over its hd values
// (when its weight is set), then rotated as `rope` does. Grid (rows, nh + nkv): block
// (r, h) takes head h of q's row r, or head h − nh of k's; ceil32(hd) threads, a value each,
// so the norm's sums follow rms_norm's order for g = hd (one block per head) and the
// results are the separate ops' bits. q and k share every RoPE parameter but attn_factor.
// For `attention_block` (attention.rs): q's heads may be read q_hs apart (a gated layer's
// [query | gate] heads) and written to qo; with kc set, k's heads also go to the f16 cache
// at their positions and nkv more blocks (h ≥ nh + nkv) store v's heads there (kv_store).
// The heads of block (r, hh) after the wait: the f16 or q8_0 (Q8) cache stores.
template <bool Q8>
__device__ __forceinline__ void qk_norm_rope_head(float* q, float* k, const QkArgs& a, int nh,
                                                  int nkv, int hd, int q_hs, float* qo,
                                                  const float* vs, u8* kc, u8* vc, int n_ctx,
                                                  int pos0, const float* rc, const float* rs) {
    const int r = blockIdx.x, hh = blockIdx.y, tid = threadIdx.x;
    if (hh >= nh + nkv) {
        const int h = hh - nh - nkv;
        if (tid >= hd) return;
        kv_put<Q8>(vc, nkv, n_ctx, hd, h, pos0 + r, tid, vs[((i64)r * nkv + h) * hd + tid]);
        return;
    }
    const bool isq = hh < nh;
    const float* src = isq ? q + (i64)r * nh * q_hs + (i64)hh * q_hs
                           : k + ((i64)r * nkv + hh - nh) * hd;
    float* hp = isq ? (qo ? qo : q) + ((i64)r * nh + hh) * hd : k + ((i64)r * nkv + hh - nh) * hd;
    const bool store = !isq && kc;
    __shared__ float xs[1024];
    if (tid < hd) xs[tid] = src[tid];
    norm_rope_head(xs, hd, isq ? a.wq : a.wk, isq ? a.attn_q : a.attn_k, a, rc, rs);
    if (tid < hd) {
        hp[tid] = xs[tid];
        if (store) kv_put<Q8>(kc, nkv, n_ctx, hd, hh - nh, pos0 + r, tid, xs[tid]);
    }
}

// The kernel storing to an f16 cache (or none) and to a q8_0 cache (hd a multiple of 32:
// the block's warps are whole blocks of the cache).
#define QK_NORM_ROPE_KERNEL(NAME, Q8)                                                         \
    extern "C" __global__ void NAME(float* q, float* k, QkArgs a, int nh, int nkv, int hd,    \
                                    int q_hs, float* qo, const float* vs, u8* kc, u8* vc,     \
                                    int n_ctx) {                                              \
        const int pos0 = a.posp ? *a.posp : a.pos0;                                           \
        /* The angles depend on nothing the step computes: made before the wait (Gemma 3 */   \
        /* 270M shape tg128 1,414 → 1,481–1,489 tok/s, H200). */                              \
        __shared__ float rc[512], rs[512];                                                    \
        if ((int)blockIdx.y < nh + nkv) rope_table(a, pos0 + (int)blockIdx.x, rc, rs);        \
        gdc_wait();                                                                           \
        qk_norm_rope_head<Q8>(q, k, a, nh, nkv, hd, q_hs, qo, vs, kc, vc, n_ctx, pos0, rc,    \
                              rs);                                                            \
    }

QK_NORM_ROPE_KERNEL(qk_norm_rope, false)
QK_NORM_ROPE_KERNEL(qk_norm_rope_q8, true)
