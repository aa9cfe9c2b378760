// Integer dot of one 32-weight unit of a packed row with q8_1 activations (int8 codes and
// per-32 (d, d·Σq), made by `quant_q8_1` in gemv_int.cu), for up to NR activation rows.
//
// Each format struct `Q_<fmt>` unpacks the unit's weights once into eight 32-bit words of
// four signed bytes (word k = weights 4k .. 4k+3, the order of the activation's words), then
// for each activation row takes `dp4a` dots and applies the unit's scales in f32. Offsets
// that are the same for the whole unit (Q4_0's −8, a K-quant's min) go through the
// activation's d·Σq; per-16 offsets are subtracted per byte (`sub_bytes`) or through Σq of
// the half (Q2_K). Layouts are dequant.cuh's (ggml's, FORMATS.md); each format is tested
// against the CPU backend's matmul and the exact product (tests/cuda_ops.rs).
//
// Signature of every `dot`: row = packed weight row, u = unit index, x[r][k] = activation
// row r's word k of unit u, ds[r] = its (d, d·Σq), acc[r] += the dot.

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Four bytes from a 2-byte aligned address.
__device__ __forceinline__ u32 ld32_2(const u8* p) {
    return (u32)ld16(p) | ((u32)ld16(p + 2) << 16);
}

__device__ __forceinline__ u32 ld32_4(const u8* p) { return *(const u32*)p; }

// Per-byte v − k without borrows between bytes (each byte of v and k below 0x80).
__device__ __forceinline__ int sub_bytes(u32 v, u32 k) {
    return (int)(((v | 0x80808080u) - k) ^ 0x80808080u);
}

// Bits 0..3 of b to bit `at` of bytes 0..3 (at ≤ 4).
__device__ __forceinline__ u32 spread4(u32 b, int at) {
    return ((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << at;
}

// dp4a with unsigned weight bytes (0..255) and signed activation bytes.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// The bits of the float 1.5·2^23: an integer sum started here reads, as a float less
// 1.5·2^23, as the exact sum while it stays within ±2^22 — one full-rate add where an
// int→float conversion takes a quarter-rate pipe.
#define SUM_K 0x4B400000

template <int NR>
__device__ __forceinline__ int dot8(const int* w, const int (&x)[NR][8], int r, int k0, int n) {
    int s = 0;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k >= k0 && k < k0 + n) s = dp4a(w[k], x[r][k], s);
    return s;
}

struct Q_Q4_0 {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)u * 18;
        const float d = h2f(ld16(b));
        int w[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 v = ld32_2(b + 2 + 4 * k);
            w[k] = v & 0x0F0F0F0F;
            w[k + 4] = (v >> 4) & 0x0F0F0F0F;
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d * (ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) - 8.f * ds[r].y);
    }
};

struct Q_Q4_1 {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)u * 20;
        const float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        int w[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 v = ld32_4(b + 4 + 4 * k);
            w[k] = v & 0x0F0F0F0F;
            w[k + 4] = (v >> 4) & 0x0F0F0F0F;
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d * ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) + m * ds[r].y;
    }
};

struct Q_Q5_0 {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)u * 22;
        const float d = h2f(ld16(b));
        const u32 qh = ld32_2(b + 2);
        int w[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 v = ld32_2(b + 6 + 4 * k);
            w[k] = (v & 0x0F0F0F0F) | spread4(qh >> (4 * k), 4);
            w[k + 4] = ((v >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * k), 4);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d * (ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) - 16.f * ds[r].y);
    }
};

struct Q_Q5_1 {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)u * 24;
        const float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        const u32 qh = ld32_4(b + 4);
        int w[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 v = ld32_4(b + 8 + 4 * k);
            w[k] = (v & 0x0F0F0F0F) | spread4(qh >> (4 * k), 4);
            w[k + 4] = ((v >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * k), 4);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d * ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) + m * ds[r].y;
    }
};

struct Q_Q8_0 {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)u * 34;
        const float d = h2f(ld16(b));
        int w[8];
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = (int)ld32_2(b + 2 + 4 * k);
#pragma unroll
        for (int r = 0; r < NR; r++) acc[r] += d * ds[r].x * (float)dot8<NR>(w, x, r, 0, 8);
    }
};

