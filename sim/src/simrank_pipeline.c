/* Pipeline stages and FSDP-like sharded collectives for the simulated rank (--pipeline, --allgather-bytes,
 * --reducescatter-bytes).
 *
 * Pipeline: the world's ranks form `stages` contiguous groups (stage = rank / (world / stages)); rank r's
 * pipeline communicator `pp` (pipeline r % (world / stages), initialised with ncclCommInitRank from an id
 * rank 0 made, as torch initialises a process group's communicator) holds one rank per stage, its comm rank
 * its stage. (Not an ncclCommSplit: a tracer sees a split child's size but not the caller's rank in it, and
 * send/recv pairs are named by the ranks at both ends.) Each step every stage sends its activations to the next stage
 * after its forward kernels and the gradients of those back to the previous stage before its backward
 * ones, each exchange one ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd (as the 1F1B steady state batches
 * a send with a receive, so no stage waits for the whole chain ahead of it) followed by the stream sync
 * the host needs before it touches what arrived: that sync is what times each send/recv pair.
 * FSDP-like: an all-gather of the parameters on the world before the forward kernels, a reduce-scatter of
 * the gradients after the backward ones.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "simint.h"
#include "simrank.h"

static uint64_t comm_hash(ncclComm_t comm) { return ((const uint64_t *)(const void *)comm)[1]; }

int pipeline_stage(const struct cfg *c) { return c->stages > 1 ? c->rank / (c->world / c->stages) : 0; }

ncclComm_t pipeline_setup(const struct api *a, const struct cfg *c, ncclUniqueId id) {
    ncclComm_t pp = NULL;
    if (c->stages <= 1) return NULL;
    check(a->ncclCommInitRank(&pp, c->stages, id, pipeline_stage(c)), "ncclCommInitRank");
    const int *hdr = (const int *)(const void *)((const char *)pp + 16);
    printf("comm pp %016llx %d %d\n", (unsigned long long)comm_hash(pp), hdr[0], hdr[1]);
    return pp;
}

/* One pipeline exchange: `toward` +1 sends to the next stage and receives from the previous one (the
 * forward pass), -1 the other way (backward); then the stream sync that waits for both. */
SIM_PHASE void pipeline_exchange(const struct api *a, const struct cfg *c, ncclComm_t pp, void *buf,
                                 cudaStream_t s, int toward) {
    if (pp == NULL) return;
    int stage = pipeline_stage(c), from = stage - toward, to = stage + toward;
    size_t count = c->act_bytes / 2; /* bf16 elements */
    check(a->ncclGroupStart(), "ncclGroupStart");
    if (from >= 0 && from < c->stages) check(a->ncclRecv(buf, count, ncclBfloat16, from, pp, s), "ncclRecv");
    if (to >= 0 && to < c->stages) check(a->ncclSend(buf, count, ncclBfloat16, to, pp, s), "ncclSend");
    check(a->ncclGroupEnd(), "ncclGroupEnd");
    check(a->cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

/* FSDP-like: gather the parameters' shards before the forward kernels (all_gather_into_tensor). */
SIM_PHASE void gather_parameters(const struct api *a, const struct cfg *c, ncclComm_t world, void *buf,
                                 cudaStream_t s) {
    if (c->ag_bytes == 0) return;
    size_t per_rank = c->ag_bytes / 2 / (uint64_t)c->world; /* bf16 elements each rank contributes */
    check(a->ncclAllGather(buf, buf, per_rank ? per_rank : 1, ncclBfloat16, world, s), "ncclAllGather");
}

/* FSDP-like: reduce the gradients and keep this rank's shard, after the backward kernels. */
SIM_PHASE void scatter_gradients(const struct api *a, const struct cfg *c, ncclComm_t world, void *buf,
                                 cudaStream_t s) {
    if (c->rs_bytes == 0) return;
    size_t per_rank = c->rs_bytes / 2 / (uint64_t)c->world;
    check(a->ncclReduceScatter(buf, buf, per_rank ? per_rank : 1, ncclBfloat16, ncclSum, world, s),
          "ncclReduceScatter");
}
