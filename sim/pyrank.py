"""pyrank: the simulated training rank of sim/src/simrank.c, written in Python over the fake libraries.

The same training loop, command line, environment, log lines and faults as simrank (its top comment
describes them), calling libcudart/libnccl through ctypes as a PyTorch job reaches CUDA through its
extension modules, so the agent sees a CPython process whose stacks hold Python frames
(``pyrank.py:allocate_cache:NN``) above the native ones. The phases and fault injectors have simrank's
names (fetch_batch, forward, backward, optimizer_step, allocate_cache, ...). Standard library only, and
valid on CPython 3.10-3.12, because a scenario may run it under any of pyenv's interpreters::

    RANK=0 WORLD_SIZE=1 python3.10 sim/pyrank.py --steps 20 --log /tmp/rank0.log

sim/faultsites.py names the function (and the call in it) where each fault kind spends its time; the
plumbing (command line, ctypes bindings, id exchange, waits) is in pyrank_lib.py beside this file.
"""

from __future__ import annotations

import time

STARTED_NS = time.time_ns()  # simrank's "start": before the imports below load anything

import argparse  # noqa: E402
import ctypes  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from typing import NoReturn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # pyrank_lib, also when run by path
from pyrank_lib import (  # noqa: E402
    ALLOC_CACHE,
    BF16,
    D2H,
    H2D,
    PR_SET_PDEATHSIG,
    SUM,
    Fault,
    Rank,
    check,
    die,
    env_double,
    healthy_noise_us,
    now_ns,
    parse,
    setup,
    slow_gpu_extra,
    spin_until,
    wait_off_cpu,
)


class Plan:
    """What one step does, worked out before it starts (simrank.c's struct plan)."""

    def __init__(self, c: argparse.Namespace, step: int) -> None:
        self.step, self.n_fwd = step, c.kernels // 3
        self.n_bwd = c.kernels - self.n_fwd
        noise = [healthy_noise_us(c.seed, c.rank, step, which, c.noise[which]) for which in range(3)]
        self.kernel_us = (c.compute_us + noise[0]) / c.kernels
        self.host_per_kernel = (c.host_us + noise[1]) / c.kernels
        self.loader_us = c.loader_us + noise[2]
        self.bucket_count = c.allreduce_bytes // c.buckets // 2  # bf16 elements
        self.fired = [f.ms_at(i, c.rank, step, c.seed) for i, f in enumerate(c.faults)]
        fired = list(zip(c.faults, self.fired, strict=True))
        self.causes = ",".join(f"{f.kind}:{ms:.3f}" for f, ms in fired if ms > 0) or "-"
        self.desync = any(f.kind == "desync" and f.fires(step) for f in c.faults)
        self.slow = 1.0 + sum(slow_gpu_extra(c.kernels, c.buckets, self.kernel_us, ms) for f, ms in fired
                              if ms > 0 and f.kind == "slow_gpu")  # fmt: skip


# The step's phases and fault injectors: simrank.c's, with the same names (docs/sim.md).


def fetch_batch(r: Rank, p: Plan) -> None:
    wait_off_cpu(p.loader_us / 1000.0)
    for f, ms in zip(r.c.faults, p.fired, strict=True):
        if ms > 0 and f.kind == "dataloader_stall":
            stall_dataloader(ms)


def stall_dataloader(ms: float) -> None:
    wait_off_cpu(ms)


def allocate_cache(r: Rank, ms: float) -> None:
    """alloc_stall: free and re-allocate the block cache in slices whose mapping time adds up to `ms`."""
    per_ns = ms * 1e6 / ALLOC_CACHE - 20000
    size = int(per_ns * env_double("RANKECHO_SIM_MALLOC_GBPS", 10.0)) if per_ns > 0 else 512
    for block in r.cache:
        check(r.a.cudaFree(block), "cudaFree")
        check(r.a.cudaMalloc(ctypes.byref(block), size), "cudaMalloc")


def forward(r: Rank, p: Plan) -> int:
    """The batch's H2D copy, the forward kernels and the loss sync (loss.item()); returns the sync's ns."""
    check(r.a.cudaMemcpyAsync(r.batch, r.host_batch, 4 << 20, H2D, r.stream), "cudaMemcpyAsync")
    for _ in range(p.n_fwd):
        r.launch("fwd", p.kernel_us, p.host_per_kernel)
    fwd_sync = time.time_ns()
    check(r.a.cudaStreamSynchronize(r.stream), "cudaStreamSynchronize")
    return time.time_ns() - fwd_sync


def spin_host_compute(ms: float) -> None:
    spin_until(now_ns() + int(ms * 1e6))


def contend_cpu(r: Rank, ms: float) -> None:
    """cpu_contention: the neighbor takes this CPU for `ms` while the rank keeps doing host work."""
    if r.neighbor is None:
        return
    old, cpu = os.sched_getaffinity(0), ctypes.CDLL(None).sched_getcpu()
    os.sched_setaffinity(0, {cpu})
    deadline = now_ns() + int(ms * 1e6)
    os.write(r.neighbor.cmd, struct.pack("=i4xd", cpu, ms))
    if os.read(r.neighbor.ack, 1):
        spin_until(deadline)
    os.sched_setaffinity(0, old)


def stall_memcpy(r: Rank, ms: float) -> None:
    """memcpy_stall: one blocking device-to-host copy sized so the fake PCIe rate makes it last `ms`."""
    ns = ms * 1e6 - 2000
    size = int(ns * env_double("RANKECHO_SIM_PCIE_GBPS", 25.0)) if ns > 0 else 1
    check(r.a.cudaMemcpy(r.host_batch, r.batch, size, D2H), "cudaMemcpy")


