// The pipelined one-row GEMV of the repacked formats (FMTQ with a STEP, vecdot.cuh): the
// decode step's matmuls. gemv_int.cu's `mvq_step` gives each thread one step of R rows,
// so a block loads, then computes, then reduces, and where the grid is about one wave
// (the 27B's per-layer matrices) the memory idles while the SMs compute: 1.0–1.4 TB/s,
// against 1.8 for the 248K-row head, whose blocks come in many waves. Here a thread keeps
// its step's activation in registers and walks K chunks of R rows with the next rows'
// loads in flight while it computes the current ones.
//
// A block is G = blockDim.y groups of T = blockDim.x threads, T the row's step count
// (the host's choice; at most 256): group g computes rows (blk·G + g)·R·K .. +R·K, thread
// t its step t of each. The per-row sums go through shared memory and one thread per row
// adds the T parts in order: the arithmetic and order of `mvq_step` with the same T, so
// the same bits, and `matmul_multi` equals the single matmul.
//
// Shapes: xq [units·32] i8, xds [units] float2 (one activation row); W `rows` packed rows
// of `row_bytes`; y [rows] f32.

// Rows a block at most (R·K·G ≤ MVS_ROWS·G) and threads a block (G·T ≤ 256).
#define MVS_ROWS 32
// Blocks an SM the compiler must leave registers for: two blocks of 256 threads (≤ 128
// registers a thread). Unbounded, ptxas gives mvs_8 up to 255 (NVRTC 13.5) and ncu saw 25%
// theoretical occupancy on the H200 with 63% of scheduler cycles idle; capped, tg64 went
// 211.6 → 231.0 tok/s (Q1_0) and 180.7 → 195.6 (TQ2_0) on the 27B-shaped files; three
// blocks (≤ 80 registers) spill: 194.5 and 172.4. NEAGARI_CUDA_MVS_MINB=N overrides.
#ifndef MVS_MINB
#define MVS_MINB 2
#endif

// Per-thread sums of a group's R·K rows from `base` into part[c·R + q][tid] (thread t's
// step t of each). `wait` is the kernel's gdc_wait, called once the first weight loads are
// out.
template <class F, int R, class Wait>
__device__ __forceinline__ void mvs_parts(const u8* __restrict__ W, int base,
                                          const i8* __restrict__ xq,
                                          const float2* __restrict__ xds, int rows, int units,
                                          i64 row_bytes, int K, Wait wait,
                                          float (&part)[MVS_ROWS][257]) {
    constexpr int S = F::STEP;
    const int T = blockDim.x, t = threadIdx.x, tid = threadIdx.y * T + t;
    // Rows past the end re-read the last row (their sums are dropped).
    auto row_at = [&](int c, int q) {
        return W + (i64)min(base + c * R + q, rows - 1) * row_bytes;
    };
    typename F::W cur[R];
#pragma unroll
    for (int q = 0; q < R; q++) cur[q] = F::load(row_at(0, q), t);
    // The weights do not depend on the kernel before: their first loads go out before the
    // wait, only the activation waits for it (tg128 27B Q1_0 216.7 → 224.7 tok/s, H200).
    wait();
    int x[S][1][8];
    float2 ds[S][1];
#pragma unroll
    for (int u = 0; u < S; u++) load_xq<1>(xq, xds, units, t * S + u, 1, x[u], ds[u]);
    for (int c = 0; c < K; c++) {
#pragma unroll
        for (int q = 0; q < R; q++) {
            const typename F::W w = cur[q];
            if (c + 1 < K) cur[q] = F::load(row_at(c + 1, q), t);
            float a[1] = {0.f};
#pragma unroll
            for (int u = 0; u < S; u++) F::template dot<1>(w, u, x[u], ds[u], a);
            part[c * R + q][tid] = a[0];
        }
    }
}

// With a norm (`nrm`, common.cuh's Nrm; part set) the row sums are scaled by the row's 1/rms
// and the first g / 32 blocks write the normed row (NrmStage). `pf` (cuda/prefetch.rs
// `take_rec`): the DeltaNet state the kernel after reads, asked into L2 once the block's
// weight loads are all out, so it lands while the GEMV finishes rather than in the next
// kernel's first microseconds (its blocks cannot start beside this one's: registers).
template <class F, int R, class Wait>
__device__ __forceinline__ void mvs_impl(const u8* __restrict__ W, const i8* __restrict__ xq,
                                         const float2* __restrict__ xds, float* __restrict__ y,
                                         int rows, int units, i64 row_bytes, int K, int blk,
                                         Wait wait, const Nrm& nrm, const Pf& pf) {
    const int T = blockDim.x, tid = threadIdx.y * T + threadIdx.x;
    __shared__ float part[MVS_ROWS][256 + 1];  // +1: the adds below read a column
    __shared__ NrmStage ns;
    mvs_parts<F, R>(W, (blk * (int)blockDim.y + (int)threadIdx.y) * R * K, xq, xds, rows,
                    units, row_bytes, K, [&] {
                        wait();
                        ns.issue(nrm, tid);
                    },
                    part);
    pf_issue(pf);
    ns.finish(nrm, tid);
    __syncthreads();
    const int per = R * K;
    for (int o = tid; o < (int)blockDim.y * per; o += T * (int)blockDim.y) {
        const int g = o / per, cq = o % per;
        const int row = (blk * (int)blockDim.y + g) * per + cq;
        if (row < rows) {
            float v = 0.f;
            for (int i = 0; i < T; i++) v += part[cq][g * T + i];
            y[row] = nrm.part ? v * ns.inv : v;
        }
    }
    ns.out(nrm, tid);
}

