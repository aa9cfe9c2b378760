// Prototype (session 31, docs/BENCHMARKS.md): the 27B one-token step's chain of GEMVs (Q1_0
// and Q4_K files) in ONE persistent kernel, against the same code launched once a GEMV, with a plain read
// of the same bytes as the ceiling. Not built by cargo. Built here with the pip CUDA 13.5
// toolkit (nvcc, nvvm, crt, cccl, cuda-runtime wheels; cudart linked statically) into
// target/pchain and carried, or on the GPU machine:
//     nvcc -O3 -std=c++17 -arch=sm_90a bench/cuda/persistent_chain_proto.cu -o /tmp/pchain
//     timeout 300 /tmp/pchain    # checks 4 layers against the host, then times 64 + head
// Session 31 wrote it with no GPU lent: not yet run. Its BMMA and IMMA lane arithmetic was
// emulated in Python against the plain dot (exact); the fragment layouts are those measured
// in session 22 (b1) and used by gemv_rows.cu (s8).
//
// The question it answers: the engine's one-token Q1_0 step is 3.4 ms, of which the GEMVs
// alone (every other kernel skipped) take 2.66 ms for 3.6 GB — 1.35 TB/s, where one large
// read runs at ~3 TB/s. Each GEMV is a launch whose blocks must start, load, compute and
// leave before the next can read its input, so the memory idles at every boundary (~5 µs
// of 257 boundaries). Here one block an SM stays for the whole chain: a producer warp
// streams the block's weight tiles of every GEMV in order into a ring of shared-memory
// slots (bulk copies, TMA), never waiting for the GEMVs' inputs — only for free slots — so
// the loads run on across the boundaries; eight consumer warps wait for the previous
// GEMV's output (a per-GEMV counter every block bumps when done), quantize it into shared
// memory and multiply the tiles the ring holds.
//
// Weights go through the ring in chunks (16 rows × ≤ 6 groups of 144 bytes); a unit (16 rows
// × its K part) may take several chunks, its warp keeping the sums in registers.
//
// Q1_0's arithmetic is session 22's `mvb128` (bmma_gemv_proto.cu): binary tensor cores,
// mma.m16n8k128 .b1 AND+POPC, one BMMA = 16 weight rows × one 128-weight Q1_0 block × the
// activation's 8 bit planes. The consumer makes the activation itself (each block from the
// f32 output of the GEMV before), so its format is free: int8 codes with one scale per 128
// values, as bit planes. Q4_K (ggml's blocks as they ship): one IMMA m16n8k32 a 32-weight
// sub-block × 16 rows with q8_1 activations (a scale per 32), as the engine's
// gemv_rows.cu. The RMS norm's scalar (1/rms) is applied to the sums at the end (the codes
// do not change under a scalar), its weight γ before quantizing.
//
// The chain: per layer (48 recurrent, 16 attention, every fourth), in-proj (16384 or 14336
// rows × 5120) ← norm(h); out-proj (5120 × 6144) ← norm(first 6144 of in-proj's output);
// gate+up with the GLU (2 × 17408 × 5120, a tile = 8 gate rows and the same 8 up rows) ←
// norm(out-proj's output); down (5120 × 17408, K in 4 chunks, sums by atomics) ← GLU output
// → h of the next layer; then the head (248320 × 5120) ← norm(h). Timed twice: the GEMVs
// alone (257 ops: the engine's step with every other kernel skipped took 2.66 ms), and with
// a recurrent layer's gated delta rule between in-proj and out-proj (STATE below: its 3 MB
// of state streamed through the same ring and written back, 305 ops). The residual adds,
// conv1d, gated norm, attention core and sampling are left out.
//
// Q1_0 layout (a repack, as cuda/repack.rs makes Q1_0R): a row is groups of 1024
// weights, 144 bytes each: 8 f16 scales (block i = weights 128i..128i+127 of the group),
// then the 8 blocks' bits word-interleaved — word t of block i at 16 + 32t + 4i, bit p of
// word t = weight 32t + p of the block (1: +d, 0: −d).
#include <cuda_fp16.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <array>
#include <functional>
#include <string>
#include <thread>
#include <vector>
typedef uint8_t u8;
typedef uint32_t u32;
typedef uint64_t u64;
typedef long long i64;
#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            printf("CUDA %s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));          \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

constexpr int NW = 8;                     // consumer warps a block
constexpr int NC = NW * 32;               // consumer threads
constexpr int NT = NC + 32;               // + the producer warp
constexpr int GB = 144;                   // a group: 1024 Q1_0 weights, or one 256-weight Q4_K block
constexpr int CH = 6;                     // groups of a chunk's row at most
constexpr int SLOT = 16 * (CH * GB + 16); // a chunk: 16 rows at a padded stride (14,080 bytes)
constexpr int MAXK = 17408;
// The activation as the consumers make it: Q1_0: 8 bit planes and (d, −Σq) a 128-value
// block (18,496 bytes at MAXK); Q4_K: int8 codes and (d, d·Σq) a 32-value unit (21,760).
constexpr int ACT_BYTES = MAXK + MAXK / 32 * 8;
constexpr int MAXNS = 16;                 // ring slots at most

enum Kind { PLAIN = 0, GLU = 1, KSPLIT = 2, STATE = 3 };
// Q1S: Q1_0 with the activation's scale a 32-value unit (llama.cpp's q8 granularity: each
// 128-weight block takes 4 BMMAs, A masked to one unit's word each) — the price of the
// engine's numbers, against Q1's one scale a 128-value block.
enum Fmt { Q1 = 0, Q4K = 1, Q1S = 2 };
// STATE: a recurrent layer's gated delta rule, its state streamed through the same ring. 48
// value heads, each S [128 j][128 i] f32 (row j = column j of the state, 512 bytes); a unit
// is 16 rows of one head. Input x = the in-proj's output: q [16 × 128], k [16 × 128], v
// [48 × 128] (value head h reads key head h / 3); q and k L2-normalized per head, α = 0.9,
// β = 0.5 (the model's come from its a/b projections): s_j ← α·s_j + β·(v_j − α·s_j·k)·k,
// o_j = s_j·q. Writes S back and o [48 × 128] to y.
constexpr int SV_HEADS = 48, SK_HEADS = 16, SD = 128;
constexpr float S_ALPHA = 0.9f, S_BETA = 0.5f;
// TMA2D: a chunk by one 2-D tensor copy (a box of ng groups × 16 rows) where the op has a
// tensor map of that box, instead of 16 row-piece copies (rows then packed at ng·144 bytes).
enum Flags { NODEP = 1, PDL = 2, TMA2D = 4 };

struct Op {
    const u8* W;          // rows × (K / group weights)·144 bytes (STATE: the state, rows × 512, rewritten)
    const float* x;       // input [K] f32
    const float* gamma;   // norm weight [K] or null (then no norm)
    float* y;             // output: [rows] (PLAIN, KSPLIT: accumulated, zeroed before) or [rows/2] (GLU)
    float* zero[2];       // [zero_n] zeroed by this op (later KSPLIT ops' outputs) or null
    int zero_n[2];
    int rows, K, kind, fmt, nkc, dep;
    const CUtensorMap* maps;  // [2] in global memory: boxes of box_ng[0] and box_ng[1] groups × 16 rows
    int box_ng[2];            // 0: no map
};

