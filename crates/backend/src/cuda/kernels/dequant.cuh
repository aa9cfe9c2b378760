// One decoder per weight format: `unit(row, u, w)` writes the 32 weights of unit `u`
// (weights 32u .. 32u+31) of a packed row into registers. Block layouts are ggml's
// (FORMATS.md); every format is tested against the CPU's dequantizer (tests/cuda_ops.rs).
// Row starts are 2-byte aligned for every format (all block sizes are even), so 16-bit
// loads are safe everywhere.

struct F_F32 {
    static constexpr int BLOCK = 32, BYTES = 128;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const float4* p = (const float4*)(row + (i64)u * 128);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 v = p[i];
            w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
        }
    }
};

struct F_F16 {
    static constexpr int BLOCK = 32, BYTES = 64;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u16* p = (const u16*)(row + (i64)u * 64);
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = h2f(p[i]);
    }
};

struct F_BF16 {
    static constexpr int BLOCK = 32, BYTES = 64;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u16* p = (const u16*)(row + (i64)u * 64);
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = bf2f(p[i]);
    }
};

struct F_Q4_0 {
    static constexpr int BLOCK = 32, BYTES = 18;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)u * 18;
        float d = h2f(ld16(b));
        const u16* q = (const u16*)(b + 2);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u16 v = q[i];
            w[2 * i] = (float)((int)(v & 0xF) - 8) * d;
            w[2 * i + 16] = (float)((int)((v >> 4) & 0xF) - 8) * d;
            w[2 * i + 1] = (float)((int)((v >> 8) & 0xF) - 8) * d;
            w[2 * i + 17] = (float)((int)(v >> 12) - 8) * d;
        }
    }
};

struct F_Q4_1 {
    static constexpr int BLOCK = 32, BYTES = 20;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)u * 20;
        float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        const u8* q = b + 4;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            w[i] = (float)(q[i] & 0xF) * d + m;
            w[i + 16] = (float)(q[i] >> 4) * d + m;
        }
    }
};

struct F_Q5_0 {
    static constexpr int BLOCK = 32, BYTES = 22;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)u * 22;
        float d = h2f(ld16(b));
        u32 qh = (u32)ld16(b + 2) | ((u32)ld16(b + 4) << 16);
        const u8* q = b + 6;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int h0 = ((qh >> j) << 4) & 0x10;
            int h1 = (qh >> (j + 12)) & 0x10;
            w[j] = (float)(((q[j] & 0xF) | h0) - 16) * d;
            w[j + 16] = (float)(((q[j] >> 4) | h1) - 16) * d;
        }
    }
};

struct F_Q5_1 {
    static constexpr int BLOCK = 32, BYTES = 24;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)u * 24;
        float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        u32 qh = (u32)ld16(b + 4) | ((u32)ld16(b + 6) << 16);
        const u8* q = b + 8;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int h0 = ((qh >> j) << 4) & 0x10;
            int h1 = (qh >> (j + 12)) & 0x10;
            w[j] = (float)((q[j] & 0xF) | h0) * d + m;
            w[j + 16] = (float)((q[j] >> 4) | h1) * d + m;
        }
    }
};

struct F_Q8_0 {
    static constexpr int BLOCK = 32, BYTES = 34;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)u * 34;
        float d = h2f(ld16(b));
        const u16* q = (const u16*)(b + 2);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            u16 v = q[i];
            w[2 * i] = (float)(i8)(v & 0xFF) * d;
            w[2 * i + 1] = (float)(i8)(v >> 8) * d;
        }
    }
};

// 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K in ggml's layout (N false) or repack.rs's (N true; vecdot.cuh's Q_Q4_Kt says how).
template <bool N>
struct F_Q4_Kt {
    static constexpr int BLOCK = 256, BYTES = 144;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 3) * 144;
        int s = u & 7;
        int sc, m;
        scale_min_k4(s, b + 4, sc, m);
        float d1 = h2f(ld16(b)) * (float)sc, m1 = h2f(ld16(b + 2)) * (float)m;
        // 16-byte aligned: the super-block is 144 = 9·16 bytes and qs starts at byte 16.
        if constexpr (N) {
            const uint4 v = *(const uint4*)(b + 16 + 16 * s);
            const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int byte = 0; byte < 4; byte++) {
                    const u32 q = words[k] >> (8 * byte);
                    w[8 * k + byte] = d1 * (float)(q & 0xF) - m1;
                    w[8 * k + 4 + byte] = d1 * (float)((q >> 4) & 0xF) - m1;
                }
            return;
        }
        const uint4* q4 = (const uint4*)(b + 16 + 32 * (s >> 1));
        int sh = (s & 1) * 4;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 v = q4[h];
            u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int byte = 0; byte < 4; byte++)
                    w[16 * h + 4 * k + byte] =
                        d1 * (float)((words[k] >> (8 * byte + sh)) & 0xF) - m1;
        }
    }
};
using F_Q4_K = F_Q4_Kt<false>;
using F_Q4_KN = F_Q4_Kt<true>;

