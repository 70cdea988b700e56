/* Internals shared by the simulated libcudart, libnccl and the rank program.
 *
 * All simulator clocks are CLOCK_MONOTONIC nanoseconds (the clock BPF timestamps use).
 * libnccl reaches stream state only through the __rankechosim_* functions libcudart exports
 * (never through public cuda* calls), so probes on public symbols see only what the
 * application itself called, as with the real NCCL, which links its own static cudart.
 */
#ifndef RANKECHO_SIM_INT_H
#define RANKECHO_SIM_INT_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_runtime_api.h"

#define SIM_EXPORT __attribute__((visibility("default")))

/* First statement of an exported function that touches no stack: GCC 12 gives such trivial leaves no
 * frame even with -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer; asking for the frame address
 * makes it begin with `push %rbp`, so a uprobe's stack there keeps its caller (docs/sim.md). */
#ifdef SIM_ENTRY_FRAMES
#define SIM_ENTRY_FRAME() __asm__ volatile("" : : "r"(__builtin_frame_address(0)))
#else
#define SIM_ENTRY_FRAME() ((void)0) /* the `make FRAME_POINTERS=` build: as compilers leave them */
#endif

/* Environment knobs (read once per process). Defaults in parentheses. */
#define SIM_ENV_NS_PER_BLOCK "RANKECHO_SIM_NS_PER_BLOCK" /* GPU ns per thread block (1000) */
#define SIM_ENV_MALLOC_GBPS "RANKECHO_SIM_MALLOC_GBPS"   /* cudaMalloc mapping rate (10) */
#define SIM_ENV_PCIE_GBPS "RANKECHO_SIM_PCIE_GBPS"       /* memcpy rate (25) */
#define SIM_ENV_BUS_GBPS "RANKECHO_SIM_BUS_GBPS"         /* collective bus bandwidth (80) */
#define SIM_ENV_LAT_US "RANKECHO_SIM_LAT_US"             /* per-collective latency (20) */
#define SIM_ENV_BIND_ADDR "RANKECHO_SIM_BIND_ADDR"       /* bootstrap/hub address (127.0.0.1) */
#define SIM_ENV_DEVICES "RANKECHO_SIM_DEVICES"           /* cudaGetDeviceCount (8) */

#define SIM_DEFAULT_NS_PER_BLOCK 1000.0
#define SIM_DEFAULT_MALLOC_GBPS 10.0
#define SIM_DEFAULT_PCIE_GBPS 25.0
#define SIM_DEFAULT_BUS_GBPS 80.0
#define SIM_DEFAULT_LAT_US 20.0

static inline int64_t sim_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t sim_realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Block (off-CPU) until the monotonic clock reaches `deadline_ns`. */
static inline void sim_sleep_until(int64_t deadline_ns) {
    struct timespec ts = {deadline_ns / 1000000000LL, deadline_ns % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* Burn CPU (on-CPU, runnable) until the monotonic clock reaches `deadline_ns`. */
static inline void sim_spin_until(int64_t deadline_ns) {
    while (sim_now_ns() < deadline_ns) {
    }
}

static inline double sim_env_double(const char *name, double fallback) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return fallback;
    char *end = NULL;
    double d = strtod(v, &end);
    return (end != v && d > 0) ? d : fallback;
}

/* Nanoseconds a cudaMalloc of `bytes` spends mapping pages (off-CPU, in the "driver"). */
static inline int64_t sim_malloc_ns(size_t bytes) {
    double gbps = sim_env_double(SIM_ENV_MALLOC_GBPS, SIM_DEFAULT_MALLOC_GBPS);
    return 20000 + (int64_t)((double)bytes / gbps);
}

/* --- Stream work items owned by libnccl (exported by libcudart) ------------------------ */

/* Called (with no stream lock held) when the GPU reaches an external item: every earlier item on
 * the stream is done at `gpu_ready_ns` (monotonic). `handle` is what to pass to
 * __rankechosim_stream_complete; the callback may run before push_external returns. */
typedef void (*sim_ready_fn)(void *ctx, void *handle, int64_t gpu_ready_ns);

/* Queue an item whose completion time is decided later (a collective). Returns 0, or -1 for an
 * invalid stream or no memory. */
SIM_EXPORT int __rankechosim_stream_push_external(cudaStream_t stream, sim_ready_fn ready,
                                                    void *ctx);
/* The external item `handle` finished at `done_ns`; later work on its stream may proceed. */
SIM_EXPORT void __rankechosim_stream_complete(void *handle, int64_t done_ns);
/* The calling thread's current device (what cudaGetDevice/cudaSetDevice see), without going
 * through the public, probe-visible entry points. */
SIM_EXPORT int __rankechosim_device(void);
SIM_EXPORT void __rankechosim_set_device(int device);
/* Multiply the duration of kernels launched from now on (1.0 = healthy GPU). */
SIM_EXPORT void __rankechosim_set_gpu_slowdown(double factor);
/* slow_link: divide this process's transfer bandwidth by `rank_factor` on every communicator and by
 * `nic_factor` on communicators that span more than one node (1.0 = healthy). libnccl reads them when a
 * collective is enqueued (__rankechosim_link_slowdown) and the hub slows the whole instance. */
SIM_EXPORT void __rankechosim_set_link_slowdown(double rank_factor, double nic_factor);
SIM_EXPORT void __rankechosim_link_slowdown(double *rank_factor, double *nic_factor);

#endif
