/* Simulated libcudart.so.12: a GPU that exists only as a per-stream "busy until" clock.
 *
 * Kernels add grid-size-proportional time to their stream; syncs block the host (off-CPU, like
 * cudaDeviceScheduleBlockingSync) until the stream's clock passes; collectives queued by libnccl
 * are stream items whose completion time is decided when every rank has arrived. cudaMalloc
 * hands out fake device addresses and spends time mapping pages; cudaFree synchronises the
 * device, as the real one does.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "simint.h"

#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x45564e54U
#define FAKE_DEVICE_BASE 0x7e0000000000ULL
#define FAKE_DEVICE_BYTES (80ULL << 30)

enum item_kind { IT_KERNEL, IT_EXTERNAL, IT_EVENT };

struct item {
    struct item *next;
    enum item_kind kind;
    int64_t dur_ns;
    struct CUstream_st *stream;
    sim_ready_fn ready; /* IT_EXTERNAL */
    void *ctx;
    int signalled;
    struct CUevent_st *event; /* IT_EVENT */
    uint64_t event_gen;
};

struct CUstream_st {
    uint32_t magic;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t busy_until;
    struct item *head, *tail;
    struct CUstream_st *next_all;
};

struct CUevent_st {
    uint32_t magic;
    int recorded; /* 0 never, 1 pending on a stream, 2 reached */
    uint64_t gen;
    int64_t t_ns;
};

struct alloc {
    uint64_t addr;
    size_t size;
};

static struct CUstream_st g_default = {STREAM_MAGIC, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                                       0, NULL, NULL, NULL};
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* streams list, events, allocations */
static pthread_cond_t g_event_cv = PTHREAD_COND_INITIALIZER;
static struct CUstream_st *g_streams = &g_default;
static struct alloc *g_allocs;
static size_t g_nallocs, g_cap_allocs;
static uint64_t g_next_addr = FAKE_DEVICE_BASE;
static double g_ns_per_block = SIM_DEFAULT_NS_PER_BLOCK;
static double g_pcie_gbps = SIM_DEFAULT_PCIE_GBPS;
static double g_slowdown = 1.0;
static int g_devices = 8;
static __thread int t_device;
static __thread cudaError_t t_last_error;

__attribute__((constructor)) static void cudart_init(void) {
    g_ns_per_block = sim_env_double(SIM_ENV_NS_PER_BLOCK, SIM_DEFAULT_NS_PER_BLOCK);
    g_pcie_gbps = sim_env_double(SIM_ENV_PCIE_GBPS, SIM_DEFAULT_PCIE_GBPS);
    g_devices = (int)sim_env_double(SIM_ENV_DEVICES, 8);
}

static cudaError_t fail(cudaError_t e) {
    t_last_error = e;
    return e;
}

static struct CUstream_st *resolve(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g_default;
    return s->magic == STREAM_MAGIC ? s : NULL;
}

static void resolve_event_locked(struct CUevent_st *ev, uint64_t gen, int64_t t) {
    pthread_mutex_lock(&g_mu);
    if (ev->magic == EVENT_MAGIC && ev->gen == gen) {
        ev->t_ns = t;
        ev->recorded = 2;
        pthread_cond_broadcast(&g_event_cv);
    }
    pthread_mutex_unlock(&g_mu);
}

/* Retire leading items the GPU can finish without outside help. Stream lock held. Returns an
 * external item that just reached the head (its owner must be told, after unlocking). */
static struct item *advance_locked(struct CUstream_st *s) {
    int64_t now = sim_now_ns();
    while (s->head != NULL) {
        struct item *it = s->head;
        if (s->busy_until < now) s->busy_until = now;
        if (it->kind == IT_EXTERNAL) {
            if (it->signalled) return NULL;
            it->signalled = 1;
            return it;
        }
        if (it->kind == IT_KERNEL) s->busy_until += it->dur_ns;
        else resolve_event_locked(it->event, it->event_gen, s->busy_until);
        s->head = it->next;
        if (s->head == NULL) s->tail = NULL;
        free(it);
    }
    pthread_cond_broadcast(&s->cv);
    return NULL;
}

