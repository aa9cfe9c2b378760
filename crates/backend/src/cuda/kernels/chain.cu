// The decode chain (cuda/chain.rs): the ops of one activation row between two mixers —
// GEMVs, the GLU GEMV, the residual norm — in ONE persistent launch, one block an SM. A
// producer warp streams the block's share of every GEMV's weights, in instruction order,
// into a ring of shared-memory slots by bulk copies and waits only for free slots, so the
// loads run on across the ops' boundaries; eight consumer warps wait for each
// instruction's inputs (a counter a instruction that every taking part block bumps when
// done), quantize the input row into shared memory (q8_1 codes, a scale a 32-value unit:
// the engine's numbers) and multiply what the ring holds on tensor cores. Measured design:
// bench/cuda/persistent_chain_proto.cu (session 31).
//
// Instructions (`CIns`, chain.rs `Ins`, the same layout):
// - GEMV: o0[rows] = W0 · x[K]. A unit is 16 rows × one of nkc K parts; with nkc > 1 the
//   parts' sums go to `part` and the unit that completes a tile (a counter a tile, reset by
//   it) adds them in part order: deterministic. With w1 two matrices of one input and K
//   are one GEMV: o0[rows0] = W0 · x, o1[rows − rows0] = W1 · x, W0's tiles first (so
//   a DeltaNet's 48-row β and α ride with its in-projections, not after them).
// - GLU: o0 = act(W0 · x) ⊙ (W1 · x), o1 = W1 · x; a unit is 8 rows of each matrix.
// - ADD_NORM: x += y; o0 = x · rsqrt(mean(x²) + eps) · γ — block 0 alone (a row of a few
//   thousand values: one block's work; the others go on). Only where no GEMV takes the
//   norm in (below).
// - NORM: o0 = the same norm of x, block 0 alone.
// - ADD: x += y, a slice a block.
// - DELTA: a Gated DeltaNet layer's one token (hybrid.cu's delta_rows arithmetic): a block a
//   value head (d_k = d_v = 128, conv ≤ 4 taps): the conv of its key head's q, k and its v
//   channels, q and k L2-normalized, the delta rule on the head's state, the gated RMS norm.
//   Fields: w0 the layer's state [nv][d_v][d_k], w1 its conv window [kc − 1][cols], x qkv
//   [cols], y z [nv·d_v], o0 out [nv·d_v], o1 alpha [nv], part beta [nv], nx the conv taps
//   [cols][kc], ny a_neg [nv], aux dt_bias [nv], gamma the norm weight [d_v]; rows = nv,
//   K = nk, fmt = kc, act = the tiled head map; tcnt: nk counters (the last of a key head's
//   value heads to have read its q, k windows writes them).
// A GEMV or GLU may take its input as the norm of another row (`norm`, chain.rs folds a
// norm into the GEMVs after it): every block sums the row's squares itself and quantizes
// its part of the normalized row, so no instruction waits for the norm; one of them also
// writes the norm's output (`mat`), and an ADD after them does the norm's residual add.
// An instruction waits for the counters of the earlier ones it reads after or writes over
// (`deps`, a bit each, the host's address ranges); reads of what earlier kernels wrote come
// after griddepcontrol.wait. The block that finishes the launch last zeroes the counters.
//
// Formats: Q1_0 in repack.rs's layout (groups of 8 blocks: 8 f16 scales, then the 16-byte
// bodies; weight 4k + j of word w is bit 8j + k) on IMMA m16n8k32 with the bits as 0/1
// codes (cn_q1i), or, with CN_Q1_P128 (an experiment: a third of the instructions, another
// rounding), on binary tensor cores — mma m16n8k128 .b1 AND+POPC, one a block, × the 8 bit
// planes of an activation quantized with ONE scale a 128-value block, not the engine's
// q8_1 (cn_q1p; one BMMA a 32-weight unit with q8_1's scales, session 33's default until
// int8 MMA beat it 124.8 to 117.9 tok/s, is gone); Q4_K (ggml's
// blocks) and TQ2_0 (repacked: groups of 8 blocks of 2-bit codes, a row's last group may
// be short) on IMMA m16n8k32 (gemv_rows.cu's lane layout). Groups of 144 bytes (1024 and
// 256 weights) and 528 (TQ2_0's 2048).

#define CN_W 8                        // consumer warps (at most the ring's slots: below)
#define CN_C (CN_W * 32)              // consumer threads
#define CN_T (CN_C + 32)              // + the producer warp
#define CN_GB 144                     // bytes a group
#ifndef CN_Q1_P128
#define CN_Q1_P128 0                  // Q1_0: 0 int8 MMA (0/1 codes); 1 binary (above)
#endif
#define CN_CH 6                       // groups of a chunk's row at most
#define CN_SLOT (16 * (CN_CH * CN_GB + 16))
#define CN_MAXK 17408
#define CN_ACT (CN_MAXK + CN_MAXK / 32 * 8)
#define CN_MAXNS 16
#define CN_MAXI 25

#define CK_GEMV 0
#define CK_GLU 1
#define CK_ADD_NORM 2
#define CK_NORM 3
#define CK_ADD 4
#define CK_DELTA 5
#define CF_Q1_0R 0
#define CF_Q4_K 1
#define CF_TQ2_0R 2

struct CIns {
    u64 w0, w1;       // weights (GEMV: w0; GLU: w0 gate, w1 up)
    u64 x, y;         // inputs (GEMV, GLU: x [K]; ADD_NORM, ADD: x [K] in place, y [K]; NORM: x)
    u64 o0, o1;       // outputs (GEMV: o0 [rows]; GLU: o0 = g, o1 = u [rows]; norms: o0 [K])
    u64 gamma;        // norm weight [K]
    u64 part;         // GEMV with nkc > 1: the parts' sums [nkc][rows] f32
    u64 nx, ny;       // GEMV, GLU with a norm: its input row (x = the norm's output)
    u64 aux;          // DELTA: dt_bias
    u32 kind, fmt, rows, K;
    u32 row_bytes, nkc, deps, tcnt;  // tcnt: the first tile counter (nkc > 1)
    float eps;
    u32 act;          // GLU: 0 SiLU, 1 GELU (tanh)
    u32 reuse;        // bit 0: the activation the instruction before made is this one's;
                      // bit 1: so is the norm scale it computed (the same norm's input)
    u32 norm;         // GEMV, GLU: 0 x as it is; 1 x = norm(nx)·γ; 2 x = norm(nx + ny)·γ
    u32 mat;          // … and this instruction writes x (a slice a block)
    u32 rows0;        // GEMV with w1 (two matrices of one input): w0's rows, its tiles
                      // first, then w1's (outputs o0, o1)
    u64 map0, map1;   // GEMV, GLU: w0's, w1's tensor maps (TMap [2]: boxes of a group × 16
                      // rows, × 8 rows), in global memory
};

