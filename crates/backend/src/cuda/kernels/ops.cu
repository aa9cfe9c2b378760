// The float ops of the forward pass. Numerics follow the CPU backend where it made a
// choice (f64 sum of squares in RMSNorm, GELU of the f16-rounded input rounded to f16,
// RoPE angles by repeated multiplication, q rounded to f16 before q·k; those are in
// attention.cu, compiled with this file as one module).

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
    gdc_wait();
    rms_norm_impl<false>(x, w, out, g, eps, nullptr, nullptr);
}

extern "C" __global__ void rms_norm_q(const float* x, const float* w, float* out, int g,
                                      float eps, i8* xq, float2* xds) {
    gdc_wait();
    rms_norm_impl<true>(x, w, out, g, eps, xq, xds);
}

// x += y, then out = rms_norm(x) (and its q8_1 with Q): one block per row of g values.
extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float* out,
                                        int g, float eps) {
    gdc_wait();
    rms_norm_impl<false, true>(x, w, out, g, eps, nullptr, nullptr, y, x);
}

extern "C" __global__ void add_rms_norm_q(float* x, const float* y, const float* w, float* out,
                                          int g, float eps, i8* xq, float2* xds) {
    gdc_wait();
    rms_norm_impl<true, true>(x, w, out, g, eps, xq, xds, y, x);
}

// Sum over the block in rms_norm_impl's order (so the results are its bits).
__device__ __forceinline__ double block_sum_rms(double s, double* part) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) part[32] = t;
    }
    __syncthreads();
    const double r = part[32];
    __syncthreads();
    return r;
}

// Gemma's sandwich in one launch: y = rms_norm(y) ⊙ wy (in place), x += y, out = rms_norm(x)
// ⊙ w (and its q8_1 with Q). One block per row of g ≤ V·blockDim values held in registers;
// the same arithmetic as rms_norm, add, rms_norm (bit-identical). V = 1 for rows of at most
// 1,024 (Gemma 3 270M's 640): with V = 8 under the 1,024-thread bound the kernel spilled.
template <bool Q, int V>
__device__ __forceinline__ void norm_add_norm_impl(float* x, float* y, const float* wy,
                                                   const float* w, float* out, int g, float eps,
                                                   i8* xq, float2* xds) {
    const i64 base = (i64)blockIdx.x * g;
    __shared__ double part[33];
    float yv[V], xv[V];
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        yv[k] = i < g ? y[base + i] : 0.f;
        xv[k] = i < g ? x[base + i] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < V; k++) s += (double)yv[k] * (double)yv[k];
    const float sy = 1.0f / sqrtf((float)(block_sum_rms(s, part) / (double)g) + eps);
    s = 0.0;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < g) {
            const float yn = yv[k] * sy * wy[i];
            y[base + i] = yn;
            xv[k] += yn;
            x[base + i] = xv[k];
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) s += (double)xv[k] * (double)xv[k];
    const float sx = 1.0f / sqrtf((float)(block_sum_rms(s, part) / (double)g) + eps);
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < g) {
            const float v = xv[k] * sx * w[i];
            out[base + i] = v;
            if (Q) q8_1_warp(v, xq, xds, (base + i) >> 5, threadIdx.x & 31);
        }
    }
}

// Up to 1,024 threads: the bound caps registers at 64 a thread (without it a 5120-wide row
// failed to launch: too many resources requested).
#define NORM_ADD_NORM(V)                                                                     \
    extern "C" __global__ void __launch_bounds__(1024)                                       \
        norm_add_norm_##V(float* x, float* y, const float* wy, const float* w, float* out,    \
                          int g, float eps) {                                                \
        gdc_wait();                                                                          \
        norm_add_norm_impl<false, V>(x, y, wy, w, out, g, eps, nullptr, nullptr);            \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(1024)                                       \
        norm_add_norm_q_##V(float* x, float* y, const float* wy, const float* w, float* out,  \
                            int g, float eps, i8* xq, float2* xds) {                         \
        gdc_wait();                                                                          \
        norm_add_norm_impl<true, V>(x, y, wy, w, out, g, eps, xq, xds);                      \
    }
