// Integer GEMV of one weight format (FMTQ, the format's struct in vecdot.cuh): the
// activation rows are quantized once per matmul input to q8_1 (int8 codes and (d, d·Σq) per
// 32 values, as ggml's CUDA backend feeds its integer kernels), then each 32-weight unit is
// dotted with `dp4a` in registers. Tested against the CPU backend and the exact product in
// tests/cuda_ops.rs (`matmul_and_embed_every_format`).
//
// Shapes: x [nr, cols] f32 → xq [nr, units·32] i8 (zero-padded) and xds [nr, units] float2;
// W `rows` packed rows of `row_bytes`; y [nr, rows] f32.

// One warp per 32-value unit; grid (ceil(units / 4), nr), 128 threads.
extern "C" __global__ void quant_q8_1(const float* __restrict__ x, i8* __restrict__ xq,
                                      float2* __restrict__ xds, int cols, int units) {
    gdc_wait();
    const int lane = threadIdx.x & 31;
    const int u = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int r = blockIdx.y;
    if (u >= units) return;  // the whole warp leaves together
    const int c = u * 32 + lane;
    const float v = c < cols ? x[(i64)r * cols + c] : 0.f;
    q8_1_warp(v, xq, xds, (i64)r * units + u, lane);
}

// With GDC_PREFETCH (the default), block `blk` asks L2 for its weight rows
// (R a group, blockDim.y groups, as mvq_step and mvq_impl assign them) before it waits for
// the previous kernel: the launch arithmetic above it reads no memory.
__device__ __forceinline__ void gdc_prefetch_rows(const u8* W, int rows, i64 row_bytes, int R,
                                                  int blk) {
#ifdef GDC_PREFETCH
    const int per = R * (int)blockDim.y, first = blk * per;
    if (first < rows) gdc_prefetch(W + (i64)first * row_bytes, (i64)min(per, rows - first) * row_bytes);
#endif
}

// Up to 8 warps a block; the host picks as many as the row's units fill (mv_warps).
#define MVQ_WARPS 8

// Activation unit u of rows 0..NR−1 (zeros past nr): two 16-byte loads a row.
template <int NR>
__device__ __forceinline__ void load_xq(const i8* __restrict__ xq, const float2* __restrict__ xds,
                                        int units, int u, int nr, int (&x)[NR][8],
                                        float2 (&ds)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; r++) {
        if (r < nr) {
            const int4* p = (const int4*)(xq + ((i64)r * units + u) * 32);
            const int4 a = __ldg(p), b = __ldg(p + 1);
            x[r][0] = a.x; x[r][1] = a.y; x[r][2] = a.z; x[r][3] = a.w;
            x[r][4] = b.x; x[r][5] = b.y; x[r][6] = b.z; x[r][7] = b.w;
            ds[r] = __ldg(xds + (i64)r * units + u);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) x[r][k] = 0;
            ds[r] = make_float2(0.f, 0.f);
        }
    }
}

// F::STEP, the units a thread takes at once: 1 unless the struct says (vecdot.cuh's
// repacked formats).
template <class F, class = void>
struct step_of {
    static constexpr int v = 1;
};
template <class F>
struct step_of<F, decltype((void)F::STEP)> {
    static constexpr int v = F::STEP;
};

