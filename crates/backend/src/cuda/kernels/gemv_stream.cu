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

// `wait` is the kernel's gdc_wait, called once the first weight loads are out.
template <class F, int R, class Wait>
__device__ __forceinline__ void mvs_impl(const u8* __restrict__ W, const i8* __restrict__ xq,
                                         const float2* __restrict__ xds, float* __restrict__ y,
                                         int rows, int units, i64 row_bytes, int K, int blk,
                                         Wait wait) {
    constexpr int S = F::STEP;
    const int T = blockDim.x, t = threadIdx.x, tid = threadIdx.y * T + t;
    const int base = (blk * (int)blockDim.y + (int)threadIdx.y) * R * K;
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
    __shared__ float part[MVS_ROWS][256 + 1];  // +1: the adds below read a column
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
    __syncthreads();
    const int per = R * K;
    for (int o = tid; o < (int)blockDim.y * per; o += T * (int)blockDim.y) {
        const int g = o / per, cq = o % per;
        const int row = (blk * (int)blockDim.y + g) * per + cq;
        if (row < rows) {
            float v = 0.f;
            for (int i = 0; i < T; i++) v += part[cq][g * T + i];
            y[row] = v;
        }
    }
}

// mvs_R: up to four matrices of one format and width that read one input (MAT4_PARAMS).
#define MVS(R)                                                                               \
    extern "C" __global__ void __launch_bounds__(256, MVS_MINB)                              \
        mvs_##R(MAT4_PARAMS, const i8* xq, const float2* xds, int units, i64 row_bytes, int K) { \
        const Mat4 p = MAT4_PICK(blockIdx.x);                                                \
        const int per = (int)blockDim.y * R * K, first = p.b * per;                          \
        if (first < p.rows) gdc_prefetch(p.W + (i64)first * row_bytes,                      \
                                         (i64)min(per, p.rows - first) * row_bytes);         \
        mvs_impl<FMTQ, R>(p.W, xq, xds, p.y, p.rows, units, row_bytes, K, p.b,               \
                          [] { gdc_wait(); });                                               \
    }
MVS(2)
MVS(4)
MVS(8)
