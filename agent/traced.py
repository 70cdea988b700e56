"""The one list of traced library functions; the BPF program and the decoder are generated from it.

Each member of :class:`FN` is one traced function: its id in ring-buffer records, library, symbol, how
the BPF side handles it, the C expressions stored in the record's four argument slots, and its group.
``enum rk_fn`` and the ``CALL()``/``INIT()`` probe lines of ``agent/bpf/agent.bpf.c`` are generated
from it (:func:`c_enum`, :func:`c_probes`, inlined by ``rankecho.agent.probes.program_text``), and so are the
Python views (``agent.events.SYMBOLS``, ``COLLECTIVES``..., ``agent.probes.PROBES``). Adding an NCCL or
CUDA call is one member here, plus what the tracker makes of it. Kept free of bcc.

Handler kinds: ``call`` (entry + return record), ``init`` (communicator creation: the unique id or
handle array is copied into a 128-byte payload), ``count`` (entry only, hand-written in agent.bpf.c as
``enter_<symbol>``; no record per call). Argument expressions (C): ``ARGn`` the n-th register argument,
``STACK(n)`` the n-th stack slot above the return address, ``I32``/``PACK`` as defined in agent.bpf.c.
Collectives: a0 = comm, a1 = stream, a2 = element count, a3 = PACK(datatype, op, root/peer).
Communicator creation: a0 = comm out-pointer (or parent comm), a1 = nranks / ndev / color, a2 = rank /
key, a3 = out-pointer, replaced by the new handle at return. CUDA runtime: a1 = stream, a2 = bytes,
a3 = memcpy kind.
"""

from __future__ import annotations

from enum import IntEnum

NO_ARGS = ("0", "0", "0", "0")


class FN(IntEnum):
    """Traced functions; the value is the ``fn`` field of a record (``enum rk_fn`` in the program)."""

    lib: str
    symbol: str
    handler: str
    args: tuple[str, str, str, str]
    group: str

    def __new__(
        cls, value: int, lib: str = "", symbol: str = "", handler: str = "", args: tuple[str, ...] = NO_ARGS,
        group: str = "",
    ) -> FN:  # fmt: skip
        obj = int.__new__(cls, value)
        obj._value_ = value
        obj.lib, obj.symbol, obj.handler, obj.group = lib, symbol, handler, group
        obj.args = (args[0], args[1], args[2], args[3])
        return obj

    NONE = 0
    COMM_INIT_RANK = 1, "nccl", "ncclCommInitRank", "init", ("ARG1", "I32(ARG2)", "I32(ARG3)", "ARG1")
    COMM_INIT_RANK_CONFIG = (
        2, "nccl", "ncclCommInitRankConfig", "init", ("ARG1", "I32(ARG2)", "I32(ARG3)", "ARG1")
    )
    COMM_INIT_ALL = 3, "nccl", "ncclCommInitAll", "init", ("ARG1", "I32(ARG2)", "0", "0")
    COMM_SPLIT = 4, "nccl", "ncclCommSplit", "init", ("ARG1", "I32(ARG2)", "I32(ARG3)", "ARG4")
    COMM_DESTROY = 5, "nccl", "ncclCommDestroy", "call", ("ARG1", "0", "0", "0")
    COMM_ABORT = 6, "nccl", "ncclCommAbort", "call", ("ARG1", "0", "0", "0")
    ALL_REDUCE = (
        10, "nccl", "ncclAllReduce", "call", ("ARG6", "STACK(1)", "ARG3", "PACK(ARG4, ARG5, 0)"), "collective"
    )
    ALL_GATHER = (
        11, "nccl", "ncclAllGather", "call", ("ARG5", "ARG6", "ARG3", "PACK(ARG4, 0, 0)"), "collective"
    )
    REDUCE_SCATTER = (
        12, "nccl", "ncclReduceScatter", "call", ("ARG6", "STACK(1)", "ARG3", "PACK(ARG4, ARG5, 0)"),
        "collective",
    )
    BROADCAST = (
        13, "nccl", "ncclBroadcast", "call", ("ARG6", "STACK(1)", "ARG3", "PACK(ARG4, 0, ARG5)"), "collective"
    )
    BCAST = 14, "nccl", "ncclBcast", "call", ("ARG5", "ARG6", "ARG2", "PACK(ARG3, 0, ARG4)"), "collective"
    REDUCE = (
        15, "nccl", "ncclReduce", "call", ("STACK(1)", "STACK(2)", "ARG3", "PACK(ARG4, ARG5, ARG6)"),
        "collective",
    )
    SEND = 16, "nccl", "ncclSend", "call", ("ARG5", "ARG6", "ARG2", "PACK(ARG3, 0, ARG4)"), "p2p"
    RECV = 17, "nccl", "ncclRecv", "call", ("ARG5", "ARG6", "ARG2", "PACK(ARG3, 0, ARG4)"), "p2p"
    GROUP_START = 18, "nccl", "ncclGroupStart", "call"
    GROUP_END = 19, "nccl", "ncclGroupEnd", "call"
    STREAM_SYNC = 30, "cuda", "cudaStreamSynchronize", "call", ("0", "ARG1", "0", "0"), "sync"
    DEVICE_SYNC = 31, "cuda", "cudaDeviceSynchronize", "call", NO_ARGS, "sync"
    EVENT_SYNC = 32, "cuda", "cudaEventSynchronize", "call", ("ARG1", "0", "0", "0"), "sync"
    MALLOC = 33, "cuda", "cudaMalloc", "call", ("0", "0", "ARG2", "0")
    FREE = 34, "cuda", "cudaFree", "call", ("ARG1", "0", "0", "0")
    MEMCPY = 35, "cuda", "cudaMemcpy", "call", ("0", "0", "ARG3", "ARG4")
    MEMCPY_ASYNC = 36, "cuda", "cudaMemcpyAsync", "call", ("0", "ARG5", "ARG3", "ARG4")
    LAUNCH_KERNEL = 37, "cuda", "cudaLaunchKernel", "count"


