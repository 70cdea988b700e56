/* rankecho node agent: uprobes on libnccl/libcudart plus scheduler tracepoints.
 *
 * Knobs come in as -D flags from agent/probes.py: OFFCPU_MIN_NS (off-CPU threshold), MAX_THREADS
 * (per-thread map size), RINGBUF_PAGES, and FILTER_PIDS (only processes user space put in `targets`;
 * without it, any process that hits a probe becomes a target, so a job is traced from its first call),
 * STACKS (capture user stacks), STACK_CALL_MIN_NS (a CUDA call at least this long ships its entry stack)
 * and STACK_SLOTS (stacks held per map while their call or off-CPU interval is in progress).
 *
 * User stacks (bpf_get_stack, frame-pointer walk) are copied into the record, never into a stack map:
 * a stack-map id is a hash bucket a later stack can take over, so it cannot name a stack off the node.
 * They are taken where they explain lateness, never per kernel launch (~1 us + 70 ns per frame):
 * at every collective's entry, at the entry of the CUDA calls that can be long (shipped only when the
 * call was), at every switch-out of a thread that calls collectives (shipped only when it stayed off
 * long), and by the low-rate on-CPU sampler.
 *
 * Kernel struct fields are never read here: the agent may run with headers older than the kernel,
 * where field offsets are silently wrong. Helpers, pt_regs and tracepoint arguments only.
 */
#include <uapi/linux/ptrace.h>
#include "pyframes.h"
#include "agent.h"

#ifndef OFFCPU_MIN_NS
#define OFFCPU_MIN_NS 1000000ULL
#endif
#ifndef MAX_THREADS
#define MAX_THREADS 8192
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 256
#endif
#ifndef STACK_CALL_MIN_NS
#define STACK_CALL_MIN_NS 1000000ULL
#endif
#ifndef STACK_SLOTS
#define STACK_SLOTS 2048
#endif

struct call_key {
    u32 tid;
    u32 fn;
};

struct offcpu {
    u64 ts;     /* switch-out */
    u64 wake;   /* sched_wakeup, 0 while still blocked or when preempted */
    u32 pid;
    u16 call;   /* function in flight at switch-out */
    u16 sleeping;
    u32 by;     /* preempted: the thread that took the CPU (0 when the thread blocked) */
    u32 pad;
};

struct launch_count {
    u32 pid;
    u32 pad;
    u64 n;
};

BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
BPF_HASH(targets, u32, u8, 4096);                              /* tgid -> 1 */
BPF_TABLE("lru_hash", struct call_key, struct rk_event, calls, MAX_THREADS);
BPF_TABLE("lru_hash", u32, struct rk_init_event, inits, 1024); /* tid -> pending init call */
BPF_TABLE("lru_hash", u32, u16, in_flight, MAX_THREADS);       /* tid -> fn */
BPF_TABLE("lru_hash", u32, struct offcpu, offstart, MAX_THREADS);
BPF_TABLE("lru_hash", u32, struct launch_count, launches, MAX_THREADS); /* cumulative per tid */
BPF_TABLE("lru_hash", u32, u32, exit_codes, 4096);          /* tgid -> status given to exit_group */
BPF_PERCPU_ARRAY(drops, u64, 1);
#ifdef STACKS
BPF_PERCPU_ARRAY(stack_scratch, struct rk_stack_event, 1); /* too big for the 512-byte BPF stack */
BPF_TABLE("lru_hash", struct call_key, struct rk_stack_event, call_stacks, STACK_SLOTS);
BPF_TABLE("lru_hash", u32, struct rk_stack_event, off_stacks, STACK_SLOTS); /* tid -> at switch-out */
/* Threads that entered a collective: only theirs are worth a stack at every switch-out (the pre-call
 * window explains the calling thread; NCCL's and the runtime's helper threads switch far more often). */
BPF_TABLE("lru_hash", u32, u8, stack_threads, MAX_THREADS);
BPF_PROG_ARRAY(stack_progs, 1); /* [0] = call_stack (agent/probes.py fills it at load) */
#endif