// Q4_K in ggml's layout (N false) or in repack.rs's (N true: unit s of a super-block is the
// 16 bytes at qs + 16s, byte 4k + i holding weight 8k + i in its low nibble and 8k + 4 + i in
// its high one, so a unit is one 16-byte load and word k makes activation words 2k, 2k + 1).
// The same integer sums either way, so the same bits.
template <bool N>
struct Q_Q4_Kt {
    // A unit's 32 nibbles times the NR activation rows, scaled: `dot`'s and `dot_u`'s shared
    // arithmetic. ggml's layout: the low or high halves (by nsh) of q's 8 words. (Masking
    // the nibbles in place and shifting the sums once cut mvqm1x4's loop 288 → 245 SASS but
    // took it from 44 to 54 registers: tg64 166.3 / 166.9 → 164.3, H200, session 35.)
    template <int NR>
    static __device__ __forceinline__ void acc_nibbles(const u32 (&q)[8], int nsh, float d1,
                                                       float m1, const int (&x)[NR][8],
                                                       const float2 (&ds)[NR], float (&acc)[NR]) {
        int w[8];
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = (q[k] >> nsh) & 0x0F0F0F0F;
        acc_words<NR>(w, d1, m1, x, ds, acc);
    }
    // The repacked unit's 4 words.
    template <int NR>
    static __device__ __forceinline__ void acc_pairs(const uint4 v, float d1, float m1,
                                                     const int (&x)[NR][8],
                                                     const float2 (&ds)[NR], float (&acc)[NR]) {
        const u32 q[4] = {v.x, v.y, v.z, v.w};
        int w[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = q[k] & 0x0F0F0F0F;
            w[2 * k + 1] = (q[k] >> 4) & 0x0F0F0F0F;
        }
        acc_words<NR>(w, d1, m1, x, ds, acc);
    }
    template <int NR>
    static __device__ __forceinline__ void acc_words(const int (&w)[8], float d1, float m1,
                                                     const int (&x)[NR][8],
                                                     const float2 (&ds)[NR], float (&acc)[NR]) {
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d1 * ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) - m1 * ds[r].y;
    }
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)(u >> 3) * 144;
        const int s = u & 7;
        int sc, m;
        scale_min_k4(s, b + 4, sc, m);
        const float d1 = h2f(ld16(b)) * (float)sc, m1 = h2f(ld16(b + 2)) * (float)m;
        // 16-byte aligned: super-blocks are 9·16 bytes and qs starts at byte 16.
        if constexpr (N) {
            acc_pairs<NR>(*(const uint4*)(b + 16 + 16 * s), d1, m1, x, ds, acc);
        } else {
            const uint4* q4 = (const uint4*)(b + 16 + 32 * (s >> 1));
            const int sh = (s & 1) * 4;
            const uint4 v0 = q4[0], v1 = q4[1];
            const u32 q[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
            acc_nibbles<NR>(q, sh, d1, m1, x, ds, acc);
        }
    }
    // A unit's loads apart from its arithmetic, for gemv_int.cu's `mvq_split`: the
    // super-block's head (d, dmin, 12 scale bytes) and the unit's qs — ggml's layout: the
    // 32 bytes whose low (even unit) or high (odd unit) nibbles are the unit's (b); the
    // repacked one: its 16 bytes (b unused). 16-byte aligned (super-blocks are 9·16 bytes,
    // qs starts at byte 16). `dot_u` is `dot`'s arithmetic on them.
    struct U {
        uint4 h, a, b;
    };
    static __device__ __forceinline__ U load_u(const u8* row, int u) {
        const uint4* b = (const uint4*)(row + (i64)(u >> 3) * 144);
        if constexpr (N) {
            return U{b[0], b[1 + (u & 7)], uint4{}};
        } else {
            const int p = 1 + 2 * ((u & 7) >> 1);
            return U{b[0], b[p], b[p + 1]};
        }
    }
    template <int NR>
    static __device__ __forceinline__ void dot_u(const U& w, int u, const int (&x)[NR][8],
                                                 const float2 (&ds)[NR], float (&acc)[NR]) {
        const int s = u & 7, sh = 8 * (s & 3);
        // scale_min_k4 on the scale bytes q[0..11] = words h.y, h.z, h.w.
        const u32 lo = w.h.y >> sh, mid = w.h.z >> sh, hi = w.h.w >> sh;
        const int sc = s < 4 ? lo & 63 : (hi & 0xF) | ((lo >> 6 & 3) << 4);
        const int m = s < 4 ? mid & 63 : (hi >> 4 & 0xF) | ((mid >> 6 & 3) << 4);
        const float d1 = h2f((u16)(w.h.x & 0xFFFF)) * (float)sc;
        const float m1 = h2f((u16)(w.h.x >> 16)) * (float)m;
        if constexpr (N) {
            acc_pairs<NR>(w.a, d1, m1, x, ds, acc);
        } else {
            const int nsh = (s & 1) * 4;
            const u32 q[8] = {w.a.x, w.a.y, w.a.z, w.a.w, w.b.x, w.b.y, w.b.z, w.b.w};
            acc_nibbles<NR>(q, nsh, d1, m1, x, ds, acc);
        }
    }
};
using Q_Q4_K = Q_Q4_Kt<false>;
using Q_Q4_KN = Q_Q4_Kt<true>;