struct ChainArgs {
    CIns ins[CN_MAXI];
    u64 cnt;          // u32 counters: [n] instructions, [1] exit, then tile counters
    u32 n, ns;
    u64 prof;         // 0, or (NEAGARI_CUDA_CHAIN_PROF=1) u64 [n][blocks][CN_PROF] (below)
};

// Profile fields an instruction a block (%globaltimer ns; stalls summed): the consumers'
// wait for the deps began, the deps were met, the block's share was done; the producer
// began, ended its loads, stalled on full slots; consumer warp 0 stalled on empty ones.
#define CN_PROF 8
#define CP_WAIT 0
#define CP_START 1
#define CP_END 2
#define CP_P0 3
#define CP_P1 4
#define CP_PSTALL 5
#define CP_CSTALL 6

// A wait that never ends is a bug: after ~2 s it traps with a line on stdout, so a broken
// chain fails its step in seconds instead of hanging.
__device__ __forceinline__ u64 cn_time() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __noinline__ void cn_stuck(const char* what, u32 a, u32 b) {
    printf("neagari chain: stuck at %s (%u, %u), block %d thread %d\n", what, a, b, blockIdx.x,
           threadIdx.x);
    __trap();
}
__device__ __forceinline__ void cn_wait_slot(u64* bar, u32 parity) {
    u32 done, n = 0;
    u64 t0 = 0;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
        if (!done && (++n & 1023) == 0) {
            if (t0 == 0) t0 = cn_time();
            else if (cn_time() - t0 > 2000000000ull) cn_stuck("a ring slot", parity, n);
        }
    } while (!done);
}
__device__ __forceinline__ u32 cn_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Polls back off (32 → 256 ns): 132 blocks spinning on one counter's line slow the very
// increments they wait for.
__device__ __forceinline__ void cn_wait_count(const u32* c, u32 target, int ins) {
    u32 n = 0, sleep = 32;
    u64 t0 = 0;
    while (cn_acquire(c) < target) {
        __nanosleep(sleep);
        if (sleep < 256) sleep <<= 1;
        if ((++n & 255) == 0) {
            if (t0 == 0) t0 = cn_time();
            else if (cn_time() - t0 > 2000000000ull) cn_stuck("an instruction's inputs", ins, *c);
        }
    }
}

__device__ __forceinline__ void cn_bmma(int (&c)[4], u32 a0, u32 a1, u32 b) {
    asm(
        "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void cn_imma(int (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 cn_w4(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
__device__ __forceinline__ float cn_hw(const uint4& v, int i) {
    return h2f((u16)(cn_w4(v, i >> 1) >> (16 * (i & 1))));
}

// A format's group: weights, bytes (TQ2_0's last group of a row may hold fewer than its 8
// blocks: then fewer bytes), groups a chunk's row takes at most.
__device__ __forceinline__ int cn_group_weights(u32 fmt) {
    return fmt == CF_Q4_K ? 256 : fmt == CF_Q1_0R ? 1024 : 2048;
}
__device__ __forceinline__ int cn_group_bytes(u32 fmt) { return fmt == CF_TQ2_0R ? 528 : CN_GB; }
__device__ __forceinline__ int cn_chunk_groups(u32 fmt) { return fmt == CF_TQ2_0R ? 1 : CN_CH; }
// A chunk row's stride in its slot: 16 bytes × an odd count, so the 8 rows a warp reads at
// once fall in different banks.
__device__ __forceinline__ int cn_stride(int bytes) { return bytes + (((bytes >> 4) & 1) ? 0 : 16); }

// A GEMV tile's matrix: 1 where it is W1's (tiles from rows0 / 16 on; `t` its tile there).
__device__ __forceinline__ int cn_second(const CIns& in, int tile, int& t) {
    const int t0 = (int)in.rows0 / 16;
    const int second = in.kind == CK_GEMV && in.w1 != 0 && tile >= t0;
    t = second ? tile - t0 : tile;
    return second;
}

// Block b of nb's share of a GEMV or GLU: units [u0, u1) (K part major: a unit u is tile
// u % tiles of part u / tiles), each in nch chunks of ≤ CN_CH groups.
// The units go to the warps a round of CN_W at a time. (Splitting a short last round's units
// by K across the idle warps measured slower: 129.5 against 137.6 tok/s, session 35.)
struct CnGeo {
    int tiles, G, nkc, u0, u1, nch;
    __device__ CnGeo(const CIns& in, int b, int nb) {
        tiles = in.kind == CK_GLU ? in.rows / 8 : in.rows / 16;
        nkc = in.nkc;
        const int gw = cn_group_weights(in.fmt);
        const int ch = cn_chunk_groups(in.fmt);
        G = ((int)in.K + gw - 1) / gw;
        const i64 U = (i64)tiles * nkc;
        u0 = (int)(U * b / nb);
        u1 = (int)(U * (b + 1) / nb);
        const int per = (G + nkc - 1) / nkc;
        nch = (per + ch - 1) / ch;
    }
    // The units of the round at unit ub.
    __device__ int round(int ub) const { return min(CN_W, u1 - ub); }
    // The bytes of groups [a, e) of a row of rb bytes.
    __device__ int bytes(const CIns& in, int a, int e) const {
        const int gb = cn_group_bytes(in.fmt);
        return min(e * gb, (int)in.row_bytes) - a * gb;
    }
    __device__ int part(int kc) const { return kc * G / nkc; }
    // Chunk [a, e) in the slot: whole rows (two bulk copies of 8 rows, row r at r·st) or a
    // tensor-map box a group (group j of the chunk at j·16·gb, its row r at r·gb). Rows are
    // read 8 at a time at these strides (odd multiples of 16 bytes, or 144 and 528 bytes),
    // so they start in different banks.
    __device__ bool whole(const CIns& in, int a, int e) const {
        return cn_stride(bytes(in, a, e)) == (int)in.row_bytes;
    }
    // Groups [a, e) of chunk c (of nch) of unit u.
    __device__ void chunk(int u, int c, int& a, int& e) const {
        const int kc = u / tiles, ua = part(kc), n = part(kc + 1) - ua;
        a = ua + c * n / nch;
        e = ua + (c + 1) * n / nch;
    }
};

// This lane's word of a 128-value block's bit planes (value i of word w at lane i): plane j
// of word w goes to lane 4j + w, the lane of the BMMA's B fragment holding column j,
// k-word w.
__device__ __forceinline__ u32 cn_plane_word(const int (&q)[4], int lane) {
    u32 mine = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const u32 bal = __ballot_sync(0xffffffffu, (q[w] >> j) & 1);
            if (lane == 4 * j + w) mine = bal;
        }
    }
    return mine;
}