#define ARG1 PT_REGS_PARM1(ctx)
#define ARG2 PT_REGS_PARM2(ctx)
#define ARG3 PT_REGS_PARM3(ctx)
#define ARG4 PT_REGS_PARM4(ctx)
#define ARG5 PT_REGS_PARM5(ctx)
#define ARG6 PT_REGS_PARM6(ctx)
/* The n-th 8-byte stack slot above the return address at function entry (7th argument = 1). */
#define STACK(n) stack_arg(ctx, n)
#define I32(x) ((u64)(x) & 0xffffffffULL)
#define U8(x) ((u64)(x) & 0xffULL)
/* a3 of a collective: datatype | op << 8 | root-or-peer << 16 */
#define PACK(dtype, op, peer) (U8(dtype) | (U8(op) << 8) | (I32(peer) << 16))

static __always_inline u64 stack_arg(struct pt_regs *ctx, int n)
{
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * n));
    return v;
}

static __always_inline void count_drop(void)
{
    int zero = 0;
    u64 *d = drops.lookup(&zero);
    if (d)
        *d += 1;
}

static __always_inline void submit(void *data, u64 size)
{
    if (events.ringbuf_output(data, size, BPF_RB_NO_WAKEUP) != 0)
        count_drop();
}

#ifdef STACKS
/* The calling thread's user stack into the per-CPU scratch record (NULL if there is none to take).
 * `entry`: taken at a function's first instruction (or past endbr64), where [SP] is still the return
 * address; the frame-pointer walk skips that caller when the function does not begin with push %rbp
 * (the kernel adds it only for such entries), so it goes along for user space to insert. */
static __always_inline struct rk_stack_event *take_stack(void *ctx, u64 sp, u64 ts, u16 fn, u32 source)
{
    int zero = 0;
    struct rk_stack_event *s = stack_scratch.lookup(&zero);
    if (!s)
        return 0;
    long n = bpf_get_stack(ctx, s->ips, sizeof(s->ips), BPF_F_USER_STACK);
    if (n <= 0)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    s->h.ts = ts;
    s->h.ts2 = 0;
    s->h.a0 = (u64)n / 8;
    s->h.a1 = 0;
    s->h.a2 = 0;
    s->h.a3 = 0;
    if (sp)
        bpf_probe_read_user(&s->h.a1, sizeof(s->h.a1), (void *)sp);
    s->h.pid = id >> 32;
    s->h.tid = (u32)id;
    s->h.kind = KIND_STACK;
    s->h.fn = fn;
    s->h.extra = source;
    s->h.launches = 0;
    __builtin_memset(s->scanned, 0, sizeof(s->scanned));
    rk_py_walk(s->h.pid, s->h.tid, &s->py); /* a no-op lookup for a process that runs no CPython */
    return s;
}
#endif

/* Is `ret` a return address: do the bytes before it end in a call instruction (call rel32, call
 * *disp32(%rip), call *%reg, call *%r8-15, call *disp8(%reg))? Rejects almost every stale local. */
static __always_inline int is_return_address(u64 ret)
{
    u8 b[8] = {};
    if (ret < 8 || bpf_probe_read_user(b, sizeof(b), (void *)(ret - 8)) != 0)
        return 0;
    return b[3] == 0xe8 || (b[2] == 0xff && b[3] == 0x15) || (b[6] == 0xff && (b[7] & 0xf8) == 0xd0) ||
           (b[5] == 0x41 && b[6] == 0xff && (b[7] & 0xf8) == 0xd0) || (b[5] == 0xff && (b[6] & 0xf8) == 0x50);
}

