/* simrank: one simulated training rank, driven by the torch-style environment.
 *
 *   RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
 *   RANKECHO_NODE_ID=node-a simrank --steps 20 --log /tmp/rank0.log
 *
 * Each step: a data-loader fetch (off-CPU), an occasional cudaMalloc, an H2D copy, forward kernels,
 * a loss sync, backward kernels interleaved with bucketed all-reduces on the world communicator,
 * one all-reduce per extra (split) communicator, and a final stream sync (pipeline send/recv and FSDP-like
 * all-gather / reduce-scatter on request: simrank_pipeline.c). Rank 0 creates the
 * NCCL unique id and serves it on MASTER_ADDR:MASTER_PORT (as torch's TCPStore would); the others
 * fetch it there. The log records what the process really did, measured around the library
 * calls (wall-clock ns):
 *
 *   rank R world W local L node NODE pid PID tid TID start PROCESS_START
 *   comm NAME HASH RANK_IN_COMM COMM_SIZE
 *   step K START ENTER END SYNC_WAIT LOADER ALLOC FWD_SYNC GPU_ARRIVE CAUSES
 *   coll K COMM BUCKET CALL_NS        (--log-collectives: before each all-reduce, after its faults)
 *
 * ENTER is when the step's first all-reduce was called, SYNC_WAIT how long the final stream sync
 * blocked, LOADER/ALLOC/FWD_SYNC the time spent fetching the batch, in cudaMalloc/cudaFree, and
 * in the forward (loss) sync; GPU_ARRIVE is when the GPU reached that all-reduce (START plus the
 * elapsed time between CUDA events recorded at both points, as a profiler would measure it);
 * CAUSES lists `kind:ms` of the faults that fired, or `-` (slow_link and slow_nic, factors rather than
 * delays, are not causes: a step where one fires is preceded by `link K RANK_FACTOR NIC_FACTOR`). The
 * last line is `done END`.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "simint.h"
#include "simrank.h"

#ifndef SIMRANK_DLOPEN
static const struct api LINKED = {
#define SIMRANK_BIND(name, ret, args) .name = name,
    SIMRANK_API(SIMRANK_BIND)
#undef SIMRANK_BIND
};
#endif

void die(const char *fmt, const char *arg) {
    fprintf(stderr, "simrank: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(2);
}

void check(int rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "simrank: %s failed with code %d\n", what, rc);
        exit(3);
    }
}

static struct api load_api(const struct cfg *c) {
#ifdef SIMRANK_DLOPEN
    struct api a;
    char path[4096];
    if (c->lib_dir == NULL) die("%s", "the dlopen build needs --lib-dir (or SIMRANK_LIB_DIR)");
    sim_sleep_until(sim_now_ns() + (int64_t)c->dlopen_delay_ms * 1000000);
    snprintf(path, sizeof path, "%s/libcudart.so.12", c->lib_dir);
    void *cudart = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (cudart == NULL) die("cannot load libcudart: %s", dlerror());
    snprintf(path, sizeof path, "%s/libnccl.so.2", c->lib_dir);
    void *nccl = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (nccl == NULL) die("cannot load libnccl: %s", dlerror());
#define SIMRANK_SYM(name, ret, args)                                                                     \
    *(void **)&a.name = dlsym(RTLD_DEFAULT, #name);                                                      \
    if (a.name == NULL) die("missing symbol %s", #name);
    SIMRANK_API(SIMRANK_SYM)
#undef SIMRANK_SYM
    return a;
#else
    (void)c;
    return LINKED;
#endif
}

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static void parse(int argc, char **argv, struct cfg *c) {
    *c = (struct cfg){.rank = env_int("RANK", 0), .world = env_int("WORLD_SIZE", 1),
                      .local_rank = env_int("LOCAL_RANK", 0), .local_world = env_int("LOCAL_WORLD_SIZE", 1),
                      .node = getenv("RANKECHO_NODE_ID"), .master_addr = getenv("MASTER_ADDR"),
                      .lib_dir = getenv("SIMRANK_LIB_DIR"), .master_port = env_int("MASTER_PORT", 29500),
                      .steps = 10, .compute_us = 20000, .host_us = 500, .loader_us = 500, .kernels = 20,
                      .allreduce_bytes = 16 << 20, .buckets = 1, .malloc_every = 50, .seed = 1, .stages = 1};
    if (c->node == NULL) c->node = "node-0";
    if (c->master_addr == NULL) c->master_addr = "127.0.0.1";
    static const struct option opts[] = {
        {"steps", 1, 0, 's'}, {"compute-us", 1, 0, 'c'}, {"host-us", 1, 0, 'h'}, {"loader-us", 1, 0, 'l'},
        {"kernels", 1, 0, 'k'}, {"allreduce-bytes", 1, 0, 'b'}, {"buckets", 1, 0, 'B'},
        {"malloc-every", 1, 0, 'm'}, {"split", 1, 0, 'S'}, {"fault", 1, 0, 'f'}, {"log", 1, 0, 'L'},
        {"seed", 1, 0, 'r'}, {"lib-dir", 1, 0, 'd'}, {"dlopen-delay-ms", 1, 0, 'D'}, {"noise-us", 1, 0, 'N'},
        {"log-collectives", 0, 0, 'C'}, {"pipeline", 1, 0, 'P'}, {"allgather-bytes", 1, 0, 'G'},
        {"reducescatter-bytes", 1, 0, 'R'}, {0, 0, 0, 0}};
    static const char *log_path;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 's': c->steps = atoi(optarg); break;
        case 'c': c->compute_us = atof(optarg); break;
        case 'h': c->host_us = atof(optarg); break;
        case 'l': c->loader_us = atof(optarg); break;
        case 'k': c->kernels = atoi(optarg); break;
        case 'b': c->allreduce_bytes = strtoull(optarg, NULL, 10); break;
        case 'B': c->buckets = atoi(optarg); break;
        case 'm': c->malloc_every = atoi(optarg); break;
        case 'r': c->seed = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'd': c->lib_dir = optarg; break;
        case 'D': c->dlopen_delay_ms = atoi(optarg); break;
        case 'L': log_path = optarg; break;
        case 'C': c->log_colls = 1; break;
        case 'G': c->ag_bytes = strtoull(optarg, NULL, 10); break;
        case 'R': c->rs_bytes = strtoull(optarg, NULL, 10); break;
        case 'P': /* STAGES:BYTES */
            if (sscanf(optarg, "%d:%" SCNu64, &c->stages, &c->act_bytes) != 2 || c->stages < 1 || c->world % c->stages)
                die("bad --pipeline %s (want STAGES:BYTES, STAGES dividing WORLD_SIZE)", optarg);
            break;
        case 'N':
            if (sscanf(optarg, "%lf:%lf:%lf", &c->noise_us[0], &c->noise_us[1], &c->noise_us[2]) != 3 ||
                c->noise_us[0] < 0 || c->noise_us[1] < 0 || c->noise_us[2] < 0)
                die("bad --noise-us %s (want COMPUTE_US:HOST_US:LOADER_US, each >= 0)", optarg);
            break;
        case 'S': {
            struct split_cfg *s = &c->splits[c->nsplits];
            unsigned long long bytes;
            if (c->nsplits == MAX_SPLITS ||
                sscanf(optarg, "%31[^:]:%d:%d:%llu", s->name, &s->group_size, &s->strided, &bytes) != 4 ||
                s->group_size < 1 || c->world % s->group_size != 0)
                die("bad --split %s (want NAME:GROUP_SIZE:STRIDED:BYTES, GROUP_SIZE dividing WORLD_SIZE)", optarg);
            s->bytes = bytes;
            c->nsplits++;
            break;
        }
        case 'f':
            if (c->nfaults == MAX_FAULTS || fault_parse(optarg, &c->faults[c->nfaults]) != 0)
                die("bad --fault %s (want KIND:MS:EVERY:START_STEP:JITTER_MS[:END[:STEPS|-[:COMM[:BUCKET]]]])", optarg);
            c->nfaults++;
            break;
        default: die("%s", "unknown option; see the comment at the top of simrank.c");
        }
    }
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world) die("%s", "RANK must be in [0, WORLD_SIZE)");
    if (c->kernels < 3 || c->buckets < 1 || c->steps < 0) die("%s", "need --kernels >= 3, --buckets >= 1");
    if (log_path && freopen(log_path, "w", stdout) == NULL) die("cannot write log %s", log_path);
}

