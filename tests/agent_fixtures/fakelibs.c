/* Minimal stand-ins for libnccl.so.2 and libcudart.so.12 with the real x86-64 signatures, used by the
 * agent's probe tests. Build twice: -DLIB_NCCL for libnccl.so.2, -DLIB_CUDA for libcudart.so.12. */
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef void *cudaStream_t;
struct ncclComm { int rank; int nranks; };

static void spin_ns(long ns)
{
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

#ifdef LIB_NCCL
__attribute__((noinline)) int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    struct ncclComm *c = malloc(sizeof(*c));
    c->rank = rank + id.internal[0] * 0;
    c->nranks = nranks;
    *comm = c;
    return 0;
}
__attribute__((noinline)) int ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config)
{
    struct ncclComm *c = malloc(sizeof(*c));
    c->rank = key + color * 0;
    c->nranks = comm->nranks;
    *newcomm = c;
    (void)config;
    return 0;
}
__attribute__((noinline)) int ncclAllReduce(const void *s, void *r, size_t count, int dtype, int op, ncclComm_t comm, cudaStream_t stream)
{
    (void)s; (void)r; (void)count; (void)dtype; (void)op; (void)comm; (void)stream;
    spin_ns(200000);
    return 0;
}
__attribute__((noinline)) int ncclSend(const void *b, size_t count, int dtype, int peer, ncclComm_t comm, cudaStream_t stream)
{
    (void)b; (void)count; (void)dtype; (void)peer; (void)comm; (void)stream;
    return 0;
}
__attribute__((noinline)) int ncclCommDestroy(ncclComm_t comm) { free(comm); return 0; }
#endif

#ifdef LIB_CUDA
__attribute__((noinline)) int cudaStreamSynchronize(cudaStream_t stream) { (void)stream; spin_ns(1000000); return 0; }
__attribute__((noinline)) int cudaMalloc(void **p, size_t size) { *p = malloc(size); return 0; }
__attribute__((noinline)) int cudaFree(void *p) { free(p); return 0; }
typedef struct { unsigned x, y, z; } dim3;
__attribute__((noinline)) int cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s)
{
    (void)f; (void)g; (void)b; (void)args; (void)shm; (void)s;
    return 0;
}
#endif