// mvs_R: up to four matrices of one format and width that read one input (MAT4_PARAMS);
// with `nrm` it finishes the norm before it (cuda/norm.rs `norm_matmul_op`).
#define MVS(R)                                                                               \
    extern "C" __global__ void __launch_bounds__(256, MVS_MINB)                              \
        mvs_##R(MAT4_PARAMS, const i8* xq, const float2* xds, int units, i64 row_bytes, int K, \
                Nrm nrm, Pf pf) {                                                            \
        const Mat4 p = MAT4_PICK(blockIdx.x);                                                \
        const int per = (int)blockDim.y * R * K, first = p.b * per;                          \
        if (first < p.rows) gdc_prefetch(p.W + (i64)first * row_bytes,                      \
                                         (i64)min(per, p.rows - first) * row_bytes);         \
        mvs_impl<FMTQ, R>(p.W, xq, xds, p.y, p.rows, units, row_bytes, K, p.b,               \
                          [] { gdc_wait(); }, nrm, pf);                                      \
    }
MVS(2)
MVS(4)
MVS(8)

// mvsg_R: a gated MLP's gate and up GEMVs and its GLU in one launch (one activation row),
// where the separate ops took `mvs_R` over both matrices and a `glu_*_q` launch. A block's
// first G/2 groups compute N = (G/2)·R·K rows of gate, the others the same rows of up; the
// thread of output row o adds both rows' parts as `mvs_impl` does (same order, so the same
// sums), writes u and g = act(g)·u (glu_act_mul: the GLU kernels' arithmetic). With oq set
// (rows and N multiples of 32), the q8_1 of g for the down projection: warp w of the block
// quantizes rows 32w .. 32w+31 of its N (the host keeps N within the block's threads, so a
// thread has one output row, tid), the values q8_1_warp took in glu_*_q. With `nrm` it
// finishes the norm before it (NrmStage; gate and up sums scaled by 1/rms before the GLU).
template <class F, int R, class Wait>
__device__ __forceinline__ void mvsg_impl(const u8* Wg, const u8* Wu, const i8* xq,
                                          const float2* xds, float* g, float* u, int rows,
                                          int units, i64 row_bytes, int K, int act, i8* oq,
                                          float2* ods, Wait wait, const Nrm& nrm) {
    const int T = blockDim.x, half = blockDim.y >> 1, gy = threadIdx.y;
    const int tid = gy * T + threadIdx.x, blk = blockIdx.x;
    const int per = R * K, N = half * per;
    const bool is_up = gy >= half;
    const u8* W = is_up ? Wu : Wg;
    const int first = blk * N + (is_up ? gy - half : gy) * per;
    if (first < rows) gdc_prefetch(W + (i64)first * row_bytes, (i64)min(per, rows - first) * row_bytes);
    __shared__ float part[MVS_ROWS][256 + 1];
    __shared__ NrmStage ns;
    mvs_parts<F, R>(W, first, xq, xds, rows, units, row_bytes, K, [&] {
        wait();
        ns.issue(nrm, tid);
    }, part);
    ns.finish(nrm, tid);
    __syncthreads();
    for (int o = tid; o < N; o += T * (int)blockDim.y) {
        const int lg = o / per, cq = o % per, row = blk * N + o;
        float r = 0.f;
        if (row < rows) {
            float vg = 0.f, vu = 0.f;
            for (int i = 0; i < T; i++) vg += part[cq][lg * T + i];
            for (int i = 0; i < T; i++) vu += part[cq][(lg + half) * T + i];
            if (nrm.part) vg *= ns.inv, vu *= ns.inv;
            r = glu_act_mul(vg, vu, act);
            g[row] = r;
            u[row] = vu;
        }
        // A warp's 32 rows are one unit, all in (rows a multiple of 32) or all out.
        if (oq && row < rows) q8_1_warp(r, oq, ods, row >> 5, o & 31);
    }
    ns.out(nrm, tid);
}

#define MVSG(R)                                                                              \
    extern "C" __global__ void __launch_bounds__(256, MVS_MINB)                              \
        mvsg_##R(const u8* wg, const u8* wu, const i8* xq, const float2* xds, float* g,        \
                 float* u, int rows, int units, i64 row_bytes, int K, int act, i8* oq,         \
                 float2* ods, Nrm nrm) {                                                     \
        mvsg_impl<FMTQ, R>(wg, wu, xq, xds, g, u, rows, units, row_bytes, K, act, oq, ods,    \
                           [] { gdc_wait(); }, nrm);                                         \
    }
MVSG(2)
MVSG(4)
MVSG(8)
