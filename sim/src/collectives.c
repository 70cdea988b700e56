/* Simulated libnccl, operations: collectives, send/recv and groups.
 *
 * Like real NCCL, every call only enqueues: the op becomes a stream item and the host returns at
 * once. The communicator's proxy thread waits until the GPU reaches the item (all earlier kernels
 * on the stream done), tells the hub it arrived, and completes the item after the hub's GO plus
 * a transfer time that grows with bytes. Between ncclGroupStart and ncclGroupEnd ops are held
 * and then enqueued as one item per (communicator, stream), so grouped send/recv pairs between
 * the same ranks cannot deadlock.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "nccl_int.h"
#include "simint.h"

struct pending {
    struct ncclComm *comm;
    cudaStream_t stream;
    struct op op;
};

static __thread int t_group_depth;
static __thread struct pending *t_group;
static __thread size_t t_group_len, t_group_cap;

static size_t type_size(ncclDataType_t t) {
    static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return (unsigned)t < ncclNumTypes ? sizes[t] : 0;
}

static void on_gpu_ready(void *ctx, void *handle, int64_t gpu_ready_ns) {
    struct task *t = ctx;
    struct ncclComm *c = t->comm;
    pthread_mutex_lock(&c->mu);
    t->stream_item = handle;
    t->gpu_ready_ns = gpu_ready_ns;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Queue `n` ops of one communicator as one stream item. */
static ncclResult_t submit(struct ncclComm *c, cudaStream_t stream, const struct op *ops, int n) {
    struct task *t = calloc(1, sizeof *t + (size_t)n * sizeof(struct op));
    if (t == NULL) return ncclSystemError;
    t->comm = c;
    t->gpu_ready_ns = -1;
    t->nops = n;
    memcpy(t->ops, ops, (size_t)n * sizeof(struct op));
    pthread_mutex_lock(&c->mu);
    if (c->tail) c->tail->next = t;
    else c->head = t;
    c->tail = t;
    pthread_mutex_unlock(&c->mu);
    if (__rankechosim_stream_push_external(stream, on_gpu_ready, t) != 0) {
        c->async_error = ncclUnhandledCudaError;
        on_gpu_ready(t, NULL, sim_now_ns()); /* keep the queue moving; the op completes at once */
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

static ncclResult_t enqueue(struct ncclComm *c, enum op_kind kind, int peer, size_t count, ncclDataType_t dt,
                            uint64_t scale, cudaStream_t stream) {
    if (c == NULL || c->magic != COMM_MAGIC || type_size(dt) == 0) return ncclInvalidArgument;
    if ((kind == OP_SEND || kind == OP_RECV || kind == OP_BROADCAST || kind == OP_REDUCE) &&
        (peer < 0 || peer >= c->nranks))
        return ncclInvalidArgument;
    struct op o = {.kind = kind, .peer = peer, .bytes = (uint64_t)count * type_size(dt) * scale,
                 .link = link_word()};
    if (kind == OP_SEND) o.seq = c->send_seq[peer]++;
    else if (kind == OP_RECV) o.seq = c->recv_seq[peer]++;
    else o.seq = c->coll_seq++;
    if (kind == OP_BROADCAST || kind == OP_REDUCE) o.peer = -1; /* root is part of the op, not a peer */
    if (t_group_depth == 0) return submit(c, stream, &o, 1);
    if (t_group_len == t_group_cap) {
        size_t cap = t_group_cap ? t_group_cap * 2 : 16;
        struct pending *grown = realloc(t_group, cap * sizeof *grown);
        if (grown == NULL) return ncclSystemError;
        t_group = grown;
        t_group_cap = cap;
    }
    t_group[t_group_len++] = (struct pending){c, stream, o};
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    t_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (t_group_depth == 0) return ncclInvalidUsage;
    if (--t_group_depth > 0) return ncclSuccess;
    ncclResult_t rc = ncclSuccess;
    struct op *ops = calloc(t_group_len ? t_group_len : 1, sizeof *ops);
    if (ops == NULL) return ncclSystemError;
    for (size_t i = 0; i < t_group_len; i++) {
        if (t_group[i].comm == NULL) continue;
        struct ncclComm *c = t_group[i].comm;
        cudaStream_t s = t_group[i].stream;
        int n = 0;
        for (size_t j = i; j < t_group_len; j++) {
            if (t_group[j].comm == c && t_group[j].stream == s) {
                ops[n++] = t_group[j].op;
                t_group[j].comm = NULL;
            }
        }
        ncclResult_t r = submit(c, s, ops, n);
        if (r != ncclSuccess) rc = r;
    }
    free(ops);
    t_group_len = 0;
    return rc;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff;
    if ((unsigned)op >= ncclNumOps) return ncclInvalidArgument;
    return enqueue(comm, OP_ALLREDUCE, -1, count, datatype, 1, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff;
    return enqueue(comm, OP_BROADCAST, root, count, datatype, 1, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff;
    if ((unsigned)op >= ncclNumOps) return ncclInvalidArgument;
    return enqueue(comm, OP_REDUCE, root, count, datatype, 1, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff;
    if (comm == NULL || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    return enqueue(comm, OP_ALLGATHER, -1, sendcount, datatype, (uint64_t)comm->nranks, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff;
    if ((unsigned)op >= ncclNumOps || comm == NULL || comm->magic != COMM_MAGIC) return ncclInvalidArgument;
    return enqueue(comm, OP_REDUCESCATTER, -1, recvcount, datatype, (uint64_t)comm->nranks, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    (void)sendbuff;
    return enqueue(comm, OP_SEND, peer, count, datatype, 1, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    (void)recvbuff;
    return enqueue(comm, OP_RECV, peer, count, datatype, 1, stream);
}