NORM_ADD_NORM(1)
NORM_ADD_NORM(8)

// A warp's sum of one double a lane, the same tree in every lane (so every lane has the
// same bits).
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// add_rms_norm_q of ONE row over gridDim.x blocks, a value per thread (g a multiple of 32,
// g ≤ blocks · blockDim): one block per row took 9.3 µs on a 5120-wide row (ncu, H200),
// a fifth of a 27B-shaped layer's small kernels. Each block writes its sum of squares to
// part[block], then the blocks meet at a barrier: bar[0] counts arrivals, bar[1] is a
// generation that the last block to arrive resets bar[0] for and bumps (so calls of any
// block count follow each other); after it every block adds the parts in one order, so the
// sum is the same in every block and every run. All blocks must be resident at once: the
// host launches at most one per SM, and the stream runs nothing beside this kernel.
// The two halves of a row norm over several blocks, a value a thread: the residual add
// (x[i] += y[i], stored) and the block's sum of squares (returned to warp 0's lane 0),
// then, given the row's total, the normed value and its q8_1.
__device__ __forceinline__ double add_sumsq_block(float* x, const float* y, const float* w,
                                                  int g, float& v, float& wi) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    v = 0.f;
    wi = 0.f;
    if (i < g) {
        v = x[i] + y[i];
        x[i] = v;
        wi = w[i];
    }
    __shared__ double red[32];
    const double s = warp_sum_d((double)v * (double)v);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    double t = 0.0;
    if (warp == 0) t = warp_sum_d(lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0);
    return t;
}

__device__ __forceinline__ void norm_out_row(float v, float wi, double total, int g, float eps,
                                             float* out, i8* xq, float2* xds) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float mean = (float)(total / (double)g);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (i < g) {
        const float o = v * scale * wi;
        out[i] = o;
        q8_1_warp(o, xq, xds, i >> 5, threadIdx.x & 31);
    }
}

extern "C" __global__ void add_rms_norm_row(float* x, const float* y, const float* w, float* out,
                                            int g, float eps, i8* xq, float2* xds,
                                            double* part, u32* bar) {
    gdc_wait();
    const int nb = gridDim.x;
    float v, wi;
    const double t = add_sumsq_block(x, y, w, g, v, wi);
    __shared__ double total;
    if (threadIdx.x == 0) {
        // The generation cannot move before this block arrives, so this is the call's.
        const u32 gen = ((volatile u32*)bar)[1];
        ((volatile double*)part)[blockIdx.x] = t;
        __threadfence();
        if (atomicAdd(bar, 1u) == (u32)nb - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (((volatile u32*)bar)[1] == gen) {
            }
        }
        __threadfence();
        double sum = 0.0;
        for (int b = 0; b < nb; b++) sum += ((volatile double*)part)[b];
        total = sum;
    }
    __syncthreads();
    norm_out_row(v, wi, total, g, eps, out, xq, xds);
}

// add_rms_norm_row's arithmetic in one thread-block cluster (Hopper): the blocks meet at
// the cluster's hardware barrier and read each other's sums of squares from shared memory,
// instead of a barrier of global atomics that the blocks spin on (4.5 µs a call inside the
// 27B's decode graph, 0.58 ms of a 4.4 ms Q1_0 step): tg128 of the 27B Q1_0 shape 229.5 →
// 241.0 tok/s (H200, same call; NEAGARI_CUDA_NORM_CL=0 is the atomics). Launched with
// cluster size gridDim.x (≤ 8), blockDim.x · gridDim.x ≥ g, a value a thread; the sum adds
// the block sums in rank order, so every block gets the same value. Row blockIdx.y of
// gridDim.y (a cluster a row; xq/xds rows of g / 32 units).
// add_rms_norm_cl's first half alone, its blocks not meeting: x += y stored, each block's
// sum of squares in part[row · gridDim.x + block] (add_sumsq_block's, so the row's total
// added in block order is add_rms_norm_cl's with as many blocks of as many threads), and
// the q8_1 of x·w, not yet scaled by the row's 1/rms: a GEMV reading it scales its sums by
// that (common.cuh `Nrm`). Row blockIdx.y; g a multiple of 32.
extern "C" __global__ void add_norm_part(float* x, const float* y, const float* w, int g,
                                         i8* xq, float2* xds, double* part, Pf pf) {
    pf_issue(pf);
    gdc_wait();
    const i64 row = (i64)blockIdx.y * g;
    x += row;
    y += row;
    xq += row;
    xds += row >> 5;
    float v, wi;
    const double t = add_sumsq_block(x, y, w, g, v, wi);
    if (threadIdx.x == 0) part[(i64)blockIdx.y * gridDim.x + blockIdx.x] = t;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < g) q8_1_warp(v * wi, xq, xds, i >> 5, threadIdx.x & 31);
}

