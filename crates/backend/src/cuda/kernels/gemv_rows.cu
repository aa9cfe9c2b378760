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
// A format struct `R_<fmt>` below gives words 2t and 2t + 1 of a unit and its (A_w, B_w).
// Formats with a scale per 16 values (Q2_K, Q3_K, Q6_K: `HALVES`) take two mma a unit,
// one a half: thread t's two words are values 8t..8t + 7, all in half t / 2, so each mma
// has the other half's threads' words at zero (Q2_K's mins take a third, of ones, for each
// half's Σq). Q3_K, Q5_K and Q6_K run only with NEAGARI_CUDA_MVR_K16=1 (modules.rs
// `rows_struct`: slower than `mvq8` in the step). Q4_1 and Q5_1 have none and stay on `mvq8`. Tested
// against the CPU backend and the exact product in tests/cuda_gemv_rows.rs.
//
// Shapes as gemv_int.cu: xq [nr, units·32] i8, xds [nr, units] float2, y [nr, rows] f32.

// Format structs: `load(row, u, t)` reads what thread t needs of unit u into a `Raw`
// (loads only, so a warp issues every load of a step before its first use stalls it),
// `unpack(raw, u, t, w0, w1)` makes words 2t and 2t + 1 of the unit (four signed bytes each,
// the activation words' order) and returns (A_w, B_w).

struct R_Q4_0 {
    struct Raw { u32 d, v0, v1; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)u * 18;
        // Words 0..3 are the low nibbles of qs' words, 4..7 the high ones.
        const u8* q = b + 2 + 8 * (t & 1);
        return Raw{ld16(b), ld32_2(q), ld32_2(q + 4)};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int sh = (t >> 1) * 4;
        w0 = (r.v0 >> sh) & 0x0F0F0F0F;
        w1 = (r.v1 >> sh) & 0x0F0F0F0F;
        const float d = h2f((u16)r.d);
        return make_float2(d, -8.f * d);
    }
};

struct R_Q5_0 {
    struct Raw { u32 d, qh, v0, v1; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)u * 22;
        const u8* q = b + 6 + 8 * (t & 1);
        return Raw{ld16(b), ld32_2(b + 2), ld32_2(q), ld32_2(q + 4)};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int sh = (t >> 1) * 4;
        // Word k holds weights 4k..4k+3: their fifth bits are qh's bits 4k..4k+3.
        w0 = ((r.v0 >> sh) & 0x0F0F0F0F) | spread4(r.qh >> (8 * t), 4);
        w1 = ((r.v1 >> sh) & 0x0F0F0F0F) | spread4(r.qh >> (8 * t + 4), 4);
        const float d = h2f((u16)r.d);
        return make_float2(d, -16.f * d);
    }
};

struct R_Q8_0 {
    struct Raw { u32 d, v0, v1; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)u * 34;
        return Raw{ld16(b), ld32_2(b + 2 + 8 * t), ld32_2(b + 6 + 8 * t)};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        w0 = (int)r.v0;
        w1 = (int)r.v1;
        return make_float2(h2f((u16)r.d), 0.f);
    }
};

// Q4_K in ggml's layout (N false) or repack.rs's (N true: vecdot.cuh's Q_Q4_Kt; word t of
// the unit's 16 bytes is words 2t (low nibbles) and 2t + 1 (high) at once).
template <bool N>
struct R_Q4_Kt {
    // The super-block's d and dmin, its 12 scale bytes, the thread's 8 bytes of qs (4 when
    // repacked: q.y unused).
    struct Raw { u32 dm, s0, s1, s2; uint2 q; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)(u >> 3) * 144;
        const int s = u & 7;
        // Aligned: super-blocks are 9·16 bytes, scales at 4, qs at 16.
        const u32* w = (const u32*)b;
        if constexpr (N)
            return Raw{w[0], w[1], w[2], w[3], make_uint2(*(const u32*)(b + 16 + 16 * s + 4 * t), 0u)};
        return Raw{w[0], w[1], w[2], w[3], *(const uint2*)(b + 16 + 32 * (s >> 1) + 8 * t)};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int s = u & 7;
        if constexpr (N) {
            w0 = r.q.x & 0x0F0F0F0F;
            w1 = (r.q.x >> 4) & 0x0F0F0F0F;
        } else {
            const int sh = (s & 1) * 4;
            w0 = (r.q.x >> sh) & 0x0F0F0F0F;
            w1 = (r.q.y >> sh) & 0x0F0F0F0F;
        }
        // The scale bytes held in s0 (0..3), s1 (4..7), s2 (8..11).
        int sc, m;
        k4_scale_min(r.s0, r.s1, r.s2, s, sc, m);
        return make_float2(h2f((u16)r.dm) * (float)sc, -h2f((u16)(r.dm >> 16)) * (float)m);
    }
};
using R_Q4_K = R_Q4_Kt<false>;
using R_Q4_KN = R_Q4_Kt<true>;

// Q5_K in ggml's layout (N false) or repack.rs's (N true: vecdot.cuh's Q_Q5_Kt; qs word t
// and the unit's fifth-bit word make words 2t and 2t + 1).
template <bool N>
struct R_Q5_Kt {
    // R_Q4_K's head, the thread's 8 bytes of qs and of the fifth bits (bit s of each byte);
    // repacked: qs word t (q.x) and the unit's fifth-bit word (h.x).
    struct Raw { u32 dm, s0, s1, s2; uint2 q, h; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)(u >> 3) * 176;
        const int s = u & 7;
        // Aligned: super-blocks are 11·16 bytes, qh at 16, qs at 48.
        const u32* w = (const u32*)b;
        if constexpr (N)
            return Raw{w[0], w[1], w[2], w[3], make_uint2(*(const u32*)(b + 48 + 16 * s + 4 * t), 0u),
                       make_uint2(*(const u32*)(b + 16 + 4 * s), 0u)};
        return Raw{w[0], w[1], w[2], w[3], *(const uint2*)(b + 48 + 32 * (s >> 1) + 8 * t),
                   *(const uint2*)(b + 16 + 8 * t)};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int s = u & 7, sh = (s & 1) * 4;
        if constexpr (N) {
            w0 = (r.q.x & 0x0F0F0F0F) | (((r.h.x >> (2 * t)) & 0x01010101) << 4);
            w1 = ((r.q.x >> 4) & 0x0F0F0F0F) | (((r.h.x >> (2 * t + 1)) & 0x01010101) << 4);
        } else {
            w0 = ((r.q.x >> sh) & 0x0F0F0F0F) | (((r.h.x >> s) & 0x01010101) << 4);
            w1 = ((r.q.y >> sh) & 0x0F0F0F0F) | (((r.h.y >> s) & 0x01010101) << 4);
        }
        int sc, m;
        k4_scale_min(r.s0, r.s1, r.s2, s, sc, m);
        return make_float2(h2f((u16)r.dm) * (float)sc, -h2f((u16)(r.dm >> 16)) * (float)m);
    }
};
using R_Q5_K = R_Q5_Kt<false>;
using R_Q5_KN = R_Q5_Kt<true>;

// The per-16 formats (HALVES): `unpack` makes the thread's words and returns the row's
// scales of the unit's two halves (x, y) and, with MINS, their mins (z, w): a weight is
// scale·code − min.
struct R_Q6_K {
    static constexpr bool HALVES = true, MINS = false;
    // d, the unit's two int8 scales, the thread's 8 bytes of ql and of qh (2-byte aligned:
    // super-blocks are 210 bytes).
    struct Raw { u32 d, sc, l0, l1, h0, h1; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)(u >> 3) * 210;
        const int s = u & 7, n = s >> 2, k = s & 3;
        const u8* ql = b + 64 * n + 32 * (k & 1) + 8 * t;
        const u8* qh = b + 128 + 32 * n + 8 * t;
        return Raw{ld16(b + 208), ld16(b + 192 + 8 * n + 2 * k), ld32_2(ql), ld32_2(ql + 4),
                   ld32_2(qh), ld32_2(qh + 4)};
    }
    static __device__ __forceinline__ float4 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int k = u & 3, nsh = (k >> 1) * 4, hsh = 2 * k;
        // Six bits less 32: −32..31.
        w0 = sub_bytes(((r.l0 >> nsh) & 0x0F0F0F0F) | (((r.h0 >> hsh) & 0x03030303) << 4),
                       0x20202020);
        w1 = sub_bytes(((r.l1 >> nsh) & 0x0F0F0F0F) | (((r.h1 >> hsh) & 0x03030303) << 4),
                       0x20202020);
        const float d = h2f((u16)r.d);
        return make_float4(d * (float)(i8)(r.sc & 0xFF), d * (float)(i8)(r.sc >> 8), 0.f, 0.f);
    }
};