static void kernel_fwd(void) {}
static void kernel_bwd(void) {}
static void kernel_opt(void) {}

/* One kernel of `us` GPU microseconds: its grid is sized so the simulated GPU takes that long. */
static void launch(const struct api *a, void (*fn)(void), double us, double host_us, cudaStream_t s) {
    double ns_per_block = sim_env_double(SIM_ENV_NS_PER_BLOCK, SIM_DEFAULT_NS_PER_BLOCK);
    unsigned blocks = (unsigned)(us * 1000.0 / ns_per_block);
    dim3 grid = {blocks ? blocks : 1, 1, 1}, block = {256, 1, 1};
    check(a->cudaLaunchKernel((const void *)fn, grid, block, NULL, 0, s), "cudaLaunchKernel");
    sim_spin_until(sim_now_ns() + (int64_t)(host_us * 1000.0)); /* the framework's own CPU work */
}

static uint64_t comm_hash(ncclComm_t comm) { return ((const uint64_t *)(const void *)comm)[1]; }

/* Everything a rank holds across steps. */
struct rank {
    struct cfg c;
    struct api a;
    cudaStream_t stream;
    cudaEvent_t step_event, coll_event; /* GPU time at step start / when the GPU reaches the collective */
    ncclComm_t world, subs[MAX_SPLITS], pp; /* pp: the pipeline communicator (NULL: no stages) */
    void *cache[ALLOC_CACHE], *occasional, *batch;
};

