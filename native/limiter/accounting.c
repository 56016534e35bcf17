/*
 * The pod's own VRAM accounting, shared by all of the pod's processes: the V2 layout has no field
 * that processes could reserve from (pod_memory_used is the hypervisor's periodic measurement), so
 * a small sibling file next to TF_SHM_PATH, `<dir>/limiter-accounting` (TF_LIMITER_ACCOUNTING_PATH
 * overrides), holds it. The hypervisor creates it empty beside the shm file with the shm file's
 * owner and mode (tfusion/hypervisor/shm/store.py), so every process that may open the shm file may
 * open it; a process creates it (0600) when it is missing. The first process sizes it.
 * Format (little-endian, version 1, 35,072 bytes; all zeroes is an empty table):
 *
 *     0     u32 magic 0x414C4654 ("TFLA")   4  u32 version (1)
 *     8     u64 used[16]                    bytes reserved on each device slot by all processes
 *     136   pad to 256
 *     256   entry[256], 136 bytes each:     u64 pid; u64 used[16] (this process's share of used[])
 *
 * Reserve-before-allocate: used[slot] is raised with compare-and-swap only when the result stays
 * within mem_limit, so concurrent processes can never overshoot; the real allocation follows, and
 * is undone (released) when the driver refuses it. Each process claims one entry and holds an
 * open-file-description write lock on the entry's first byte for its whole life; the kernel drops
 * that lock when the process dies, so any process that can take an entry's lock while the entry
 * names a pid knows its owner is gone and moves the entry's bytes out of used[] (done when a
 * reservation would fail and when an entry is claimed). This works across PID namespaces (the
 * pod's containers) because only the lock, never the pid, is trusted.
 *
 * Known limits: a process killed between raising used[] and recording it in its entry (two atomic
 * instructions) leaks that reservation until the file is removed (conservative: never an
 * overshoot); a child made by fork() shares its parent's entry; with all 256 entries taken a
 * process still reserves from used[] but its bytes are not reclaimed when it dies. When the file
 * cannot be created the limit is kept per process (one line on stderr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "limiter.h"

#define ACCT_MAGIC 0x414C4654u
#define ACCT_VERSION 1u
#define ACCT_ENTRIES 256
#define ACCT_ENTRIES_OFFSET 256u

struct acct_entry {
    uint64_t pid;
    uint64_t used[TF_MAX_DEVICES];
};

struct acct_file {
    uint32_t magic;
    uint32_t version;
    uint64_t used[TF_MAX_DEVICES];
    unsigned char pad[ACCT_ENTRIES_OFFSET - 8 - 8 * TF_MAX_DEVICES];
    struct acct_entry entries[ACCT_ENTRIES];
};

_Static_assert(sizeof(struct acct_entry) == 136, "entry size");
_Static_assert(sizeof(struct acct_file) == 35072, "accounting file size");

static struct acct_file *book;
static struct acct_entry *mine;
static int acct_fd = -1;

static int lock_entry(int index) {
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                         .l_start = (off_t)(ACCT_ENTRIES_OFFSET + (size_t)index * sizeof(struct acct_entry)),
                         .l_len = 1};
    return fcntl(acct_fd, F_OFD_SETLK, &lock) == 0;
}

static void unlock_entry(int index) {
    struct flock lock = {.l_type = F_UNLCK, .l_whence = SEEK_SET,
                         .l_start = (off_t)(ACCT_ENTRIES_OFFSET + (size_t)index * sizeof(struct acct_entry)),
                         .l_len = 1};
    fcntl(acct_fd, F_OFD_SETLK, &lock);
}

static void subtract_saturating(uint64_t *word, uint64_t amount) {
    uint64_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    uint64_t next;
    do {
        next = seen > amount ? seen - amount : 0;
    } while (!__atomic_compare_exchange_n(word, &seen, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
}

/* move a dead owner's bytes out of used[]; the caller holds the entry's lock */
static void reclaim_entry(struct acct_entry *entry) {
    for (int slot = 0; slot < TF_MAX_DEVICES; slot++) {
        uint64_t bytes = __atomic_exchange_n(&entry->used[slot], 0, __ATOMIC_ACQ_REL);
        if (bytes)
            subtract_saturating(&book->used[slot], bytes);
    }
    __atomic_store_n(&entry->pid, 0, __ATOMIC_RELEASE);
}

