/* Simulated libnccl, communicator lifecycle: unique ids, init, split, destroy, and the proxy
 * thread that turns queued collectives into hub arrivals once the GPU reaches them.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nccl_int.h"
#include "simint.h"

static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *g_live[256]; /* communicators to close politely at exit */

static double g_bus_gbps = SIM_DEFAULT_BUS_GBPS;
static double g_lat_us = SIM_DEFAULT_LAT_US;

__attribute__((constructor)) static void nccl_init(void) {
    g_bus_gbps = sim_env_double(SIM_ENV_BUS_GBPS, SIM_DEFAULT_BUS_GBPS);
    g_lat_us = sim_env_double(SIM_ENV_LAT_US, SIM_DEFAULT_LAT_US);
}

static void say_bye(struct ncclComm *c) {
    struct msg bye = {.type = MSG_BYE, .rank = c->rank};
    net_send(c->data_fd, &bye);
    net_send(c->ctrl_fd, &bye);
}

__attribute__((destructor)) static void nccl_fini(void) {
    pthread_mutex_lock(&g_live_mu);
    for (size_t i = 0; i < sizeof g_live / sizeof g_live[0]; i++) {
        if (g_live[i] == NULL) continue;
        say_bye(g_live[i]);
        shutdown(g_live[i]->data_fd, SHUT_RDWR);
        shutdown(g_live[i]->ctrl_fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&g_live_mu);
    hub_wait_all(30000);
}

static void track(struct ncclComm *c, int add) {
    pthread_mutex_lock(&g_live_mu);
    for (size_t i = 0; i < sizeof g_live / sizeof g_live[0]; i++) {
        if (add ? g_live[i] == NULL : g_live[i] == c) {
            g_live[i] = add ? c : NULL;
            break;
        }
    }
    pthread_mutex_unlock(&g_live_mu);
}

static uint32_t g_node_hash;

__attribute__((constructor)) static void link_init(void) {
    const char *node = getenv("RANKECHO_NODE_ID");
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = node && *node ? node : "node-0"; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    g_node_hash = h;
}

static uint64_t x100(double f) {
    double v = f * 100.0 + 0.5;
    return v < 100 ? 100 : v > 65535 ? 65535 : (uint64_t)v;
}

uint64_t link_word(void) {
    double rank_f = 1.0, nic_f = 1.0;
    __rankechosim_link_slowdown(&rank_f, &nic_f);
    return (uint64_t)g_node_hash | x100(rank_f) << 32 | x100(nic_f) << 48;
}

void link_add(struct link_acc *acc, uint64_t word) {
    uint32_t node = (uint32_t)word, rank_x100 = (uint32_t)(word >> 32) & 0xffff, nic_x100 = (uint32_t)(word >> 48);
    if (acc->nodes == 0) acc->node = node, acc->nodes = 1;
    else if (acc->node != node) acc->nodes = 2;
    if (rank_x100 > acc->rank_x100) acc->rank_x100 = rank_x100;
    if (nic_x100 > acc->nic_x100) acc->nic_x100 = nic_x100;
}

uint32_t link_factor_x100(const struct link_acc *acc) {
    uint32_t f = acc->rank_x100 > 100 ? acc->rank_x100 : 100;
    if (acc->nodes > 1 && acc->nic_x100 > f) f = acc->nic_x100;
    return f;
}

int64_t transfer_ns(enum op_kind kind, uint64_t bytes, int nranks, double slow) {
    double n = nranks, factor = 1.0;
    if (kind == OP_ALLREDUCE) factor = 2.0 * (n - 1) / n;
    else if (kind == OP_ALLGATHER || kind == OP_REDUCESCATTER) factor = (n - 1) / n;
    if (nranks <= 1 && kind != OP_SEND && kind != OP_RECV) factor = 0;
    return (int64_t)(g_lat_us * 1000.0 + factor * (double)bytes * (slow > 1.0 ? slow : 1.0) / g_bus_gbps);
}

static void fatal_from_hub(struct ncclComm *c, const struct msg *m) {
    if (m->type == MSG_ERROR && m->a == HUBERR_MISMATCH)
        sim_fatal("communicator %016llx: collective mismatch reported by rank %d (see the hub's message "
                  "above); aborting", (unsigned long long)c->hash, m->rank);
    if (m->type == MSG_ERROR)
        sim_fatal("communicator %016llx: rank %d left without ncclCommDestroy (its process exited or was "
                  "killed); aborting like NCCL's async error handling", (unsigned long long)c->hash, m->rank);
    sim_fatal("communicator %016llx: lost the connection to the hub in rank 0's process (did it exit?); "
              "aborting", (unsigned long long)c->hash);
}

/* Wait for the GO of every op in `t`; returns the completion time of the slowest op. */
static int64_t run_task(struct ncclComm *c, struct task *t) {
    sim_sleep_until(t->gpu_ready_ns);
    for (int i = 0; i < t->nops; i++) {
        struct op *o = &t->ops[i];
        struct msg m = {.type = MSG_ARRIVE, .rank = c->rank, .a = (int)o->kind, .b = o->peer, .seq = o->seq,
                        .x = o->bytes, .y = o->link};
        if (net_send(c->data_fd, &m) != 0 && !c->stopping) fatal_from_hub(c, &m);
    }
    int64_t done = 0;
    for (int left = t->nops; left > 0;) {
        struct msg m = {0};
        if (net_recv(c->data_fd, &m) != 1 || m.type != MSG_GO) {
            if (c->stopping) return sim_now_ns();
            fatal_from_hub(c, &m);
        }
        for (int i = 0; i < t->nops; i++) {
            struct op *o = &t->ops[i];
            if (!o->done && (int)o->kind == m.a && o->seq == m.seq && (m.b < 0 || o->peer == m.b)) {
                o->done = 1;
                left--;
                int64_t end = sim_now_ns() + transfer_ns(o->kind, o->bytes, c->nranks, (double)m.y / 100.0);
                if (end > done) done = end;
                break;
            }
        }
    }
    return done;
}

static void *proxy_main(void *arg) {
    struct ncclComm *c = arg;
    pthread_setname_np(pthread_self(), "NCCL Progress"); /* as real NCCL names its proxy threads */
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stopping && (c->head == NULL || c->head->gpu_ready_ns < 0)) pthread_cond_wait(&c->cv, &c->mu);
        if (c->stopping) break; /* destroy drained the queue first; abort drops it */
        struct task *t = c->head;
        pthread_mutex_unlock(&c->mu);
        int64_t done = run_task(c, t);
        pthread_mutex_lock(&c->mu);
        c->head = t->next;
        if (c->head == NULL) c->tail = NULL;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (t->stream_item) __rankechosim_stream_complete(t->stream_item, done);
        free(t);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Connect both channels to a hub, wait until every rank joined, start the proxy. */
static ncclResult_t comm_connect(ncclComm_t *out, uint32_t ip, uint16_t port, uint64_t hash, int rank,
                                 int nranks) {
    struct ncclComm *c = calloc(1, sizeof *c);
    if (c == NULL) return ncclSystemError;
    c->magic = COMM_MAGIC;
    c->hash = hash;
    c->rank = rank;
    c->nranks = nranks;
    c->hub_ip = ip;
    c->device = __rankechosim_device();
    c->send_seq = calloc((size_t)nranks, sizeof *c->send_seq);
    c->recv_seq = calloc((size_t)nranks, sizeof *c->recv_seq);
    c->ctrl_fd = net_connect(ip, port, 60000);
    c->data_fd = net_connect(ip, port, 60000);
    if (c->ctrl_fd < 0 || c->data_fd < 0 || !c->send_seq || !c->recv_seq) {
        char addr[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &ip, addr, sizeof addr);
        fprintf(stderr, "rankecho-sim nccl: rank %d could not reach the communicator hub at %s:%u within 60 s; "
                "is rank 0 running and the address routable?\n", rank, addr, ntohs(port));
        if (c->ctrl_fd >= 0) close(c->ctrl_fd);
        if (c->data_fd >= 0) close(c->data_fd);
        free(c->send_seq);
        free(c->recv_seq);
        free(c);
        return ncclSystemError;
    }
    struct msg hello = {.type = MSG_HELLO, .rank = rank, .a = nranks, .b = CHAN_CTRL, .x = hash};
    net_send(c->ctrl_fd, &hello);
    hello.b = CHAN_DATA;
    net_send(c->data_fd, &hello);
    struct msg m = {0};
    if (net_recv(c->ctrl_fd, &m) != 1 || m.type != MSG_READY) fatal_from_hub(c, &m);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->proxy, NULL, proxy_main, c) != 0) return ncclSystemError;
    track(c, 1);
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version) {
    SIM_ENTRY_FRAME();
    if (version == NULL) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (uniqueId == NULL) return ncclInvalidArgument;
    struct sim_id id = {.ip = net_bind_ip(), .hash = net_random64()};
    memcpy(id.magic, ID_MAGIC, sizeof id.magic);
    if (hub_start(id.ip, id.hash, &id.port) != 0) {
        fprintf(stderr, "rankecho-sim nccl: cannot listen on %s; set it to a local address\n", SIM_ENV_BIND_ADDR);
        return ncclSystemError;
    }
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &id, sizeof id);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    struct sim_id id;
    memcpy(&id, commId.internal, sizeof id);
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0) {
        fprintf(stderr, "rankecho-sim nccl: rank %d got a unique id not made by ncclGetUniqueId "
                "(distribute rank 0's id unchanged)\n", rank);
        return ncclInvalidArgument;
    }
    return comm_connect(comm, id.ip, id.port, id.hash, rank, nranks);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    (void)config; /* every init is blocking here */
    return ncclCommInitRank(comm, nranks, commId, rank);
}

