/*
 * The pod's limits: the shared-memory file the hypervisor writes (TF_SHM_PATH, the V2 layout of
 * reference hypervisor §5.2, 35,504 bytes, discriminant 1), mapped read-write once, on the first
 * intercepted call, and the shm slot of each CUDA device, found by UUID.
 *
 * Fail-safe: when the file is missing, unreadable, of the wrong size or not V2, or when
 * DISABLE_GPU_LIMITER=true, the process runs unlimited and says so in one line on stderr. A device
 * whose UUID is in no slot is not limited either (one line per such device).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "limiter.h"

#define MAX_ORDINALS 64
#define SLOT_UNKNOWN (-2)
#define SLOT_NONE (-1)

static unsigned char *shm;
static pthread_once_t limits_once = PTHREAD_ONCE_INIT;
static int ordinal_slot[MAX_ORDINALS];
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;

typedef CUresult (*ctx_get_device_fn)(CUdevice *);
typedef CUresult (*device_get_uuid_fn)(CUuuid *, CUdevice);
static ctx_get_device_fn real_ctx_get_device;
static device_get_uuid_fn real_device_get_uuid;

void tf_say(const char *fmt, ...) {
    char line[512];
    int used = snprintf(line, sizeof line, "tfusion-limiter[%d]: ", (int)getpid());
    va_list args;
    va_start(args, fmt);
    int more = vsnprintf(line + used, sizeof line - (size_t)used - 1, fmt, args);
    va_end(args);
    size_t length = (size_t)used + (more < 0 ? 0 : (size_t)more);
    if (length > sizeof line - 2)
        length = sizeof line - 2;
    line[length++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, length);
    (void)ignored;
}

static const char *map_shm(const char *path, unsigned char **out) {
    static char why[320];
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot open TF_SHM_PATH=%s: %s", path, strerror(errno));
        return why;
    }
    struct stat info = {0};
    if (fstat(fd, &info) != 0 || info.st_size != (off_t)TF_FILE_SIZE) {
        snprintf(why, sizeof why, "TF_SHM_PATH=%s has %lld bytes, the V2 layout has %u", path,
                 (long long)info.st_size, TF_FILE_SIZE);
        close(fd);
        return why;
    }
    void *base = mmap(NULL, TF_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(why, sizeof why, "cannot map TF_SHM_PATH=%s: %s", path, strerror(errno));
        return why;
    }
    uint32_t discriminant = __atomic_load_n((uint32_t *)base, __ATOMIC_ACQUIRE);
    if (discriminant != TF_DISCRIMINANT_V2) {
        snprintf(why, sizeof why, "TF_SHM_PATH=%s has layout discriminant %u, only %u (V2) is understood",
                 path, discriminant, TF_DISCRIMINANT_V2);
        munmap(base, TF_FILE_SIZE);
        return why;
    }
    *out = base;
    return NULL;
}

static void load_limits(void) {
    for (int i = 0; i < MAX_ORDINALS; i++)
        ordinal_slot[i] = SLOT_UNKNOWN;
    const char *disabled = getenv("DISABLE_GPU_LIMITER");
    if (disabled && strcasecmp(disabled, "true") == 0) {
        tf_say("DISABLE_GPU_LIMITER=true: this process runs without GPU limits");
        return;
    }
    const char *path = getenv("TF_SHM_PATH");
    if (!path || !*path) {
        tf_say("TF_SHM_PATH is not set: this process runs without GPU limits");
        return;
    }
    unsigned char *base = NULL;
    const char *why = map_shm(path, &base);
    if (why) {
        tf_say("%s: this process runs without GPU limits", why);
        return;
    }
    tf_accounting_open(path);
    shm = base;
    tf_register_with_hypervisor();
}

void tf_ensure_limits(void) { pthread_once(&limits_once, load_limits); }

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void resolve_device_calls(void) {
    real_ctx_get_device = (ctx_get_device_fn)tf_real_symbol("cuCtxGetDevice");
    real_device_get_uuid = (device_get_uuid_fn)tf_real_symbol("cuDeviceGetUuid_v2");
    if (!real_device_get_uuid)
        real_device_get_uuid = (device_get_uuid_fn)tf_real_symbol("cuDeviceGetUuid");
}

int tf_limits_enabled(void) {
    tf_ensure_limits();
    return shm != NULL;
}

static size_t field_offset(int slot, unsigned field) {
    return TF_DEVICES_OFFSET + (size_t)slot * TF_ENTRY_SIZE + field;
}

uint32_t tf_shm_u32(int slot, unsigned field) {
    return __atomic_load_n((uint32_t *)(shm + field_offset(slot, field)), __ATOMIC_ACQUIRE);
}

double tf_shm_f64(int slot, unsigned field) {
    uint64_t bits = __atomic_load_n((uint64_t *)(shm + field_offset(slot, field)), __ATOMIC_ACQUIRE);
    double value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

uint64_t tf_shm_u64(int slot, unsigned field) {
    return __atomic_load_n((uint64_t *)(shm + field_offset(slot, field)), __ATOMIC_ACQUIRE);
}

uint64_t tf_mem_limit(int slot) { return tf_shm_u64(slot, TF_F_MEM_LIMIT); }

uint64_t tf_shm_heartbeat(void) { return __atomic_load_n((uint64_t *)(shm + TF_HEARTBEAT_OFFSET), __ATOMIC_ACQUIRE); }

double *tf_shm_tokens(int slot) { return (double *)(shm + field_offset(slot, TF_F_TOKENS)); }

/* the UUID's hex digits without a "GPU-" prefix and without dashes, lowercase */
static void normalise_uuid(const char *text, char *out, size_t size) {
    if (strncasecmp(text, "GPU-", 4) == 0)
        text += 4;
    size_t n = 0;
    for (; *text && n + 1 < size; text++)
        if (*text != '-')
            out[n++] = (char)tolower((unsigned char)*text);
    out[n] = '\0';
}

