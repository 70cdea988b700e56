/* The rank's bootstrap: rank 0 creates the NCCL unique id and serves it on MASTER_ADDR:MASTER_PORT, as
 * torch's TCPStore would; every other rank fetches it there (simrank.c calls exchange_id in setup). */
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
    int fd, clients;
    ncclUniqueId id;
};

static void *serve_id(void *p) {
    struct serve_arg *a = p;
    for (int i = 0; i < a->clients; i++) {
        int c = accept(a->fd, NULL, NULL);
        if (c < 0) break;
        if (write(c, &a->id, sizeof a->id) != (ssize_t)sizeof a->id) perror("simrank: id store");
        close(c);
    }
    close(a->fd);
    return NULL;
}

ncclUniqueId exchange_id(const struct cfg *c, const struct api *api) {
    static struct serve_arg arg;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->master_port)};
    if (inet_pton(AF_INET, c->master_addr, &sa.sin_addr) != 1) die("MASTER_ADDR %s is not IPv4", c->master_addr);
    if (c->rank == 0) {
        check(api->ncclGetUniqueId(&arg.id), "ncclGetUniqueId");
        if (c->world == 1) return arg.id;
        int one = 1;
        arg.fd = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(arg.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(arg.fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(arg.fd, 128) != 0)
            die("cannot listen on MASTER_ADDR:MASTER_PORT (%s); pick a free MASTER_PORT", c->master_addr);
        arg.clients = c->world - 1;
        pthread_t t;
        pthread_create(&t, NULL, serve_id, &arg);
        pthread_detach(t);
        return arg.id;
    }
    ncclUniqueId id;
    for (int64_t deadline = sim_now_ns() + 60 * 1000000000LL;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && read(fd, &id, sizeof id) == (ssize_t)sizeof id) {
            close(fd);
            return id;
        }
        close(fd);
        if (sim_now_ns() > deadline) die("no unique id from rank 0 at MASTER_ADDR %s within 60 s", c->master_addr);
        usleep(20000);
    }
}
