/*
 * A CUDA program for the limiter's tests, built two ways: linked against libcuda.so.1 and calling
 * the driver API directly, or (-DVIA_GET_PROC_ADDRESS) as the CUDA 12 runtime does: dlopen
 * libcuda.so.1, dlsym cuGetProcAddress_v2, and resolve every other entry point through it.
 * Prints one JSON object per line, flushed. Uses device PROBE_DEVICE (default 0); PROBE_PER_THREAD=1
 * asks cuGetProcAddress for the per-thread default stream variants (nvcc --default-stream per-thread).
 *
 *   probe info                          {"free": F, "total": T}
 *   probe alloc KIND BYTES COUNT [hold] allocate up to COUNT blocks; {"granted": N, "refused": CODE};
 *                                       with hold, wait for stdin to close; then free them all and
 *                                       print {"freed": N, "free": F, "total": T}
 *                                       KIND: plain managed pitch async pool create array array3d
 *   probe next-dlsym                    {"next_is_interposer": B}: dlsym(RTLD_NEXT, "dlsym") from here
 *                                       finds the preloaded limiter's dlsym (what this program binds)
 *   probe bench N                       {"launches": N, "ns_per_launch": X}: N cuLaunchKernel calls
 *                                       of one block, timed with CLOCK_MONOTONIC
 *   probe launch N GRID BLOCK [KIND]    N launches, {"launched": i} after each; KIND: kernel ex
 *                                       cooperative graph; PROBE_SAY_READY=1 prints {"ready": true}
 *                                       just before the first launch
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_alloc_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*array_create)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*array3d_create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*array_destroy)(CUarray);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **);
    CUresult (*launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*launch_cooperative)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void **);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
} api;

#ifdef VIA_GET_PROC_ADDRESS
static void resolve(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (!driver) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(3);
    }
    CUresult (*get)(const char *, void **, int, unsigned long long, int *) =
        (CUresult(*)(const char *, void **, int, unsigned long long, int *))dlsym(driver, "cuGetProcAddress_v2");
    /* the runtime asks for the newest version of cuGetProcAddress through itself */
    void *again = NULL;
    int status = 0;
    if (!get || get("cuGetProcAddress", &again, 12040, 0, &status) != CUDA_SUCCESS) {
        fprintf(stderr, "no cuGetProcAddress\n");
        exit(3);
    }
    get = (CUresult(*)(const char *, void **, int, unsigned long long, int *))again;
    unsigned long long flags = getenv("PROBE_PER_THREAD") ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
#define GET(field, name)                                                                           \
    if (get(name, (void **)&api.field, 12040, flags, &status) != CUDA_SUCCESS) {                       \
        fprintf(stderr, "cuGetProcAddress(%s) failed\n", name);                                   \
        exit(3);                                                                                   \
    }
    GET(init, "cuInit") GET(device_get, "cuDeviceGet") GET(ctx_create, "cuCtxCreate")
    GET(mem_alloc, "cuMemAlloc") GET(mem_alloc_managed, "cuMemAllocManaged")
    GET(mem_alloc_pitch, "cuMemAllocPitch") GET(mem_alloc_async, "cuMemAllocAsync")
    GET(mem_alloc_pool, "cuMemAllocFromPoolAsync") GET(mem_create, "cuMemCreate")
    GET(array_create, "cuArrayCreate") GET(array3d_create, "cuArray3DCreate") GET(mem_free, "cuMemFree")
    GET(mem_free_async, "cuMemFreeAsync") GET(mem_release, "cuMemRelease") GET(array_destroy, "cuArrayDestroy")
    GET(mem_get_info, "cuMemGetInfo") GET(launch, "cuLaunchKernel") GET(launch_ex, "cuLaunchKernelEx")
    GET(launch_cooperative, "cuLaunchCooperativeKernel") GET(graph_launch, "cuGraphLaunch")
}
#else
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayDestroy(CUarray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);