// The activation's 128-value blocks [kb0, kb1) from x (f32, through L2), by the consumer
// warps: q8_1 per 32-value unit (q = rint(v / d), d = max|v| / 127, as gemv_int.cu), int8
// codes [K] and (d, d·Σq) a unit at act + CN_MAXK. Q1_0 with CN_Q1_P128: codes over the
// whole block as 8 bit planes [group][32 lanes][8 blocks] u32 — bit p of a unit's word is
// value 4(p & 7) + (p >> 3) of the unit, the weights' bit order — and (d, −Σq as int
// bits) a block at act + CN_MAXK.
// With a norm (`gamma`): each value is (x + y)·scale·γ (y may be null), the engine's norm
// arithmetic, so the codes are those of its written output.
__device__ __forceinline__ void cn_prep(const float* __restrict__ x, const float* __restrict__ y,
                                        const float* __restrict__ gamma, float scale, u32 fmt,
                                        int kb0, int kb1, u8* act) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // PB blocks a warp at a time, every load out before the first is used.
    constexpr int PB = 6;
    const int perm = 4 * (lane & 7) + (lane >> 3);
    const bool planes = fmt == CF_Q1_0R && CN_Q1_P128;
    for (int kbb = kb0 + warp; kbb < kb1; kbb += CN_W * PB) {
        float v[PB][4];
#pragma unroll
        for (int p = 0; p < PB; p++) {
            const int kb = min(kbb + p * CN_W, kb1 - 1);
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const int i = kb * 128 + (planes ? 32 * w + perm : 4 * lane + w);
                v[p][w] = __ldcg(x + i);
                if (y) v[p][w] += __ldcg(y + i);
                if (gamma) v[p][w] = v[p][w] * scale * __ldg(gamma + i);
            }
        }
#pragma unroll
        for (int p = 0; p < PB; p++) {
            const int kb = kbb + p * CN_W;
            if (kb >= kb1) break;
            if (planes) {
                // Unit w is v[p][w] across the warp; one scale (d, −Σq) for the block.
                const float amax = warp_max(fmaxf(fmaxf(fabsf(v[p][0]), fabsf(v[p][1])),
                                                  fmaxf(fabsf(v[p][2]), fabsf(v[p][3]))));
                const float d = amax / 127.f;
                int q[4], s = 0;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    q[w] = amax == 0.f ? 0 : (int)rintf(v[p][w] / d);
                    s += q[w];
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                if (lane == 0) ((float2*)(act + CN_MAXK))[kb] = make_float2(d, __int_as_float(-s));
                ((u32*)act)[((kb >> 3) * 32 + lane) * 8 + (kb & 7)] = cn_plane_word(q, lane);
            } else {
                // Lane L: values 4L .. 4L+3, unit L / 8 (8 lanes a unit).
                float m = fmaxf(fmaxf(fabsf(v[p][0]), fabsf(v[p][1])), fmaxf(fabsf(v[p][2]), fabsf(v[p][3])));
#pragma unroll
                for (int o = 4; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                const float d = m / 127.f;
                int s = 0;
                u32 word = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int q = m == 0.f ? 0 : (int)rintf(v[p][i] / d);
                    s += q;
                    word |= (u32)(q & 0xff) << (8 * i);
                }
#pragma unroll
                for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                ((u32*)act)[kb * 32 + lane] = word;
                if ((lane & 7) == 0) ((float2*)(act + CN_MAXK))[kb * 4 + lane / 8] = make_float2(d, d * (float)s);
            }
        }
    }
}

// The block's consumer threads' Σ (each thread's s), in warp then warp-index order; every
// consumer thread gets it. `red` is free again on return.
__device__ __forceinline__ double cn_block_sum(double s, double* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) red[warp] = s;
    named_sync(1, CN_C);
    double t = 0.0;
    for (int w = 0; w < CN_W; w++) t += red[w];
    named_sync(1, CN_C);
    return t;
}