extern "C" __global__ void add_rms_norm_cl(float* x, const float* y, const float* w, float* out,
                                           int g, float eps, i8* xq, float2* xds, Pf pf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    pf_issue(pf);
    gdc_wait();
    const i64 row = (i64)blockIdx.y * g;
    x += row;
    y += row;
    out += row;
    xq += row;
    xds += row >> 5;
    float v, wi;
    const double t = add_sumsq_block(x, y, w, g, v, wi);
    __shared__ double bsum;
    __shared__ double total;
    if (threadIdx.x == 0) bsum = t;
    // Every block's bsum is written and visible cluster-wide after this.
    cluster_sync();
    if (threadIdx.x < 32) {
        // Lane r reads rank r's sum (the reads in flight together: one after another they
        // were gridDim.x distributed-memory round trips), lane 0 adds them in rank order.
        const int lane = threadIdx.x;
        const double b = lane < (int)gridDim.x ? ld_cluster(&bsum, lane) : 0.0;
        double sum = 0.0;
        for (int r = 0; r < (int)gridDim.x; r++) sum += __shfl_sync(0xffffffffu, b, r);
        if (lane == 0) total = sum;
    }
    // No block may leave while another still reads its bsum: arrive here, wait at the end.
    cluster_arrive();
    __syncthreads();
    norm_out_row(v, wi, total, g, eps, out, xq, xds);
    cluster_wait();
#endif
}

extern "C" __global__ void add(float* x, const float* y, i64 n) {
    gdc_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" __global__ void add_bias(float* x, const float* b, int cols, i64 n) {
    gdc_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % cols];
}

extern "C" __global__ void softcap(float* x, float cap, i64 n) {
    gdc_wait();
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
    gdc_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_mul(g[i], u[i]);
}

extern "C" __global__ void glu_gelu(float* g, const float* u, i64 n) {
    gdc_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = gelu_mul(g[i], u[i]);
}

// The same, also writing the product as q8_1 (n a multiple of 32, so a warp is all in or
// all out).
extern "C" __global__ void glu_silu_q(float* g, const float* u, i64 n, i8* xq, float2* xds,
                                      Pf pf) {
    pf_issue(pf);
    gdc_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float r = silu_mul(g[i], u[i]);
    g[i] = r;
    q8_1_warp(r, xq, xds, i >> 5, threadIdx.x & 31);
}

extern "C" __global__ void glu_gelu_q(float* g, const float* u, i64 n, i8* xq, float2* xds,
                                      Pf pf) {
    pf_issue(pf);
    gdc_wait();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float r = gelu_mul(g[i], u[i]);
    g[i] = r;
    q8_1_warp(r, xq, xds, i >> 5, threadIdx.x & 31);
}

// x [rows, cols] f32 → dst [rows, kp] f16, zero past cols.
extern "C" __global__ void to_f16(const float* x, u16* dst, int rows, int cols, int kp) {
    gdc_wait();
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)rows * kp) return;
    const int r = (int)(t / kp), c = (int)(t % kp);
    dst[t] = c < cols ? f2h(x[(i64)r * cols + c]) : (u16)0;
}