// The repacked formats (F::STEP units a thread step, vecdot.cuh): a block is G = blockDim.y
// groups of T = blockDim.x threads; group g computes weight rows (blk·G + g)·R .. +R, its
// threads take steps round-robin (the host makes T the row's step count where it is at most
// 256, so each thread loads 16 or 32 bytes of each of its R rows once and no lane idles:
// a 5120-wide Q1_0 row is 40 steps, which one warp-rounded group would run at 40 of 64
// lanes). The R rows' steps are loaded first, then each unit's activation serves them.
// Sums go through shared memory; one thread per output adds its group's T parts in order
// (the same order for any G and R, so `matmul_multi` and `matmul_rows` equal the single
// matmul bit for bit).
template <class F, int NR, int R>
__device__ __forceinline__ void mvq_step(const u8* __restrict__ W, const i8* __restrict__ xq,
                                         const float2* __restrict__ xds, float* __restrict__ y,
                                         int rows, int units, i64 row_bytes, int nr, int blk) {
    constexpr int S = F::STEP;
    const int T = blockDim.x, G = blockDim.y;
    const int tid = threadIdx.y * T + threadIdx.x, nthr = T * G;
    const int row0 = (blk * G + (int)threadIdx.y) * R;
    float acc[R][NR];
#pragma unroll
    for (int q = 0; q < R; q++)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[q][r] = 0.f;
    const int steps = units / S;  // the host keeps rows whole steps
    for (int s = threadIdx.x; s < steps; s += T) {
        typename F::W w[R];
        // Rows past the end re-read the last row (their sums are dropped).
#pragma unroll
        for (int q = 0; q < R; q++)
            w[q] = F::load(W + (i64)min(row0 + q, rows - 1) * row_bytes, s);
#pragma unroll
        for (int j = 0; j < S; j++) {
            int x[NR][8];
            float2 ds[NR];
            load_xq<NR>(xq, xds, units, s * S + j, nr, x, ds);
#pragma unroll
            for (int q = 0; q < R; q++) F::template dot<NR>(w[q], j, x, ds, acc[q]);
        }
    }
    __shared__ float part[R * NR][MVQ_WARPS * 32 + 1];  // +1: the adds below read a column
#pragma unroll
    for (int q = 0; q < R; q++)
#pragma unroll
        for (int r = 0; r < NR; r++) part[q * NR + r][tid] = acc[q][r];
    __syncthreads();
    for (int o = tid; o < G * R * NR; o += nthr) {
        const int g = o / (R * NR), qr = o % (R * NR);
        const int q = qr / NR, r = qr % NR, row = (blk * G + g) * R + q;
        if (r < nr && row < rows) {
            float v = 0.f;
            for (int i = 0; i < T; i++) v += part[qr][g * T + i];
            y[(i64)r * rows + row] = v;
        }
    }
}

// A block is G = blockDim.y groups of 1–8 warps (G·warps ≤ 8); group g computes R
// consecutive weight rows (blk·G + g)·R .. +R for nr ≤ NR activation rows. Threads take units
// round-robin; the activation unit is loaded once (two 16-byte loads per row) and serves the
// R weight rows, each weight unit is unpacked once and serves every activation row. The
// group's warps reduce through shared memory, in warp order, and thread o writes output o
// of the block as mvq_step does (mvqg_impl relies on it). Several groups of one warp take
// rows of at most 32 units: Gemma 3's 640-wide head in 131,072 one-warp blocks ran at
// 1.1 TB/s. Formats with a STEP go to `mvq_step`.
template <class F, int NR, int R>
__device__ __forceinline__ void mvq_impl(const u8* __restrict__ W, const i8* __restrict__ xq,
                                         const float2* __restrict__ xds, float* __restrict__ y,
                                         int rows, int units, i64 row_bytes, int nr, int blk) {
    if constexpr (step_of<F>::v > 1) {
        mvq_step<F, NR, R>(W, xq, xds, y, rows, units, row_bytes, nr, blk);
    } else {
        const int T = blockDim.x, G = blockDim.y, nw = T >> 5;
        const int tid = threadIdx.y * T + threadIdx.x, nthr = T * G, lane = threadIdx.x & 31;
        const int row0 = (blk * G + (int)threadIdx.y) * R;
        float acc[R][NR];
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int r = 0; r < NR; r++) acc[q][r] = 0.f;
        for (int u = threadIdx.x; u < units; u += T) {
            int x[NR][8];
            float2 ds[NR];
            load_xq<NR>(xq, xds, units, u, nr, x, ds);
            // Rows past the end re-read the last row (their sums are dropped): no branch,
            // so the R rows' loads can all be issued before the first is used.
#pragma unroll
            for (int q = 0; q < R; q++)
                F::template dot<NR>(W + (i64)min(row0 + q, rows - 1) * row_bytes, u, x, ds,
                                    acc[q]);
        }
        __shared__ float red[R * NR][MVQ_WARPS];
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int r = 0; r < NR; r++) {
                const float s = warp_sum(acc[q][r]);
                if (lane == 0) red[q * NR + r][tid >> 5] = s;
            }
        __syncthreads();
        for (int o = tid; o < G * R * NR; o += nthr) {
            const int g = o / (R * NR), qr = o % (R * NR);
            const int q = qr / NR, r = qr % NR, row = (blk * G + g) * R + q;
            if (r < nr && row < rows) {
                float s = 0.f;
                for (int k = 0; k < nw; k++) s += red[qr][g * nw + k];
                y[(i64)r * rows + row] = s;
            }
        }
    }
}

// Whether F's unit loads come apart from its arithmetic (F::U, F::load_u, F::dot_u;
// vecdot.cuh's Q_Q4_K).
template <class F, class = void>
struct has_unit {
    static constexpr bool v = false;
};
template <class F>
struct has_unit<F, decltype((void)sizeof(typename F::U))> {
    static constexpr bool v = true;
};

