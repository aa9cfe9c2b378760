// How fast are the decode chain's consumer loops on their own? Session 33's profile had a
// chain GEMV's consumer warps issuing ~1 instruction per 7.5–13 clocks once all their data
// had arrived; this times `cn_q1i` (chain.cu, included as it is) with nothing else in the
// block: a slot of 16 rows × NG groups in the producer's box layout and the activation
// quantized by `cn_prep`, each warp multiplying the same slot REPS times. Variants:
//   plain   cn_q1i as the chain calls it, a call a chunk
//   fence   + the chain's per-chunk slot release (fence.proxy.async, __syncwarp)
//   pair    two groups an iteration (a copy of cn_q1i whose loop body does j and j + 1)
//   no-mma  cn_q1i's loop with each IMMA replaced by adds (timing only)
//   mma     cn_q1i's MMAs alone, operands from the loop's indices (timing only)
//   Q4_K, TQ2_0  cn_q4k, cn_tq2 on their formats' groups (144 bytes: 256 weights; 528:
//           2048), the same way
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

// cn_q1i with two groups an iteration (each group's sums in its own accumulators, added
// in group order).
__device__ __forceinline__ void q1i_pair(const u8* ra, const u8* rb, int gs, int ng, const u8* act,
                                         float& acc0, float& acc1) {
    int j = 0;
    for (; j + 1 < ng; j += 2) {
        float p0[2] = {0.f, 0.f}, p1[2] = {0.f, 0.f};
#pragma unroll
        for (int h = 0; h < 2; h++) cn_q1i_group(ra + (j + h) * gs, rb + (j + h) * gs, j + h, act, p0[h], p1[h]);
        acc0 += p0[0];
        acc0 += p0[1];
        acc1 += p1[0];
        acc1 += p1[1];
    }
    if (j < ng) cn_q1i_group(ra + j * gs, rb + j * gs, j, act, acc0, acc1);
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
// 4 no MMA, 5 MMAs only (4, 5: timing only), 6 Q4_K (cn_q4k), 7 TQ2_0 (cn_tq2). Block: W
// warps; slot [NG][16 rows][gb] (the producer's box layout), act; K the activation's.
template <int V, int MAXT>
__global__ void __launch_bounds__(MAXT, 1)
    consume(const u8* __restrict__ w, const float* __restrict__ x, int reps, float* out, long long* clk,
            int K, int gb) {
    extern __shared__ __align__(128) u8 smb[];
    u8* slot = smb;
    u8* act = smb + NG * 16 * gb;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    for (int i = threadIdx.x; i < NG * 16 * gb / 16; i += blockDim.x) ((uint4*)slot)[i] = ((const uint4*)w)[i];
    const u32 fmt = V == 6 ? CF_Q4_K : V == 7 ? CF_TQ2_0R : CF_Q1_0R;
    if (V == 3) {
        for (int i = threadIdx.x; i < CN_ACT / 16; i += blockDim.x) ((uint4*)act)[i] = ((const uint4*)x)[i];
    } else if (warp < CN_W) {
        cn_prep(x, nullptr, nullptr, 1.f, fmt, 0, K / 128, act);
    }
    __syncthreads();
    const int gs = 16 * gb;
    const u8* ra = slot + g * gb;
    const u8* rb = slot + (g + 8) * gb;
    float acc0 = 0.f, acc1 = 0.f;
    const long long t0 = clock64();
    for (int r = 0; r < reps; r++) {
        // Nothing may be kept from the rep before: the slot is "new" each time.
        asm volatile("" ::: "memory");
        float a0 = 0.f, a1 = 0.f;
        if (V == 7) cn_tq2(ra, rb, gs, 0, NG, K / 256, act, a0, a1);
        else if (V == 6) cn_q4k(ra, rb, gs, 0, NG, act, a0, a1);
        else if (V == 5) q1i_part<2>(ra, rb, gs, NG, act, a0, a1);
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

typedef void (*Kern)(const u8*, const float*, int, float*, long long*, int, int);
template <int V>
static Kern kern(bool w16) {
    return w16 ? consume<V, 512> : consume<V, 256>;
}
static Kern kern_of(int v, bool w16) {
    switch (v) {
        case 0: return kern<0>(w16);
        case 1: return kern<1>(w16);
        case 2: return kern<2>(w16);
        case 3: return kern<3>(w16);
        case 4: return kern<4>(w16);
        case 5: return kern<5>(w16);
        case 6: return kern<6>(w16);
        default: return kern<7>(w16);
    }
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

// q8_1 as cn_prep makes it: codes and d a 32-value unit.
static void q8_1(const std::vector<float>& x, std::vector<int>& q, std::vector<float>& d) {
    q.assign(x.size(), 0);
    d.assign(x.size() / 32, 0.f);
    for (size_t u = 0; u < x.size() / 32; u++) {
        float amax = 0.f;
        for (int p = 0; p < 32; p++) amax = std::max(amax, std::fabs(x[u * 32 + p]));
        d[u] = amax / 127.f;
        for (int p = 0; p < 32; p++) q[u * 32 + p] = amax == 0.f ? 0 : (int)std::nearbyint(x[u * 32 + p] / d[u]);
    }
}

// One format's slot (16 rows × NG groups, box layout), activation and reference rows.
struct Case {
    const char* name;
    int gb, wg;                 // bytes and weights a group
    std::vector<u8> w;          // [NG][16][gb]
    std::vector<float> x;       // [K]
    std::vector<double> ref;    // [16]
    int K() const { return NG * wg; }
};

int main() {
    int sms = 0, khz = 0, ndev = 0;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto scale = [&](float lo) { return f2h_host(lo + lo * (rng() % 1000) / 1000.f); };
    // A repacked group's 8 f16 block scales.
    auto scales8 = [&](u8* p) {
        for (int b = 0; b < 8; b++) {
            const uint16_t h = scale(0.01f);
            memcpy(p + 2 * b, &h, 2);
        }
    };
    std::vector<int> q;
    std::vector<float> dq;

    // Q1_0 (repack.rs): group = 8 f16 scales, 8 bodies of 4 words; weight 32w + 4k + j of a
    // block at bit 8j + k of word w; ±d.
    Case c1{"Q1_0", CN_GB, 1024, std::vector<u8>(NG * 16 * CN_GB), {}, std::vector<double>(16, 0.0)};
    for (int j = 0; j < NG; j++)
        for (int r = 0; r < 16; r++) {
            u8* p = &c1.w[(j * 16 + r) * CN_GB];
            scales8(p);
            for (int i = 16; i < CN_GB; i++) p[i] = (u8)rng();
        }
    c1.x.resize(c1.K());
    for (auto& v : c1.x) v = nd(rng);
    q8_1(c1.x, q, dq);
    for (int u = 0; u < c1.K() / 32; u++)
        for (int r = 0; r < 16; r++) {
            const int j = u / 32, blk = (u / 4) % 8, wd = u % 4;
            const u8* p = &c1.w[(j * 16 + r) * CN_GB];
            uint16_t hs;
            memcpy(&hs, p + 2 * blk, 2);
            uint32_t word;
            memcpy(&word, p + 16 + 16 * blk + 4 * wd, 4);
            long s = 0;
            for (int k = 0; k < 32; k++) s += ((word >> (8 * (k % 4) + k / 4)) & 1) ? q[u * 32 + k] : -q[u * 32 + k];
            c1.ref[r] += (double)h2f_host(hs) * dq[u] * (double)s;
        }

    // Q4_K (ggml): d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; weight
    // 64c + l is the low nibble of byte 32c + l (sub-block 2c), 64c + 32 + l its high nibble
    // (2c + 1); value d·sc·q − dmin·m.
    Case c4{"Q4_K", CN_GB, 256, std::vector<u8>(NG * 16 * CN_GB), {}, std::vector<double>(16, 0.0)};
    for (auto& b : c4.w) b = (u8)rng();
    for (int j = 0; j < NG; j++)
        for (int r = 0; r < 16; r++) {
            u8* p = &c4.w[(j * 16 + r) * CN_GB];
            const uint16_t d = scale(0.001f), dm = scale(0.0005f);
            memcpy(p, &d, 2);
            memcpy(p + 2, &dm, 2);
        }
    c4.x.resize(c4.K());
    for (auto& v : c4.x) v = nd(rng);
    q8_1(c4.x, q, dq);
    for (int j = 0; j < NG; j++)
        for (int r = 0; r < 16; r++) {
            const u8* p = &c4.w[(j * 16 + r) * CN_GB];
            uint16_t hd, hm;
            memcpy(&hd, p, 2);
            memcpy(&hm, p + 2, 2);
            const u8* sc = p + 4;
            for (int sb = 0; sb < 8; sb++) {
                int s6, m6;
                if (sb < 4) s6 = sc[sb] & 63, m6 = sc[sb + 4] & 63;
                else s6 = (sc[sb + 4] & 0xF) | ((sc[sb - 4] >> 6) << 4), m6 = (sc[sb + 4] >> 4) | ((sc[sb] >> 6) << 4);
                const int u = j * 8 + sb;
                long sq = 0, sx = 0;
                for (int l = 0; l < 32; l++) {
                    const u8 byte = p[16 + 32 * (sb / 2) + l];
                    const int nib = sb % 2 ? byte >> 4 : byte & 0xF;
                    sq += (long)nib * q[u * 32 + l];
                    sx += q[u * 32 + l];
                }
                c4.ref[r] += dq[u] * ((double)h2f_host(hd) * s6 * sq - (double)h2f_host(hm) * m6 * sx);
            }
        }

    // TQ2_0 (repack.rs): group = 8 f16 scales, 8 bodies of 64 bytes; weight 128c + 32l + m
    // of a block has code (qs[32c + m] >> 2l) & 3, value (code − 1)·d.
    const int GT = 16 + 8 * 64;
    Case c2{"TQ2_0", GT, 2048, std::vector<u8>(NG * 16 * GT), {}, std::vector<double>(16, 0.0)};
    for (int j = 0; j < NG; j++)
        for (int r = 0; r < 16; r++) {
            u8* p = &c2.w[(j * 16 + r) * GT];
            scales8(p);
            // Codes 0..2 (3 is not a TQ2_0 code).
            for (int i = 16; i < GT; i++) {
                u8 v = 0;
                for (int k = 0; k < 4; k++) v |= (u8)((rng() % 3) << (2 * k));
                p[i] = v;
            }
        }
    c2.x.resize(c2.K());
    for (auto& v : c2.x) v = nd(rng);
    q8_1(c2.x, q, dq);
    for (int j = 0; j < NG; j++)
        for (int r = 0; r < 16; r++) {
            const u8* p = &c2.w[(j * 16 + r) * GT];
            for (int b = 0; b < 8; b++) {
                uint16_t hs;
                memcpy(&hs, p + 2 * b, 2);
                for (int un = 0; un < 8; un++) {
                    const int c = un / 4, l = un % 4, u = (j * 8 + b) * 8 + un;
                    long s = 0;
                    for (int m = 0; m < 32; m++) {
                        const int code = (p[16 + 64 * b + 32 * c + m] >> (2 * l)) & 3;
                        s += (long)(code - 1) * q[u * 32 + m];
                    }
                    c2.ref[r] += (double)h2f_host(hs) * dq[u] * (double)s;
                }
            }
        }

    // p128 (Q1_0's weights): codes over each 128-value block; planes [group][lane 4j + w][8
    // blocks] (plane j of unit w, bit p = value 4(p & 7) + (p >> 3) of the unit), (d, −Σq)
    // a block. Both roundings against the f32 dot.
    std::vector<u8> a128(CN_ACT, 0);
    std::vector<double> ref128(16, 0.0), exact(16, 0.0);
    for (int kb = 0; kb < c1.K() / 128; kb++) {
        float amax = 0.f;
        for (int k = 0; k < 128; k++) amax = std::max(amax, std::fabs(c1.x[kb * 128 + k]));
        const float d = amax / 127.f;
        int code[128], sum = 0;
        for (int k = 0; k < 128; k++) sum += code[k] = amax == 0.f ? 0 : (int)std::nearbyint(c1.x[kb * 128 + k] / d);
        const int j = kb / 8, i = kb % 8;
        for (int L = 0; L < 32; L++) {
            const int pl = L / 4, w = L % 4;
            uint32_t word = 0;
            for (int p = 0; p < 32; p++) word |= (uint32_t)((code[32 * w + 4 * (p & 7) + (p >> 3)] >> pl) & 1) << p;
            memcpy(&a128[((j * 32 + L) * 8 + i) * 4], &word, 4);
        }
        const int neg = -sum;
        memcpy(&a128[CN_MAXK + kb * 8], &d, 4);
        memcpy(&a128[CN_MAXK + kb * 8 + 4], &neg, 4);
        for (int r = 0; r < 16; r++) {
            const u8* p = &c1.w[(j * 16 + r) * CN_GB];
            uint16_t hs;
            memcpy(&hs, p + 2 * i, 2);
            long s = 0;
            double e = 0.0;
            for (int k = 0; k < 128; k++) {
                uint32_t word;
                memcpy(&word, p + 16 + 16 * i + 4 * (k / 32), 4);
                const int kk = k % 32, bit = (word >> (8 * (kk % 4) + kk / 4)) & 1;
                s += bit ? code[k] : -code[k];
                e += bit ? c1.x[kb * 128 + k] : -c1.x[kb * 128 + k];
            }
            ref128[r] += (double)h2f_host(hs) * d * (double)s;
            exact[r] += (double)h2f_host(hs) * e;
        }
    }
    {
        double e32 = 0.0, e128 = 0.0, n = 0.0;
        for (int r = 0; r < 16; r++) {
            e32 += (c1.ref[r] - exact[r]) * (c1.ref[r] - exact[r]);
            e128 += (ref128[r] - exact[r]) * (ref128[r] - exact[r]);
            n += exact[r] * exact[r];
        }
        printf("Q1_0: error of the quantized activation against the f32 dot (rms over the 16 rows, "
               "relative): a scale a 32 values %.2e, a 128 values %.2e\n",
               std::sqrt(e32 / n), std::sqrt(e128 / n));
    }
    // Without a GPU: the host references and the error line only.
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: host part only\n");
        return 0;
    }
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    float* od;
    long long* cd;
    u8* a128d;
    CK(cudaMalloc(&od, 64));
    CK(cudaMalloc(&cd, sms * 16 * 8));
    CK(cudaMalloc(&a128d, CN_ACT));
    CK(cudaMemcpy(a128d, a128.data(), CN_ACT, cudaMemcpyHostToDevice));
    const int reps = 200;
    printf("SMs %d, clock %.0f MHz; a slot of 16 rows x %d groups a warp, %d reps\n", sms, khz / 1e3, NG, reps);
    const char* names[8] = {"plain", "fence", "pair", "p128", "no-mma", "mma", "Q4_K", "TQ2_0"};
    for (int v = 0; v < 8; v++) {
        const Case& c = v == 6 ? c4 : v == 7 ? c2 : c1;
        const std::vector<double>& ref = v == 3 ? ref128 : c.ref;
        u8* wd;
        float* xd;
        CK(cudaMalloc(&wd, c.w.size()));
        CK(cudaMalloc(&xd, c.K() * 4));
        CK(cudaMemcpy(wd, c.w.data(), c.w.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(xd, c.x.data(), c.K() * 4, cudaMemcpyHostToDevice));
        const float* xin = v == 3 ? (const float*)a128d : xd;
        const int smem = NG * 16 * c.gb + CN_ACT;
        for (int W : {4, 8, 16}) {
            const Kern k = kern_of(v, W == 16);
            CK(cudaFuncSetAttribute((const void*)k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            for (int it = 0; it < 2; it++) {  // the first launch warms up
                k<<<sms, 32 * W, smem>>>(wd, xin, reps, od, cd, c.K(), c.gb);
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
            }
            std::vector<long long> clk(sms * W);
            float o[16];
            CK(cudaMemcpy(clk.data(), cd, clk.size() * 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o, od, 64, cudaMemcpyDeviceToHost));
            double worst = 0.0;
            for (int r = 0; r < 16; r++)
                worst = std::max(worst, std::fabs(o[r] - ref[r]) / (std::fabs(ref[r]) + 1e-3));
            double mean = 0.0, mx = 0.0;
            for (long long e : clk) mean += (double)e, mx = std::max(mx, (double)e);
            mean /= clk.size();
            const double per_group = mx / reps / NG;
            const double wpc = (double)W * 16 * c.wg / per_group;  // weights a clock an SM
            const double tbs = wpc * khz * 1e3 * sms * c.gb / c.wg / 1e12;
            printf("%-6s W=%2d  %7.0f clk a group a warp (mean %7.0f)  %6.0f weights/clk/SM  "
                   "= %5.2f TB/s of %s  max rel err %.1e %s\n",
                   names[v], W, per_group, mean / reps / NG, wpc, tbs, c.name, worst,
                   v == 4 || v == 5 ? "(timing only)" : worst < 1e-4 ? "ok" : "WRONG");
        }
        CK(cudaFree(wd));
        CK(cudaFree(xd));
    }
    return 0;
}