static void resolve(void) {
    api.init = cuInit, api.device_get = cuDeviceGet, api.ctx_create = cuCtxCreate_v2;
    api.mem_alloc = cuMemAlloc_v2, api.mem_alloc_managed = cuMemAllocManaged;
    api.mem_alloc_pitch = cuMemAllocPitch_v2, api.mem_alloc_async = cuMemAllocAsync;
    api.mem_alloc_pool = cuMemAllocFromPoolAsync, api.mem_create = cuMemCreate;
    api.array_create = cuArrayCreate_v2, api.array3d_create = cuArray3DCreate_v2, api.mem_free = cuMemFree_v2;
    api.mem_free_async = cuMemFreeAsync, api.mem_release = cuMemRelease, api.array_destroy = cuArrayDestroy;
    api.mem_get_info = cuMemGetInfo_v2, api.launch = cuLaunchKernel, api.launch_ex = cuLaunchKernelEx;
    api.launch_cooperative = cuLaunchCooperativeKernel, api.graph_launch = cuGraphLaunch;
}
#endif

struct held {
    int kind;
    unsigned long long key;
};

enum { PLAIN, MANAGED, PITCH, ASYNC, POOL, CREATE, ARRAY, ARRAY3D };
static const char *const kinds[] = {"plain", "managed", "pitch", "async", "pool", "create", "array", "array3d"};

static CUresult allocate(int kind, size_t bytes, unsigned long long *key) {
    size_t pitch;
    CUarray array = NULL;
    CUresult r;
    switch (kind) {
    case MANAGED: return api.mem_alloc_managed(key, bytes, 1);
    case PITCH: return api.mem_alloc_pitch(key, &pitch, bytes / 4, 4, 4);
    case ASYNC: return api.mem_alloc_async(key, bytes, NULL);
    case POOL: return api.mem_alloc_pool(key, bytes, NULL, NULL);
    case CREATE: return api.mem_create(key, bytes, NULL, 0);
    case ARRAY: {
        CUDA_ARRAY_DESCRIPTOR d = {bytes / 4, 1, CU_AD_FORMAT_FLOAT, 1};
        r = api.array_create(&array, &d);
        *key = (unsigned long long)(size_t)array;
        return r;
    }
    case ARRAY3D: {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes / 8, 2, 2, CU_AD_FORMAT_HALF, 1, 0};
        r = api.array3d_create(&array, &d);
        *key = (unsigned long long)(size_t)array;
        return r;
    }
    default: return api.mem_alloc(key, bytes);
    }
}

static CUresult release(int kind, unsigned long long key) {
    switch (kind) {
    case ASYNC:
    case POOL: return api.mem_free_async(key, NULL);
    case CREATE: return api.mem_release(key);
    case ARRAY:
    case ARRAY3D: return api.array_destroy((CUarray)(size_t)key);
    default: return api.mem_free(key);
    }
}

static void print_info(const char *prefix) {
    size_t free_bytes = 0, total = 0;
    CUresult r = api.mem_get_info(&free_bytes, &total);
    printf("{%s\"free\": %zu, \"total\": %zu, \"result\": %d}\n", prefix, free_bytes, total, r);
    fflush(stdout);
}

static int alloc_command(int argc, char **argv) {
    int kind = -1;
    for (int i = 0; i < 8; i++)
        if (strcmp(argv[2], kinds[i]) == 0)
            kind = i;
    if (kind < 0 || argc < 5)
        return 2;
    size_t bytes = strtoull(argv[3], NULL, 10);
    long count = strtol(argv[4], NULL, 10);
    unsigned long long *keys = calloc((size_t)count, sizeof *keys);
    long granted = 0;
    CUresult refused = 0;
    while (granted < count) {
        CUresult r = allocate(kind, bytes, &keys[granted]);
        if (r != CUDA_SUCCESS) {
            refused = r;
            break;
        }
        granted++;
    }
    printf("{\"granted\": %ld, \"refused\": %d}\n", granted, refused);
    fflush(stdout);
    if (argc > 5 && strcmp(argv[5], "hold") == 0)
        while (getchar() != EOF) {
        }
    long freed = 0;
    for (long i = 0; i < granted; i++)
        freed += release(kind, keys[i]) == CUDA_SUCCESS;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "\"freed\": %ld, ", freed);
    print_info(prefix);
    return 0;
}