// ---- PTX helpers (sm_90) ----
__device__ __forceinline__ u32 smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* b, u32 n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect(u64* b, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(b)), "r"(bytes) : "memory");
}
// A wait that never ends is a bug here: after ~2 s any wait traps, so a broken build fails
// its device call in seconds instead of hanging until the call's limit.
__device__ __forceinline__ u64 gtime() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __noinline__ void stuck(const char* what, u32 a, u32 b) {
    printf("stuck: %s (%u, %u) block %d thread %d\n", what, a, b, blockIdx.x, threadIdx.x);
    __trap();
}
__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {
    u32 done, n = 0;
    u64 t0 = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(smem(b)), "r"(parity) : "memory");
        if (!done && (++n & 1023) == 0) {
            if (t0 == 0) t0 = gtime();
            else if (gtime() - t0 > 2000000000ull) stuck("mbarrier", parity, n);
        }
    } while (!done);
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem(dst)), "l"(src), "r"(bytes), "r"(smem(bar)) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* tm, int x, int y, u64* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(smem(dst)), "l"(tm), "r"(x), "r"(y), "r"(smem(bar)) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void bmma(int (&c)[4], u32 a0, u32 a1, u32 b) {
    asm volatile("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3]) : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void imma(int (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 w4(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }
__device__ __forceinline__ float hf(u32 h) { return __half2float(__ushort_as_half((unsigned short)(h & 0xffffu))); }
__device__ __forceinline__ float hw(const uint4& v, int i) { return hf(w4(v, i >> 1) >> (16 * (i & 1))); }
__device__ __forceinline__ float wsum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__host__ __device__ inline int group_weights(int fmt) { return fmt == Q4K ? 256 : 1024; }
// A chunk row's stride in its slot: a multiple of 16 bytes whose count of 16 is odd, so the
// 8 rows a warp reads at once fall in different banks.
__host__ __device__ inline int stride_of(int ng) { return ng * GB + ((ng & 1) ? 0 : 16); }

// Block b of nb's share of an op: units [u0, u1) (a unit = 16 rows × one of nkc K parts, K
// part major, so a block's units share one or two parts), each in nch chunks of ≤ CH groups.
struct Geo {
    int tiles, G, nkc, u0, u1, nch;
    __host__ __device__ Geo(const Op& op, int b, int nb) {
        tiles = op.rows / 16;
        nkc = op.nkc;
        G = op.kind == STATE ? 0 : op.K / group_weights(op.fmt);
        const i64 U = (i64)tiles * nkc;
        u0 = (int)(U * b / nb);
        u1 = (int)(U * (b + 1) / nb);
        const int per = (G + nkc - 1) / nkc;
        nch = op.kind == STATE ? 1 : (per + CH - 1) / CH;
    }
    __host__ __device__ int part(int kc) const { return kc * G / nkc; }
    // Groups [a, e) of chunk c of unit u.
    __host__ __device__ void chunk(int u, int c, int& a, int& e) const {
        const int kc = u / tiles, ua = part(kc), n = part(kc + 1) - ua;
        a = ua + c * n / nch;
        e = ua + (c + 1) * n / nch;
    }
};

// One STATE unit by a warp: rows j0 .. j0+15 of value head h, their state in `st` (shared
// memory, 16 × 128 f32); lane L holds i = 4L .. 4L+3.
__device__ __forceinline__ void state_unit(const Op& op, int tile, const float* st) {
    const int lane = threadIdx.x & 31;
    const int h = tile / (SD / 16), j0 = (tile % (SD / 16)) * 16, kh = h / (SV_HEADS / SK_HEADS);
    const float4 q4 = __ldcg((const float4*)(op.x + kh * SD) + lane);
    const float4 k4 = __ldcg((const float4*)(op.x + SK_HEADS * SD + kh * SD) + lane);
    const float vj = lane < 16 ? __ldcg(op.x + 2 * SK_HEADS * SD + h * SD + j0 + lane) : 0.f;
    const float qn = rsqrtf(wsum(q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w) + 1e-6f);
    const float kn = rsqrtf(wsum(k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w) + 1e-6f);
    const float q[4] = {q4.x * qn, q4.y * qn, q4.z * qn, q4.w * qn};
    const float k[4] = {k4.x * kn, k4.y * kn, k4.z * kn, k4.w * kn};
    float* out = (float*)op.W + (i64)(h * SD + j0) * SD;
    float oj = 0.f;
    for (int j = 0; j < 16; j++) {
        const float4 s4 = *((const float4*)(st + j * SD) + lane);
        float sv[4] = {s4.x, s4.y, s4.z, s4.w};
        const float sk = wsum(sv[0] * k[0] + sv[1] * k[1] + sv[2] * k[2] + sv[3] * k[3]);
        const float u = S_BETA * (__shfl_sync(0xffffffffu, vj, j) - S_ALPHA * sk);
        float so = 0.f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            sv[e] = S_ALPHA * sv[e] + u * k[e];
            so += sv[e] * q[e];
        }
        *((float4*)(out + j * SD) + lane) = make_float4(sv[0], sv[1], sv[2], sv[3]);
        so = wsum(so);
        if (lane == j) oj = so;
    }
    if (lane < 16) op.y[h * SD + j0 + lane] = oj;
}

// This lane's word of a 128-value block's bit planes (lane L holds values 32i + L, i = 0..3):
// plane j, word i (values 32i .. 32i+31, bit p = value 32i + p) goes to lane 4j + i, the lane
// of B's fragment that holds column j, k-word i.
__device__ __forceinline__ u32 plane_word(const int (&q)[4], int lane) {
    u32 mine = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 bal = __ballot_sync(0xffffffffu, (q[i] >> j) & 1);
            if (lane == 4 * j + i) mine = bal;
        }
    }
    return mine;
}

// The activation blocks [kb0, kb1) of 128 values, made by the consumer warps from x (f32,
// from L2), times γ where the op has a norm; returns this thread's share of Σx².
// Q1_0: int8 codes with one scale a block, as 8 bit planes (planes [blk/8][32 lanes][8]:
// lane 4j + i of B's fragment holds plane j, word i = values 32i .. 32i+31; bit p = value
// 32i + p) and xd [blk] = (d, −Σq as int bits).
// Q4_K: int8 codes [K] with (d, d·Σq) a 32-value unit in ds [K/32] (q8_1, as the engine).
__device__ __forceinline__ float prep(const Op& op, int kb0, int kb1, u8* act) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // PB blocks a warp at a time, every load out before the first is used (the input comes
    // from L2: one round trip a batch, not one a block).
    constexpr int PB = 6;
    float ss = 0.f;
    for (int kbb = kb0 + warp; kbb < kb1; kbb += NW * PB) {
        float v[PB][4];
#pragma unroll
        for (int p = 0; p < PB; p++) {
            const int kb = min(kbb + p * NW, kb1 - 1);
            if (op.fmt != Q4K) {
#pragma unroll
                for (int i = 0; i < 4; i++) v[p][i] = __ldcg(op.x + kb * 128 + 32 * i + lane);
            } else {
                const float4 f = __ldcg((const float4*)(op.x + kb * 128) + lane);
                v[p][0] = f.x, v[p][1] = f.y, v[p][2] = f.z, v[p][3] = f.w;
            }
        }
#pragma unroll
        for (int p = 0; p < PB; p++) {
            const int kb = kbb + p * NW;
            if (kb >= kb1) break;
            float m = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int k = op.fmt != Q4K ? kb * 128 + 32 * i + lane : kb * 128 + 4 * lane + i;
                ss += v[p][i] * v[p][i];
                if (op.gamma) v[p][i] *= op.gamma[k];
                m = fmaxf(m, fabsf(v[p][i]));
            }
            if (op.fmt == Q1S) {
                // A scale a 32-value unit: unit i is v[p][i] across the warp.
                int q[4], sqi[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float mi = fabsf(v[p][i]);
#pragma unroll
                    for (int s = 16; s > 0; s >>= 1) mi = fmaxf(mi, __shfl_xor_sync(0xffffffffu, mi, s));
                    q[i] = __float2int_rn(v[p][i] * (mi > 0.f ? 127.f / mi : 0.f));
                    sqi[i] = q[i];
#pragma unroll
                    for (int s = 16; s > 0; s >>= 1) sqi[i] += __shfl_xor_sync(0xffffffffu, sqi[i], s);
                    if (lane == 0) ((float2*)(act + MAXK))[kb * 4 + i] = make_float2(mi / 127.f, __int_as_float(-sqi[i]));
                }
                const u32 mine = plane_word(q, lane);
                ((u32*)act)[((kb >> 3) * 32 + lane) * 8 + (kb & 7)] = mine;
            } else if (op.fmt == Q1) {
#pragma unroll
                for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
                const float inv = m > 0.f ? 127.f / m : 0.f;
                int q[4], sq = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    q[i] = __float2int_rn(v[p][i] * inv);
                    sq += q[i];
                }
#pragma unroll
                for (int s = 16; s > 0; s >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, s);
                const u32 mine = plane_word(q, lane);
                u32* planes = (u32*)act;
                float2* xd = (float2*)(act + MAXK);
                planes[((kb >> 3) * 32 + lane) * 8 + (kb & 7)] = mine;
                if (lane == 0) xd[kb] = make_float2(m / 127.f, __int_as_float(-sq));
            } else {
                // Lane L: values 4L .. 4L+3, unit L / 8 (8 lanes a unit).
#pragma unroll
                for (int s = 4; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
                const float inv = m > 0.f ? 127.f / m : 0.f;
                int sq = 0;
                u32 word = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int q = __float2int_rn(v[p][i] * inv);
                    sq += q;
                    word |= (u32)(q & 0xff) << (8 * i);
                }
#pragma unroll
                for (int s = 4; s > 0; s >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, s);
                ((u32*)act)[kb * 32 + lane] = word;
                const float d = m / 127.f;
                if ((lane & 7) == 0) ((float2*)(act + MAXK))[kb * 4 + lane / 8] = make_float2(d, d * (float)sq);
            }
        }
    }
    return ss;
}