// mvq_impl's one-group, one-activation-row case for rows of several rounds a thread, where
// F's loads come apart (has_unit; else mvq_impl): each round's R rows are loaded before
// their arithmetic, the first round's before the kernel's gdc_wait (`wait`; the weights do
// not depend on the kernel before). With the loads inside `dot`, ptxas put each row's after
// the previous row's arithmetic, R DRAM waits a round: the 27B's Q4_K ffn_down (544 units
// on 192 threads, 3 rounds) ran at 45% of the DRAM peak (ncu) and 23.7 µs, 17.6 this way
// (H200, examples/cuda_gemv.rs). On rows of one round the same path lost (gate+up 31.2 →
// 34.0 µs, head 197 → 214: 77–94 registers against 40 halve the blocks an SM), and with
// the next round's loads also in flight (118 registers) every shape lost. The same sums
// in the same order as mvq_impl, so the same bits.
// With a norm (`nrm`, common.cuh's Nrm; part set) the sums are scaled by the row's 1/rms
// and the first g / 32 blocks write the normed row, 32 values each; the loads of the parts
// and of those values go out after the wait and are used after the loop, so their latency
// hides under it.
template <class F, int R, class Wait>
__device__ __forceinline__ void mvq_split(const u8* __restrict__ W, const i8* __restrict__ xq,
                                          const float2* __restrict__ xds, float* __restrict__ y,
                                          int rows, int units, i64 row_bytes, int blk,
                                          Wait wait, const Nrm& nrm) {
    if constexpr (!has_unit<F>::v) {
        wait();
        mvq_impl<F, 1, R>(W, xq, xds, y, rows, units, row_bytes, 1, blk);
    } else {
        const int T = blockDim.x, nw = T >> 5, lane = threadIdx.x & 31;
        const int row0 = blk * R;
        using U = typename F::U;
        U cur[R];
        // Rows past the end re-read the last row (their sums are dropped).
        auto ld = [&](int u) {
#pragma unroll
            for (int q = 0; q < R; q++)
                cur[q] = F::load_u(W + (i64)min(row0 + q, rows - 1) * row_bytes, u);
        };
        float acc[R][1];
#pragma unroll
        for (int q = 0; q < R; q++) acc[q][0] = 0.f;
        if ((int)threadIdx.x < units) ld(threadIdx.x);
        wait();
        const bool norm = nrm.part != nullptr;
        const double mine = norm && threadIdx.x < 32 && lane < nrm.np ? nrm.part[lane] : 0.0;
        // Warp 0 of block b < g / 32 writes value b·32 + lane of the normed row (one block
        // writing all of it took 10 µs a call: a chain of dependent loads and stores).
        const int oi = blockIdx.x * 32 + lane;
        const bool wo = norm && threadIdx.x < 32 && oi < nrm.g;
        const float ox = wo ? nrm.x[oi] : 0.f, ow = wo ? nrm.w[oi] : 0.f;
        for (int u = threadIdx.x; u < units; u += T) {
            int x[1][8];
            float2 ds[1];
            load_xq<1>(xq, xds, units, u, 1, x, ds);
#pragma unroll
            for (int q = 0; q < R; q++) F::template dot_u<1>(cur[q], u, x, ds, acc[q]);
            if (u + T < units) ld(u + T);
        }
        __shared__ float red[R][MVQ_WARPS];
        __shared__ float inv_rms;
#pragma unroll
        for (int q = 0; q < R; q++) {
            const float s = warp_sum(acc[q][0]);
            if (lane == 0) red[q][threadIdx.x >> 5] = s;
        }
        if (norm && threadIdx.x < 32) {
            const float r = nrm_scale(nrm, mine);
            if (lane == 0) inv_rms = r;
        }
        __syncthreads();
        for (int q = threadIdx.x; q < R; q += T) {
            if (row0 + q < rows) {
                float s = 0.f;
                for (int k = 0; k < nw; k++) s += red[q][k];
                y[row0 + q] = norm ? s * inv_rms : s;
            }
        }
        if (wo) nrm.out[oi] = ox * inv_rms * ow;
    }
}

// mvqN: up to N activation rows, R weight rows per block (the host's MVQ_ROWS_PER_BLOCK).
#define MVQ(NAME, NR, R)                                                                     \
    extern "C" __global__ void __launch_bounds__(MVQ_WARPS * 32)                             \
        NAME(const u8* W, const i8* xq, const float2* xds, float* y, int rows, int units,     \
             i64 row_bytes, int nr) {                                                        \
        gdc_prefetch_rows(W, rows, row_bytes, R, blockIdx.x);                                \
        gdc_wait();                                                                          \
        mvq_impl<FMTQ, NR, R>(W, xq, xds, y, rows, units, row_bytes, nr, blockIdx.x);        \
    }