struct init_all_arg {
    ncclComm_t *slot;
    int ndev, rank, device;
    ncclUniqueId id;
    ncclResult_t rc;
};

static void *init_all_main(void *p) {
    struct init_all_arg *a = p;
    __rankechosim_set_device(a->device);
    a->rc = ncclCommInitRank(a->slot, a->ndev, a->id, a->rank);
    return NULL;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    if (comm == NULL || ndev < 1) return ncclInvalidArgument;
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) return rc;
    struct init_all_arg *args = calloc((size_t)ndev, sizeof *args);
    pthread_t *threads = calloc((size_t)ndev, sizeof *threads);
    if (args == NULL || threads == NULL) return ncclSystemError;
    for (int i = 0; i < ndev; i++) {
        args[i] = (struct init_all_arg){&comm[i], ndev, i, devlist ? devlist[i] : i, id, ncclSuccess};
        pthread_create(&threads[i], NULL, init_all_main, &args[i]);
    }
    for (int i = 0; i < ndev; i++) {
        pthread_join(threads[i], NULL);
        if (args[i].rc != ncclSuccess) rc = args[i].rc;
    }
    free(args);
    free(threads);
    return rc;
}

static int valid(const struct ncclComm *c) { return c != NULL && c->magic == COMM_MAGIC; }

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    (void)config;
    if (!valid(comm) || newcomm == NULL || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) return ncclInvalidArgument;
    struct msg m = {.type = MSG_SPLIT, .rank = comm->rank, .a = color, .b = key};
    if (net_send(comm->ctrl_fd, &m) != 0 || net_recv(comm->ctrl_fd, &m) != 1 || m.type != MSG_SPLIT_REPLY)
        fatal_from_hub(comm, &m);
    comm->splits++;
    *newcomm = NULL;
    if (m.a == 0) return ncclSuccess;
    return comm_connect(newcomm, (uint32_t)m.y, (uint16_t)m.b, m.x, m.rank, m.a);
}

