// Prototype (session 22, docs/BENCHMARKS.md): the one-row Q1_0 GEMV on the binary tensor
// cores (mma.m16n8k128 .b1 and.popc, native BMMA on sm_90) against a host reference, with
// a plain read of the same bytes as the ceiling. Not built by cargo; on the GPU machine:
//     nvcc -O3 -arch=sm_90 bench/cuda/bmma_gemv_proto.cu -o /tmp/bmma && /tmp/bmma
// The activation's int8 codes go in as bit planes (x = −128·b7 + Σ 2^j·b_j), so a weight
// row's Σ_{bit set} x is Σ_j 2^j·popc(w & plane_j):
//   mvb32:  q8_1 as the GEMV takes it now (a scale a 32-value unit), the Q1_0R layout of
//           cuda/repack.rs. The four units of a BMMA's k = 128 need their own scales, so B's
//           8 columns are (unit, plane parity), 4 BMMAs a unit word with the planes
//           combined by shifting the accumulator (Horner).
//   mvb128: a scale a 128-value block (the codes the GEMV would need the producers to
//           make), weights word-interleaved in 4-block groups: one BMMA a block, B's 8
//           columns the 8 planes.
// KS warps of a block split K; D groups of 4 blocks in flight a lane.
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <random>
#include <cstring>
typedef uint8_t u8;
typedef uint32_t u32;
typedef int8_t i8;
typedef long long i64;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ void bmma(int (&c)[4], u32 a0, u32 a1, u32 b) {
    asm volatile("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3]) : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ uint4 ldg4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 w4(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// Q1_0R layout: row = groups of 8 blocks: 16 B of f16 scales, then 8 bodies of 16 B.
__device__ __forceinline__ const u8* rp_body(const u8* row, int b) { return row + (i64)(b >> 3) * 144 + 16 + 16 * (b & 7); }
__device__ __forceinline__ float rp_scale(const u8* row, int b) {
    return __half2float(*(const __half*)(row + (i64)(b >> 3) * 144 + 2 * (b & 7)));
}

// Per-32 activation scales. planes [unit][par*4 + p] = plane 2p+par of the unit's codes,
// bit 8j+k = code 4k+j. Warp: 16 rows; lane (g,t) takes block 4c+t of rows g, g+8.
// KS warps of a block split K (groups of 4 blocks), TW tiles a block.
template <int KS, int D>
__global__ void __launch_bounds__(256) mvb32(const u8* __restrict__ W, const u32* __restrict__ planes,
                                             const float2* __restrict__ xds, float* __restrict__ y,
                                             int rows, int nb, i64 row_bytes) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tw = blockDim.x / 32 / KS;
    const int tile = blockIdx.x * tw + warp / KS, ks = warp % KS;
    const int r0 = tile * 16 + g, r1 = r0 + 8;
    const u8* w0 = W + (i64)min(r0, rows - 1) * row_bytes;
    const u8* w1 = W + (i64)min(r1, rows - 1) * row_bytes;
    const bool active = (g >> 1) == t;
    const int par = g & 1;
    const int ng = nb / 4;
    const int c0 = ks * ng / KS, c1 = (ks + 1) * ng / KS;
    float acc0 = 0.f, acc1 = 0.f;
    uint4 ra0[D], ra1[D];
    float rd0[D], rd1[D];
#pragma unroll
    for (int d = 0; d < D; d++) {
        const int b = 4 * min(c0 + d, c1 - 1) + t;
        ra0[d] = ldg4(rp_body(w0, b)); ra1[d] = ldg4(rp_body(w1, b));
        rd0[d] = rp_scale(w0, b); rd1[d] = rp_scale(w1, b);
    }
    for (int cb = c0; cb < c1; cb += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int c = cb + d;
            if (c < c1) {
                const uint4 a0 = ra0[d], a1 = ra1[d];
                const float d0 = rd0[d], d1 = rd1[d];
                const int b = 4 * c + t;
                if (c + D < c1) {
                    ra0[d] = ldg4(rp_body(w0, b + 4 * D)); ra1[d] = ldg4(rp_body(w1, b + 4 * D));
                    rd0[d] = rp_scale(w0, b + 4 * D); rd1[d] = rp_scale(w1, b + 4 * D);
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int u = 4 * b + i;
                    uint4 bq = make_uint4(0, 0, 0, 0);
                    if (active) bq = *(const uint4*)(planes + (i64)u * 8 + par * 4);
                    const float2 ds = xds[u];
                    int cc[4] = {0, 0, 0, 0};
                    bmma(cc, w4(a0, i), w4(a1, i), bq.w);
                    cc[1] = -cc[1]; cc[3] = -cc[3];
#pragma unroll
                    for (int p = 2; p >= 0; p--) {
#pragma unroll
                        for (int k = 0; k < 4; k++) cc[k] <<= 2;
                        bmma(cc, w4(a0, i), w4(a1, i), w4(bq, p));
                    }
                    const int v0 = cc[0] + 2 * cc[1], v1 = cc[2] + 2 * cc[3];
                    acc0 += d0 * (ds.x * (float)(2 * v0) - ds.y);
                    acc1 += d1 * (ds.x * (float)(2 * v1) - ds.y);
                }
            }
        }
    }
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
    if (KS == 1) {
        if (t == 0) {
            if (r0 < rows) y[r0] = acc0;
            if (r1 < rows) y[r1] = acc1;
        }
    } else {
        __shared__ float part[8][16][KS];
        const int lt = warp / KS;
        if (t == 0) { part[lt][g][ks] = acc0; part[lt][g + 8][ks] = acc1; }
        __syncthreads();
        if (ks == 0 && lane < 16) {
            float s = 0.f;
            for (int k = 0; k < KS; k++) s += part[lt][lane][k];
            const int r = tile * 16 + lane;
            if (r < rows) y[r] = s;
        }
    }
}