def log_failure(r: Rank, f: Fault, step: int) -> None:
    r.say(f"fault {f.kind} {step} {f.ms:g}", flush=True)


def hang_rank(r: Rank, f: Fault, step: int) -> None:
    log_failure(r, f, step)
    if f.ms > 0:
        wait_off_cpu(f.ms)
        return
    while True:
        wait_off_cpu(1000.0)


def crash_rank(r: Rank, f: Fault, step: int) -> NoReturn:
    log_failure(r, f, step)
    os._exit(int(f.ms))  # no atexit handlers, no goodbye to the hub: a crash


def before_collective(r: Rank, p: Plan) -> None:
    for f, ms in zip(r.c.faults, p.fired, strict=True):
        if f.fires(p.step) and f.kind == "hang":
            hang_rank(r, f, p.step)
        if f.fires(p.step) and f.kind == "crash":
            crash_rank(r, f, p.step)
        if ms > 0 and f.kind == "host_compute":
            spin_host_compute(ms)
        if ms > 0 and f.kind == "cpu_contention":
            contend_cpu(r, ms)
        if ms > 0 and f.kind == "memcpy_stall":
            stall_memcpy(r, ms)


def desync_rank(r: Rank, p: Plan) -> None:
    for f in r.c.faults:
        if f.kind == "desync" and f.fires(p.step):
            log_failure(r, f, p.step)
    count, buf = p.bucket_count * 2, r.batch
    check(r.a.ncclAllReduce(buf, buf, count, BF16, SUM, r.world, r.stream), "ncclAllReduce")


def backward(r: Rank, p: Plan) -> int:
    """Backward kernels interleaved with the bucketed all-reduces, then one per split communicator;
    returns when the first all-reduce was called."""
    c, a, enter, b = r.c, r.a, 0, 0
    for k in range(p.n_bwd):
        r.launch("bwd", p.kernel_us, p.host_per_kernel)
        while b < (k + 1) * c.buckets // p.n_bwd:  # bucket b's gradients are ready
            if b == 0:
                before_collective(r, p)
                check(a.cudaEventRecord(r.coll_event, r.stream), "cudaEventRecord")
                enter = time.time_ns()  # after the record (it takes the stream's lock): next is the call
            if b == 0 and p.desync:
                desync_rank(r, p)
            else:
                buf, n = r.batch, p.bucket_count
                check(a.ncclAllReduce(buf, buf, n, BF16, SUM, r.world, r.stream), "ncclAllReduce")
            b += 1
    for sub, (_, _, _, nbytes) in zip(r.subs, c.splits, strict=True):
        check(a.ncclAllReduce(r.batch, r.batch, nbytes // 2, BF16, SUM, sub, r.stream), "ncclAllReduce")
    return enter


def optimizer_step(r: Rank) -> int:
    """The optimizer kernel and the step's final stream sync; returns when that sync began."""
    r.a.__rankechosim_set_gpu_slowdown(1.0)
    r.launch("opt", 1.0, 0.0)
    sync_start = time.time_ns()
    check(r.a.cudaStreamSynchronize(r.stream), "cudaStreamSynchronize")
    return sync_start


def run_step(r: Rank, step: int) -> None:
    c, a, p = r.c, r.a, Plan(r.c, step)
    start = time.time_ns()
    check(a.cudaEventRecord(r.step_event, r.stream), "cudaEventRecord")  # the GPU is idle: now
    fetch_batch(r, p)
    loaded = time.time_ns()
    for f, ms in zip(c.faults, p.fired, strict=True):
        if ms > 0 and f.kind == "alloc_stall":
            allocate_cache(r, ms)
    if c.malloc_every > 0 and step % c.malloc_every == 0:
        check(a.cudaFree(r.occasional), "cudaFree")
        check(a.cudaMalloc(ctypes.byref(r.occasional), 16 << 20), "cudaMalloc")
    allocated = time.time_ns()
    a.__rankechosim_set_gpu_slowdown(p.slow)  # slow_gpu: the forward's loss sync waits longer
    fwd_sync = forward(r, p)
    enter = backward(r, p)
    sync_start = optimizer_step(r)
    end = time.time_ns()
    gpu_ms = ctypes.c_float()
    check(a.cudaEventElapsedTime(ctypes.byref(gpu_ms), r.step_event, r.coll_event), "cudaEventElapsedTime")
    gpu = start + int(gpu_ms.value * 1e6)
    r.say(f"step {step} {start} {enter} {end} {end - sync_start} {loaded - start} {allocated - loaded} "
          f"{fwd_sync} {gpu} {p.causes}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    if os.environ.get("SIMRANK_DIE_WITH_PARENT"):  # the launcher's death must not leave ranks behind
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:
            sys.exit(4)
    c = parse(sys.argv[1:] if argv is None else argv)
    try:
        out = open(c.log, "w") if c.log else sys.stdout  # noqa: SIM115 (the rank's stdout, as simrank's freopen)
    except OSError:
        die(f"cannot write log {c.log}")
    r = Rank(c, out)
    r.say(f"rank {c.rank} world {c.world} local {c.local_rank} node {c.node} pid {os.getpid()} "
          f"tid {threading.get_native_id()} start {STARTED_NS}")  # fmt: skip
    setup(r)
    for step in range(c.steps):
        run_step(r, step)
    for sub in reversed(r.subs):
        check(r.a.ncclCommDestroy(sub), "ncclCommDestroy")
    check(r.a.ncclCommDestroy(r.world), "ncclCommDestroy")
    if r.neighbor is not None:
        r.neighbor.stop()
    r.say(f"done {time.time_ns()}", flush=True)


if __name__ == "__main__":
    main()