// Greedy pick of each row: the highest value, the lowest index among equals, NaN ignored
// (-1 while none is seen; a row of NaNs gives 0, decoded on the host from a zero key).
__device__ __forceinline__ void amax_merge(float& v, int& i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// Key of a candidate: the value's bits made monotone (−0 taken as +0, so equal values tie),
// then the complement of the index, so the larger key is the host rule's pick (highest
// value, lowest index). Every non-NaN value has a key above 0.
__device__ __forceinline__ u64 amax_key(float v, int i) {
    if (v == 0.0f) v = 0.0f;
    const u32 b = __float_as_uint(v);
    const u32 o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)o << 32) | (u64)(~(u32)i);
}

// Grid (blocks over the row, rows): each block picks among `chunk` values of its row and
// merges its pick into keys[row] (zeroed before) with an atomic max. One block per row took
// 105 µs on a 248,320-wide row (ncu, H200).
extern "C" __global__ void argmax_rows(const float* x, int cols, int chunk, u64* keys) {
    gdc_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* row = x + (i64)blockIdx.y * cols;
    const int c0 = blockIdx.x * chunk, c1 = min(cols, c0 + chunk);
    float v = 0.0f;
    int i = -1;
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
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
        if (lane == 0 && i >= 0) {
            const u64 k = amax_key(v, i);
            u64* p = keys + blockIdx.y;
            asm volatile("red.global.max.u64 [%0], %1;" ::"l"(p), "l"(k) : "memory");
        }
    }
}

// Repetition penalties before a top-k (lib.rs `Penalties::apply`, the same arithmetic):
// logit l of each listed token of every row becomes (l ≤ 0 ? l·rp : l / rp) − sub. Grid
// (rows), a thread a token; the tokens are distinct.
extern "C" __global__ void penalize(float* x, int cols, const u32* ids, const float* subs,
                                   int n, float rp) {
    gdc_wait();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const u32 t = ids[j];
        if (t >= (u32)cols) continue;
        float* p = x + (i64)blockIdx.x * cols + t;
        float l = *p;
        l = l <= 0.0f ? l * rp : l / rp;
        *p = l - subs[j];
    }
}

// The k best of each row (top-k sampling's candidates: highest value, lowest index among
// equals, NaN left out), in two launches so that only k keys a row come back to the host.
// Keys are amax_key's (zeros: NaN and padding, which sort last), in shared memory, in runs
// of K (a power of two ≥ k, at most 64) sorted descending; pairs of runs are then halved
// into one until one is left: C[i] = max(A[i], B[K−1−i]) is a bitonic run holding the K
// best of A and B, and a bitonic merge sorts it (Shanbhag et al., "Efficient Top-K Query
// Processing on Massively Parallel Hardware", 2018). Blocks of TOPK_THREADS.
#define TOPK_N 4096
#define TOPK_THREADS 512

__device__ __forceinline__ void topk_swap_desc(u64* s, int i, int j) {
    const u64 a = s[i], b = s[j];
    if (a < b) {
        s[i] = b;
        s[j] = a;
    }
}

// s[0..runs·K): runs (a power of two) of K keys, each sorted descending → s[0..K) the K
// best, descending.
__device__ __forceinline__ void topk_reduce(u64* s, int runs, int K) {
    for (; runs > 1; runs >>= 1) {
        const int n = (runs >> 1) * K;
        u64 c[TOPK_N / 2 / TOPK_THREADS];
        __syncthreads();
#pragma unroll
        for (int q = 0; q < TOPK_N / 2 / TOPK_THREADS; q++) {
            const int j = threadIdx.x + q * TOPK_THREADS, m = j / K, i = j % K;
            if (j < n) {
                const u64 a = s[2 * m * K + i], b = s[(2 * m + 1) * K + K - 1 - i];
                c[q] = a > b ? a : b;
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < TOPK_N / 2 / TOPK_THREADS; q++) {
            const int j = threadIdx.x + q * TOPK_THREADS;
            if (j < n) s[j] = c[q];
        }
        for (int stride = K >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < n / 2; t += TOPK_THREADS) {
                const int i = 2 * t - (t & (stride - 1));
                topk_swap_desc(s, i, i + stride);
            }
        }
    }
    __syncthreads();
}