// 1 / rms of the row nx (+ ny) (norm 2) over K, by every consumer thread of the block: Σ
// in double as the engine's norm, then 1/sqrt(mean + eps) in f32.
__device__ float cn_row_scale(const CIns& in, double* red) {
    const int tid = threadIdx.x;
    const float* x = (const float*)in.nx;
    const float* y = in.norm == 2 ? (const float*)in.ny : nullptr;
    double s = 0.0;
    for (int i = 4 * tid; i < (int)in.K; i += 4 * CN_C) {
        float4 v = __ldcg((const float4*)(x + i));
        if (y) {
            const float4 u = __ldcg((const float4*)(y + i));
            v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
        }
        s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    const float mean = (float)(cn_block_sum(s, red) / (double)in.K);
    return 1.0f / sqrtf(mean + in.eps);
}

// Q1_0 on binary MMA with a scale a 128-value block (CN_Q1_P128): groups [a, a + ng) of rows
// g, g + 8. Block i: lane t's A words are word t of the two rows' block (its 32 weights)
// and B the planes' word of this lane (plane g of the block's unit t), so lane t gets
// planes 2t, 2t + 1 of rows g, g + 8 over the whole block; weighted (×2, plane 7 is −128)
// and with −Σq (lane 0) they make the block's Σ ±q, scaled by its d, then its f16 scale.
// bench/cuda/chain_consumer_proto.cu times it against cn_q1i.
__device__ __forceinline__ void cn_q1p(const u8* ra, const u8* rb, int gs, int a, int ng, const u8* act,
                                       float& acc0, float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const int wa = 2 << (2 * t), wb = (2 * t + 1 == 7) ? -256 : (2 << (2 * t + 1));
    const u32* planes = (const u32*)act;
    const float2* xd = (const float2*)(act + CN_MAXK);
    for (int j = 0; j < ng; j++) {
        const int grp = a + j;
        const u8* ga = ra + j * gs;
        const u8* gb = rb + j * gs;
        const uint4 sa = *(const uint4*)ga, sb = *(const uint4*)gb;
        const uint4 p0 = *(const uint4*)(planes + (grp * 32 + lane) * 8);
        const uint4 p1 = *(const uint4*)(planes + (grp * 32 + lane) * 8 + 4);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 a0 = *(const u32*)(ga + 16 + 16 * i + 4 * t);
            const u32 a1 = *(const u32*)(gb + 16 + 16 * i + 4 * t);
            const float2 xs = xd[grp * 8 + i];
            int cc[4] = {0, 0, 0, 0};
            cn_bmma(cc, a0, a1, cn_w4(i < 4 ? p0 : p1, i & 3));
            const int sq = t == 0 ? __float_as_int(xs.y) : 0;
            acc0 += cn_hw(sa, i) * (xs.x * (float)(cc[0] * wa + cc[1] * wb + sq));
            acc1 += cn_hw(sb, i) * (xs.x * (float)(cc[2] * wa + cc[3] * wb + sq));
        }
    }
}

// Q1_0 on int8 MMA: groups [a, a + ng) of rows g, g + 8. One IMMA m16n8k32 a
// 32-weight unit: lane t's A k-slots 4t.. and 16 + 4t.. hold weights 8t .. 8t+3 and 8t+4 ..
// 8t+7 of the unit as 0/1 bytes — bits 2t and 2t + 1 of each byte of the unit's word
// (repack.rs: weight 4k + j is bit 8j + k) — and B every column the activation's bytes
// 8t .. 8t+7 (cn_q4k's slots). Σ ±q = 2·Σ_{bit set} q − Σq; lane t scales unit t of each
// block, the quad's reduction adds them.
// One group (ga, gb: its rows g, g + 8 in the slot; grp: its index in the activation).
__device__ __forceinline__ void cn_q1i_group(const u8* ga, const u8* gb, int grp, const u8* act,
                                             float& acc0, float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const float2* ds = (const float2*)(act + CN_MAXK);
    const u32 M = 0x01010101u;
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
        acc0 += cn_hw(sa, i) * (xd.x * (float)(2 * c0) - xd.y);
        acc1 += cn_hw(sb, i) * (xd.x * (float)(2 * c2) - xd.y);
    }
}

__device__ __forceinline__ void cn_q1i(const u8* ra, const u8* rb, int gs, int a, int ng, const u8* act,
                                       float& acc0, float& acc1) {
    for (int j = 0; j < ng; j++) cn_q1i_group(ra + j * gs, rb + j * gs, a + j, act, acc0, acc1);
}

// Q4_K's scale and min of sub-block s, times d and dmin (h: the block's first 16 bytes).
__device__ __forceinline__ float2 cn_q4k_sm(const uint4& h, int s) {
    int sc, m;
    k4_scale_min(h.y, h.z, h.w, s, sc, m);
    return make_float2(h2f((u16)(h.x & 0xFFFF)) * (float)sc, h2f((u16)(h.x >> 16)) * (float)m);
}

// Q4_K: blocks [a, a + ng) of rows g, g + 8: one IMMA m16n8k32 a 32-weight sub-block, the
// weights as A (k-slots 4t.. and 16 + 4t.. hold bytes 8t .. 8t+7 of the sub-block pair's
// nibbles, as gemv_rows.cu: A and B agree on where a value sits), the activation as every
// column of B, so c0 is row g's dot and c2 row g + 8's in each lane. Lane t scales
// sub-blocks 2t and 2t + 1; the quad's reduction adds them.
__device__ __forceinline__ void cn_q4k(const u8* ra, const u8* rb, int gs, int a, int ng, const u8* act,
                                       float& acc0, float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const float2* ds = (const float2*)(act + CN_MAXK);
    for (int j = 0; j < ng; j++) {
        const int blk = a + j;
        const u8* pa = ra + j * gs;
        const u8* pb = rb + j * gs;
        const uint4 ha = *(const uint4*)pa, hb = *(const uint4*)pb;
        int c_lo0 = 0, c_lo2 = 0, c_hi0 = 0, c_hi2 = 0;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const uint2 qa = *(const uint2*)(pa + 16 + 32 * p + 8 * t);
            const uint2 qb = *(const uint2*)(pb + 16 + 32 * p + 8 * t);
            const uint2 xl = *(const uint2*)(act + (blk * 8 + 2 * p) * 32 + 8 * t);
            const uint2 xh = *(const uint2*)(act + (blk * 8 + 2 * p + 1) * 32 + 8 * t);
            const u32 M = 0x0F0F0F0Fu;
            int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
            cn_imma(cl, qa.x & M, qb.x & M, qa.y & M, qb.y & M, xl.x, xl.y);
            cn_imma(ch, (qa.x >> 4) & M, (qb.x >> 4) & M, (qa.y >> 4) & M, (qb.y >> 4) & M, xh.x, xh.y);
            if (p == t) {
                c_lo0 = cl[0], c_lo2 = cl[2], c_hi0 = ch[0], c_hi2 = ch[2];
            }
        }
        const float2 xl = ds[blk * 8 + 2 * t], xh = ds[blk * 8 + 2 * t + 1];
        const float2 la = cn_q4k_sm(ha, 2 * t), ua = cn_q4k_sm(ha, 2 * t + 1);
        const float2 lb = cn_q4k_sm(hb, 2 * t), ub = cn_q4k_sm(hb, 2 * t + 1);
        acc0 += la.x * xl.x * (float)c_lo0 - la.y * xl.y + ua.x * xh.x * (float)c_hi0 - ua.y * xh.y;
        acc1 += lb.x * xl.x * (float)c_lo2 - lb.y * xl.y + ub.x * xh.x * (float)c_hi2 - ub.y * xh.y;
    }
}

