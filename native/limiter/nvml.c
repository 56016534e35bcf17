/*
 * NVML's memory query reports the pod's share, so that nvidia-smi and monitoring inside the pod
 * show the limit, not the whole device: for a device whose UUID is in an active slot with a
 * mem_limit, total = mem_limit, used = the larger of the pod's reserved bytes (accounting.c) and
 * the hypervisor's measured pod_memory_used, free = total - used (never below 0). The real
 * NVML comes from dlopen("libnvidia-ml.so.1"); calling these never loads the CUDA driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>

#include "limiter.h"

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef int (*memory_info_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef int (*memory_info_v2_fn)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef int (*get_uuid_fn)(nvmlDevice_t, char *, unsigned);

#define NVML_SUCCESS 0
#define NVML_ERROR_LIBRARY_NOT_FOUND 12

static memory_info_fn real_memory_info;
static memory_info_v2_fn real_memory_info_v2;
static get_uuid_fn real_get_uuid;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void load_nvml(void) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml)
        return;
    real_memory_info = (memory_info_fn)tf_library_symbol(nvml, "nvmlDeviceGetMemoryInfo");
    real_memory_info_v2 = (memory_info_v2_fn)tf_library_symbol(nvml, "nvmlDeviceGetMemoryInfo_v2");
    real_get_uuid = (get_uuid_fn)tf_library_symbol(nvml, "nvmlDeviceGetUUID");
}

/* the limit and the used bytes of the device's slot; 0 when the device is not limited */
static uint64_t share_of(nvmlDevice_t device, uint64_t *used) {
    char uuid[96];
    if (!tf_limits_enabled() || !real_get_uuid || real_get_uuid(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return 0;
    int slot = tf_slot_of_uuid_text(uuid);
    if (slot < 0 || !tf_shm_u32(slot, TF_F_ACTIVE))
        return 0;
    uint64_t limit = tf_mem_limit(slot);
    *used = tf_share_used(slot);
    if (*used > limit)
        *used = limit;
    return limit;
}

TF_EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    pthread_once(&nvml_once, load_nvml);
    if (!real_memory_info)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    int result = real_memory_info(device, memory);
    uint64_t used = 0, limit = result == NVML_SUCCESS && memory ? share_of(device, &used) : 0;
    if (limit) {
        memory->total = limit;
        memory->used = used;
        memory->free = limit - used;
    }
    return result;
}

TF_EXPORT int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    pthread_once(&nvml_once, load_nvml);
    if (!real_memory_info_v2)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    int result = real_memory_info_v2(device, memory);
    uint64_t used = 0, limit = result == NVML_SUCCESS && memory ? share_of(device, &used) : 0;
    if (limit) {
        memory->total = limit;
        memory->reserved = 0;
        memory->used = used;
        memory->free = limit - used;
    }
    return result;
}

void *tf_nvml_wrapper(const char *name) {
    if (__builtin_strcmp(name, "nvmlDeviceGetMemoryInfo") == 0)
        return (void *)nvmlDeviceGetMemoryInfo;
    if (__builtin_strcmp(name, "nvmlDeviceGetMemoryInfo_v2") == 0)
        return (void *)nvmlDeviceGetMemoryInfo_v2;
    return NULL;
}