// Per-128 activation scales (the ceiling): weights in a word-interleaved layout of 4-block
// groups: group c of a row = 64 B body: uint4 for word t holds word t of blocks 4c..4c+3,
// then scales elsewhere: sc[row][b] f16. planes128 [block][plane g'][slot t] u32; xb128
// [block] = (d, −Σq).
template <int KS, int D>
__global__ void __launch_bounds__(256) mvb128(const u8* __restrict__ W, const __half* __restrict__ sc,
                                              const u32* __restrict__ planes, const float2* __restrict__ xd,
                                              float* __restrict__ y, int rows, int nb) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tw = blockDim.x / 32 / KS;
    const int tile = blockIdx.x * tw + warp / KS, ks = warp % KS;
    const int r0 = tile * 16 + g, r1 = r0 + 8;
    const i64 row_bytes = (i64)nb * 16;
    const u8* w0 = W + (i64)min(r0, rows - 1) * row_bytes + 16 * t;
    const u8* w1 = W + (i64)min(r1, rows - 1) * row_bytes + 16 * t;
    const __half* s0 = sc + (i64)min(r0, rows - 1) * nb;
    const __half* s1 = sc + (i64)min(r1, rows - 1) * nb;
    // plane weights: column 2t and 2t+1 (×2: Σ±x = 2Σ_set x − Σx)
    const int wa = (2 * t == 7) ? -256 : (2 << (2 * t));
    const int wb = (2 * t + 1 == 7) ? -256 : (2 << (2 * t + 1));
    const int ng = nb / 4;
    const int c0 = ks * ng / KS, c1 = (ks + 1) * ng / KS;
    float acc0 = 0.f, acc1 = 0.f;
    uint4 ra0[D], ra1[D];
    uint2 rs0[D], rs1[D];