struct R_Q3_K {
    static constexpr bool HALVES = true, MINS = false;
    // d; the two bytes of the unit's scales' low nibbles (bits 0..15) and of their high
    // bits (16..31); the thread's 8 bytes of codes and of the high mask.
    struct Raw { u32 d, sc, q0, q1, m0, m1; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)(u >> 3) * 110;
        const int s = u & 7;
        // Scales 2s and 2s + 1 (dequant.cuh's scale_q3_k): low nibbles in bytes
        // 2(s % 4) and + 1 (the high nibbles from s = 4), high bits in bytes 8 + 2(s % 2)
        // and + 1.
        const u32 sc = (u32)ld16(b + 96 + 2 * (s & 3)) | ((u32)ld16(b + 104 + 2 * (s & 1)) << 16);
        const u8* q = b + 32 + 32 * (s >> 2) + 8 * t;
        return Raw{ld16(b + 108), sc, ld32_2(q), ld32_2(q + 4), ld32_2(b + 8 * t),
                   ld32_2(b + 8 * t + 4)};
    }
    static __device__ __forceinline__ float4 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int s = u & 7, sh = 2 * (s & 3);
        // Code 0..3 plus 4 where the high-mask bit is set, minus 4: −4..3.
        w0 = sub_bytes(((r.q0 >> sh) & 0x03030303) | (((r.m0 >> s) & 0x01010101) << 2),
                       0x04040404);
        w1 = sub_bytes(((r.q1 >> sh) & 0x03030303) | (((r.m1 >> s) & 0x01010101) << 2),
                       0x04040404);
        const int ls = 4 * (s >> 2), hs = 16 + 2 * (s >> 1);
        const int a = (int)(((r.sc >> ls) & 0xF) | (((r.sc >> hs) & 3) << 4)) - 32;
        const int b = (int)(((r.sc >> (ls + 8)) & 0xF) | (((r.sc >> (hs + 8)) & 3) << 4)) - 32;
        const float d = h2f((u16)r.d);
        return make_float4(d * (float)a, d * (float)b, 0.f, 0.f);
    }
};

struct R_Q2_K {
    static constexpr bool HALVES = true, MINS = true;
    // d and dmin, the unit's two scale bytes (scale low nibble, min high), the thread's 8
    // bytes of codes (4-byte aligned: super-blocks are 84 bytes).
    struct Raw { u32 dm, sc, q0, q1; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)(u >> 3) * 84;
        const int s = u & 7;
        const u8* q = b + 16 + 32 * (s >> 2) + 8 * t;
        return Raw{ld32_4(b + 80), ld16(b + 2 * s), ld32_4(q), ld32_4(q + 4)};
    }
    static __device__ __forceinline__ float4 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int sh = 2 * (u & 3);
        w0 = (r.q0 >> sh) & 0x03030303;
        w1 = (r.q1 >> sh) & 0x03030303;
        const float d = h2f((u16)r.dm), dmin = h2f((u16)(r.dm >> 16));
        return make_float4(d * (float)(r.sc & 0xF), d * (float)((r.sc >> 8) & 0xF),
                           dmin * (float)((r.sc >> 4) & 0xF), dmin * (float)(r.sc >> 12));
    }
};

struct R_Q1_0 {
    struct Raw { u32 d, bits; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)(u >> 2) * 18;
        // Byte t of the unit's 32 sign bits holds words 2t and 2t + 1 (a nibble each).
        return Raw{ld16(b), b[2 + 4 * (u & 3) + t]};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        // Bit i of a nibble to bit 8i as vecdot.cuh's Q_Q1_0. Σ ±x = 2·Σ_{bit set} x − Σ x.
        w0 = ((r.bits & 0xFu) * 0x00204081u) & 0x01010101u;
        w1 = ((r.bits >> 4) * 0x00204081u) & 0x01010101u;
        const float d = h2f((u16)r.d);
        return make_float2(2.f * d, -d);
    }
};

struct R_TQ2_0 {
    struct Raw { u32 d, v0, v1; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const u8* b = row + (i64)(u >> 3) * 66;
        const u8* q = b + 32 * ((u & 7) >> 2) + 8 * t;
        return Raw{ld16(b + 64), ld32_2(q), ld32_2(q + 4)};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int sh = 2 * (u & 3);
        // Codes 0..2 for −1..1: the −1 goes through d·Σq.
        w0 = (r.v0 >> sh) & 0x03030303;
        w1 = (r.v1 >> sh) & 0x03030303;
        const float d = h2f((u16)r.d);
        return make_float2(d, -d);
    }
};

// The repacked layouts (repack.rs; lowbit.cu's rp_body / rp_scale find a block's body and
// f16 scale in its 8-block group).
struct R_Q1_0R {
    struct Raw { u32 d; uint2 v; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const int b = u >> 2;
        // Activation words 2t and 2t + 1 of the unit are words 2(t % 2) and 2(t % 2) + 1 of
        // the block's bit-sliced body (repack.rs).
        const u8* g = row + (i64)(b >> 3) * (16 + 8 * 16);
        return Raw{ld16(g + 2 * (b & 7)), *(const uint2*)(rp_body<16>(row, b) + 8 * (t & 1))};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        // Unit u % 4's weights 4k..4k+3 are bit u % 4 + 4·(k / 4) of their word's bytes.
        const int sh = (u & 3) + 4 * (t >> 1);
        w0 = (r.v.x >> sh) & 0x01010101u;
        w1 = (r.v.y >> sh) & 0x01010101u;
        const float d = h2f((u16)r.d);
        return make_float2(2.f * d, -d);
    }
};

struct R_TQ2_0R {
    struct Raw { u32 d; uint2 v; };
    static __device__ __forceinline__ Raw load(const u8* row, int u, int t) {
        const int b = u >> 3;
        const u8* g = row + (i64)(b >> 3) * (16 + 8 * 64);
        const u8* q = rp_body<64>(row, b) + 32 * ((u & 7) >> 2) + 8 * t;
        return Raw{ld16(g + 2 * (b & 7)), *(const uint2*)q};
    }
    static __device__ __forceinline__ float2 unpack(const Raw& r, int u, int t, int& w0, int& w1) {
        const int sh = 2 * (u & 3);
        w0 = (r.v.x >> sh) & 0x03030303;
        w1 = (r.v.y >> sh) & 0x03030303;
        const float d = h2f((u16)r.d);
        return make_float2(d, -d);
    }
};

// The repacked Q1_0 / TQ2_0 again, a step of 4 units at a time (`mvrb_impl`): one scale per
// weight block, so a row's value is d·(A·code − 1) and a step adds
// d_w · (A · Σ_units d_x·c − Σ_units d_x·Σq) to the row's sum: per unit only the integer dot
// takes the unit's activation scale, the weight scale comes once per step. `load(row, s, t)`
// reads step s (units 4s..4s+3, within one block) where a row's groups (GROUP_BYTES each,
// GROUP_STEPS steps; what a K split or a chunk of the tile may cut) are `gp` bytes apart,
// `unpack(raw, j, t, w0, w1)` makes unit j's words 2t and 2t + 1 as R_ above (B_Q1_0R: 2^j times
// them, SLICED).
struct B_Q1_0R {
    static constexpr bool PER_UNIT = false;
    // Unit j's bytes are 2^j·bit (mvrb_step takes the 2^−j into the activation's scale).
    static constexpr bool SLICED = true;
    static constexpr float A = 2.f;
    static constexpr int GROUP_BYTES = 16 + 8 * 16, GROUP_STEPS = 8;
    struct Raw { uint2 v; u32 d; };
    static __device__ __forceinline__ Raw load(const u8* row, int s, int t, int gp) {
        // Step s is block s: the two words of its bit-sliced body (16-byte aligned) that hold
        // activation words 2t and 2t + 1 of every unit (R_Q1_0R), shifted so that unit j's
        // bits of them are bit j of every byte, and its scale.
        const u8* g = row + (i64)(s >> 3) * gp;
        const uint2 v = *(const uint2*)(g + 16 + 16 * (s & 7) + 8 * (t & 1));
        const int sh = 4 * (t >> 1);
        return Raw{make_uint2(v.x >> sh, v.y >> sh), ld16(g + 2 * (s & 7))};
    }
    // One immediate mask a word (j is known once unrolled), where a shift and a mask took the
    // bits down to bit 0.
    static __device__ __forceinline__ void unpack(const Raw& r, int j, int t, int& w0, int& w1) {
        w0 = r.v.x & (0x01010101u << j);
        w1 = r.v.y & (0x01010101u << j);
    }
};

struct B_TQ2_0R {
    static constexpr bool PER_UNIT = false, SLICED = false;
    static constexpr float A = 1.f;
    static constexpr int GROUP_BYTES = 16 + 8 * 64, GROUP_STEPS = 16;
    struct Raw { uint2 v; u32 d; };
    static __device__ __forceinline__ Raw load(const u8* row, int s, int t, int gp) {
        // Step s is half s % 2 of block s / 2: thread t's 8 bytes of that half's 32.
        const int b = s >> 1;
        const u8* g = row + (i64)(b >> 3) * gp;
        return Raw{*(const uint2*)(g + 16 + 64 * (b & 7) + 32 * (s & 1) + 8 * t),
                   ld16(g + 2 * (b & 7))};
    }
    static __device__ __forceinline__ void unpack(const Raw& r, int j, int t, int& w0, int& w1) {
        w0 = (r.v.x >> (2 * j)) & 0x03030303;
        w1 = (r.v.y >> (2 * j)) & 0x03030303;
    }
};

