// Prototype (session 35, docs/BENCHMARKS.md): Q1_0 weights "bit-sliced by unit" against the
// engine's Q1_0R word layout, for the one-row dp4a GEMV and the 8-row (verify) int8-MMA
// GEMV, with q8_1 activations (a scale a 32-value unit, as now: no change of rounding).
// Not built by cargo; on the GPU machine:
//     nvcc -O3 -arch=sm_90a -std=c++17 bench/cuda/q1_slice_proto.cu -o /tmp/qs && /tmp/qs
//
// Q1_0R (repack.rs, vecdot.cuh Q_Q1_0R): a 32-bit word is one unit, weight 4k + j at bit
// 8j + k, so the bytes of weights 4k..4k+3 need a shift to a common bit before dp4a can add
// the unit's eight words into one sum: (w << (7 − k)) & 0x80808080, then dp4a — three
// instructions a 4 weights. Bit-sliced: eight units of a row (256 weights, two Q1_0
// blocks) are eight words, unit s at bit s of every byte: word w, bit 8j + s = weight
// 4w + j of unit s. A unit's eight words then share one bit, so w & (0x01010101 << s) (an
// immediate mask, s known at compile time) is 2^s·b a byte and dp4a sums the unit at that
// one scale, which the unit's float step takes out: two instructions a 4 weights. In the
// 8-row int8 MMA (u8 × s8, m16n8k32, one unit an MMA) the A registers are one LOP3 each
// instead of a shift and a LOP3. Same sums, other layout: both variants are checked
// against one host reference.
#include <random>
#include "proto_common.cuh"

