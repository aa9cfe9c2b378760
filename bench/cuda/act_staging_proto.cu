// Prototype (session 32, docs/BENCHMARKS.md): how long a persistent kernel's block takes to
// stage an R-row activation into shared memory — the question a multi-row decode chain
// (the 8-row verify) turns on. Not built by cargo; standalone nvcc, as
// persistent_chain_proto.cu:
//     nvcc -O3 -std=c++17 -arch=sm_90a bench/cuda/act_staging_proto.cu -o /tmp/stage_act
//     /tmp/stage_act
// Two ways, each by all 132 blocks at once (one an SM, 256 threads), repeated 200 times in
// one launch (a barrier between rounds; the rows stay in L2):
//   f32:  the block reads R rows × span f32 values through L2 and quantizes them (q8_1 per 32
//         values, the chain's cn_prep arithmetic) into shared memory — what the one-row chain
//         does per GEMV instruction;
//   q8_1: the rows were quantized once (elsewhere) into global memory; thread 0 bulk-copies
//         R × span code bytes and R × span/32 (d, d·Σq) pairs into shared memory.
// Printed: µs a round, and the L2 bytes a round across the grid. The one-row chain's prep
// is the f32 row at R = 1 (span 5,120: 20 KB a block).
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
typedef uint8_t u8;
typedef uint32_t u32;
typedef uint64_t u64;
#define CK(x)                                                                            \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            printf("CUDA %s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));       \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

constexpr int NT = 256, ROUNDS = 200, MAXR = 8, MAXSPAN = 17408;

__device__ __forceinline__ u32 smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// f32 rows [R][K] → smem codes [R][span] and (d, d·Σq) [R][span/32]; block b reads span
// values from offset (b · 977) mod (K − span), so blocks read different parts of the rows.
__global__ void __launch_bounds__(NT, 1) stage_f32(const float* __restrict__ x, int K, int R, int span, u32* sink) {
    extern __shared__ __align__(128) u8 sm[];
    u8* codes = sm;
    float2* ds = (float2*)(sm + MAXR * MAXSPAN);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int off = K > span ? (blockIdx.x * 977 * 4) % (K - span) / 128 * 128 : 0;
    const int nkb = span / 128;
    for (int round = 0; round < ROUNDS; round++) {
        // Work items (row, 128-value block), 6 at a time a warp with every load out first.
        constexpr int PB = 6;
        for (int p0 = warp; p0 < R * nkb; p0 += 8 * PB) {
            float4 v[PB];
#pragma unroll
            for (int p = 0; p < PB; p++) {
                const int it = min(p0 + p * 8, R * nkb - 1), r = it / nkb, kb = it % nkb;
                v[p] = __ldcg((const float4*)(x + (size_t)r * K + off + kb * 128) + lane);
            }
#pragma unroll
            for (int p = 0; p < PB; p++) {
                const int it = p0 + p * 8;
                if (it >= R * nkb) break;
                const int r = it / nkb, kb = it % nkb;
                float m = fmaxf(fmaxf(fabsf(v[p].x), fabsf(v[p].y)), fmaxf(fabsf(v[p].z), fabsf(v[p].w)));
#pragma unroll
                for (int o = 4; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                const float d = m / 127.f;
                const float f[4] = {v[p].x, v[p].y, v[p].z, v[p].w};
                int s = 0;
                u32 w = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int q = m == 0.f ? 0 : (int)rintf(f[i] / d);
                    s += q;
                    w |= (u32)(q & 0xff) << (8 * i);
                }
#pragma unroll
                for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                ((u32*)(codes + r * span + kb * 128))[lane] = w;
                if ((lane & 7) == 0) ds[r * (span / 32) + kb * 4 + lane / 8] = make_float2(d, d * (float)s);
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && codes[5] == 0xAB && blockIdx.x == 999) sink[0] = codes[7];
}

// q8_1 rows in global memory: codes [R][K], pairs [R][K/32] → smem by bulk copies.
__global__ void __launch_bounds__(NT, 1) stage_q8(const u8* __restrict__ xq, const float2* __restrict__ xds, int K,
                                                  int R, int span, u32* sink) {
    extern __shared__ __align__(128) u8 sm[];
    u8* codes = sm;
    u8* ds = sm + MAXR * MAXSPAN;
    __shared__ __align__(8) u64 bar;
    const int off = K > span ? (blockIdx.x * 977 * 4) % (K - span) / 128 * 128 : 0;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(&bar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    for (int round = 0; round < ROUNDS; round++) {
        if (threadIdx.x == 0) {
            const u32 bytes = R * span + R * (span / 32) * 8;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(&bar)), "r"(bytes) : "memory");
            for (int r = 0; r < R; r++) {
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             ::"r"(smem(codes + r * span)), "l"(xq + (size_t)r * K + off), "r"(span), "r"(smem(&bar))
                             : "memory");
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             ::"r"(smem(ds + r * (span / 32) * 8)), "l"(xds + (size_t)r * (K / 32) + off / 32),
                             "r"(span / 32 * 8), "r"(smem(&bar))
                             : "memory");
            }
        }
        u32 done = 0;
        do {
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done) : "r"(smem(&bar)), "r"(round & 1) : "memory");
        } while (!done);
        __syncthreads();
    }
    if (threadIdx.x == 0 && codes[5] == 0xAB && blockIdx.x == 999) sink[0] = codes[7];
}