// Q4_K: a scale and a min per unit (PER_UNIT), so a step adds Σ_units (d·sc)·d_x·c − (dmin·m)·
// d_x·Σq, as R_Q4_K. Step s is half s % 2 of super-block s / 2 (sub-blocks 4(s % 2) ..
// + 3): the super-block's 16-byte head (d, dmin, 12 scale bytes) and, in ggml's layout (N
// false), thread t's 8 bytes of each of the half's two 32-byte qs runs (low nibbles: the even
// sub-block, high: the odd); in repack.rs's (N true), word t of each of the four units.
template <bool N>
struct B_Q4_Kt {
    static constexpr bool PER_UNIT = true, SLICED = false;
    static constexpr int GROUP_BYTES = 144, GROUP_STEPS = 2;
    // Repacked: q0 = units 0 and 1's words, q1 = units 2 and 3's.
    struct Raw { uint4 h; uint2 q0, q1; };
    static __device__ __forceinline__ Raw load(const u8* row, int s, int t, int gp) {
        const u8* b = row + (i64)(s >> 1) * gp;
        if constexpr (N) {
            const u32* q = (const u32*)(b + 16 + 64 * (s & 1) + 4 * t);
            return Raw{*(const uint4*)b, make_uint2(q[0], q[4]), make_uint2(q[8], q[12])};
        }
        const u8* q = b + 16 + 64 * (s & 1) + 8 * t;
        return Raw{*(const uint4*)b, *(const uint2*)q, *(const uint2*)(q + 32)};
    }
    static __device__ __forceinline__ void unpack(const Raw& r, int j, int t, int& w0, int& w1) {
        const uint2 q = j < 2 ? r.q0 : r.q1;
        if constexpr (N) {
            const u32 v = (j & 1) ? q.y : q.x;
            w0 = v & 0x0F0F0F0F;
            w1 = (v >> 4) & 0x0F0F0F0F;
        } else {
            w0 = (q.x >> (4 * (j & 1))) & 0x0F0F0F0F;
            w1 = (q.y >> (4 * (j & 1))) & 0x0F0F0F0F;
        }
    }
    // The step's four 6-bit scales and mins as floats (dequant.cuh's scale_min_k4, four
    // bytes at a time), d and dmin.
    static __device__ __forceinline__ void scales(const Raw& r, int s, float (&sc)[4],
                                                  float (&mn)[4], float& d, float& dmin) {
        u32 a, b;
        if ((s & 1) == 0) {
            a = r.h.y & 0x3F3F3F3F;
            b = r.h.z & 0x3F3F3F3F;
        } else {
            a = (r.h.w & 0x0F0F0F0F) | ((r.h.y >> 2) & 0x30303030);
            b = ((r.h.w >> 4) & 0x0F0F0F0F) | ((r.h.z >> 2) & 0x30303030);
        }
        // Byte j under the exponent of 2^23: the float 2^23 + byte, less 2^23.
#pragma unroll
        for (int j = 0; j < 4; j++) {
            sc[j] = __int_as_float(__byte_perm(a, 0x4B000000, 0x7540 | j)) - 8388608.f;
            mn[j] = __int_as_float(__byte_perm(b, 0x4B000000, 0x7540 | j)) - 8388608.f;
        }
        d = h2f((u16)r.h.x);
        dmin = h2f((u16)(r.h.x >> 16));
    }
};
using B_Q4_K = B_Q4_Kt<false>;
using B_Q4_KN = B_Q4_Kt<true>;

// The most parts `mvrt_*` splits K in (mod.rs MVRT_MAXP), and `mvrtg_4`'s leftover (its
// own bound: a larger one in every tile kernel moved their register allocations).
#define MVRT_MAXP 4
#define MVRTG_MAXP 8

// Where a K split's parts meet without a cluster (`p` null: in the cluster's rank 0): each
// block stores its sums at p[(tile block · parts + part) · MT · 128 ..] and counts at
// c[tile block]; the last to count adds the parts in rank order (the cluster's order, so
// the same bits) and puts the counter back to 0. The tile block is blockIdx.x / parts.
struct Ks {
    float* p;
    u32* c;
};

// Blocks an SM the 4-tile kernels (`mvrt_4`, `mvrc_4`) leave registers for: two (≤ 128 a
// thread; Q1_0's take 96–123). Three (≤ 80) spill 68–84 bytes on Q1_0 (ptxas 13.5) but
// would fit its 46 KB tiles three an SM; NEAGARI_CUDA_MVRT_MINB=N sets it for measuring.
#ifndef MVRT_MINB
#define MVRT_MINB 2
#endif

// Up to 8 warps a block split the units of the block's 16 weight rows (the host picks as
// many as the units fill, `mvr_warps`); they meet in shared memory at the end.
#define MVR_WARPS 8
// Units a warp takes a step (mvr_impl).
#define MVR_UNITS 4

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

// Whether a format struct has a scale per 16 values (its HALVES, false where it has none).
template <class F, class = void>
struct Halves {
    static constexpr bool v = false;
};
template <class F>
struct Halves<F, decltype(void(F::HALVES))> {
    static constexpr bool v = F::HALVES;
};

// Weight rows 16·blk .. 16·blk + 15 for nr ≤ 8 activation rows; `tile` is where row
// 16·blk is (in W, or its copy in shared memory: `mvrt`).
template <class F>
__device__ __forceinline__ void mvr_impl(const u8* __restrict__ tile, const i8* __restrict__ xq,
                                         const float2* __restrict__ xds, float* __restrict__ y,
                                         int rows, int units, i64 row_bytes, int nr, int blk) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blk * 16 + g, r1 = r0 + 8, last = rows - 1 - blk * 16;
    // Rows past the end re-read the last row (their sums are dropped).
    const u8* wa = tile + (i64)min(g, last) * row_bytes;
    const u8* wb = tile + (i64)min(g + 8, last) * row_bytes;
    // This thread's activation words (row g) and the scales of its output columns.
    const bool xin = g < nr;
    const int2* xr = (const int2*)(xq + (i64)(xin ? g : 0) * units * 32) + t;
    const int c0 = 2 * t, c1 = 2 * t + 1;
    const float2* s0 = xds + (i64)min(c0, nr - 1) * units;
    const float2* s1 = xds + (i64)min(c1, nr - 1) * units;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    // MVR_UNITS consecutive units a warp a step, every load issued before the first is
    // used: a unit of 16 rows is only 72 weight bytes in Q1_0, too few to wait for alone.
    for (int u0 = warp * MVR_UNITS; u0 < units; u0 += nw * MVR_UNITS) {
        typename F::Raw ra[MVR_UNITS], rb[MVR_UNITS];
        float2 e0[MVR_UNITS], e1[MVR_UNITS];
        int2 x[MVR_UNITS];
#pragma unroll
        for (int j = 0; j < MVR_UNITS; j++) {
            // Past the row's end: the last unit again, its sums scaled by 0 below (no
            // branch between the loads).
            const int u = min(u0 + j, units - 1);
            ra[j] = F::load(wa, u, t);
            rb[j] = F::load(wb, u, t);
            x[j] = __ldg(xr + (i64)u * 4);
            e0[j] = __ldg(s0 + u);
            e1[j] = __ldg(s1 + u);
        }
#pragma unroll
        for (int j = 0; j < MVR_UNITS; j++) {
            const int u = min(u0 + j, units - 1);
            const float keep = u0 + j < units ? 1.f : 0.f;
            int a[4];
            const int2 xv = xin ? x[j] : make_int2(0, 0);
            const float2 g0 = make_float2(e0[j].x * keep, e0[j].y * keep);
            const float2 g1 = make_float2(e1[j].x * keep, e1[j].y * keep);
            if constexpr (Halves<F>::v) {
                const float4 fa = F::unpack(ra[j], u, t, a[0], a[2]);
                const float4 fb = F::unpack(rb[j], u, t, a[1], a[3]);
                // The thread's words are in half t / 2: one mma a half, the other's zero.
                const bool h1 = t >= 2;
                int lo[4], hi[4];
#pragma unroll
                for (int k = 0; k < 4; k++) lo[k] = h1 ? 0 : a[k], hi[k] = h1 ? a[k] : 0;
                int c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
                mma_s8(c0, lo, xv.x, xv.y);
                mma_s8(c1, hi, xv.x, xv.y);
                acc[0] += g0.x * (fa.x * (float)c0[0] + fa.y * (float)c1[0]);
                acc[1] += g1.x * (fa.x * (float)c0[1] + fa.y * (float)c1[1]);
                acc[2] += g0.x * (fb.x * (float)c0[2] + fb.y * (float)c1[2]);
                acc[3] += g1.x * (fb.x * (float)c0[3] + fb.y * (float)c1[3]);
                if constexpr (F::MINS) {
                    // Each half's Σq of columns 2t, 2t + 1: ones as weight row g in half 0
                    // (sums in c[0], c[1]) and as row g + 8 in half 1 (c[2], c[3]).
                    const int o0 = h1 ? 0 : 0x01010101, o1 = h1 ? 0x01010101 : 0;
                    const int ones[4] = {o0, o1, o0, o1};
                    int c[4] = {0, 0, 0, 0};
                    mma_s8(c, ones, xv.x, xv.y);
                    acc[0] -= g0.x * (fa.z * (float)c[0] + fa.w * (float)c[2]);
                    acc[1] -= g1.x * (fa.z * (float)c[1] + fa.w * (float)c[3]);
                    acc[2] -= g0.x * (fb.z * (float)c[0] + fb.w * (float)c[2]);
                    acc[3] -= g1.x * (fb.z * (float)c[1] + fb.w * (float)c[3]);
                }
            } else {
                const float2 fa = F::unpack(ra[j], u, t, a[0], a[2]);
                const float2 fb = F::unpack(rb[j], u, t, a[1], a[3]);
                int c[4] = {0, 0, 0, 0};
                mma_s8(c, a, xv.x, xv.y);
                acc[0] += fa.x * g0.x * (float)c[0] + fa.y * g0.y;
                acc[1] += fa.x * g1.x * (float)c[1] + fa.y * g1.y;
                acc[2] += fb.x * g0.x * (float)c[2] + fb.y * g0.y;
                acc[3] += fb.x * g1.x * (float)c[3] + fb.y * g1.y;
            }
        }
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
    gdc_wait();
    mvr_impl<FMTR>(W + (i64)blockIdx.x * 16 * row_bytes, xq, xds, y, rows, units, row_bytes, nr,
                   blockIdx.x);
}