// TQ2_0 (repack.rs: groups of 8 blocks of 256 weights, 8 f16 scales then 64-byte bodies;
// unit u of a block is bytes 32·(u / 4) .. + 31 of its body, bits 2·(u % 4), code c for
// weight (c − 1)·d): groups [a, a + ng) of rows g, g + 8, the row's `nbk` blocks in all
// (its last group may be short). One IMMA m16n8k32 a unit, the codes as A in the same
// k-slots as Q4_K's nibbles; lane t scales units 2t and 2t + 1; −Σq makes the −1.
__device__ __forceinline__ void cn_tq2(const u8* ra, const u8* rb, int gs, int a, int ng, int nbk,
                                       const u8* act, float& acc0, float& acc1) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const float2* ds = (const float2*)(act + CN_MAXK);
    for (int j = 0; j < ng; j++) {
        const int grp = a + j;
        const u8* ga = ra + j * gs;
        const u8* gb = rb + j * gs;
        const uint4 sa = *(const uint4*)ga, sb = *(const uint4*)gb;
        const int nblk = min(8, nbk - 8 * grp);
        for (int i = 0; i < nblk; i++) {
            const int blk = grp * 8 + i;
            // Bytes 8t .. 8t+7 of the body's two 32-byte halves, rows g and g + 8.
            const uint2 qa0 = *(const uint2*)(ga + 16 + 64 * i + 8 * t);
            const uint2 qa1 = *(const uint2*)(ga + 16 + 64 * i + 32 + 8 * t);
            const uint2 qb0 = *(const uint2*)(gb + 16 + 64 * i + 8 * t);
            const uint2 qb1 = *(const uint2*)(gb + 16 + 64 * i + 32 + 8 * t);
            int c_lo0 = 0, c_lo2 = 0, c_hi0 = 0, c_hi2 = 0;
#pragma unroll
            for (int p = 0; p < 4; p++) {
                const uint2 qa = p < 2 ? qa0 : qa1, qb = p < 2 ? qb0 : qb1;
                const u32 M = 0x03030303u;
                const int sl = 2 * ((2 * p) & 3), sh = 2 * ((2 * p + 1) & 3);
                const uint2 xl = *(const uint2*)(act + (blk * 8 + 2 * p) * 32 + 8 * t);
                const uint2 xh = *(const uint2*)(act + (blk * 8 + 2 * p + 1) * 32 + 8 * t);
                int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
                cn_imma(cl, (qa.x >> sl) & M, (qb.x >> sl) & M, (qa.y >> sl) & M, (qb.y >> sl) & M, xl.x, xl.y);
                cn_imma(ch, (qa.x >> sh) & M, (qb.x >> sh) & M, (qa.y >> sh) & M, (qb.y >> sh) & M, xh.x, xh.y);
                if (p == t) {
                    c_lo0 = cl[0], c_lo2 = cl[2], c_hi0 = ch[0], c_hi2 = ch[2];
                }
            }
            const float2 xl = ds[blk * 8 + 2 * t], xh = ds[blk * 8 + 2 * t + 1];
            const float da = cn_hw(sa, i), db = cn_hw(sb, i);
            acc0 += da * (xl.x * (float)c_lo0 - xl.y + xh.x * (float)c_hi0 - xh.y);
            acc1 += db * (xl.x * (float)c_lo2 - xl.y + xh.x * (float)c_hi2 - xh.y);
        }
    }
}

// A tile's 16 sums (lane r < 16 holds row r of the tile: GEMV rows tile·16 + r; GLU gate
// rows tile·8 + r for r < 8, up rows tile·8 + r − 8) to the outputs.
__device__ __forceinline__ void cn_store(const CIns& in, int tile, float v) {
    const int lane = threadIdx.x & 31;
    if (in.kind == CK_GEMV) {
        int t;
        float* o = (float*)(cn_second(in, tile, t) ? in.o1 : in.o0);
        if (lane < 16) o[t * 16 + lane] = v;
    } else {
        const float up = __shfl_down_sync(0xffffffffu, v, 8);
        if (lane < 8) {
            ((float*)in.o0)[tile * 8 + lane] = glu_act_mul(v, up, (int)in.act);
            ((float*)in.o1)[tile * 8 + lane] = up;
        }
    }
}

// The row norm of block 0 (ADD_NORM: x += y first): the engine's add_rms_norm arithmetic
// (Σx² in double, 1/sqrt(mean + eps) in f32).
__device__ void cn_norm(const CIns& in, double* red) {
    const int tid = threadIdx.x;
    float* x = (float*)in.x;
    const float* y = (const float*)in.y;
    const int K = in.K;
    double s = 0.0;
    for (int i = tid; i < K; i += CN_C) {
        float v = __ldcg(x + i);
        if (in.kind == CK_ADD_NORM) {
            v += __ldcg(y + i);
            x[i] = v;
        }
        s += (double)v * (double)v;
    }
    const float mean = (float)(cn_block_sum(s, red) / (double)K);
    const float scale = 1.0f / sqrtf(mean + in.eps);
    const float* w = (const float*)in.gamma;
    float* out = (float*)in.o0;
    for (int i = tid; i < K; i += CN_C) {
        const float v = in.kind == CK_ADD_NORM ? x[i] : __ldcg(x + i);
        out[i] = v * scale * w[i];
    }
}