__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
__device__ __forceinline__ u32 w8(const uint4& a, const uint4& b, int i) {
    const uint4& v = i < 4 ? a : b;
    const int j = i & 3;
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// One row: a group of T threads takes R rows; a thread a step of 8 units (32 bytes of a
// row) at a time, round-robin; the unit's activation (8 words, (d, d·Σq)) is loaded once
// and serves the R rows. SLICED picks the layout. Sums in the thread, then the group's
// threads through shared memory. Scales f16 [row][block of 128].
template <bool SLICED, int R>
__global__ void __launch_bounds__(256) mv1(const u8* __restrict__ W, const __half* __restrict__ sc,
                                           const i8* __restrict__ xq, const float2* __restrict__ xds,
                                           float* __restrict__ y, int rows, int units) {
    const int T = blockDim.x, G = blockDim.y;
    const int row0 = (blockIdx.x * G + threadIdx.y) * R;
    const int steps = units / 8, nb = units / 4;
    const i64 row_bytes = (i64)units * 4;
    float acc[R];
#pragma unroll
    for (int q = 0; q < R; q++) acc[q] = 0.f;
    for (int s = threadIdx.x; s < steps; s += T) {
        uint4 wa[R], wb[R];
        float d[R][2];
#pragma unroll
        for (int q = 0; q < R; q++) {
            const int r = min(row0 + q, rows - 1);
            const u8* p = W + (i64)r * row_bytes + 32 * s;
            wa[q] = ld_stream(p);
            wb[q] = ld_stream(p + 16);
            const __half2 h = *(const __half2*)(sc + (i64)r * nb + 2 * s);
            d[q][0] = __low2float(h);
            d[q][1] = __high2float(h);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int un = 8 * s + u;
            const int4 xa = *(const int4*)(xq + (i64)un * 32), xb = *(const int4*)(xq + (i64)un * 32 + 16);
            const int x[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            const float2 ds = xds[un];
#pragma unroll
            for (int q = 0; q < R; q++) {
                int c = 0;
                float f;
                if constexpr (SLICED) {
                    // Unit u at bit u of every byte of the 8 words: 2^u·Σ_set x.
#pragma unroll
                    for (int k = 0; k < 8; k++) c = dp4a_us(w8(wa[q], wb[q], k) & (0x01010101u << u), x[k], c);
                    f = (float)c * (2.0f / (float)(1 << u));
                } else {
                    // Q1_0R: unit u is word u; weights 4k..4k+3 at bits 8j + k: shifted to bit 7.
                    const u32 v = w8(wa[q], wb[q], u);
#pragma unroll
                    for (int k = 0; k < 8; k++) c = dp4a_us((v << (7 - k)) & 0x80808080u, x[k], c);
                    f = (float)(c >> 6);
                }
                acc[q] += d[q][u >> 2] * (ds.x * f - ds.y);
            }
        }
    }
    // [group][row][thread]; T·G ≤ 256.
    __shared__ float part[256 * R];
#pragma unroll
    for (int q = 0; q < R; q++) part[(threadIdx.y * R + q) * T + threadIdx.x] = acc[q];
    __syncthreads();
    if (threadIdx.x < R) {
        const int q = threadIdx.x, r = row0 + q;
        float v = 0.f;
        for (int i = 0; i < T; i++) v += part[(threadIdx.y * R + q) * T + i];
        if (r < rows) y[r] = v;
    }
}

__device__ __forceinline__ void mma_u8s8(int (&c)[4], const u32 (&a)[4], int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Eight rows (tokens): a warp takes MT tiles of 16 weight rows over the whole K; one MMA a
// tile and unit, k = 32. The MMA's k order is the layout's: lane (g, t) holds k-words 2t
// and 2t + 1 of rows g and g + 8 (A) and of token g (B), so B's k-word i is the unit's
// activation word i. Q1_0R: A word 2t of row g = (w >> 2t) & 0x01010101 (bit 8j + 2t is
// weight 8t + j... of the unit, as its activation word 2t holds); sliced: w_{2t} &
// (0x01010101 << u). xq [token][K], xds [token][unit].
template <bool SLICED, int MT>
__global__ void __launch_bounds__(256) mv8(const u8* __restrict__ W, const __half* __restrict__ sc,
                                           const i8* __restrict__ xq, const float2* __restrict__ xds,
                                           float* __restrict__ y, int rows, int units) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tile0 = (blockIdx.x * (blockDim.x >> 5) + warp) * MT;
    const i64 row_bytes = (i64)units * 4;
    const int nb = units / 4;
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
    const u8* rp[MT][2];
    const __half* sp[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int r0 = min((tile0 + m) * 16 + g, rows - 1), r1 = min((tile0 + m) * 16 + g + 8, rows - 1);
        rp[m][0] = W + (i64)r0 * row_bytes;
        rp[m][1] = W + (i64)r1 * row_bytes;
        sp[m][0] = sc + (i64)r0 * nb;
        sp[m][1] = sc + (i64)r1 * nb;
    }
    for (int s = 0; s < units / 8; s++) {
        // The step's words of each row: the lane's words 2t, 2t + 1 (sliced: they hold
        // the 8 units), or the 8 unit words (Q1_0R, one a unit).
        uint4 wa[MT][2], wb[MT][2];
        uint2 wl[MT][2];
        float dw[MT][2][2];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (SLICED) {
                    wl[m][h] = *(const uint2*)(rp[m][h] + 32 * s + 8 * t);
                } else {
                    wa[m][h] = *(const uint4*)(rp[m][h] + 32 * s);
                    wb[m][h] = *(const uint4*)(rp[m][h] + 32 * s + 16);
                }
                const __half2 hd = *(const __half2*)(sp[m][h] + 2 * s);
                dw[m][h][0] = __low2float(hd);
                dw[m][h][1] = __high2float(hd);
            }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int un = 8 * s + u;
            // B: token g's activation words 2t, 2t + 1 of the unit.
            const int2 bx = *(const int2*)(xq + (i64)g * units * 32 + (i64)un * 32 + 8 * t);
            const float2 e0 = xds[(i64)(2 * t) * units + un], e1 = xds[(i64)(2 * t + 1) * units + un];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                u32 a[4];
                float sc2;
                if constexpr (SLICED) {
                    const u32 mk = 0x01010101u << u;
                    a[0] = wl[m][0].x & mk;
                    a[1] = wl[m][1].x & mk;
                    a[2] = wl[m][0].y & mk;
                    a[3] = wl[m][1].y & mk;
                    sc2 = 2.0f / (float)(1 << u);
                } else {
                    const u32 v0 = w8(wa[m][0], wb[m][0], u), v1 = w8(wa[m][1], wb[m][1], u);
                    a[0] = (v0 >> (2 * t)) & 0x01010101u;
                    a[1] = (v1 >> (2 * t)) & 0x01010101u;
                    a[2] = (v0 >> (2 * t + 1)) & 0x01010101u;
                    a[3] = (v1 >> (2 * t + 1)) & 0x01010101u;
                    sc2 = 2.0f;
                }
                int c[4] = {0, 0, 0, 0};
                mma_u8s8(c, a, bx.x, bx.y);
                const float d0 = dw[m][0][u >> 2], d1 = dw[m][1][u >> 2];
                acc[m][0] += d0 * (e0.x * sc2 * (float)c[0] - e0.y);
                acc[m][1] += d0 * (e1.x * sc2 * (float)c[1] - e1.y);
                acc[m][2] += d1 * (e0.x * sc2 * (float)c[2] - e0.y);
                acc[m][3] += d1 * (e1.x * sc2 * (float)c[3] - e1.y);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int row = (tile0 + m) * 16 + g + (k >> 1) * 8, tok = 2 * t + (k & 1);
            if (row < rows) y[(i64)tok * rows + row] = acc[m][k];
        }
}

struct Shape {
    const char* name;
    int rows, cols;
};

int main() {
    const Shape shapes[] = {{"gate+up", 34816, 5120},
                            {"qkv+z", 16384, 5120},
                            {"down", 5120, 17408},
                            {"ssm_out", 5120, 6144}};
    std::mt19937_64 rng(11);
    const int COPIES = 8, NT = 8;
    for (const Shape& sh : shapes) {
        const int rows = sh.rows, K = sh.cols, units = K / 32, nb = K / 128;
        // Bits: b[row][k] (weight +1 where set, −1 where clear), scales [row][block].
        std::vector<u32> bits((size_t)rows * units);  // natural: bit p of unit word = weight 32u + p
        for (auto& v : bits) v = (u32)rng();
        std::vector<uint16_t> scl((size_t)rows * nb);
        for (auto& v : scl) v = f2h_host(0.005f + 0.01f * (float)((rng() >> 40) & 0xffff) / 65536.f);
        // Q1_0R words: weight 4k + j of the unit at bit 8j + k.
        std::vector<u32> wr((size_t)rows * units), ws((size_t)rows * units);
        for (size_t i = 0; i < wr.size(); i++) {
            u32 o = 0;
            for (int k = 0; k < 8; k++)
                for (int j = 0; j < 4; j++)
                    if ((bits[i] >> (4 * k + j)) & 1) o |= 1u << (8 * j + k);
            wr[i] = o;
        }
        // Sliced: group of 8 units, word w: bit 8j + s = weight 4w + j of unit s.
        for (int r = 0; r < rows; r++)
            for (int gq = 0; gq < units / 8; gq++)
                for (int w = 0; w < 8; w++) {
                    u32 o = 0;
                    for (int s = 0; s < 8; s++)
                        for (int j = 0; j < 4; j++)
                            if ((bits[(size_t)r * units + 8 * gq + s] >> (4 * w + j)) & 1) o |= 1u << (8 * j + s);
                    ws[(size_t)r * units + 8 * gq + w] = o;
                }
        // Activations: NT tokens of q8_1 (codes, (d, d·Σq)).
        std::vector<i8> q((size_t)NT * K);
        for (auto& v : q) v = (i8)((int)(rng() % 255) - 127);
        std::vector<float2> ds((size_t)NT * units);
        for (int n = 0; n < NT; n++)
            for (int u = 0; u < units; u++) {
                const float d = 0.01f + 0.02f * (float)((rng() >> 40) & 0xffff) / 65536.f;
                int s = 0;
                for (int k = 0; k < 32; k++) s += q[(size_t)n * K + 32 * u + k];
                ds[(size_t)n * units + u] = make_float2(d, d * (float)s);
            }
        // The activation as the MMA's k order reads it (word i of the unit = weights of
        // activation word i: Q1_0R's k-word i is weights 4i..4i+3 — natural order — and
        // the sliced word w is weights 4w..4w+3: both natural, so one copy serves).
        std::vector<double> ref((size_t)NT * rows);
        for (int r = 0; r < rows; r++)
            for (int n = 0; n < NT; n++) {
                double a = 0;
                for (int u = 0; u < units; u++) {
                    long s = 0;
                    const u32 v = bits[(size_t)r * units + u];
                    for (int p = 0; p < 32; p++) {
                        const int x = q[(size_t)n * K + 32 * u + p];
                        s += ((v >> p) & 1) ? x : -x;
                    }
                    a += (double)h2f_host(scl[(size_t)r * nb + u / 4]) * (double)ds[(size_t)n * units + u].x * (double)s;
                }
                ref[(size_t)n * rows + r] = a;
            }
        const size_t wbytes = wr.size() * 4, sbytes = scl.size() * 2;
        u8 *dWr, *dWs, *dS;
        i8* dq;
        float2* dds;
        float* dy;
        CK(cudaMalloc(&dWr, wbytes * COPIES));
        CK(cudaMalloc(&dWs, wbytes * COPIES));
        CK(cudaMalloc(&dS, sbytes * COPIES));
        for (int c = 0; c < COPIES; c++) {
            CK(cudaMemcpy(dWr + wbytes * c, wr.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dWs + wbytes * c, ws.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dS + sbytes * c, scl.data(), sbytes, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&dq, q.size()));
        CK(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dds, ds.size() * 8));
        CK(cudaMemcpy(dds, ds.data(), ds.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dy, (size_t)NT * rows * 4));
        const double bytes = (double)(wbytes + sbytes);
        auto check = [&](int nt) { return rel_err(dy, ref, (size_t)nt * rows); };
        auto timeit = [&](auto launch) { return time_us(launch, COPIES); };
        printf("%s: %d x %d, %.1f MB\n", sh.name, rows, K, bytes / 1e6);
#define RUN1(SL, R, G)                                                                             \
    {                                                                                              \
        const int T = min(units / 8, 256 / G);                                                     \
        const int blocks = (rows + R * G - 1) / (R * G);                                           \
        u8* base = SL ? dWs : dWr;                                                                 \
        auto L = [&](int c) {                                                                      \
            mv1<SL, R><<<blocks, dim3(T, G)>>>(base + wbytes * c, (const __half*)(dS + sbytes * c), \
                                               dq, dds, dy, rows, units);                          \
        };                                                                                         \
        L(0);                                                                                      \
        CK(cudaDeviceSynchronize());                                                               \
        const double err = check(1);                                                               \
        const float us = timeit(L);                                                                \
        printf("  1 row  %-7s R=%d G=%d T=%3d blocks=%5d: %7.2f us %5.2f TB/s  err %.2e\n",       \
               SL ? "sliced" : "Q1_0R", R, G, T, blocks, us, bytes / us / 1e6, err);               \
    }
#define RUN8(SL, MT)                                                                               \
    {                                                                                              \
        const int tiles = (rows + 15) / 16, blocks = (tiles + 8 * MT - 1) / (8 * MT);              \
        u8* base = SL ? dWs : dWr;                                                                 \
        auto L = [&](int c) {                                                                      \
            mv8<SL, MT><<<blocks, 256>>>(base + wbytes * c, (const __half*)(dS + sbytes * c), dq,  \
                                         dds, dy, rows, units);                                    \
        };                                                                                         \
        L(0);                                                                                      \
        CK(cudaDeviceSynchronize());                                                               \
        const double err = check(NT);                                                              \
        const float us = timeit(L);                                                                \
        printf("  8 rows %-7s MT=%d blocks=%5d: %7.2f us %5.2f TB/s  err %.2e\n",                  \
               SL ? "sliced" : "Q1_0R", MT, blocks, us, bytes / us / 1e6, err);                    \
    }
        RUN1(false, 4, 2) RUN1(true, 4, 2) RUN1(false, 2, 4) RUN1(true, 2, 4) RUN1(false, 4, 1)
        RUN1(true, 4, 1)
        RUN8(false, 1) RUN8(true, 1) RUN8(false, 2) RUN8(true, 2) RUN8(false, 4) RUN8(true, 4)
        cudaFree(dWr);
        cudaFree(dWs);
        cudaFree(dS);
        cudaFree(dq);
        cudaFree(dds);
        cudaFree(dy);
    }
    return 0;
}
