/*
 * Compute: every kernel launch takes tokens from its slot's erl_current_tokens before the driver
 * is asked; the hypervisor's ERL loop refills the bucket at the rate that keeps the device's
 * utilisation at the pod's up_limit (tfusion/hypervisor/limiter/erl.py). While the bucket is short
 * the launching thread sleeps (1 ms, doubling to 10 ms; never spinning) and tries again.
 *
 * Cost of one launch, in tokens: ceil(grid blocks x threads per block / total_cuda_cores), at least
 * 1 — one token for a launch that fills the device's CUDA cores once (1 token per launch when the
 * file has no core count). A graph launch costs 1 (its kernels are not visible here). The cost is
 * capped at the bucket's capacity so that a big launch can always go once the bucket is full.
 *
 * The subtract is a compare-and-swap loop on the f64's bits that only succeeds when the bucket
 * holds the whole cost (reference hypervisor §5.2). A heartbeat older than the grace period
 * (TF_LIMITER_HEARTBEAT_GRACE_S, default 10 s) means the hypervisor is gone: launches wait until it
 * is fresh again. Nothing here allocates or takes a lock.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "limiter.h"

#define SLEEP_FIRST_NS 1000000L
#define SLEEP_MAX_NS 10000000L
#define DEFAULT_GRACE_S 10

static long grace_s(void) {
    static long cached = -1;
    long seen = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (seen >= 0)
        return seen;
    const char *text = getenv("TF_LIMITER_HEARTBEAT_GRACE_S");
    char *end = NULL;
    long value = text ? strtol(text, &end, 10) : DEFAULT_GRACE_S;
    if (text && (end == text || *end || value <= 0)) {
        tf_say("TF_LIMITER_HEARTBEAT_GRACE_S=%s is not a positive whole number of seconds; using %d", text,
               DEFAULT_GRACE_S);
        value = DEFAULT_GRACE_S;
    }
    __atomic_store_n(&cached, value, __ATOMIC_RELAXED);
    return value;
}

static int heartbeat_fresh(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    uint64_t beat = tf_shm_heartbeat();
    return beat + (uint64_t)grace_s() >= (uint64_t)now.tv_sec;
}

static int take(double *tokens, double cost) {
    uint64_t *word = (uint64_t *)tokens;
    uint64_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    for (;;) {
        double current;
        memcpy(&current, &seen, sizeof current);
        if (!(current >= cost))
            return 0;
        double left = current - cost;
        uint64_t next;
        memcpy(&next, &left, sizeof next);
        if (__atomic_compare_exchange_n(word, &seen, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
    }
}

static double launch_cost(int slot, uint64_t threads) {
    uint32_t cores = tf_shm_u32(slot, TF_F_CORES);
    double cost = cores ? (double)((threads + cores - 1) / cores) : 1.0;
    if (cost < 1.0)
        cost = 1.0;
    double capacity = tf_shm_f64(slot, TF_F_CAPACITY);
    if (capacity >= 1.0 && cost > capacity)
        cost = capacity;
    return cost;
}

void tf_take_launch_tokens(int slot, uint64_t threads) {
    if (slot < 0)
        return;
    long pause = SLEEP_FIRST_NS;
    for (;;) {
        if (heartbeat_fresh() && take(tf_shm_tokens(slot), launch_cost(slot, threads)))
            return;
        struct timespec step = {0, pause};
        nanosleep(&step, NULL);
        pause = pause * 2 > SLEEP_MAX_NS ? SLEEP_MAX_NS : pause * 2;
        if (!tf_shm_u32(slot, TF_F_ACTIVE))
            return; /* the slot was taken away from the pod: nothing to enforce */
    }
}

static uint64_t threads_of(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
    return (uint64_t)gx * gy * gz * (uint64_t)bx * by * bz;
}

#define LAUNCH(name)                                                                               \
    CUresult name TF_LAUNCH_PARAMS {                                                               \
        tf_take_launch_tokens(tf_current_slot(), threads_of(gx, gy, gz, bx, by, bz));              \
        return TF_CALL_REAL(name, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);       \
    }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)

#define LAUNCH_COOPERATIVE(name)                                                                   \
    CUresult name TF_COOP_PARAMS {                                                                 \
        tf_take_launch_tokens(tf_current_slot(), threads_of(gx, gy, gz, bx, by, bz));              \
        return TF_CALL_REAL(name, f, gx, gy, gz, bx, by, bz, shared, stream, params);              \
    }
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel)
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX(name)                                                                            \
    CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {       \
        if (config)                                                                                \
            tf_take_launch_tokens(tf_current_slot(),                                               \
                                  threads_of(config->gridDimX, config->gridDimY, config->gridDimZ, \
                                             config->blockDimX, config->blockDimY, config->blockDimZ)); \
        return TF_CALL_REAL(name, config, f, params, extra);                                       \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define GRAPH_LAUNCH(name)                                                                         \
    CUresult name(CUgraphExec graph, CUstream stream) {                                            \
        tf_take_launch_tokens(tf_current_slot(), 0);                                               \
        return TF_CALL_REAL(name, graph, stream);                                                  \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)
