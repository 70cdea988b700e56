/* The communicator hub: the bootstrap root that rank 0's process runs for each communicator.
 *
 * It gathers every rank's two connections, then matches arrivals: a collective with sequence
 * number k is released (GO to every rank) once all ranks arrived at k with the same op and
 * size; a send is released together with its matching receive. It also answers ncclCommSplit
 * by grouping ranks by color, ordering them by (key, old rank) and starting one hub per group.
 * A rank that disconnects without saying goodbye is reported to all others (MSG_ERROR).
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_int.h"
#include "simint.h"

#define COLL_SLOTS 1024

struct conn {
    int fd;
    int bye;
};

struct coll_slot {
    uint64_t seq;
    int count;
    int kind;
    uint64_t bytes;
    struct link_acc link;
};

struct p2p {
    struct p2p *next;
    int src, dst;
    uint64_t seq;
    int have_send, have_recv;
    struct link_acc link;
};

struct split_req {
    int color, key, set;
};

struct hub {
    uint32_t ip;
    uint64_t hash;
    int lfd;
    int nranks;
    struct conn *conns; /* index rank * 2 + channel */
    struct coll_slot slots[COLL_SLOTS];
    struct p2p *pending;
    struct split_req *split;
    int nsplit;
    uint32_t splits;
};

static pthread_mutex_t g_hubs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hubs_cv = PTHREAD_COND_INITIALIZER;
static int g_hubs_running;

static void broadcast(struct hub *h, int chan, const struct msg *m) {
    for (int r = 0; r < h->nranks; r++) {
        struct conn *c = &h->conns[r * 2 + chan];
        if (c->fd >= 0) net_send(c->fd, m);
    }
}

static void fail_all(struct hub *h, int rank, int kind) {
    struct msg m = {.type = MSG_ERROR, .rank = rank, .a = kind, .x = h->hash};
    broadcast(h, CHAN_DATA, &m);
    broadcast(h, CHAN_CTRL, &m);
}

/* Accept connections until every rank's data and control channels said hello. */
static int gather(struct hub *h) {
    int joined = 0;
    while (h->nranks == 0 || joined < 2 * h->nranks) {
        int fd = accept4(h->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) return -1;
        net_tune(fd);
        struct msg m = {0};
        if (net_recv(fd, &m) != 1 || m.type != MSG_HELLO || m.x != h->hash || m.a <= 0 ||
            (h->nranks && m.a != h->nranks) || m.rank < 0 || m.rank >= m.a || (m.b != 0 && m.b != 1)) {
            fprintf(stderr, "rankecho-sim nccl hub %016llx: rejected a connection with a bad hello\n",
                    (unsigned long long)h->hash);
            close(fd);
            continue;
        }
        if (h->nranks == 0) {
            h->nranks = m.a;
            h->conns = calloc((size_t)(2 * m.a), sizeof *h->conns);
            h->split = calloc((size_t)m.a, sizeof *h->split);
            if (!h->conns || !h->split) return -1;
            for (int i = 0; i < 2 * m.a; i++) h->conns[i].fd = -1;
        }
        struct conn *c = &h->conns[m.rank * 2 + m.b];
        if (c->fd >= 0) {
            fprintf(stderr, "rankecho-sim nccl hub %016llx: rank %d joined twice; check RANK values\n",
                    (unsigned long long)h->hash, m.rank);
            close(fd);
            continue;
        }
        c->fd = fd;
        joined++;
    }
    pthread_mutex_lock(&g_hubs_mu); /* from now on ranks depend on this process staying up */
    g_hubs_running++;
    pthread_mutex_unlock(&g_hubs_mu);
    struct msg ready = {.type = MSG_READY, .x = h->hash, .a = h->nranks};
    broadcast(h, CHAN_CTRL, &ready);
    return 0;
}

static void go(struct hub *h, int rank, int kind, int peer, uint64_t seq, uint32_t slow_x100) {
    struct msg m = {.type = MSG_GO, .rank = rank, .a = kind, .b = peer, .seq = seq, .y = slow_x100};
    net_send(h->conns[rank * 2 + CHAN_DATA].fd, &m);
}

