/* Fault injection for the simulated rank: each kind leaves the signature a real cause would.
 *
 * host_compute      on-CPU busy loop before the collective (the rank's thread is running)
 * dataloader_stall  blocked in ppoll() on an empty pipe (off-CPU, sleeping)
 * cpu_contention    a separate "noisy-neighbor" process pinned to the rank's CPU spins at
 *                   SCHED_FIFO priority, so the rank's thread is runnable but preempted
 * slow_gpu          the rank's kernels run slower (launches identical, syncs longer): its GPU reaches the
 *                   step's first world all-reduce `ms` late (slow_gpu_extra)
 * alloc_stall       a free/malloc cycle over a block cache, each cudaMalloc slow (see simrank.c)
 * hang              stops before the step's first collective, asleep in ppoll(), for `ms` (0: until killed)
 * crash             _exit()s with status `ms` before the step's first collective (no goodbye to the hub)
 * desync            the step's first collective carries twice the byte count (the hub then aborts the job)
 * slow_link         the rank's transfer bandwidth divided by `ms` (the factor) on every communicator: each
 *                   instance it takes part in takes longer for every member (the hub applies it, comm.c)
 * slow_nic          the same, only on communicators spanning more than one node (a node's slow NIC; the
 *                   scenario's `slow_link` on a node)
 * memcpy_stall      a blocking cudaMemcpy (device to host) sized to take `ms`, before the collective: the
 *                   rank is inside the copy call, off-CPU (like a .item() / .cpu() on a large tensor)
 * hang, crash and desync fire once, at start_step, and log a `fault KIND STEP VALUE` line before acting.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simint.h"
#include "simrank.h"

static const char *const NAMES[F_NKINDS] = {"host_compute", "dataloader_stall", "cpu_contention", "slow_gpu",
                                            "alloc_stall",  "hang",             "crash",          "desync",
                                            "slow_link",    "slow_nic",         "memcpy_stall"};

const char *fault_name(enum fault_kind k) { return (unsigned)k < F_NKINDS ? NAMES[k] : "?"; }

/* A whole decimal integer >= lo; 0 when `text` is one. */
static int parse_int(const char *text, int lo, int *out) {
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < lo || v > 1000000000L) return -1;
    *out = (int)v;
    return 0;
}

/* The optional tail ":END[:STEPS[:COMM[:BUCKET]]]" (END -1: none; STEPS "-" or "S1,S2,..."; COMM -1: the
 * world, else a split's index; BUCKET a world bucket); 0 when well-formed. */
static int parse_tail(const char *tail, struct fault *f) {
    char buf[1024], *field[4] = {0};
    int n = 0;
    if (*tail == '\0') return 0;
    if (*tail != ':' || strlen(tail) >= sizeof buf) return -1;
    strcpy(buf, tail + 1);
    for (char *p = buf; p != NULL && n < 5; n++) {
        if (n == 4) return -1; /* a fifth field */
        field[n] = p;
        if ((p = strchr(p, ':')) != NULL) *p++ = '\0';
    }
    if (parse_int(field[0], -1, &f->end_step) != 0) return -1;
    if (field[1] != NULL && strcmp(field[1], "-") != 0) {
        for (char *save = NULL, *s = strtok_r(field[1], ",", &save); s; s = strtok_r(NULL, ",", &save))
            if (f->nsteps == MAX_FAULT_STEPS || parse_int(s, 0, &f->steps[f->nsteps++]) != 0) return -1;
        if (f->nsteps == 0) return -1;
    }
    if (field[2] != NULL && (parse_int(field[2], -1, &f->comm) != 0 || f->comm >= MAX_SPLITS)) return -1;
    if (field[3] != NULL && parse_int(field[3], 0, &f->bucket) != 0) return -1;
    return 0;
}

int fault_parse(const char *spec, struct fault *out) {
    char kind[32];
    double ms, jitter;
    int every, start, n = 0;
    if (sscanf(spec, "%31[a-z_]:%lf:%d:%d:%lf%n", kind, &ms, &every, &start, &jitter, &n) != 5) return -1;
    for (int k = 0; k < F_NKINDS; k++) {
        if (strcmp(kind, NAMES[k]) == 0) {
            if (ms < 0 || every < 1 || start < 0 || jitter < 0) return -1;
            *out = (struct fault){(enum fault_kind)k, ms, jitter, every, start, .end_step = -1, .comm = -1};
            return parse_tail(spec + n, out);
        }
    }
    return -1;
}