// One DELTA instruction's heads on this block (see the top). `sm`: 1,300 floats of scratch.
__device__ void cn_delta(const CIns& in, u32* cnt, int b, int nb, float* sm) {
    constexpr int DK = 128, DV = 128;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nv = (int)in.rows, nk = (int)in.K, kc = (int)in.fmt, pad = 4 - kc;
    const int key_dim = nk * DK, cols = 2 * key_dim + nv * DV;
    const float* qkv = (const float*)in.x;
    float* win = (float*)in.w1;
    const float* cw = (const float*)in.nx;
    float* xs = sm;               // [384] the convolved q, k, v channels
    float* qkw = sm + 384;        // [3][256] the key head's q, k windows after this token
    float* os = sm + 384 + 768;   // [128] the head's outputs
    float* gd = os + 128;         // decay, β
    int* last = (int*)(gd + 2);
    for (int h = b; h < nv; h += nb) {
        const int kh = in.act ? h % nk : h / (nv / nk);
        // The gate of the norm at the end (the z GEMV before wrote it): asked for now.
        float zv[4];
        if (warp == 0) {
#pragma unroll
            for (int e = 0; e < 4; e++) zv[e] = __ldcg((const float*)in.y + (i64)h * DV + 4 * lane + e);
        }
        // The conv, right-aligned as delta_rows: the window then the input, taps before
        // the kernel's start 0.
        for (int lc = tid; lc < 2 * DK + DV; lc += CN_C) {
            const int c = lc < DK ? kh * DK + lc
                          : lc < 2 * DK ? key_dim + kh * DK + lc - DK
                                        : 2 * key_dim + h * DV + lc - 2 * DK;
            float e[4];
#pragma unroll
            for (int m = 0; m < 3; m++) e[m] = m >= pad ? __ldcg(win + (i64)(m - pad) * cols + c) : 0.f;
            e[3] = __ldcg(qkv + c);
            float acc = 0.f;
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (u >= pad) acc += e[u] * __ldg(cw + (i64)c * kc + u - pad);
            xs[lc] = silu_f(acc);
            // The window after the input: its last kc − 1 values.
#pragma unroll
            for (int m = 0; m < 3; m++) {
                if (m >= kc - 1) break;
                // e[pad + m + 1], picked so that e stays in registers.
                const int i = pad + m + 1;
                const float v = i == 1 ? e[1] : i == 2 ? e[2] : e[3];
                if (lc < 2 * DK) qkw[m * 2 * DK + lc] = v;
                else win[(i64)m * cols + c] = v;
            }
        }
        if (tid == 0) {
            const float a = __ldcg((const float*)in.o1 + h) + __ldg((const float*)in.aux + h);
            gd[0] = expf(__ldg((const float*)in.ny + h) * softplus_f(a));
            gd[1] = sigmoid_f(__ldcg((const float*)in.part + h));
        }
        named_sync(1, CN_C);
        // The key head's windows: written by the last of its value heads to have read them.
        if (tid == 0) {
            __threadfence();
            *last = atomicAdd(cnt + in.tcnt + kh, 1u) == (u32)(nv / nk) - 1;
        }
        // q (also by 1/√d_k) and k L2-normalized, a warp each (l2_norm_qk's order).
        if (warp < 2) {
            float v[4], ss = 0.f;
#pragma unroll
            for (int r = 0; r < 4; r++) {
                v[r] = xs[warp * DK + lane + 32 * r];
                ss += v[r] * v[r];
            }
            ss = warp_sum(ss);
            const float inv = warp == 0 ? (1.0f / sqrtf((float)DK)) / sqrtf(ss + 1e-6f)
                                        : 1.0f / sqrtf(ss + 1e-6f);
#pragma unroll
            for (int r = 0; r < 4; r++) xs[warp * DK + lane + 32 * r] = v[r] * inv;
        }
        named_sync(1, CN_C);
        if (*last) {
            __threadfence();
            for (int lc = tid; lc < 2 * DK; lc += CN_C) {
                const int c = lc < DK ? kh * DK + lc : key_dim + kh * DK + lc - DK;
                for (int m = 0; m < kc - 1; m++) win[(i64)m * cols + c] = qkw[m * 2 * DK + lc];
            }
            if (tid == 0) cnt[in.tcnt + kh] = 0;
        }
        // The delta rule: p = Σ_i k_i s_i, δ = β (v − decay·p), s ← decay·s + k δ,
        // o = Σ_i q_i s_i. Warp w: columns CW·w .. CW·w + CW − 1 (CW = 128 / CN_W), 8 at a
        // time; lane l: rows 4l .. 4l + 3.
        const float decay = gd[0], bt = gd[1];
        const float4 q4 = *(const float4*)(xs + 4 * lane);
        const float4 k4 = *(const float4*)(xs + DK + 4 * lane);
        float* S = (float*)in.w0 + (i64)h * DV * DK;
#pragma unroll 1
        for (int half = 0; half < DV / CN_W / 8; half++) {
            const int j0 = DV / CN_W * warp + 8 * half;
            float4 st[8];
#pragma unroll
            for (int c = 0; c < 8; c++) st[c] = __ldcg((const float4*)(S + (i64)(j0 + c) * DK) + lane);
#pragma unroll
            for (int c = 0; c < 8; c++) {
                float4& sv = st[c];
                const float p = warp_sum(k4.x * sv.x + k4.y * sv.y + k4.z * sv.z + k4.w * sv.w);
                const float d = bt * (xs[2 * DK + j0 + c] - decay * p);
                sv.x = decay * sv.x + k4.x * d;
                sv.y = decay * sv.y + k4.y * d;
                sv.z = decay * sv.z + k4.z * d;
                sv.w = decay * sv.w + k4.w * d;
                const float o = warp_sum(q4.x * sv.x + q4.y * sv.y + q4.z * sv.z + q4.w * sv.w);
                if (lane == 0) os[j0 + c] = o;
                *((float4*)(S + (i64)(j0 + c) * DK) + lane) = sv;
            }
        }
        named_sync(1, CN_C);
        // The gated RMS norm over the head (rms_norm_gated's arithmetic), warp 0.
        if (warp == 0) {
            float o[4], ss = 0.f;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                o[e] = os[4 * lane + e];
                ss += o[e] * o[e];
            }
            ss = warp_sum(ss);
            const float inv = 1.0f / sqrtf(ss / (float)DV + in.eps);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = 4 * lane + e;
                ((float*)in.o0)[(i64)h * DV + j] = o[e] * inv * __ldg((const float*)in.gamma + j) * silu_f(zv[e]);
            }
        }
        named_sync(1, CN_C);
    }
}