// The same over up to four matrices of one format and width (MAT4_PARAMS).
extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32)
    mvrm(MAT4_PARAMS, const i8* xq, const float2* xds, int units, i64 row_bytes, int nr) {
    const Mat4 p = MAT4_PICK(blockIdx.x);
    gdc_wait();
    mvr_impl<FMTR>(p.W + (i64)p.b * 16 * row_bytes, xq, xds, p.y, p.rows, units, row_bytes, nr,
                   p.b);
}

// The repacked formats (FMTB, their B_ struct): the block-scaled GEMV, its tile by bulk copy.
#ifdef FMTB

// `mvr_impl` for the block-scaled formats (B_ above) over MT tiles of 16 weight rows: a
// warp takes a step of 4 units (one weight scale) at a time, with no tail (rows are whole
// blocks: 4 or 8 units), and each activation fragment it loads serves MT tiles. With one
// tile a block (MT = 1) the eight rows' activations went through L1 once per 16 weight rows,
// 4.4 times the weight bytes: ncu gave the 27B Q1_0 gate/up L1 89% busy at 0.41 TB/s. Per
// unit and tile: the unpack, the mma and a multiply-add a sum; the scales once a step.
//
// A K split (`parts` > 1, a cluster of that many blocks, `part` this block's rank): the
// tile and xq / xds start at the part's first unit, `pu` units of it; `units` stays the
// activation rows' length. The parts' sums meet in the cluster's rank 0, added in rank
// order.
//
// The tile's row r, group q is at tile + r·stride + q·gp. CH (chunked, `mvrc`): group q of
// every row lands by itself, on bars[q], and a warp waits for a step's group before its
// loads.
// One step of `mvrb_impl` (units 4s..4s+3 of the rows; `s` as F::load counts it) on its MT
// tiles: x the thread's activation words of the step's units, (d0, y0) / (d1, y1) the
// (d, d·Σq) of its output columns, q0 / q1 their sums over the step.
template <class F, int MT>
__device__ __forceinline__ void mvrb_step(float (&acc)[MT][4], const u8* __restrict__ tile,
                                          int stride, int gp, int s, int last, int g, int t,
                                          const int2 (&x)[4], const float (&d0)[4],
                                          const float (&d1)[4], const float (&y0)[4],
                                          const float (&y1)[4], float q0, float q1) {
#pragma unroll
    for (int i = 0; i < MT; i++) {
        // Rows past the end re-read the last row (their sums are dropped).
        const typename F::Raw ra = F::load(tile + (i64)min(16 * i + g, last) * stride, s, t, gp);
        const typename F::Raw rb =
            F::load(tile + (i64)min(16 * i + g + 8, last) * stride, s, t, gp);
        float m[4] = {0.f, 0.f, 0.f, 0.f};
        // PER_UNIT: the mins' Σ_units m·d_x·Σq.
        float n[4] = {0.f, 0.f, 0.f, 0.f};
        float sa[4], ma[4], sb[4], mb[4], da, dma, db, dmb;
        if constexpr (F::PER_UNIT) {
            F::scales(ra, s, sa, ma, da, dma);
            F::scales(rb, s, sb, mb, db, dmb);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int a[4];
            F::unpack(ra, j, t, a[0], a[2]);
            F::unpack(rb, j, t, a[1], a[3]);
            // The sums start at 1.5·2^23, so their bits are the float 1.5·2^23 + Σ
            // (|Σ| ≤ 32·15·127 < 2^22) and one subtraction makes Σ exact: a float add
            // instead of an int→float conversion (a quarter-rate pipe, 4 a unit).
            int c[4] = {SUM_K, SUM_K, SUM_K, SUM_K};
            mma_s8(c, a, x[j].x, x[j].y);
            float v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = __int_as_float(c[k]) - 12582912.f;
            if constexpr (F::PER_UNIT) {
                m[0] += sa[j] * d0[j] * v[0];
                m[1] += sa[j] * d1[j] * v[1];
                m[2] += sb[j] * d0[j] * v[2];
                m[3] += sb[j] * d1[j] * v[3];
                n[0] += ma[j] * y0[j];
                n[1] += ma[j] * y1[j];
                n[2] += mb[j] * y0[j];
                n[3] += mb[j] * y1[j];
            } else {
                // SLICED: the sums are 2^j times over; 2^−j on the activation's d gives the
                // same products (exact scalings), so the same bits.
                const float e0 = F::SLICED ? d0[j] * (1.f / (float)(1 << j)) : d0[j];
                const float e1 = F::SLICED ? d1[j] * (1.f / (float)(1 << j)) : d1[j];
                m[0] += e0 * v[0];
                m[1] += e1 * v[1];
                m[2] += e0 * v[2];
                m[3] += e1 * v[3];
            }
        }
        if constexpr (F::PER_UNIT) {
            acc[i][0] += da * m[0] - dma * n[0];
            acc[i][1] += da * m[1] - dma * n[1];
            acc[i][2] += db * m[2] - dmb * n[2];
            acc[i][3] += db * m[3] - dmb * n[3];
        } else {
            const float wa = h2f((u16)ra.d), wb = h2f((u16)rb.d);
            // A·m − q in one rounding: with A = 2, ptxas made it m + m (exact), then − q,
            // so the fused form is the same bits and one instruction fewer an output.
            acc[i][0] += wa * __fmaf_rn(F::A, m[0], -q0);
            acc[i][1] += wa * __fmaf_rn(F::A, m[1], -q1);
            acc[i][2] += wb * __fmaf_rn(F::A, m[2], -q0);
            acc[i][3] += wb * __fmaf_rn(F::A, m[3], -q1);
        }
    }
}

// The step's activation scales as `mvrb_step` takes them: (d, d·Σq) of units 4s .. 4s + 3
// of columns c0 and c1 (two units a 16-byte load each, a, b), and the block-scaled sums.
struct MvrbScales {
    float d0[4], d1[4], y0[4], y1[4], q0, q1;
    __device__ __forceinline__ MvrbScales(float4 e0a, float4 e0b, float4 e1a, float4 e1b)
        : d0{e0a.x, e0a.z, e0b.x, e0b.z},
          d1{e1a.x, e1a.z, e1b.x, e1b.z},
          y0{e0a.y, e0a.w, e0b.y, e0b.w},
          y1{e1a.y, e1a.w, e1b.y, e1b.w},
          q0((y0[0] + y0[1]) + (y0[2] + y0[3])),
          q1((y1[0] + y1[1]) + (y1[2] + y1[3])) {}
};

// A thread's activations as `mvrb_step` takes them, from its warp's first step (`warp`) on,
// `nw` warps taking the steps in turn. Column g of B is activation row g (rows past nr
// re-read the last; those columns' sums are dropped); the scales are those of this
// thread's output columns 2t and 2t + 1, two units a 16-byte load (units is a multiple of
// 4). `xq`, `xds`: the part's first unit.
struct MvrbAct {
    const int2* xr;
    const float4 *s0, *s1;
    __device__ __forceinline__ MvrbAct(const i8* __restrict__ xq, const float2* __restrict__ xds,
                                       int units, int nr, int g, int t, int warp)
        : xr((const int2*)(xq + (i64)min(g, nr - 1) * units * 32) + t + 16 * warp),
          s0((const float4*)(xds + (i64)min(2 * t, nr - 1) * units) + 2 * warp),
          s1((const float4*)(xds + (i64)min(2 * t + 1, nr - 1) * units) + 2 * warp) {}
    // This step's words and scales.
    __device__ __forceinline__ MvrbScales load(int2 (&x)[4]) const {
#pragma unroll
        for (int j = 0; j < 4; j++) x[j] = __ldg(xr + 4 * j);
        return MvrbScales(__ldg(s0), __ldg(s0 + 1), __ldg(s1), __ldg(s1 + 1));
    }
    // On to the warp's next step.
    __device__ __forceinline__ void next(int nw) { xr += 16 * nw, s0 += 2 * nw, s1 += 2 * nw; }
};

// A K split's meeting: part q's sum k of tile i is ld(i, k, q); warp w adds tiles w, w + nw,
// …, every part's four sums asked for before the first is added (one at a time they were
// 4·parts distributed-memory round trips), then added in rank order, and stores them to y.
template <int MT, int MAXP, class Ld>
__device__ __forceinline__ void mvrb_parts_sum(Ld ld, float* __restrict__ y, int rows, int nr,
                                               int base, int parts, int warp, int nw) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = warp; i < MT; i += nw) {
        float b[4][MAXP];
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int q = 0; q < MAXP; q++) b[k][q] = q < parts ? ld(i, k, q) : 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float v = 0.f;
#pragma unroll
            for (int q = 0; q < MAXP; q++)
                if (q < parts) v += b[k][q];
            const int r = base + 16 * i + g + (k < 2 ? 0 : 8), c = 2 * t + (k & 1);
            if (r < rows && c < nr) y[(i64)c * rows + r] = v;
        }
    }
}

