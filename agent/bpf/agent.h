/* Layouts shared by the BPF program and agent/events.py: change both together
 * (tests/test_agent_events.py checks that the ids and sizes agree). */
#ifndef RANKECHO_AGENT_H
#define RANKECHO_AGENT_H

/* Record kinds in the ring buffer. */
enum rk_kind {
    KIND_CALL = 1,      /* one traced function call: enter ts, return ts, four argument slots */
    KIND_COMM_INIT = 2, /* a communicator was created: call record + 128 payload bytes */
    KIND_OFFCPU = 3,    /* a thread of a target process was off CPU for at least OFFCPU_MIN_NS */
    KIND_EXIT = 4,      /* the last thread of a target process exited */
};

/* Traced functions (the `fn` field). */
enum rk_fn {
    FN_NONE = 0,
    FN_COMM_INIT_RANK = 1,
    FN_COMM_INIT_RANK_CONFIG = 2,
    FN_COMM_INIT_ALL = 3,
    FN_COMM_SPLIT = 4,
    FN_COMM_DESTROY = 5,
    FN_COMM_ABORT = 6,
    FN_ALL_REDUCE = 10,
    FN_ALL_GATHER = 11,
    FN_REDUCE_SCATTER = 12,
    FN_BROADCAST = 13,
    FN_BCAST = 14,
    FN_REDUCE = 15,
    FN_SEND = 16,
    FN_RECV = 17,
    FN_GROUP_START = 18,
    FN_GROUP_END = 19,
    FN_STREAM_SYNC = 30,
    FN_DEVICE_SYNC = 31,
    FN_EVENT_SYNC = 32,
    FN_MALLOC = 33,
    FN_FREE = 34,
    FN_MEMCPY = 35,
    FN_MEMCPY_ASYNC = 36,
    FN_LAUNCH_KERNEL = 37,
};

/* 72 bytes. KIND_CALL: ts = enter, ts2 = return, a0..a3 per function (see agent/events.py),
 * launches = the calling thread's cumulative cudaLaunchKernel count at entry.
 * KIND_OFFCPU: ts = switch-out, ts2 = switch-in, a0 = wakeup ts (0 if preempted), extra = state
 * (1 sleeping, 0 preempted), fn = call in flight. KIND_EXIT: ts = exit time. */
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

/* KIND_COMM_INIT: ncclUniqueId bytes (InitRank*), or up to 16 comm handles (InitAll). */
struct rk_init_event {
    struct rk_event h;
    __u8 payload[RK_PAYLOAD];
};

#endif