// Q5_K in ggml's layout (N false) or in repack.rs's (N true: the qs of unit s paired as
// Q_Q4_Kt's at qs + 16s, and its 32 fifth bits as one word at qh + 4s, bit 8i + m the fifth
// bit of weight 4m + i, so activation word m's are bits m of the word's four bytes).
// Repacked, a unit's loads come apart from its arithmetic (U, load_u, dot_u: gemv_int.cu's
// `mvq_split`, by `has_unit`), which ggml's 64 bytes a unit did not allow in registers.
struct Q5KPairs {
    // The repacked unit's words: qs word k's nibble halves and bits 2k, 2k + 1 of h.
    template <int NR>
    static __device__ __forceinline__ void acc(const uint4 v, u32 h, float d1, float m1,
                                               const int (&x)[NR][8], const float2 (&ds)[NR],
                                               float (&acc)[NR]) {
        const u32 q[4] = {v.x, v.y, v.z, v.w};
        int w[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = (q[k] & 0x0F0F0F0F) | (((h >> (2 * k)) & 0x01010101) << 4);
            w[2 * k + 1] = ((q[k] >> 4) & 0x0F0F0F0F) | (((h >> (2 * k + 1)) & 0x01010101) << 4);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d1 * ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) - m1 * ds[r].y;
    }
    // The super-block's head (d, dmin, 12 scale bytes), the unit's 16 bytes of qs and its
    // word of fifth bits (super-blocks are 11·16 bytes: qh at 16, qs at 48).
    struct U {
        uint4 h, a;
        u32 q5;
    };
    static __device__ __forceinline__ U load_u(const u8* row, int u) {
        const u8* b = row + (i64)(u >> 3) * 176;
        const int s = u & 7;
        return U{*(const uint4*)b, *(const uint4*)(b + 48 + 16 * s), *(const u32*)(b + 16 + 4 * s)};
    }
    template <int NR>
    static __device__ __forceinline__ void dot_u(const U& w, int u, const int (&x)[NR][8],
                                                 const float2 (&ds)[NR], float (&a)[NR]) {
        const int s = u & 7;
        int sc, m;
        k4_scale_min(w.h.y, w.h.z, w.h.w, s, sc, m);
        const float d1 = h2f((u16)(w.h.x & 0xFFFF)) * (float)sc;
        const float m1 = h2f((u16)(w.h.x >> 16)) * (float)m;
        acc<NR>(w.a, w.q5, d1, m1, x, ds, a);
    }
};
template <bool N>
struct Q5KSplit {};
template <>
struct Q5KSplit<true> : Q5KPairs {};

template <bool N>
struct Q_Q5_Kt : Q5KSplit<N> {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)(u >> 3) * 176;
        const int s = u & 7;
        int sc, m;
        scale_min_k4(s, b + 4, sc, m);
        const float d1 = h2f(ld16(b)) * (float)sc, m1 = h2f(ld16(b + 2)) * (float)m;
        // 16-byte aligned: super-blocks are 11·16 bytes, qh at 16, ql at 48.
        if constexpr (N) {
            Q5KPairs::acc<NR>(*(const uint4*)(b + 48 + 16 * s), *(const u32*)(b + 16 + 4 * s),
                              d1, m1, x, ds, acc);
        } else {
            const uint4* l4 = (const uint4*)(b + 48 + 32 * (s >> 1));
            const uint4* h4 = (const uint4*)(b + 16);
            const uint4 a0 = l4[0], a1 = l4[1], c0 = h4[0], c1 = h4[1];
            const u32 ql[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const u32 qh[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
            const int sh = (s & 1) * 4;
            int w[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                w[k] = ((ql[k] >> sh) & 0x0F0F0F0F) | (((qh[k] >> s) & 0x01010101) << 4);
#pragma unroll
            for (int r = 0; r < NR; r++)
                acc[r] += d1 * ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) - m1 * ds[r].y;
        }
    }
};
using Q_Q5_K = Q_Q5_Kt<false>;
using Q_Q5_KN = Q_Q5_Kt<true>;