/* What one step does, worked out before it starts. */
struct plan {
    int step, n_fwd, n_bwd;
    double kernel_us, host_per_kernel, loader_us, slow; /* healthy work, with any --noise-us drawn */
    double link_rank, link_nic; /* slow_link / slow_nic factors this step (1.0: healthy) */
    uint64_t bucket_count;
    int desync; /* a desync fault fires: desync_rank issues the first bucket */
    double fired[MAX_FAULTS];
};

SIM_PHASE static void setup(struct rank *r) {
    const struct cfg *c = &r->c;
    const struct api *a = &r->a;
    check(a->cudaSetDevice(c->local_rank % 8), "cudaSetDevice");
    check(a->cudaStreamCreate(&r->stream), "cudaStreamCreate");
    check(a->cudaEventCreate(&r->step_event), "cudaEventCreate");
    check(a->cudaEventCreate(&r->coll_event), "cudaEventCreate");
    ncclUniqueId pp_id;
    ncclUniqueId id = exchange_id(c, a, &pp_id);
    check(a->ncclCommInitRank(&r->world, c->world, id, c->rank), "ncclCommInitRank");
    printf("comm world %016llx %d %d\n", (unsigned long long)comm_hash(r->world), c->rank, c->world);
    for (int i = 0; i < c->nsplits; i++) {
        const struct split_cfg *s = &c->splits[i];
        int color = s->strided ? c->rank % (c->world / s->group_size) : c->rank / s->group_size;
        check(a->ncclCommSplit(r->world, color, c->rank, &r->subs[i], NULL), "ncclCommSplit");
        const int *hdr = (const int *)(const void *)((const char *)r->subs[i] + 16);
        printf("comm %s %016llx %d %d\n", s->name, (unsigned long long)comm_hash(r->subs[i]), hdr[0], hdr[1]);
    }
    r->pp = pipeline_setup(a, c, pp_id);
    for (int i = 0; i < ALLOC_CACHE; i++) check(a->cudaMalloc(&r->cache[i], 8 << 20), "cudaMalloc");
    check(a->cudaMalloc(&r->batch, 4 << 20), "cudaMalloc");
    fflush(stdout);
}

