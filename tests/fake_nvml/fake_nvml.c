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
 *   FAKE_NVML_MIG         comma-separated indices of the GPUs whose MIG mode is on (default: none). Both
 *                         GPUs have the seven-slice 80 GB layout (profiles 19 1g.10gb, 15 1g.20gb,
 *                         14 2g.20gb, 9 3g.40gb, 5 4g.40gb, 0 7g.80gb with NVIDIA's placements);
 *                         GPU instances refuse misplaced or overlapping slots as the driver does
 *   FAKE_GPU_BUSY_CLOCK   the simulated machine's busy-time clock (tests/fake_cuda/busy_clock.h), which the
 *                         fake CUDA driver advances with each launch: GPU i's utilisation, its compute
 *                         processes (the ones that launched on it and are alive, 0 bytes each) and their
 *                         SM utilisation come from it, each over the last whole 250 ms sampling period
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../fake_cuda/busy_clock.h"

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_IN_USE 19
#define NVML_ERROR_INSUFFICIENT_RESOURCES 23
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
    int mig_of; /* a MIG device handle: 1 + the index of its GPU (0 on a whole GPU) */
} fake_device;

static fake_device devices[2] = {
    {"GPU-5f3a1c2e-0000-4000-8000-000000000a00", "NVIDIA A100-SXM4-80GB", 85899345920ULL, 1073741824ULL,
     "00000000:3B:00.0", 0, 0x3b, 8, 0, 0, 6912, 42, 10, 250123, 51, 1000, 500,
     1, {4242}, {1073741824ULL}, {37}, 0},
    {"GPU-9b1d7e44-1111-4111-8111-000000000b01", "NVIDIA H100 80GB HBM3", 85520809984ULL, 2684354560ULL,
     "00000000:86:00.0", 0, 0x86, 9, 0, -2, 16896, 7, 3, 110500, 38, 0, 0,
     2, {5151, 5252}, {2147483648ULL, 536870912ULL}, {5, 2}, 0},
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
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
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

static int is_mig_handle(nvmlDevice_t d);

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned len) {
    if (initialised && is_mig_handle(d)) return copy_string(uuid, len, d->uuid);
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

/* --- the busy-time clock (FAKE_GPU_BUSY_CLOCK) ----------------------------------------------------- */

#define SAMPLE_PERIOD_NS 250000000ULL

struct window {
    uint64_t start_ns, start_busy; /* 0 start: no period begun */
    unsigned percent;              /* the last whole period's busy share */
};

static struct window device_windows[2];
static struct window process_windows[BUSY_CLOCK_ENTRIES][2];

static const struct busy_clock *busy_clock(void) {
    static const struct busy_clock *mapped;
    static char mapped_path[512];
    const char *path = getenv("FAKE_GPU_BUSY_CLOCK");
    if (!path || !*path) return NULL;
    if (mapped && strcmp(path, mapped_path) == 0) return mapped;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    const struct busy_clock *clock = NULL;
    if (lseek(fd, 0, SEEK_END) >= (off_t)sizeof *clock) {
        void *map = mmap(NULL, sizeof *clock, PROT_READ, MAP_SHARED, fd, 0);
        clock = map == MAP_FAILED ? NULL : map;
    }
    close(fd);
    if (clock) {
        mapped = clock;
        snprintf(mapped_path, sizeof mapped_path, "%s", path);
    }
    return clock;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* the busy share of the last whole sampling period, as NVML reports utilisation */
static unsigned windowed_percent(struct window *w, uint64_t busy) {
    uint64_t now = now_ns();
    if (w->start_ns == 0 || busy < w->start_busy) {
        w->start_ns = now;
        w->start_busy = busy;
        w->percent = 0;
    } else if (now - w->start_ns >= SAMPLE_PERIOD_NS) {
        double share = (double)(busy - w->start_busy) / (double)(now - w->start_ns);
        w->percent = share >= 1.0 ? 100u : (unsigned)(share * 100.0 + 0.5);
        w->start_ns = now;
        w->start_busy = busy;
    }
    return w->percent;
}

static int process_alive(uint64_t pid) { return pid != 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM); }

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *util) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (is_lost(d)) return NVML_ERROR_GPU_IS_LOST;
    const struct busy_clock *clock = busy_clock();
    int i = index_of(d);
    util->gpu = clock ? windowed_percent(&device_windows[i], __atomic_load_n(&clock->busy_ns[i], __ATOMIC_RELAXED))
                      : d->util_gpu;
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