static int on_arrive(struct hub *h, int rank, const struct msg *m) {
    if (m->a == OP_SEND || m->a == OP_RECV) {
        int src = m->a == OP_SEND ? rank : m->b;
        int dst = m->a == OP_SEND ? m->b : rank;
        struct p2p **pp = &h->pending;
        while (*pp && !((*pp)->src == src && (*pp)->dst == dst && (*pp)->seq == m->seq)) pp = &(*pp)->next;
        if (*pp == NULL) {
            *pp = calloc(1, sizeof **pp);
            if (*pp == NULL) return -1;
            **pp = (struct p2p){NULL, src, dst, m->seq, 0, 0, {0}};
        }
        struct p2p *e = *pp;
        link_add(&e->link, m->y);
        if (m->a == OP_SEND) e->have_send = 1;
        else e->have_recv = 1;
        if (e->have_send && e->have_recv) {
            uint32_t slow = link_factor_x100(&e->link);
            go(h, src, OP_SEND, dst, e->seq, slow);
            go(h, dst, OP_RECV, src, e->seq, slow);
            *pp = e->next;
            free(e);
        }
        return 0;
    }
    struct coll_slot *s = &h->slots[m->seq % COLL_SLOTS];
    if (s->count == 0) *s = (struct coll_slot){m->seq, 0, m->a, m->x, {0}};
    if (s->seq != m->seq || s->kind != m->a || s->bytes != m->x) {
        fprintf(stderr,
                "rankecho-sim nccl hub %016llx: rank %d called op kind %d (%llu bytes) as collective #%llu "
                "but another rank called kind %d (%llu bytes); every rank must issue the same collectives "
                "in the same order\n",
                (unsigned long long)h->hash, rank, m->a, (unsigned long long)m->x,
                (unsigned long long)m->seq, s->kind, (unsigned long long)s->bytes);
        fail_all(h, rank, HUBERR_MISMATCH);
        return -1;
    }
    link_add(&s->link, m->y);
    if (++s->count == h->nranks) {
        s->count = 0;
        uint32_t slow = link_factor_x100(&s->link);
        for (int r = 0; r < h->nranks; r++) go(h, r, s->kind, -1, s->seq, slow);
    }
    return 0;
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int on_split(struct hub *h, int rank, const struct msg *m) {
    h->split[rank] = (struct split_req){m->a, m->b, 1};
    if (++h->nsplit < h->nranks) return 0;
    int *order = calloc((size_t)h->nranks, sizeof *order);
    if (order == NULL) return -1;
    for (int r = 0; r < h->nranks; r++) {
        struct split_req *q = &h->split[r];
        if (!q->set) continue;
        struct msg reply = {.type = MSG_SPLIT_REPLY, .rank = -1, .a = 0};
        if (q->color != NCCL_SPLIT_NOCOLOR) {
            int n = 0;
            for (int o = 0; o < h->nranks; o++) {
                struct split_req *p = &h->split[o];
                if (p->set && p->color == q->color) order[n++] = o;
            }
            for (int i = 1; i < n; i++) { /* insertion sort by (key, old rank) */
                int v = order[i], j = i - 1;
                while (j >= 0 && (h->split[order[j]].key > h->split[v].key ||
                                  (h->split[order[j]].key == h->split[v].key && order[j] > v))) {
                    order[j + 1] = order[j];
                    j--;
                }
                order[j + 1] = v;
            }
            uint64_t hash = mix64(h->hash ^ mix64(((uint64_t)h->splits << 32) ^ (uint32_t)q->color));
            uint16_t port;
            if (hub_start(h->ip, hash, &port) != 0) {
                free(order);
                return -1;
            }
            for (int i = 0; i < n; i++) {
                struct msg rep = {.type = MSG_SPLIT_REPLY, .rank = i, .a = n, .b = port, .x = hash,
                                  .y = h->ip};
                net_send(h->conns[order[i] * 2 + CHAN_CTRL].fd, &rep);
                h->split[order[i]].set = 0;
            }
            continue;
        }
        net_send(h->conns[r * 2 + CHAN_CTRL].fd, &reply);
        q->set = 0;
    }
    free(order);
    h->nsplit = 0;
    h->splits++;
    return 0;
}

static void serve(struct hub *h) {
    int n = 2 * h->nranks;
    struct pollfd *pfds = calloc((size_t)n, sizeof *pfds);
    if (pfds == NULL) return;
    for (;;) {
        int open = 0;
        for (int i = 0; i < n; i++) {
            pfds[i].fd = h->conns[i].fd;
            pfds[i].events = POLLIN;
            open += h->conns[i].fd >= 0;
        }
        if (open == 0) break;
        if (poll(pfds, (nfds_t)n, -1) < 0) continue;
        for (int i = 0; i < n; i++) {
            if (pfds[i].fd < 0 || !(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            struct conn *c = &h->conns[i];
            struct msg m = {0};
            int rc = net_recv(c->fd, &m);
            if (rc != 1) {
                close(c->fd);
                c->fd = -1;
                if (!c->bye) {
                    fail_all(h, i / 2, HUBERR_LOST);
                    goto out;
                }
                continue;
            }
            int bad = 0;
            if (m.type == MSG_BYE) c->bye = 1;
            else if (m.type == MSG_ARRIVE) bad = on_arrive(h, i / 2, &m);
            else if (m.type == MSG_SPLIT) bad = on_split(h, i / 2, &m);
            if (bad) goto out;
        }
    }
out:
    free(pfds);
}

static void *hub_main(void *arg) {
    struct hub *h = arg;
    pthread_setname_np(pthread_self(), "NCCL Bootstrap");
    int serving = gather(h) == 0;
    if (serving) serve(h);
    for (int i = 0; h->conns && i < 2 * h->nranks; i++)
        if (h->conns[i].fd >= 0) close(h->conns[i].fd);
    close(h->lfd);
    while (h->pending) {
        struct p2p *e = h->pending;
        h->pending = e->next;
        free(e);
    }
    free(h->conns);
    free(h->split);
    free(h);
    if (serving) {
        pthread_mutex_lock(&g_hubs_mu);
        g_hubs_running--;
        pthread_cond_broadcast(&g_hubs_cv);
        pthread_mutex_unlock(&g_hubs_mu);
    }
    return NULL;
}

int hub_start(uint32_t ip, uint64_t hash, uint16_t *port_out) {
    struct hub *h = calloc(1, sizeof *h);
    if (h == NULL) return -1;
    h->ip = ip;
    h->hash = hash;
    h->lfd = net_listen(ip, port_out);
    if (h->lfd < 0) {
        free(h);
        return -1;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    if (pthread_create(&t, &attr, hub_main, h) != 0) {
        close(h->lfd);
        free(h);
        return -1;
    }
    pthread_attr_destroy(&attr);
    return 0;
}

/* Keep this process alive while hubs it hosts still serve other ranks (bounded wait). */
void hub_wait_all(int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    pthread_mutex_lock(&g_hubs_mu);
    while (g_hubs_running > 0)
        if (pthread_cond_timedwait(&g_hubs_cv, &g_hubs_mu, &ts) != 0) break;
    pthread_mutex_unlock(&g_hubs_mu);
}
