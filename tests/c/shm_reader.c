/*
 * What a C limiter sees in tfusion's shared-memory file: maps it and reads every field at the
 * offsets of the V2 layout (reference hypervisor §5.2), written here as numbers on purpose, so this
 * program checks the file and not a shared header. Built by tests/c/__init__.py with gcc.
 *
 *   shm_reader FILE                 print every field as one JSON object
 *   shm_reader FILE take SLOT COST  subtract COST tokens from SLOT as a limiter does per kernel
 *                                   (compare-and-swap, only when that many are there)
 *   shm_reader FILE pids            take the PID-set lock (CAS 0 -> own pid), print the set, unlock
 *   shm_reader FILE lock-and-exit   take the PID-set lock and exit holding it (a dead holder)
 */
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_SIZE 35504
#define DEVICES 8
#define ENTRY_SIZE 136
#define MAX_DEVICES 16
#define OFF_UUID 0
#define OFF_UP_LIMIT 64
#define OFF_MEM_LIMIT 72
#define OFF_CORES 80
#define OFF_POD_MEMORY 88
#define OFF_REFILL 96
#define OFF_CAPACITY 104
#define OFF_TOKENS 112
#define OFF_LAST_UPDATE 120
#define OFF_ACTIVE 128
#define DEVICE_COUNT 2184
#define HEARTBEAT 2192
#define PID_LOCK 2200
#define PID_VALUES 2208
#define PID_CAPACITY 2048
#define PID_BITMAP 18592
#define PID_LEN 34976
#define PID_OWNER 34984

static unsigned char *base;

static uint32_t load32(size_t off) { return __atomic_load_n((uint32_t *)(base + off), __ATOMIC_SEQ_CST); }
static uint64_t load64(size_t off) { return __atomic_load_n((uint64_t *)(base + off), __ATOMIC_SEQ_CST); }
static double loadf(size_t off) {
    uint64_t bits = load64(off);
    double value;
    memcpy(&value, &bits, sizeof value);
    return value;
}
static size_t dev(int slot, size_t field) { return DEVICES + (size_t)slot * ENTRY_SIZE + field; }

static void print_pids(void) {
    int first = 1;
    printf("[");
    for (int slot = 0; slot < PID_CAPACITY; slot++) {
        uint64_t word = load64(PID_BITMAP + (size_t)(slot / 64) * 8);
        if (word & ((UINT64_C(1) << 63) >> (slot & 63))) {
            printf("%s%" PRIu64, first ? "" : ",", load64(PID_VALUES + (size_t)slot * 8));
            first = 0;
        }
    }
    printf("]");
}

static int lock_pids(void) {
    uint64_t me = (uint64_t)getpid();
    for (int tries = 0; tries < 2000000; tries++) {
        uint64_t expected = 0;
        if (__atomic_compare_exchange_n((uint64_t *)(base + PID_LOCK), &expected, me, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return 1;
        sched_yield();
    }
    return 0;
}

static void unlock_pids(void) {
    uint64_t me = (uint64_t)getpid();
    __atomic_compare_exchange_n((uint64_t *)(base + PID_LOCK), &me, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static int take(int slot, double cost) {
    uint64_t *word = (uint64_t *)(base + dev(slot, OFF_TOKENS));
    uint64_t seen = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    for (;;) {
        double current, next;
        memcpy(&current, &seen, sizeof current);
        if (current < cost) return 0;
        next = current - cost;
        uint64_t bits;
        memcpy(&bits, &next, sizeof bits);
        if (__atomic_compare_exchange_n(word, &seen, bits, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 1;
    }
}

static void dump(void) {
    printf("{\"size\":%d,\"discriminant\":%" PRIu32 ",\"device_count\":%" PRIu32 ",\"last_heartbeat\":%" PRIu64
           ",\"devices\":[",
           FILE_SIZE, load32(0), load32(DEVICE_COUNT), load64(HEARTBEAT));
    int first = 1;
    for (int slot = 0; slot < MAX_DEVICES; slot++) {
        if (!load32(dev(slot, OFF_ACTIVE))) continue;
        char uuid[65];
        memcpy(uuid, base + dev(slot, OFF_UUID), 64);
        uuid[64] = 0;
        printf("%s{\"slot\":%d,\"uuid\":\"%s\",\"up_limit\":%" PRIu32 ",\"mem_limit\":%" PRIu64
               ",\"total_cuda_cores\":%" PRIu32 ",\"pod_memory_used\":%" PRIu64
               ",\"refill_rate\":%.17g,\"capacity\":%.17g,\"tokens\":%.17g,\"last_token_update\":%.17g"
               ",\"is_active\":%" PRIu32 "}",
               first ? "" : ",", slot, uuid, load32(dev(slot, OFF_UP_LIMIT)), load64(dev(slot, OFF_MEM_LIMIT)),
               load32(dev(slot, OFF_CORES)), load64(dev(slot, OFF_POD_MEMORY)), loadf(dev(slot, OFF_REFILL)),
               loadf(dev(slot, OFF_CAPACITY)), loadf(dev(slot, OFF_TOKENS)), loadf(dev(slot, OFF_LAST_UPDATE)),
               load32(dev(slot, OFF_ACTIVE)));
        first = 0;
    }
    printf("],\"pid_lock_holder\":%" PRIu64 ",\"pid_len\":%" PRIu64 ",\"pid_owner\":%" PRIu64 ",\"pids\":",
           load64(PID_LOCK), load64(PID_LEN), load64(PID_OWNER));
    print_pids();
    printf("}\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [take SLOT COST | pids | lock-and-exit]\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 1; }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != FILE_SIZE) {
        fprintf(stderr, "size %lld, expected %d\n", (long long)st.st_size, FILE_SIZE);
        return 1;
    }
    base = mmap(NULL, FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 1; }
    close(fd);
    if (argc == 2) {
        dump();
    } else if (argc == 5 && strcmp(argv[2], "take") == 0) {
        int slot = atoi(argv[3]);
        double cost = atof(argv[4]);
        double before = loadf(dev(slot, OFF_TOKENS));
        int ok = take(slot, cost);
        printf("{\"taken\":%s,\"before\":%.17g,\"after\":%.17g}\n", ok ? "true" : "false", before,
               loadf(dev(slot, OFF_TOKENS)));
    } else if (argc == 3 && strcmp(argv[2], "pids") == 0) {
        if (!lock_pids()) { fprintf(stderr, "PID-set lock held by %" PRIu64 "\n", load64(PID_LOCK)); return 3; }
        printf("{\"holder\":%" PRIu64 ",\"len\":%" PRIu64 ",\"pids\":", load64(PID_LOCK), load64(PID_LEN));
        print_pids();
        printf("}\n");
        unlock_pids();
    } else if (argc == 3 && strcmp(argv[2], "lock-and-exit") == 0) {
        if (!lock_pids()) return 3;
        printf("{\"holder\":%d}\n", getpid());
    } else {
        fprintf(stderr, "unknown command\n");
        return 2;
    }
    return 0;
}
