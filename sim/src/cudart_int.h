/* Internals shared by the files of the simulated libcudart (never exported). */
#ifndef RANKECHO_SIM_CUDART_INT_H
#define RANKECHO_SIM_CUDART_INT_H

#include <pthread.h>
#include <stdint.h>

#include "cuda_runtime_api.h"
#include "simint.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x45564e54U

enum item_kind { IT_KERNEL, IT_EXTERNAL, IT_EVENT };

/* One unit of queued GPU work that cannot run yet because something before it is unresolved. */
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
    int64_t busy_until; /* monotonic ns when the GPU finishes every resolved item */
    struct item *head, *tail;
    struct CUstream_st *next_all;
};

struct CUevent_st {
    uint32_t magic;
    int recorded; /* 0 never, 1 pending on a stream, 2 reached */
    uint64_t gen;
    int64_t t_ns;
};

/* g_mu guards the stream list, events and allocations; lock order: stream mu, then g_mu. */
extern HIDDEN pthread_mutex_t sim_rt_mu;
extern HIDDEN pthread_cond_t sim_rt_event_cv;
extern HIDDEN struct CUstream_st sim_rt_default_stream;

HIDDEN cudaError_t sim_rt_fail(cudaError_t e);
HIDDEN struct CUstream_st *sim_rt_resolve(cudaStream_t s);
HIDDEN struct item *sim_rt_advance_locked(struct CUstream_st *s);
HIDDEN void sim_rt_append_locked(struct CUstream_st *s, struct item *it);
HIDDEN cudaError_t sim_rt_enqueue_work(cudaStream_t stream, int64_t dur_ns);
HIDDEN void sim_rt_sync_stream(struct CUstream_st *s);
HIDDEN cudaError_t sim_rt_device_sync(void);

#endif