static int reclaim_dead(void) {
    int reclaimed = 0;
    if (acct_fd < 0)
        return 0;
    for (int i = 0; i < ACCT_ENTRIES; i++) {
        struct acct_entry *entry = &book->entries[i];
        if (entry == mine || !__atomic_load_n(&entry->pid, __ATOMIC_ACQUIRE))
            continue;
        if (lock_entry(i)) {
            if (__atomic_load_n(&entry->pid, __ATOMIC_ACQUIRE)) {
                reclaim_entry(entry);
                reclaimed = 1;
            }
            unlock_entry(i);
        }
    }
    return reclaimed;
}

static void claim_entry(void) {
    for (int i = 0; i < ACCT_ENTRIES; i++) {
        if (!lock_entry(i))
            continue; /* a live process holds it */
        struct acct_entry *entry = &book->entries[i];
        if (__atomic_load_n(&entry->pid, __ATOMIC_ACQUIRE))
            reclaim_entry(entry);
        __atomic_store_n(&entry->pid, (uint64_t)getpid(), __ATOMIC_RELEASE);
        mine = entry; /* the lock stays held until the process ends */
        return;
    }
    tf_say("all %d entries of the accounting file are taken: this process's VRAM is not reclaimed if it dies",
           ACCT_ENTRIES);
}

static struct acct_file *private_accounting(const char *why) {
    tf_say("%s: the VRAM limit is kept for this process alone", why);
    void *base = mmap(NULL, sizeof(struct acct_file), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return base == MAP_FAILED ? NULL : base;
}

static struct acct_file *map_shared(const char *path, char *why, size_t why_size) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(why, why_size, "cannot open the accounting file %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat info = {0};
    /* a new file is all zeroes, which is a valid empty table: growing it twice is harmless */
    if (fstat(fd, &info) != 0 || (info.st_size == 0 && ftruncate(fd, sizeof(struct acct_file)) != 0) ||
        (info.st_size != 0 && info.st_size != (off_t)sizeof(struct acct_file))) {
        snprintf(why, why_size, "the accounting file %s is not %zu bytes", path, sizeof(struct acct_file));
        close(fd);
        return NULL;
    }
    struct acct_file *base = mmap(NULL, sizeof *base, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(why, why_size, "cannot map the accounting file %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    uint32_t magic = 0;
    __atomic_compare_exchange_n(&base->magic, &magic, ACCT_MAGIC, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (magic != 0 && magic != ACCT_MAGIC) {
        snprintf(why, why_size, "the accounting file %s has magic %#x, not %#x", path, magic, ACCT_MAGIC);
        munmap(base, sizeof *base);
        close(fd);
        return NULL;
    }
    __atomic_store_n(&base->version, ACCT_VERSION, __ATOMIC_RELEASE);
    acct_fd = fd;
    return base;
}

void tf_accounting_open(const char *shm_path) {
    char path[PATH_MAX], why[PATH_MAX + 128];
    const char *override = getenv("TF_LIMITER_ACCOUNTING_PATH");
    if (override && *override) {
        snprintf(path, sizeof path, "%s", override);
    } else {
        const char *slash = strrchr(shm_path, '/');
        int dir_length = slash ? (int)(slash - shm_path) : 1;
        snprintf(path, sizeof path, "%.*s/limiter-accounting", dir_length, slash ? shm_path : ".");
    }
    book = map_shared(path, why, sizeof why);
    if (!book) {
        book = private_accounting(why);
        return;
    }
    claim_entry();
}

static int try_reserve(int slot, uint64_t bytes, uint64_t limit) {
    uint64_t seen = __atomic_load_n(&book->used[slot], __ATOMIC_ACQUIRE);
    do {
        if (bytes > limit || seen > limit - bytes)
            return 0;
    } while (!__atomic_compare_exchange_n(&book->used[slot], &seen, seen + bytes, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    if (mine)
        __atomic_add_fetch(&mine->used[slot], bytes, __ATOMIC_ACQ_REL);
    return 1;
}

int tf_reserve(int slot, uint64_t bytes, uint64_t limit) {
    if (!book)
        return 1;
    if (try_reserve(slot, bytes, limit))
        return 1;
    return reclaim_dead() && try_reserve(slot, bytes, limit);
}

void tf_release(int slot, uint64_t bytes) {
    if (!book)
        return;
    if (mine)
        subtract_saturating(&mine->used[slot], bytes);
    subtract_saturating(&book->used[slot], bytes);
}

uint64_t tf_used(int slot) { return book ? __atomic_load_n(&book->used[slot], __ATOMIC_ACQUIRE) : 0; }
