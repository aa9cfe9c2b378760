// Shared definitions of every CUDA module: fixed-width types, half/bfloat16 conversions
// through PTX (NVRTC builds without the CUDA headers), warp reductions.
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as the CPU's f16 conversion does.
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }

// A 16-byte load of streamed weights (read once): around L1, which keeps the activation.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#define NEG_INF __int_as_float(0xff800000)

// q8_1 of one 32-value unit held one value per lane: int8 codes q = round(v / d) with
// d = max|v| / 127, and (d, d·Σq). The integer GEMV's activation format (gemv_int.cu).
__device__ __forceinline__ void q8_1_warp(float v, i8* xq, float2* xds, i64 unit, int lane) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.f;
    const int q = amax == 0.f ? 0 : (int)rintf(v / d);
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    xq[unit * 32 + lane] = (i8)q;
    if (lane == 0) xds[unit] = make_float2(d, d * (float)sum);
}

// A GEMV over up to four matrices of one format and width that read one input
// (`matmul_multi`: q/k/v, gate/up) in one launch: their weights, outputs and rows, and
// the first blocks of matrices 1..3 (blocks [0, b1) run matrix 0, [b1, b2) matrix 1, …;
// unused starts are past the grid). MAT4_PICK(b) is block b's matrix: its index, weights,
// output, rows, and b counted from the matrix's first block.
#define MAT4_PARAMS                                                                        \
    const u8 *w0, const u8 *w1, const u8 *w2, const u8 *w3, float *y0, float *y1, float *y2, \
        float *y3, int n0, int n1, int n2, int n3, int b1, int b2, int b3
#define MAT4_PICK(b) mat4_pick(b, w0, w1, w2, w3, y0, y1, y2, y3, n0, n1, n2, n3, b1, b2, b3)
struct Mat4 {
    int m;
    const u8* W;
    float* y;
    int rows, b;
};
__device__ __forceinline__ Mat4 mat4_pick(int b, MAT4_PARAMS) {
    Mat4 p{0, w0, y0, n0, b};
    if (b >= b3) p = Mat4{3, w3, y3, n3, b - b3};
    else if (b >= b2) p = Mat4{2, w2, y2, n2, b - b2};
    else if (b >= b1) p = Mat4{1, w1, y1, n1, b - b1};
    return p;
}

