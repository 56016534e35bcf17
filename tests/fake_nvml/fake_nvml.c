/*
 * A fake libnvidia-ml.so.1 for tests: a two-GPU node (an A100 and an H100) behind the NVML C API,
 * so that nvidia-ml-py's real ctypes code runs against it without a driver. Only the symbols
 * tfusion's NVML backend uses are implemented; anything else is missing, like on an old driver.
 *
 * Knobs (environment, read on every call):
 *   FAKE_NVML_GPU_COUNT   number of GPUs present (0..2, default 2)
 *   FAKE_NVML_INIT_ERROR  nvmlInitWithFlags fails with NVML_ERROR_DRIVER_NOT_LOADED
 *   FAKE_NVML_LOST_INDEX  that GPU answers memory and utilisation queries with GPU_IS_LOST
 *   FAKE_NVML_GONE_INDEX  that GPU has no handle at all (GPU_IS_LOST from nvmlDeviceGetHandleByIndex)
 *   FAKE_NVML_XID         "index:xid": one XID critical event, delivered once per distinct value
 *   FAKE_NVML_NO_EVENTS   event registration is NOT_SUPPORTED
 *   FAKE_NVML_NVLINKS     number of active NVLink links (of 4) joining the two GPUs (default 0)
 *   FAKE_NVML_TOPOLOGY    common ancestor level of the two GPUs (NVML_TOPOLOGY_*, default 50 = SYSTEM);
 *                         -1: the call is NOT_SUPPORTED
 */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define XID_CRITICAL_ERROR 0x8ULL

typedef struct {
    const char *uuid;
    const char *name;
    unsigned long long total;
    unsigned long long used;
    const char *bus_id;
    unsigned domain, bus;
    int cc_major, cc_minor;
    int numa; /* -2: NVML says NOT_SUPPORTED (callers fall back to sysfs) */
    unsigned cores;
    unsigned util_gpu, util_mem;
    unsigned power_mw, temp_c, pcie_rx_kb, pcie_tx_kb;
    int nprocs;
    unsigned pids[4];
    unsigned long long proc_mem[4];
    unsigned proc_sm[4];
} fake_device;

static fake_device devices[2] = {
    {"GPU-5f3a1c2e-0000-4000-8000-000000000a00", "NVIDIA A100-SXM4-80GB", 85899345920ULL, 1073741824ULL,
     "00000000:3B:00.0", 0, 0x3b, 8, 0, 0, 6912, 42, 10, 250123, 51, 1000, 500,
     1, {4242}, {1073741824ULL}, {37}},
    {"GPU-9b1d7e44-1111-4111-8111-000000000b01", "NVIDIA H100 80GB HBM3", 85520809984ULL, 2684354560ULL,
     "00000000:86:00.0", 0, 0x86, 9, 0, -2, 16896, 7, 3, 110500, 38, 0, 0,
     2, {5151, 5252}, {2147483648ULL, 536870912ULL}, {5, 2}},
};

static int initialised = 0;
static char delivered_xid[64] = "";

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned pid;
    unsigned long long timeStamp;
    unsigned smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef fake_device *nvmlDevice_t;
typedef struct { int registered; } fake_event_set;
typedef fake_event_set *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static int gpu_count(void) {
    const char *v = getenv("FAKE_NVML_GPU_COUNT");
    int n = v ? atoi(v) : 2;
    return n < 0 ? 0 : (n > 2 ? 2 : n);
}

static int index_of(nvmlDevice_t d) {
    if (d == &devices[0]) return 0;
    if (d == &devices[1]) return 1;
    return -1;
}