// The end of `mvrb_impl`: warp `warp` of `nw` holds its sums of the block's MT tiles in
// `acc`; they meet in shared memory in warp order and go to y. With K split, the parts'
// sums then meet in the cluster's rank 0 or, with `ks`, through global memory
// (`mvrb_parts_sum` either way, so the same bits). `sync` is the block's barrier of those
// nw warps (at most NW). With `scale` (K whole, parts = 1: a norm finished here,
// `mvr_norm_inv`) row c's sums are scaled by scale[c]. Returns whether this block wrote
// the sums to y (K whole, or the part that added the others'). At most MAXP parts.
//
// With an epilogue `epi` (Epi::on; `mvrtg_4`'s GLU, K whole) the warps' sums are not added
// here: after the barrier, epi(red) reads them itself, from the padded layout below (tile
// stride 133, sum stride 33 floats, so a warp reading one activation row's 32 outputs
// meets no bank twice), and mvrb_finish returns true.
struct NoEpi {
    static constexpr bool on = false;
    __device__ __forceinline__ void operator()(const float*) const {}
};
// `red`: warp w's sum k of tile i at lane, [w][i][k][lane]; padded (Epi::on) a tile is 133
// floats and its sums 33 apart.
template <int NW, int MT, bool PAD>
struct Red {
    float v[NW][MT][4][32];
    __device__ __forceinline__ float& at(int w, int i, int k, int lane) { return v[w][i][k][lane]; }
};
template <int NW, int MT>
struct Red<NW, MT, true> {
    static constexpr int TILE = 133, SUM = 33;
    float v[NW][MT][TILE];
    __device__ __forceinline__ float& at(int w, int i, int k, int lane) { return v[w][i][k * SUM + lane]; }
};
template <int MT, class Sync, int NW = MVR_WARPS, int MAXP = MVRT_MAXP, class Epi = NoEpi>
__device__ __forceinline__ bool mvrb_finish(const float (&acc)[MT][4], float* __restrict__ y,
                                            int rows, int nr, int base, int part, int parts,
                                            int warp, int nw, Sync sync, Ks ks,
                                            const float* scale = nullptr, Epi epi = Epi{}) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    constexpr bool PAD = Epi::on;
    __shared__ Red<NW, MT, PAD> red;
    // The block's sums when K is split in a cluster: read by its rank 0.
    __shared__ float psum[MT][4][32];
    // The tile block's parts' sums, [parts, MT, 4, 32], when they meet through ks.
    const int tb = blockIdx.x / parts;
    float* kp = ks.p ? ks.p + (i64)tb * parts * MT * 128 : nullptr;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) red.at(warp, i, k, lane) = acc[i][k];
    sync();
    if constexpr (Epi::on) {
        if (parts == 1) {
            epi(&red.v[0][0][0]);
            return true;
        }
    }
    // Warp w sums tiles w, w + nw, …, in warp order: the result does not depend on timing.
    for (int i = warp; i < MT; i += nw) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float v = 0.f;
            for (int w = 0; w < nw; w++) v += red.at(w, i, k, lane);
            const int r = base + 16 * i + g + (k < 2 ? 0 : 8), c = 2 * t + (k & 1);
            if (parts > 1 && ks.p) kp[(part * MT + i) * 128 + k * 32 + lane] = v;
            else if (parts > 1) psum[i][k][lane] = v;
            else if (r < rows && c < nr) y[(i64)c * rows + r] = scale ? v * scale[c] : v;
        }
    }
    if (parts == 1) return true;
    if (ks.p) {
        __shared__ int last;
        // The block's sums are stored, and visible device-wide, before it counts.
        __threadfence();
        sync();
        if (threadIdx.x == 0) last = atomicAdd(&ks.c[tb], 1u) == (u32)(parts - 1);
        sync();
        if (!last) return false;
        // The other parts' sums are read after their counts, past L1.
        __threadfence();
        mvrb_parts_sum<MT, MAXP>(
            [&](int i, int k, int q) { return __ldcg(kp + (q * MT + i) * 128 + k * 32 + lane); },
            y, rows, nr, base, parts, warp, nw);
        if (threadIdx.x == 0) ks.c[tb] = 0;
        return true;
    }
#if __CUDA_ARCH__ >= 900
    // Every part's psum is written and visible cluster-wide after this.
    cluster_sync();
    if (part == 0)
        mvrb_parts_sum<MT, MAXP>(
            [&](int i, int k, int q) { return ld_cluster(&psum[i][k][lane], q); }, y, rows, nr,
            base, parts, warp, nw);
    // No block leaves while rank 0 still reads its psum.
    cluster_sync();
#endif
    return part == 0;
}

// The decode rows' RMSNorm finished in the tensor-core GEMV (cuda/norm.rs `norm_matmul_op`,
// 3–8 rows; common.cuh's Nrm: add_norm_part left x, the parts and the q8_1 of x·w): warp 0
// copies the rows' parts (nr·np ≤ 64, row c's part b at c·np + b) into shared memory once
// the kernel before is done (in registers through the loop, they spilled); after the loop,
// lane c adds row c's parts in block order (so add_rms_norm_cl's total and 1/rms,
// nrm_scale's arithmetic) into inv[c], which the warps read after mvrb_finish's first
// barrier (its `scale`). Then each warp writes pairs (row c, unit u) of the normed rows
// (`mvr_norm_out`), the grid's warps in turn. In the ring (`mvrq_impl`) the compute warps do
// this, not the producer warp (with the norm on its idle lanes, its copies waited behind
// it: the 27B Q4_K 8-row step 8.81 → 10.05 ms, H100).
// The rows' parts a block copies (nr·np, at most the host's NORM_ROW_BLOCKS).
#define NRM_PARTS 64
__device__ __forceinline__ void mvr_norm_load(const Nrm& n, int nr, int lane, double* ps) {
    for (int i = lane; i < nr * n.np; i += 32) ps[i] = n.part[i];
}
__device__ __forceinline__ void mvr_norm_inv(const Nrm& n, int nr, int lane, const double* ps,
                                              float* inv) {
    __syncwarp();
    if (lane >= nr) return;
    double t = 0.0;
    for (int b = 0; b < n.np; b++) t += ps[lane * n.np + b];
    const float mean = (float)(t / (double)n.g);
    inv[lane] = 1.0f / sqrtf(mean + n.eps);
}
__device__ __forceinline__ void mvr_norm_out(const Nrm& n, int nr, int lane, int warp, int nw,
                                              const float* inv) {
    const int units = n.g >> 5;
    for (int q = blockIdx.x * nw + warp; q < nr * units; q += gridDim.x * nw) {
        const int c = q / units, o = (q - c * units) * 32 + lane;
        const i64 at = (i64)c * n.g + o;
        n.out[at] = n.x[at] * inv[c] * n.w[o];
    }
}

// Nothing before mvrb_impl's finish (its default hook).
struct NoPre {
    __device__ __forceinline__ void operator()() const {}
};

template <class F, int MT, bool CH = false, class Pre = NoPre, int NW = MVR_WARPS,
          int MAXP = MVRT_MAXP, class Epi = NoEpi>
__device__ __forceinline__ bool mvrb_impl(const u8* __restrict__ tile, const i8* __restrict__ xq,
                                          const float2* __restrict__ xds, float* __restrict__ y,
                                          int rows, int units, int pu, int stride, int gp, u64* bars,
                                          int nr, int blk, int part, int parts, Ks ks = Ks{},
                                          const float* scale = nullptr, Pre pre = Pre{},
                                          Epi epi = Epi{}) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int base = blk * 16 * MT, last = rows - 1 - base;
    MvrbAct a(xq, xds, units, nr, g, t, warp);
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const int steps = pu >> 2;
    for (int s = warp; s < steps; s += nw, a.next(nw)) {
        int2 x[4];
        const MvrbScales e = a.load(x);
        if constexpr (CH) mbar_wait(&bars[s / F::GROUP_STEPS], 0);
        mvrb_step<F, MT>(acc, tile, stride, gp, s, last, g, t, x, e.d0, e.d1, e.y0, e.y1, e.q0,
                         e.q1);
    }
    pre();
    const auto sync = [] { __syncthreads(); };
    return mvrb_finish<MT, decltype(sync), NW, MAXP, Epi>(acc, y, rows, nr, base, part, parts,
                                                          warp, nw, sync, ks, scale, epi);
}

// Bytes between two rows of a tile in shared memory: the row's, plus 16 where that is an
// even number of 16-byte words, so the 8 rows a warp reads at once start in 8 different
// 16-byte bank groups (Q4_K's 2,880-byte rows put rows g and g + 2 in the same banks).
// The host sizes the tile the same way (matmul.rs `mvr_tma`).
__device__ __forceinline__ int mvrt_stride(i64 row_bytes) {
    return (int)row_bytes + ((row_bytes >> 4) & 1 ? 0 : 16);
}