// Q5_K in ggml's layout (N false) or repack.rs's (N true; vecdot.cuh's Q_Q5_Kt says how).
template <bool N>
struct F_Q5_Kt {
    static constexpr int BLOCK = 256, BYTES = 176;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 3) * 176;
        int s = u & 7;
        int sc, m;
        scale_min_k4(s, b + 4, sc, m);
        float d1 = h2f(ld16(b)) * (float)sc, m1 = h2f(ld16(b + 2)) * (float)m;
        if constexpr (N) {
            const u8* ql = b + 48 + 16 * s;
            const u32 h = *(const u32*)(b + 16 + 4 * s);
#pragma unroll
            for (int l = 0; l < 32; l++) {
                // Weight l = 8k + 4·hi + i: nibble hi of byte 4k + i; fifth bit 8(l % 4) + l / 4.
                const int k = l >> 3, hi = (l >> 2) & 1, i = l & 3;
                const int q = ((ql[4 * k + i] >> (4 * hi)) & 0xF) + (int)(((h >> (8 * i + (l >> 2))) & 1) << 4);
                w[l] = d1 * (float)q - m1;
            }
            return;
        }
        const u8* qh = b + 16;
        const u8* ql = b + 48 + 32 * (s >> 1);
        int sh = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = ((ql[l] >> sh) & 0xF) + (((qh[l] >> s) & 1) << 4);
            w[l] = d1 * (float)q - m1;
        }
    }
};
using F_Q5_K = F_Q5_Kt<false>;
using F_Q5_KN = F_Q5_Kt<true>;

struct F_Q6_K {
    static constexpr int BLOCK = 256, BYTES = 210;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 3) * 210;
        int s = u & 7;
        int n = s >> 2, k = s & 3;
        float d = h2f(ld16(b + 208));
        const u8* ql = b + 64 * n + 32 * (k & 1);
        const u8* qh = b + 128 + 32 * n;
        const i8* sc = (const i8*)(b + 192 + 8 * n + 2 * k);
        int nsh = (k >> 1) * 4, hsh = 2 * k;
        float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (((ql[l] >> nsh) & 0xF) | (((qh[l] >> hsh) & 3) << 4)) - 32;
            w[l] = (l < 16 ? d0 : d1) * (float)q;
        }
    }
};

struct F_Q2_K {
    static constexpr int BLOCK = 256, BYTES = 84;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 3) * 84;
        int s = u & 7;
        float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
        const u8* q = b + 16 + 32 * (s >> 2);
        int sh = 2 * (s & 3);
        u8 sa = b[2 * s], sb = b[2 * s + 1];
        float da = d * (float)(sa & 0xF), ma = dmin * (float)(sa >> 4);
        float db = d * (float)(sb & 0xF), mb = dmin * (float)(sb >> 4);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            float q2 = (float)((q[l] >> sh) & 3);
            w[l] = l < 16 ? da * q2 - ma : db * q2 - mb;
        }
    }
};

// Signed 6-bit scale i of a Q3_K super-block's 12 packed scale bytes.
__device__ __forceinline__ int scale_q3_k(const u8* s, int i) {
    int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
    int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

struct F_Q3_K {
    static constexpr int BLOCK = 256, BYTES = 110;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 3) * 110;
        int s = u & 7;
        float d = h2f(ld16(b + 108));
        const u8* hm = b;
        const u8* q = b + 32 + 32 * (s >> 2);
        int sh = 2 * (s & 3);
        u8 m = (u8)(1u << s);
        float da = d * (float)scale_q3_k(b + 96, 2 * s), db = d * (float)scale_q3_k(b + 96, 2 * s + 1);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int v = (int)((q[l] >> sh) & 3) - ((hm[l] & m) ? 0 : 4);
            w[l] = (l < 16 ? da : db) * (float)v;
        }
    }
};