static nvmlReturn_t check(nvmlDevice_t d) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int i = index_of(d);
    if (i < 0 || i >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static int is_lost(nvmlDevice_t d) {
    const char *v = getenv("FAKE_NVML_LOST_INDEX");
    return v && *v && atoi(v) == index_of(d);
}

static nvmlReturn_t copy_string(char *out, unsigned len, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (getenv("FAKE_NVML_INIT_ERROR")) return NVML_ERROR_DRIVER_NOT_LOADED;
    initialised++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Fake NVML error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned len) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, len, "550.54.15");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned)gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if ((int)index >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    const char *gone = getenv("FAKE_NVML_GONE_INDEX");
    if (gone && *gone && atoi(gone) == (int)index) return NVML_ERROR_GPU_IS_LOST;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned len) {
    nvmlReturn_t r = check(d);
    return r ? r : copy_string(uuid, len, d->uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned len) {
    nvmlReturn_t r = check(d);
    return r ? r : copy_string(name, len, d->name);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *index) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    *index = (unsigned)index_of(d);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (is_lost(d)) return NVML_ERROR_GPU_IS_LOST;
    memory->total = d->total;
    memory->used = d->used;
    memory->free = d->total - d->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    memset(pci, 0, sizeof(*pci));
    strncpy(pci->busIdLegacy, d->bus_id + 4, sizeof(pci->busIdLegacy) - 1);
    strncpy(pci->busId, d->bus_id, sizeof(pci->busId) - 1);
    pci->domain = d->domain;
    pci->bus = d->bus;
    pci->pciDeviceId = 0x20b210de;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    *major = d->cc_major;
    *minor = d->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, int *node) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (d->numa == -2) return NVML_ERROR_NOT_SUPPORTED;
    *node = d->numa;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t d, unsigned *cores) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    *cores = d->cores;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *util) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (is_lost(d)) return NVML_ERROR_GPU_IS_LOST;
    util->gpu = d->util_gpu;
    util->memory = d->util_mem;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned *mw) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    *mw = d->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned *temp) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;
    *temp = d->temp_c;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned *value) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (counter == 0) *value = d->pcie_tx_kb;
    else if (counter == 1) *value = d->pcie_rx_kb;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *infos) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    unsigned n = (unsigned)d->nprocs;
    if (*count < n || infos == NULL) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        infos[i].pid = d->pids[i];
        infos[i].usedGpuMemory = d->proc_mem[i];
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                             unsigned *count, unsigned long long lastSeen) {
    (void)lastSeen;
    nvmlReturn_t r = check(d);
    if (r) return r;
    unsigned n = (unsigned)d->nprocs;
    if (samples == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        memset(&samples[i], 0, sizeof(samples[i]));
        samples[i].pid = d->pids[i];
        samples[i].timeStamp = 1700000000000000ULL;
        samples[i].smUtil = d->proc_sm[i];
    }
    *count = n;
    return NVML_SUCCESS;
}

#define FAKE_NVLINK_LINKS 4

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    nvmlReturn_t r = check(a);
    if (r || (r = check(b))) return r;
    if (!level) return NVML_ERROR_INVALID_ARGUMENT;
    int value = env_int("FAKE_NVML_TOPOLOGY", 50);
    if (value < 0) return NVML_ERROR_NOT_SUPPORTED;
    *level = a == b ? 0 : value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned link, int *active) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (link >= FAKE_NVLINK_LINKS || !active) return NVML_ERROR_INVALID_ARGUMENT;
    *active = (int)link < env_int("FAKE_NVML_NVLINKS", 0) && gpu_count() == 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned link, nvmlPciInfo_t *pci) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (link >= FAKE_NVLINK_LINKS || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    if ((int)link >= env_int("FAKE_NVML_NVLINKS", 0) || gpu_count() != 2) return NVML_ERROR_NOT_SUPPORTED;
    fake_device *peer = &devices[1 - index_of(d)];
    memset(pci, 0, sizeof(*pci));
    strncpy(pci->busId, peer->bus_id, sizeof(pci->busId) - 1);
    pci->domain = peer->domain;
    pci->bus = peer->bus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof(fake_event_set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (getenv("FAKE_NVML_NO_EVENTS")) return NVML_ERROR_NOT_SUPPORTED;
    if (!(types & XID_CRITICAL_ERROR)) return NVML_ERROR_NOT_SUPPORTED;
    set->registered = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms) {
    (void)timeoutms;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    const char *v = getenv("FAKE_NVML_XID");
    if (set && set->registered && v && *v && strcmp(v, delivered_xid) != 0) {
        int index = 0, xid = 0;
        if (sscanf(v, "%d:%d", &index, &xid) == 2 && index >= 0 && index < gpu_count()) {
            strncpy(delivered_xid, v, sizeof(delivered_xid) - 1);
            memset(data, 0, sizeof(*data));
            data->device = &devices[index];
            data->eventType = XID_CRITICAL_ERROR;
            data->eventData = (unsigned long long)xid;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}