#ifndef FMTQ2  // a pair module (below) holds only its own kernels
MVQ(mvq1, 1, 2)
MVQ(mvq2, 2, 2)
MVQ(mvq4, 4, 1)
MVQ(mvq8, 8, 1)
MVQ(mvq1x4, 1, 4)
MVQ(mvq1x8, 1, 8)
MVQ(mvq1x1, 1, 1)
// mvq1x4 by mvq_split: one activation row, rows of several rounds a thread (the host's
// choice; NEAGARI_CUDA_MVQ_SPLIT=0 turns it off; a block of one group).
extern "C" __global__ void __launch_bounds__(MVQ_WARPS * 32)
    mvq1x4u(const u8* W, const i8* xq, const float2* xds, float* y, int rows, int units,
            i64 row_bytes, int nr) {
    gdc_prefetch_rows(W, rows, row_bytes, 4, blockIdx.x);
    mvq_split<FMTQ, 4>(W, xq, xds, y, rows, units, row_bytes, blockIdx.x, [] { gdc_wait(); },
                       Nrm{});
}
#endif

// mvqmN: the same over up to four matrices of one format and width that read one input
// (MAT4_PARAMS, common.cuh). One launch instead of four, and a matrix of a few rows (a
// DeltaNet's beta/alpha) no longer leaves the GPU idle on its own.
#define MVQM(NAME, NR, R)                                                                    \
    extern "C" __global__ void __launch_bounds__(MVQ_WARPS * 32)                             \
        NAME(MAT4_PARAMS, const i8* xq, const float2* xds, int units, i64 row_bytes, int nr) { \
        const Mat4 p = MAT4_PICK(blockIdx.x);                                                \
        gdc_prefetch_rows(p.W, p.rows, row_bytes, R, p.b);                                   \
        gdc_wait();                                                                          \
        mvq_impl<FMTQ, NR, R>(p.W, xq, xds, p.y, p.rows, units, row_bytes, nr, p.b);         \
    }
#ifndef FMTQ2  // a pair module (below) holds only its own kernels
MVQM(mvqm1x1, 1, 1)
MVQM(mvqm1x2, 1, 2)
MVQM(mvqm1x4, 1, 4)
MVQM(mvqm1x8, 1, 8)
MVQM(mvqm2, 2, 2)
MVQM(mvqm4, 4, 1)
MVQM(mvqm8, 8, 1)
// mvqm1x4 by mvq_split (matmul.rs `half_warps`, NEAGARI_CUDA_MVM_HALF): the host gives it
// half the warps of `mv_warps`, two rounds a thread, as `mvq1x4u` takes the 27B's Q4_K
// ssm_out, and the first round's loads go out before the wait. With `nrm` it finishes the
// norm before it (norm.rs `norm_matmul_op`).
extern "C" __global__ void __launch_bounds__(MVQ_WARPS * 32)
    mvqm1x4u(MAT4_PARAMS, const i8* xq, const float2* xds, int units, i64 row_bytes, int nr,
             Nrm nrm) {
    const Mat4 p = MAT4_PICK(blockIdx.x);
    gdc_prefetch_rows(p.W, p.rows, row_bytes, 4, p.b);
    mvq_split<FMTQ, 4>(p.W, xq, xds, p.y, p.rows, units, row_bytes, p.b, [] { gdc_wait(); },
                       nrm);
}
#endif

// glu_act_mul (act(g)·u of the GLU kernels): common.cuh.

// q8_1 of one 32-value unit by one thread: q8_1_warp's values (max, rounding and integer
// sum do not depend on the order), for blocks whose threads do not make whole warps.
// The values come from other blocks: volatile loads (not L1), all issued before the first
// is used.
__device__ __forceinline__ void q8_1_serial(const volatile float* p, i8* xq, float2* xds,
                                            i64 unit) {
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = p[i];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float d = amax / 127.f;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int q = amax == 0.f ? 0 : (int)rintf(v[i] / d);
        xq[unit * 32 + i] = (i8)q;
        sum += q;
    }
    xds[unit] = make_float2(d, d * (float)sum);
}