// Programmatic dependent launch (Hopper and later; the host launches every kernel with
// programmatic stream serialization there, `launch!` in mod.rs): a kernel may start while
// the previous one in the stream is still running, so every kernel calls gdc_wait() before
// it touches global memory — reads of what the previous kernel wrote and writes of what it
// may still read alike. The wait returns once the previous kernel has completed and its
// writes are visible; it is a no-op for a kernel launched without the attribute. Since
// every kernel waits, the order is transitive, as without PDL.
// The next kernel may launch once every block of this one has exited, or, with GDC_EARLY
// (the default; NEAGARI_CUDA_PDL=exit turns it off), once every block has passed its wait:
// its blocks then wait on free SMs while this kernel runs. A grid's dependents launch only once all its blocks
// have signalled (or exited), so all of them are resident by then: a kernel whose blocks
// wait for each other (add_rms_norm_row) cannot be starved by its dependents. Measured
// (tg128, H200): Gemma 3 270M shape 765 → 836 tok/s with the signal at exit, 805 early;
// 27B Q1_0 193 → 198 at exit, 201 early.
// A format module may opt out (GDC_NO_PREFETCH, NEAGARI_CUDA_NOPF, modules.rs).
#ifdef GDC_NO_PREFETCH
#undef GDC_PREFETCH
#endif
// With GDC_PREFETCH (the default with GDC_EARLY), a block asks L2 for `bytes` at `p` (its weight rows: they do not
// depend on the previous kernel, so this may run before gdc_wait()), a 128-byte line a
// thread at a time; a no-op otherwise.
__device__ __forceinline__ void gdc_prefetch(const u8* p, i64 bytes) {
#if defined(GDC_PREFETCH) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int nthr = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
    for (i64 o = (i64)tid * 128; o < bytes; o += (i64)nthr * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

__device__ __forceinline__ void gdc_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef GDC_EARLY
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#endif
}

// The next GEMV's weights into L2 while a small kernel runs (`Backend::prefetch`,
// cuda/prefetch.rs): up to two ranges (16-byte aligned, sizes multiples of 16), cut in
// PF_CHUNK pieces spread over the grid's blocks, one `cp.async.bulk.prefetch.L2` each by a
// block's thread 0. A hint the copy engine serves without the block: no thread waits for
// it, and a block may exit before it lands. Kernels take a `Pf` (the host's `PfArgs`, by
// value) and call pf_issue before their gdc_wait, while the kernel before still runs (after
// the wait it cost the 27B Q1_0 step 0.9 ms: the GEMV after it waited behind the prefetch).
#define PF_CHUNK 65536
// With `first` set, the kernel also lets the next one launch at once, before its own wait
// (prefetch.rs says when): that GEMV then finds SMs and sends its weight loads while the
// GEMV before this kernel still finishes. Safe as every wait: the next kernel's wait still
// waits for this one, which waits for the one before, and nothing before a wait reads what
// the step writes.
struct Pf {
    const u8* p0;
    u64 n0;
    const u8* p1;
    u64 n1;
    u64 first;
};
__device__ __forceinline__ void pf_issue(const Pf& pf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef GDC_EARLY
    if (pf.first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (pf.n0 == 0 || threadIdx.x != 0 || threadIdx.y != 0) return;
    const u64 nb = (u64)gridDim.x * gridDim.y * gridDim.z;
    const u64 b = ((u64)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const u64 c0 = (pf.n0 + PF_CHUNK - 1) / PF_CHUNK, c1 = (pf.n1 + PF_CHUNK - 1) / PF_CHUNK;
    for (u64 c = b; c < c0 + c1; c += nb) {
        const bool first = c < c0;
        const u64 o = (first ? c : c - c0) * PF_CHUNK, n = first ? pf.n0 : pf.n1;
        const u8* p = (first ? pf.p0 : pf.p1) + o;
        const u32 len = (u32)min((u64)PF_CHUNK, n - o);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(len) : "memory");
    }
#endif
}

// A decode row's RMSNorm finished by the GEMV that reads it (cuda/norm.rs
// `norm_matmul_op`): ops.cu's add_norm_part left x (the residual after the add), each of
// its np blocks' sum of squares in part[0, np) and the q8_1 of x·w without the row's 1/rms.
// The GEMV scales its sums by 1/rms (nrm_scale) and writes the normed row out =
// x·(1/rms)·w — add_rms_norm_cl's total, in its block order, and its arithmetic, so its
// bits. part null: no norm. The host's `NrmArgs`, by value.
struct Nrm {
    const double* part;
    const float* x;
    const float* w;
    float* out;
    int np, g;
    float eps;
};
// Lane b (< np) of the calling warp holds part[b]; every lane gets 1/rms.
__device__ __forceinline__ float nrm_scale(const Nrm& n, double mine) {
    double t = 0.0;
    for (int b = 0; b < n.np; b++) t += __shfl_sync(0xffffffffu, mine, b);
    const float mean = (float)(t / (double)n.g);
    return 1.0f / sqrtf(mean + n.eps);
}

// A few bytes from global into shared memory without a register holding them until they
// land (cp.async, sm_80+; a plain copy before): 4 or 8 bytes, aligned to that. The thread
// waits for its copies with `cp_async_wait`.
template <int N>
__device__ __forceinline__ void cp_async(void* smem, const void* g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(
                     (u32)__cvta_generic_to_shared(smem)),
                 "l"(g), "n"(N)
                 : "memory");
#else
    if (N == 8) *(u64*)smem = *(const u64*)g;
    else *(u32*)smem = *(const u32*)g;
#endif
}
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// A decode row's norm finished by a block of the streaming GEMV (gemv_stream.cu): warp 0 of
// the block (its first 32 threads by index; the host gives blocks of ≥ 32 threads) copies
// the row's parts and, in block b < g / 32, values 32b .. 32b + 31 of x and w into shared
// memory once the kernel before is done (`issue`, no registers through the loop), then after
// the loop makes 1/rms (`finish`, nrm_scale's arithmetic) for the block's row sums, and
// writes those values of the normed row (`out`), as `mvq_split` does with Nrm.
struct NrmStage {
    double part[32];
    float x[32], w[32];
    float inv;
    __device__ __forceinline__ void issue(const Nrm& n, int tid) {
        if (!n.part || tid >= 32) return;
        if (tid < n.np) cp_async<8>(&part[tid], n.part + tid);
        const int o = blockIdx.x * 32 + tid;
        if (o < n.g) {
            cp_async<4>(&x[tid], n.x + o);
            cp_async<4>(&w[tid], n.w + o);
        }
    }
    // Before the block's barrier that precedes the reads of `inv`.
    __device__ __forceinline__ void finish(const Nrm& n, int tid) {
        if (!n.part || tid >= 32) return;
        cp_async_wait();
        __syncwarp();
        const float r = nrm_scale(n, tid < n.np ? part[tid] : 0.0);
        if (tid == 0) inv = r;
    }
    // After that barrier.
    __device__ __forceinline__ void out(const Nrm& n, int tid) const {
        const int o = blockIdx.x * 32 + tid;
        if (n.part && tid < 32 && o < n.g) n.out[o] = x[tid] * inv * w[tid];
    }
};

// Bulk copies from global into shared memory by the tensor memory accelerator (sm_90+;
// no-ops before): one thread inits an mbarrier (one arrival), says how many bytes its phase
// waits for (`mbar_expect`), issues the copies (`bulk_load`: 16-byte aligned addresses and
// a multiple of 16 bytes); the threads then wait on the phase (`mbar_wait`). A GEMV's
// weights do not depend on the kernel before, so they are asked for before gdc_wait()
// (gemv_rows.cu's `mvrt`).
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// A barrier whose phase completes after `count` arrivals (`mbar_arrive`; `mbar_expect`
// is one).
__device__ __forceinline__ void mbar_init_n(u64* bar, u32 count) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
#endif
}