#define SCAN_WORDS 32
/* A stack taken inside a function without frame pointers (a libc wrapper, code the vDSO calls back from)
 * loses callers: the frame-pointer walk follows saved %rbp values, and a function that kept %rbp for its
 * caller leaves no link to itself. Its return address is still on the stack. So off-CPU and sampled
 * stacks also carry the words from the interrupted thread's user SP (bpf_task_pt_regs) up that pass
 * is_return_address, in stack order, the walk's own return addresses among them: user space inserts the
 * others between the walk's frames they lie between (agent/stacks.py). */
static __always_inline void scan_callers(struct rk_stack_event *s)
{
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    u64 sp = 0;
    bpf_probe_read_kernel(&sp, sizeof(sp), &regs->sp);
    u64 words[SCAN_WORDS] = {};
    if (!sp || bpf_probe_read_user(words, sizeof(words), (void *)sp) != 0)
        return;
    u32 found = 0;
#pragma clang loop unroll(disable)
    for (int i = 0; i < SCAN_WORDS; i++) {
        if (found >= RK_SCAN_KEEP)
            break;
        if (words[i] > 0xffff && is_return_address(words[i]))
            s->scanned[found++ & (RK_SCAN_KEEP - 1)] = words[i];
    }
}

/* Which calls take a stack at entry: 2 = always shipped (collectives), 1 = shipped when the call lasted
 * at least STACK_CALL_MIN_NS (the CUDA calls that can be long), 0 = none. Generated from agent/traced.py. */
/* @STACK_POLICY@ */

static __always_inline int accept(u32 tgid)
{
    if (targets.lookup(&tgid))
        return 1;
#ifdef FILTER_PIDS
    return 0;
#else
    u8 one = 1;
    targets.update(&tgid, &one);
    return 1;
#endif
}

static __always_inline int begin_call(struct pt_regs *ctx, u16 fn, u64 a0, u64 a1, u64 a2, u64 a3)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!accept(id >> 32))
        return 0;
    struct rk_event e = {};
    e.ts = bpf_ktime_get_ns();
    e.pid = id >> 32;
    e.tid = (u32)id;
    e.kind = KIND_CALL;
    e.fn = fn;
    e.a0 = a0;
    e.a1 = a1;
    e.a2 = a2;
    e.a3 = a3;
    /* Snapshot of the thread's launch counter, so each step's launches can be told apart. */
    struct launch_count *lc = launches.lookup(&e.tid);
    e.launches = lc ? lc->n : 0;
    struct call_key k = {.tid = e.tid, .fn = fn};
    calls.update(&k, &e);
    in_flight.update(&e.tid, &fn);
#ifdef STACKS
    if (stack_policy(fn)) {
        if (stack_policy(fn) == 2) {
            u8 one = 1;
            stack_threads.update(&e.tid, &one);
        }
        /* The stack is taken by call_stack, one program every traced call jumps to: inlined into each
         * call's own probe, the stack walk made up a third of the compile. Back here only if the jump
         * failed (the program array not filled yet): then the call has no stack. */
        stack_progs.call(ctx, 0);
    }
#endif
    return 0;
}

#ifdef STACKS
/* Tail-called from begin_call (same pt_regs: the call's entry), which left the call in `calls` and its
 * function in `in_flight`. */
int call_stack(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u16 *fn = in_flight.lookup(&tid);
    if (!fn)
        return 0;
    struct call_key k = {.tid = tid, .fn = *fn};
    struct rk_event *e = calls.lookup(&k);
    if (!e)
        return 0;
    struct rk_stack_event *s = take_stack(ctx, PT_REGS_SP(ctx), e->ts, k.fn, STACK_CALL);
    if (s)
        call_stacks.update(&k, s);
    return 0;
}
#endif

static __always_inline int end_call(u16 fn, u64 rc)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct call_key k = {.tid = tid, .fn = fn};
    struct rk_event *e = calls.lookup(&k);
    if (!e)
        return 0;
    e->ts2 = bpf_ktime_get_ns();
    e->extra = (u32)rc;
