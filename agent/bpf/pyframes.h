/* CPython frames from BPF (bcc dialect): the interpreter's frame chain of the current thread, read with
 * bpf_probe_read_user from the offsets agent/pyframes.py puts in `py_targets` for each CPython process.
 * Self-contained: include it once in a bcc program (after <uapi/linux/ptrace.h>) and call rk_py_walk()
 * from any uprobe or tracepoint that runs in the context of the thread to read. Layouts here and in
 * agent/pyframes.py (RkPyTarget, RkPyStack) change together (tests/test_agent_pyframes.py checks sizes).
 *
 * Why a walk of the thread list and not TLS: with bcc and this machine's 6.1 headers task->thread.fsbase
 * reads as garbage, so the walk goes _PyRuntime -> interpreters.head -> threads and picks the state whose
 * native thread id (3.11+) or pthread's tid (3.10: pthread_t is glibc's struct pthread) is the caller's.
 * Why frames are marked, not skipped: a data-dependent `continue` over 3.12's shim frames made the verifier
 * give up (E2BIG, see ../shared notes); user space drops marked frames. Every loop is bounded and
 * kept a loop (unrolled, the agent's many inlined copies took 4.6 s to compile instead of 2.2 s).
 */
#ifndef RANKECHO_PYFRAMES_H
#define RANKECHO_PYFRAMES_H

#ifndef RK_PY_MAX_FRAMES
#define RK_PY_MAX_FRAMES 24
#endif
#ifndef RK_PY_MAX_THREADS
#define RK_PY_MAX_THREADS 32 /* thread states looked at, newest first (the main thread is the oldest) */
#endif
#ifndef RK_PY_MAX_TARGETS
#define RK_PY_MAX_TARGETS 1024
#endif

#define RK_PY_NONE 0xffff        /* an offset a version does not have */
#define RK_PY_OWNER_CSTACK 3      /* 3.12 FRAME_OWNED_BY_CSTACK: the shim frame of a C-to-Python entry */
#define RK_PY_FRAME_SHIM 1        /* rk_py_frame.flags: not a Python function, drop it */

/* rk_py_stack.status */
#define RK_PY_OK 0
#define RK_PY_NO_TARGET 1  /* the process is not in py_targets */
#define RK_PY_NO_THREAD 2  /* no thread state of this thread (not a Python thread, or not found in time) */
#define RK_PY_READ_FAIL 3  /* a read of the interpreter's memory failed (page not present, torn update) */

/* Per CPython process: where _PyRuntime is and the version's offsets (bytes; RK_PY_NONE = absent). */
struct rk_py_target {
    __u64 runtime;          /* address of _PyRuntime */
    __u16 version;          /* 310, 311, 312 */
    __u16 interp_head;      /* _PyRuntimeState.interpreters.head */
    __u16 tstate_head;      /* PyInterpreterState.threads.head (3.10: tstate_head) */
    __u16 ts_next;          /* PyThreadState.next */
    __u16 ts_native_tid;    /* PyThreadState.native_thread_id (3.11+) */
    __u16 ts_thread_id;     /* PyThreadState.thread_id (pthread_t) */
    __u16 pthread_tid;      /* struct pthread.tid, for 3.10 */
    __u16 ts_frame;         /* PyThreadState.frame (3.10) / .cframe (3.11+) */
    __u16 cframe_current;   /* _PyCFrame.current_frame (3.11+), RK_PY_NONE for 3.10 */
    __u16 f_code;           /* frame -> code object */
    __u16 f_back;           /* frame -> caller frame */
    __u16 f_instr;          /* f_lasti (3.10, int, code units) / prev_instr (3.11+, pointer) */
    __u16 f_owner;          /* _PyInterpreterFrame.owner (3.12), RK_PY_NONE otherwise */
    __u16 code_adaptive;    /* PyCodeObject.co_code_adaptive (3.11+): prev_instr - (code + this) = offset */
    __u16 frame_size;       /* bytes of a frame read at once: past the last field above, at most 127 */
    __u16 pad;
};

/* One frame: the code object's address and the byte offset of the instruction being run in it. */
struct rk_py_frame {
    __u64 code;
    __s32 offset; /* bytes into co_code; negative: the frame has not started */
    __u32 flags;  /* RK_PY_FRAME_SHIM */
};

struct rk_py_stack {
    __u32 n;         /* frames filled, innermost first */
    __u16 status;    /* RK_PY_OK ... */
    __u16 truncated; /* 1: more frames than RK_PY_MAX_FRAMES */
    struct rk_py_frame frames[RK_PY_MAX_FRAMES];
};