#pragma unroll
    for (int d = 0; d < D; d++) {
        const int c = min(c0 + d, c1 - 1);
        ra0[d] = ldg4(w0 + 64 * c); ra1[d] = ldg4(w1 + 64 * c);
        rs0[d] = *(const uint2*)(s0 + 4 * c); rs1[d] = *(const uint2*)(s1 + 4 * c);
    }
    for (int cb = c0; cb < c1; cb += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int c = cb + d;
            if (c < c1) {
                const uint4 a0 = ra0[d], a1 = ra1[d];
                const uint2 sa = rs0[d], sb = rs1[d];
                if (c + D < c1) {
                    ra0[d] = ldg4(w0 + 64 * (c + D)); ra1[d] = ldg4(w1 + 64 * (c + D));
                    rs0[d] = *(const uint2*)(s0 + 4 * (c + D)); rs1[d] = *(const uint2*)(s1 + 4 * (c + D));
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int b = 4 * c + i;
                    const u32 bw = planes[(i64)b * 32 + lane];
                    const float2 xs = xd[b];
                    int cc[4] = {0, 0, 0, 0};
                    bmma(cc, w4(a0, i), w4(a1, i), bw);
                    const int sq = t == 0 ? __float_as_int(xs.y) : 0;
                    const int v0 = cc[0] * wa + cc[1] * wb + sq, v1 = cc[2] * wa + cc[3] * wb + sq;
                    const u32 hs0 = i < 2 ? sa.x : sa.y, hs1 = i < 2 ? sb.x : sb.y;
                    const float dw0 = __half2float(__ushort_as_half((unsigned short)((i & 1) ? hs0 >> 16 : hs0 & 0xffff)));
                    const float dw1 = __half2float(__ushort_as_half((unsigned short)((i & 1) ? hs1 >> 16 : hs1 & 0xffff)));
                    acc0 += dw0 * xs.x * (float)v0;
                    acc1 += dw1 * xs.x * (float)v1;
                }
            }
        }
    }
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
    if (KS == 1) {
        if (t == 0) {
            if (r0 < rows) y[r0] = acc0;
            if (r1 < rows) y[r1] = acc1;
        }
    } else {
        __shared__ float part[8][16][KS];
        const int lt = warp / KS;
        if (t == 0) { part[lt][g][ks] = acc0; part[lt][g + 8][ks] = acc1; }
        __syncthreads();
        if (ks == 0 && lane < 16) {
            float s = 0.f;
            for (int k = 0; k < KS; k++) s += part[lt][lane][k];
            const int r = tile * 16 + lane;
            if (r < rows) y[r] = s;
        }
    }
}

// Pure read of n uint4 (the ceiling): U loads in flight a thread.
template <int U>
__global__ void __launch_bounds__(256) readk(const uint4* __restrict__ p, i64 n, u32* out) {
    u32 x = 0;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) v[k] = ldg4(p + i + k * stride);
#pragma unroll
        for (int k = 0; k < U; k++) x ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n; i += stride) { uint4 v = ldg4(p + i); x ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (x == 0x12345678u) out[0] = x;
}

static float h2f_host(uint16_t h) { __half x; memcpy(&x, &h, 2); return __half2float(x); }
static uint16_t f2h_host(float f) { __half x = __float2half(f); uint16_t h; memcpy(&h, &x, 2); return h; }

struct Shape { const char* name; int rows, cols; };

