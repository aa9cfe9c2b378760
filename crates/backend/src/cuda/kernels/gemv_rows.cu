// Integer GEMV of 3–8 activation rows on the tensor cores (sm_80+): the verify forward of
// a speculative block, where `mvq8` (gemv_int.cu) re-read the eight rows' q8_1 activations
// for every weight row and spent 64 dp4a per 32 weights.
//
// One `mma.sync.m16n8k32` (s8 × s8 → s32) per 32-weight unit and 16 weight rows: the
// weights are the A side (16 rows × the unit's 32 values), the activation rows the n = 8
// side, so each weight byte is read and unpacked once for all eight rows and each
// activation word is loaded once per 16 weight rows. The unit's integer dots then take the
// unit's scales in f32, as `mvq_impl` does: acc += A_w · d_x · Σ w·q + B_w · d_x·Σq, with
// (A_w, B_w) from the format struct below (the same arithmetic as vecdot.cuh's `dot`).
//
// Fragments (PTX ISA, m16n8k32 .s8): thread (g = lane / 4, t = lane % 4) holds A of rows
// g and g + 8 at k-slots 4t.. and 16 + 4t.., B of column g at the same slots, and C of rows
// g, g + 8 and columns 2t, 2t + 1. The sum over k does not care which weight sits in which
// slot as long as A and B agree, so slot group t holds the unit's word 2t and group 4 + t
// word 2t + 1: a thread loads 8 contiguous activation bytes and unpacks two contiguous
// words of each of its rows.
//
// A format struct `R_<fmt>` gives `unit(row, u, t, w0, w1)`: words 2t and 2t + 1 of unit u
// (four signed bytes each, the activation words' order), returning (A_w, B_w). Formats with
// scales per 16 values (Q2_K, Q3_K, Q6_K) have none and stay on `mvq8`. Tested against the
// CPU backend and the exact product in tests/cuda_ops.rs (`multi_row_gemv_on_tensor_cores`).
//
// Shapes as gemv_int.cu: xq [nr, units·32] i8, xds [nr, units] float2, y [nr, rows] f32.

struct R_Q4_0 {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)u * 18;
        const float d = h2f(ld16(b));
        // Words 0..3 are the low nibbles of qs' words, 4..7 the high ones.
        const u8* q = b + 2 + 8 * (t & 1);
        const int sh = (t >> 1) * 4;
        w0 = (ld32_2(q) >> sh) & 0x0F0F0F0F;
        w1 = (ld32_2(q + 4) >> sh) & 0x0F0F0F0F;
        return make_float2(d, -8.f * d);
    }
};

struct R_Q4_1 {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)u * 20;
        const u8* q = b + 4 + 8 * (t & 1);
        const int sh = (t >> 1) * 4;
        w0 = (ld32_4(q) >> sh) & 0x0F0F0F0F;
        w1 = (ld32_4(q + 4) >> sh) & 0x0F0F0F0F;
        return make_float2(h2f(ld16(b)), h2f(ld16(b + 2)));
    }
};

struct R_Q5_0 {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)u * 22;
        const float d = h2f(ld16(b));
        const u32 qh = ld32_2(b + 2);
        const u8* q = b + 6 + 8 * (t & 1);
        const int sh = (t >> 1) * 4;
        // Word k holds weights 4k..4k+3: their fifth bits are qh's bits 4k..4k+3.
        w0 = ((ld32_2(q) >> sh) & 0x0F0F0F0F) | spread4(qh >> (8 * t), 4);
        w1 = ((ld32_2(q + 4) >> sh) & 0x0F0F0F0F) | spread4(qh >> (8 * t + 4), 4);
        return make_float2(d, -16.f * d);
    }
};

struct R_Q5_1 {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)u * 24;
        const u32 qh = ld32_4(b + 4);
        const u8* q = b + 8 + 8 * (t & 1);
        const int sh = (t >> 1) * 4;
        w0 = ((ld32_4(q) >> sh) & 0x0F0F0F0F) | spread4(qh >> (8 * t), 4);
        w1 = ((ld32_4(q + 4) >> sh) & 0x0F0F0F0F) | spread4(qh >> (8 * t + 4), 4);
        return make_float2(h2f(ld16(b)), h2f(ld16(b + 2)));
    }
};

struct R_Q8_0 {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)u * 34;
        w0 = (int)ld32_2(b + 2 + 8 * t);
        w1 = (int)ld32_2(b + 6 + 8 * t);
        return make_float2(h2f(ld16(b)), 0.f);
    }
};

struct R_Q4_K {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)(u >> 3) * 144;
        const int s = u & 7;
        int sc, m;
        scale_min_k4(s, b + 4, sc, m);
        // 8-byte aligned: super-blocks are 9·16 bytes and qs starts at byte 16.
        const uint2 v = *(const uint2*)(b + 16 + 32 * (s >> 1) + 8 * t);
        const int sh = (s & 1) * 4;
        w0 = (v.x >> sh) & 0x0F0F0F0F;
        w1 = (v.y >> sh) & 0x0F0F0F0F;
        return make_float2(h2f(ld16(b)) * (float)sc, -h2f(ld16(b + 2)) * (float)m);
    }
};

struct R_Q5_K {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)(u >> 3) * 176;
        const int s = u & 7;
        int sc, m;
        scale_min_k4(s, b + 4, sc, m);
        // 8-byte aligned: super-blocks are 11·16 bytes, qh at 16, ql at 48.
        const uint2 l = *(const uint2*)(b + 48 + 32 * (s >> 1) + 8 * t);
        const uint2 h = *(const uint2*)(b + 16 + 8 * t);
        const int sh = (s & 1) * 4;
        w0 = ((l.x >> sh) & 0x0F0F0F0F) | (((h.x >> s) & 0x01010101) << 4);
        w1 = ((l.y >> sh) & 0x0F0F0F0F) | (((h.y >> s) & 0x01010101) << 4);
        return make_float2(h2f(ld16(b)) * (float)sc, -h2f(ld16(b + 2)) * (float)m);
    }
};