/* The step's phases and fault injectors below are SIM_PHASE functions, so each is a frame of its own
 * (named as in stacks: `cudaMalloc <- allocate_cache <- run_step <- main`); docs/sim.md lists them. */

/* The data-loader wait (off-CPU), then any dataloader_stall fault. */
SIM_PHASE static void fetch_batch(const struct cfg *c, const struct plan *p) {
    wait_off_cpu(p->loader_us / 1000.0);
    for (int i = 0; i < c->nfaults; i++)
        if (p->fired[i] > 0 && c->faults[i].kind == F_DATALOADER_STALL) stall_dataloader(p->fired[i]);
}

/* alloc_stall: free and re-allocate the block cache in slices whose mapping time adds up to `ms`. */
SIM_PHASE static void allocate_cache(const struct api *a, void **cache, double ms) {
    double gbps = sim_env_double(SIM_ENV_MALLOC_GBPS, SIM_DEFAULT_MALLOC_GBPS);
    double per_ns = ms * 1e6 / ALLOC_CACHE - 20000;
    size_t bytes = per_ns > 0 ? (size_t)(per_ns * gbps) : 512;
    for (int i = 0; i < ALLOC_CACHE; i++) {
        check(a->cudaFree(cache[i]), "cudaFree");
        check(a->cudaMalloc(&cache[i], bytes), "cudaMalloc");
    }
}

/* The batch's H2D copy, the forward kernels and the loss sync (loss.item()); returns the sync's ns. */
SIM_PHASE static int64_t forward(struct rank *r, const struct plan *p) {
    static char host_batch[1];
    const struct api *a = &r->a;
    check(a->cudaMemcpyAsync(r->batch, host_batch, 4 << 20, cudaMemcpyHostToDevice, r->stream), "cudaMemcpyAsync");
    gather_parameters(a, &r->c, r->world, r->batch, r->stream);
    for (int k = 0; k < p->n_fwd; k++) launch(a, kernel_fwd, p->kernel_us, p->host_per_kernel, r->stream);
    pipeline_exchange(a, &r->c, r->pp, r->batch, r->stream, +1); /* activations to the next stage */
    int64_t fwd_sync = sim_realtime_ns();
    check(a->cudaStreamSynchronize(r->stream), "cudaStreamSynchronize");
    return sim_realtime_ns() - fwd_sync;
}

/* Faults that strike right before a collective: the world's bucket `bucket` (comm -1) or split `comm`'s
 * all-reduce (the step's first collective unless a fault chose another); then its `coll` log line. */
SIM_PHASE static void before_collective(const struct rank *r, const struct plan *p, int comm, int bucket) {
    const struct cfg *c = &r->c;
    for (int i = 0; i < c->nfaults; i++) {
        const struct fault *f = &c->faults[i];
        if (f->comm != comm || f->bucket != bucket) continue;
        if (fault_fires(f, p->step) && f->kind == F_HANG) hang_rank(f, p->step);
        if (fault_fires(f, p->step) && f->kind == F_CRASH) crash_rank(f, p->step);
        if (p->fired[i] <= 0) continue;
        if (f->kind == F_HOST_COMPUTE) spin_host_compute(p->fired[i]);
        if (f->kind == F_CPU_CONTENTION) contend_cpu(p->fired[i]);
        if (f->kind == F_MEMCPY_STALL) stall_memcpy(&r->a, r->batch, p->fired[i]);
    }
    if (c->log_colls)
        printf("coll %d %s %d %lld\n", p->step, comm < 0 ? "world" : c->splits[comm].name, bucket,
               (long long)sim_realtime_ns());
}