int main(int argc, char** argv) {
    const Shape shapes[] = {{"gate+up", 34816, 5120}, {"qkv+z", 16384, 5120}, {"down", 5120, 17408}, {"ssm_out", 5120, 6144}};
    std::mt19937_64 rng(7);
    const int COPIES = 8;
    for (const Shape& sh : shapes) {
        const int rows = sh.rows, K = sh.cols, nb = K / 128, units = K / 32;
        const i64 row_bytes = (i64)nb / 8 * 144;
        // weights: bits per (row, block, word) in "natural" order bit p <-> weight 32w + p.
        std::vector<u32> bits((size_t)rows * nb * 4);
        for (auto& v : bits) v = (u32)rng();
        std::vector<uint16_t> scl((size_t)rows * nb);
        for (auto& v : scl) v = f2h_host(0.005f + 0.01f * (float)((rng() >> 40) & 0xffff) / 65536.f);
        // activation codes and per-32 scales
        std::vector<int> q(K);
        for (auto& v : q) v = (int)(rng() % 255) - 127;
        std::vector<float2> ds(units);
        for (int u = 0; u < units; u++) {
            float d = 0.01f + 0.02f * (float)((rng() >> 40) & 0xffff) / 65536.f;
            int s = 0; for (int k = 0; k < 32; k++) s += q[32 * u + k];
            ds[u] = make_float2(d, d * (float)s);
        }
        // permuted word (Q1_0R: weight 4k+j at bit 8j+k)
        auto perm = [](u32 w) { u32 o = 0; for (int j = 0; j < 4; j++) for (int k = 0; k < 8; k++) if ((w >> (4 * k + j)) & 1) o |= 1u << (8 * j + k); return o; };
        std::vector<u8> wr((size_t)rows * row_bytes);
        for (int r = 0; r < rows; r++) for (int b = 0; b < nb; b++) {
            u8* row = wr.data() + (size_t)r * row_bytes;
            memcpy(row + (b >> 3) * 144 + 2 * (b & 7), &scl[(size_t)r * nb + b], 2);
            for (int w = 0; w < 4; w++) { u32 v = perm(bits[((size_t)r * nb + b) * 4 + w]); memcpy(row + (b >> 3) * 144 + 16 + 16 * (b & 7) + 4 * w, &v, 4); }
        }
        std::vector<u32> pl((size_t)units * 8);
        for (int u = 0; u < units; u++) for (int j = 0; j < 8; j++) {
            u32 nat = 0; for (int p = 0; p < 32; p++) if (((u32)(q[32 * u + p] & 0xff) >> j) & 1) nat |= 1u << p;
            pl[(size_t)u * 8 + (j & 1) * 4 + (j >> 1)] = perm(nat);
        }
        // per-128 variant: codes requantized per block (just use the same codes, scale = unit 0's d)
        std::vector<u8> w128((size_t)rows * nb * 16);
        for (int r = 0; r < rows; r++) for (int c = 0; c < nb / 4; c++) for (int t = 0; t < 4; t++) for (int i = 0; i < 4; i++) {
            u32 v = bits[((size_t)r * nb + 4 * c + i) * 4 + t];
            memcpy(&w128[(size_t)r * nb * 16 + 64 * c + 16 * t + 4 * i], &v, 4);
        }
        std::vector<u32> pl128((size_t)nb * 32);
        std::vector<float2> xd128(nb);
        for (int b = 0; b < nb; b++) {
            int s = 0; for (int k = 0; k < 128; k++) s += q[128 * b + k];
            { int ns = -s; float f; memcpy(&f, &ns, 4); xd128[b] = make_float2(ds[4 * b].x, f); }
            for (int j = 0; j < 8; j++) for (int t = 0; t < 4; t++) {
                u32 nat = 0; for (int p = 0; p < 32; p++) if (((u32)(q[128 * b + 32 * t + p] & 0xff) >> j) & 1) nat |= 1u << p;
                pl128[(size_t)b * 32 + j * 4 + t] = nat;
            }
        }
        // references
        std::vector<double> ref32(rows), ref128(rows);
        for (int r = 0; r < rows; r++) {
            double a = 0, a2 = 0;
            for (int b = 0; b < nb; b++) {
                double dw = h2f_host(scl[(size_t)r * nb + b]); double sb = 0;
                for (int w = 0; w < 4; w++) {
                    const u32 v = bits[((size_t)r * nb + b) * 4 + w]; const int u = 4 * b + w;
                    long s = 0; for (int p = 0; p < 32; p++) s += ((v >> p) & 1) ? q[32 * u + p] : -q[32 * u + p];
                    a += dw * (double)ds[u].x * (double)s; sb += (double)s;
                }
                a2 += dw * (double)ds[4 * b].x * sb;
            }
            ref32[r] = a; ref128[r] = a2;
        }
        // device buffers: COPIES of the weights to defeat L2
        u8 *dW, *dW128; __half* dS; u32 *dP, *dP128; float2 *dX, *dX128; float* dy;
        const size_t wbytes = wr.size(), w128bytes = w128.size();
        CK(cudaMalloc(&dW, wbytes * COPIES)); CK(cudaMalloc(&dW128, w128bytes * COPIES)); CK(cudaMalloc(&dS, scl.size() * 2 * COPIES));
        for (int c = 0; c < COPIES; c++) {
            CK(cudaMemcpy(dW + wbytes * c, wr.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dW128 + w128bytes * c, w128.data(), w128bytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dS + scl.size() * c, scl.data(), scl.size() * 2, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&dP, pl.size() * 4)); CK(cudaMemcpy(dP, pl.data(), pl.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dP128, pl128.size() * 4)); CK(cudaMemcpy(dP128, pl128.data(), pl128.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dX, ds.size() * 8)); CK(cudaMemcpy(dX, ds.data(), ds.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dX128, xd128.size() * 8)); CK(cudaMemcpy(dX128, xd128.data(), xd128.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dy, rows * 4));
        std::vector<float> hy(rows);
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        const double bytes = (double)wbytes;
        auto check = [&](const std::vector<double>& ref) {
            CK(cudaMemcpy(hy.data(), dy, rows * 4, cudaMemcpyDeviceToHost));
            double md = 0, mr = 0; for (int r = 0; r < rows; r++) { md = fmax(md, fabs(hy[r] - ref[r])); mr = fmax(mr, fabs(ref[r])); }
            return md / mr;
        };
        auto timeit = [&](auto launch) {
            for (int i = 0; i < 3; i++) launch(i % COPIES);
            CK(cudaDeviceSynchronize());
            const int N = 200;
            cudaEventRecord(e0);
            for (int i = 0; i < N; i++) launch(i % COPIES);
            cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1);
            return ms * 1000.f / N;
        };
        printf("%s: %d x %d, %.1f MB\n", sh.name, rows, K, bytes / 1e6);
#define RUN32(KS, WARPS, DD) { \
            const int tw = WARPS / KS; const int blocks = (rows / 16 + tw - 1) / tw; \
            auto L = [&](int c) { mvb32<KS, DD><<<blocks, WARPS * 32>>>(dW + wbytes * c, dP, dX, dy, rows, nb, row_bytes); }; \
            L(0); CK(cudaDeviceSynchronize()); double err = check(ref32); float us = timeit(L); \
            printf("  mvb32  KS=%d D=%d warps=%d blocks=%d: %7.2f us %5.2f TB/s  err %.2e\n", KS, DD, WARPS, blocks, us, bytes / us / 1e6, err); }
#define RUN128(KS, WARPS, DD) { \
            const int tw = WARPS / KS; const int blocks = (rows / 16 + tw - 1) / tw; \
            auto L = [&](int c) { mvb128<KS, DD><<<blocks, WARPS * 32>>>(dW128 + w128bytes * c, dS + scl.size() * c, dP128, dX128, dy, rows, nb); }; \
            L(0); CK(cudaDeviceSynchronize()); double err = check(ref128); float us = timeit(L); \
            printf("  mvb128 KS=%d D=%d warps=%d blocks=%d: %7.2f us %5.2f TB/s  err %.2e\n", KS, DD, WARPS, blocks, us, bytes / us / 1e6, err); }
        RUN32(1, 4, 1) RUN32(2, 8, 1) RUN32(4, 8, 1) RUN32(8, 8, 1) RUN32(4, 8, 2) RUN32(8, 8, 2)
        RUN128(1, 4, 1) RUN128(2, 8, 1) RUN128(4, 8, 1) RUN128(8, 8, 1) RUN128(1, 4, 2) RUN128(4, 8, 2) RUN128(2, 8, 4)
        {
            int dev; cudaGetDevice(&dev); int nsm; cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
            u32* dz; CK(cudaMalloc(&dz, 4));
            const i64 n16 = (i64)(wbytes / 16);
            for (int mult : {2, 4, 8, 16}) {
                auto L4 = [&](int c) { readk<4><<<nsm * mult, 256>>>((const uint4*)(dW + wbytes * c), n16, dz); };
                auto L8 = [&](int c) { readk<8><<<nsm * mult, 256>>>((const uint4*)(dW + wbytes * c), n16, dz); };
                float u4 = timeit(L4), u8v = timeit(L8);
                printf("  read   blocks=%d x256: U=4 %7.2f us %5.2f TB/s   U=8 %7.2f us %5.2f TB/s\n", nsm * mult, u4, bytes / u4 / 1e6, u8v, bytes / u8v / 1e6);
            }
            cudaFree(dz);
        }
        cudaFree(dW); cudaFree(dW128); cudaFree(dS); cudaFree(dP); cudaFree(dP128); cudaFree(dX); cudaFree(dX128); cudaFree(dy);
    }
    return 0;
}
