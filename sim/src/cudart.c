/* Simulated libcudart.so.12: a GPU that exists only as a per-stream "busy until" clock.
 * This file: devices, streams, kernels and the external items libnccl queues; see also
 * cudart_events.c and cudart_mem.c.
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

#include "cudart_int.h"

HIDDEN struct CUstream_st sim_rt_default_stream = {STREAM_MAGIC, PTHREAD_MUTEX_INITIALIZER,
                                                   PTHREAD_COND_INITIALIZER, 0, NULL, NULL, NULL};
HIDDEN pthread_mutex_t sim_rt_mu = PTHREAD_MUTEX_INITIALIZER;
HIDDEN pthread_cond_t sim_rt_event_cv = PTHREAD_COND_INITIALIZER;
static struct CUstream_st *g_streams = &sim_rt_default_stream; /* guarded by sim_rt_mu */
static double g_ns_per_block = SIM_DEFAULT_NS_PER_BLOCK;
static double g_slowdown = 1.0;
static int g_devices = 8;
static __thread int t_device;
static __thread cudaError_t t_last_error;

__attribute__((constructor)) static void cudart_init(void) {
    g_ns_per_block = sim_env_double(SIM_ENV_NS_PER_BLOCK, SIM_DEFAULT_NS_PER_BLOCK);
    g_devices = (int)sim_env_double(SIM_ENV_DEVICES, 8);
}

cudaError_t sim_rt_fail(cudaError_t e) {
    t_last_error = e;
    return e;
}

struct CUstream_st *sim_rt_resolve(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &sim_rt_default_stream;
    return s->magic == STREAM_MAGIC ? s : NULL;
}

static void resolve_event_locked(struct CUevent_st *ev, uint64_t gen, int64_t t) {
    pthread_mutex_lock(&sim_rt_mu);
    if (ev->magic == EVENT_MAGIC && ev->gen == gen) {
        ev->t_ns = t;
        ev->recorded = 2;
        pthread_cond_broadcast(&sim_rt_event_cv);
    }
    pthread_mutex_unlock(&sim_rt_mu);
}

/* Retire leading items the GPU can finish without outside help. Stream lock held. Returns an
 * external item that just reached the head (its owner must be told, after unlocking). */
