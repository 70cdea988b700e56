/* Simulated libcudart, memory: fake device addresses (never dereferenced), cudaMalloc time spent
 * "mapping pages" off-CPU, cudaFree synchronising the device as the real one does, and copies
 * timed by a PCIe-like rate. Freed ranges go to an address-ordered free list (adjacent ones merged)
 * that cudaMalloc searches first-fit before taking fresh space, so a free/malloc cycle (the
 * alloc_stall fault) runs for any number of steps instead of exhausting the 80 GiB. */
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
static struct alloc *g_free; /* free ranges, ascending addr, never adjacent; guarded by sim_rt_mu */
static size_t g_nfree, g_cap_free;
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

static size_t rounded_size(size_t size) { return size ? (size + 511) & ~(size_t)511 : 512; }

/* First fit from the free list, else fresh space at g_next_addr; 0 when neither has room. */
static uint64_t take_range(size_t rounded) {
    for (size_t i = 0; i < g_nfree; i++) {
        if (g_free[i].size < rounded) continue;
        uint64_t addr = g_free[i].addr;
        g_free[i].addr += rounded;
        g_free[i].size -= rounded;
        if (g_free[i].size == 0) {
            memmove(&g_free[i], &g_free[i + 1], (g_nfree - i - 1) * sizeof *g_free);
            g_nfree--;
        }
        return addr;
    }
    if (g_next_addr + rounded > FAKE_DEVICE_BASE + FAKE_DEVICE_BYTES) return 0;
    uint64_t addr = g_next_addr;
    g_next_addr += rounded;
    return addr;
}

/* Return a range: merged with its neighbours, given back to fresh space when it ends there. */
static void give_back(uint64_t addr, size_t size) {
    size_t i = 0;
    while (i < g_nfree && g_free[i].addr < addr) i++;
    if (i > 0 && g_free[i - 1].addr + g_free[i - 1].size == addr) {
        i--;
        g_free[i].size += size;
    } else {
        if (g_nfree == g_cap_free) {
            size_t cap = g_cap_free ? g_cap_free * 2 : 64;
            struct alloc *grown = realloc(g_free, cap * sizeof *grown);
            if (grown == NULL) return; /* the range is leaked, as a real allocator might */
            g_free = grown;
            g_cap_free = cap;
        }
        memmove(&g_free[i + 1], &g_free[i], (g_nfree - i) * sizeof *g_free);
        g_free[i] = (struct alloc){addr, size};
        g_nfree++;
    }
    if (i + 1 < g_nfree && g_free[i].addr + g_free[i].size == g_free[i + 1].addr) {
        g_free[i].size += g_free[i + 1].size;
        memmove(&g_free[i + 1], &g_free[i + 2], (g_nfree - i - 2) * sizeof *g_free);
        g_nfree--;
    }
    if (g_free[i].addr + g_free[i].size == g_next_addr) {
        g_next_addr = g_free[i].addr;
        g_nfree--; /* the last range: nothing after it to move */
    }
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (devPtr == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    size_t rounded = rounded_size(size);
    pthread_mutex_lock(&sim_rt_mu);
    uint64_t addr = take_range(rounded);
    if (addr == 0 || remember(addr, size) != 0) {
        if (addr != 0) give_back(addr, rounded);
        pthread_mutex_unlock(&sim_rt_mu);
        return sim_rt_fail(cudaErrorMemoryAllocation);
    }
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
            give_back(g_allocs[i].addr, rounded_size(g_allocs[i].size));
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
