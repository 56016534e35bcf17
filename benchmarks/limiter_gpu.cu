// The small CUDA program benchmarks/limiter_gpu.py builds with nvcc and runs under
// libcuda_limiter.so on a real GPU. It uses the CUDA runtime, so the driver is reached the way real
// programs reach it (the runtime dlopens libcuda.so.1 and resolves entry points through
// cuGetProcAddress). Each command prints one JSON line.
//
//   limiter_gpu info                  cudaMemGetInfo
//   limiter_gpu alloc BYTES           one cudaMalloc of BYTES (kept until exit)
//   limiter_gpu spin SECONDS          launches a kernel that keeps every SM busy ~1 ms, back to back
//   limiter_gpu bench LAUNCHES        empty launches: ns per launch (host side)

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

__global__ void empty() {}

static int info() {
    size_t free_bytes = 0, total = 0;
    cudaError_t r = cudaMemGetInfo(&free_bytes, &total);
    std::printf("{\"free\": %zu, \"total\": %zu, \"result\": \"%s\"}\n", free_bytes, total, cudaGetErrorName(r));
    return 0;
}

static int alloc(size_t bytes) {
    void *p = nullptr;
    cudaError_t r = cudaMalloc(&p, bytes);
    std::printf("{\"bytes\": %zu, \"result\": \"%s\"}\n", bytes, cudaGetErrorName(r));
    return 0;
}

static int spin_for(double seconds) {
    int sms = 0, khz = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    long long cycles = (long long)khz;  // kHz x 1 ms
    auto start = std::chrono::steady_clock::now();
    long launches = 0;
    for (;;) {
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (elapsed >= seconds)
            break;
        spin<<<sms, 1>>>(cycles);  // one block per SM: the whole device busy while it runs
        cudaError_t r = cudaDeviceSynchronize();
        if (r != cudaSuccess) {
            std::printf("{\"error\": \"%s\", \"launches\": %ld}\n", cudaGetErrorName(r), launches);
            return 1;
        }
        launches++;
    }
    std::printf("{\"launches\": %ld, \"seconds\": %.1f, \"sms\": %d}\n", launches, seconds, sms);
    return 0;
}

static int bench(long n) {
    empty<<<1, 32>>>();  // the first launch loads the module
    cudaDeviceSynchronize();
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < n; i++)
        empty<<<1, 32>>>();
    auto end = std::chrono::steady_clock::now();
    cudaError_t r = cudaDeviceSynchronize();
    double ns = std::chrono::duration<double, std::nano>(end - start).count();
    std::printf("{\"launches\": %ld, \"ns_per_launch\": %.1f, \"result\": \"%s\"}\n", n, ns / (double)n,
                cudaGetErrorName(r));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    int rc = 2;
    if (std::strcmp(argv[1], "info") == 0)
        rc = info();
    else if (std::strcmp(argv[1], "alloc") == 0 && argc > 2)
        rc = alloc(std::strtoull(argv[2], nullptr, 10));
    else if (std::strcmp(argv[1], "spin") == 0 && argc > 2)
        rc = spin_for(std::atof(argv[2]));
    else if (std::strcmp(argv[1], "bench") == 0 && argc > 2)
        rc = bench(std::atol(argv[2]));
    std::fflush(stdout);
    return rc;
}
