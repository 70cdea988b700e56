"""User stacks on the node: symbolise the raw addresses BPF captured, name each stack by its content,
ship each distinct stack once.

A stack record (:class:`~rankecho.agent.events.StackRecord`) holds instruction pointers, innermost
first, and for a stack taken at a function's entry the return address found at SP. The frame-pointer
walk skips the immediate caller of a function that does not begin with ``push %rbp`` (shrink-wrapped
prologues, frameless leaves: ``cudaFree <- main`` without ``run_step``), so that address is inserted
as the second frame when the walk did not already yield it (docs/agent.md, "Call stacks").

Frames are function names (GCC clone suffixes such as ``.constprop.0`` dropped, ``[unknown]`` where no
symbol covers the address); the id is :func:`rankecho.shared.stacks.stack_id` of the frames, so equal
stacks have equal ids on every node and across agent restarts, unlike kernel stack-map ids (hash
buckets a later stack can take over). Echo dedupes by id, so a stack shipped twice (after the bounded
seen-set forgot it) is harmless.

Symbols come from bcc's symbol caches (:mod:`rankecho.agent.symbols`, in a helper process); each
distinct address of a process incarnation is looked up once, each distinct raw stack symbolised once.

Usage::

    symbols = SymbolClient()
    keeper = StackKeeper(symbols.resolve, symbols.forget)
    info = keeper.stack(record, start_ticks)     # StackInfo(id, frames, truncated, new)
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rankecho.agent.events import STACK_DEPTH, StackRecord
from rankecho.shared.stacks import stack_id

UNKNOWN = "[unknown]"
CLONE_SUFFIX = re.compile(r"(?:\.(?:constprop|isra|part|cold|lto_priv|localalias)(?:\.\d+)?)+$")
"""GCC's names for clones of one function (``run_step.constprop.0``, ``f.part.1.isra.0``, ``f.cold``)."""
SEEN_MAX = 65_536
"""Stack ids remembered as shipped; past this the set starts over (a reshipped stack is harmless)."""
CACHE_MAX = 16_384
"""Symbolised stacks (raw addresses -> frames) and symbols kept, per kind, before starting over."""

Resolve = Callable[[int, int, list[int]], "list[str | None] | None"]
"""(pid, start ticks, addresses) -> function names, None where no symbol covers an address; None
instead of the list when the lookup itself failed (then nothing is cached)."""


def normalise(name: str) -> str:
    """A function name without GCC's clone suffixes."""
    return CLONE_SUFFIX.sub("", name) or name


def addresses(rec: StackRecord) -> list[int]:
    """The stack's return addresses with the entry's immediate caller inserted where the walk skipped it."""
    ips = list(rec.ips)
    if rec.ret and ips and (len(ips) < 2 or ips[1] != rec.ret):
        ips.insert(1, rec.ret)
    return ips


def truncated(rec: StackRecord) -> bool:
    """The walk stopped early: one frame deep (the code has no frame pointers to follow) or at the cap."""
    return len(rec.ips) <= 1 or len(rec.ips) >= STACK_DEPTH


def cut_at_unknown(frames: list[str]) -> tuple[list[str], bool]:
    """The frames up to the first caller no symbol covers, and whether any were cut. Past code without
    frame pointers the walk follows whatever %rbp held: an unnamed "caller" is most likely garbage and
    everything outside it untrustworthy, so the stack is reported truncated there rather than wrong.
    (An unnamed innermost frame, e.g. the vDSO, is kept: the IP itself is real.)"""
    for i in range(1, len(frames)):
        if frames[i] == UNKNOWN:
            return frames[:i], True
    return frames, False


def python_frames(pid: int, tid: int, rec: StackRecord, native: list[str]) -> list[str]:
    """Where a CPython thread's Python frames join its native ones (agent/pyframes.py's ``frames_for``
    supplies them). Until that lands the native frames are returned unchanged; when it does, this is the
    one place that merges them (innermost first, Python frames outside the native frames that ran
    inside the interpreter). ``rec`` says when and where the stack was taken (``rec.ts``, ``rec.source``:
    a call's entry, a switch-out, a sample), to match the Python frames captured at the same moment;
    :meth:`StackKeeper.stack` caches by raw native addresses, so its key must then take in the Python
    frames too."""
    return native


@dataclass(frozen=True, slots=True)
class StackInfo:
    id: str
    frames: tuple[str, ...]
    truncated: bool
    new: bool
    """Not shipped before by this agent (the caller sends the ``rankecho.stack`` point)."""


class StackKeeper:
    """Symbolised stacks by raw content, and the bounded set of stack ids already shipped."""

    def __init__(self, resolve: Resolve, release: Callable[[int], None] = lambda pid: None,
                 python: Callable[[int, int, StackRecord, list[str]], list[str]] = python_frames) -> None:
        """``resolve`` names an address; ``release(pid)`` frees what it holds for an exited process."""
        self._resolve = resolve
        self._release = release
        self._python = python
        self._frames: OrderedDict[tuple[int, int, tuple[int, ...]], tuple[str, bool]] = OrderedDict()
        self._names: dict[tuple[int, int, int], str] = {}
        self._seen: set[str] = set()

    def _names_of(self, pid: int, start: int, addrs: list[int]) -> list[str] | None:
        missing = sorted({a for a in addrs if (pid, start, a) not in self._names})
        if missing:
            found = self._resolve(pid, start, missing)
            if found is None:
                return None
            if len(self._names) + len(missing) > CACHE_MAX:
                self._names.clear()
            for addr, name in zip(missing, found, strict=True):
                self._names[(pid, start, addr)] = normalise(name) if name else UNKNOWN
        return [self._names.get((pid, start, a), UNKNOWN) for a in addrs]

    def frames(self, rec: StackRecord, start: int) -> tuple[list[str], bool] | None:
        """The record's native frames, innermost first, and whether the walk was cut short; None when
        the symbols could not be looked up."""
        # Return addresses point after their call: look up the call itself (addr - 1), which a call as
        # a function's last instruction would otherwise attribute to the next function.
        lookups = [a if i == 0 else a - 1 for i, a in enumerate(addresses(rec))]
        names = self._names_of(rec.pid, start, lookups)
        return None if names is None else (names, truncated(rec))

    def stack(self, rec: StackRecord, start: int) -> StackInfo | None:
        """The record's stack, named; None when its symbols could not be looked up (the helper failed):
        no id is better than an id for frames that are wrong."""
        key = (rec.pid, start, (*rec.ips, rec.ret))
        hit = self._frames.get(key)
        if hit is None:
            named = self.frames(rec, start)
            if named is None:
                return None
            native, short = named
            native, cut = cut_at_unknown(native)
            cut = cut or short
            merged = self._python(rec.pid, rec.tid, rec, native)
            hit = ("\n".join(merged), cut)
            if len(self._frames) >= CACHE_MAX:
                self._frames.popitem(last=False)
            self._frames[key] = hit
        frames = tuple(hit[0].split("\n"))
        sid = stack_id(frames)
        new = sid not in self._seen
        if new:
            if len(self._seen) >= SEEN_MAX:
                self._seen.clear()
            self._seen.add(sid)
        return StackInfo(sid, frames, hit[1], new)

    def forget(self, pid: int) -> None:
        """A process exited: its symbolised stacks and symbols go (a reused pid has other maps)."""
        for key in [k for k in self._frames if k[0] == pid]:
            del self._frames[key]
        for name in [k for k in self._names if k[0] == pid]:
            del self._names[name]
        self._release(pid)