/* the clock's entries of processes alive that launched on GPU i, at most `cap` (their indices) */
static unsigned clock_processes(const struct busy_clock *clock, int i, unsigned *entries, unsigned cap) {
    unsigned n = 0;
    for (unsigned e = 0; e < BUSY_CLOCK_ENTRIES && n < cap; e++) {
        uint64_t pid = __atomic_load_n(&clock->entries[e].pid, __ATOMIC_ACQUIRE);
        if (process_alive(pid) && __atomic_load_n(&clock->entries[e].busy_ns[i], __ATOMIC_RELAXED) > 0)
            entries[n++] = e;
    }
    return n;
}

static nvmlReturn_t clock_running_processes(const struct busy_clock *clock, nvmlDevice_t d, unsigned *count,
                                            nvmlProcessInfo_t *infos) {
    unsigned entries[BUSY_CLOCK_ENTRIES];
    unsigned n = clock_processes(clock, index_of(d), entries, BUSY_CLOCK_ENTRIES);
    if (*count < n || infos == NULL) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < n; k++) {
        infos[k].pid = (unsigned)clock->entries[entries[k]].pid;
        infos[k].usedGpuMemory = 0;
        infos[k].gpuInstanceId = 0xFFFFFFFFu;
        infos[k].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t clock_process_utilization(const struct busy_clock *clock, nvmlDevice_t d,
                                              nvmlProcessUtilizationSample_t *samples, unsigned *count) {
    int i = index_of(d);
    unsigned entries[BUSY_CLOCK_ENTRIES];
    unsigned n = clock_processes(clock, i, entries, BUSY_CLOCK_ENTRIES);
    if (samples == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < n; k++) {
        const struct busy_clock_entry *entry = &clock->entries[entries[k]];
        memset(&samples[k], 0, sizeof(samples[k]));
        samples[k].pid = (unsigned)entry->pid;
        samples[k].timeStamp = now_ns() / 1000;
        samples[k].smUtil = windowed_percent(&process_windows[entries[k]][i],
                                             __atomic_load_n(&entry->busy_ns[i], __ATOMIC_RELAXED));
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *infos) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (busy_clock()) return clock_running_processes(busy_clock(), d, count, infos);
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
    if (busy_clock()) return clock_process_utilization(busy_clock(), d, samples, count);
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

/* --- MIG ------------------------------------------------------------------------------------------ */

#define MIG_MAX_INSTANCES 7
#define NAME_V2 96
#define NVML_DEVICE_MIG_ENABLE 1
#define GI_PROFILE_COUNT 0x12
#define CI_PROFILE_COUNT 0x9

typedef struct { unsigned start, size; } nvmlGpuInstancePlacement_t;
typedef struct {
    unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NAME_V2];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct {
    unsigned version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[NAME_V2];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    int index;            /* NVML_GPU_INSTANCE_PROFILE_* this profile answers */
    unsigned id;          /* GPU-instance profile ID */
    const char *name;
    unsigned slices;      /* compute slices */
    unsigned size;        /* memory slots a placement covers */
    unsigned starts_mask; /* bit s: the profile may start at slot s */
    unsigned long long memory_mb;
    unsigned instances;
} gi_profile;

static const gi_profile profiles[] = {
    {0x0, 19, "MIG 1g.10gb", 1, 1, 0x7F, 9856, 7},
    {0x9, 15, "MIG 1g.20gb", 1, 2, 0x55, 19968, 4},
    {0x1, 14, "MIG 2g.20gb", 2, 2, 0x15, 19968, 3},
    {0x2, 9, "MIG 3g.40gb", 3, 4, 0x11, 40192, 2},
    {0x3, 5, "MIG 4g.40gb", 4, 4, 0x01, 40192, 1},
    {0x4, 0, "MIG 7g.80gb", 7, 8, 0x01, 80384, 1},
};
#define PROFILE_TOTAL (sizeof(profiles) / sizeof(profiles[0]))

/* compute-instance profile index -> compute slices (NVML_COMPUTE_INSTANCE_PROFILE_*) */
static const unsigned ci_slices[CI_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 1, 7};

struct fake_gi;
typedef struct fake_ci {
    struct fake_gi *gi;
    int used;
    unsigned id, profile_id;
} fake_ci;

typedef struct fake_gi {
    int used;
    int gpu;
    unsigned id;
    const gi_profile *profile;
    unsigned start;
    fake_ci ci;
    char mig_uuid[64];
    fake_device mig; /* the MIG device handle of this instance's compute instance */
} fake_gi;

typedef fake_gi *nvmlGpuInstance_t;
typedef fake_ci *nvmlComputeInstance_t;
typedef struct {
    nvmlDevice_t device;
    unsigned id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct { unsigned start, size; } nvmlComputeInstancePlacement_t;
typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

static fake_gi instances[2][MIG_MAX_INSTANCES];
static unsigned next_gi_id = 1;

static int is_mig_handle(nvmlDevice_t d) {
    return d != NULL && d->mig_of > 0;
}

static int mig_enabled(int gpu) {
    const char *v = getenv("FAKE_NVML_MIG");
    if (!v) return 0;
    for (const char *p = v; *p; p++) {
        if (*p >= '0' && *p <= '9' && (p == v || p[-1] == ',') && atoi(p) == gpu) return 1;
    }
    return 0;
}

static nvmlReturn_t check_mig(nvmlDevice_t d) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    return mig_enabled(index_of(d)) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static const gi_profile *profile_by_id(unsigned id) {
    for (unsigned i = 0; i < PROFILE_TOTAL; i++)
        if (profiles[i].id == id) return &profiles[i];
    return NULL;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *current, unsigned *pending) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = (unsigned)mig_enabled(index_of(d));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < PROFILE_TOTAL; i++) {
        if (profiles[i].index != (int)profile) continue;
        unsigned version = info->version;
        memset(info, 0, sizeof(*info));
        info->version = version;
        info->id = profiles[i].id;
        info->sliceCount = profiles[i].slices;
        info->instanceCount = profiles[i].instances;
        info->multiprocessorCount = 14 * profiles[i].slices;
        info->memorySizeMB = profiles[i].memory_mb;
        strncpy(info->name, profiles[i].name, sizeof(info->name) - 1);
        return NVML_SUCCESS;
    }
    return profile < GI_PROFILE_COUNT ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned profileId,
                                                           nvmlGpuInstancePlacement_t *placements, unsigned *count) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    const gi_profile *p = profile_by_id(profileId);
    if (!p || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned s = 0; s < 8; s++) {
        if (!(p->starts_mask & (1u << s))) continue;
        if (placements) {
            if (n >= *count) return NVML_ERROR_INSUFFICIENT_SIZE;
            placements[n].start = s;
            placements[n].size = p->size;
        }
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

static int overlaps(int gpu, unsigned start, unsigned size) {
    for (int i = 0; i < MIG_MAX_INSTANCES; i++) {
        const fake_gi *g = &instances[gpu][i];
        if (g->used && start < g->start + g->profile->size && g->start < start + size) return 1;
    }
    return 0;
}

static nvmlReturn_t create_gi(nvmlDevice_t d, unsigned profileId, int start, nvmlGpuInstance_t *out) {
    nvmlReturn_t r = check_mig(d);
    if (r) return r;
    const gi_profile *p = profile_by_id(profileId);
    if (!p || !out) return NVML_ERROR_INVALID_ARGUMENT;
    int gpu = index_of(d);
    if (start >= 0) {
        if (start > 7 || !(p->starts_mask & (1u << start))) return NVML_ERROR_INVALID_ARGUMENT;
        if (overlaps(gpu, (unsigned)start, p->size)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else {
        for (int s = 0; s < 8 && start < 0; s++)
            if ((p->starts_mask & (1u << s)) && !overlaps(gpu, (unsigned)s, p->size)) start = s;
        if (start < 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    for (int i = 0; i < MIG_MAX_INSTANCES; i++) {
        fake_gi *g = &instances[gpu][i];
        if (g->used) continue;
        memset(g, 0, sizeof(*g));
        g->used = 1;
        g->gpu = gpu;
        g->id = next_gi_id++;
        g->profile = p;
        g->start = (unsigned)start;
        *out = g;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned profileId, nvmlGpuInstance_t *out) {
    return create_gi(d, profileId, -1, out);
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *out) {
    if (!placement) return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(d, profileId, (int)placement->start, out);
}

static nvmlReturn_t check_gi(nvmlGpuInstance_t gi) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    for (int gpu = 0; gpu < 2; gpu++)
        for (int i = 0; i < MIG_MAX_INSTANCES; i++)
            if (gi == &instances[gpu][i] && gi->used) return NVML_SUCCESS;
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (gi->ci.used) return NVML_ERROR_IN_USE;
    gi->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned id, nvmlGpuInstance_t *out) {
    nvmlReturn_t r = check_mig(d);
    if (r) return r;
    for (int i = 0; i < MIG_MAX_INSTANCES; i++) {
        fake_gi *g = &instances[index_of(d)][i];
        if (g->used && g->id == id) {
            *out = g;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    info->device = &devices[gi->gpu];
    info->id = gi->id;
    info->profileId = gi->profile->id;
    info->placement.start = gi->start;
    info->placement.size = gi->profile->size;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gi, unsigned profile,
                                                           unsigned engProfile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (engProfile != 0 || profile >= CI_PROFILE_COUNT || !info) return NVML_ERROR_INVALID_ARGUMENT;
    if (ci_slices[profile] > gi->profile->slices || profile > 6) return NVML_ERROR_NOT_SUPPORTED;
    unsigned version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    info->id = profile;
    info->sliceCount = ci_slices[profile];
    info->instanceCount = gi->profile->slices / ci_slices[profile];
    info->multiprocessorCount = 14 * ci_slices[profile];
    snprintf(info->name, sizeof(info->name), "MIG %uc.%s", ci_slices[profile], gi->profile->name + 4);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned profileId,
                                                  nvmlComputeInstance_t *out) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (profileId >= CI_PROFILE_COUNT || !out) return NVML_ERROR_INVALID_ARGUMENT;
    if (ci_slices[profileId] > gi->profile->slices) return NVML_ERROR_NOT_SUPPORTED;
    if (gi->ci.used) return NVML_ERROR_INSUFFICIENT_RESOURCES; /* one compute instance per GPU instance here */
    gi->ci.gi = gi;
    gi->ci.used = 1;
    gi->ci.id = 0;
    gi->ci.profile_id = profileId;
    snprintf(gi->mig_uuid, sizeof(gi->mig_uuid), "MIG-%08x-aaaa-4bbb-8ccc-%012x", 0xfa4e0000u + gi->id,
             (unsigned)gi->gpu * 16u + gi->start);
    memset(&gi->mig, 0, sizeof(gi->mig));
    gi->mig.uuid = gi->mig_uuid;
    gi->mig.name = gi->profile->name;
    gi->mig.total = gi->profile->memory_mb * 1024ULL * 1024ULL;
    gi->mig.mig_of = gi->gpu + 1;
    *out = &gi->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!ci || !ci->used || check_gi(ci->gi)) return NVML_ERROR_INVALID_ARGUMENT;
    ci->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned id, nvmlComputeInstance_t *out) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (!gi->ci.used || gi->ci.id != id) return NVML_ERROR_NOT_FOUND;
    *out = &gi->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!ci || !ci->used || !info) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &devices[ci->gi->gpu];
    info->gpuInstance = ci->gi;
    info->id = ci->id;
    info->profileId = ci->profile_id;
    info->placement.start = 0;
    info->placement.size = ci_slices[ci->profile_id];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned *count) {
    nvmlReturn_t r = check(d);
    if (r) return r;
    *count = mig_enabled(index_of(d)) ? MIG_MAX_INSTANCES : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned index, nvmlDevice_t *mig) {
    nvmlReturn_t r = check_mig(d);
    if (r) return r;
    if (index >= MIG_MAX_INSTANCES || !mig) return NVML_ERROR_INVALID_ARGUMENT;
    fake_gi *g = &instances[index_of(d)][index];
    if (!g->used || !g->ci.used) return NVML_ERROR_NOT_FOUND;
    *mig = &g->mig;
    return NVML_SUCCESS;
}

static fake_gi *gi_of_mig(nvmlDevice_t d) {
    for (int gpu = 0; gpu < 2; gpu++)
        for (int i = 0; i < MIG_MAX_INSTANCES; i++)
            if (d == &instances[gpu][i].mig && instances[gpu][i].used && instances[gpu][i].ci.used)
                return &instances[gpu][i];
    return NULL;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned *id) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    fake_gi *g = gi_of_mig(d);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    *id = g->id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned *id) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    fake_gi *g = gi_of_mig(d);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    *id = g->ci.id;
    return NVML_SUCCESS;
}
