/* The rank's bootstrap: rank 0 creates the NCCL unique id and serves it on MASTER_ADDR:MASTER_PORT, as
 * torch's TCPStore would; every other rank fetches it there (simrank.c calls exchange_id in setup). With
 * pipeline stages rank 0 also creates one id per pipeline (its `pp` communicator, initialised with
 * ncclCommInitRank as torch initialises a process group's) and serves them in the same reply. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "simint.h"
#include "simrank.h"

/* Rank 0 hands the 128-byte id to every other rank over TCP, as a TCPStore get/set would. */
struct serve_arg {
    int fd, clients, nids;
    ncclUniqueId ids[1 + MAX_PIPELINES]; /* the world's, then pipeline k's at 1 + k */
};

static void *serve_id(void *p) {
    struct serve_arg *a = p;
    for (int i = 0; i < a->clients; i++) {
        int c = accept(a->fd, NULL, NULL);
        if (c < 0) break;
        ssize_t size = (ssize_t)(sizeof a->ids[0] * (size_t)a->nids);
        if (write(c, a->ids, (size_t)size) != size) perror("simrank: id store");
        close(c);
    }
    close(a->fd);
    return NULL;
}

static int pipelines(const struct cfg *c) { return c->stages > 1 ? c->world / c->stages : 0; }

ncclUniqueId exchange_id(const struct cfg *c, const struct api *api, ncclUniqueId *pp_id) {
    static struct serve_arg arg;
    static ncclUniqueId got[1 + MAX_PIPELINES];
    arg.nids = 1 + pipelines(c);
    if (arg.nids > 1 + MAX_PIPELINES) die("%s", "too many pipelines (world / stages > MAX_PIPELINES)");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->master_port)};
    if (inet_pton(AF_INET, c->master_addr, &sa.sin_addr) != 1) die("MASTER_ADDR %s is not IPv4", c->master_addr);
    if (c->rank == 0) {
        for (int i = 0; i < arg.nids; i++) check(api->ncclGetUniqueId(&arg.ids[i]), "ncclGetUniqueId");
        if (pp_id && arg.nids > 1) *pp_id = arg.ids[1]; /* rank 0 is in pipeline 0 */
        if (c->world == 1) return arg.ids[0];
        int one = 1;
        arg.fd = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(arg.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(arg.fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(arg.fd, 128) != 0)
            die("cannot listen on MASTER_ADDR:MASTER_PORT (%s); pick a free MASTER_PORT", c->master_addr);
        arg.clients = c->world - 1;
        pthread_t t;
        pthread_create(&t, NULL, serve_id, &arg);
        pthread_detach(t);
        return arg.ids[0];
    }
    ssize_t size = (ssize_t)(sizeof got[0] * (size_t)arg.nids);
    for (int64_t deadline = sim_now_ns() + 60 * 1000000000LL;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && recv(fd, got, (size_t)size, MSG_WAITALL) == size) {
            close(fd);
            if (pp_id && arg.nids > 1) *pp_id = got[1 + c->rank % pipelines(c)];
            return got[0];
        }
        close(fd);
        if (sim_now_ns() > deadline) die("no unique id from rank 0 at MASTER_ADDR %s within 60 s", c->master_addr);
        usleep(20000);
    }
}