static int slot_of_hex(const char *wanted) {
    char have[72], text[72];
    for (int slot = 0; slot < TF_MAX_DEVICES; slot++) {
        memcpy(text, shm + field_offset(slot, TF_F_UUID), 64);
        text[63] = '\0';
        normalise_uuid(text, have, sizeof have);
        if (have[0] && strcmp(have, wanted) == 0)
            return slot;
    }
    return SLOT_NONE;
}

int tf_slot_of_uuid_text(const char *uuid) {
    char wanted[72];
    normalise_uuid(uuid, wanted, sizeof wanted);
    return shm && wanted[0] ? slot_of_hex(wanted) : SLOT_NONE;
}

static int slot_of_uuid(const CUuuid *uuid) {
    char wanted[40];
    for (int i = 0; i < 16; i++)
        snprintf(wanted + 2 * i, 3, "%02x", (unsigned char)uuid->bytes[i]);
    int slot = slot_of_hex(wanted);
    if (slot >= 0)
        return slot;
    tf_say("device uuid %s is in no slot of TF_SHM_PATH: it is not limited in this process", wanted);
    return SLOT_NONE;
}

static int slot_of_ordinal(CUdevice device) {
    if (device < 0 || device >= MAX_ORDINALS)
        return SLOT_NONE;
    int slot = __atomic_load_n(&ordinal_slot[device], __ATOMIC_ACQUIRE);
    if (slot != SLOT_UNKNOWN)
        return slot;
    CUuuid uuid;
    if (!real_device_get_uuid || real_device_get_uuid(&uuid, device) != CUDA_SUCCESS)
        return SLOT_NONE; /* asked again next time: the driver may not be initialised yet */
    pthread_mutex_lock(&slot_lock);
    slot = ordinal_slot[device];
    if (slot == SLOT_UNKNOWN) {
        slot = slot_of_uuid(&uuid);
        __atomic_store_n(&ordinal_slot[device], slot, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&slot_lock);
    return slot;
}

int tf_current_slot(void) {
    if (!tf_limits_enabled())
        return SLOT_NONE;
    pthread_once(&driver_once, resolve_device_calls);
    if (!real_ctx_get_device)
        return SLOT_NONE;
    CUdevice device;
    if (real_ctx_get_device(&device) != CUDA_SUCCESS)
        return SLOT_NONE;
    int slot = slot_of_ordinal(device);
    if (slot >= 0 && !tf_shm_u32(slot, TF_F_ACTIVE))
        return SLOT_NONE;
    return slot;
}