static void append_locked(struct CUstream_st *s, struct item *it) {
    it->next = NULL;
    it->stream = s;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
}

/* Add `dur_ns` of GPU work to a stream. */
static cudaError_t enqueue_work(cudaStream_t stream, int64_t dur_ns) {
    struct CUstream_st *s = resolve(stream);
    if (s == NULL) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->mu);
    if (s->head == NULL) {
        int64_t now = sim_now_ns();
        if (s->busy_until < now) s->busy_until = now;
        s->busy_until += dur_ns;
    } else {
        struct item *it = calloc(1, sizeof *it);
        if (it == NULL) {
            pthread_mutex_unlock(&s->mu);
            return fail(cudaErrorMemoryAllocation);
        }
        it->kind = IT_KERNEL;
        it->dur_ns = dur_ns;
        append_locked(s, it);
    }
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

int __rankechosim_stream_push_external(cudaStream_t stream, sim_ready_fn ready, void *ctx) {
    struct CUstream_st *s = resolve(stream);
    if (s == NULL) return -1;
    struct item *it = calloc(1, sizeof *it);
    if (it == NULL) return -1;
    it->kind = IT_EXTERNAL;
    it->ready = ready;
    it->ctx = ctx;
    pthread_mutex_lock(&s->mu);
    append_locked(s, it);
    struct item *head = advance_locked(s);
    int64_t t = s->busy_until;
    pthread_mutex_unlock(&s->mu);
    if (head) head->ready(head->ctx, head, t);
    return 0;
}

void __rankechosim_stream_complete(void *handle, int64_t done_ns) {
    struct item *it = handle;
    struct CUstream_st *s = it->stream;
    pthread_mutex_lock(&s->mu);
    if (s->busy_until < done_ns) s->busy_until = done_ns;
    s->head = it->next;
    if (s->head == NULL) s->tail = NULL;
    free(it);
    struct item *next = advance_locked(s);
    int64_t t = s->busy_until;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (next) next->ready(next->ctx, next, t);
}

void __rankechosim_set_gpu_slowdown(double factor) { g_slowdown = factor > 0 ? factor : 1.0; }