BPF_HASH(py_targets, __u32, struct rk_py_target, RK_PY_MAX_TARGETS);

/* One frame's bytes, read with one helper call (separate reads of code, caller, instruction and owner
 * cost ~4x as much); 8 bytes of slack past the 127 a masked offset can reach. */
struct rk_py_scratch {
    __u8 buf[136];
};
BPF_PERCPU_ARRAY(py_scratch, struct rk_py_scratch, 1);

static __always_inline __u64 rk_py_ptr(__u64 addr) {
    __u64 v = 0;
    if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
        return 0;
    return v;
}

/* The PyThreadState of thread `tid`, or 0. */
static __always_inline __u64 rk_py_thread_state(struct rk_py_target *t, __u32 tid) {
    __u64 interp = rk_py_ptr(t->runtime + t->interp_head);
    if (!interp)
        return 0;
    __u64 ts = rk_py_ptr(interp + t->tstate_head);
    /* 3.11+ compare native_thread_id; 3.10 reads the tid from pthread_t (one more dereference). */
    __u64 id_at = t->ts_native_tid != RK_PY_NONE ? t->ts_native_tid : t->ts_thread_id;
    __u64 deref = t->ts_native_tid == RK_PY_NONE;
    __u64 found = 0;
#pragma clang loop unroll(disable)
    for (int i = 0; i < RK_PY_MAX_THREADS; i++) {
        if (!ts || found)
            break;
        __u64 where = ts + id_at;
        if (deref)
            where = rk_py_ptr(where) + t->pthread_tid;
        __u32 id = 0;
        bpf_probe_read_user(&id, sizeof(id), (void *)where);
        if (id == tid)
            found = ts;
        else
            ts = rk_py_ptr(ts + t->ts_next);
    }
    return found;
}

/* Fill `out` with the Python frames of thread `tid` of process `tgid`, innermost first. Returns the
 * number of frames (0 when the thread runs no Python code or the process is not a target). */
static __always_inline int rk_py_walk(__u32 tgid, __u32 tid, struct rk_py_stack *out) {
    out->n = 0;
    out->truncated = 0;
    struct rk_py_target *t = py_targets.lookup(&tgid);
    if (!t) {
        out->status = RK_PY_NO_TARGET;
        return 0;
    }
    __u64 ts = rk_py_thread_state(t, tid);
    if (!ts) {
        out->status = RK_PY_NO_THREAD;
        return 0;
    }
    out->status = RK_PY_OK;
    __u64 frame = rk_py_ptr(ts + t->ts_frame);
    if (frame && t->cframe_current != RK_PY_NONE)
        frame = rk_py_ptr(frame + t->cframe_current);
    int zero = 0;
    struct rk_py_scratch *s = py_scratch.lookup(&zero);
    if (!s)
        return 0;
    int interp_frames = t->version >= 311;
    int has_owner = t->f_owner != RK_PY_NONE;
    __u32 size = t->frame_size & 127, o_code = t->f_code & 127, o_back = t->f_back & 127;
    __u32 o_instr = t->f_instr & 127, o_owner = t->f_owner & 127;
    __u64 adaptive = t->code_adaptive;
    __u32 n = 0;
#pragma clang loop unroll(disable)
    for (int i = 0; i < RK_PY_MAX_FRAMES; i++) {
        if (!frame)
            break;
        if (bpf_probe_read_user(s->buf, size, (void *)frame) != 0) {
            out->status = RK_PY_READ_FAIL;
            frame = 0;
            break;
        }
        struct rk_py_frame *f = &out->frames[i];
        __u64 code = *(__u64 *)(s->buf + o_code);
        __s32 offset = -1;
        if (interp_frames) {
            __u64 instr = *(__u64 *)(s->buf + o_instr);
            if (instr && code)
                offset = (__s32)(instr - (code + adaptive));
        } else {
            __s32 lasti = *(__s32 *)(s->buf + o_instr);
            offset = lasti < 0 ? -1 : lasti * 2;
        }
        __u8 owner = has_owner ? s->buf[o_owner] : 0;
        f->code = code;
        f->offset = offset;
        f->flags = (owner == RK_PY_OWNER_CSTACK || !code) ? RK_PY_FRAME_SHIM : 0;
        n = i + 1;
        frame = *(__u64 *)(s->buf + o_back);
    }
    if (frame)
        out->truncated = 1;
    out->n = n;
    return n;
}

#endif
