// Prototype (session 35, docs/BENCHMARKS.md): the 8-row (verify) Q1_0 GEMV on the binary
// tensor cores with the activation rounded once per 128 values, against a host reference,
// with a plain read of the same bytes as the ceiling. The engine's verify GEMV (`mvrt_4` /
// `mvrmt_4`, int8 MMA on bits expanded to bytes: ~100 SASS instructions a 16-row tile ×
// 128 weights × 8 tokens) is timed beside it by `ROWS=8 cuda_gemv Q1_0` in the same call.
// Not built by cargo; on the GPU machine:
//     nvcc -O3 -arch=sm_90a -std=c++17 bench/cuda/bmma_verify_proto.cu -o /tmp/bv && /tmp/bv
// A token's int8 codes of a 128-value block go in as 8 bit planes (x = −128·b7 + Σ 2^j·b_j);
// one BMMA m16n8k128 (and.popc) takes 16 weight rows × one plane of the 8 tokens (B's 8
// columns), so a block is 8 BMMAs chained by Horner's rule in the accumulator (shift left
// one, then the next plane): S = Σ_{bit set} x, and a row's product is
// d_w · d_x · (2·S − Σx). ~60 instructions a tile × block × 8 tokens.
// Layouts (the repack an engine kernel would upload): weights word-interleaved in 4-block
// groups (group c of a row: 64 B, uint4 t holds word t of blocks 4c..4c+3; lane (g, t)
// of a BMMA holds word t of rows g and g + 8), f16 scales [row][block]; planes
// [block][lane = token·4 + word][plane] (two 16-byte loads a lane a block), d and Σq
// [block][token].
#include <random>
#include "proto_common.cuh"

__device__ __forceinline__ void bmma(int (&c)[4], u32 a0, u32 a1, u32 b) {
    asm("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, "
        "{%6}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ u32 w4(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
__device__ __forceinline__ float h_lo(u32 h) { return __half2float(__ushort_as_half((unsigned short)(h & 0xffff))); }
__device__ __forceinline__ float h_hi(u32 h) { return __half2float(__ushort_as_half((unsigned short)(h >> 16))); }

// Warp: MT tiles of 16 rows (tile group blockIdx·(warps/KS) + warp/KS), K split over KS
// warps. Lane (g, t): rows g and g + 8 of each tile, tokens 2t and 2t + 1. y: [8][rows].
template <int MT, int KS>
__global__ void __launch_bounds__(256) mvbr(const u8* __restrict__ W, const __half* __restrict__ sc,
                                            const uint4* __restrict__ planes,
                                            const float* __restrict__ xd, const int* __restrict__ xs,
                                            float* __restrict__ y, int rows, int nb) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int groups = blockDim.x / 32 / KS;
    const int tg = blockIdx.x * groups + warp / KS, ks = warp % KS;
    const i64 row_bytes = (i64)nb * 16;
    const u8* wr[MT][2];
    const __half* sr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int r0 = min((tg * MT + m) * 16 + g, rows - 1), r1 = min(r0 + 8, rows - 1);
        wr[m][0] = W + (i64)r0 * row_bytes + 16 * t;
        wr[m][1] = W + (i64)r1 * row_bytes + 16 * t;
        sr[m][0] = sc + (i64)r0 * nb;
        sr[m][1] = sc + (i64)r1 * nb;
    }
    const int ng = nb / 4, c0 = ks * ng / KS, c1 = (ks + 1) * ng / KS;
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
    for (int c = c0; c < c1; c++) {
        uint4 a[MT][2];
        uint2 s[MT][2];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            a[m][0] = ld_stream(wr[m][0] + 64 * c);
            a[m][1] = ld_stream(wr[m][1] + 64 * c);
            s[m][0] = *(const uint2*)(sr[m][0] + 4 * c);
            s[m][1] = *(const uint2*)(sr[m][1] + 4 * c);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int b = 4 * c + i;
            const uint4 p0 = planes[((i64)b * 32 + lane) * 2], p1 = planes[((i64)b * 32 + lane) * 2 + 1];
            const float2 dx = *(const float2*)(xd + b * 8 + 2 * t);
            const int2 sx = *(const int2*)(xs + b * 8 + 2 * t);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const u32 x0 = w4(a[m][0], i), x1 = w4(a[m][1], i);
                int cc[4] = {0, 0, 0, 0};
                bmma(cc, x0, x1, p1.w);  // plane 7: weight −128
#pragma unroll
                for (int k = 0; k < 4; k++) cc[k] = -cc[k];
#pragma unroll
                for (int p = 6; p >= 0; p--) {
#pragma unroll
                    for (int k = 0; k < 4; k++) cc[k] <<= 1;
                    bmma(cc, x0, x1, p < 4 ? w4(p0, p) : w4(p1, p - 4));
                }
                const u32 h0 = i < 2 ? s[m][0].x : s[m][0].y, h1 = i < 2 ? s[m][1].x : s[m][1].y;
                const float d0 = (i & 1) ? h_hi(h0) : h_lo(h0), d1 = (i & 1) ? h_hi(h1) : h_lo(h1);
                acc[m][0] += d0 * dx.x * (float)(2 * cc[0] - sx.x);
                acc[m][1] += d0 * dx.y * (float)(2 * cc[1] - sx.y);
                acc[m][2] += d1 * dx.x * (float)(2 * cc[2] - sx.x);
                acc[m][3] += d1 * dx.y * (float)(2 * cc[3] - sx.y);
            }
        }
    }
    auto put = [&](int m, int k, float v) {
        const int row = (tg * MT + m) * 16 + g + (k >> 1) * 8, tok = 2 * t + (k & 1);
        if (row < rows) y[(i64)tok * rows + row] = v;
    };
    if (KS == 1) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int k = 0; k < 4; k++) put(m, k, acc[m][k]);
    } else {
        // [group][ks][m·4 + k][lane]
        __shared__ float part[8 * MT * 4 * 32];
        const int grp = warp / KS;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int k = 0; k < 4; k++) part[((warp * MT + m) * 4 + k) * 32 + lane] = acc[m][k];
        __syncthreads();
        if (ks == 0) {
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float v = 0.f;
                    for (int q = 0; q < KS; q++) v += part[(((grp * KS + q) * MT + m) * 4 + k) * 32 + lane];
                    put(m, k, v);
                }
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
        for (int k = 0; k < U; k++) v[k] = ld_stream(p + i + k * stride);
