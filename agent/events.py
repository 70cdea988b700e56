"""Decoding of the BPF ring-buffer records (layouts in agent/bpf/agent.h) into plain dataclasses.

The traced functions (``FN``) and their groups come from the table in :mod:`rankecho.agent.traced`.

Kept free of bcc so the tracker and its tests run anywhere. Usage::

    record = decode(raw_bytes)   # CallRecord | InitRecord | OffCpuRecord | ExitRecord | StackRecord
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from rankecho.agent.pyframes import MAX_FRAMES as PY_MAX_FRAMES
from rankecho.agent.traced import FN, group


class KIND(IntEnum):
    CALL = 1
    COMM_INIT = 2
    OFFCPU = 3
    EXIT = 4
    STACK = 5


class STACK_SOURCE(IntEnum):
    """Where a stack record was taken (``enum rk_stack_source``)."""

    CALL = 1
    OFFCPU = 2
    SAMPLE = 3


SYMBOLS: dict[FN, str] = {f: f.symbol for f in FN}
COLLECTIVES = group("collective")
P2P = group("p2p")
SYNCS = group("sync")

HEADER = struct.Struct("<QQQQQQIIHHIQ")
"""struct rk_event: ts, ts2, a0, a1, a2, a3, pid, tid, kind, fn, extra, launches (72 bytes)."""
PAYLOAD_SIZE = 128
INIT_SIZE = HEADER.size + PAYLOAD_SIZE
STACK_DEPTH = 64
"""RK_STACK_DEPTH: the deepest user stack a record holds."""
PY_STACK_SIZE = 8 + 16 * PY_MAX_FRAMES
"""struct rk_py_stack (agent/bpf/pyframes.h), at the end of a stack record."""
SCAN_KEEP = 8
"""RK_SCAN_KEEP: return addresses kept from the scan above SP."""
STACK_SIZE = HEADER.size + 8 * STACK_DEPTH + 8 * SCAN_KEEP + PY_STACK_SIZE


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One traced call. ``ts``/``ts2`` are BPF monotonic ns at entry and return."""

    pid: int
    tid: int
    fn: FN
    ts: int
    ts2: int
    a0: int
    a1: int
    a2: int
    a3: int
    rc: int
    launches: int = 0
    """The thread's cumulative cudaLaunchKernel count when the call was entered."""


@dataclass(frozen=True, slots=True)
class InitRecord:
    """Communicator creation; ``payload`` is the ncclUniqueId (or InitAll's handle array)."""

    call: CallRecord
    payload: bytes


@dataclass(frozen=True, slots=True)
class OffCpuRecord:
    pid: int
    tid: int
    ts_out: int
    ts_in: int
    ts_wake: int  # 0 when preempted (never blocked)
    sleeping: bool
    call: FN
    preempted_by: int = 0
    """Who held the CPU (tid): for a preempted thread the one that took it, for a woken one the one it
    waited behind in the run queue (0: the CPU was idle, or the thread is still blocked)."""


@dataclass(frozen=True, slots=True)
class ExitRecord:
    pid: int
    ts: int
    status: int | None = None
    """The status the process gave exit_group; None when it died another way (a signal)."""


@dataclass(frozen=True, slots=True)
class StackRecord:
    """A thread's user stack (raw instruction pointers, innermost first). It precedes the record it
    belongs to: the call (``ts`` = its entry) or off-CPU interval (``ts`` = switch-out) of the same tid;
    a sample stands alone."""

    pid: int
    tid: int
    ts: int
    source: STACK_SOURCE
    call: FN
    ips: tuple[int, ...]
    ret: int = 0
    """The return address at SP when taken at a function's entry, else 0."""
    scanned: tuple[int, ...] = ()
    """Off-CPU and sampled stacks: the return addresses found above the user SP, in stack order
    (innermost first), the walk's own among them (agent/stacks.py inserts the others)."""
    py: bytes = b""
    """The thread's Python frames as BPF read them (``struct rk_py_stack``; agent/pyframes.py names them)."""


Record = CallRecord | InitRecord | OffCpuRecord | ExitRecord | StackRecord


def _fn(value: int) -> FN:
    try:
        return FN(value)
    except ValueError:
        return FN.NONE


def decode(raw: bytes) -> Record:
    """Decode one ring-buffer record; raises ValueError on a truncated or unknown record."""
    if len(raw) < HEADER.size:
        raise ValueError(f"record of {len(raw)} bytes is shorter than the {HEADER.size}-byte header")
    ts, ts2, a0, a1, a2, a3, pid, tid, kind, fn, extra, launches = HEADER.unpack_from(raw)
    if kind == KIND.CALL:
        rc = extra - (1 << 32) if extra >= 1 << 31 else extra
        return CallRecord(pid, tid, _fn(fn), ts, ts2, a0, a1, a2, a3, rc, launches)
    if kind == KIND.COMM_INIT:
        if len(raw) < INIT_SIZE:
            raise ValueError(f"comm-init record of {len(raw)} bytes, expected {INIT_SIZE}")
        rc = extra - (1 << 32) if extra >= 1 << 31 else extra
        call = CallRecord(pid, tid, _fn(fn), ts, ts2, a0, a1, a2, a3, rc)
        return InitRecord(call, bytes(raw[HEADER.size : INIT_SIZE]))
    if kind == KIND.OFFCPU:
        return OffCpuRecord(pid, tid, ts, ts2, a0, bool(extra), _fn(fn), a1)
    if kind == KIND.EXIT:
        return ExitRecord(pid, ts, a1 if a0 else None)
    if kind == KIND.STACK:
        if len(raw) < STACK_SIZE:
            raise ValueError(f"stack record of {len(raw)} bytes, expected {STACK_SIZE}")
        n = min(a0, STACK_DEPTH)
        ips = struct.unpack_from(f"<{n}Q", raw, HEADER.size)
        py = bytes(raw[STACK_SIZE - PY_STACK_SIZE : STACK_SIZE])
        scan_at = HEADER.size + 8 * STACK_DEPTH
        scanned = tuple(a for a in struct.unpack_from(f"<{SCAN_KEEP}Q", raw, scan_at) if a)
        return StackRecord(pid, tid, ts, STACK_SOURCE(extra), _fn(fn), ips, a1, scanned, py)
    raise ValueError(f"unknown record kind {kind}")


def unpack_collective(a3: int) -> tuple[int, int, int]:
    """(datatype, op, root-or-peer) from the packed a3 slot of a collective record."""
    return a3 & 0xFF, (a3 >> 8) & 0xFF, (a3 >> 16) & 0xFFFFFFFF