// Q1_0: a chunk's groups [a, a + ng) of rows g, g + 8 (at ra, rb in the slot): one BMMA a
// 128-weight block and the 8 planes; the plane weights of B's columns 2t, 2t+1 (×2: Σ±x =
// 2·Σ_{bit set} x − Σx; plane 7 is −128) and −Σq (lanes t = 0) make Σ ±x. PER32 (Q1S): a
// scale a 32-value unit, so 4 BMMAs a block, the A words of unit u only (lane t holds
// k-word t = unit t, so the others pass 0), each sum scaled by d_u.
template <bool PER32>
__device__ __forceinline__ void q1_chunk(const u8* ra, const u8* rb, int a, int ng, const u8* act, float& acc0,
                                         float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const int wa = 2 << (2 * t), wb = (2 * t + 1 == 7) ? -256 : (2 << (2 * t + 1));
    const u32* planes = (const u32*)act;
    const float2* xd = (const float2*)(act + MAXK);
    for (int j = 0; j < ng; j++) {
        const int grp = a + j;
        const uint4 sa = *(const uint4*)(ra + j * GB), sb = *(const uint4*)(rb + j * GB);
        const uint4 a0 = *(const uint4*)(ra + j * GB + 16 + 32 * t);
        const uint4 a1 = *(const uint4*)(ra + j * GB + 32 + 32 * t);
        const uint4 b0 = *(const uint4*)(rb + j * GB + 16 + 32 * t);
        const uint4 b1 = *(const uint4*)(rb + j * GB + 32 + 32 * t);
        const uint4 p0 = *(const uint4*)(planes + (grp * 32 + lane) * 8);
        const uint4 p1 = *(const uint4*)(planes + (grp * 32 + lane) * 8 + 4);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 wa_i = w4(i < 4 ? a0 : a1, i & 3), wb_i = w4(i < 4 ? b0 : b1, i & 3);
            const u32 pl = w4(i < 4 ? p0 : p1, i & 3);
            constexpr int NU = PER32 ? 4 : 1;
            float s0 = 0.f, s1 = 0.f;
#pragma unroll
            for (int u = 0; u < NU; u++) {
                const float2 xs = xd[(grp * 8 + i) * NU + u];
                const bool on = !PER32 || t == u;
                int cc[4] = {0, 0, 0, 0};
                bmma(cc, on ? wa_i : 0u, on ? wb_i : 0u, pl);
                const int sq = t == 0 ? __float_as_int(xs.y) : 0;
                s0 += xs.x * (float)(cc[0] * wa + cc[1] * wb + sq);
                s1 += xs.x * (float)(cc[2] * wa + cc[3] * wb + sq);
            }
            acc0 += hw(sa, i) * s0;
            acc1 += hw(sb, i) * s1;
        }
    }
}

// Q4_K's scale and min of sub-block s (dequant.cuh's scale_min_k4 on the words of the
// block's bytes 4..15), times d and dmin.
__device__ __forceinline__ float2 q4k_sm(const uint4& h, int s) {
    const int bb = (s & 3) * 8;
    const u32 b0 = (h.y >> bb) & 0xFF, b1 = (h.z >> bb) & 0xFF, b2 = (h.w >> bb) & 0xFF;
    int sc, m;
    if (s < 4) {
        sc = b0 & 63;
        m = b1 & 63;
    } else {
        sc = (b2 & 0xF) | ((b0 >> 6) << 4);
        m = (b2 >> 4) | ((b1 >> 6) << 4);
    }
    return make_float2(hf(h.x) * (float)sc, hf(h.x >> 16) * (float)m);
}

// Q4_K: a chunk's blocks [a, a + ng) (256 weights, ggml's layout) of rows g, g + 8: one IMMA
// m16n8k32 a 32-weight sub-block, the weights as A (k-slots 4t.. and 16 + 4t.. hold bytes
// 8t .. 8t+7 of the sub-block pair's nibbles: the sum over k does not care where a value
// sits as long as A and B agree — gemv_rows.cu's layout), the activation as every column of
// B, so every column of C is the same dot: c0 row g, c2 row g + 8, in each lane. Lane t
// scales sub-blocks 2t and 2t + 1; the warp's reduction over t adds them.
__device__ __forceinline__ void q4k_chunk(const u8* ra, const u8* rb, int a, int ng, const u8* act, float& acc0,
                                          float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const float2* ds = (const float2*)(act + MAXK);
    for (int j = 0; j < ng; j++) {
        const int blk = a + j;
        const u8* pa = ra + j * GB;
        const u8* pb = rb + j * GB;
        const uint4 ha = *(const uint4*)pa, hb = *(const uint4*)pb;
        int c_lo0 = 0, c_lo2 = 0, c_hi0 = 0, c_hi2 = 0;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const uint2 qa = *(const uint2*)(pa + 16 + 32 * p + 8 * t);
            const uint2 qb = *(const uint2*)(pb + 16 + 32 * p + 8 * t);
            const uint2 xl = *(const uint2*)(act + (blk * 8 + 2 * p) * 32 + 8 * t);
            const uint2 xh = *(const uint2*)(act + (blk * 8 + 2 * p + 1) * 32 + 8 * t);
            const u32 M = 0x0F0F0F0Fu;
            int cl[4] = {0, 0, 0, 0}, chh[4] = {0, 0, 0, 0};
            imma(cl, qa.x & M, qb.x & M, qa.y & M, qb.y & M, xl.x, xl.y);
            imma(chh, (qa.x >> 4) & M, (qb.x >> 4) & M, (qa.y >> 4) & M, (qb.y >> 4) & M, xh.x, xh.y);
            if (p == t) {
                c_lo0 = cl[0], c_lo2 = cl[2], c_hi0 = chh[0], c_hi2 = chh[2];
            }
        }
        const float2 xl = ds[blk * 8 + 2 * t], xh = ds[blk * 8 + 2 * t + 1];
        const float2 la = q4k_sm(ha, 2 * t), ua = q4k_sm(ha, 2 * t + 1);
        const float2 lb = q4k_sm(hb, 2 * t), ub = q4k_sm(hb, 2 * t + 1);
        acc0 += la.x * xl.x * (float)c_lo0 - la.y * xl.y + ua.x * xh.x * (float)c_hi0 - ua.y * xh.y;
        acc1 += lb.x * xl.x * (float)c_lo2 - lb.y * xl.y + ub.x * xh.x * (float)c_hi2 - ub.y * xh.y;
    }
}

