// Kernels of one weight format (FMT is defined by the module's compile options):
// the warp-per-row GEMV for 1..NR activation rows, the embedding lookup, and the
// dequantization to f16 that feeds cuBLAS for larger batches.
//
// Shapes: W is `rows` packed rows of `units` × 32 weights (`row_bytes` each; float
// formats are padded to whole units at upload); x is [nr, cols] f32, y is [nr, rows] f32.

#define MV_WARPS 4

template <int N>
__device__ __forceinline__ float dot32(const float* w, const float* x) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < N; i++) s += w[i] * x[i];
    return s;
}

__device__ __forceinline__ void load_x32(const float* __restrict__ x, float* xr) {
    const float4* xv = (const float4*)x;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 a = __ldg(xv + i);
        xr[4 * i] = a.x; xr[4 * i + 1] = a.y; xr[4 * i + 2] = a.z; xr[4 * i + 3] = a.w;
    }
}

// A block of 1–4 warps computes R consecutive weight rows for nr ≤ NR activation rows.
// Its threads take 32-weight units round-robin (about one unit per thread on a 4096-wide
// row, so thousands of short warps keep enough loads in flight), decode them in registers,
// and the block reduces at the end. With one activation row the x unit is loaded once and
// reused by the R weight rows; with several, each decoded unit serves every activation row.
template <class F, int NR, int R>
__device__ __forceinline__ void mv_impl(const u8* __restrict__ W, const float* __restrict__ x,
                                        float* __restrict__ y, int rows, int cols, i64 row_bytes,
                                        int nr) {
    const int tid = threadIdx.x, nthr = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * R;
    const int units = (cols + 31) >> 5;
    const bool vec_ok = (cols & 3) == 0;
    float acc[R][NR];
#pragma unroll
    for (int q = 0; q < R; q++)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[q][r] = 0.f;
    for (int u = tid; u < units; u += nthr) {
        float w[32];
        if ((u + 1) * 32 <= cols && vec_ok) {
            if constexpr (NR == 1) {
                float xr[32];
                load_x32(x + u * 32, xr);
#pragma unroll
                for (int q = 0; q < R; q++) {
                    if (row0 + q < rows) {
                        F::unit(W + (i64)(row0 + q) * row_bytes, u, w);
                        acc[q][0] += dot32<32>(w, xr);
                    }
                }
            } else {
#pragma unroll
                for (int q = 0; q < R; q++) {
                    if (row0 + q < rows) {
                        F::unit(W + (i64)(row0 + q) * row_bytes, u, w);
#pragma unroll
                        for (int r = 0; r < NR; r++) {
                            if (r < nr) {
                                float xr[32];
                                load_x32(x + (i64)r * cols + u * 32, xr);
                                acc[q][r] += dot32<32>(w, xr);
                            }
                        }
                    }
                }
            }
        } else {
            // Ragged tail of a float row whose length is not a multiple of 32 (or of 4).
#pragma unroll
            for (int q = 0; q < R; q++) {
                if (row0 + q < rows) {
                    F::unit(W + (i64)(row0 + q) * row_bytes, u, w);
#pragma unroll
                    for (int r = 0; r < NR; r++) {
                        if (r < nr) {
                            float s = 0.f;
#pragma unroll
                            for (int i = 0; i < 32; i++)
                                if (u * 32 + i < cols) s += w[i] * x[(i64)r * cols + u * 32 + i];
                            acc[q][r] += s;
                        }
                    }
                }
            }
        }
    }
    __shared__ float red[R * NR][MV_WARPS];
#pragma unroll
    for (int q = 0; q < R; q++)
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float s = warp_sum(acc[q][r]);
            if (lane == 0) red[q * NR + r][warp] = s;
        }
    __syncthreads();
    if (tid < R * NR) {
        const int q = tid / NR, r = tid % NR;
        if (r < nr && row0 + q < rows) {
            float s = 0.f;
            for (int k = 0; k < (nthr >> 5); k++) s += red[tid][k];
            y[(i64)r * rows + row0 + q] = s;
        }
    }
}

// mvN: up to N activation rows; R weight rows per block (the host's MV_ROWS_PER_BLOCK).
#define MV(NAME, NR, R)                                                                      \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32)                               \
        NAME(const u8* W, const float* x, float* y, int rows, int cols, i64 row_bytes,        \
             int nr) {                                                                        \
        gdc_wait();                                                                           \
        mv_impl<FMT, NR, R>(W, x, y, rows, cols, row_bytes, nr);                              \
    }
MV(mv1, 1, 2)
MV(mv2, 2, 2)
MV(mv4, 4, 1)
MV(mv8, 8, 1)
// Single row, four weight rows per block (more loads in flight per thread; chosen with
// NEAGARI_CUDA_MV_ROWS=4 while the two are compared).
MV(mv1x4, 1, 4)

// out[i, :] = W[ids[i], :] * scale. Grid: (ids, ceil(units / 128)).
extern "C" __global__ void embed(const u8* W, const u32* ids, float* out, int cols,
                                 i64 row_bytes, float scale) {
    gdc_wait();
    const int i = blockIdx.x;
    const int u = blockIdx.y * blockDim.x + threadIdx.x;
    if (u * 32 >= cols) return;
    const u8* wr = W + (i64)ids[i] * row_bytes;
    float w[32];
    FMT::unit(wr, u, w);
    float* o = out + (i64)i * cols + u * 32;
    for (int k = 0; k < 32 && u * 32 + k < cols; k++) o[k] = w[k] * scale;
}

// dst[r, :] = f16(W[r, :]) over whole units (kp = units·32 columns). Four threads per
// unit, each storing 8 consecutive halves as one 16-byte write, so a warp's stores are
// contiguous (the unit is decoded four times; the ALU has room, the stores had not).
extern "C" __global__ void dequant_f16(const u8* W, u16* dst, int rows, int units,
                                       i64 row_bytes) {
    gdc_wait();
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)rows * units * 4) return;
    const i64 tu = t >> 2;
    const int part = (int)(t & 3);
    const int r = (int)(tu / units), u = (int)(tu % units);
    float w[32];
    FMT::unit(W + (i64)r * row_bytes, u, w);
    u32 h[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i = part * 8 + 2 * k;
        // Select by the compile-time index, so w stays in registers.
        float a = 0.f, b = 0.f;
#pragma unroll
        for (int j = 0; j < 32; j += 2)
            if (j == i) { a = w[j]; b = w[j + 1]; }
        h[k] = (u32)f2h(a) | ((u32)f2h(b) << 16);
    }
    uint4* o = (uint4*)(dst + (i64)r * units * 32 + u * 32 + part * 8);
    *o = make_uint4(h[0], h[1], h[2], h[3]);
}