#ifdef STACKS
    /* The stack goes first, so user space holds it when the call record arrives. */
    struct rk_stack_event *s = call_stacks.lookup(&k);
    if (s) {
        if (stack_policy(fn) == 2 || e->ts2 - e->ts >= STACK_CALL_MIN_NS)
            submit(s, sizeof(*s));
        call_stacks.delete(&k);
    }
#endif
    submit(e, sizeof(*e));
    calls.delete(&k);
    in_flight.delete(&tid);
    return 0;
}

/* Communicator creation: the unique id is passed by value on the stack right above the return
 * address (so `rank` of ncclCommInitRank is the third register argument); the new handle is only
 * written when the call returns. */
static __always_inline int begin_init(struct pt_regs *ctx, u16 fn, u64 a0, u64 a1, u64 a2, u64 a3)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!accept(id >> 32))
        return 0;
    struct rk_init_event e = {};
    e.h.ts = bpf_ktime_get_ns();
    e.h.pid = id >> 32;
    e.h.tid = (u32)id;
    e.h.kind = KIND_COMM_INIT;
    e.h.fn = fn;
    e.h.a0 = a0;
    e.h.a1 = a1;
    e.h.a2 = a2;
    e.h.a3 = a3;
    if (fn == FN_COMM_INIT_RANK || fn == FN_COMM_INIT_RANK_CONFIG)
        bpf_probe_read_user(e.payload, RK_PAYLOAD, (void *)(PT_REGS_SP(ctx) + 8));
    inits.update(&e.h.tid, &e);
    u16 f = fn;
    in_flight.update(&e.h.tid, &f);
    return 0;
}

static __always_inline int end_init(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct rk_init_event *e = inits.lookup(&tid);
    if (!e)
        return 0;
    e->h.ts2 = bpf_ktime_get_ns();
    e->h.extra = (u32)PT_REGS_RC(ctx);
    u64 handle = 0;
    if (e->h.fn == FN_COMM_INIT_ALL) {
        /* a0 = ncclComm_t comms[ndev]: copy up to 16 handles. */
        u64 n = e->h.a1 > 16 ? 16 : e->h.a1;
        if (n == 16)
            bpf_probe_read_user(e->payload, 128, (void *)e->h.a0);
        else
            bpf_probe_read_user(e->payload, (n & 15) * 8, (void *)e->h.a0);
    } else {
        /* a3 = address of the ncclComm_t the library filled in. */
        bpf_probe_read_user(&handle, sizeof(handle), (void *)e->h.a3);
        e->h.a3 = handle;
    }
    submit(e, sizeof(*e));
    inits.delete(&tid);
    in_flight.delete(&tid);
    return 0;
}

#define CALL(name, FN, A0, A1, A2, A3)                                              \
    int enter_##name(struct pt_regs *ctx) { return begin_call(ctx, FN, A0, A1, A2, A3); } \
    int return_##name(struct pt_regs *ctx) { return end_call(FN, PT_REGS_RC(ctx)); }

#define INIT(name, FN, A0, A1, A2, A3)                                                    \
    int enter_##name(struct pt_regs *ctx) { return begin_init(ctx, FN, A0, A1, A2, A3); } \
    int return_##name(struct pt_regs *ctx) { return end_init(ctx); }

/* One CALL() or INIT() line per traced function, generated from the table in agent/traced.py (which
 * also says what each argument slot holds); hand-written handlers ("count") follow. */
/* @TRACED_PROBES@ */

/* Kernel launches are far too frequent for one record each: count them per thread here and let
 * user space read the cumulative counts once per window. */
int enter_cudaLaunchKernel(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!accept(id >> 32))
        return 0;
    u32 tid = (u32)id;
    struct launch_count zero = {.pid = id >> 32};
    struct launch_count *c = launches.lookup_or_try_init(&tid, &zero);
    if (c)
        __sync_fetch_and_add(&c->n, 1);
    return 0;
}