// Ops [op0, op1) in one launch; `done[o]` counts the blocks through op o, `*epoch` the step
// (a one-thread kernel bumps it before each step's launches, so the counters need no reset
// and a replayed graph counts right): an op waits for done[dep] = nb·epoch where dep is in
// this launch, for the launch before (griddepcontrol) where it is not and PDL is set.
// Work order, the producer's and the consumers' alike: an op's units in batches of NW (unit
// ub + w to warp w), a batch's chunks chunk-major (chunk c of every unit of the batch, then
// c + 1), so warp w takes slots base + c·nbw + w and keeps its unit's sums in registers.
// A consumer waits for its slot by mbarrier parity, which tells the fill it wants from the
// one before only once that one is done: warp w's chunks are nbw ≤ NW apart, so the ring
// needs ns ≥ NW slots (session 34: the 6-slot runs broke this and trapped in session 32).
// MINB 2 (two blocks an SM, so that under programmatic dependent launch the next op's
// blocks start beside this one's) wants a ring of ≤ 6 slots, fewer than NW: not run.
template <int MINB>
__global__ void __launch_bounds__(NT, MINB) chain(const Op* __restrict__ ops, int op0, int op1, u32* done,
                                               const u32* epoch_p, int ns, int flags, u64* stamps) {
    extern __shared__ __align__(128) u8 sm[];
    u8* ring = sm;               // [ns][SLOT]
    u8* act = sm + ns * SLOT;    // [ACT_BYTES]
    __shared__ u64 full[MAXNS], empty[MAXNS];
    __shared__ float sh_ss;
    const int nb = gridDim.x, b = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int i = 0; i < ns; i++) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (flags & PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    // Block 0's clock at the start and as it finishes each op (every op waits for the one
    // before on every block, so these are the ops' ends to within a counter's round trip).
    if (stamps && b == 0 && threadIdx.x == 0) stamps[0] = gtime();

    if (warp == NW) {
        // Producer: every chunk of every op in order; waits only for free slots.
        if (lane != 0) return;
        u32 seq = 0;
        for (int o = op0; o < op1; o++) {
            const Op op = ops[o];
            const Geo geo(op, b, nb);
            const i64 row_bytes = (i64)geo.G * GB;
            for (int ub = geo.u0; ub < geo.u1; ub += NW) {
                const int nbw = min(NW, geo.u1 - ub);
                for (int c = 0; c < geo.nch; c++)
                    for (int w = 0; w < nbw; w++, seq++) {
                        const int u = ub + w, tile = u % geo.tiles;
                        const int s = seq % ns;
                        if (seq >= (u32)ns) mbar_wait(&empty[s], ((seq / ns) - 1) & 1);
                        u8* dst = ring + s * SLOT;
                        if (op.kind == STATE) {
                            mbar_expect(&full[s], 16 * SD * 4);
                            bulk_load(dst, op.W + (i64)tile * 16 * SD * 4, 16 * SD * 4, &full[s]);
                            continue;
                        }
                        int a, e;
                        geo.chunk(u, c, a, e);
                        const int ng = e - a, st = stride_of(ng);
                        if (ng == 0) {
                            mbar_arrive(&full[s]);
                            continue;
                        }
                        const u8* src = op.W + (i64)tile * 16 * row_bytes + (i64)a * GB;
                        mbar_expect(&full[s], 16 * ng * GB);
                        const int m = !(flags & TMA2D) ? -1 : ng == op.box_ng[0] ? 0 : ng == op.box_ng[1] ? 1 : -1;
                        if (m >= 0) {
                            tma_load_2d(dst, op.maps + m, a * (GB / 4), tile * 16, &full[s]);
                        } else if (st == row_bytes) {
                            bulk_load(dst, src, 16 * st, &full[s]);
                        } else {
                            for (int r = 0; r < 16; r++) bulk_load(dst + r * st, src + r * row_bytes, ng * GB, &full[s]);
                        }
                    }
            }
        }
        return;
    }

    // Consumers.
    const int ctid = threadIdx.x;  // 0..NC-1
    const u32 epoch = *(volatile const u32*)epoch_p;
    const int g = lane >> 2, t = lane & 3;
    u32 base = 0;
    for (int o = op0; o < op1; o++) {
        const Op op = ops[o];
        const Geo geo(op, b, nb);
        if (ctid == 0) sh_ss = 0.f;
        if (!(flags & NODEP)) {
            if (op.dep >= op0) {
                if (ctid == 0) {
                    u32 n = 0;
                    u64 t0 = 0;
                    while (ld_acquire(&done[op.dep]) < (u32)nb * epoch)
                        if ((++n & 1023) == 0) {
                            if (t0 == 0) t0 = gtime();
                            else if (gtime() - t0 > 2000000000ull) stuck("op counter", o, done[op.dep]);
                        }
                }
            } else if (o == op0 && (flags & PDL)) {
                asm volatile("griddepcontrol.wait;" ::: "memory");
            }
        }
        named_sync(1, NC);
        // A later KSPLIT op's output, zeroed (nothing reads or adds to it before this op is done).
        for (int z = 0; z < 2; z++)
            if (op.zero[z]) {
                const int z0 = (int)((i64)op.zero_n[z] * b / nb), z1 = (int)((i64)op.zero_n[z] * (b + 1) / nb);
                for (int i = z0 + ctid; i < z1; i += NC) op.zero[z][i] = 0.f;
            }
        // The activation blocks of 128 values this block's units read.
        int kb0 = 0, kb1 = op.kind == STATE ? 0 : op.K / 128;
        // (A norm needs Σx² over all of K: then every block makes the whole activation.)
        if (op.kind == KSPLIT && !op.gamma && geo.u1 > geo.u0) {
            const int per = group_weights(op.fmt) / 128;
            kb0 = geo.part(geo.u0 / geo.tiles) * per;
            kb1 = geo.part((geo.u1 - 1) / geo.tiles + 1) * per;
        }
        float ss = prep(op, kb0, kb1, act);
        if (op.gamma && op.kind != STATE) {
            ss = wsum(ss);
            if (lane == 0) atomicAdd(&sh_ss, ss);
        }
        named_sync(1, NC);
        const float scale = op.gamma ? rsqrtf(sh_ss / (float)op.K + 1e-6f) : 1.f;
        for (int ub = geo.u0; ub < geo.u1; ub += NW) {
            const int nbw = min(NW, geo.u1 - ub);
            if (warp < nbw) {
                const int u = ub + warp, tile = u % geo.tiles;
                float acc0 = 0.f, acc1 = 0.f;
                for (int c = 0; c < geo.nch; c++) {
                    const u32 seq = base + c * nbw + warp;
                    const int s = seq % ns;
                    mbar_wait(&full[s], (seq / ns) & 1);
                    const u8* slot = ring + s * SLOT;
                    if (op.kind == STATE) {
                        state_unit(op, tile, (const float*)slot);
                    } else {
                        int a, e;
                        geo.chunk(u, c, a, e);
                        const int ng = e - a;
                        const bool box = (flags & TMA2D) && (ng == op.box_ng[0] || ng == op.box_ng[1]);
                        const int st = box ? ng * GB : stride_of(ng);
                        if (op.fmt == Q1) q1_chunk<false>(slot + g * st, slot + (g + 8) * st, a, ng, act, acc0, acc1);
                        else if (op.fmt == Q1S) q1_chunk<true>(slot + g * st, slot + (g + 8) * st, a, ng, act, acc0, acc1);
                        else q4k_chunk(slot + g * st, slot + (g + 8) * st, a, ng, act, acc0, acc1);
                    }
                    // The slot's reads done (and ordered before the next bulk copy into it).
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&empty[s]);
                }
                if (op.kind != STATE) {
                    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
                    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
                    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
                    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
                    if (t == 0) {
                        acc0 *= scale;
                        acc1 *= scale;
                        const int r = tile * 16 + g;
                        if (op.kind == PLAIN) {
                            op.y[r] = acc0;
                            op.y[r + 8] = acc1;
                        } else if (op.kind == GLU) {
                            op.y[tile * 8 + g] = acc0 / (1.f + __expf(-acc0)) * acc1;
                        } else {
                            atomicAdd(&op.y[r], acc0);
                            atomicAdd(&op.y[r + 8], acc1);
                        }
                    }
                }
            }
            base += geo.nch * nbw;
        }
        // Every unit of this block done: the op's counter (the outputs before it).
        named_sync(1, NC);
        if (ctid == 0) {
            __threadfence();
            atomicAdd(&done[o], 1u);
            if (stamps && b == 0) stamps[1 + o - op0] = gtime();
        }
    }
}