struct Q_Q6_K {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)(u >> 3) * 210;
        const int s = u & 7;
        const int n = s >> 2, k = s & 3;
        const float d = h2f(ld16(b + 208));
        const u8* ql = b + 64 * n + 32 * (k & 1);
        const u8* qh = b + 128 + 32 * n;
        const i8* sc = (const i8*)(b + 192 + 8 * n + 2 * k);
        const int nsh = (k >> 1) * 4, hsh = 2 * k;
        const float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
        int w[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 v = ((ld32_2(ql + 4 * j) >> nsh) & 0x0F0F0F0F) |
                          (((ld32_2(qh + 4 * j) >> hsh) & 0x03030303) << 4);
            w[j] = sub_bytes(v, 0x20202020);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += ds[r].x * (d0 * (float)dot8<NR>(w, x, r, 0, 4) +
                                 d1 * (float)dot8<NR>(w, x, r, 4, 4));
    }
};

struct Q_Q2_K {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)(u >> 3) * 84;
        const int s = u & 7;
        const float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
        const u8* q = b + 16 + 32 * (s >> 2);  // 4-byte aligned: 84 = 4·21
        const int sh = 2 * (s & 3);
        const int sa = b[2 * s], sb = b[2 * s + 1];
        int w[8];
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = (ld32_4(q + 4 * j) >> sh) & 0x03030303;
        const int ones[8] = {0x01010101, 0x01010101, 0x01010101, 0x01010101,
                             0x01010101, 0x01010101, 0x01010101, 0x01010101};
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int isum = (sa & 0xF) * dot8<NR>(w, x, r, 0, 4) + (sb & 0xF) * dot8<NR>(w, x, r, 4, 4);
            const int imin = (sa >> 4) * dot8<NR>(ones, x, r, 0, 4) + (sb >> 4) * dot8<NR>(ones, x, r, 4, 4);
            acc[r] += ds[r].x * (d * (float)isum - dmin * (float)imin);
        }
    }
};

struct Q_Q3_K {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)(u >> 3) * 110;
        const int s = u & 7;
        const float d = h2f(ld16(b + 108));
        const u8* q = b + 32 + 32 * (s >> 2);
        const int sh = 2 * (s & 3);
        const int da = scale_q3_k(b + 96, 2 * s), db = scale_q3_k(b + 96, 2 * s + 1);
        int w[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            // Code 0..3 plus 4 where the high-mask bit is set, minus 4: −4..3.
            const u32 v = ((ld32_2(q + 4 * j) >> sh) & 0x03030303) |
                          (((ld32_2(b + 4 * j) >> s) & 0x01010101) << 2);
            w[j] = sub_bytes(v, 0x04040404);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += ds[r].x * d *
                      (float)(da * dot8<NR>(w, x, r, 0, 4) + db * dot8<NR>(w, x, r, 4, 4));
    }
};

struct Q_Q1_0 {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)(u >> 2) * 18;
        const float d = h2f(ld16(b));
        const u32 bits = ld32_2(b + 2 + 4 * (u & 3));
        // Σ ±x = 2·Σ_{bit set} x − Σ x. A nibble n times 0x00204081 is n + n<<7 + n<<14 +
        // n<<21 (no overlaps, so no carries), so its bit i lands at bit 8i: four
        // instructions a word where spread4's shifts and ors took eleven (this GEMV is
        // bound by instructions, not by its 1-bit weights' bytes).
        int w[8];
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = (((bits >> (4 * k)) & 0xFu) * 0x00204081u) & 0x01010101u;
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d * (2.f * ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) - ds[r].y);
    }
};

struct Q_TQ2_0 {
    template <int NR>
    static __device__ __forceinline__ void dot(const u8* row, int u, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u8* b = row + (i64)(u >> 3) * 66;
        const int s = u & 7;
        const float d = h2f(ld16(b + 64));
        const u8* q = b + 32 * (s >> 2);
        const int sh = 2 * (s & 3);
        int w[8];
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = (ld32_2(q + 4 * k) >> sh) & 0x03030303;
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += d * (ds[r].x * (float)dot8<NR>(w, x, r, 0, 8) - ds[r].y);
    }
};

