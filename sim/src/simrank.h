/* The simulated training rank: configuration, the library entry points it uses, fault injection. */
#ifndef RANKECHO_SIMRANK_H
#define RANKECHO_SIMRANK_H

#include <stdint.h>
#include <stdio.h>

#include "nccl.h"

/* A step phase or fault injector: never inlined, cloned or merged, so it is a frame of its own with
 * exactly this name in a frame-pointer stack walk (the rank is also built -fno-optimize-sibling-calls,
 * so no call in it becomes a jump that drops its caller's frame). */
#define SIM_PHASE __attribute__((noinline, noipa))

/* Every library function the rank calls. Linked builds bind them at load time (DT_NEEDED);
 * the dlopen build resolves them with dlsym after a delay, like a framework importing CUDA late. */
#define SIMRANK_API(X)                                                                                   \
    X(cudaSetDevice, cudaError_t, (int))                                                                 \
    X(cudaStreamCreate, cudaError_t, (cudaStream_t *))                                                   \
    X(cudaLaunchKernel, cudaError_t, (const void *, dim3, dim3, void **, size_t, cudaStream_t))          \
    X(cudaStreamSynchronize, cudaError_t, (cudaStream_t))                                                \
    X(cudaDeviceSynchronize, cudaError_t, (void))                                                        \
    X(cudaMalloc, cudaError_t, (void **, size_t))                                                        \
    X(cudaFree, cudaError_t, (void *))                                                                   \
    X(cudaMemcpy, cudaError_t, (void *, const void *, size_t, enum cudaMemcpyKind))                      \
    X(cudaMemcpyAsync, cudaError_t, (void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t))   \
    X(cudaEventCreate, cudaError_t, (cudaEvent_t *))                                                     \
    X(cudaEventRecord, cudaError_t, (cudaEvent_t, cudaStream_t))                                         \
    X(cudaEventElapsedTime, cudaError_t, (float *, cudaEvent_t, cudaEvent_t))                            \
    X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId *))                                                   \
    X(ncclCommInitRank, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int))                            \
    X(ncclCommSplit, ncclResult_t, (ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *))                 \
    X(ncclCommDestroy, ncclResult_t, (ncclComm_t))                                                       \
    X(ncclAllReduce, ncclResult_t,                                                                       \
      (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))             \
    X(ncclAllGather, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)) \
    X(ncclReduceScatter, ncclResult_t,                                                                   \
      (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))             \
    X(ncclSend, ncclResult_t, (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))     \
    X(ncclRecv, ncclResult_t, (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))           \
    X(ncclGroupStart, ncclResult_t, (void))                                                              \
    X(ncclGroupEnd, ncclResult_t, (void))                                                                \
    X(__rankechosim_set_gpu_slowdown, void, (double))                                                   \
    X(__rankechosim_set_link_slowdown, void, (double, double))

struct api {
#define SIMRANK_FIELD(name, ret, args) ret(*name) args;
    SIMRANK_API(SIMRANK_FIELD)
#undef SIMRANK_FIELD
};

/* F_HANG, F_CRASH and F_DESYNC are failures, not delays: they fire once, at start_step. F_HANG stops the rank
 * before the step's first collective for `ms` (0: until killed); F_CRASH exits with status `ms`; F_DESYNC issues
 * the step's first collective with twice the byte count. */
enum fault_kind {
    F_HOST_COMPUTE,
    F_DATALOADER_STALL,
    F_CPU_CONTENTION,
    F_SLOW_GPU,
    F_ALLOC_STALL,
    F_HANG,
    F_CRASH,
    F_DESYNC,
    F_SLOW_LINK, /* this rank's transfer bandwidth / `ms` (the factor) on every communicator */
    F_SLOW_NIC,  /* the same, only on communicators spanning more than one node (a node's slow NIC) */
    F_MEMCPY_STALL, /* a blocking device-to-host copy of `ms` before the step's first collective */
    F_NKINDS
};

#define MAX_FAULT_STEPS 64 /* sim/scenario_faults.py's MAX_LISTED_STEPS */

