/*
 * A fake CUDA driver (libcuda.so.1) for testing tfusion's limiter without a GPU: devices with fixed
 * UUIDs, contexts, the allocation and launch calls over host memory (anonymous mappings reserved,
 * not committed), cuMemGetInfo_v2 from the bytes handed out, and a simulated busy-time clock
 * (each launch adds grid x block x FAKE_CUDA_NS_PER_THREAD nanoseconds, default 1).
 *
 * Linked with -Bsymbolic, as a real driver is: its calls to itself never reach an interposer.
 * cuGetProcAddress(_v2) resolves versioned names as the real driver does (cuMemAlloc -> _v2, the
 * _ptsz variants for per-thread default streams). With FAKE_CUDA_PRIVATE_ENTRY_POINTS=1 it hands out
 * internal entry points for cuMemAlloc and cuLaunchKernel that differ from the exported symbols,
 * as a real driver may.
 *
 * Env: FAKE_CUDA_DEVICES (default 1), FAKE_CUDA_TOTAL_MIB (default 81920), FAKE_CUDA_UUIDS (comma-separated
 * UUIDs of devices 0, 1, ..., hex digits only counted, so an NVML-style "GPU-..." works; the default
 * otherwise), FAKE_GPU_BUSY_CLOCK (a file all processes of the simulated machine share: each launch
 * also adds its busy nanoseconds there, per device and per process, for the fake NVML to turn into
 * utilisation; layout in busy_clock.h).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "busy_clock.h"
#include "cuda_api.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 8

struct CUctx_st {
    CUdevice device;
};

static struct CUctx_st contexts[MAX_DEVICES];
static __thread CUcontext current;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t used_bytes;
static uint64_t launches;
static uint64_t busy_ns;
static uint64_t next_handle = 1;

struct block {
    unsigned long long key;
    void *host;
    size_t bytes;
    struct block *next;
};
static struct block *blocks;

static long env_long(const char *name, long fallback) {
    const char *text = getenv(name);
    return text && *text ? strtol(text, NULL, 10) : fallback;
}

static int device_count(void) {
    long n = env_long("FAKE_CUDA_DEVICES", 1);
    return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : (int)n;
}

static uint64_t total_bytes(void) { return (uint64_t)env_long("FAKE_CUDA_TOTAL_MIB", 81920) << 20; }

EXPORT CUresult cuInit(unsigned int flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuDriverGetVersion(int *version) { *version = 12040; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *count) { *count = device_count(); return CUDA_SUCCESS; }

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static int hex_value(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* the device'th entry of FAKE_CUDA_UUIDS as 16 bytes; 0 when there is none (or it is not 32 hex digits) */
static int configured_uuid(unsigned char out[16], CUdevice device) {
    const char *text = getenv("FAKE_CUDA_UUIDS");
    for (int skip = device; text && skip > 0; skip--) {
        text = strchr(text, ',');
        text = text ? text + 1 : NULL;
    }
    if (!text)
        return 0;
    int digits = 0;
    for (; *text && *text != ',' && digits < 32; text++) {
        if (*text == 'G' || *text == 'P' || *text == 'U') /* an NVML-style "GPU-" prefix */
            continue;
        int v = hex_value(*text);
        if (v < 0)
            continue;
        out[digits / 2] = (unsigned char)(digits % 2 ? (out[digits / 2] | v) : v << 4);
        digits++;
    }
    return digits == 32;
}

/* device i: 5f3a1c2e-7e57-4000-8000-0000000000<i>, unless FAKE_CUDA_UUIDS names it */
EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) {
    static const unsigned char base[16] = {0x5f, 0x3a, 0x1c, 0x2e, 0x7e, 0x57, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    if (device < 0 || device >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char configured[16];
    if (configured_uuid(configured, device)) {
        memcpy(uuid->bytes, configured, 16);
        return CUDA_SUCCESS;
    }
    memcpy(uuid->bytes, base, 16);
    uuid->bytes[15] = (char)device;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) { return cuDeviceGetUuid(uuid, device); }

EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device) {
    (void)flags;
    if (device < 0 || device >= device_count())
        return CUDA_ERROR_INVALID_VALUE;
    contexts[device].device = device;
    current = *ctx = &contexts[device];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = current; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx; return CUDA_SUCCESS; }

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    if (!current)
        return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    *device = current->device;
    return CUDA_SUCCESS;
}

