/*
 * VRAM: every allocation call reserves its bytes in the pod's accounting (accounting.c) before the
 * driver is asked, and is refused with CUDA_ERROR_OUT_OF_MEMORY when that would take the pod past
 * the slot's mem_limit (0 in the file means no VRAM limit). The bytes of each live allocation are
 * remembered by pointer (or VMM handle, or array) so that its free gives them back.
 * cuMemGetInfo_v2 reports the share: total = mem_limit, free = mem_limit - the pod's used bytes
 * (never more than the device really has free); "used" is the larger of the accounting's
 * bytes and the hypervisor's measured pod_memory_used, which also sees memory no hook counted.
 *
 * Sizes: managed memory counts in full; a pitched allocation counts pitch x height (reserved as
 * width rounded up to 512 x height first, corrected after); an array counts
 * width x height x depth x channels x element size (4 bytes for formats the table does not know);
 * memory kept by a stream-ordered pool after cuMemFreeAsync is not counted.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "limiter.h"

#define BUCKETS 4096

struct allocation {
    uint64_t key;
    uint64_t bytes;
    int slot;
    struct allocation *next;
};

static struct allocation *buckets[BUCKETS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket_of(uint64_t key) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 52) % BUCKETS; }

static void remember(uint64_t key, uint64_t bytes, int slot) {
    struct allocation *node = malloc(sizeof *node);
    if (!node)
        return; /* the bytes stay reserved: conservative */
    node->key = key;
    node->bytes = bytes;
    node->slot = slot;
    pthread_mutex_lock(&table_lock);
    node->next = buckets[bucket_of(key)];
    buckets[bucket_of(key)] = node;
    pthread_mutex_unlock(&table_lock);
}

static void forget(uint64_t key) {
    struct allocation *found = NULL;
    pthread_mutex_lock(&table_lock);
    for (struct allocation **link = &buckets[bucket_of(key)]; *link; link = &(*link)->next) {
        if ((*link)->key == key) {
            found = *link;
            *link = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    if (found) {
        tf_release(found->slot, found->bytes);
        free(found);
    }
}

uint64_t tf_share_used(int slot) {
    uint64_t reserved = tf_used(slot);
    uint64_t measured = tf_shm_u64(slot, TF_F_POD_MEMORY);
    return reserved > measured ? reserved : measured;
}

/* the slot whose limit applies to a new allocation of `bytes`, -1 for none; OOM when over */
static CUresult admit(uint64_t bytes, int *slot_out) {
    int slot = tf_current_slot();
    *slot_out = -1;
    if (slot < 0)
        return CUDA_SUCCESS;
    uint64_t limit = tf_mem_limit(slot);
    if (limit == 0)
        return CUDA_SUCCESS;
    if (!tf_reserve(slot, bytes, limit))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *slot_out = slot;
    return CUDA_SUCCESS;
}

/* after the driver answered: keep the reservation for a success, give it back otherwise */
static CUresult settle(CUresult result, int slot, uint64_t key, uint64_t bytes) {
    if (slot < 0)
        return result;
    if (result == CUDA_SUCCESS)
        remember(key, bytes, slot);
    else
        tf_release(slot, bytes);
    return result;
}

#define ALLOCATE(bytes, call, key_expr)                                                            \
    do {                                                                                           \
        int slot_;                                                                                 \
        CUresult admitted_ = admit((bytes), &slot_);                                               \
        if (admitted_ != CUDA_SUCCESS)                                                             \
            return admitted_;                                                                      \
        CUresult result_ = (call);                                                                 \
        return settle(result_, slot_, result_ == CUDA_SUCCESS ? (uint64_t)(key_expr) : 0, (bytes)); \
    } while (0)

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    ALLOCATE(bytes, TF_CALL_REAL(cuMemAlloc_v2, dptr, bytes), *dptr);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    ALLOCATE(bytes, TF_CALL_REAL(cuMemAllocManaged, dptr, bytes, flags), *dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    ALLOCATE(bytes, TF_CALL_REAL(cuMemAllocAsync, dptr, bytes, stream), *dptr);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    ALLOCATE(bytes, TF_CALL_REAL(cuMemAllocAsync_ptsz, dptr, bytes, stream), *dptr);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
    ALLOCATE(bytes, TF_CALL_REAL(cuMemAllocFromPoolAsync, dptr, bytes, pool, stream), *dptr);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
    ALLOCATE(bytes, TF_CALL_REAL(cuMemAllocFromPoolAsync_ptsz, dptr, bytes, pool, stream), *dptr);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    ALLOCATE(bytes, TF_CALL_REAL(cuMemCreate, handle, bytes, prop, flags), *handle);
}

static uint64_t element_bytes(int format) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4;
    }
}