struct item *sim_rt_advance_locked(struct CUstream_st *s) {
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

void sim_rt_append_locked(struct CUstream_st *s, struct item *it) {
    it->next = NULL;
    it->stream = s;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
}

/* Add `dur_ns` of GPU work to a stream. */
cudaError_t sim_rt_enqueue_work(cudaStream_t stream, int64_t dur_ns) {
    struct CUstream_st *s = sim_rt_resolve(stream);
    if (s == NULL) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->mu);
    if (s->head == NULL) {
        int64_t now = sim_now_ns();
        if (s->busy_until < now) s->busy_until = now;
        s->busy_until += dur_ns;
    } else {
        struct item *it = calloc(1, sizeof *it);
        if (it == NULL) {
            pthread_mutex_unlock(&s->mu);
            return sim_rt_fail(cudaErrorMemoryAllocation);
        }
        it->kind = IT_KERNEL;
        it->dur_ns = dur_ns;
        sim_rt_append_locked(s, it);
    }
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

int __rankechosim_stream_push_external(cudaStream_t stream, sim_ready_fn ready, void *ctx) {
    struct CUstream_st *s = sim_rt_resolve(stream);
    if (s == NULL) return -1;
    struct item *it = calloc(1, sizeof *it);
    if (it == NULL) return -1;
    it->kind = IT_EXTERNAL;
    it->ready = ready;
    it->ctx = ctx;
    pthread_mutex_lock(&s->mu);
    sim_rt_append_locked(s, it);
    struct item *head = sim_rt_advance_locked(s);
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
    struct item *next = sim_rt_advance_locked(s);
    int64_t t = s->busy_until;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (next) next->ready(next->ctx, next, t);
}

int __rankechosim_device(void) { return t_device; }

void __rankechosim_set_device(int device) { t_device = device; }

void __rankechosim_set_gpu_slowdown(double factor) {
    SIM_ENTRY_FRAME();
    g_slowdown = factor > 0 ? factor : 1.0;
}

static _Atomic double g_link_rank = 1.0, g_link_nic = 1.0;

void __rankechosim_set_link_slowdown(double rank_factor, double nic_factor) {
    SIM_ENTRY_FRAME();
    g_link_rank = rank_factor >= 1.0 ? rank_factor : 1.0;
    g_link_nic = nic_factor >= 1.0 ? nic_factor : 1.0;
}

void __rankechosim_link_slowdown(double *rank_factor, double *nic_factor) {
    SIM_ENTRY_FRAME();
    *rank_factor = g_link_rank;
    *nic_factor = g_link_nic;
}

void sim_rt_sync_stream(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    while (s->head != NULL) pthread_cond_wait(&s->cv, &s->mu);
    int64_t t = s->busy_until;
    pthread_mutex_unlock(&s->mu);
    sim_sleep_until(t);
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= g_devices) return sim_rt_fail(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (device == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (count == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    *count = g_devices;
    return cudaSuccess;
}

cudaError_t sim_rt_device_sync(void) {
    pthread_mutex_lock(&sim_rt_mu);
    size_t n = 0;
    for (struct CUstream_st *s = g_streams; s; s = s->next_all) n++;
    struct CUstream_st **all = calloc(n, sizeof *all);
    n = 0;
    for (struct CUstream_st *s = g_streams; s && all; s = s->next_all) all[n++] = s;
    pthread_mutex_unlock(&sim_rt_mu);
    if (all == NULL) return sim_rt_fail(cudaErrorMemoryAllocation);
    for (size_t i = 0; i < n; i++) sim_rt_sync_stream(all[i]);
    free(all);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return sim_rt_device_sync(); }

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

const char *cudaGetErrorName(cudaError_t error) {
    SIM_ENTRY_FRAME();
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

const char *cudaGetErrorString(cudaError_t error) {
    SIM_ENTRY_FRAME();
    return error == cudaSuccess ? "no error" : "simulated CUDA error (see cudaGetErrorName)";
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    if (runtimeVersion == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

static cudaError_t create_stream(cudaStream_t *pStream) {
    if (pStream == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL) return sim_rt_fail(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_lock(&sim_rt_mu);
    s->next_all = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&sim_rt_mu);
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    (void)flags;
    return create_stream(pStream);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) { return create_stream(pStream); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    struct CUstream_st *s = sim_rt_resolve(stream);
    if (s == NULL || s == &sim_rt_default_stream) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    sim_rt_sync_stream(s); /* pending work finishes first, as with the real driver */
    pthread_mutex_lock(&sim_rt_mu);
    for (struct CUstream_st **p = &g_streams; *p; p = &(*p)->next_all) {
        if (*p == s) {
            *p = s->next_all;
            break;
        }
    }
    pthread_mutex_unlock(&sim_rt_mu);
    s->magic = 0;
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    struct CUstream_st *s = sim_rt_resolve(stream);
    if (s == NULL) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    sim_rt_sync_stream(s);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    struct CUstream_st *s = sim_rt_resolve(stream);
    if (s == NULL) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->mu);
    int busy = s->head != NULL || s->busy_until > sim_now_ns();
    pthread_mutex_unlock(&s->mu);
    return busy ? cudaErrorNotReady : cudaSuccess;
}


cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream) {
    (void)blockDim;
    (void)args;
    (void)sharedMem;
    if (func == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    double blocks = (double)gridDim.x * (double)gridDim.y * (double)gridDim.z;
    return sim_rt_enqueue_work(stream, (int64_t)(blocks * g_ns_per_block * g_slowdown));
}