__global__ void bump(u32* e) { *e += 1; }

// The ring alone: each block streams its share of `bytes` (contiguous) through `ns` slots,
// a slot filled by `per` bulk copies of `copy` bytes (a chunk of 16 row pieces is 16 copies);
// the consumer warps only wait for each slot and free it. Bandwidth by copy size says
// whether the copy engine's request rate caps chunks cut into rows (Q4_K's: 16 of ~800 B).
__global__ void __launch_bounds__(NT, 1) ring_only(const u8* __restrict__ src, i64 bytes, int copy, int per, int ns) {
    extern __shared__ __align__(128) u8 sm[];
    __shared__ u64 full[MAXNS], empty[MAXNS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 slot_bytes = (i64)copy * per;
    const i64 nslots = bytes / slot_bytes;
    const i64 s0 = nslots * blockIdx.x / gridDim.x, s1 = nslots * (blockIdx.x + 1) / gridDim.x;
    if (threadIdx.x == 0) {
        for (int i = 0; i < ns; i++) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == NW) {
        if (lane != 0) return;
        for (i64 q = s0; q < s1; q++) {
            const u32 seq = (u32)(q - s0);
            const int s = seq % ns;
            if (seq >= (u32)ns) mbar_wait(&empty[s], ((seq / ns) - 1) & 1);
            mbar_expect(&full[s], (u32)slot_bytes);
            for (int r = 0; r < per; r++)
                bulk_load(sm + s * SLOT + r * copy, src + q * slot_bytes + (i64)r * copy, copy, &full[s]);
        }
        return;
    }
    for (i64 q = s0 + warp; q < s1; q += NW) {
        const u32 seq = (u32)(q - s0);
        const int s = seq % ns;
        mbar_wait(&full[s], (seq / ns) & 1);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
}

// Pure read of n uint4 (the ceiling of one launch): U loads in flight a thread.
template <int U>
__global__ void __launch_bounds__(256) readk(const uint4* __restrict__ p, i64 n, u32* out) {
    u32 x = 0;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(p + i + k * stride));
#pragma unroll
        for (int k = 0; k < U; k++) x ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n; i += stride) x ^= p[i].x;
    if (x == 0x12345678u) out[0] = x;
}

__device__ __forceinline__ u32 mix(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (u32)(z ^ (z >> 31));
}

// Random weights: scales in [0.5, 1.5)/√K, random bits. One thread a (row, group).
__global__ void fill_w(u8* W, i64 rowgroups, int K, u64 seed) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rowgroups) return;
    u8* p = W + i * GB;
    u32 sc[4];
    for (int k = 0; k < 4; k++) {
        u32 h[2];
        for (int e = 0; e < 2; e++) {
            const float f = (0.5f + (float)(mix(seed ^ (i * 64 + k * 2 + e)) >> 8) / 16777216.f) * rsqrtf((float)K);
            h[e] = __half_as_ushort(__float2half(f));
        }
        sc[k] = h[0] | (h[1] << 16);
    }
    *(uint4*)p = make_uint4(sc[0], sc[1], sc[2], sc[3]);
    for (int k = 0; k < 8; k++)
        *(uint4*)(p + 16 + 16 * k) = make_uint4(mix(seed * 3 + i * 40 + 4 * k), mix(seed * 3 + i * 40 + 4 * k + 1),
                                                mix(seed * 3 + i * 40 + 4 * k + 2), mix(seed * 3 + i * 40 + 4 * k + 3));
}

// Random Q4_K blocks (ggml's layout): d = dmin ∈ [0.5, 1.5)/(200·√K), random scale bytes and
// nibbles. One thread a block.
__global__ void fill_q4k(u8* W, i64 blocks, int K, u64 seed) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= blocks) return;
    u8* p = W + i * GB;
    const float f = (0.5f + (float)(mix(seed ^ (i * 64)) >> 8) / 16777216.f) / (200.f * sqrtf((float)K));
    const u32 h = __half_as_ushort(__float2half(f));
    *(uint4*)p = make_uint4(h | (h << 16), mix(seed * 5 + i * 40 + 1), mix(seed * 5 + i * 40 + 2),
                            mix(seed * 5 + i * 40 + 3));
    for (int k = 0; k < 8; k++)
        *(uint4*)(p + 16 + 16 * k) =
            make_uint4(mix(seed * 7 + i * 40 + 4 * k), mix(seed * 7 + i * 40 + 4 * k + 1),
                       mix(seed * 7 + i * 40 + 4 * k + 2), mix(seed * 7 + i * 40 + 4 * k + 3));
}

__global__ void fill_f(float* x, int n, u64 seed, float lo, float hi) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = lo + (hi - lo) * (float)(mix(seed ^ (u64)i) >> 8) / 16777216.f;
}

// ---- host ----
struct Chain {
    std::vector<Op> ops;
    std::vector<const char*> names;
    std::vector<i64> wbytes;  // each op's weight bytes in the arena (STATE: 0)
    u8* arena = nullptr;      // every GEMV's weights, one allocation
    i64 total = 0;            // the arena's bytes
    i64 state = 0;            // the STATE ops' bytes (each read and written once a step)
    std::vector<void*> allocs;
    void free_all() {
        for (void* p : allocs) CK(cudaFree(p));
        allocs.clear();
    }
};

static float* dalloc(Chain& c, i64 n) {
    float* p;
    CK(cudaMalloc(&p, (size_t)n * 4));
    CK(cudaMemset(p, 0, (size_t)n * 4));
    c.allocs.push_back(p);
    return p;
}

// The chain of `layers` layers and a head of `head_rows` rows, weights (format `fmt`) random
// on the device; with `recurrence`, a STATE op between a recurrent layer's in-proj and out-proj;
// `out_parts`: the out-proj's K in that many parts across blocks (KSPLIT), 1 whole rows.
static Chain build(int layers, int head_rows, bool recurrence, int fmt, int out_parts = 1) {
    Chain c;
    const int H = 5120, FF = 17408, VD = SV_HEADS * SD;
    std::vector<int> src;  // each op's input: the output of op src (−1: h0)
    auto add = [&](const char* name, int rows, int K, int kind, int nkc, int from) {
        Op op{};
        op.rows = rows;
        op.K = K;
        op.kind = kind;
        op.fmt = fmt;
        op.nkc = nkc;
        op.dep = (int)c.ops.size() - 1;
        c.ops.push_back(op);
        c.names.push_back(name);
        c.wbytes.push_back(kind == STATE ? 0 : (i64)rows * (K / group_weights(fmt)) * GB);
        src.push_back(from);
        return (int)c.ops.size() - 1;
    };
    int h = -1;
    std::vector<std::array<int, 3>> zero;  // (in-proj, down, out-proj or −1) of a layer
    for (int l = 0; l < layers; l++) {
        const bool rec = (l + 1) % 4 != 0;
        const int in = add(rec ? "qkv+z" : "q+g+k+v", rec ? 16384 : 14336, H, PLAIN, 1, h);
        int mix = in;
        if (rec && recurrence) mix = add("delta", VD, 0, STATE, 1, in);
        const int out = add(rec ? "ssm_out" : "o", H, VD, out_parts > 1 ? KSPLIT : PLAIN, out_parts, mix);
        const int gu = add("gate+up", 2 * FF, H, GLU, 1, out);
        h = add("down", H, FF, KSPLIT, 4, gu);
        zero.push_back({in, h, out_parts > 1 ? out : -1});
    }
    add("head", head_rows, H, PLAIN, 1, h);
    for (i64 w : c.wbytes) c.total += w;
    CK(cudaMalloc(&c.arena, c.total));
    c.allocs.push_back(c.arena);
    float* gamma = dalloc(c, VD);
    fill_f<<<(VD + 255) / 256, 256>>>(gamma, VD, 99, 0.9f, 1.1f);
    float* h0 = dalloc(c, H);
    fill_f<<<(H + 255) / 256, 256>>>(h0, H, 98, -1.f, 1.f);
    i64 off = 0;
    for (size_t o = 0; o < c.ops.size(); o++) {
        Op& op = c.ops[o];
        if (op.kind == STATE) {
            const i64 n = (i64)op.rows * SD;
            float* st = dalloc(c, n);
            fill_f<<<(unsigned)((n + 255) / 256), 256>>>(st, (int)n, 500 + o, -0.05f, 0.05f);
            op.W = (const u8*)st;
            c.state += n * 4;
            op.y = dalloc(c, op.rows);
        } else {
            op.W = c.arena + off;
            const i64 rg = (i64)op.rows * (op.K / group_weights(fmt));
            if (fmt != Q4K) fill_w<<<(unsigned)((rg + 255) / 256), 256>>>(c.arena + off, rg, op.K, 1000 + o);
            else fill_q4k<<<(unsigned)((rg + 255) / 256), 256>>>(c.arena + off, rg, op.K, 1000 + o);
            off += c.wbytes[o];
            op.gamma = strcmp(c.names[o], "down") == 0 ? nullptr : gamma;  // the GLU output has no norm
            op.y = dalloc(c, op.kind == GLU ? op.rows / 2 : op.rows);
        }
        op.x = src[o] < 0 ? h0 : c.ops[src[o]].y;
    }
    for (auto [in, down, out] : zero) {
        c.ops[in].zero[0] = c.ops[down].y;
        c.ops[in].zero_n[0] = c.ops[down].rows;
        if (out >= 0) {
            c.ops[in].zero[1] = c.ops[out].y;
            c.ops[in].zero_n[1] = c.ops[out].rows;
        }
    }
    CK(cudaDeviceSynchronize());
    return c;
}

