/* Layouts shared by the BPF program and agent/events.py: change both together
 * (tests/test_agent_discovery.py checks that the ids and sizes agree). Inlined into the program by
 * agent/probes.py, which also fills in the generated parts (@...@ markers). */
#ifndef RANKECHO_AGENT_H
#define RANKECHO_AGENT_H

/* Record kinds in the ring buffer. */
enum rk_kind {
    KIND_CALL = 1,      /* one traced function call: enter ts, return ts, four argument slots */
    KIND_COMM_INIT = 2, /* a communicator was created: call record + 128 payload bytes */
    KIND_OFFCPU = 3,    /* a thread of a target process was off CPU for at least OFFCPU_MIN_NS */
    KIND_EXIT = 4,      /* the last thread of a target process exited */
    KIND_STACK = 5,     /* a user stack: precedes the record it belongs to (same tid and ts) */
};

/* Why a KIND_STACK record was taken (its `extra` field). */
enum rk_stack_source {
    STACK_CALL = 1,   /* at a traced call's entry (collectives always, long CUDA calls) */
    STACK_OFFCPU = 2, /* at a switch-out, kept because the off-CPU interval was long */
    STACK_SAMPLE = 3, /* the on-CPU sampler (no record follows) */
};

/* Traced functions (the `fn` field): enum rk_fn, generated from agent/traced.py. */
/* @TRACED_ENUM@ */

/* 72 bytes. KIND_CALL: ts = enter, ts2 = return, a0..a3 per function (see agent/events.py),
 * launches = the calling thread's cumulative cudaLaunchKernel count at entry.
 * KIND_OFFCPU: ts = switch-out, ts2 = switch-in, a0 = wakeup ts (0 if preempted), extra = state
 * (1 sleeping, 0 preempted), fn = call in flight. KIND_EXIT: ts = exit time, a0 = 1 when a1 holds the
 * status given to exit_group (0: unknown, e.g. killed by a signal). */
struct rk_event {
    __u64 ts;
    __u64 ts2;
    __u64 a0;
    __u64 a1;
    __u64 a2;
    __u64 a3;
    __u32 pid;   /* tgid */
    __u32 tid;
    __u16 kind;
    __u16 fn;
    __u32 extra; /* KIND_CALL: return value (int) */
    __u64 launches;
};

#define RK_PAYLOAD 128

/* Deepest user stack kept: 64 frames covers framework call chains (a PyTorch dispatcher stack is 30-50
 * native frames) while bounding the walk at ~5 us and the record at 584 bytes; the kernel's own
 * limit is 127 (kernel.perf_event_max_stack). A stack that fills it is marked truncated. */
#define RK_STACK_DEPTH 64
/* Return addresses kept from the scan above SP of an off-CPU or sampled stack (a power of two). */
#define RK_SCAN_KEEP 8

/* KIND_STACK: h.ts = ts of the record it belongs to (call entry, switch-out, sample time), h.fn = the
 * call, h.a0 = frames walked, h.a1 = the return address at SP when taken at a function's entry (0
 * otherwise: user space inserts it when the frame-pointer walk skipped the immediate caller),
 * h.extra = enum rk_stack_source. */
struct rk_stack_event {
    struct rk_event h;
    __u64 ips[RK_STACK_DEPTH];
    __u64 scanned[RK_SCAN_KEEP]; /* off-CPU and sampled stacks: return addresses above SP (scan_callers) */
    struct rk_py_stack py; /* the thread's Python frames (agent/bpf/pyframes.h); n = 0 outside CPython */
};

/* KIND_COMM_INIT: ncclUniqueId bytes (InitRank*), or up to 16 comm handles (InitAll). */
struct rk_init_event {
    struct rk_event h;
    __u8 payload[RK_PAYLOAD];
};

#endif
