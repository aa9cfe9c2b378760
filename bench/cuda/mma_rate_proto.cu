// Tensor-core issue rate on this GPU, one question: how fast is the binary MMA
// (m16n8k128 .b1 AND+POPC, the decode chain's Q1_0 path) next to the int8 one (m16n8k32
// .s8)? Each warp runs 8 independent accumulator chains of `iters` MMAs; all SMs, W warps a
// block. Prints MMAs a clock an SM and ns per MMA per SM partition for both.
// Build: nvcc -arch=sm_90a -O3 -o target/mma_rate bench/cuda/mma_rate_proto.cu
#include <cstdio>
#include <cuda_runtime.h>

// B1: the binary MMA, else the int8 one; the same 8 chains of `iters` each.
template <bool B1>
__global__ void mma_rate(int iters, int* out) {
    int c[8][4] = {};
    unsigned a0 = threadIdx.x * 2654435761u, a1 = a0 ^ 0x5bd1e995u, b = a0 + 7;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (B1)
                asm volatile(
                    "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, "
                    "{%6}, {%0,%1,%2,%3};"
                    : "+r"(c[j][0]), "+r"(c[j][1]), "+r"(c[j][2]), "+r"(c[j][3])
                    : "r"(a0 + j), "r"(a1), "r"(b));
            else
                asm volatile(
                    "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                    "{%8,%9}, {%0,%1,%2,%3};"
                    : "+r"(c[j][0]), "+r"(c[j][1]), "+r"(c[j][2]), "+r"(c[j][3])
                    : "r"(a0 + j), "r"(a1), "r"(a0), "r"(a1), "r"(b), "r"(b));
        }
    }
    int s = 0;
    for (int j = 0; j < 8; j++) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    if (s == 0x7fffffff) out[0] = s;
}

int main() {
    int sms = 0, clk = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    int* out;
    cudaMalloc(&out, 4);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int iters = 4096;
    for (int warps : {4, 8, 16}) {
        for (int k = 0; k < 2; k++) {
            auto run = [&] {
                if (k == 0) mma_rate<true><<<sms, 32 * warps>>>(iters, out);
                else mma_rate<false><<<sms, 32 * warps>>>(iters, out);
            };
            run();
            cudaEventRecord(e0);
            run();
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            const double per_sm = (double)warps * iters * 8;
            const double clocks = ms * 1e-3 * clk * 1e3;
            printf("%s warps %2d: %.3f ms, %.3f MMA/clk/SM, %.1f ns per MMA per partition (clock %d MHz) %s\n",
                   k == 0 ? "b1 m16n8k128" : "s8 m16n8k32", warps, ms, per_sm / clocks,
                   ms * 1e6 / (per_sm / 4), clk / 1000, cudaGetErrorString(cudaGetLastError()));
        }
    }
    return 0;
}