int fault_scheduled(const struct fault *f, int step) {
    if (f->nsteps > 0) {
        for (int i = 0; i < f->nsteps; i++)
            if (f->steps[i] == step) return 1;
        return 0;
    }
    if (f->end_step >= 0 && step > f->end_step) return 0;
    return step >= f->start_step && (step - f->start_step) % f->every == 0;
}

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Milliseconds fault `f` injects at `step` (0 when it does not fire); jitter is deterministic. */
double fault_ms_at(const struct fault *f, int index, int rank, int step, unsigned seed) {
    if (f->kind == F_HANG || f->kind == F_CRASH || f->kind == F_DESYNC) /* once; only a timed hang delays */
        return f->kind == F_HANG && fault_fires(f, step) ? f->ms : 0;
    if (!fault_scheduled(f, step)) return 0;
    uint64_t h = mix(((uint64_t)seed << 40) ^ ((uint64_t)(unsigned)rank << 24) ^ ((uint64_t)index << 20) ^
                     (uint64_t)(unsigned)step);
    double u = (double)(h >> 11) / (double)(1ULL << 53); /* [0, 1) */
    double ms = f->ms + f->jitter_ms * (2.0 * u - 1.0);
    return ms > 0 ? ms : 0;
}

/* slow_gpu's factor less 1 for `ms`: `ms` is the lateness the fault causes, the extra GPU time before the step's
 * first world all-reduce (bucket 0, where the rank records its GPU arrival), so the factor is taken against the
 * GPU time of the kernels that run before it: the forward ones and the backward ones up to bucket 0's gradients
 * (simrank.c's plan_step splits them a third forward, and backward() issues bucket 0 after the first m
 * backward kernels with m * buckets >= n_bwd). docs/sim.md. */
double slow_gpu_extra(const struct cfg *c, double kernel_us, double ms) {
    int n_fwd = c->kernels / 3, n_bwd = c->kernels - n_fwd;
    return ms * 1000.0 / (kernel_us * (n_fwd + (n_bwd + c->buckets - 1) / c->buckets));
}

/* Healthy jitter (--noise-us): uniform in [0, max) us, a function of (seed, rank, step, which) only, so a
 * scenario's noise is the same on every run and in both rank programs (pyrank_lib.healthy_noise_us). */
double healthy_noise_us(const struct cfg *c, int step, int which) {
    if (c->noise_us[which] <= 0) return 0;
    uint64_t h = mix(((uint64_t)c->seed << 40) ^ ((uint64_t)(unsigned)c->rank << 24) ^ (uint64_t)(unsigned)step ^
                     ((uint64_t)(which + 1) << 56));
    return c->noise_us[which] * ((double)(h >> 11) / (double)(1ULL << 53));
}

int fault_fires(const struct fault *f, int step) {
    return (f->kind == F_HANG || f->kind == F_CRASH || f->kind == F_DESYNC) && step == f->start_step;
}

void log_failure(const struct fault *f, int step) {
    printf("fault %s %d %g\n", fault_name(f->kind), step, f->ms);
    fflush(stdout);
}

/* hang: log, then stop before the collective, asleep in ppoll(), for `ms` (0: for good, like a
 * deadlocked loader; the launcher kills it). */
SIM_PHASE void hang_rank(const struct fault *f, int step) {
    log_failure(f, step);
    if (f->ms > 0) {
        wait_off_cpu(f->ms);
        return;
    }
    for (;;) wait_off_cpu(1000.0);
}

/* crash: log, then _exit() with status `ms`: no atexit handlers, no goodbye to the hub. */
SIM_PHASE void crash_rank(const struct fault *f, int step) {
    log_failure(f, step);
    _exit((int)f->ms);
}

/* memcpy_stall: one blocking device-to-host copy whose size the fake PCIe rate turns into `ms` (its
 * cudaMemcpy costs 2 us plus bytes / RANKECHO_SIM_PCIE_GBPS, cudart_mem.c). */
