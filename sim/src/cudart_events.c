/* Simulated libcudart, events: a recorded event resolves to the GPU time at which its stream
 * reached it, so cudaEventElapsedTime measures simulated GPU work. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "cudart_int.h"

static cudaError_t create(cudaEvent_t *event) {
    if (event == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (ev == NULL) return sim_rt_fail(cudaErrorMemoryAllocation);
    ev->magic = EVENT_MAGIC;
    *event = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    return create(event);
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return create(event); }

static int valid(cudaEvent_t e) { return e != NULL && e->magic == EVENT_MAGIC; }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!valid(event)) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&sim_rt_mu);
    event->magic = 0; /* a pending record resolves into nothing; the memory stays valid */
    pthread_mutex_unlock(&sim_rt_mu);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    struct CUstream_st *s = sim_rt_resolve(stream);
    if (s == NULL || !valid(event)) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    struct item *it = calloc(1, sizeof *it);
    if (it == NULL) return sim_rt_fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&sim_rt_mu);
    event->gen++;
    event->recorded = 1;
    it->event_gen = event->gen;
    pthread_mutex_unlock(&sim_rt_mu);
    it->kind = IT_EVENT;
    it->event = event;
    sim_rt_append_locked(s, it);
    struct item *head = sim_rt_advance_locked(s);
    int64_t t = s->busy_until;
    pthread_mutex_unlock(&s->mu);
    if (head) head->ready(head->ctx, head, t);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!valid(event)) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&sim_rt_mu);
    while (event->recorded == 1) pthread_cond_wait(&sim_rt_event_cv, &sim_rt_mu);
    int64_t t = event->t_ns;
    pthread_mutex_unlock(&sim_rt_mu);
    sim_sleep_until(t);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!valid(event)) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&sim_rt_mu);
    int done = event->recorded != 1 && event->t_ns <= sim_now_ns();
    pthread_mutex_unlock(&sim_rt_mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (ms == NULL) return sim_rt_fail(cudaErrorInvalidValue);
    if (!valid(start) || !valid(end)) return sim_rt_fail(cudaErrorInvalidResourceHandle);
    if (start->recorded != 2 || end->recorded != 2) return sim_rt_fail(cudaErrorNotReady);
    *ms = (float)((double)(end->t_ns - start->t_ns) / 1e6);
    return cudaSuccess;
}