// Each GEMV op's tensor maps: its distinct chunk widths (at most 2), a box of that many
// groups (u32 elements: 36 a group) × 16 rows each; an op with more widths keeps row copies.
typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static void make_maps(Chain& c) {
    static EncodeTiled enc = nullptr;
    if (!enc) {
        cudaDriverEntryPointQueryResult q;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&enc, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !enc) {
            printf("no cuTensorMapEncodeTiled\n");
            exit(1);
        }
    }
    std::vector<CUtensorMap> maps(2 * c.ops.size());
    for (size_t o = 0; o < c.ops.size(); o++) {
        Op& op = c.ops[o];
        op.box_ng[0] = op.box_ng[1] = 0;
        if (op.kind == STATE) continue;
        const Geo geo(op, 0, 1);
        std::vector<int> widths;
        for (int kc = 0; kc < geo.nkc; kc++)
            for (int ch = 0; ch < geo.nch; ch++) {
                int a, e;
                geo.chunk(kc * geo.tiles, ch, a, e);
                if (e > a && std::find(widths.begin(), widths.end(), e - a) == widths.end()) widths.push_back(e - a);
            }
        if (widths.size() > 2) continue;
        const i64 row_bytes = (i64)geo.G * GB;
        for (size_t i = 0; i < widths.size(); i++) {
            const cuuint64_t dims[2] = {(cuuint64_t)(row_bytes / 4), (cuuint64_t)op.rows};
            const cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
            const cuuint32_t box[2] = {(cuuint32_t)(widths[i] * GB / 4), 16};
            const cuuint32_t es[2] = {1, 1};
            const CUresult r = enc(&maps[2 * o + i], CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, (void*)op.W, dims, strides, box,
                                   es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
            if (r != CUDA_SUCCESS) {
                printf("cuTensorMapEncodeTiled: %d (op %zu, box %d groups)\n", (int)r, o, widths[i]);
                exit(1);
            }
            op.box_ng[i] = widths[i];
        }
    }
    CUtensorMap* d;
    CK(cudaMalloc(&d, maps.size() * sizeof(CUtensorMap)));
    CK(cudaMemcpy(d, maps.data(), maps.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
    c.allocs.push_back(d);
    for (size_t o = 0; o < c.ops.size(); o++) c.ops[o].maps = d + 2 * o;
}

static float h2f_host(uint16_t h) {
    __half x;
    memcpy(&x, &h, 2);
    return __half2float(x);
}

static void run_threads(int n, const std::function<void(int, int)>& f) {
    std::vector<std::thread> th;
    const int nth = 16;
    for (int i = 0; i < nth; i++) th.emplace_back(f, (int)((i64)n * i / nth), (int)((i64)n * (i + 1) / nth));
    for (auto& x : th) x.join();
}

// A STATE op on the host from its state before the run (`pre`) and the device's input.
static double check_state(const Op& op, const std::vector<float>& pre) {
    std::vector<float> x(2 * SK_HEADS * SD + SV_HEADS * SD), y(op.rows), post(pre.size());
    CK(cudaMemcpy(x.data(), op.x, x.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), op.y, y.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(post.data(), op.W, post.size() * 4, cudaMemcpyDeviceToHost));
    double md = 0, mr = 0, ms = 0, msr = 0;
    for (int h = 0; h < SV_HEADS; h++) {
        const int kh = h / (SV_HEADS / SK_HEADS);
        const float* q = x.data() + kh * SD;
        const float* k = x.data() + SK_HEADS * SD + kh * SD;
        double qn = 0, kn = 0;
        for (int i = 0; i < SD; i++) qn += (double)q[i] * q[i], kn += (double)k[i] * k[i];
        qn = 1 / sqrt(qn + 1e-6);
        kn = 1 / sqrt(kn + 1e-6);
        for (int j = 0; j < SD; j++) {
            const float* s = pre.data() + (i64)(h * SD + j) * SD;
            double sk = 0;
            for (int i = 0; i < SD; i++) sk += s[i] * k[i] * kn;
            const double u = S_BETA * (x[2 * SK_HEADS * SD + h * SD + j] - S_ALPHA * sk);
            double o = 0;
            for (int i = 0; i < SD; i++) {
                const double sn = S_ALPHA * s[i] + u * k[i] * kn;
                o += sn * q[i] * qn;
                ms = fmax(ms, fabs(post[(i64)(h * SD + j) * SD + i] - sn));
                msr = fmax(msr, fabs(sn));
            }
            md = fmax(md, fabs(y[h * SD + j] - o));
            mr = fmax(mr, fabs(o));
        }
    }
    return fmax(md / mr, ms / msr);
}

// A GEMV op on the host (double), from the device's own input, its activation quantized
// as the kernel does; max |y − ref| / max |ref|.
static double check_gemv(const Op& op, i64 wbytes) {
    const int K = op.K, G = K / group_weights(op.fmt), outn = op.kind == GLU ? op.rows / 2 : op.rows;
    const int QB = op.fmt == Q1 ? 128 : 32;  // values a scale of the activation
    std::vector<u8> W(wbytes);
    std::vector<float> x(K), gam(K, 1.f), y(outn);
    CK(cudaMemcpy(W.data(), op.W, wbytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(x.data(), op.x, K * 4, cudaMemcpyDeviceToHost));
    if (op.gamma) CK(cudaMemcpy(gam.data(), op.gamma, K * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), op.y, outn * 4, cudaMemcpyDeviceToHost));
    std::vector<int> q(K);
    std::vector<double> d(K / QB), sq(K / QB, 0.0);
    double ss = 0;
    for (int k = 0; k < K; k++) ss += (double)x[k] * x[k];
    for (int kb = 0; kb < K / QB; kb++) {
        float m = 0.f, v[128];
        for (int i = 0; i < QB; i++) {
            v[i] = op.gamma ? x[kb * QB + i] * gam[kb * QB + i] : x[kb * QB + i];
            m = fmaxf(m, fabsf(v[i]));
        }
        const float inv = m > 0.f ? 127.f / m : 0.f;
        for (int i = 0; i < QB; i++) {
            q[kb * QB + i] = (int)nearbyintf(v[i] * inv);
            sq[kb] += q[kb * QB + i];
        }
        d[kb] = m / 127.f;
    }
    const double scale = op.gamma ? 1.0 / sqrt(ss / K + 1e-6) : 1.0;
    std::vector<double> dot(op.rows);
    const i64 row_bytes = (i64)G * GB;
    run_threads(op.rows, [&](int r0, int r1) {
        for (int r = r0; r < r1; r++) {
            const u8* row = W.data() + r * row_bytes;
            double a = 0;
            for (int grp = 0; grp < G; grp++) {
                const u8* blk = row + grp * GB;
                if (op.fmt != Q4K) {
                    for (int i = 0; i < 8; i++) {
                        uint16_t hs;
                        memcpy(&hs, blk + 2 * i, 2);
                        double sb = 0;
                        for (int tt = 0; tt < 4; tt++) {
                            u32 w;
                            memcpy(&w, blk + 16 + 32 * tt + 4 * i, 4);
                            long s = 0;
                            for (int p = 0; p < 32; p++) {
                                const int qq = q[(grp * 8 + i) * 128 + 32 * tt + p];
                                s += ((w >> p) & 1) ? qq : -qq;
                            }
                            // The activation's scale: the block's (Q1) or the unit's (Q1S).
                            sb += (op.fmt == Q1 ? d[grp * 8 + i] : d[(grp * 8 + i) * 4 + tt]) * (double)s;
                        }
                        a += (double)h2f_host(hs) * sb;
                    }
                } else {
                    uint16_t hd, hm;
                    memcpy(&hd, blk, 2);
                    memcpy(&hm, blk + 2, 2);
                    const u8* sc = blk + 4;
                    for (int sb = 0; sb < 8; sb++) {
                        int scv, mv;
                        if (sb < 4) {
                            scv = sc[sb] & 63;
                            mv = sc[sb + 4] & 63;
                        } else {
                            scv = (sc[sb + 4] & 0xF) | ((sc[sb - 4] >> 6) << 4);
                            mv = (sc[sb + 4] >> 4) | ((sc[sb] >> 6) << 4);
                        }
                        const int u = grp * 8 + sb;
                        long s = 0;
                        for (int l = 0; l < 32; l++) {
                            const int nib = (blk[16 + 32 * (sb / 2) + l] >> (4 * (sb & 1))) & 0xF;
                            s += (long)nib * q[u * 32 + l];
                        }
                        a += (double)h2f_host(hd) * scv * d[u] * (double)s - (double)h2f_host(hm) * mv * d[u] * sq[u];
                    }
                }
            }
            dot[r] = a * scale;
        }
    });
    double md = 0, mr = 0;
    for (int o = 0; o < outn; o++) {
        double ref;
        if (op.kind == GLU) {
            const int tile = o / 8, gg = o % 8;
            const double gv = dot[tile * 16 + gg], uv = dot[tile * 16 + 8 + gg];
            ref = gv / (1 + exp(-gv)) * uv;
        } else {
            ref = dot[o];
        }
        md = fmax(md, fabs(y[o] - ref));
        mr = fmax(mr, fabs(ref));
    }
    return md / mr;
}

// The STATE ops' states before a run (the check needs them; a run rewrites them).
static std::vector<std::vector<float>> snapshot(const Chain& c) {
    std::vector<std::vector<float>> pre(c.ops.size());
    for (size_t o = 0; o < c.ops.size(); o++)
        if (c.ops[o].kind == STATE) {
            pre[o].resize((size_t)c.ops[o].rows * SD);
            CK(cudaMemcpy(pre[o].data(), c.ops[o].W, pre[o].size() * 4, cudaMemcpyDeviceToHost));
        }
    return pre;
}

static double check_op(const Chain& c, size_t o, const std::vector<std::vector<float>>& pre) {
    return c.ops[o].kind == STATE ? check_state(c.ops[o], pre[o]) : check_gemv(c.ops[o], c.wbytes[o]);
}

int main(int argc, char** argv) {
    int dev = 0, nsm = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    const int NB = nsm;
    auto smem_of = [](int ns) { return ns * SLOT + ACT_BYTES; };
    CK(cudaFuncSetAttribute(chain<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_of(14)));
    CK(cudaFuncSetAttribute(chain<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_of(6)));
    u32* done;
    CK(cudaMalloc(&done, 4096 * 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    u32* epoch;  // the step number, on the device (`chain`'s counters wait for nb·epoch)
    CK(cudaMalloc(&epoch, 4));
    Op* dops;
    CK(cudaMalloc(&dops, 4096 * sizeof(Op)));

    // Counters and step number to 0 before a run of launches.
    auto reset = [&] {
        CK(cudaMemsetAsync(done, 0, 4096 * 4, st));
        CK(cudaMemsetAsync(epoch, 0, 4, st));
    };
    u64* stamps;
    CK(cudaMalloc(&stamps, 4096 * 8));
    auto persistent = [&](const Chain& c, int ns, int flags, u64* st_ = nullptr) {
        bump<<<1, 1, 0, st>>>(epoch);
        int op0 = 0, op1 = (int)c.ops.size();
        int nsv = ns, fl = flags;
        const Op* po = dops;
        const u32* ep = epoch;
        void* args[] = {(void*)&po, &op0, &op1, &done, &ep, &nsv, &fl, &st_};
        CK(cudaLaunchCooperativeKernel((void*)chain<1>, dim3(NB), dim3(NT), args, smem_of(ns), st));
    };
    // One launch a range of ops [starts[i], starts[i + 1]) (the ops inside a range wait on
    // the counters, the first on the launch before).
    auto ranges = [&](const Chain& c, const std::vector<int>& starts, int ns, bool pdl) {
        bump<<<1, 1, 0, st>>>(epoch);
        for (size_t i = 0; i < starts.size(); i++) {
            const int o0 = starts[i], o1 = i + 1 < starts.size() ? starts[i + 1] : (int)c.ops.size();
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(NB);
            cfg.blockDim = dim3(NT);
            cfg.dynamicSmemBytes = smem_of(ns);
            cfg.stream = st;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = pdl ? 1 : 0;
            CK(cudaLaunchKernelEx(&cfg, chain<1>, (const Op*)dops, o0, o1, (u32*)done,
                                  (const u32*)epoch, ns, pdl ? (int)PDL : 0, (u64*)nullptr));
        }
    };
    auto each_op = [](const Chain& c) {
        std::vector<int> v(c.ops.size());
        for (size_t o = 0; o < v.size(); o++) v[o] = (int)o;
        return v;
    };
    auto per_op = [&](const Chain& c, int ns, bool pdl) { ranges(c, each_op(c), ns, pdl); };
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto upload = [&](const Chain& c) {
        CK(cudaMemcpy(dops, c.ops.data(), c.ops.size() * sizeof(Op), cudaMemcpyHostToDevice));
    };

    // 1. Check: 4 layers (3 recurrent) and an 8192-row head, every op against the host, in
    //    one persistent launch and one launch an op (with and without PDL).
    const char* fmt_name[] = {"Q1_0", "Q4_K", "Q1_0/32"};
    for (int fmt : {Q1, Q1S, Q4K}) {
        Chain c = build(4, 8192, true, fmt);
        make_maps(c);
        upload(c);
        for (int mode = 0; mode < 4; mode++) {
            reset();
            const auto pre = snapshot(c);
            if (mode == 0) persistent(c, 14, 0);
            else if (mode == 1) per_op(c, 14, false);
            else if (mode == 2) per_op(c, 6, true);
            else persistent(c, 14, TMA2D);
            CK(cudaStreamSynchronize(st));
            double worst = 0;
            for (size_t o = 0; o < c.ops.size(); o++) {
                const double e = check_op(c, o, pre);
                worst = fmax(worst, e);
                if (mode == 0 && o < 6)
                    printf("  check %s %-8s %6d x %5d: rel %.2e\n", fmt_name[fmt], c.names[o], c.ops[o].rows, c.ops[o].K, e);
            }
            printf("check %s %s: %zu ops, worst rel %.2e %s\n", fmt_name[fmt],
                   mode == 0 ? "persistent" : mode == 1 ? "per-op" : mode == 2 ? "per-op+PDL" : "persistent, 2-D copies",
                   c.ops.size(), worst,
                   worst < 1e-4 ? "ok" : "MISMATCH");
        }
        c.free_all();
    }

    // 2. Time: 64 layers + the 248320-row head, the GEMVs alone and with the recurrence.
    auto timeit = [&](const char* name, double gb, auto run) {
        for (int i = 0; i < 2; i++) run();
        CK(cudaStreamSynchronize(st));
        const int N = 10;
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < N; i++) run();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= N;
        printf("  %-44s %7.3f ms  %5.2f TB/s\n", name, ms, gb / ms);
    };
    for (int fmt : {Q1, Q1S, Q4K})
    for (int rec = 0; rec < 2; rec++) {
        Chain c = build(64, 248320, rec == 1, fmt);
        make_maps(c);
        upload(c);
        // Bytes a step: the weights once, a state read and written.
        const double gb = (double)(c.total + 2 * c.state) / 1e9;
        printf("%s chain%s: %zu ops, %.3f GB of weights + 2 x %.3f GB of state, %d blocks of %d threads\n",
               fmt_name[fmt], rec ? " with the recurrence" : " of GEMVs", c.ops.size(), (double)c.total / 1e9, (double)c.state / 1e9,
               NB, NT);
        if (rec == 0) {
            u32* dz;
            CK(cudaMalloc(&dz, 4));
            const i64 n16 = c.total / 16;
            timeit("read (one launch, 4 blocks of 256 an SM)", gb,
                   [&] { readk<4><<<nsm * 4, 256, 0, st>>>((const uint4*)c.arena, n16, dz); });
            timeit("read (8 loads in flight)", gb,
                   [&] { readk<8><<<nsm * 4, 256, 0, st>>>((const uint4*)c.arena, n16, dz); });
            if (fmt == Q1) {
                // The ring alone over the same bytes, by copy size (≤ 13,824 bytes a slot).
                CK(cudaFuncSetAttribute(ring_only, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_of(14)));
                const int sizes[][2] = {{576, 16}, {720, 16}, {864, 16}, {1440, 8}, {2880, 4}, {11520, 1}};
                for (const auto& cp : sizes) {
                    const int copy = cp[0], per = cp[1];
                    char name[80];
                    snprintf(name, sizeof name, "ring alone, 14 slots of %d x %d B", per, copy);
                    timeit(name, gb, [&] { ring_only<<<NB, NT, smem_of(14), st>>>(c.arena, c.total, copy, per, 14); });
                }
            }
        }
        reset();
        for (int ns : {14, 10, 8})
            timeit((std::string("persistent, ring ") + std::to_string(ns)).c_str(), gb, [&] { persistent(c, ns, 0); });
        timeit("persistent, ring 14, 2-D tensor copies", gb, [&] { persistent(c, 14, TMA2D); });
        timeit("persistent, ring 14, no waits (ceiling)", gb, [&] { persistent(c, 14, NODEP); });
        // Launches of op ranges, replayed as a graph: one an op (with and without programmatic
        // dependent launch), and, with the recurrence, the engine's likely first step — the
        // delta rule and the attention core as launches of their own, every GEMV between them
        // in one (a range starts at each "delta", after it, and at each "o") — and the MLP alone
        // in one launch ([gate+up, down], the rest an op a launch).
        std::vector<int> mixer_apart, mlp_only;
        for (int o = 0; o < (int)c.ops.size(); o++) {
            const std::string n = c.names[o];
            if (o == 0 || n == "delta" || n == "o" || (o > 0 && std::string(c.names[o - 1]) == "delta"))
                mixer_apart.push_back(o);
            if (n != "down") mlp_only.push_back(o);
        }
        struct Run { const char* what; const std::vector<int>* starts; int ns; bool pdl; };
        const std::vector<int> one = each_op(c);
        std::vector<Run> runs = {{"one launch an op", &one, 14, false},
                                 {"one launch an op", &one, 14, true},
                                 {"one launch an op", &one, 6, true}};
        if (rec) {
            for (int ns : {14, 8}) runs.push_back({"mixers apart, GEMVs between in one", &mixer_apart, ns, true});
            runs.push_back({"MLP in one launch, the rest an op a launch", &mlp_only, 8, true});
        }
        for (const Run& r : runs) {
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            reset();
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            ranges(c, *r.starts, r.ns, r.pdl);
            CK(cudaStreamEndCapture(st, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            char name[120];
            snprintf(name, sizeof name, "%s (%zu launches, graph), ring %d%s", r.what, r.starts->size(), r.ns,
                     r.pdl ? ", PDL" : "");
            timeit(name, gb, [&] { CK(cudaGraphLaunch(ge, st)); });
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(gr));
        }
        if (rec) {
            // The mixers-apart launches at full size against the host, first layer.
            reset();
            const auto pre_m = snapshot(c);
            ranges(c, mixer_apart, 6, true);
            CK(cudaStreamSynchronize(st));
            double wm = 0;
            for (int o = 0; o < 5; o++) wm = fmax(wm, check_op(c, o, pre_m));
            printf("  check mixers apart (first layer): worst rel %.2e %s\n", wm, wm < 1e-4 ? "ok" : "MISMATCH");
        }
        // A persistent run at full size against the host: the first and last layer (the head
        // is 248320 rows: left out).
        reset();
        const auto pre = snapshot(c);
        persistent(c, 14, 0);
        CK(cudaStreamSynchronize(st));
        double worst = 0;
        const int n = (int)c.ops.size() - 1, per = rec ? 5 : 4;
        for (int o = 0; o < n; o++)
            if (o < per || o >= n - 4) worst = fmax(worst, check_op(c, o, pre));
        printf("  check at 64 layers (first and last layer): worst rel %.2e %s\n", worst,
               worst < 1e-4 ? "ok" : "MISMATCH");
        // Where the persistent step's time goes, by op name (block 0's clock at each op's end).
        reset();
        persistent(c, 14, 0, stamps);
        CK(cudaStreamSynchronize(st));
        std::vector<u64> ts(c.ops.size() + 1);
        CK(cudaMemcpy(ts.data(), stamps, ts.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<std::string> names;
        for (const char* n : c.names)
            if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
        printf("  %-10s %5s %10s %10s %8s\n", "op", "count", "us each", "MB each", "TB/s");
        for (const auto& n : names) {
            double us = 0, mb = 0;
            int k = 0;
            for (size_t o = 0; o < c.ops.size(); o++)
                if (n == c.names[o]) {
                    us += (ts[o + 1] - ts[o]) / 1e3;
                    mb += (c.ops[o].kind == STATE ? 2.0 * c.ops[o].rows * SD * 4 : (double)c.wbytes[o]) / 1e6;
                    k++;
                }
            printf("  %-10s %5d %10.2f %10.2f %8.2f\n", n.c_str(), k, us / k, mb / k, mb / us);  // MB/µs = TB/s
        }
        printf("  whole step (block 0's clock) %.3f ms\n", (ts.back() - ts[0]) / 1e6);
        c.free_all();
        if (rec == 1) {
            // The out-proj (ssm_out / o: 320 row tiles, ~2.4 a block) in 4 K parts across
            // blocks (~9.7 units a block), its sums by atomics like the down projection's.
            Chain c4 = build(64, 248320, true, fmt, 4);
            make_maps(c4);
            upload(c4);
            reset();
            timeit("persistent, ring 14, out-proj K in 4 parts", gb, [&] { persistent(c4, 14, 0); });
            reset();
            const auto pre4 = snapshot(c4);
            persistent(c4, 14, 0);
            CK(cudaStreamSynchronize(st));
            double w4 = 0;
            for (int o = 0; o < 5; o++) w4 = fmax(w4, check_op(c4, o, pre4));
            printf("  check (first layer): worst rel %.2e %s\n", w4, w4 < 1e-4 ? "ok" : "MISMATCH");
            c4.free_all();
        }
    }
    return 0;
}
