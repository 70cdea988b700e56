/* A fake rank for the agent tests: waits for GO_FILE (if set), dlopens the fake libraries from LIBDIR,
 * creates a communicator from a fixed unique id, then runs STEPS steps of launches, an all-reduce and a
 * stream sync, while a helper thread sleeps (off CPU) 5 ms per step. Prints nothing; exits 0. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *comm_t;
typedef struct { unsigned x, y, z; } dim3;

static volatile int running = 1;
static void *helper(void *arg)
{
    (void)arg;
    while (running) {
        struct timespec t = {0, 5000000};
        nanosleep(&t, NULL);
    }
    return NULL;
}

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) { fprintf(stderr, "missing %s\n", name); exit(2); }
    return p;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    int steps = argc > 2 ? atoi(argv[2]) : 10;
    int rank = argc > 3 ? atoi(argv[3]) : 0;
    int nranks = argc > 4 ? atoi(argv[4]) : 1;
    const char *go = getenv("GO_FILE");
    while (go && access(go, F_OK) != 0) usleep(10000);
    char path[4096];
    snprintf(path, sizeof path, "%s/libcudart.so.12", dir);
    void *cuda = dlopen(path, RTLD_NOW);
    snprintf(path, sizeof path, "%s/libnccl.so.2", dir);
    void *nccl = dlopen(path, RTLD_NOW);
    if (!cuda || !nccl) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    int (*init)(comm_t *, int, ncclUniqueId, int) = sym(nccl, "ncclCommInitRank");
    int (*split)(comm_t, int, int, comm_t *, void *) = sym(nccl, "ncclCommSplit");
    int (*allreduce)(const void *, void *, size_t, int, int, comm_t, void *) = sym(nccl, "ncclAllReduce");
    int (*destroy)(comm_t) = sym(nccl, "ncclCommDestroy");
    int (*sync)(void *) = sym(cuda, "cudaStreamSynchronize");
    int (*launch)(const void *, dim3, dim3, void **, size_t, void *) = sym(cuda, "cudaLaunchKernel");
    int (*cmalloc)(void **, size_t) = sym(cuda, "cudaMalloc");

    pthread_t th;
    pthread_create(&th, NULL, helper, NULL);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    strcpy(id.internal, "rankecho-test-unique-id");
    comm_t comm = NULL, child = NULL;
    init(&comm, nranks, id, rank);
    split(comm, 1, rank, &child, NULL);
    void *buf = NULL;
    cmalloc(&buf, 1 << 20);
    void *stream = (void *)0x5000;
    dim3 g = {1, 1, 1};
    for (int s = 0; s < steps; s++) {
        for (int k = 0; k < 7; k++) launch((void *)main, g, g, NULL, 0, stream);
        allreduce(buf, buf, 1024, 7, 0, comm, stream);
        sync(stream);
    }
    destroy(child);
    destroy(comm);
    running = 0;
    pthread_join(th, NULL);
    return 0;
}