// The repacked Q1_0 / TQ2_0 (cuda/repack.rs; lowbit.cu's rp_body / rp_scale). A thread takes
// a step of STEP = 4 units (128 weights) of a weight row: `load(row, s)` reads the step's
// bytes with 16-byte loads into a `W`, then `dot<NR>(w, j, x, ds, acc)` dots its unit j with
// the activation unit 4s + j (the same x, ds, acc as the one-unit `dot` above). gemv_int.cu
// loads the R weight rows' steps first, then walks the units.


// Word j of v (j is a constant once the caller's loop is unrolled).
__device__ __forceinline__ u32 word4(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Q1_0: a step is one block (16 bytes of bits and its scale), its four units bit-sliced
// (repack.rs): weight 4k + i of unit j is bit 8i + j + 4·(k / 4) of word k % 4. So unit
// j's activation word k pairs with word k % 4 & (0x01010101 << (j + 4·(k / 4))), one
// immediate mask (j, k known once unrolled): 2^j·bit a byte for k < 4, 2^(j+4)·bit for
// k ≥ 4, where the unit's eight words once sat at eight bit positions and each took a
// shift to bit 7 first (three instructions a four weights, now two). lo·16 + hi is
// 2^(j+4)·Σ_{bit set} x (|·| < 2^20, read through SUM_K) and Σ ±x = that / 2^(j+3) − Σ x:
// the 2^−(j+3) goes to the activation's d, the same product as the shifted form's
// 128·Σ / 64, so the same bits.
struct Q_Q1_0R {
    static constexpr int STEP = 4;
    struct W {
        uint4 q;
        float d;
    };
    static __device__ __forceinline__ W load(const u8* row, int s) {
        W w;
        w.q = ld_stream(rp_body<16>(row, s));
        w.d = rp_scale<16>(row, s);
        return w;
    }
    template <int NR>
    static __device__ __forceinline__ void dot(const W& w, int j, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        int lo[NR], s[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) lo[r] = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 m = word4(w.q, k) & (0x01010101u << j);
#pragma unroll
            for (int r = 0; r < NR; r++) lo[r] = dp4a_us(m, x[r][k], lo[r]);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) s[r] = lo[r] * 16 + SUM_K;
#pragma unroll
        for (int k = 4; k < 8; k++) {
            const u32 m = word4(w.q, k - 4) & (0x01010101u << (j + 4));
#pragma unroll
            for (int r = 0; r < NR; r++) s[r] = dp4a_us(m, x[r][k], s[r]);
        }
        const float inv = 1.f / (float)(8 << j);
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += w.d * __fmaf_rn(ds[r].x * inv, __int_as_float(s[r]) - 12582912.f, -ds[r].y);
    }
};

// TQ2_0: a step is half a block (32 bytes: units 4c .. 4c+3 share them, unit l takes bits
// 2l of every byte). word & (3 << 2l in every byte) is 4^l·code per byte (≤ 128: dp4a's
// unsigned bytes), so the unit's eight dp4a sum 4^l·Σcode·q and one shift at the end gives
// Σcode·q — exactly what shifting every word to the top bits first gave, one instruction a
// word fewer (a third of the loop); weights are (code − 1)·d, so the dot is
// d·(dx·Σcode·q − dx·Σq). (Q1_0R's SUM_K read, here with 4^−l on dx, added 4 spilled
// bytes to `mvs_8`'s 48 under ptxas 13: not taken unmeasured.)
struct Q_TQ2_0R {
    static constexpr int STEP = 4;
    struct W {
        uint4 a, b;
        float d;
    };
    static __device__ __forceinline__ W load(const u8* row, int s) {
        W w;
        const uint4* p = (const uint4*)(rp_body<64>(row, s >> 1) + 32 * (s & 1));
        w.a = ld_stream(p);
        w.b = ld_stream(p + 1);
        w.d = rp_scale<64>(row, s >> 1);
        return w;
    }
    template <int NR>
    static __device__ __forceinline__ void dot(const W& w, int l, const int (&x)[NR][8],
                                               const float2 (&ds)[NR], float (&acc)[NR]) {
        const u32 q[8] = {w.a.x, w.a.y, w.a.z, w.a.w, w.b.x, w.b.y, w.b.z, w.b.w};
        int s[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) s[r] = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 m = q[k] & (0x03030303u << (2 * l));
#pragma unroll
            for (int r = 0; r < NR; r++) s[r] = dp4a_us(m, x[r][k], s[r]);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[r] += w.d * (ds[r].x * (float)(s[r] >> (2 * l)) - ds[r].y);
    }
};
