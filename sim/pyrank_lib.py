"""The plumbing of sim/pyrank.py: its command line, the fake libraries through ctypes, the NCCL id exchange,
the data-loader wait and cpu_contention's neighbor process; pyrank.py keeps the step's phases and fault
injectors (the frames stacks should show). Standard library only, valid on CPython 3.10-3.12; imported by
plain name from pyrank.py's directory, never as part of the rankecho package."""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any, NoReturn, TextIO

FAULT_KINDS = ("host_compute", "dataloader_stall", "cpu_contention", "slow_gpu", "alloc_stall", "hang",
               "crash", "desync", "memcpy_stall")  # fmt: skip
ONCE = ("hang", "crash", "desync")
ALLOC_CACHE, MAX_FAULTS, MAX_SPLITS, MAX_FAULT_STEPS = 8, 16, 4, 64
BF16, SUM, H2D, D2H = 9, 0, 1, 2
PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1
M64 = (1 << 64) - 1


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


P, INT, SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
PP = ctypes.POINTER(ctypes.c_void_p)
API: dict[str, tuple[str, Any, list[Any]]] = {  # name -> (library, return type, argument types)
    "cudaSetDevice": ("cudart", INT, [INT]),
    "cudaStreamCreate": ("cudart", INT, [PP]),
    "cudaLaunchKernel": ("cudart", INT, [P, Dim3, Dim3, PP, SZ, P]),
    "cudaStreamSynchronize": ("cudart", INT, [P]),
    "cudaMalloc": ("cudart", INT, [PP, SZ]),
    "cudaFree": ("cudart", INT, [P]),
    "cudaMemcpy": ("cudart", INT, [P, P, SZ, INT]),
    "cudaMemcpyAsync": ("cudart", INT, [P, P, SZ, INT, P]),
    "cudaEventCreate": ("cudart", INT, [PP]),
    "cudaEventRecord": ("cudart", INT, [P, P]),
    "cudaEventElapsedTime": ("cudart", INT, [ctypes.POINTER(ctypes.c_float), P, P]),
    "__rankechosim_set_gpu_slowdown": ("cudart", None, [ctypes.c_double]),
    "ncclGetUniqueId": ("nccl", INT, [ctypes.POINTER(UniqueId)]),
    "ncclCommInitRank": ("nccl", INT, [PP, INT, UniqueId, INT]),
    "ncclCommSplit": ("nccl", INT, [P, INT, INT, PP, P]),
    "ncclCommDestroy": ("nccl", INT, [P]),
    "ncclAllReduce": ("nccl", INT, [P, P, SZ, INT, INT, P, P]),
}
KERNEL = ctypes.CFUNCTYPE(None)


