/* TCP plumbing for the simulated libnccl: fixed-size messages over blocking sockets. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nccl_int.h"
#include "simint.h"

void sim_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rankecho-sim nccl [pid %d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    _exit(70);
}

uint32_t net_bind_ip(void) {
    const char *addr = getenv(SIM_ENV_BIND_ADDR);
    struct in_addr in;
    if (addr == NULL || *addr == '\0') addr = "127.0.0.1";
    if (inet_pton(AF_INET, addr, &in) != 1)
        sim_fatal("%s=%s is not an IPv4 address; set it to this host's address", SIM_ENV_BIND_ADDR, addr);
    return in.s_addr;
}

uint64_t net_random64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = (uint64_t)sim_now_ns() ^ ((uint64_t)getpid() << 32);
    return v;
}

/* Both ends of every connection: without TCP_NODELAY a second small message sent before the first is
 * acknowledged (two GOs to a rank whose group holds a send and a recv) waits ~40 ms for a delayed ACK. */
void net_tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int net_listen(uint32_t ip, uint16_t *port_out) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = ip, .sin_port = 0};
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        close(fd);
        return -1;
    }
    *port_out = sa.sin_port;
    return fd;
}

int net_connect(uint32_t ip, uint16_t port, int timeout_ms) {
    int64_t deadline = sim_now_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = ip, .sin_port = port};
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            net_tune(fd);
            return fd;
        }
        close(fd);
        if (sim_now_ns() > deadline) return -1;
        usleep(20000);
    }
}

int net_send(int fd, const struct msg *m) {
    const char *p = (const char *)m;
    size_t left = sizeof *m;
    while (left) {
        ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        left -= (size_t)n;
    }
    return 0;
}

int net_recv(int fd, struct msg *m) {
    char *p = (char *)m;
    size_t left = sizeof *m;
    while (left) {
        ssize_t n = recv(fd, p, left, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 && left == sizeof *m) return 0;
        if (n <= 0) return -1;
        p += n;
        left -= (size_t)n;
    }
    return 1;
}