static int launch_command(int argc, char **argv) {
    if (argc < 5)
        return 2;
    long n = strtol(argv[2], NULL, 10);
    unsigned grid = (unsigned)strtoul(argv[3], NULL, 10), block = (unsigned)strtoul(argv[4], NULL, 10);
    const char *kind = argc > 5 ? argv[5] : "kernel";
    if (getenv("PROBE_SAY_READY")) {
        printf("{\"ready\": true}\n"); /* the next thing it does is the first launch */
        fflush(stdout);
    }
    for (long i = 1; i <= n; i++) {
        CUresult r;
        if (strcmp(kind, "ex") == 0) {
            CUlaunchConfig c = {grid, 1, 1, block, 1, 1, 0, NULL, NULL, 0};
            r = api.launch_ex(&c, NULL, NULL, NULL);
        } else if (strcmp(kind, "cooperative") == 0) {
            r = api.launch_cooperative(NULL, grid, 1, 1, block, 1, 1, 0, NULL, NULL);
        } else if (strcmp(kind, "graph") == 0) {
            r = api.graph_launch(NULL, NULL);
        } else {
            r = api.launch(NULL, grid, 1, 1, block, 1, 1, 0, NULL, NULL, NULL);
        }
        if (r != CUDA_SUCCESS) {
            printf("{\"error\": %d}\n", r);
            return 1;
        }
        printf("{\"launched\": %ld}\n", i);
        fflush(stdout);
    }
    return 0;
}

/* asks for all the compute it can get: launches back to back until killed */
static int saturate_command(int argc, char **argv) {
    if (argc < 4)
        return 2;
    unsigned grid = (unsigned)strtoul(argv[2], NULL, 10), block = (unsigned)strtoul(argv[3], NULL, 10);
    printf("{\"saturating\": true}\n");
    fflush(stdout);
    for (;;) {
        CUresult r = api.launch(NULL, grid, 1, 1, block, 1, 1, 0, NULL, NULL, NULL);
        if (r != CUDA_SUCCESS) {
            printf("{\"error\": %d}\n", r);
            return 1;
        }
    }
}

static int bench_command(int argc, char **argv) {
    if (argc < 3)
        return 2;
    long n = strtol(argv[2], NULL, 10);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < n; i++)
        if (api.launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
            return 1;
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (double)(end.tv_sec - start.tv_sec) * 1e9 + (double)(end.tv_nsec - start.tv_nsec);
    printf("{\"launches\": %ld, \"ns_per_launch\": %.1f}\n", n, ns / (double)n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    if (strcmp(argv[1], "next-dlsym") == 0) {
        void *next = dlsym(RTLD_NEXT, "dlsym");
        printf("{\"next_is_interposer\": %s}\n", next == (void *)dlsym ? "true" : "false");
        return 0;
    }
    resolve();
    CUdevice device;
    CUcontext ctx;
    if (api.init(0) != CUDA_SUCCESS || api.device_get(&device, getenv("PROBE_DEVICE") ? atoi(getenv("PROBE_DEVICE")) : 0) != CUDA_SUCCESS ||
        api.ctx_create(&ctx, 0, device) != CUDA_SUCCESS) {
        fprintf(stderr, "no device\n");
        return 3;
    }
    if (strcmp(argv[1], "info") == 0) {
        print_info("");
        return 0;
    }
    if (strcmp(argv[1], "alloc") == 0)
        return alloc_command(argc, argv);
    if (strcmp(argv[1], "launch") == 0)
        return launch_command(argc, argv);
    if (strcmp(argv[1], "bench") == 0)
        return bench_command(argc, argv);
    if (strcmp(argv[1], "saturate") == 0)
        return saturate_command(argc, argv);
    return 2;
}
