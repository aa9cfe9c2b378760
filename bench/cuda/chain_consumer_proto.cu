// How fast is the decode chain's Q1_0 consumer loop on its own? Session 33's profile had a
// chain GEMV's consumer warps issuing ~1 instruction per 7.5–13 clocks once all their data
// had arrived; this times `cn_q1i` (chain.cu, included as it is) with nothing else in the
// block: a slot of 16 rows × NG groups in the producer's box layout and the activation
// quantized by `cn_prep`, each warp multiplying the same slot REPS times. Variants:
//   plain   cn_q1i as the chain calls it, a call a chunk
//   fence   + the chain's per-chunk slot release (fence.proxy.async, __syncwarp)
//   pair    two groups an iteration (a copy of cn_q1i whose loop body does j and j + 1)
//   no-mma  cn_q1i's loop with each IMMA replaced by adds (timing only)
//   mma     cn_q1i's MMAs alone, operands from the loop's indices (timing only)
//   p128    cn_q1p (chain.cu's CN_Q1_P128): binary MMA with ONE activation scale a 128-value
//           block (not the engine's q8_1: a scale a 32-value unit), so one BMMA m16n8k128
//           takes 16 rows × a whole block, B's 8 columns the codes' 8 bit planes (session
//           22's mvb128, in the chain's slot): ~150 SASS instructions a group against
//           cn_q1i's ~440. Its activation is made here on the host (cn_prep makes it only
//           where chain.cu is compiled with CN_Q1_P128). Also prints both roundings' error
//           against the f32 dot.
// at 4, 8 and 16 warps a block (16: ≤ 128 registers). Checks every variant's rows against a
// host reference (the same q8_1 codes), prints clocks a group a warp, weights a clock an SM
// and the weight bytes a second that rate would stream over all SMs.
// Not built by cargo; on the GPU machine, from the repository root:
//     nvcc -O3 -arch=sm_90a -std=c++17 -I crates/backend/src/cuda/kernels \
//         -o /tmp/ccp bench/cuda/chain_consumer_proto.cu && /tmp/ccp
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>
#include <random>
#include "common.cuh"
#include "chain.cu"

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            printf("CUDA %s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));             \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

constexpr int NG = 6;  // groups a chunk (CN_CH)
constexpr int K = NG * 1024;

// cn_q1i with two groups an iteration (same sums, same order a group).
__device__ __forceinline__ void q1i_pair(const u8* ra, const u8* rb, int gs, int ng, const u8* act,
                                         float& acc0, float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const float2* ds = (const float2*)(act + CN_MAXK);
    const u32 M = 0x01010101u;
    int j = 0;
    for (; j + 1 < ng; j += 2) {
        float p0[2] = {0.f, 0.f}, p1[2] = {0.f, 0.f};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int grp = j + h;
            const u8* ga = ra + grp * gs;
            const u8* gb = rb + grp * gs;
            const uint4 sa = *(const uint4*)ga, sb = *(const uint4*)gb;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint4 wa = *(const uint4*)(ga + 16 + 16 * i);
                const uint4 wb = *(const uint4*)(gb + 16 + 16 * i);
                const int unit0 = (grp * 8 + i) * 4;
                int c0 = 0, c2 = 0;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const uint2 x = *(const uint2*)(act + (unit0 + u) * 32 + 8 * t);
                    const u32 va = cn_w4(wa, u) >> (2 * t), vb = cn_w4(wb, u) >> (2 * t);
                    int cc[4] = {0, 0, 0, 0};
                    cn_imma(cc, va & M, vb & M, (va >> 1) & M, (vb >> 1) & M, x.x, x.y);
                    if (u == t) {
                        c0 = cc[0];
                        c2 = cc[2];
                    }
                }
                const float2 xd = ds[unit0 + t];
                p0[h] += cn_hw(sa, i) * (xd.x * (float)(2 * c0) - xd.y);
                p1[h] += cn_hw(sb, i) * (xd.x * (float)(2 * c2) - xd.y);
            }
        }
        // cn_q1i adds a group's blocks into acc in order; so does this, group by group.
        acc0 += p0[0];
        acc0 += p0[1];
        acc1 += p1[0];
        acc1 += p1[1];
    }
    if (j < ng) cn_q1i(ra + j * gs, rb + j * gs, gs, j, 1, act, acc0, acc1);
}