// `mvrb_impl` with the block's MT·16 weight rows (of its part of K: `part_units` units,
// `part_bytes` bytes a row, the last part what is left) brought into shared memory by bulk
// copies (sm_90+; one a row where rows are padded or split, by the lanes of warp 0) before
// the wait: `mvr`
// keeps about one unit of its rows in flight a warp (ptxas puts each unit's loads just
// before its mma), and ncu gave the 27B Q1_0 gate/up (25 MB, 2,176 blocks of 16 rows) 78.6
// µs alone, 0.32 TB/s. Here a block's whole tile is asked for at once (at most the host's
// cap) and the warps then read it from shared memory. Dynamic shared memory: the tile, MT·16
// rows of `mvrt_stride(part_bytes)` (part_bytes a multiple of 16, W 16-byte aligned).
// `wait` is the kernel's gdc_wait, called once the copies are asked for. At most NW warps.
// `pf`: the DeltaNet state the kernel after reads, asked into L2 once the tile has landed
// (gemv_stream.cu's mvs_impl says why).
template <class F, int MT, int NW = MVR_WARPS, class Wait>
__device__ __forceinline__ void mvrt_impl(const u8* __restrict__ W, const i8* __restrict__ xq,
                                          const float2* __restrict__ xds, float* __restrict__ y,
                                          int rows, int units, i64 row_bytes, int nr, int blk,
                                          int parts, int part_units, int part_bytes, Ks ks,
                                          Wait wait, const Nrm& nrm, const Pf& pf = Pf{}) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 sm[];
    __shared__ u64 bar;
    // With a norm (nrm.part set, parts = 1): the rows' parts and 1/rms (mvr_norm_*).
    __shared__ double parts_s[NRM_PARTS];
    __shared__ float inv_rms[8];
    const bool norm = nrm.part != nullptr;
    const int part = parts > 1 ? (int)(blockIdx.x % parts) : 0;
    const int u0 = part * part_units, pu = min(part_units, units - u0);
    const int pbytes = part + 1 < parts ? part_bytes : (int)row_bytes - part * part_bytes;
    const int stride = mvrt_stride(part_bytes), n = min(16 * MT, rows - blk * 16 * MT);
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) {
            mbar_init(&bar);
            mbar_init_fence();
            mbar_expect(&bar, (u32)(n * pbytes));
        }
        // The expected bytes are set before any copy can land.
        __syncwarp();
        const u8* src = W + (i64)blk * 16 * MT * row_bytes + (i64)part * part_bytes;
        // Whole unpadded rows: one copy (64 copies of Q1_0's 720-byte rows made the 27B's
        // gate/up 24.1 → 28.5 µs).
        if (stride == row_bytes) {
            if (threadIdx.x == 0) bulk_load(sm, src, (u32)(n * row_bytes), &bar);
        } else {
            for (int r = threadIdx.x; r < n; r += 32)
                bulk_load(sm + r * stride, src + r * row_bytes, (u32)pbytes, &bar);
        }
    }
    // The barrier is initialised before any thread waits on it.
    __syncthreads();
    wait();
    const int lane = threadIdx.x & 31;
    if (norm && threadIdx.x < 32) mvr_norm_load(nrm, nr, lane, parts_s);
    mbar_wait(&bar, 0);
    pf_issue(pf);
    const auto pre = [&] {
        if (norm && threadIdx.x < 32) mvr_norm_inv(nrm, nr, lane, parts_s, inv_rms);
    };
    mvrb_impl<F, MT, false, decltype(pre), NW>(sm, xq + u0 * 32, xds + u0, y, rows, units, pu,
                                               stride, F::GROUP_BYTES, nullptr, nr, blk, part,
                                               parts, ks, norm ? inv_rms : nullptr, pre);
    if (norm) mvr_norm_out(nrm, nr, lane, threadIdx.x >> 5, blockDim.x >> 5, inv_rms);
#else
    // The host runs these kernels only on sm_90 and newer (CudaBackend::mvrt_mt).
    __trap();
#endif
}

// mvrt_<MT>: one matrix, MT tiles of 16 rows a block; mvrmt_<MT>: up to four matrices of one
// format and width (MAT4_PARAMS, blocks counted in MT-tile blocks). With K split in
// `parts` (launched as clusters of that many blocks), block b·parts + p takes part p of
// tile block b. `mvrmt` finishes a norm with `nrm` (K whole; `mvr_norm_*`).
#define MVRT(MT, MINB)                                                                             \
    extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32, MINB)                        \
        mvrt_##MT(const u8* W, const i8* xq, const float2* xds, float* y, int rows, int units, \
                  i64 row_bytes, int nr, int parts, int part_units, int part_bytes, Ks ks) {   \
        mvrt_impl<FMTB, MT>(W, xq, xds, y, rows, units, row_bytes, nr, blockIdx.x / parts,     \
                            parts, part_units, part_bytes, ks, [] { gdc_wait(); }, Nrm{});   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32, MINB)                        \
        mvrmt_##MT(MAT4_PARAMS, const i8* xq, const float2* xds, int units, i64 row_bytes,     \
                   int nr, int parts, int part_units, int part_bytes, Ks ks, Nrm nrm,          \
                   Pf pf) {                                                                    \
        const Mat4 p = MAT4_PICK(blockIdx.x / parts);                                          \
        mvrt_impl<FMTB, MT>(p.W, xq, xds, p.y, p.rows, units, row_bytes, nr, p.b, parts,       \
                            part_units, part_bytes, ks, [] { gdc_wait(); }, nrm, pf);          \
    }
MVRT(1, 3)
MVRT(2, 2)
MVRT(4, MVRT_MINB)

// mvrt_4w: `mvrt_4` with twice the warps, each taking half the steps of K, for a matrix
// whose grid leaves SMs without a block. The 27B Q1_0 8-row ssm_out (80 blocks on 132 SMs)
// is bound by each warp's chain of ~2,400 instructions at 7 cycles apart (ncu, H100): alone
// 12.67 → 11.85 µs, the 8-row greedy step 5.16 → 5.09 ms; half the tiles a block instead
// (160 blocks) was slower (13.33 µs). The warps' sums meet in another order than
// `mvrt_4`'s: not the same bits.
extern "C" __global__ void __launch_bounds__(2 * MVR_WARPS * 32, 1)
    mvrt_4w(const u8* W, const i8* xq, const float2* xds, float* y, int rows, int units,
            i64 row_bytes, int nr, int parts, int part_units, int part_bytes, Ks ks) {
    mvrt_impl<FMTB, 4, 2 * MVR_WARPS>(W, xq, xds, y, rows, units, row_bytes, nr,
                                      blockIdx.x / parts, parts, part_units, part_bytes, ks,
                                      [] { gdc_wait(); }, Nrm{});
}

// `matmul_glu` of 3–8 rows on `mvrt_4`'s tile: tile block b's 64 rows are gate rows 32b ..
// +31, then the same rows of up (one bulk copy each), so the block ends with both sums of
// each of its 32 outputs and writes g = act(gate)·up, u = up and g's q8_1 (oq, ods: its 32
// outputs are one unit of each activation row) — the separate ops' sums (the same
// `mvrb_impl` per row) and `glu_*_q`'s arithmetic, one launch instead of two. Rows a
// multiple of 32 (the host's condition); g, u [nr, rows].
//
// A block takes tile blocks blockIdx.x, + gridDim.x, …: the host caps the grid at two
// blocks an SM (mod.rs glu_loop) and, with `bufs` = 2 (two tiles of dynamic shared memory),
// the next tile's copy is in flight while the block computes the current one: the 27B's
// 544 tile blocks are 2.06 waves at two blocks an SM, and each block's compute waited
// for its whole tile first (ncu: 15–19% of the warp samples at that wait). 27B Q1_0 8-row
// greedy step 5.55–5.58 → 5.38–5.43 ms (H200). Giving the 16 tile blocks past two whole
// rounds out as 64 quarter tiles (8 + 8 rows, the last of a unit's four quantizing it)
// instead: 5.57 ms. With `nrm` it finishes the norm before it (`mvr_norm_*`: gate and up
// sums scaled by 1/rms before the GLU).
// With `parts` > 1 (fused.rs `glu_split`, NEAGARI_CUDA_GLU_SPLIT) the tile blocks left past
// the whole rounds go out in parts of K instead, a part a block: each copies its groups of
// the 64 rows and stores its sums to `ks`, and the last of a tile block's parts adds them
// in part order (mvrb_finish) and applies the GLU, so a leftover costs a part's copy and
// steps rather than a whole tile's.
//
// A tile block with K whole ends in `GluEpi` (mvrb_finish's `epi`) where ON: warp c adds
// activation row c's gate and up sums from the warps' `red` itself, lane l output l (gate
// row l: tile l / 16, its row l % 16; up: two tiles on), and applies the GLU, so the sums
// skip `ys` and the barrier after it. The same sums in the same order as mvrb_finish's, so
// the same bits; the 27B's 8-row greedy step 5.11 → 5.05 ms on Q1_0, 7.34 → 7.21 on TQ2_0
// (H100). ON for the formats with one scale a block: Q4_K's kernel (128 registers before)
// spilled 20 bytes with it.
template <bool ON>
struct GluEpi {
    static constexpr bool on = ON;
    float *g, *u;
    i8* oq;
    float2* ods;
    const float* inv;
    int rows, nr, blk, act;
    // red: mvrb_finish's padded `Red` of mvrtg_4's 8 warps and 4 tiles.
    __device__ __forceinline__ void operator()(const float* red) const {
        using R = Red<MVR_WARPS, 4, true>;
        const int lane = threadIdx.x & 31, c = threadIdx.x >> 5;
        if (c >= nr) return;
        const int i = lane >> 4, r = lane & 15, k = 2 * (r >> 3) + (c & 1);
        const int at0 = 4 * (r & 7) + (c >> 1);
        float gv = 0.f, uv = 0.f;
#pragma unroll
        for (int w = 0; w < MVR_WARPS; w++) {
            gv += red[(w * 4 + i) * R::TILE + k * R::SUM + at0];
            uv += red[(w * 4 + i + 2) * R::TILE + k * R::SUM + at0];
        }
        if (inv) gv *= inv[c], uv *= inv[c];
        const i64 at = (i64)c * rows + blk * 32 + lane;
        const float h = glu_act_mul(gv, uv, act);
        g[at] = h;
        u[at] = uv;
        if (oq) q8_1_warp(h, oq, ods, at >> 5, lane);
    }
};

extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32, MVRT_MINB)
    mvrtg_4(const u8* wg, const u8* wu, const i8* xq, const float2* xds, float* g, float* u,
            int rows, int units, i64 row_bytes, int nr, int act, i8* oq, float2* ods, int bufs,
            Nrm nrm, int parts, Ks ks) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 sm[];
    __shared__ u64 bar[2];
    // With a norm (nrm.part set): the rows' parts and 1/rms (mvr_norm_*), 1/rms once.
    __shared__ double parts_s[NRM_PARTS];
    __shared__ float inv_rms[8];
    const bool norm = nrm.part != nullptr;
    // The block's sums: activation row c's gate rows at [c][0, 32), up rows at [c][32, 64).
    __shared__ float ys[8][64];
    const int stride = mvrt_stride(row_bytes), nblk = rows / 32, tile = 64 * stride;
    // R rounds of whole tile blocks, then the L left over: whole, by the first L blocks, or
    // with `parts` > 1 (the host keeps L·parts within the grid and every part some groups)
    // in parts of K by the first L·parts blocks, which meet through `ks` (mvrb_finish).
    const int G = gridDim.x, R = nblk / G, L = nblk - R * G;
    const bool split = parts > 1 && L > 0;
    constexpr int GB = FMTB::GROUP_BYTES, GU = FMTB::GROUP_STEPS * 4;
    const int groups = (int)(row_bytes / GB), per = (groups + parts - 1) / parts;
    // This block's item i: tile block blk (< 0: none) and its part p (< 0: K whole).
    auto item = [&](int i, int& blk, int& p) {
        const int b = blockIdx.x;
        p = -1;
        blk = i < R ? b + i * G : i == R && !split && b < L ? b + R * G : -1;
        if (i == R && split && b < L * parts) blk = R * G + b / parts, p = b % parts;
    };
    // Part p's first group, groups and bytes a row, and its rows' stride in shared memory.
    auto part_of = [&](int p, int& g0, int& ng, int& pb, int& st) {
        g0 = p < 0 ? 0 : p * per;
        ng = p < 0 ? groups : min(groups, g0 + per) - g0;
        pb = p < 0 ? (int)row_bytes : ng * GB;
        st = p < 0 ? stride : mvrt_stride(pb);
    };
    // Warp 0: tile block `blk`'s 64 rows (of part p) into buffer `b`.
    auto fetch = [&](int blk, int p, int b) {
        int g0, ng, pb, st;
        part_of(p, g0, ng, pb, st);
        if (threadIdx.x == 0) mbar_expect(&bar[b], (u32)(64 * pb));
        // The expected bytes are set before any copy can land.
        __syncwarp();
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const u8* src = (m ? wu : wg) + (i64)blk * 32 * row_bytes + (i64)g0 * GB;
            u8* dst = sm + b * tile + m * 32 * st;
            if (p < 0 && stride == row_bytes) {
                if (threadIdx.x == 0) bulk_load(dst, src, (u32)(32 * row_bytes), &bar[b]);
            } else {
                bulk_load(dst + threadIdx.x * st, src + threadIdx.x * row_bytes, (u32)pb,
                          &bar[b]);
            }
        }
    };
    if (threadIdx.x == 0) {
        mbar_init(&bar[0]);
        mbar_init(&bar[1]);
        mbar_init_fence();
    }
    // The barriers are initialised before any thread waits on them.
    __syncthreads();
    int blk, p;
    item(0, blk, p);
    // The weights do not depend on the kernel before (the host keeps the grid ≤ nblk).
    if (threadIdx.x < 32) fetch(blk, p, 0);
    gdc_wait();
    const int lane = threadIdx.x & 31, c = threadIdx.x >> 5;
    if (norm && threadIdx.x < 32) mvr_norm_load(nrm, nr, lane, parts_s);
    for (int i = 0; blk >= 0; i++) {
        int nblk2, np;
        item(i + 1, nblk2, np);
        const int b = bufs > 1 ? i & 1 : 0;
        const u32 phase = (u32)((bufs > 1 ? i >> 1 : i) & 1);
        // Buffer b ^ 1 was last read in the previous round, which ended in a barrier.
        if (bufs > 1 && nblk2 >= 0 && threadIdx.x < 32) fetch(nblk2, np, b ^ 1);
        mbar_wait(&bar[b], phase);
        int g0, ng, pb, st;
        part_of(p, g0, ng, pb, st);
        // A part's units; K whole takes them all (TQ2_0's 5,120-wide rows are 2.5 groups).
        const int u0 = g0 * GU, pu = p < 0 ? units : min(ng * GU, units - u0);
        const auto pre = [&] {
            if (norm && i == 0 && threadIdx.x < 32) mvr_norm_inv(nrm, nr, lane, parts_s, inv_rms);
        };
        using Epi = GluEpi<!FMTB::PER_UNIT>;
        const Epi epi{g, u, oq, ods, norm ? inv_rms : nullptr, rows, nr, blk, act};
        const bool have = mvrb_impl<FMTB, 4, false, decltype(pre), MVR_WARPS, MVRTG_MAXP, Epi>(
            sm + b * tile, xq + u0 * 32, xds + u0, &ys[0][0], 64, units, pu, st, GB, nullptr,
            nr, 0, max(p, 0), p < 0 ? 1 : parts, p < 0 ? Ks{} : ks,
            norm && p < 0 ? inv_rms : nullptr, pre, epi);
        // Warp c: activation row c's 32 outputs, a lane each, through `ys` (a part's sums are
        // scaled here), where GluEpi did not take them.
        if (!Epi::on || p >= 0) {
            __syncthreads();
            if (have && c < nr) {
                const i64 at = (i64)c * rows + blk * 32 + lane;
                const float sc = norm && p >= 0 ? inv_rms[c] : 1.f;
                const float uv = ys[c][32 + lane] * sc;
                const float h = glu_act_mul(ys[c][lane] * sc, uv, act);
                g[at] = h;
                u[at] = uv;
                if (oq) q8_1_warp(h, oq, ods, at >> 5, lane);
            }
        }
        if (nblk2 >= 0) {
            // Every read of buffer b and ys is done before a copy or the next round's sums
            // overwrite them (generic-proxy reads, then async-proxy writes: the fence).
            fence_async_shared();
            __syncthreads();
            if (bufs == 1 && threadIdx.x < 32) fetch(nblk2, np, 0);
        }
        blk = nblk2, p = np;
    }
    if (norm) mvr_norm_out(nrm, nr, lane, c, MVR_WARPS, inv_rms);
#else
    __trap();
#endif
}

// Groups a row's part at most in `mvrc` (its barriers; the 27B Q4_K ffn_down in 4 parts
// has 17, Q1_0's 17,408-wide rows 17 whole).
#define MVRC_MAXG 72

// `mvrt_impl` with the tile brought in by group: one tensor copy (`tm`: a 2-D map of the
// matrix as 4-byte words, a box of one group × the block's 16·MT rows; rows past the end
// come as zeros) and one barrier per group of the part, so a warp starts on its first step
// once that step's group has landed instead of after the whole tile (ncu, 27B Q1_0 gate/up
// with 8 rows: 16% of `mvrt`'s warp samples waited on the tile's one barrier). Shared
// memory: group q of row r at (q·16·MT + r)·GROUP_BYTES (a box lands rows at its width;
// 144 and 528 bytes are odd numbers of 16-byte words, so the 8 rows a warp reads at once
// start in different bank groups).
template <class F, int MT, class Wait>
__device__ __forceinline__ void mvrc_impl(const TMap* tm, const i8* __restrict__ xq,
                                          const float2* __restrict__ xds, float* __restrict__ y,
                                          int rows, int units, int nr, int blk, int parts,
                                          int part_units, int part_bytes, Ks ks, Wait wait) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 sm[];
    __shared__ u64 bars[MVRC_MAXG];
    constexpr int RB = 16 * MT, GB = F::GROUP_BYTES;
    const int part = parts > 1 ? (int)(blockIdx.x % parts) : 0;
    const int u0 = part * part_units, pu = min(part_units, units - u0);
    const int ng = min(((pu >> 2) + F::GROUP_STEPS - 1) / F::GROUP_STEPS, MVRC_MAXG);
    if (threadIdx.x == 0) {
        for (int q = 0; q < ng; q++) mbar_init(&bars[q]);
        mbar_init_fence();
    }
    // The barriers are initialised before any thread waits on them. The copies go out
    // after this: with them before it, the block's other warps waited for thread 0 to
    // issue all of them (ncu, Q4_K gate+up by group: 23% of the warp samples there).
    __syncthreads();
    if (threadIdx.x == 0) {
        // In order: the groups every warp takes first land first.
        const int x0 = part * (part_bytes >> 2);
        for (int q = 0; q < ng; q++) {
            mbar_expect(&bars[q], (u32)(RB * GB));
            tma_load_2d(sm + q * RB * GB, tm, x0 + q * (GB >> 2), blk * RB, &bars[q]);
        }
    }
    wait();
    mvrb_impl<F, MT, true>(sm, xq + u0 * 32, xds + u0, y, rows, units, pu, GB, RB * GB, bars, nr,
                           blk, part, parts, ks);