#pragma unroll
        for (int k = 0; k < U; k++) x ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n; i += stride) {
        uint4 v = ld_stream(p + i);
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x12345678u) out[0] = x;
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
    std::mt19937_64 rng(7);
    const int COPIES = 8, NT = 8;
    for (const Shape& sh : shapes) {
        const int rows = sh.rows, K = sh.cols, nb = K / 128;
        // Weight bits (natural order: bit p of word w is weight 32w + p) and scales.
        std::vector<u32> bits((size_t)rows * nb * 4);
        for (auto& v : bits) v = (u32)rng();
        std::vector<uint16_t> scl((size_t)rows * nb);
        for (auto& v : scl) v = f2h_host(0.005f + 0.01f * (float)((rng() >> 40) & 0xffff) / 65536.f);
        std::vector<u8> w((size_t)rows * nb * 16);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < nb / 4; c++)
                for (int t = 0; t < 4; t++)
                    for (int i = 0; i < 4; i++)
                        memcpy(&w[(size_t)r * nb * 16 + 64 * c + 16 * t + 4 * i],
                               &bits[((size_t)r * nb + 4 * c + i) * 4 + t], 4);
        // Tokens' codes, per-128 scales and sums; planes [block][token·4 + word][plane].
        std::vector<int> q((size_t)NT * K);
        for (auto& v : q) v = (int)(rng() % 255) - 127;
        std::vector<float> xd((size_t)nb * 8);
        std::vector<int> xs((size_t)nb * 8);
        std::vector<u32> pl((size_t)nb * 32 * 8);
        for (int b = 0; b < nb; b++)
            for (int n = 0; n < NT; n++) {
                xd[b * 8 + n] = 0.01f + 0.02f * (float)((rng() >> 40) & 0xffff) / 65536.f;
                int s = 0;
                for (int k = 0; k < 128; k++) s += q[(size_t)n * K + 128 * b + k];
                xs[b * 8 + n] = s;
                for (int word = 0; word < 4; word++)
                    for (int j = 0; j < 8; j++) {
                        u32 nat = 0;
                        for (int p = 0; p < 32; p++)
                            if (((u32)(q[(size_t)n * K + 128 * b + 32 * word + p] & 0xff) >> j) & 1) nat |= 1u << p;
                        pl[((size_t)b * 32 + n * 4 + word) * 8 + j] = nat;
                    }
            }
        // Reference [token][row].
        std::vector<double> ref((size_t)NT * rows);
        for (int r = 0; r < rows; r++)
            for (int n = 0; n < NT; n++) {
                double a = 0;
                for (int b = 0; b < nb; b++) {
                    long s = 0;
                    for (int wd = 0; wd < 4; wd++) {
                        const u32 v = bits[((size_t)r * nb + b) * 4 + wd];
                        for (int p = 0; p < 32; p++) {
                            const int x = q[(size_t)n * K + 128 * b + 32 * wd + p];
                            s += ((v >> p) & 1) ? x : -x;
                        }
                    }
                    a += (double)h2f_host(scl[(size_t)r * nb + b]) * (double)xd[b * 8 + n] * (double)s;
                }
                ref[(size_t)n * rows + r] = a;
            }
        u8* dW;
        __half* dS;
        uint4* dP;
        float *dXd, *dy;
        int* dXs;
        const size_t wb = w.size(), sb = scl.size() * 2;
        CK(cudaMalloc(&dW, wb * COPIES));
        CK(cudaMalloc(&dS, sb * COPIES));
        for (int c = 0; c < COPIES; c++) {
            CK(cudaMemcpy(dW + wb * c, w.data(), wb, cudaMemcpyHostToDevice));
            CK(cudaMemcpy((u8*)dS + sb * c, scl.data(), sb, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&dP, pl.size() * 4));
        CK(cudaMemcpy(dP, pl.data(), pl.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dXd, xd.size() * 4));
        CK(cudaMemcpy(dXd, xd.data(), xd.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dXs, xs.size() * 4));
        CK(cudaMemcpy(dXs, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dy, (size_t)NT * rows * 4));
        const double bytes = (double)(wb + sb);
        auto check = [&]() { return rel_err(dy, ref, ref.size()); };
        auto timeit = [&](auto launch) { return time_us(launch, COPIES); };
        printf("%s: %d x %d, 8 tokens, %.1f MB (weights + scales)\n", sh.name, rows, K, bytes / 1e6);
#define RUN(MT, KS, WARPS)                                                                          \
    {                                                                                               \
        const int groups = WARPS / KS, tiles = (rows + 15) / 16;                                    \
        const int blocks = (tiles + MT * groups - 1) / (MT * groups);                               \
        auto L = [&](int c) {                                                                       \
            mvbr<MT, KS><<<blocks, WARPS * 32>>>(dW + wb * c, (const __half*)((u8*)dS + sb * c), dP, \
                                                 dXd, dXs, dy, rows, nb);                           \
        };                                                                                          \
        CK(cudaMemset(dy, 0, ref.size() * 4));                                                       \
        L(0);                                                                                       \
        CK(cudaDeviceSynchronize());                                                                \
        const double err = check();                                                                 \
        const float us = timeit(L);                                                                 \
        printf("  mvbr MT=%d KS=%d warps=%d blocks=%5d: %7.2f us %5.2f TB/s  err %.2e\n", MT, KS,  \
               WARPS, blocks, us, bytes / us / 1e6, err);                                           \
    }
        RUN(1, 1, 8) RUN(2, 1, 8) RUN(4, 1, 8) RUN(1, 2, 8) RUN(2, 2, 8) RUN(4, 2, 8) RUN(2, 4, 8)
        RUN(4, 4, 8) RUN(1, 1, 4) RUN(2, 1, 4)
        {
            int dev, nsm;
            cudaGetDevice(&dev);
            cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
            u32* dz;
            CK(cudaMalloc(&dz, 4));
            const i64 n16 = (i64)(wb / 16);
            for (int mult : {4, 8}) {
                auto L8 = [&](int c) { readk<8><<<nsm * mult, 256>>>((const uint4*)(dW + wb * c), n16, dz); };
                const float u = timeit(L8);
                printf("  read blocks=%d x256, U=8: %7.2f us %5.2f TB/s\n", nsm * mult, u, (double)wb / u / 1e6);
            }
            cudaFree(dz);
        }
        cudaFree(dW);
        cudaFree(dS);
        cudaFree(dP);
        cudaFree(dXd);
        cudaFree(dXs);
        cudaFree(dy);
    }
    return 0;
}