/* desync: log it, then issue the step's first collective with twice the byte count. */
SIM_PHASE static void desync_rank(struct rank *r, const struct plan *p) {
    for (int i = 0; i < r->c.nfaults; i++)
        if (r->c.faults[i].kind == F_DESYNC && fault_fires(&r->c.faults[i], p->step)) log_failure(&r->c.faults[i], p->step);
    check(r->a.ncclAllReduce(r->batch, r->batch, p->bucket_count * 2, ncclBfloat16, ncclSum, r->world, r->stream),
          "ncclAllReduce");
}

/* Backward kernels interleaved with the bucketed all-reduces, then one per split communicator;
 * returns when the first all-reduce was called. */
SIM_PHASE static int64_t backward(struct rank *r, const struct plan *p) {
    const struct cfg *c = &r->c;
    const struct api *a = &r->a;
    int64_t enter = 0;
    pipeline_exchange(a, c, r->pp, r->batch, r->stream, -1); /* their gradients back to the previous stage */
    for (int k = 0, b = 0; k < p->n_bwd; k++) {
        launch(a, kernel_bwd, p->kernel_us, p->host_per_kernel, r->stream);
        for (; b < (k + 1) * c->buckets / p->n_bwd; b++) { /* bucket b's gradients are ready */
            before_collective(r, p, -1, b);
            if (b == 0) {
                check(a->cudaEventRecord(r->coll_event, r->stream), "cudaEventRecord");
                enter = sim_realtime_ns(); /* after the record (it takes the stream's lock): next is the call */
                if (p->desync) {
                    desync_rank(r, p);
                    continue;
                }
            }
            check(a->ncclAllReduce(r->batch, r->batch, p->bucket_count, ncclBfloat16, ncclSum, r->world, r->stream),
                  "ncclAllReduce");
        }
    }
    scatter_gradients(a, c, r->world, r->batch, r->stream);
    for (int i = 0; i < c->nsplits; i++) {
        before_collective(r, p, i, 0);
        check(a->ncclAllReduce(r->batch, r->batch, c->splits[i].bytes / 2, ncclBfloat16, ncclSum, r->subs[i],
                               r->stream),
              "ncclAllReduce");
    }
    return enter;
}

/* The optimizer kernel and the step's final stream sync; returns when that sync began. */
SIM_PHASE static int64_t optimizer_step(struct rank *r) {
    const struct api *a = &r->a;
    a->__rankechosim_set_gpu_slowdown(1.0);
    launch(a, kernel_opt, 1.0, 0, r->stream);
    int64_t sync_start = sim_realtime_ns();
    check(a->cudaStreamSynchronize(r->stream), "cudaStreamSynchronize");
    return sync_start;
}

static void plan_step(const struct cfg *c, int step, struct plan *p, char *causes, size_t size) {
    *p = (struct plan){.step = step, .n_fwd = c->kernels / 3, .slow = 1.0, .link_rank = 1.0, .link_nic = 1.0};
    p->n_bwd = c->kernels - p->n_fwd;
    p->kernel_us = (c->compute_us + healthy_noise_us(c, step, 0)) / c->kernels;
    p->host_per_kernel = (c->host_us + healthy_noise_us(c, step, 1)) / c->kernels;
    p->loader_us = c->loader_us + healthy_noise_us(c, step, 2);
    p->bucket_count = c->allreduce_bytes / (uint64_t)c->buckets / 2; /* bf16 elements */
    for (int i = 0; i < c->nfaults; i++) {
        p->fired[i] = fault_ms_at(&c->faults[i], i, c->rank, step, c->seed);
        enum fault_kind k = c->faults[i].kind;
        if (k == F_SLOW_LINK || k == F_SLOW_NIC) { /* a factor, not a delay: logged on its own `link` line */
            double *f = k == F_SLOW_LINK ? &p->link_rank : &p->link_nic;
            if (p->fired[i] > *f) *f = p->fired[i];
            continue;
        }
        if (p->fired[i] > 0)
            snprintf(causes + strlen(causes), size - strlen(causes), "%s%s:%.3f", *causes ? "," : "",
                     fault_name(c->faults[i].kind), p->fired[i]);
        if (c->faults[i].kind == F_DESYNC && fault_fires(&c->faults[i], step)) p->desync = 1;
        if (p->fired[i] > 0 && c->faults[i].kind == F_SLOW_GPU) p->slow += slow_gpu_extra(c, p->kernel_us, p->fired[i]);
    }
}

