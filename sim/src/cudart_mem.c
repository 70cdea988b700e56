/* Simulated libcudart, memory: fake device addresses (never dereferenced), cudaMalloc time spent
 * "mapping pages" off-CPU, cudaFree synchronising the device as the real one does, and copies
 * timed by a PCIe-like rate. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cudart_int.h"

#define FAKE_DEVICE_BASE 0x7e0000000000ULL
#define FAKE_DEVICE_BYTES (80ULL << 30)

struct alloc {
    uint64_t addr;
    size_t size;
};

static struct alloc *g_allocs; /* guarded by sim_rt_mu */
static size_t g_nallocs, g_cap_allocs;
static uint64_t g_next_addr = FAKE_DEVICE_BASE;
static double g_pcie_gbps = SIM_DEFAULT_PCIE_GBPS;

__attribute__((constructor)) static void mem_init(void) {
    g_pcie_gbps = sim_env_double(SIM_ENV_PCIE_GBPS, SIM_DEFAULT_PCIE_GBPS);
}

static int remember(uint64_t addr, size_t size) {
    if (g_nallocs == g_cap_allocs) {
        size_t cap = g_cap_allocs ? g_cap_allocs * 2 : 64;
        struct alloc *grown = realloc(g_allocs, cap * sizeof *grown);
        if (grown == NULL) return -1;
        g_allocs = grown;
        g_cap_allocs = cap;
    }
    g_allocs[g_nallocs++] = (struct alloc){addr, size};
    return 0;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (devPtr == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    size_t rounded = size ? (size + 511) & ~(size_t)511 : 512;
    pthread_mutex_lock(&sim_rt_mu);
    uint64_t addr = g_next_addr;
    if (addr + rounded > FAKE_DEVICE_BASE + FAKE_DEVICE_BYTES || remember(addr, size) != 0) {
        pthread_mutex_unlock(&sim_rt_mu);
        return sim_rt_fail(cudaErrorMemoryAllocation);
    }
    g_next_addr += rounded;
    pthread_mutex_unlock(&sim_rt_mu);
    sim_sleep_until(sim_now_ns() + sim_malloc_ns(size));
    *devPtr = (void *)(uintptr_t)addr;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr) {
    if (devPtr == NULL) return cudaSuccess;
    sim_rt_device_sync();
    pthread_mutex_lock(&sim_rt_mu);
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].addr == (uint64_t)(uintptr_t)devPtr) {
            g_allocs[i] = g_allocs[--g_nallocs];
            pthread_mutex_unlock(&sim_rt_mu);
            return cudaSuccess;
        }
    }
    pthread_mutex_unlock(&sim_rt_mu);
    return sim_rt_fail(cudaErrorInvalidValue);
}

static int64_t copy_ns(size_t count) { return 2000 + (int64_t)((double)count / g_pcie_gbps); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    if ((dst == NULL || src == NULL) && count) return sim_rt_fail(cudaErrorInvalidValue);
    sim_rt_sync_stream(&sim_rt_default_stream);
    if (kind == cudaMemcpyHostToHost) memmove(dst, src, count);
    sim_sleep_until(sim_now_ns() + copy_ns(count));
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if ((dst == NULL || src == NULL) && count) return sim_rt_fail(cudaErrorInvalidValue);
    if (kind == cudaMemcpyHostToHost) memmove(dst, src, count);
    return sim_rt_enqueue_work(stream, copy_ns(count));
}