static void sync_stream(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    while (s->head != NULL) pthread_cond_wait(&s->cv, &s->mu);
    int64_t t = s->busy_until;
    pthread_mutex_unlock(&s->mu);
    sim_sleep_until(t);
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= g_devices) return fail(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (device == NULL) return fail(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (count == NULL) return fail(cudaErrorInvalidValue);
    *count = g_devices;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    pthread_mutex_lock(&g_mu);
    size_t n = 0;
    for (struct CUstream_st *s = g_streams; s; s = s->next_all) n++;
    struct CUstream_st **all = calloc(n, sizeof *all);
    n = 0;
    for (struct CUstream_st *s = g_streams; s && all; s = s->next_all) all[n++] = s;
    pthread_mutex_unlock(&g_mu);
    if (all == NULL) return fail(cudaErrorMemoryAllocation);
    for (size_t i = 0; i < n; i++) sync_stream(all[i]);
    free(all);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t error) { return cudaGetErrorName(error); }

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    if (runtimeVersion == NULL) return fail(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    (void)flags;
    if (pStream == NULL) return fail(cudaErrorInvalidValue);
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL) return fail(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_lock(&g_mu);
    s->next_all = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_mu);
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    struct CUstream_st *s = resolve(stream);
    if (s == NULL || s == &g_default) return fail(cudaErrorInvalidResourceHandle);
    sync_stream(s); /* pending work finishes first, as with the real driver */
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st **p = &g_streams; *p; p = &(*p)->next_all) {
        if (*p == s) {
            *p = s->next_all;
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    s->magic = 0;
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    struct CUstream_st *s = resolve(stream);
    if (s == NULL) return fail(cudaErrorInvalidResourceHandle);
    sync_stream(s);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    struct CUstream_st *s = resolve(stream);
    if (s == NULL) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->mu);
    int busy = s->head != NULL || s->busy_until > sim_now_ns();
    pthread_mutex_unlock(&s->mu);
    return busy ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    if (event == NULL) return fail(cudaErrorInvalidValue);
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (ev == NULL) return fail(cudaErrorMemoryAllocation);
    ev->magic = EVENT_MAGIC;
    *event = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (event == NULL || event->magic != EVENT_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mu);
    event->magic = 0; /* a pending record resolves into nothing; memory stays valid */
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    struct CUstream_st *s = resolve(stream);
    if (s == NULL || event == NULL || event->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    struct item *it = calloc(1, sizeof *it);
    if (it == NULL) return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&g_mu);
    event->gen++;
    event->recorded = 1;
    uint64_t gen = event->gen;
    pthread_mutex_unlock(&g_mu);
    it->kind = IT_EVENT;
    it->event = event;
    it->event_gen = gen;
    append_locked(s, it);
    struct item *head = advance_locked(s);
    int64_t t = s->busy_until;
    pthread_mutex_unlock(&s->mu);
    if (head) head->ready(head->ctx, head, t);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (event == NULL || event->magic != EVENT_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mu);
    while (event->recorded == 1) pthread_cond_wait(&g_event_cv, &g_mu);
    int64_t t = event->t_ns;
    pthread_mutex_unlock(&g_mu);
    sim_sleep_until(t);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (event == NULL || event->magic != EVENT_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mu);
    int done = event->recorded != 1 && event->t_ns <= sim_now_ns();
    pthread_mutex_unlock(&g_mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (ms == NULL) return fail(cudaErrorInvalidValue);
    if (start == NULL || end == NULL || start->magic != EVENT_MAGIC || end->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    if (start->recorded != 2 || end->recorded != 2) return fail(cudaErrorNotReady);
    *ms = (float)((double)(end->t_ns - start->t_ns) / 1e6);
    return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream) {
    (void)blockDim;
    (void)args;
    (void)sharedMem;
    if (func == NULL) return fail(cudaErrorInvalidValue);
    double blocks = (double)gridDim.x * (double)gridDim.y * (double)gridDim.z;
    return enqueue_work(stream, (int64_t)(blocks * g_ns_per_block * g_slowdown));
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (devPtr == NULL) return fail(cudaErrorInvalidValue);
    size_t rounded = (size + 511) & ~(size_t)511;
    pthread_mutex_lock(&g_mu);
    if (g_next_addr + rounded > FAKE_DEVICE_BASE + FAKE_DEVICE_BYTES) {
        pthread_mutex_unlock(&g_mu);
        return fail(cudaErrorMemoryAllocation);
    }
    if (g_nallocs == g_cap_allocs) {
        size_t cap = g_cap_allocs ? g_cap_allocs * 2 : 64;
        struct alloc *grown = realloc(g_allocs, cap * sizeof *grown);
        if (grown == NULL) {
            pthread_mutex_unlock(&g_mu);
            return fail(cudaErrorMemoryAllocation);
        }
        g_allocs = grown;
        g_cap_allocs = cap;
    }
    uint64_t addr = g_next_addr;
    g_next_addr += rounded ? rounded : 512;
    g_allocs[g_nallocs++] = (struct alloc){addr, size};
    pthread_mutex_unlock(&g_mu);
    sim_sleep_until(sim_now_ns() + sim_malloc_ns(size));
    *devPtr = (void *)(uintptr_t)addr;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr) {
    if (devPtr == NULL) return cudaSuccess;
    cudaDeviceSynchronize();
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].addr == (uint64_t)(uintptr_t)devPtr) {
            g_allocs[i] = g_allocs[--g_nallocs];
            pthread_mutex_unlock(&g_mu);
            return cudaSuccess;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return fail(cudaErrorInvalidValue);
}

static int64_t copy_ns(size_t count) { return 2000 + (int64_t)((double)count / g_pcie_gbps); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    if ((dst == NULL || src == NULL) && count) return fail(cudaErrorInvalidValue);
    sync_stream(&g_default);
    if (kind == cudaMemcpyHostToHost) memmove(dst, src, count);
    sim_sleep_until(sim_now_ns() + copy_ns(count));
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if ((dst == NULL || src == NULL) && count) return fail(cudaErrorInvalidValue);
    if (kind == cudaMemcpyHostToHost) memmove(dst, src, count);
    return enqueue_work(stream, copy_ns(count));
}