struct fault {
    enum fault_kind kind;
    double ms, jitter_ms;
    int every, start_step;
    int end_step;                /* last step a periodic fault may fire at (-1: none) */
    int nsteps;                  /* > 0: it fires exactly at steps[0..nsteps) instead */
    int steps[MAX_FAULT_STEPS];
    int comm, bucket;            /* strikes before this collective: comm -1 the world's bucket `bucket`,
                                    else split `comm`'s all-reduce (hang, crash and the pre-collective delays) */
};

#define MAX_FAULTS 16
#define MAX_SPLITS 4
#define ALLOC_CACHE 8

struct split_cfg {
    char name[32];
    int group_size;
    int strided;
    uint64_t bytes;
};

struct cfg {
    int rank, world, local_rank, local_world;
    const char *node, *master_addr, *lib_dir;
    int master_port;
    int steps;
    double compute_us, host_us, loader_us;
    int kernels;
    uint64_t allreduce_bytes;
    int buckets;
    int malloc_every;
    unsigned seed;
    double noise_us[3]; /* healthy jitter: compute, host, loader; + uniform [0, max) per rank and step */
    int dlopen_delay_ms;
    int log_colls; /* --log-collectives: a `coll` line at every collective call */
    int stages;          /* --pipeline STAGES:BYTES: pipeline stages (1: none) and the activation bytes */
    uint64_t act_bytes;  /* one stage-to-stage send (activations forward, their gradients backward) */
    uint64_t ag_bytes, rs_bytes; /* --allgather-bytes / --reducescatter-bytes: FSDP-like, on the world */
    struct split_cfg splits[MAX_SPLITS];
    int nsplits;
    struct fault faults[MAX_FAULTS];
    int nfaults;
};

/* simrank.c: report and exit (die: status 2, bad usage; check: status 3, a failed library call) */
void die(const char *fmt, const char *arg) __attribute__((noreturn));
void check(int rc, const char *what);

/* simrank_id.c: the NCCL unique id, from rank 0 over TCP (MASTER_ADDR:MASTER_PORT) */
#define MAX_PIPELINES 256 /* world / stages */
ncclUniqueId exchange_id(const struct cfg *c, const struct api *api, ncclUniqueId *pp_id); /* pp_id: with stages */

/* simrank_faults.c */
const char *fault_name(enum fault_kind k);
/* "kind:ms:every:start_step:jitter_ms[:end[:s1,s2..|-[:comm[:bucket]]]]" */
int fault_parse(const char *spec, struct fault *out);
int fault_scheduled(const struct fault *f, int step);  /* a delay or link fault's schedule includes `step` */
double fault_ms_at(const struct fault *f, int index, int rank, int step, unsigned seed);
int fault_fires(const struct fault *f, int step); /* a failure kind: 1 at its one step */
void log_failure(const struct fault *f, int step); /* the `fault KIND STEP VALUE` line */
double healthy_noise_us(const struct cfg *c, int step, int which); /* which: 0 compute, 1 host, 2 loader */
double slow_gpu_extra(const struct cfg *c, double kernel_us, double ms); /* slow_gpu: its factor less 1 */
void wait_off_cpu(double ms);
/* The fault injectors, each its own frame in a stack walk (SIM_PHASE): */
void stall_dataloader(double ms);
void spin_host_compute(double ms);
void contend_cpu(double ms); /* needs neighbor_start() first */
void hang_rank(const struct fault *f, int step);
void crash_rank(const struct fault *f, int step) __attribute__((noreturn));
void stall_memcpy(const struct api *a, const void *device_buf, double ms);
int neighbor_start(void);

/* simrank_pipeline.c: pipeline stages (--pipeline) and FSDP-like all-gather / reduce-scatter */
int pipeline_stage(const struct cfg *c);
ncclComm_t pipeline_setup(const struct api *a, const struct cfg *c, ncclUniqueId id); /* NULL: no stages */
void pipeline_exchange(const struct api *a, const struct cfg *c, ncclComm_t pp, void *buf, cudaStream_t s,
                       int toward);
void gather_parameters(const struct api *a, const struct cfg *c, ncclComm_t world, void *buf, cudaStream_t s);
void scatter_gradients(const struct api *a, const struct cfg *c, ncclComm_t world, void *buf, cudaStream_t s);
void neighbor_stop(void);

#endif