SIM_PHASE static void run_step(struct rank *r, int step) {
    const struct cfg *c = &r->c;
    const struct api *a = &r->a;
    struct plan p;
    char causes[512] = "";
    plan_step(c, step, &p, causes, sizeof causes);
    int64_t start = sim_realtime_ns();
    check(a->cudaEventRecord(r->step_event, r->stream), "cudaEventRecord"); /* the GPU is idle: now */
    fetch_batch(c, &p);
    int64_t loaded = sim_realtime_ns();
    for (int i = 0; i < c->nfaults; i++)
        if (p.fired[i] > 0 && c->faults[i].kind == F_ALLOC_STALL) allocate_cache(a, r->cache, p.fired[i]);
    if (c->malloc_every > 0 && step % c->malloc_every == 0) {
        check(a->cudaFree(r->occasional), "cudaFree");
        check(a->cudaMalloc(&r->occasional, 16 << 20), "cudaMalloc");
    }
    int64_t allocated = sim_realtime_ns();
    a->__rankechosim_set_gpu_slowdown(p.slow); /* slow_gpu: the forward's loss sync waits longer */
    a->__rankechosim_set_link_slowdown(p.link_rank, p.link_nic); /* slow_link: this step's collectives */
    if (p.link_rank > 1.0 || p.link_nic > 1.0) printf("link %d %g %g\n", step, p.link_rank, p.link_nic);
    int64_t fwd_sync = forward(r, &p);
    int64_t enter = backward(r, &p);
    int64_t sync_start = optimizer_step(r);
    int64_t end = sim_realtime_ns();
    float gpu_ms = 0;
    check(a->cudaEventElapsedTime(&gpu_ms, r->step_event, r->coll_event), "cudaEventElapsedTime");
    printf("step %d %lld %lld %lld %lld %lld %lld %lld %lld %s\n", step, (long long)start, (long long)enter,
           (long long)end, (long long)(end - sync_start), (long long)(loaded - start), (long long)(allocated - loaded),
           (long long)fwd_sync, (long long)start + (long long)((double)gpu_ms * 1e6), *causes ? causes : "-");
    fflush(stdout);
}

int main(int argc, char **argv) {
    int64_t started = sim_realtime_ns();
    if (getenv("SIMRANK_DIE_WITH_PARENT")) { /* the launcher's death must not leave ranks behind */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) return 4;
    }
    static struct rank r;
    parse(argc, argv, &r.c);
    for (int i = 0; i < r.c.nfaults; i++)
        if (r.c.faults[i].kind == F_CPU_CONTENTION && neighbor_start() != 0) die("%s", "cannot fork the neighbor");
    r.a = load_api(&r.c);
    printf("rank %d world %d local %d node %s pid %d tid %ld start %lld\n", r.c.rank, r.c.world, r.c.local_rank,
           r.c.node, (int)getpid(), (long)syscall(SYS_gettid), (long long)started);
    setup(&r);
    for (int step = 0; step < r.c.steps; step++) run_step(&r, step);
    if (r.pp != NULL) check(r.a.ncclCommDestroy(r.pp), "ncclCommDestroy");
    for (int i = r.c.nsplits - 1; i >= 0; i--) check(r.a.ncclCommDestroy(r.subs[i]), "ncclCommDestroy");
    check(r.a.ncclCommDestroy(r.world), "ncclCommDestroy");
    neighbor_stop();
    printf("done %lld\n", (long long)sim_realtime_ns());
    return 0;
}
