/*
 * The simulated machine's busy-time clock, shared by the fake CUDA driver (which adds each launch's
 * busy nanoseconds) and the fake NVML (which turns the increments into utilisation). A file named by
 * FAKE_GPU_BUSY_CLOCK, little-endian, all zeroes when new:
 *   u64 busy_ns[8]                      busy nanoseconds per device, all processes
 *   entry[64] { u64 pid; u64 busy_ns[8] }  one per process that launched (claimed by compare-and-swap
 *                                          of pid from 0; never reused: a test machine's lifetime)
 *   u64 busy_until_ns[8]                when each device's queued work ends (CLOCK_MONOTONIC): a device
 *                                          runs one launch at a time, so it is never more than 100 % busy
 */
#ifndef TFUSION_FAKE_BUSY_CLOCK_H
#define TFUSION_FAKE_BUSY_CLOCK_H

#include <stdint.h>

#define BUSY_CLOCK_DEVICES 8
#define BUSY_CLOCK_ENTRIES 64

struct busy_clock_entry {
    uint64_t pid;
    uint64_t busy_ns[BUSY_CLOCK_DEVICES];
};

struct busy_clock {
    uint64_t busy_ns[BUSY_CLOCK_DEVICES];
    struct busy_clock_entry entries[BUSY_CLOCK_ENTRIES];
    uint64_t busy_until_ns[BUSY_CLOCK_DEVICES];
};

/* how far ahead of now a device's queue may reach before a launch waits, as a full launch queue does */
#define BUSY_CLOCK_QUEUE_NS 20000000ULL

#endif