def die(msg: str, code: int = 2) -> NoReturn:
    """Exit like simrank's die/check (2: bad usage, 3: a library call failed), its log flushed."""
    print(f"pyrank: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def check(rc: int, what: str) -> None:
    if rc != 0:
        die(f"{what} failed with code {rc}", 3)


def env_int(name: str, fallback: int) -> int:
    v = os.environ.get(name, "")
    return int(v) if v else fallback


def env_double(name: str, fallback: float) -> float:
    try:
        d = float(os.environ.get(name, ""))
    except ValueError:
        return fallback
    return d if d > 0 else fallback


def now_ns() -> int:
    return time.monotonic_ns()  # CLOCK_MONOTONIC, the simulator's clock


def spin_until(deadline_ns: int) -> None:
    while time.monotonic_ns() < deadline_ns:
        pass


class Fault:
    def __init__(self, spec: str) -> None:
        kind, ms, every, start, jitter, *schedule = spec.split(":")
        self.kind, self.ms, self.jitter = kind, float(ms), float(jitter)
        self.every, self.start = int(every), int(start)
        self.end = int(schedule[0]) if schedule else -1  # simrank_faults.c's schedule tail
        listed = schedule[1] if len(schedule) > 1 else "-"  # comm/bucket (more fields): the C rank's only
        self.steps = [int(s) for s in listed.split(",")] if listed != "-" else []
        if kind not in FAULT_KINDS or self.ms < 0 or self.every < 1 or self.start < 0 or self.jitter < 0:
            raise ValueError(spec)
        bad_steps = len(self.steps) > MAX_FAULT_STEPS or min([*self.steps, 0]) < 0
        if len(schedule) > 2 or self.end < -1 or bad_steps:
            raise ValueError(spec)

    def scheduled(self, step: int) -> bool:
        """simrank_faults.c's fault_scheduled: the listed steps, else start, start + every, ... up to end."""
        if self.steps:
            return step in self.steps
        if 0 <= self.end < step:
            return False
        return step >= self.start and (step - self.start) % self.every == 0

    def fires(self, step: int) -> bool:
        """A failure kind: true at its one step."""
        return self.kind in ONCE and step == self.start

    def ms_at(self, index: int, rank: int, step: int, seed: int) -> float:
        """simrank_faults.c's fault_ms_at: the same deterministic jitter."""
        if self.kind in ONCE:
            return self.ms if self.kind == "hang" and self.fires(step) else 0.0
        if not self.scheduled(step):
            return 0.0
        z = _mix(((seed << 40) ^ ((rank & 0xFFFFFFFF) << 24) ^ (index << 20) ^ (step & 0xFFFFFFFF)) & M64)
        u = (z >> 11) / float(1 << 53)
        ms = self.ms + self.jitter * (2.0 * u - 1.0)
        return ms if ms > 0 else 0.0


def _mix(z: int) -> int:
    """simrank_faults.c's mix (splitmix64's finaliser)."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def healthy_noise_us(seed: int, rank: int, step: int, which: int, max_us: float) -> float:
    """simrank_faults.c's healthy_noise_us: uniform in [0, max_us), from (seed, rank, step, which) only
    (which: 0 compute, 1 host, 2 loader)."""
    if max_us <= 0:
        return 0.0
    z = _mix(((seed << 40) ^ ((rank & 0xFFFFFFFF) << 24) ^ (step & 0xFFFFFFFF) ^ ((which + 1) << 56)) & M64)
    return max_us * ((z >> 11) / float(1 << 53))


def slow_gpu_extra(kernels: int, buckets: int, kernel_us: float, ms: float) -> float:
    """simrank_faults.c's slow_gpu_extra: the factor less 1 that makes the GPU reach the step's first world
    all-reduce ``ms`` late, against the GPU time of the kernels before it (the forward third and the backward
    ones up to bucket 0's gradients), so a fault's ``ms`` is the lateness it causes."""
    n_fwd = kernels // 3
    n_bwd = kernels - n_fwd
    return ms * 1000.0 / (kernel_us * (n_fwd + (n_bwd + buckets - 1) // buckets))


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pyrank", description="see sim/src/simrank.c's top comment")
    options = (("steps", int, 10), ("compute-us", float, 20000), ("host-us", float, 500),
               ("loader-us", float, 500), ("kernels", int, 20), ("allreduce-bytes", int, 16 << 20),
               ("buckets", int, 1), ("malloc-every", int, 50), ("seed", int, 1), ("dlopen-delay-ms", int, 0))
    for name, kind, default in options:
        ap.add_argument(f"--{name}", type=kind, default=default)
    ap.add_argument("--lib-dir", default=os.environ.get("SIMRANK_LIB_DIR") or None)
    ap.add_argument("--log")
    ap.add_argument("--split", action="append", default=[])
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--noise-us", default="0:0:0")
    c = ap.parse_args(argv)
    try:
        c.noise = [float(v) for v in c.noise_us.split(":")]
    except ValueError:
        c.noise = []
    if len(c.noise) != 3 or min(c.noise) < 0:
        die(f"bad --noise-us {c.noise_us} (want COMPUTE_US:HOST_US:LOADER_US, each >= 0)")
    c.rank, c.world = env_int("RANK", 0), env_int("WORLD_SIZE", 1)
    c.local_rank, c.node = env_int("LOCAL_RANK", 0), os.environ.get("RANKECHO_NODE_ID") or "node-0"
    c.master_addr, c.master_port = os.environ.get("MASTER_ADDR") or "127.0.0.1", env_int("MASTER_PORT", 29500)
    c.splits = []
    for s in c.split:
        name, group, strided, nbytes = s.split(":")
        if len(c.splits) == MAX_SPLITS or int(group) < 1 or c.world % int(group):
            die(f"bad --split {s} (want NAME:GROUP_SIZE:STRIDED:BYTES, GROUP_SIZE dividing WORLD_SIZE)")
        c.splits.append((name, int(group), int(strided), int(nbytes)))
    try:
        c.faults = [Fault(f) for f in c.fault]
    except ValueError as e:
        die(f"bad --fault {e} (want KIND:MS:EVERY:START_STEP:JITTER_MS[:END_STEP[:S1,S2,...]])")
    if len(c.faults) > MAX_FAULTS:
        die("too many --fault")
    if c.world < 1 or not 0 <= c.rank < c.world:
        die("RANK must be in [0, WORLD_SIZE)")
    if c.kernels < 3 or c.buckets < 1 or c.steps < 0:
        die("need --kernels >= 3, --buckets >= 1")
    return c


def load_api(c: argparse.Namespace) -> Any:
    """The libraries, as a linked simrank finds them (LD_LIBRARY_PATH) or, with --lib-dir, from there after
    --dlopen-delay-ms (a framework importing CUDA late)."""
    if c.lib_dir:
        time.sleep(c.dlopen_delay_ms / 1000.0)
    where = (c.lib_dir + "/") if c.lib_dir else ""
    libs = {"cudart": ctypes.CDLL(where + "libcudart.so.12", mode=ctypes.RTLD_GLOBAL)}
    libs["nccl"] = ctypes.CDLL(where + "libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
    api = argparse.Namespace()
    for name, (lib, restype, argtypes) in API.items():
        fn = getattr(libs[lib], name)
        fn.restype, fn.argtypes = restype, argtypes
        setattr(api, name, fn)
    return api


class Neighbor:
    """cpu_contention's "noisy-neighbor": a forked process that, on command, pins itself to the rank's CPU
    and spins there at SCHED_FIFO priority, so the rank is runnable but preempted."""

    def __init__(self) -> None:
        cmd_r, self.cmd = os.pipe()
        self.ack, ack_w = os.pipe()
        sys.stdout.flush()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.cmd)
            os.close(self.ack)
            self.serve(cmd_r, ack_w)
        os.close(cmd_r)
        os.close(ack_w)

    @staticmethod
    def serve(cmd: int, ack: int) -> NoReturn:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_NAME, b"noisy-neighbor", 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            print("pyrank: cpu_contention without CAP_SYS_NICE: the neighbor spins at normal priority, so "
                  "the rank is only partly preempted (run as root for the full effect)", file=sys.stderr)
        while len(msg := os.read(cmd, 16)) == 16:
            cpu, ms = struct.unpack("=i4xd", msg)
            os.sched_setaffinity(0, {cpu})
            deadline = now_ns() + int(ms * 1e6)
            os.write(ack, b"\1")
            spin_until(deadline)
        os._exit(0)

    def stop(self) -> None:
        os.close(self.cmd)
        os.close(self.ack)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


class Rank:
    """Everything a rank holds across steps (simrank.c's struct rank)."""

    def __init__(self, c: argparse.Namespace, out: TextIO) -> None:
        self.c, self.out = c, out
        self.neighbor = Neighbor() if any(f.kind == "cpu_contention" for f in c.faults) else None
        self.a = load_api(c)
        self.stream, self.step_event, self.coll_event, self.world = P(), P(), P(), P()
        self.subs: list[Any] = []
        self.cache = [P() for _ in range(ALLOC_CACHE)]
        self.occasional, self.batch = P(), P()
        self.host_batch = ctypes.create_string_buffer(1)
        self.kernels = {k: KERNEL(lambda: None) for k in ("fwd", "bwd", "opt")}
        self.pipe: tuple[int, int] | None = None

    def say(self, line: str, flush: bool = False) -> None:
        self.out.write(line + "\n")
        if flush:
            self.out.flush()

    def launch(self, kernel: str, us: float, host_us: float) -> None:
        """One kernel of `us` GPU microseconds, then the framework's own CPU work."""
        blocks = int(us * 1000.0 / env_double("RANKECHO_SIM_NS_PER_BLOCK", 1000.0))
        fn = ctypes.cast(self.kernels[kernel], P)
        check(self.a.cudaLaunchKernel(fn, Dim3(blocks or 1, 1, 1), Dim3(256, 1, 1), None, 0, self.stream),
              "cudaLaunchKernel")
        spin_until(now_ns() + int(host_us * 1000.0))


_PIPE: list[int] = []


def wait_off_cpu(ms: float) -> None:
    """Blocked in select() on a pipe nobody writes, like a loader waiting on an empty worker queue
    (microsecond timeouts, as simrank's ppoll; poll() would round each wait up to a millisecond)."""
    if not _PIPE:
        _PIPE.extend(os.pipe())
    deadline = now_ns() + int(ms * 1e6)
    while (left := deadline - now_ns()) > 0:
        select.select(_PIPE[:1], [], [], left / 1e9)


def exchange_id(r: Rank) -> UniqueId:
    """Rank 0 makes the NCCL id and serves it on MASTER_ADDR:MASTER_PORT (as torch's TCPStore would)."""
    c, uid = r.c, UniqueId()
    if c.rank == 0:
        check(r.a.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        if c.world == 1:
            return uid
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((c.master_addr, c.master_port))
            srv.listen(128)
        except OSError:
            die(f"cannot listen on MASTER_ADDR:MASTER_PORT ({c.master_addr}); pick a free MASTER_PORT")

        def serve() -> None:
            for _ in range(c.world - 1):
                conn, _addr = srv.accept()
                conn.sendall(bytes(uid))
                conn.close()
            srv.close()

        threading.Thread(target=serve, daemon=True).start()
        return uid
    deadline = now_ns() + 60 * 10**9
    while True:
        try:
            with socket.create_connection((c.master_addr, c.master_port)) as conn:
                got = b""
                while len(got) < 128 and (chunk := conn.recv(128 - len(got))):
                    got += chunk
                if len(got) == 128:
                    return UniqueId.from_buffer_copy(got)
        except OSError:
            pass
        if now_ns() > deadline:
            die(f"no unique id from rank 0 at MASTER_ADDR {c.master_addr} within 60 s")
        time.sleep(0.02)


def comm_hash(comm: Any) -> int:
    return int(ctypes.cast(comm, ctypes.POINTER(ctypes.c_uint64))[1])


def setup(r: Rank) -> None:
    c, a, ref = r.c, r.a, ctypes.byref
    check(a.cudaSetDevice(c.local_rank % 8), "cudaSetDevice")
    check(a.cudaStreamCreate(ref(r.stream)), "cudaStreamCreate")
    check(a.cudaEventCreate(ref(r.step_event)), "cudaEventCreate")
    check(a.cudaEventCreate(ref(r.coll_event)), "cudaEventCreate")
    uid = exchange_id(r)
    check(a.ncclCommInitRank(ref(r.world), c.world, uid, c.rank), "ncclCommInitRank")
    r.say(f"comm world {comm_hash(r.world):016x} {c.rank} {c.world}")
    for name, group, strided, _ in c.splits:
        color = c.rank % (c.world // group) if strided else c.rank // group
        sub = P()
        check(a.ncclCommSplit(r.world, color, c.rank, ref(sub), None), "ncclCommSplit")
        hdr = ctypes.cast((sub.value or 0) + 16, ctypes.POINTER(ctypes.c_int))
        r.say(f"comm {name} {comm_hash(sub):016x} {hdr[0]} {hdr[1]}")
        r.subs.append(sub)
    for block in r.cache:
        check(a.cudaMalloc(ref(block), 8 << 20), "cudaMalloc")
    check(a.cudaMalloc(ref(r.batch), 4 << 20), "cudaMalloc")
    r.out.flush()