__device__ __forceinline__ void mbar_init(u64* bar) { mbar_init_n(bar, 1); }

// One arrival (release: this thread's shared-memory reads and writes come before it).
__device__ __forceinline__ void mbar_arrive(u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// This thread's shared-memory accesses so far ordered before the async proxy's (a bulk
// copy into memory it read): without it the copy may land before the reads are done.
__device__ __forceinline__ void fence_async_shared() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Barrier `id` (1..15; 0 is __syncthreads') of `n` threads (whole warps).
__device__ __forceinline__ void named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// The barriers' initialisation visible to the async proxy (the bulk copies).
__device__ __forceinline__ void mbar_init_fence() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// This phase of `bar` completes once `bytes` have landed (one arrival, the caller's).
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
#endif
}

// A CUtensorMap (the driver's 128-byte opaque descriptor, cuTensorMapEncodeTiled), passed
// to a kernel by value as a `__grid_constant__` parameter.
struct __align__(64) TMap {
    u64 v[16];
};

// The box of a 2-D tensor map at (x, y) (elements of dimension 0, rows) into `dst` (128-byte
// aligned), completing on `bar` (the box's whole size, zeros past the tensor's end).
__device__ __forceinline__ void tma_load_2d(void* dst, const TMap* tm, int x, int y, u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];"
        ::"r"(smem_u32(dst)), "l"(tm), "r"(x), "r"(y), "r"(smem_u32(bar))
        : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
#if __CUDA_ARCH__ >= 900
    u32 done;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
    } while (!done);
#endif
}

// Thread-block clusters (sm_90+; no-ops before, where the host launches none): the
// cluster's barrier, split (`cluster_arrive`: this thread's shared-memory writes released;
// `cluster_wait`: every block's acquired) or whole, and a read of another block's copy of
// a shared variable (`v` in cluster rank `rank`'s shared memory).
__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

// An arrive without release, for a block that only must not leave while the others read
// its shared memory, where what it wrote since needs no ordering: a release arrive waits
// (ERRBAR) for every load and store the thread has in flight.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}

__device__ __forceinline__ u32 cluster_addr(const void* v, int rank) {
    u32 remote = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(v)), "r"(rank));
#endif
    return remote;
}

__device__ __forceinline__ float ld_cluster(const float* v, int rank) {
    float b = 0.f;
#if __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(b) : "r"(cluster_addr(v, rank)) : "memory");
#endif
    return b;
}

__device__ __forceinline__ double ld_cluster(const double* v, int rank) {
    double b = 0.0;
#if __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(b) : "r"(cluster_addr(v, rank)) : "memory");
#endif
    return b;
}

// Activations of the hybrid and GLU kernels (the CPU backend's arithmetic).
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch's softplus (beta 1, threshold 20), as the CPU's.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// act(g)·u of the GLU kernels in ops.cu (the same arithmetic, so the same bits): act 0 is
// SiLU, 1 GELU (tanh form) of the f16-rounded gate, rounded to f16.
__device__ __forceinline__ float glu_act_mul(float v, float u, int act) {
    if (act == 0) return v / (1.0f + expf(-v)) * u;
    if (v <= -10.0f) return 0.0f;
    if (v >= 10.0f) return v * u;
    const float xh = h2f(f2h(v));
    const float t = tanhf(0.7978846f * xh * (1.0f + 0.044715f * xh * xh));
    return h2f(f2h(0.5f * xh * (1.0f + t))) * u;
}

// Q4_K's 6-bit scale and min of sub-block s (dequant.cuh's scale_min_k4) from the words of
// the block's scale bytes 4..7 (w0), 8..11 (w1) and 12..15 (w2), without indexing registers.
__device__ __forceinline__ void k4_scale_min(u32 w0, u32 w1, u32 w2, int s, int& sc, int& m) {
    const int bb = (s & 3) * 8;
    const u32 b0 = (w0 >> bb) & 0xFF, b1 = (w1 >> bb) & 0xFF, b2 = (w2 >> bb) & 0xFF;
    if (s < 4) {
        sc = b0 & 63;
        m = b1 & 63;
    } else {
        sc = (b2 & 0xF) | ((b0 >> 6) << 4);
        m = (b2 >> 4) | ((b1 >> 6) << 4);
    }
}