static CUresult hand_out(unsigned long long *key, size_t bytes, int with_memory) {
    if (!current)
        return 201;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult result = CUDA_SUCCESS;
    if (used_bytes + bytes > total_bytes()) {
        result = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct block *b = calloc(1, sizeof *b);
        b->bytes = bytes;
        if (with_memory) {
            b->host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            b->key = (uint64_t)(uintptr_t)b->host;
        } else {
            b->key = next_handle++;
        }
        b->next = blocks;
        blocks = b;
        used_bytes += bytes;
        *key = b->key;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

static CUresult take_back(unsigned long long key) {
    pthread_mutex_lock(&lock);
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    for (struct block **link = &blocks; *link; link = &(*link)->next) {
        struct block *b = *link;
        if (b->key == key) {
            *link = b->next;
            used_bytes -= b->bytes;
            if (b->host)
                munmap(b->host, b->bytes);
            free(b);
            result = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) { return hand_out(dptr, bytes, 1); }
static CUresult private_mem_alloc(CUdeviceptr *dptr, size_t bytes) { return hand_out(dptr, bytes, 1); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    (void)flags;
    return hand_out(dptr, bytes, 1);
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int element) {
    (void)element;
    *pitch = (width + 511) & ~(size_t)511;
    return hand_out(dptr, *pitch * (height ? height : 1), 1);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    (void)stream;
    return hand_out(dptr, bytes, 1);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    return cuMemAllocAsync(dptr, bytes, stream);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
    (void)pool;
    (void)stream;
    return hand_out(dptr, bytes, 1);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
    return cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    (void)prop;
    (void)flags;
    return hand_out(handle, bytes, 0);
}

static size_t element(int format) {
    return format == CU_AD_FORMAT_UNSIGNED_INT8 || format == CU_AD_FORMAT_SIGNED_INT8 ? 1
           : format == CU_AD_FORMAT_UNSIGNED_INT16 || format == CU_AD_FORMAT_SIGNED_INT16 || format == CU_AD_FORMAT_HALF
               ? 2
               : 4;
}
static size_t one(size_t n) { return n ? n : 1; }

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *d) {
    unsigned long long key;
    CUresult r = hand_out(&key, d->Width * one(d->Height) * one(d->NumChannels) * element(d->Format), 1);
    if (r == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)key;
    return r;
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    unsigned long long key;
    CUresult r = hand_out(&key, d->Width * one(d->Height) * one(d->Depth) * one(d->NumChannels) * element(d->Format), 1);
    if (r == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return take_back(dptr); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) { (void)stream; return take_back(dptr); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) { return cuMemFreeAsync(dptr, stream); }
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return take_back(handle); }
EXPORT CUresult cuArrayDestroy(CUarray array) { return take_back((uint64_t)(uintptr_t)array); }

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    pthread_mutex_lock(&lock);
    *total = total_bytes();
    *free_bytes = total_bytes() - used_bytes;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static struct busy_clock *shared_clock;
static struct busy_clock_entry *own_entry;
static pthread_once_t clock_once = PTHREAD_ONCE_INIT;

/* map FAKE_GPU_BUSY_CLOCK and claim this process's entry (the first free one) */
static void open_shared_clock(void) {
    const char *path = getenv("FAKE_GPU_BUSY_CLOCK");
    if (!path || !*path)
        return;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    struct busy_clock *clock = NULL;
    off_t size = lseek(fd, 0, SEEK_END);
    if (size >= (off_t)sizeof *clock || ftruncate(fd, sizeof *clock) == 0) { /* growing it zero-fills */
        void *map = mmap(NULL, sizeof *clock, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        clock = map == MAP_FAILED ? NULL : map;
    }
    close(fd);
    if (!clock)
        return;
    uint64_t pid = (uint64_t)getpid();
    for (int i = 0; i < BUSY_CLOCK_ENTRIES; i++) {
        uint64_t free_pid = 0;
        if (__atomic_compare_exchange_n(&clock->entries[i].pid, &free_pid, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            own_entry = &clock->entries[i];
            break;
        }
    }
    shared_clock = clock;
}

static uint64_t monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* the launch runs after the device's queued work; a queue reaching BUSY_CLOCK_QUEUE_NS ahead makes
 * the caller wait, so the device's busy time never outruns the wall clock by more than that */
static void queue(uint64_t *busy_until, uint64_t ns) {
    uint64_t now = monotonic_ns();
    uint64_t seen = __atomic_load_n(busy_until, __ATOMIC_ACQUIRE), end;
    do {
        end = (seen > now ? seen : now) + ns;
    } while (!__atomic_compare_exchange_n(busy_until, &seen, end, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    if (end - now > BUSY_CLOCK_QUEUE_NS) {
        uint64_t wait = end - now - BUSY_CLOCK_QUEUE_NS;
        struct timespec pause = {(time_t)(wait / 1000000000ULL), (long)(wait % 1000000000ULL)};
        nanosleep(&pause, NULL);
    }
}

static CUresult run(uint64_t threads) {
    if (!current)
        return 201;
    uint64_t ns = threads * (uint64_t)env_long("FAKE_CUDA_NS_PER_THREAD", 1);
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&busy_ns, ns, __ATOMIC_RELAXED);
    pthread_once(&clock_once, open_shared_clock);
    int device = current->device;
    if (shared_clock && device < BUSY_CLOCK_DEVICES) {
        queue(&shared_clock->busy_until_ns[device], ns);
        __atomic_add_fetch(&shared_clock->busy_ns[device], ns, __ATOMIC_RELAXED);
        if (own_entry)
            __atomic_add_fetch(&own_entry->busy_ns[device], ns, __ATOMIC_RELAXED);
    }
    return CUDA_SUCCESS;
}

#define GRID(gx, gy, gz, bx, by, bz) ((uint64_t)(gx) * (gy) * (gz) * (bx) * (by) * (bz))
#define LAUNCH_ARGS                                                                                      \
    CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared, \
        CUstream stream, void **params
EXPORT CUresult cuLaunchKernel(LAUNCH_ARGS, void **extra) {
    (void)f, (void)shared, (void)stream, (void)params, (void)extra;
    return run(GRID(gx, gy, gz, bx, by, bz));
}
static CUresult private_launch(LAUNCH_ARGS, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
EXPORT CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
EXPORT CUresult cuLaunchCooperativeKernel(LAUNCH_ARGS) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_ARGS) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)f, (void)params, (void)extra;
    return run(GRID(c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ));
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(c, f, params, extra);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec graph, CUstream stream) {
    (void)graph, (void)stream;
    return run(1);
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec graph, CUstream stream) { return cuGraphLaunch(graph, stream); }

/* the simulated device: launches so far and busy nanoseconds */
EXPORT uint64_t fakeCudaLaunches(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }
EXPORT uint64_t fakeCudaBusyNs(void) { return __atomic_load_n(&busy_ns, __ATOMIC_RELAXED); }

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);

struct entry {
    const char *name;
    void *fn;
};
#define E(name) {#name, (void *)name}
static const struct entry table[] = {
    E(cuInit), E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGet), E(cuDeviceGetUuid), E(cuDeviceGetUuid_v2),
    E(cuCtxCreate_v2), E(cuCtxGetCurrent), E(cuCtxSetCurrent), E(cuCtxGetDevice), E(cuMemAlloc_v2),
    E(cuMemAllocManaged), E(cuMemAllocPitch_v2), E(cuMemAllocAsync), E(cuMemAllocAsync_ptsz),
    E(cuMemAllocFromPoolAsync), E(cuMemAllocFromPoolAsync_ptsz), E(cuMemCreate), E(cuArrayCreate_v2),
    E(cuArray3DCreate_v2), E(cuMemFree_v2), E(cuMemFreeAsync), E(cuMemFreeAsync_ptsz), E(cuMemRelease),
    E(cuArrayDestroy), E(cuMemGetInfo_v2), E(cuLaunchKernel), E(cuLaunchKernel_ptsz), E(cuLaunchCooperativeKernel),
    E(cuLaunchCooperativeKernel_ptsz), E(cuLaunchKernelEx), E(cuLaunchKernelEx_ptsz), E(cuGraphLaunch),
    E(cuGraphLaunch_ptsz), E(cuGetProcAddress), E(cuGetProcAddress_v2),
};

static void *find(const char *name) {
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].fn;
    return NULL;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    char name[128];
    void *fn = NULL;
    if (version >= 12000 && strcmp(symbol, "cuGetProcAddress") == 0)
        symbol = "cuGetProcAddress_v2";
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        fn = find(name);
    }
    if (!fn && version >= 3020) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        fn = find(name);
    }
    if (!fn)
        fn = find(symbol);
    if (fn && env_long("FAKE_CUDA_PRIVATE_ENTRY_POINTS", 0)) {
        if (fn == (void *)cuMemAlloc_v2)
            fn = (void *)private_mem_alloc;
        else if (fn == (void *)cuLaunchKernel)
            fn = (void *)private_launch;
    }
    if (status)
        *status = fn ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND */
    *pfn = fn;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