static ncclResult_t finish(ncclComm_t comm, int abort) {
    if (!valid(comm)) return ncclInvalidArgument;
    track(comm, 0);
    pthread_mutex_lock(&comm->mu);
    if (!abort)
        while (comm->head != NULL) pthread_cond_wait(&comm->cv, &comm->mu);
    comm->stopping = abort ? 2 : 1;
    pthread_cond_broadcast(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
    if (!abort) say_bye(comm);
    shutdown(comm->data_fd, SHUT_RDWR);
    shutdown(comm->ctrl_fd, SHUT_RDWR);
    pthread_join(comm->proxy, NULL);
    close(comm->data_fd);
    close(comm->ctrl_fd);
    comm->magic = 0;
    free(comm->send_seq);
    free(comm->recv_seq);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return finish(comm, 0); }

ncclResult_t ncclCommAbort(ncclComm_t comm) { return finish(comm, 1); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    SIM_ENTRY_FRAME();
    if (!valid(comm) || count == NULL) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    SIM_ENTRY_FRAME();
    if (!valid(comm) || rank == NULL) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    SIM_ENTRY_FRAME();
    if (!valid(comm) || device == NULL) return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    SIM_ENTRY_FRAME();
    if (!valid(comm) || asyncError == NULL) return ncclInvalidArgument;
    *asyncError = comm->async_error;
    return ncclSuccess;
}

const char *ncclGetLastError(ncclComm_t comm) {
    SIM_ENTRY_FRAME();
    (void)comm;
    return "";
}

const char *ncclGetErrorString(ncclResult_t result) {
    SIM_ENTRY_FRAME();
    static const char *names[] = {"no error", "unhandled cuda error", "unhandled system error", "internal error",
                                  "invalid argument", "invalid usage", "remote process exited or there was a "
                                  "network error", "NCCL operation in progress"};
    return (unsigned)result < sizeof names / sizeof names[0] ? names[result] : "unknown result code";
}