TRACED: tuple[FN, ...] = tuple(f for f in FN if f.symbol)
"""Every traced function, in id order."""

HANDLERS = ("call", "init", "count")


def group(name: str) -> frozenset[FN]:
    return frozenset(f for f in TRACED if f.group == name)


def c_enum() -> str:
    """``enum rk_fn`` for the BPF program."""
    lines = [f"    FN_{f.name} = {f.value}," for f in FN]
    return "enum rk_fn {\n" + "\n".join(lines) + "\n};\n"


STACK_ALWAYS = ("collective", "p2p")
"""Groups whose every call ships the stack taken at its entry (where a late rank entered from)."""
STACK_IF_LONG: frozenset[FN] = frozenset({FN.MALLOC, FN.FREE, FN.MEMCPY, FN.MEMCPY_ASYNC})
"""Besides the syncs: calls that can be long, whose entry stack ships only when they were."""


def stack_policy(fn: FN) -> int:
    """2: the entry stack always ships; 1: only when the call was long; 0: no stack (never per launch)."""
    if fn.group in STACK_ALWAYS:
        return 2
    if fn.group == "sync" or fn in STACK_IF_LONG:
        return 1
    return 0


def c_stack_policy() -> str:
    """``stack_policy(fn)`` for the BPF program (:func:`stack_policy` as a switch)."""
    cases = [f"    case FN_{f.name}: return {stack_policy(f)};" for f in TRACED if stack_policy(f)]
    return ("static __always_inline int stack_policy(u16 fn)\n{\n    switch (fn) {\n" + "\n".join(cases)
            + "\n    }\n    return 0;\n}\n")


def c_probes() -> str:
    """One ``CALL(symbol, FN_X, a0, a1, a2, a3)`` or ``INIT(...)`` line per recorded function."""
    lines = []
    for f in TRACED:
        if f.handler not in HANDLERS:
            raise ValueError(f"FN.{f.name}: handler {f.handler!r} is not one of {HANDLERS}")
        if f.handler != "count":
            lines.append(f"{f.handler.upper()}({f.symbol}, FN_{f.name}, {', '.join(f.args)})")
    return "\n".join(lines) + "\n"
