/* Internals of the simulated libnccl: wire messages, sockets, the hub and the communicator.
 *
 * Topology: the process that creates a unique id (rank 0, as with real NCCL) runs a "hub" thread
 * listening on TCP. Every rank opens two connections to its communicator's hub: a control one
 * used by the calling thread (init, split) and a data one used by the communicator's proxy thread
 * (collective arrivals). The hub releases a collective when every rank's GPU has reached it and a
 * send/recv when both peers have, which is what makes early ranks wait for a late one.
 */
#ifndef RANKECHO_SIM_NCCL_INT_H
#define RANKECHO_SIM_NCCL_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>

#include "nccl.h"

#define ID_MAGIC "RKSIMID1"
#define COMM_MAGIC 0x52414e4b4543484fULL /* "RANKECHO" */

enum msg_type {
    MSG_HELLO = 1, /* rank, a = nranks, b = channel, x = comm hash */
    MSG_READY,     /* hub -> control: everyone joined */
    MSG_ARRIVE,    /* a = op kind, b = peer, seq, x = bytes */
    MSG_GO,        /* a = op kind, b = peer, seq */
    MSG_SPLIT,     /* a = color, b = key */
    MSG_SPLIT_REPLY, /* rank = new rank, a = new nranks, b = port, x = hash, y = IPv4 (network order) */
    MSG_BYE,
    MSG_ERROR, /* rank = the rank that failed, a = error kind */
};

enum chan { CHAN_DATA = 0, CHAN_CTRL = 1 };

enum op_kind { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_SEND, OP_RECV };

enum hub_error { HUBERR_LOST = 1, HUBERR_MISMATCH = 2 };

struct msg {
    uint32_t type;
    int32_t rank;
    int32_t a;
    int32_t b;
    uint64_t seq;
    uint64_t x;
    uint64_t y;
};

/* The 128-byte ncclUniqueId: magic, hub IPv4 and port (network order), communicator hash. */
struct sim_id {
    char magic[8];
    uint32_t ip;
    uint16_t port;
    uint16_t pad;
    uint64_t hash;
};

/* One queued op of a task. */
struct op {
    enum op_kind kind;
    int peer;
    uint64_t seq;
    uint64_t bytes;
    uint64_t link; /* link_word(): this rank's node and link slowdown when the op was enqueued */
    int done;
};

/* A stream item: one collective, or every op a group put on one (communicator, stream). */
struct task {
    struct task *next;
    struct ncclComm *comm;
    void *stream_item;
    int64_t gpu_ready_ns; /* -1 until the GPU reaches the task */
    int nops;
    struct op ops[];
};

struct ncclComm {
    /* Public-by-convention header (stable offsets, documented in docs/sim.md). */
    uint64_t magic;
    uint64_t hash; /* equal on every rank of the communicator */
    int32_t rank;
    int32_t nranks;
    /* Private. */
    int device;
    int data_fd, ctrl_fd;
    uint32_t hub_ip; /* network order */
    uint64_t coll_seq;
    uint64_t *send_seq, *recv_seq; /* per peer */
    uint32_t splits;
    pthread_t proxy;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct task *head, *tail;
    int stopping;
    ncclResult_t async_error;
};

/* net.c */
int net_listen(uint32_t ip, uint16_t *port_out);
int net_connect(uint32_t ip, uint16_t port, int timeout_ms);
void net_tune(int fd); /* TCP_NODELAY */
int net_send(int fd, const struct msg *m);
int net_recv(int fd, struct msg *m); /* 1 ok, 0 EOF, -1 error */
uint32_t net_bind_ip(void);
uint64_t net_random64(void);
void sim_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* hub.c */
int hub_start(uint32_t ip, uint64_t hash, uint16_t *port_out);
void hub_wait_all(int timeout_ms);

/* transfer model: `slow` divides the bus bandwidth (slow_link; 1.0 = healthy) */
int64_t transfer_ns(enum op_kind kind, uint64_t bytes, int nranks, double slow);

/* slow_link. An arrival carries a link word (msg.y): the rank's node (a hash of RANKECHO_NODE_ID, low 32
 * bits), its rank slowdown and its NIC slowdown (x100, 16 bits each). The hub slows an instance by the
 * largest rank slowdown of its members and, when they span two or more nodes, the largest NIC slowdown,
 * and sends that factor (x100) with the GO: every member then takes the same longer transfer. */
uint64_t link_word(void);
struct link_acc {
    uint32_t node;
    int nodes; /* 0: none yet, 1: one node, 2: several */
    uint32_t rank_x100, nic_x100;
};
void link_add(struct link_acc *acc, uint64_t word);
uint32_t link_factor_x100(const struct link_acc *acc);

#endif