static uint64_t at_least_one(size_t n) { return n ? (uint64_t)n : 1; }

CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
    uint64_t bytes = desc ? (uint64_t)desc->Width * at_least_one(desc->Height) * at_least_one(desc->NumChannels) *
                                element_bytes(desc->Format)
                          : 0;
    ALLOCATE(bytes, TF_CALL_REAL(cuArrayCreate_v2, array, desc), (uintptr_t)*array);
}

CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    uint64_t bytes = desc ? (uint64_t)desc->Width * at_least_one(desc->Height) * at_least_one(desc->Depth) *
                                at_least_one(desc->NumChannels) * element_bytes(desc->Format)
                          : 0;
    ALLOCATE(bytes, TF_CALL_REAL(cuArray3DCreate_v2, array, desc), (uintptr_t)*array);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int element) {
    uint64_t guess = (((uint64_t)width + 511) & ~(uint64_t)511) * at_least_one(height);
    int slot;
    CUresult admitted = admit(guess, &slot);
    if (admitted != CUDA_SUCCESS)
        return admitted;
    CUresult result = TF_CALL_REAL(cuMemAllocPitch_v2, dptr, pitch, width, height, element);
    if (slot < 0 || result != CUDA_SUCCESS)
        return settle(result, slot, 0, guess);
    uint64_t actual = (uint64_t)*pitch * at_least_one(height);
    if (actual > guess && !tf_reserve(slot, actual - guess, tf_mem_limit(slot))) {
        TF_CALL_REAL(cuMemFree_v2, *dptr);
        tf_release(slot, guess);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < guess)
        tf_release(slot, guess - actual);
    remember(*dptr, actual, slot);
    return CUDA_SUCCESS;
}

#define FREE(key, call)                                                                            \
    do {                                                                                           \
        CUresult result_ = (call);                                                                 \
        if (result_ == CUDA_SUCCESS)                                                               \
            forget((uint64_t)(key));                                                               \
        return result_;                                                                            \
    } while (0)

CUresult cuMemFree_v2(CUdeviceptr dptr) { FREE(dptr, TF_CALL_REAL(cuMemFree_v2, dptr)); }

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    FREE(dptr, TF_CALL_REAL(cuMemFreeAsync, dptr, stream));
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    FREE(dptr, TF_CALL_REAL(cuMemFreeAsync_ptsz, dptr, stream));
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { FREE(handle, TF_CALL_REAL(cuMemRelease, handle)); }

CUresult cuArrayDestroy(CUarray array) { FREE((uintptr_t)array, TF_CALL_REAL(cuArrayDestroy, array)); }

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    CUresult result = TF_CALL_REAL(cuMemGetInfo_v2, free_bytes, total_bytes);
    int slot = result == CUDA_SUCCESS ? tf_current_slot() : -1;
    uint64_t limit = slot >= 0 ? tf_mem_limit(slot) : 0;
    if (limit == 0)
        return result;
    uint64_t used = tf_share_used(slot);
    uint64_t share_free = used < limit ? limit - used : 0;
    if (free_bytes && share_free < *free_bytes)
        *free_bytes = (size_t)share_free;
    if (total_bytes)
        *total_bytes = (size_t)limit;
    return result;
}