extern "C" __global__ void __launch_bounds__(CN_T, 1) chain(const __grid_constant__ ChainArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 sm[];
    const int ns = (int)args.ns;
    u8* ring = sm;                // [ns][CN_SLOT]
    u8* act = sm + ns * CN_SLOT;  // [CN_ACT]
    __shared__ u64 full[CN_MAXNS], empty[CN_MAXNS];
    __shared__ double red[CN_W];
    __shared__ int last_sh;
    const int nb = gridDim.x, b = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u32* cnt = (u32*)args.cnt;
    u64* prof = (u64*)args.prof;
    const int n = (int)args.n;
    if (threadIdx.x == 0) {
        for (int i = 0; i < ns; i++) {
            mbar_init(&full[i]);
            mbar_init(&empty[i]);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp == CN_W) {
        // Producer: every chunk of every GEMV and GLU in order; waits only for free slots.
        // The weights do not depend on the kernels before, so no griddepcontrol.wait.
        if (lane != 0) return;
        u32 seq = 0;
        for (int o = 0; o < n; o++) {
            const CIns& in = args.ins[o];
            if (in.kind != CK_GEMV && in.kind != CK_GLU) continue;
            const CnGeo geo(in, b, nb);
            const i64 rb = in.row_bytes;
            u64* pf = prof ? prof + ((i64)o * nb + b) * CN_PROF : nullptr;
            u64 stall = 0;
            if (pf) pf[CP_P0] = cn_time();
            for (int ub = geo.u0; ub < geo.u1;) {
                const int nu = geo.round(ub);
                for (int c = 0; c < geo.nch; c++)
                    for (int w = 0; w < nu; w++, seq++) {
                        const int u = ub + w, tile = u % geo.tiles;
                        const int s = seq % ns;
                        if (seq >= (u32)ns) {
                            const u64 t = pf ? cn_time() : 0;
                            cn_wait_slot(&empty[s], ((seq / ns) - 1) & 1);
                            if (pf) stall += cn_time() - t;
                        }
                        u8* dst = ring + s * CN_SLOT;
                        int a, e;
                        geo.chunk(u, c, a, e);
                        if (e == a) {
                            mbar_arrive(&full[s]);
                            continue;
                        }
                        // Slot rows 0..15: GEMV rows tile·16 + r; GLU gate rows tile·8 + r
                        // (r < 8), then the same up rows.
                        const bool glu = in.kind == CK_GLU;
                        const int gb = cn_group_bytes(in.fmt);
                        int mt;
                        const int second = cn_second(in, tile, mt);
                        if (geo.whole(in, a, e)) {
                            // Two copies of 8 whole rows each.
                            mbar_expect(&full[s], 16 * (u32)rb);
                            const u8* wm = (const u8*)(second ? in.w1 : in.w0);
                            const u8* src0 = wm + (glu ? (i64)mt * 8 : (i64)mt * 16) * rb;
                            const u8* src1 = glu ? (const u8*)in.w1 + (i64)mt * 8 * rb : src0 + 8 * rb;
                            bulk_load(dst, src0, 8 * (u32)rb, &full[s]);
                            bulk_load(dst + 8 * rb, src1, 8 * (u32)rb, &full[s]);
                        } else {
                            // A box a group (two for the GLU: gate, up): a copy per row
                            // took the producer ~100 ns each (session 33's profile).
                            // Boxes are whole (zeros past a row's end: TQ2_0's short group).
                            mbar_expect(&full[s], 16 * gb * (e - a));
                            const TMap* m0 = (const TMap*)(second ? in.map1 : in.map0);
                            for (int j = a; j < e; j++) {
                                u8* d = dst + (j - a) * 16 * gb;
                                if (glu) {
                                    tma_load_2d(d, m0 + 1, j * (gb >> 2), mt * 8, &full[s]);
                                    tma_load_2d(d + 8 * gb, (const TMap*)in.map1 + 1, j * (gb >> 2), mt * 8, &full[s]);
                                } else {
                                    tma_load_2d(d, m0, j * (gb >> 2), mt * 16, &full[s]);
                                }
                            }
                        }
                    }
                ub += nu;
            }
            if (pf) {
                pf[CP_P1] = cn_time();
                pf[CP_PSTALL] = stall;
            }
        }
        return;
    }

    // Consumers. Everything they read that a kernel before wrote comes after this.
    gdc_wait();
    const int ctid = threadIdx.x;
    const int g = lane >> 2;
    u32 base = 0;
    // The shared activation is the whole input of the instruction before (one K part); the
    // norm scale the block computed last.
    bool whole = false, have_scale = false;
    float last_scale = 1.f;
    for (int o = 0; o < n; o++) {
        const CIns& in = args.ins[o];
        const bool one = in.kind == CK_ADD_NORM || in.kind == CK_NORM;
        if (one && b != 0) {
            if (prof && ctid == 0) prof[((i64)o * nb + b) * CN_PROF + CP_END] = 0;
            continue;
        }
        u64* pf = prof ? prof + ((i64)o * nb + b) * CN_PROF : nullptr;
        u64 cstall = 0;
        if (pf && ctid == 0) pf[CP_WAIT] = cn_time();
        // The instructions this one reads after or writes over.
        if (ctid == 0) {
            // A DELTA's state is no input of this step (its layer's DELTA of the step
            // before wrote it, from DRAM by now): the block's head's 64 KB into L2 while
            // the block waits, a hint the copy engine serves.
            if (in.kind == CK_DELTA && b < (int)in.rows)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const float*)in.w0 + (i64)b * 128 * 128),
                             "r"(128 * 128 * 4)
                             : "memory");
            u32 d = in.deps;
            while (d) {
                const int j = __ffs(d) - 1;
                d &= d - 1;
                const u32 k = args.ins[j].kind;
                cn_wait_count(cnt + j, (k == CK_ADD_NORM || k == CK_NORM) ? 1u : (u32)nb, o);
            }
            if (pf) pf[CP_START] = cn_time();
        }
        named_sync(1, CN_C);
        if (in.kind != CK_GEMV && in.kind != CK_GLU) whole = have_scale = false;
        if (one) {
            cn_norm(in, red);
        } else if (in.kind == CK_DELTA) {
            cn_delta(in, cnt, b, nb, (float*)act);
        } else if (in.kind == CK_ADD) {
            const int i0 = (int)((i64)in.K * b / nb), i1 = (int)((i64)in.K * (b + 1) / nb);
            for (int i = i0 + ctid; i < i1; i += CN_C)
                ((float*)in.x)[i] = __ldcg((const float*)in.x + i) + __ldcg((const float*)in.y + i);
        } else {
            const CnGeo geo(in, b, nb);
            const bool prep = !((in.reuse & 1) && whole) && geo.u1 > geo.u0;
            float scale = 1.f;
            if (in.norm && (prep || in.mat)) {
                scale = (in.reuse & 2) && have_scale ? last_scale : cn_row_scale(in, red);
                last_scale = scale;
                have_scale = true;
            } else {
                have_scale = have_scale && (in.reuse & 2);
            }
            if (in.mat) {
                // The norm's output, this block's slice.
                const float* nx = (const float*)in.nx;
                const float* ny = (const float*)in.ny;
                const float* gw = (const float*)in.gamma;
                const int i0 = (int)((i64)in.K * b / nb), i1 = (int)((i64)in.K * (b + 1) / nb);
                for (int i = i0 + ctid; i < i1; i += CN_C) {
                    float v = __ldcg(nx + i);
                    if (in.norm == 2) v += __ldcg(ny + i);
                    ((float*)in.x)[i] = v * scale * gw[i];
                }
            }
            if (prep) {
                // The activation's 128-value blocks this block's K parts read.
                const int per = cn_group_weights(in.fmt) / 128, nkb = (int)in.K / 128;
                const int kb0 = geo.part(geo.u0 / geo.tiles) * per;
                const int kb1 = min(geo.part((geo.u1 - 1) / geo.tiles + 1) * per, nkb);
                if (in.norm)
                    cn_prep((const float*)in.nx, in.norm == 2 ? (const float*)in.ny : nullptr,
                            (const float*)in.gamma, scale, in.fmt, kb0, kb1, act);
                else
                    cn_prep((const float*)in.x, nullptr, nullptr, 1.f, in.fmt, kb0, kb1, act);
                whole = geo.nkc == 1;
            } else if (geo.u1 == geo.u0) {
                whole = whole && (in.reuse & 1);
            }
            named_sync(1, CN_C);
            for (int ub = geo.u0; ub < geo.u1;) {
                const int nu = geo.round(ub);
                // Warp w takes unit ub + w.
                if (warp < nu) {
                    const int u = ub + warp;
                    float acc0 = 0.f, acc1 = 0.f;
                    for (int c = 0; c < geo.nch; c++) {
                        // The parity wait below tells the phase of seq from the one before
                        // in its slot only if that one (seq − ns) has been filled: this
                        // warp's previous chunk was seq − nu, so nu ≤ CN_W ≤ ns keeps it
                        // (16 warps on 14 slots broke it and hung, session 33).
                        const u32 seq = base + c * nu + warp;
                        const int s = seq % ns;
                        const u64 t = pf ? cn_time() : 0;
                        cn_wait_slot(&full[s], (seq / ns) & 1);
                        if (pf) cstall += cn_time() - t;
                        const u8* slot = ring + s * CN_SLOT;
                        int a, e;
                        geo.chunk(u, c, a, e);
                        const int ng = e - a, gb = cn_group_bytes(in.fmt);
                        // The producer's layout (`CnGeo::whole`): row stride, group stride.
                        const bool wh = geo.whole(in, a, e);
                        const int rs = wh ? (int)in.row_bytes : gb, gs = wh ? gb : 16 * gb;
                        const u8* ra = slot + g * rs;
                        const u8* rb = slot + (g + 8) * rs;
                        if (in.fmt == CF_Q1_0R && CN_Q1_P128) cn_q1p(ra, rb, gs, a, ng, act, acc0, acc1);
                        else if (in.fmt == CF_Q1_0R) cn_q1i(ra, rb, gs, a, ng, act, acc0, acc1);
                        else if (in.fmt == CF_Q4_K) cn_q4k(ra, rb, gs, a, ng, act, acc0, acc1);
                        else cn_tq2(ra, rb, gs, a, ng, (int)in.K / 256, act, acc0, acc1);
                        // The slot's reads done and ordered before the next bulk copy into it.
                        fence_async_shared();
                        __syncwarp();
                        if (lane == 0) mbar_arrive(&empty[s]);
                    }
                    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
                    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
                    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
                    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
                    // Lane r < 16 takes row r of the tile: rows g from lanes 4g, g + 8 from 4g.
                    const float r0 = __shfl_sync(0xffffffffu, acc0, 4 * (lane & 7));
                    const float r1 = __shfl_sync(0xffffffffu, acc1, 4 * (lane & 7));
                    float v = lane < 8 ? r0 : r1;
                    const int tile = u % geo.tiles, kc = u / geo.tiles;
                    if (geo.nkc == 1) {
                        cn_store(in, tile, v);
                    } else {
                        float* part = (float*)in.part;
                        if (lane < 16) part[((i64)kc * geo.tiles + tile) * 16 + lane] = v;
                        __threadfence();
                        __syncwarp();
                        u32 old = 0;
                        if (lane == 0) old = atomicAdd(cnt + in.tcnt + tile, 1u);
                        old = __shfl_sync(0xffffffffu, old, 0);
                        if (old == (u32)geo.nkc - 1) {
                            // The tile's last part: add them all in part order.
                            __threadfence();
                            v = 0.f;
                            for (int q = 0; q < geo.nkc; q++)
                                v += lane < 16 ? __ldcg(part + ((i64)q * geo.tiles + tile) * 16 + lane) : 0.f;
                            cn_store(in, tile, v);
                            if (lane == 0) cnt[in.tcnt + tile] = 0;
                        }
                    }
                }
                base += geo.nch * nu;
                ub += nu;
            }
        }
        // This block's share done: the instruction's counter (its writes before it).
        named_sync(1, CN_C);
        if (ctid == 0) {
            __threadfence();
            atomicAdd(cnt + o, 1u);
            if (pf) {
                pf[CP_END] = cn_time();
                pf[CP_CSTALL] = cstall;
            }
        }
    }
    // The block that finishes last zeroes the instruction counters for the next launch
    // (no block reads them any more).
    if (ctid == 0) {
        __threadfence();
        last_sh = atomicAdd(cnt + n, 1u) == (u32)nb - 1;
    }
    named_sync(1, CN_C);
    if (last_sh) {
        __threadfence();
        for (int i = ctid; i <= n; i += CN_C) cnt[i] = 0;
    }
#endif
}