// cn_q1i's loop with a part taken out (the sums are then wrong; timing only): MODE 1 no
// MMA (each IMMA replaced by adds of its operands), MODE 2 the MMAs alone (operands made
// from the loop's indices, no shared-memory reads, no bit expansion).
template <int MODE>
__device__ __forceinline__ void q1i_part(const u8* ra, const u8* rb, int gs, int ng, const u8* act,
                                         float& acc0, float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const float2* ds = (const float2*)(act + CN_MAXK);
    const u32 M = 0x01010101u;
    for (int j = 0; j < ng; j++) {
        const u8* ga = ra + j * gs;
        const u8* gb = rb + j * gs;
        const uint4 sa = MODE == 2 ? make_uint4(j, 0, 0, 0) : *(const uint4*)ga;
        const uint4 sb = MODE == 2 ? make_uint4(j, 1, 0, 0) : *(const uint4*)gb;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint4 wa = MODE == 2 ? make_uint4(i + j, lane, j, i) : *(const uint4*)(ga + 16 + 16 * i);
            const uint4 wb = MODE == 2 ? make_uint4(j, i, lane, j) : *(const uint4*)(gb + 16 + 16 * i);
            const int unit0 = (j * 8 + i) * 4;
            int c0 = 0, c2 = 0;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const uint2 x = MODE == 2 ? make_uint2(unit0 + u, lane) : *(const uint2*)(act + (unit0 + u) * 32 + 8 * t);
                u32 a0, a1, a2, a3;
                if (MODE == 2) {
                    a0 = cn_w4(wa, u), a1 = cn_w4(wb, u), a2 = a0 ^ u, a3 = a1 ^ u;
                } else {
                    const u32 va = cn_w4(wa, u) >> (2 * t), vb = cn_w4(wb, u) >> (2 * t);
                    a0 = va & M, a1 = vb & M, a2 = (va >> 1) & M, a3 = (vb >> 1) & M;
                }
                int cc[4] = {0, 0, 0, 0};
                if (MODE == 1) {
                    cc[0] = (int)(a0 + a2 + x.x);
                    cc[2] = (int)(a1 + a3 + x.y);
                } else {
                    cn_imma(cc, a0, a1, a2, a3, x.x, x.y);
                }
                if (u == t) {
                    c0 = cc[0];
                    c2 = cc[2];
                }
            }
            const float2 xd = MODE == 2 ? make_float2(1.f, 0.f) : ds[unit0 + t];
            acc0 += cn_hw(sa, i) * (xd.x * (float)(2 * c0) - xd.y);
            acc1 += cn_hw(sb, i) * (xd.x * (float)(2 * c2) - xd.y);
        }
    }
}

// V: 0 plain, 1 fence, 2 pair, 3 p128 (`x` is then the ready activation: planes, scales),
// 4 no MMA, 5 MMAs only (4, 5: timing only). Block: W warps; slot [NG][16 rows][144] (box
// layout), act.
template <int V, int MAXT>
__global__ void __launch_bounds__(MAXT, 1)
    consume(const u8* __restrict__ w, const float* __restrict__ x, int reps, float* out, long long* clk) {
    extern __shared__ __align__(128) u8 smb[];
    u8* slot = smb;
    u8* act = smb + NG * 16 * CN_GB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    for (int i = threadIdx.x; i < NG * 16 * CN_GB / 16; i += blockDim.x)
        ((uint4*)slot)[i] = ((const uint4*)w)[i];
    if (V == 3) {
        for (int i = threadIdx.x; i < CN_ACT / 16; i += blockDim.x) ((uint4*)act)[i] = ((const uint4*)x)[i];
    } else if (warp < CN_W) {
        cn_prep(x, nullptr, nullptr, 1.f, CF_Q1_0R, 0, K / 128, act);
    }
    __syncthreads();
    const int gs = 16 * CN_GB;
    const u8* ra = slot + g * CN_GB;
    const u8* rb = slot + (g + 8) * CN_GB;
    float acc0 = 0.f, acc1 = 0.f;
    const long long t0 = clock64();
    for (int r = 0; r < reps; r++) {
        // Nothing may be kept from the rep before: the slot is "new" each time.
        asm volatile("" ::: "memory");
        float a0 = 0.f, a1 = 0.f;
        if (V == 5) q1i_part<2>(ra, rb, gs, NG, act, a0, a1);
        else if (V == 4) q1i_part<1>(ra, rb, gs, NG, act, a0, a1);
        else if (V == 3) cn_q1p(ra, rb, gs, 0, NG, act, a0, a1);
        else if (V == 2) q1i_pair(ra, rb, gs, NG, act, a0, a1);
        else cn_q1i(ra, rb, gs, 0, NG, act, a0, a1);
        if (V == 1) {
            fence_async_shared();
            __syncwarp();
        }
        if (r == 0) acc0 = a0, acc1 = a1;
        else acc0 += a0 * 1e-30f, acc1 += a1 * 1e-30f;  // keeps the rep, not the sum
    }
    const long long t1 = clock64();
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
    const float r0 = __shfl_sync(0xffffffffu, acc0, 4 * (lane & 7));
    const float r1 = __shfl_sync(0xffffffffu, acc1, 4 * (lane & 7));
    if (blockIdx.x == 0 && warp == 0 && lane < 16) out[lane] = lane < 8 ? r0 : r1;
    if (lane == 0) clk[blockIdx.x * (blockDim.x / 32) + warp] = t1 - t0;
}