/* Off-CPU intervals of every thread of a target process. current == prev during sched_switch. */
TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u32 prev = args->prev_pid;
    if (prev != 0) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (targets.lookup(&tgid)) {
            struct offcpu o = {};
            o.ts = now;
            o.pid = tgid;
            /* Low state bits set = blocked (S, D, ...); 0 or the preempt marker = still runnable. */
            o.sleeping = (args->prev_state & 0xff) ? 1 : 0;
            o.by = o.sleeping ? 0 : args->next_pid;
            u16 *call = in_flight.lookup(&prev);
            o.call = call ? *call : 0;
            offstart.update(&prev, &o);
#ifdef STACKS
            /* current is still prev here: its user stack is where it blocked or was preempted. */
            if (stack_threads.lookup(&prev)) {
                struct rk_stack_event *s = take_stack(args, 0, now, o.call, STACK_OFFCPU);
                if (s) {
                    scan_callers(s);
                    off_stacks.update(&prev, s);
                }
            }
#endif
        }
    }
    u32 next = args->next_pid;
    struct offcpu *o = offstart.lookup(&next);
    if (!o)
        return 0;
    if (now - o->ts >= OFFCPU_MIN_NS) {
        struct rk_event e = {};
        e.ts = o->ts;
        e.ts2 = now;
        e.a0 = o->wake;
        /* Who held the CPU: the preemptor, or for a woken thread the one it waited behind (prev). */
        e.a1 = o->sleeping ? (o->wake ? prev : 0) : o->by;
        e.pid = o->pid;
        e.tid = next;
        e.kind = KIND_OFFCPU;
        e.fn = o->call;
        e.extra = o->sleeping;
#ifdef STACKS
        struct rk_stack_event *s = off_stacks.lookup(&next);
        if (s && s->h.ts == o->ts)
            submit(s, sizeof(*s));
#endif
        submit(&e, sizeof(e));
    }
#ifdef STACKS
    off_stacks.delete(&next);
#endif
    offstart.delete(&next);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    u32 tid = args->pid;
    struct offcpu *o = offstart.lookup(&tid);
    if (o && o->wake == 0)
        o->wake = bpf_ktime_get_ns();
    return 0;
}

/* The status a target passes to exit_group (exit(), _exit(), returning from main): the only place it is
 * readable without a kernel struct read (task->exit_code's offset is wrong with these headers). A
 * process killed by a signal never calls it, so its exit record says "unknown". */
TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!targets.lookup(&tgid))
        return 0;
    u32 code = (u32)args->error_code & 0xff;
    exit_codes.update(&tgid, &code);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 tid = (u32)id;
    offstart.delete(&tid);
    in_flight.delete(&tid);
#ifdef STACKS
    off_stacks.delete(&tid);
    stack_threads.delete(&tid);
#endif
    if (!args->group_dead || !targets.lookup(&tgid))
        return 0;
    targets.delete(&tgid);
    struct rk_event e = {};
    e.ts = bpf_ktime_get_ns();
    e.pid = tgid;
    e.tid = tid;
    e.kind = KIND_EXIT;
    u32 *code = exit_codes.lookup(&tgid);
    if (code) {
        e.a0 = 1; /* a1 holds the exit status */
        e.a1 = *code;
        exit_codes.delete(&tgid);
    }
    submit(&e, sizeof(e));
    return 0;
}

#ifdef STACKS
/* The low-rate on-CPU sampler (a cpu-clock perf event on every CPU, agent --sample-hz): the user stack
 * of a target thread that was running, for the window's host-compute share. Its context (a struct
 * bpf_perf_event_data) only goes to bpf_get_stack, so it is taken as void *: including
 * <uapi/linux/bpf_perf_event.h> for the type pulls in kernel headers that cost ~0.9 s of every compile. */
int on_cpu_sample(void *ctx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!tgid || !targets.lookup(&tgid))
        return 0;
    struct rk_stack_event *s = take_stack(ctx, 0, bpf_ktime_get_ns(), 0, STACK_SAMPLE);
    if (s) {
        scan_callers(s);
        submit(s, sizeof(*s));
    }
    return 0;
}
#endif