int main() {
    int dev = 0, nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    const int K = MAXSPAN;
    float* x;
    u8* xq;
    float2* xds;
    u32* sink;
    CK(cudaMalloc(&x, (size_t)MAXR * K * 4));
    CK(cudaMalloc(&xq, (size_t)MAXR * K));
    CK(cudaMalloc(&xds, (size_t)MAXR * K / 32 * 8));
    CK(cudaMalloc(&sink, 4));
    float* h = (float*)malloc((size_t)MAXR * K * 4);
    for (size_t i = 0; i < (size_t)MAXR * K; i++) h[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
    CK(cudaMemcpy(x, h, (size_t)MAXR * K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(xq, 1, (size_t)MAXR * K));
    CK(cudaMemset(xds, 0, (size_t)MAXR * K / 32 * 8));
    const int smem_bytes = MAXR * MAXSPAN + MAXR * MAXSPAN / 32 * 8;  // 174 KB
    CK(cudaFuncSetAttribute(stage_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    CK(cudaFuncSetAttribute(stage_q8, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    printf("%d blocks of %d threads, %d rounds a launch; µs a round (L2 MB a round over the grid)\n", nsm, NT,
           ROUNDS);
    printf("%4s %6s %22s %22s\n", "R", "span", "f32 + quantize", "q8_1 bulk copy");
    const int spans[] = {2048, 5120, 6144, 8704, 17408};
    const int rs[] = {1, 2, 4, 8};
    for (int r : rs)
        for (int span : spans) {
            if (r * span * 10 / 8 > smem_bytes) continue;
            float t[2];
            for (int kind = 0; kind < 2; kind++) {
                for (int rep = 0; rep < 2; rep++) {  // the first launch warms L2
                    CK(cudaEventRecord(a));
                    if (kind == 0) stage_f32<<<nsm, NT, smem_bytes>>>(x, K, r, span, sink);
                    else stage_q8<<<nsm, NT, smem_bytes>>>(xq, xds, K, r, span, sink);
                    CK(cudaEventRecord(b));
                    CK(cudaEventSynchronize(b));
                    CK(cudaGetLastError());
                    float ms;
                    CK(cudaEventElapsedTime(&ms, a, b));
                    t[kind] = ms * 1000.f / ROUNDS;
                }
            }
            const double f32_mb = (double)nsm * r * span * 4 / 1e6, q8_mb = (double)nsm * r * span * 1.25 / 1e6;
            printf("%4d %6d %12.2f (%6.1f) %12.2f (%6.1f)\n", r, span, t[0], f32_mb, t[1], q8_mb);
        }
    return 0;
}
