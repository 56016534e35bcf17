/*
 * Finding the real driver and handing out the limiter's wrappers wherever a program looks.
 *
 * Programs reach driver entry points three ways, and each must end at a wrapper:
 *   - by direct linking: the wrappers are exported under the driver's names, so with LD_PRELOAD
 *     the dynamic linker binds the program to them first;
 *   - through dlsym (a program or library that dlopens libcuda.so.1): this library exports its own
 *     dlsym, which asks glibc's and swaps in the wrapper when the name is a hooked one;
 *   - through cuGetProcAddress(_v2), which the CUDA 12 runtime uses for nearly everything: the hook
 *     asks the real one, and when the pointer it got is the real function behind a wrapper, it
 *     hands out the wrapper instead (comparing pointers, not names, so versioned and per-thread
 *     variants are matched exactly as the driver chose them).
 * The real functions come from dlopen("libcuda.so.1") and glibc's own dlsym, found with
 * dlvsym(RTLD_NEXT, "dlsym", ...) so that no lookup of ours ever goes through the interposer.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "limiter.h"

typedef void *(*dlsym_fn)(void *, const char *);

void *tf_real_fn[TF_HOOK_COUNT];

#define TF_HOOK_NAME(name) #name,
static const char *const hook_names[TF_HOOK_COUNT] = {TF_HOOKS(TF_HOOK_NAME)};
#undef TF_HOOK_NAME
#define TF_HOOK_ADDRESS(name) (void *)name,
static void *const hook_wrappers[TF_HOOK_COUNT] = {TF_HOOKS(TF_HOOK_ADDRESS)};
#undef TF_HOOK_ADDRESS

static _Atomic(dlsym_fn) glibc_dlsym_cached;
static void *driver;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static dlsym_fn glibc_dlsym(void) {
    dlsym_fn found = atomic_load(&glibc_dlsym_cached);
    if (found)
        return found;
    /* glibc >= 2.34 keeps dlsym in libc with both versions; older ones only have GLIBC_2.2.5 */
    found = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!found)
        found = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    atomic_store(&glibc_dlsym_cached, found);
    return found;
}

static void load_driver(void) {
    dlsym_fn lookup = glibc_dlsym();
    driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!driver || !lookup) {
        tf_say("cannot load the CUDA driver (libcuda.so.1): %s", driver ? "no dlsym in libc" : dlerror());
        return;
    }
    for (int i = 0; i < TF_HOOK_COUNT; i++)
        tf_real_fn[i] = lookup(driver, hook_names[i]);
}

void tf_ensure_real(void) { pthread_once(&real_once, load_driver); }

void *tf_library_symbol(void *library, const char *name) {
    dlsym_fn lookup = glibc_dlsym();
    return lookup ? lookup(library, name) : NULL;
}

void *tf_real_symbol(const char *name) {
    tf_ensure_real();
    dlsym_fn lookup = glibc_dlsym();
    return driver && lookup ? lookup(driver, name) : NULL;
}

static int hook_by_name(const char *symbol) {
    if (!symbol || symbol[0] != 'c' || symbol[1] != 'u')
        return -1;
    for (int i = 0; i < TF_HOOK_COUNT; i++)
        if (strcmp(symbol, hook_names[i]) == 0)
            return i;
    return -1;
}

static void *nvml_hook(const char *symbol) {
    return symbol && symbol[0] == 'n' && symbol[1] == 'v' ? tf_nvml_wrapper(symbol) : NULL;
}

static void *wrapper_for_real(void *real) {
    if (!real)
        return NULL;
    for (int i = 0; i < TF_HOOK_COUNT; i++)
        if (tf_real_fn[i] == real)
            return hook_wrappers[i];
    return NULL;
}

/*
 * glibc resolves RTLD_NEXT relative to the object that called dlsym, found from the return
 * address. Names that are not hooked are therefore passed on by a tail call (a jump, so the
 * caller's return address is what glibc sees): dlsym(RTLD_NEXT, ...) keeps meaning "after the
 * caller", not "after this library". Hooked names get the wrapper whatever the lookup found.
 */
TF_EXPORT void *dlsym(void *handle, const char *symbol) {
    dlsym_fn lookup = glibc_dlsym();
    if (!lookup)
        return NULL;
    int hook = hook_by_name(symbol);
    void *nvml = hook < 0 ? nvml_hook(symbol) : NULL;
    if (hook < 0 && !nvml)
        return lookup(handle, symbol);
    if (nvml)
        return lookup(handle, symbol) ? nvml : NULL;
    void *found = lookup(handle, symbol);
    /* no driver loading here: a driver that looks itself up while it loads must not wait on us */
    return found ? hook_wrappers[hook] : NULL;
}

/* the hooked symbol the driver chose for a cuGetProcAddress request (its versioned, per-thread name) */
static int hook_for_request(const char *symbol, int cuda_version, unsigned long long flags) {
    static const char *const versioned[] = {"cuMemAlloc", "cuMemAllocPitch", "cuMemFree", "cuMemGetInfo",
                                            "cuArrayCreate", "cuArray3DCreate"};
    static const char *const per_thread[] = {"cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
                                             "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
                                             "cuGraphLaunch"};
    char name[96];
    size_t length = strlen(symbol);
    if (length + 6 > sizeof name)
        return -1;
    memcpy(name, symbol, length + 1);
    for (size_t i = 0; i < sizeof versioned / sizeof *versioned; i++)
        if (cuda_version >= 3020 && strcmp(symbol, versioned[i]) == 0)
            memcpy(name + length, "_v2", 4);
    if (cuda_version >= 12000 && strcmp(symbol, "cuGetProcAddress") == 0)
        memcpy(name + length, "_v2", 4);
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        for (size_t i = 0; i < sizeof per_thread / sizeof *per_thread; i++)
            if (strcmp(symbol, per_thread[i]) == 0)
                memcpy(name + length, "_ptsz", 6);
    return hook_by_name(name);
}

static void swap_in_wrapper(const char *symbol, void **pfn, int cuda_version, unsigned long long flags) {
    void *wrapper = wrapper_for_real(*pfn);
    if (!wrapper && *pfn && symbol) {
        /* the driver may hand out internal entry points that differ from its exported symbols */
        int hook = hook_for_request(symbol, cuda_version, flags);
        if (hook >= 0 && tf_real_fn[hook])
            wrapper = hook_wrappers[hook];
    }
    if (wrapper)
        *pfn = wrapper;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags) {
    CUresult result = TF_CALL_REAL(cuGetProcAddress, symbol, pfn, cuda_version, flags);
    if (result == CUDA_SUCCESS && pfn)
        swap_in_wrapper(symbol, pfn, cuda_version, flags);
    return result;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, unsigned long long flags,
                             int *status) {
    CUresult result = TF_CALL_REAL(cuGetProcAddress_v2, symbol, pfn, cuda_version, flags, status);
    if (result == CUDA_SUCCESS && pfn)
        swap_in_wrapper(symbol, pfn, cuda_version, flags);
    return result;
}