static float h2f_host(uint16_t h) {
    const uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
static uint16_t f2h_host(float f) {  // normal positive values only (the scales)
    int e;
    const float m = std::frexp(f, &e);  // f = m·2^e, m in [0.5, 1)
    return (uint16_t)(((e + 14) << 10) | ((int)std::lround((m * 2 - 1) * 1024) & 1023));
}

int main() {
    int sms = 0, khz = 0, ndev = 0;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    // Slot bytes, box layout: group j at j·16·144, row r at r·144: 8 f16 scales, 8 bodies.
    std::vector<u8> wh(NG * 16 * CN_GB);
    for (int j = 0; j < NG; j++)
        for (int r = 0; r < 16; r++) {
            u8* p = &wh[(j * 16 + r) * CN_GB];
            for (int b = 0; b < 8; b++) {
                const uint16_t h = f2h_host(0.01f + 0.01f * (rng() % 1000) / 1000.f);
                memcpy(p + 2 * b, &h, 2);
            }
            for (int i = 16; i < CN_GB; i++) p[i] = (u8)rng();
        }
    std::vector<float> xh(K);
    for (auto& v : xh) v = nd(rng);
    // Reference: q8_1 codes as cn_prep makes them, weights ±d (repack.rs's bit order).
    std::vector<double> ref(16, 0.0);
    for (int u = 0; u < K / 32; u++) {
        float amax = 0.f;
        for (int p = 0; p < 32; p++) amax = std::max(amax, std::fabs(xh[u * 32 + p]));
        const float d = amax / 127.f;
        for (int r = 0; r < 16; r++) {
            const int j = u / 32, blk = (u / 4) % 8, wd = u % 4;
            const u8* p = &wh[(j * 16 + r) * CN_GB];
            uint16_t hs;
            memcpy(&hs, p + 2 * blk, 2);
            uint32_t word;
            memcpy(&word, p + 16 + 16 * blk + 4 * wd, 4);
            long s = 0;
            for (int q = 0; q < 32; q++) {
                const int code = amax == 0.f ? 0 : (int)std::nearbyint(xh[u * 32 + q] / d);
                const int bit = (word >> (8 * (q % 4) + q / 4)) & 1;
                s += bit ? code : -code;
            }
            ref[r] += (double)h2f_host(hs) * d * (double)s;
        }
    }
    // p128: codes over each 128-value block; planes [group][lane 4j + w][8 blocks] (plane j
    // of unit w, bit p = value 4(p & 7) + (p >> 3) of the unit), (d, −Σq) a block.
    std::vector<u8> a128(CN_ACT, 0);
    std::vector<double> ref128(16, 0.0), exact(16, 0.0);
    for (int kb = 0; kb < K / 128; kb++) {
        float amax = 0.f;
        for (int q = 0; q < 128; q++) amax = std::max(amax, std::fabs(xh[kb * 128 + q]));
        const float d = amax / 127.f;
        int code[128], sum = 0;
        for (int q = 0; q < 128; q++) sum += code[q] = amax == 0.f ? 0 : (int)std::nearbyint(xh[kb * 128 + q] / d);
        const int j = kb / 8, i = kb % 8;
        for (int L = 0; L < 32; L++) {
            const int pl = L / 4, w = L % 4;
            uint32_t word = 0;
            for (int p = 0; p < 32; p++)
                word |= (uint32_t)((code[32 * w + 4 * (p & 7) + (p >> 3)] >> pl) & 1) << p;
            memcpy(&a128[((j * 32 + L) * 8 + i) * 4], &word, 4);
        }
        const int neg = -sum;
        memcpy(&a128[CN_MAXK + kb * 8], &d, 4);
        memcpy(&a128[CN_MAXK + kb * 8 + 4], &neg, 4);
        for (int r = 0; r < 16; r++) {
            const u8* p = &wh[(j * 16 + r) * CN_GB];
            uint16_t hs;
            memcpy(&hs, p + 2 * i, 2);
            long s = 0;
            double e = 0.0;
            for (int q = 0; q < 128; q++) {
                uint32_t word;
                memcpy(&word, p + 16 + 16 * i + 4 * (q / 32), 4);
                const int qq = q % 32, bit = (word >> (8 * (qq % 4) + qq / 4)) & 1;
                s += bit ? code[q] : -code[q];
                e += bit ? xh[kb * 128 + q] : -xh[kb * 128 + q];
            }
            ref128[r] += (double)h2f_host(hs) * d * (double)s;
            exact[r] += (double)h2f_host(hs) * e;
        }
    }
    {
        double e32 = 0.0, e128 = 0.0, n = 0.0;
        for (int r = 0; r < 16; r++) {
            e32 += (ref[r] - exact[r]) * (ref[r] - exact[r]);
            e128 += (ref128[r] - exact[r]) * (ref128[r] - exact[r]);
            n += exact[r] * exact[r];
        }
        printf("error of the quantized activation against the f32 dot (rms over the 16 rows, relative): "
               "a scale a 32 values %.2e, a 128 values %.2e\n", std::sqrt(e32 / n), std::sqrt(e128 / n));
    }
    // Without a GPU: the host references and the error line only.
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: host part only\n");
        return 0;
    }
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    u8* wd;
    u8* a128d;
    float *xd, *od;
    long long* cd;
    CK(cudaMalloc(&wd, wh.size()));
    CK(cudaMalloc(&xd, K * 4));
    CK(cudaMalloc(&od, 64));
    CK(cudaMalloc(&cd, sms * 16 * 8));
    CK(cudaMemcpy(wd, wh.data(), wh.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xd, xh.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&a128d, CN_ACT));
    CK(cudaMemcpy(a128d, a128.data(), CN_ACT, cudaMemcpyHostToDevice));
    const int smem = NG * 16 * CN_GB + CN_ACT;
    const int reps = 200;
    printf("SMs %d, clock %.0f MHz; a slot of 16 rows x %d groups (%d weights a warp a rep)\n", sms,
           khz / 1e3, NG, 16 * K);
    const char* names[6] = {"plain", "fence", "pair", "p128", "no-mma", "mma"};
    for (int v = 0; v < 6; v++)
        for (int W : {4, 8, 16}) {
            auto launch = [&] {
                const int T = 32 * W;
                if (W == 16) {
                    if (v == 0) consume<0, 512><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 1) consume<1, 512><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 2) consume<2, 512><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 3) consume<3, 512><<<sms, T, smem>>>(wd, (const float*)a128d, reps, od, cd);
                    if (v == 4) consume<4, 512><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 5) consume<5, 512><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                } else {
                    if (v == 0) consume<0, 256><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 1) consume<1, 256><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 2) consume<2, 256><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 3) consume<3, 256><<<sms, T, smem>>>(wd, (const float*)a128d, reps, od, cd);
                    if (v == 4) consume<4, 256><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                    if (v == 5) consume<5, 256><<<sms, T, smem>>>(wd, xd, reps, od, cd);
                }
            };
            CK(cudaFuncSetAttribute(consume<0, 512>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<1, 512>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<2, 512>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<0, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<1, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<2, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<3, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<3, 512>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<4, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<4, 512>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<5, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            CK(cudaFuncSetAttribute(consume<5, 512>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            launch();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            launch();
            CK(cudaDeviceSynchronize());
            std::vector<long long> c(sms * W);
            float o[16];
            CK(cudaMemcpy(c.data(), cd, c.size() * 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o, od, 64, cudaMemcpyDeviceToHost));
            double worst = 0.0;
            for (int r = 0; r < 16; r++)
                worst = std::max(worst, std::fabs(o[r] - (v == 3 ? ref128 : ref)[r]) /
                                            (std::fabs((v == 3 ? ref128 : ref)[r]) + 1e-3));
            double mean = 0.0, mx = 0.0;
            for (long long e : c) mean += (double)e, mx = std::max(mx, (double)e);
            mean /= c.size();
            const double per_group = mx / reps / NG;
            const double wpc = (double)W * 16 * 1024 / per_group;  // weights a clock an SM
            const double tbs = wpc * khz * 1e3 * sms * 144.0 / 1024.0 / 1e12;
            printf("%-6s W=%2d  %7.0f clk a group a warp (mean %7.0f)  %6.0f weights/clk/SM  "
                   "= %5.2f TB/s of Q1_0  max rel err %.1e %s\n",
                   names[v], W, per_group, mean / reps / NG, wpc, tbs, worst,
                   v >= 4 ? "(timing only)" : worst < 1e-4 ? "ok" : "WRONG");
        }
    return 0;
}