#else
    __trap();
#endif
}

// mvrc_<MT> / mvrmc_<MT>: mvrt_<MT> / mvrmt_<MT> by group (the host's choice where a row is
// whole groups), the matrices' maps by value (`__grid_constant__`: the copies read them
// where they are). `slots` (and mvrmc's norm, never set here) are unused: the arguments
// are the ring's (`mvrq_<MT>`), so the host launches both alike.
#define MVRC(MT, MINB)                                                                             \
    extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32, MINB)                        \
        mvrc_##MT(const __grid_constant__ TMap tm, const i8* xq, const float2* xds, float* y,   \
                  int rows, int units, int nr, int parts, int part_units, int part_bytes,      \
                  int slots, Ks ks) {                                                          \
        mvrc_impl<FMTB, MT>(&tm, xq, xds, y, rows, units, nr, blockIdx.x / parts, parts,        \
                            part_units, part_bytes, ks, [] { gdc_wait(); });                  \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(MVR_WARPS * 32, MINB)                        \
        mvrmc_##MT(const __grid_constant__ TMap t0, const __grid_constant__ TMap t1,            \
                   const __grid_constant__ TMap t2, const __grid_constant__ TMap t3,            \
                   MAT4_PARAMS, const i8* xq, const float2* xds, int units, int nr, int parts,  \
                   int part_units, int part_bytes, int slots, Ks ks, Nrm) {                    \
        const Mat4 p = MAT4_PICK(blockIdx.x / parts);                                          \
        const TMap* tm = p.m == 0 ? &t0 : p.m == 1 ? &t1 : p.m == 2 ? &t2 : &t3;               \
        mvrc_impl<FMTB, MT>(tm, xq, xds, p.y, p.rows, units, nr, p.b, parts, part_units,       \
                            part_bytes, ks, [] { gdc_wait(); });                              \
    }
MVRC(1, 3)
MVRC(2, 2)
MVRC(4, MVRT_MINB)

// Slots at most in `mvrq`'s ring (its barriers).
#define MVRQ_MAXS 16

// `mvrc_impl` through a ring of `slots` group slots in shared memory: a producer warp (warp
// MVR_WARPS) copies group q of the tile into slot q % slots once the warps that read the
// group before are done with it (`empty`), and the MVR_WARPS warps compute as `mvrb_impl`
// by group — the same steps a warp, the same sums in the same order. ncu, 27B Q4_K qkv+z
// by group with 8 rows: the whole tile took 233 KB of the SM's 256 KB of L1 and shared
// memory, the activations hit L1 58% of the time and 28% of the warp samples waited on
// them, 22% on the tile's barriers; the ring is a fraction of the tile. (With each
// group's activation rows copied into the slot too, 17 small bulk copies a group, the
// kernel took twice as long: 27B Q4_K gate+up 51.4 → 107.3 µs.) Slot: the group of the
// tile, RB rows of GB bytes as the box lands them. The host makes `slots` a multiple of the
// groups between a warp's two groups (MVR_WARPS / GS, at least 1): the slot of a warp's
// next group then last held a group that warp waited for, so the `full` phase it waits on
// by parity is the next one and not the one after.
template <class F, int MT, class Wait>
__device__ __forceinline__ void mvrq_impl(const TMap* tm, const i8* __restrict__ xq,
                                          const float2* __restrict__ xds, float* __restrict__ y,
                                          int rows, int units, int nr, int blk, int parts,
                                          int part_units, int part_bytes, int slots, Ks ks,
                                          Wait wait, const Nrm& nrm) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 sm[];
    __shared__ u64 full[MVRQ_MAXS], empty[MVRQ_MAXS];
    // With a norm (nrm.part set, parts = 1): the rows' parts (at most the host's
    // NORM_ROW_BLOCKS, the parts' buffer) and 1/rms (mvr_norm_*).
    __shared__ double parts_s[NRM_PARTS];
    __shared__ float inv_rms[8];
    const bool norm = nrm.part != nullptr;
    constexpr int RB = 16 * MT, GB = F::GROUP_BYTES, GS = F::GROUP_STEPS, SLOT = RB * GB;
    // Warps computing a group's steps (each arrives on its `empty` once).
    constexpr int NW = MVR_WARPS, CW = GS < NW ? GS : NW;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int part = parts > 1 ? (int)(blockIdx.x % parts) : 0;
    const int u0 = part * part_units, pu = min(part_units, units - u0);
    const int steps = pu >> 2, ng = (steps + GS - 1) / GS, base = blk * RB;
    if (threadIdx.x == 0) {
        for (int i = 0; i < slots; i++) {
            mbar_init(&full[i]);
            mbar_init_n(&empty[i], CW);
        }
        mbar_init_fence();
    }
    // The barriers are initialised before any thread uses them.
    __syncthreads();
    if (warp == NW) {
        // The weights do not depend on the kernel before: no wait.
        if (lane == 0) {
            const int x0 = part * (part_bytes >> 2);
            for (int q = 0; q < ng; q++) {
                const int sl = q % slots;
                // The slot's readers of group q − slots are done.
                if (q >= slots) mbar_wait(&empty[sl], (q / slots - 1) & 1);
                mbar_expect(&full[sl], SLOT);
                tma_load_2d(sm + sl * SLOT, tm, x0 + q * (GB >> 2), base, &full[sl]);
            }
        }
        __syncwarp();
        // mvrb_finish's two cluster barriers.
        if (parts > 1 && !ks.p) {
            cluster_sync();
            cluster_sync();
        }
        return;
    }
    wait();
    if (norm && warp == 0) mvr_norm_load(nrm, nr, lane, parts_s);
    const int g = lane >> 2, t = lane & 3, last = rows - 1 - base;
    MvrbAct a(xq + u0 * 32, xds + u0, units, nr, g, t, warp);
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int s = warp; s < steps; s += NW, a.next(NW)) {
        const int q = s / GS, s2 = s - q * GS, sl = q % slots;
        int2 x[4];
        const MvrbScales e = a.load(x);
        // The warp's first step of the group (steps go round the warps).
        if (s2 < NW) mbar_wait(&full[sl], (q / slots) & 1);
        mvrb_step<F, MT>(acc, sm + sl * SLOT, GB, 0, s2, last, g, t, x, e.d0, e.d1, e.y0, e.y1,
                         e.q0, e.q1);
        // The warp's last step of the group: the slot may take another once every reader
        // has said so, each lane's reads ordered before the copy that will overwrite them
        // (generic-proxy reads, then an async-proxy write: the PTX memory model asks for the
        // fence; without it, a possible cause of the one mismatch measured, BENCHMARKS
        // session 29).
        if (s2 + NW >= GS || s + NW >= steps) {
            fence_async_shared();
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[sl]);
        }
    }
    if (norm && warp == 0) mvr_norm_inv(nrm, nr, lane, parts_s, inv_rms);
    mvrb_finish<MT>(acc, y, rows, nr, base, part, parts, warp, NW,
                    [] { named_sync(1, MVR_WARPS * 32); }, ks, norm ? inv_rms : nullptr);
    if (norm) mvr_norm_out(nrm, nr, lane, warp, NW, inv_rms);
#else
    __trap();
#endif
}

// mvrq_<MT> / mvrmq_<MT>: mvrc_<MT> / mvrmc_<MT> through the ring (MVR_WARPS + 1 warps a
// block), `slots` slots of dynamic shared memory; `mvrmq` finishes a norm with `nrm`.
#define MVRQ(MT, MINB)                                                                             \
    extern "C" __global__ void __launch_bounds__((MVR_WARPS + 1) * 32, MINB)                  \
        mvrq_##MT(const __grid_constant__ TMap tm, const i8* xq, const float2* xds, float* y,   \
                  int rows, int units, int nr, int parts, int part_units, int part_bytes,      \
                  int slots, Ks ks) {                                                          \
        mvrq_impl<FMTB, MT>(&tm, xq, xds, y, rows, units, nr, blockIdx.x / parts, parts,        \
                            part_units, part_bytes, slots, ks, [] { gdc_wait(); }, Nrm{});    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__((MVR_WARPS + 1) * 32, MINB)                  \
        mvrmq_##MT(const __grid_constant__ TMap t0, const __grid_constant__ TMap t1,            \
                   const __grid_constant__ TMap t2, const __grid_constant__ TMap t3,            \
                   MAT4_PARAMS, const i8* xq, const float2* xds, int units, int nr, int parts,  \
                   int part_units, int part_bytes, int slots, Ks ks, Nrm nrm) {                \
        const Mat4 p = MAT4_PICK(blockIdx.x / parts);                                          \
        const TMap* tm = p.m == 0 ? &t0 : p.m == 1 ? &t1 : p.m == 2 ? &t2 : &t3;               \
        mvrq_impl<FMTB, MT>(tm, xq, xds, p.y, p.rows, units, nr, p.b, parts, part_units,       \
                            part_bytes, slots, ks, [] { gdc_wait(); }, nrm);                  \
    }
MVRQ(1, 2)
MVRQ(2, 2)
MVRQ(4, MVRT_MINB)
#endif
