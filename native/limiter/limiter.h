/*
 * Internal interface of libcuda_limiter.so: the hooked driver entry points, the real functions
 * behind them, the pod's shared-memory file and the pod's own memory accounting.
 */
#ifndef TFUSION_LIMITER_H
#define TFUSION_LIMITER_H

#include <stdint.h>

#include "cuda_api.h"

#define TF_EXPORT __attribute__((visibility("default")))

/* every driver entry point the limiter replaces; the order is the index into tf_real_fn */
#define TF_HOOKS(X)                                                                                \
    X(cuMemAlloc_v2) X(cuMemAllocManaged) X(cuMemAllocPitch_v2) X(cuMemAllocAsync)                 \
    X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz)             \
    X(cuMemCreate) X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuMemFree_v2) X(cuMemFreeAsync)     \
    X(cuMemFreeAsync_ptsz) X(cuMemRelease) X(cuArrayDestroy) X(cuMemGetInfo_v2) X(cuLaunchKernel)  \
    X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)                            \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch)                \
    X(cuGraphLaunch_ptsz) X(cuGetProcAddress) X(cuGetProcAddress_v2)

#define TF_HOOK_INDEX(name) TF_HOOK_##name,
enum { TF_HOOKS(TF_HOOK_INDEX) TF_HOOK_COUNT };
#undef TF_HOOK_INDEX

#define TF_DECLARE(ret, name, params)                                                              \
    typedef ret(*name##_fn) params;                                                                \
    TF_EXPORT ret name params;

TF_DECLARE(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytes))
TF_DECLARE(CUresult, cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytes, unsigned int flags))
TF_DECLARE(CUresult, cuMemAllocPitch_v2,
           (CUdeviceptr * dptr, size_t *pitch, size_t width, size_t height, unsigned int element))
TF_DECLARE(CUresult, cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytes, CUstream stream))
TF_DECLARE(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytes, CUstream stream))
TF_DECLARE(CUresult, cuMemAllocFromPoolAsync,
           (CUdeviceptr * dptr, size_t bytes, CUmemoryPool pool, CUstream stream))
TF_DECLARE(CUresult, cuMemAllocFromPoolAsync_ptsz,
           (CUdeviceptr * dptr, size_t bytes, CUmemoryPool pool, CUstream stream))
TF_DECLARE(CUresult, cuMemCreate,
           (CUmemGenericAllocationHandle * handle, size_t bytes, const CUmemAllocationProp *prop,
            unsigned long long flags))
TF_DECLARE(CUresult, cuArrayCreate_v2, (CUarray * array, const CUDA_ARRAY_DESCRIPTOR *desc))
TF_DECLARE(CUresult, cuArray3DCreate_v2, (CUarray * array, const CUDA_ARRAY3D_DESCRIPTOR *desc))
TF_DECLARE(CUresult, cuMemFree_v2, (CUdeviceptr dptr))
TF_DECLARE(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream))
TF_DECLARE(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream))
TF_DECLARE(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle))
TF_DECLARE(CUresult, cuArrayDestroy, (CUarray array))
TF_DECLARE(CUresult, cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes))
#define TF_LAUNCH_PARAMS                                                                           \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,             \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,        \
     void **extra)
TF_DECLARE(CUresult, cuLaunchKernel, TF_LAUNCH_PARAMS)
TF_DECLARE(CUresult, cuLaunchKernel_ptsz, TF_LAUNCH_PARAMS)
TF_DECLARE(CUresult, cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra))
TF_DECLARE(CUresult, cuLaunchKernelEx_ptsz,
           (const CUlaunchConfig *config, CUfunction f, void **params, void **extra))
#define TF_COOP_PARAMS                                                                             \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,             \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params)
TF_DECLARE(CUresult, cuLaunchCooperativeKernel, TF_COOP_PARAMS)
TF_DECLARE(CUresult, cuLaunchCooperativeKernel_ptsz, TF_COOP_PARAMS)
TF_DECLARE(CUresult, cuGraphLaunch, (CUgraphExec graph, CUstream stream))
TF_DECLARE(CUresult, cuGraphLaunch_ptsz, (CUgraphExec graph, CUstream stream))
TF_DECLARE(CUresult, cuGetProcAddress,
           (const char *symbol, void **pfn, int cuda_version, unsigned long long flags))
TF_DECLARE(CUresult, cuGetProcAddress_v2,
           (const char *symbol, void **pfn, int cuda_version, unsigned long long flags, int *status))

/* resolve.c: the real driver, loaded once on first use; NULL where the driver lacks a symbol */
extern void *tf_real_fn[TF_HOOK_COUNT];
void tf_ensure_real(void);
void *tf_real_symbol(const char *name);
/* glibc's dlsym on another library's handle (never the interposer) */
void *tf_library_symbol(void *library, const char *name);
/* dlsym hands out this library's NVML wrappers for these names */
void *tf_nvml_wrapper(const char *name);
#define TF_REAL(name) ((name##_fn)tf_real_fn[TF_HOOK_##name])
/* call the real `name` or say the driver is missing */
#define TF_CALL_REAL(name, ...)                                                                    \
    (tf_ensure_real(), TF_REAL(name) ? TF_REAL(name)(__VA_ARGS__) : CUDA_ERROR_STUB_LIBRARY)

/* config.c: the pod's limits, read once on the first intercepted call */
void tf_ensure_limits(void);
/* the shm slot of the calling thread's current device, or -1 when it is not limited */
int tf_current_slot(void);
int tf_limits_enabled(void);
/* the slot whose UUID matches (any case, with or without "GPU-", dashes ignored), or -1 */
int tf_slot_of_uuid_text(const char *uuid);
uint64_t tf_mem_limit(int slot);
/* one line on stderr, prefixed with the library's name */
void tf_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* shm fields of slot `slot` (atomic loads and stores; f64 as raw bits) */
uint32_t tf_shm_u32(int slot, unsigned field);
uint64_t tf_shm_u64(int slot, unsigned field);
double tf_shm_f64(int slot, unsigned field);
uint64_t tf_shm_heartbeat(void);
double *tf_shm_tokens(int slot);

#define TF_FILE_SIZE 35504u
#define TF_DISCRIMINANT_V2 1u
#define TF_MAX_DEVICES 16
#define TF_DEVICES_OFFSET 8u
#define TF_ENTRY_SIZE 136u
#define TF_F_UUID 0u
#define TF_F_UP_LIMIT 64u
#define TF_F_MEM_LIMIT 72u
#define TF_F_CORES 80u
#define TF_F_POD_MEMORY 88u
#define TF_F_REFILL 96u
#define TF_F_CAPACITY 104u
#define TF_F_TOKENS 112u
#define TF_F_LAST_UPDATE 120u
#define TF_F_ACTIVE 128u
#define TF_DEVICE_COUNT_OFFSET 2184u
#define TF_HEARTBEAT_OFFSET 2192u

/* accounting.c: the pod's bytes in use per device slot, shared by all its processes */
void tf_accounting_open(const char *shm_path);
/* reserve `bytes` on `slot` when that keeps the pod within `limit`; 1 when reserved */
int tf_reserve(int slot, uint64_t bytes, uint64_t limit);
void tf_release(int slot, uint64_t bytes);
uint64_t tf_used(int slot);
/* what the pod uses on `slot`: its reserved bytes or the hypervisor's measurement, the larger */
uint64_t tf_share_used(int slot);

/* register.c: POST /api/v1/process to the node's hypervisor, once, on a background thread */
void tf_register_with_hypervisor(void);

/* compute.c */
void tf_take_launch_tokens(int slot, uint64_t threads);

#endif