// mvqgN: a gated MLP's gate and up GEMVs and its GLU in one launch: block b computes its
// rows of both matrices (mvq_impl twice; the thread that wrote an output of each applies
// g = act(g)·u to it), so no GLU launch follows. A block holds RB = R·blockDim.y rows (the
// repacked formats' row groups; 1 group otherwise). With oq set (rows a multiple of 32, RB
// a power of two), the q8_1 of g for the down projection too: a block of ≥ 32 rows
// quantizes its own units; below, the last block to finish a unit (cnt[unit] counts its
// 32 / RB blocks, then goes back to 0) does. oq is not the xq being read.
template <int NR, int R>
__device__ __forceinline__ void mvqg_impl(const u8* Wg, const u8* Wu, const i8* xq,
                                          const float2* xds, float* g, float* u, int rows,
                                          int units, i64 row_bytes, int nr, int act, i8* oq,
                                          float2* ods, u32* cnt) {
    const int blk = blockIdx.x, G = blockDim.y;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthr = blockDim.x * G;
    mvq_impl<FMTQ, NR, R>(Wg, xq, xds, g, rows, units, row_bytes, nr, blk);
    __syncthreads();  // mvq_impl's reduction scratch is reused
    mvq_impl<FMTQ, NR, R>(Wu, xq, xds, u, rows, units, row_bytes, nr, blk);
    // The outputs this thread wrote (mvq_impl's and mvq_step's mapping).
    for (int o = tid; o < G * R * NR; o += nthr) {
        const int q = o % (R * NR) / NR, r = o % NR, row = (blk * G + o / (R * NR)) * R + q;
        if (r < nr && row < rows) {
            const i64 i = (i64)r * rows + row;
            g[i] = glu_act_mul(g[i], u[i], act);
        }
    }
    if (!oq) return;
    const int rb = R * G;
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (rb < 32) {
        if (tid == 0) last = atomicAdd(cnt + blk * rb / 32, 1u) == (u32)(32 / rb) - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
    }
    // This block's units (the one it completed, or its own), for every activation row.
    const int u0 = blk * rb / 32, nu = min(max(rb / 32, 1), rows / 32 - u0);
    for (int jb = tid; jb < nu * nr; jb += nthr) {
        const int r = jb / nu, un = u0 + jb % nu;
        q8_1_serial(g + (i64)r * rows + un * 32, oq, ods, (i64)r * (rows / 32) + un);
    }
    if (rb < 32 && tid == 0) cnt[u0] = 0;
}

#define MVQG(NAME, NR, R)                                                                    \
    extern "C" __global__ void __launch_bounds__(MVQ_WARPS * 32)                             \
        NAME(const u8* wg, const u8* wu, const i8* xq, const float2* xds, float* g, float* u, \
             int rows, int units, i64 row_bytes, int nr, int act, i8* oq, float2* ods,        \
             u32* cnt) {                                                                     \
        gdc_wait();                                                                          \
        mvqg_impl<NR, R>(wg, wu, xq, xds, g, u, rows, units, row_bytes, nr, act, oq, ods,     \
                         cnt);                                                               \
    }
#ifndef FMTQ2  // a pair module (below) holds only its own kernels
MVQG(mvqg1x1, 1, 1)
MVQG(mvqg1x2, 1, 2)
MVQG(mvqg1x4, 1, 4)
MVQG(mvqg1x8, 1, 8)
MVQG(mvqg2, 2, 2)
MVQG(mvqg4, 4, 1)
MVQG(mvqg8, 8, 1)
#endif

#ifdef FMTQ2
// mvqpN: `matmul_multi` of one activation row over matrices of TWO formats that read one
// input, as mvqm: matrices [0, na) are FMTQ (row_bytes ra), the rest FMTQ2 (rb), one launch
// instead of one a format (Gemma 3's Q4_K_M q, k in Q5_0 beside its v in Q8_0). Both
// formats take one 32-value unit a thread step (no STEP), so mv_block's shape suits both.
// A module of its own (matmul.rs `pair_kernels`), compiled at load.
#define MVQP(NAME, R)                                                                        \
    extern "C" __global__ void __launch_bounds__(MVQ_WARPS * 32)                             \
        NAME(MAT4_PARAMS, const i8* xq, const float2* xds, int units, i64 ra, i64 rb, int na) { \
        const Mat4 p = MAT4_PICK(blockIdx.x);                                                \
        const i64 row_bytes = p.m < na ? ra : rb;                                            \
        gdc_prefetch_rows(p.W, p.rows, row_bytes, R, p.b);                                   \
        gdc_wait();                                                                          \
        if (p.m < na) mvq_impl<FMTQ, 1, R>(p.W, xq, xds, p.y, p.rows, units, row_bytes, 1, p.b); \
        else mvq_impl<FMTQ2, 1, R>(p.W, xq, xds, p.y, p.rows, units, row_bytes, 1, p.b);     \
    }
MVQP(mvqp1x1, 1)
MVQP(mvqp1x2, 2)
MVQP(mvqp1x4, 4)
MVQP(mvqp1x8, 8)
#endif