struct R_Q1_0 {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)(u >> 2) * 18;
        const float d = h2f(ld16(b));
        // Byte t of the unit's 32 sign bits holds words 2t and 2t + 1 (a nibble each);
        // bit i of a nibble to bit 8i as vecdot.cuh's Q_Q1_0. Σ ±x = 2·Σ_{bit set} x − Σ x.
        const u32 bits = b[2 + 4 * (u & 3) + t];
        w0 = ((bits & 0xFu) * 0x00204081u) & 0x01010101u;
        w1 = ((bits >> 4) * 0x00204081u) & 0x01010101u;
        return make_float2(2.f * d, -d);
    }
};

struct R_TQ2_0 {
    static __device__ __forceinline__ float2 unit(const u8* row, int u, int t, int& w0, int& w1) {
        const u8* b = row + (i64)(u >> 3) * 66;
        const int s = u & 7;
        const float d = h2f(ld16(b + 64));
        const u8* q = b + 32 * (s >> 2) + 8 * t;
        const int sh = 2 * (s & 3);
        // Codes 0..2 for −1..1: the −1 goes through d·Σq.
        w0 = (ld32_2(q) >> sh) & 0x03030303;
        w1 = (ld32_2(q + 4) >> sh) & 0x03030303;
        return make_float2(d, -d);
    }
};

// Up to 8 warps a block split the units of the block's 16 weight rows (the host picks as
// many as the units fill, `mvr_warps`); they meet in shared memory at the end.
#define MVR_WARPS 8

__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], int b0, int b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    // The host runs these kernels only on sm_80 and newer (mvr_on).
    __trap();
#endif
}

// Weight rows 16·blk .. 16·blk + 15 for nr ≤ 8 activation rows.
template <class F>
__device__ __forceinline__ void mvr_impl(const u8* __restrict__ W, const i8* __restrict__ xq,
                                         const float2* __restrict__ xds, float* __restrict__ y,
                                         int rows, int units, i64 row_bytes, int nr, int blk) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blk * 16 + g, r1 = r0 + 8;
    // Rows past the end re-read the last row (their sums are dropped).
    const u8* wa = W + (i64)min(r0, rows - 1) * row_bytes;
    const u8* wb = W + (i64)min(r1, rows - 1) * row_bytes;
    // This thread's activation words (row g) and the scales of its output columns.
    const bool xin = g < nr;
    const int2* xr = (const int2*)(xq + (i64)(xin ? g : 0) * units * 32) + t;
    const int c0 = 2 * t, c1 = 2 * t + 1;
    const float2* s0 = xds + (i64)min(c0, nr - 1) * units;
    const float2* s1 = xds + (i64)min(c1, nr - 1) * units;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int u = warp; u < units; u += nw) {
        int a[4];
        const float2 fa = F::unit(wa, u, t, a[0], a[2]);
        const float2 fb = F::unit(wb, u, t, a[1], a[3]);
        int2 x = __ldg(xr + (i64)u * 4);
        if (!xin) x = make_int2(0, 0);
        const float2 e0 = __ldg(s0 + u), e1 = __ldg(s1 + u);
        int c[4] = {0, 0, 0, 0};
        mma_s8(c, a, x.x, x.y);
        acc[0] += fa.x * e0.x * (float)c[0] + fa.y * e0.y;
        acc[1] += fa.x * e1.x * (float)c[1] + fa.y * e1.y;
        acc[2] += fb.x * e0.x * (float)c[2] + fb.y * e0.y;
        acc[3] += fb.x * e1.x * (float)c[3] + fb.y * e1.y;
    }
    __shared__ float red[MVR_WARPS][4][32];
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][i][lane] = acc[i];
    __syncthreads();
    if (warp == 0) {
        // Summed in warp order: the result does not depend on timing.
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float s = 0.f;
            for (int w = 0; w < nw; w++) s += red[w][i][lane];
            const int r = i < 2 ? r0 : r1, c = (i & 1) ? c1 : c0;
            if (r < rows && c < nr) y[(i64)c * rows + r] = s;
        }
    }
}

extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32)
    mvr(const u8* W, const i8* xq, const float2* xds, float* y, int rows, int units,
        i64 row_bytes, int nr) {
    mvr_impl<FMTR>(W, xq, xds, y, rows, units, row_bytes, nr, blockIdx.x);
}

// The same over up to four matrices of one format and width (`mvqm*`'s block ranges).
extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32)
    mvrm(const u8* w0, const u8* w1, const u8* w2, const u8* w3, float* y0, float* y1,
         float* y2, float* y3, int n0, int n1, int n2, int n3, int b1, int b2, int b3,
         const i8* xq, const float2* xds, int units, i64 row_bytes, int nr) {
    int b = blockIdx.x;
    const u8* W = w0;
    float* y = y0;
    int rows = n0;
    if (b >= b3) { b -= b3; W = w3; y = y3; rows = n3; }
    else if (b >= b2) { b -= b2; W = w2; y = y2; rows = n2; }
    else if (b >= b1) { b -= b1; W = w1; y = y1; rows = n1; }
    mvr_impl<FMTR>(W, xq, xds, y, rows, units, row_bytes, nr, b);
}
