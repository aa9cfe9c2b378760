// What the standalone prototypes of bench/cuda share (bmma_verify_proto.cu,
// q1_slice_proto.cu): error checks, f16 on the host, the streaming 16-byte load, timing of a
// launch rotating over COPIES weight copies (so L2 is cold), the error against a reference.
#pragma once
#include <cuda_fp16.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
typedef uint8_t u8;
typedef uint32_t u32;
typedef int8_t i8;
typedef long long i64;
#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            printf("CUDA %s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));              \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

// A 16-byte load of streamed weights (read once): around L1.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static uint16_t f2h_host(float f) {
    __half x = __float2half(f);
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
static float h2f_host(uint16_t h) {
    __half x;
    memcpy(&x, &h, 2);
    return __half2float(x);
}

// µs a launch: 3 warm launches, then 200 timed, `launch(c)` taking copy c % copies.
template <class L>
static float time_us(L launch, int copies) {
    for (int i = 0; i < 3; i++) launch(i % copies);
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int N = 200;
    cudaEventRecord(e0);
    for (int i = 0; i < N; i++) launch(i % copies);
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms * 1000.f / N;
}

// max |y − ref| / max |ref| over the first n of device buffer y.
static double rel_err(const float* y, const std::vector<double>& ref, size_t n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), y, n * 4, cudaMemcpyDeviceToHost));
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs(h[i] - ref[i]));
        mr = fmax(mr, fabs(ref[i]));
    }
    return md / mr;
}