// Softmax sums: (m, s) = (largest value, Σ exp(v − m)) of the values not NaN; −∞ adds
// nothing, so a row of them (or of NaN) is (−∞, 0). `sm_add` takes one value, `sm_merge`
// another pair.
__device__ __forceinline__ void sm_add(float& m, float& s, float v) {
    if (isnan(v) || v == NEG_INF) return;
    if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
    } else {
        s += expf(v - m);
    }
}
__device__ __forceinline__ void sm_merge(float& m, float& s, float m2, float s2) {
    if (m2 == NEG_INF) return;
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else {
        s += s2 * expf(m2 - m);
    }
}
// A block's pairs merged in a fixed order (lanes, then warps); the block's pair in thread 0.
__device__ __forceinline__ void sm_block(float& m, float& s) {
    __shared__ float2 w[TOPK_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_down_sync(0xffffffffu, m, o);
        const float s2 = __shfl_down_sync(0xffffffffu, s, o);
        sm_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) w[warp] = make_float2(m, s);
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < (int)(blockDim.x >> 5); i++) sm_merge(m, s, w[i].x, w[i].y);
    }
}

// Grid (chunks of TOPK_N values, rows): part[row][chunk][0..K) = the chunk's K best keys;
// with `ms`, ms[row][chunk] = the chunk's softmax sums (sm_add).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    topk_chunks(const float* x, int cols, int K, u64* part, float2* ms) {
    gdc_wait();
    __shared__ u64 s[TOPK_N];
    const float* row = x + (i64)blockIdx.y * cols;
    const int c0 = blockIdx.x * TOPK_N;
    float m = NEG_INF, e = 0.0f;
    for (int j = threadIdx.x; j < TOPK_N; j += TOPK_THREADS) {
        const int c = c0 + j;
        const float v = c < cols ? row[c] : 0.0f;
        s[j] = c >= cols || isnan(v) ? 0ull : amax_key(v, c);
        if (c < cols) sm_add(m, e, v);
    }
    if (ms) {
        sm_block(m, e);
        if (threadIdx.x == 0) ms[(i64)blockIdx.y * gridDim.x + blockIdx.x] = make_float2(m, e);
    }
    // Each run of K sorted descending (bitonic; a run's last pass is all descending).
    for (int size = 2; size <= K; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < TOPK_N / 2; t += TOPK_THREADS) {
                const int i = 2 * t - (t & (stride - 1));
                if (((i & (K - 1)) & size) == 0) topk_swap_desc(s, i, i + stride);
                else topk_swap_desc(s, i + stride, i);
            }
        }
    }
    topk_reduce(s, TOPK_N / K, K);
    u64* out = part + ((i64)blockIdx.y * gridDim.x + blockIdx.x) * K;
    for (int j = threadIdx.x; j < K; j += TOPK_THREADS) out[j] = s[j];
}

// Grid (rows): keys[row][0..K) = the K best of the row's `chunks` runs of K chunk keys
// (padded with empty runs to `runs`, a power of two; runs·K ≤ TOPK_N); with `ms`,
// ms_row[row] = the row's softmax sums from its chunks' ms[row][chunk].
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    topk_merge(const u64* part, int chunks, int runs, int K, u64* keys, const float2* ms,
               float2* ms_row) {
    gdc_wait();
    __shared__ u64 s[TOPK_N];
    const u64* in = part + (i64)blockIdx.x * chunks * K;
    const int n = chunks * K;
    for (int j = threadIdx.x; j < runs * K; j += TOPK_THREADS) s[j] = j < n ? in[j] : 0ull;
    if (ms) {
        float m = NEG_INF, e = 0.0f;
        for (int j = threadIdx.x; j < chunks; j += TOPK_THREADS) {
            const float2 p = ms[(i64)blockIdx.x * chunks + j];
            sm_merge(m, e, p.x, p.y);
        }
        sm_block(m, e);
        if (threadIdx.x == 0) ms_row[blockIdx.x] = make_float2(m, e);
    }
    topk_reduce(s, runs, K);
    for (int j = threadIdx.x; j < K; j += TOPK_THREADS) keys[(i64)blockIdx.x * K + j] = s[j];
}