SIM_PHASE void stall_memcpy(const struct api *a, const void *device_buf, double ms) {
    static char host[1]; /* a device-to-host copy is never dereferenced by the fake runtime */
    double gbps = sim_env_double(SIM_ENV_PCIE_GBPS, SIM_DEFAULT_PCIE_GBPS);
    double ns = ms * 1e6 - 2000;
    size_t bytes = ns > 0 ? (size_t)(ns * gbps) : 1;
    if (a->cudaMemcpy(host, device_buf, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        fprintf(stderr, "simrank: memcpy_stall: cudaMemcpy failed\n");
}

/* dataloader_stall: the loader's queue stays empty for `ms` (off-CPU, sleeping). */
SIM_PHASE void stall_dataloader(double ms) { wait_off_cpu(ms); }

/* host_compute: `ms` of busy host work (on-CPU, running). */
SIM_PHASE void spin_host_compute(double ms) { sim_spin_until(sim_now_ns() + (int64_t)(ms * 1e6)); }

SIM_PHASE void wait_off_cpu(double ms) {
    static int fds[2] = {-1, -1};
    if (fds[0] < 0 && pipe(fds) != 0) {
        sim_sleep_until(sim_now_ns() + (int64_t)(ms * 1e6));
        return;
    }
    int64_t deadline = sim_now_ns() + (int64_t)(ms * 1e6);
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    for (int64_t left; (left = deadline - sim_now_ns()) > 0;) {
        struct timespec ts = {left / 1000000000LL, left % 1000000000LL};
        ppoll(&p, 1, &ts, NULL); /* like a loader waiting on a worker queue that stays empty */
    }
}

static pid_t g_pid = -1;
static int g_cmd = -1, g_ack = -1;

struct neighbor_cmd {
    int cpu;
    double ms;
};

static void neighbor_main(int cmd, int ack) {
    prctl(PR_SET_NAME, "noisy-neighbor");
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct sched_param sp = {.sched_priority = 1};
    int rt = sched_setscheduler(0, SCHED_FIFO, &sp) == 0;
    if (!rt)
        fprintf(stderr, "simrank: cpu_contention without CAP_SYS_NICE: the neighbor spins at normal priority, "
                        "so the rank is only partly preempted (run as root for the full effect)\n");
    struct neighbor_cmd c;
    while (read(cmd, &c, sizeof c) == (ssize_t)sizeof c) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(c.cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
        int64_t deadline = sim_now_ns() + (int64_t)(c.ms * 1e6);
        char one = 1;
        if (write(ack, &one, 1) != 1) break;
        sim_spin_until(deadline);
    }
    _exit(0);
}

int neighbor_start(void) {
    int cmd[2], ack[2];
    if (pipe(cmd) != 0 || pipe(ack) != 0) return -1;
    fflush(NULL);
    g_pid = fork();
    if (g_pid < 0) return -1;
    if (g_pid == 0) {
        close(cmd[1]);
        close(ack[0]);
        neighbor_main(cmd[0], ack[1]);
    }
    close(cmd[0]);
    close(ack[1]);
    g_cmd = cmd[1];
    g_ack = ack[0];
    return 0;
}

void neighbor_stop(void) {
    if (g_pid <= 0) return;
    close(g_cmd);
    close(g_ack);
    kill(g_pid, SIGKILL);
    waitpid(g_pid, NULL, 0);
    g_pid = -1;
}

/* cpu_contention: the neighbor takes this CPU for `ms` while the rank stays runnable. */
SIM_PHASE void contend_cpu(double ms) {
    if (g_pid <= 0) return;
    cpu_set_t old, one;
    sched_getaffinity(0, sizeof old, &old);
    int cpu = sched_getcpu();
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
    struct neighbor_cmd c = {cpu, ms};
    char ack;
    int64_t deadline = sim_now_ns() + (int64_t)(ms * 1e6);
    if (write(g_cmd, &c, sizeof c) == (ssize_t)sizeof c && read(g_ack, &ack, 1) == 1) {
        /* Runnable from here on; the neighbor owns this CPU until `deadline`. Keep doing host work
         * (tiny slices) so the thread stays runnable rather than sleeping. */
        sim_spin_until(deadline);
    }
    sched_setaffinity(0, sizeof old, &old);
}
