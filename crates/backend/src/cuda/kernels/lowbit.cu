// Decoders of the 1- and 2-bit formats, in dequant.cuh's style (`unit(row, u, w)` writes
// weights 32u .. 32u+31 of a packed row as f32); the GEMV, embedding and f16 dequantizer of
// matmul.cu run on them unchanged. Layouts: FORMATS.md; references: neagari-quant's
// q1_0.rs, q2_0.rs, tq2_0.rs. Blocks are 18 or 66 bytes, so rows start 2-byte aligned and
// 16-bit loads are the widest safe ones; Q1_0 and TQ2_0 are uploaded in a 16-byte aligned
// layout (`F_Q1_0R`, `F_TQ2_0R` below) unless NEAGARI_CUDA_REPACK=0.

// Q1_0 (type 41): 128 weights per 18-byte block: f16 d, then 16 bytes of sign bits
// (bit j%8 of byte j/8, LSB first): bit 1 → +d, 0 → −d.
struct F_Q1_0 {
    static constexpr int BLOCK = 128, BYTES = 18;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 2) * 18;
        const float d = h2f(ld16(b));
        const u8* q = b + 2 + 4 * (u & 3);
        const u32 bits = (u32)ld16(q) | ((u32)ld16(q + 2) << 16);
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = ((bits >> i) & 1) ? d : -d;
    }
};

// Q2_0 (type 42): 64 weights per 18-byte block: f16 d, then 2-bit codes
// (code j = (qs[j/4] >> 2(j%4)) & 3), weight (code − 1)·d.
struct F_Q2_0 {
    static constexpr int BLOCK = 64, BYTES = 18;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 1) * 18;
        const float d = h2f(ld16(b));
        const u8* q = b + 2 + 8 * (u & 1);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 v = (u32)ld16(q + 2 * k);
#pragma unroll
            for (int i = 0; i < 8; i++) w[8 * k + i] = (float)((int)((v >> (2 * i)) & 3) - 1) * d;
        }
    }
};

// TQ2_0 (type 35): 256 weights per 66-byte block: qs[64], then f16 d. Weight
// 128c + 32l + m has code (qs[32c + m] >> 2l) & 3 and value (code − 1)·d; unit s of the
// block is (c, l) = (s / 4, s % 4), so its 32 weights read the 32 bytes of half c.
struct F_TQ2_0 {
    static constexpr int BLOCK = 256, BYTES = 66;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const u8* b = row + (i64)(u >> 3) * 66;
        const int s = u & 7;
        const float d = h2f(ld16(b + 64));
        const u8* q = b + 32 * (s >> 2);
        const int sh = 2 * (s & 3);
#pragma unroll
        for (int m = 0; m < 32; m += 2) {
            const u32 v = (u32)ld16(q + m);
            w[m] = (float)((int)((v >> sh) & 3) - 1) * d;
            w[m + 1] = (float)((int)((v >> (8 + sh)) & 3) - 1) * d;
        }
    }
};

// The repacked layout of Q1_0 and TQ2_0 (cuda/repack.rs, made at upload): a row is groups
// of 8 blocks, each 16 bytes of the blocks' f16 scales then the blocks' BODY-byte bodies,
// so every body starts 16-byte aligned. Block b's body and scale:
template <int BODY>
__device__ __forceinline__ const u8* rp_body(const u8* row, int b) {
    return row + (i64)(b >> 3) * (16 + 8 * BODY) + 16 + BODY * (b & 7);
}
template <int BODY>
__device__ __forceinline__ float rp_scale(const u8* row, int b) {
    return h2f(ld16(row + (i64)(b >> 3) * (16 + 8 * BODY) + 2 * (b & 7)));
}

// Q1_0 repacked: the body is four 32-bit words, its four units bit-sliced: weight 4k + i of
// unit j at bit 8i + j + 4·(k / 4) of word k % 4 (repack.rs).
struct F_Q1_0R {
    static constexpr int BLOCK = 128, BYTES = 18;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const int b = u >> 2, j = u & 3;
        const float d = rp_scale<16>(row, b);
        const uint4 v = *(const uint4*)rp_body<16>(row, b);
        const u32 words[4] = {v.x >> j, v.y >> j, v.z >> j, v.w >> j};
#pragma unroll
        for (int i = 0; i < 32; i++)
            w[i] = ((words[(i >> 2) & 3] >> (8 * (i & 3) + 4 * (i >> 4))) & 1) ? d : -d;
    }
};

// TQ2_0 repacked: the body is ggml's qs[64] (weight 128c + 32l + m: (qs[32c + m] >> 2l) & 3).
struct F_TQ2_0R {
    static constexpr int BLOCK = 256, BYTES = 66;
    static __device__ __forceinline__ void unit(const u8* row, int u, float* w) {
        const int b = u >> 3, s = u & 7;
        const float d = rp_scale<64>(row, b);
        const uint4* q = (const uint4*)(rp_body<64>(row, b) + 32 * (s >> 2));
        const int sh = 2 * (s & 3);
        const uint4 v0 = q[0], v1 = q[1];
        const u32 words[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int m = 0; m < 32; m++)
            w[m] = (float)((int)((words[m >> 2] >> (8 * (m & 3) + sh)) & 3) - 1) * d;
    }
};
