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

from rankecho.agent import pyframe_cache
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
    """The stack's return addresses with the callers the frame-pointer walk skipped put back: the entry's
    immediate caller (``ret``), and each return address found above SP (``scanned``, stack order) that
    is not one of the walk's own, before the walk frame it precedes on the stack."""
    ips = list(rec.ips)
    if rec.ret and ips and (len(ips) < 2 or ips[1] != rec.ret):
        ips.insert(1, rec.ret)
    if not rec.scanned or not ips:
        return ips
    out, j = ips[:1], 1  # ips[j]: the next walk frame the scan has not reached yet
    for addr in rec.scanned:
        if addr in ips[j:]:
            k = ips.index(addr, j)
            out += ips[j : k + 1]
            j = k + 1
        elif j < len(ips):  # a caller between out[-1] and ips[j]: the walk skipped it
            out.append(addr)
    return out + ips[j:]


def python_cut(rec: StackRecord) -> bool:
    """The Python walk had more frames than it keeps (``rk_py_stack.truncated``, bytes 6-7)."""
    return len(rec.py) >= 8 and int.from_bytes(rec.py[6:8], "little") != 0


def truncated(rec: StackRecord) -> bool:
    """The walk stopped early: one frame deep (the code has no frame pointers to follow) or at the cap,
    or the Python walk did."""
    return len(rec.ips) <= 1 or len(rec.ips) >= STACK_DEPTH or python_cut(rec)


INTERPRETER = re.compile(r"^(?:ffi_|_ctypes|_?Py|_PyEval|cfunction_|method_vectorcall|\[unknown\])")
"""Native frames of the interpreter and its C-call machinery (libffi, _ctypes): where the program's own
native frames end and its Python frames take over."""


def merge_python(native: list[str], python: list[str]) -> list[str]:
    """Innermost first: the native frames the program's code ran (down to the first interpreter frame;
    the innermost one always), then its Python frames. Without Python frames, the native ones as they
    are: an interpreter walk that found nothing must not cut a C program's stack."""
    if not python:
        return native
    cut = next((i for i, name in enumerate(native) if i > 0 and INTERPRETER.match(name)), len(native))
    return native[:cut] + python


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
    """A CPython thread's Python frames (read by BPF with the native walk, named by agent/pyframe_cache.py)
    joined to its native ones."""
    return merge_python(native, pyframe_cache.python_frames(pid, rec.py) if rec.py else [])


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
        self._frames: OrderedDict[tuple[int, int, tuple[int, ...], bytes], tuple[str, bool]] = OrderedDict()
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
        addrs = addresses(rec)
        lookups = [a if i == 0 else a - 1 for i, a in enumerate(addrs)]
        names = self._names_of(rec.pid, start, lookups)
        if names is None:
            return None
        # A word the scan above SP found but the walk did not is a guess (a stale return address left in
        # a frame's locals passes the call-instruction check too): unnamed, it adds nothing, and as an
        # [unknown] "caller" it would cut the walk's own frames after it (cut_at_unknown).
        walked = {*rec.ips, rec.ret}
        kept = [n for i, (a, n) in enumerate(zip(addrs, names, strict=True))
                if i == 0 or n != UNKNOWN or a in walked]
        return kept, truncated(rec)

    def stack(self, rec: StackRecord, start: int) -> StackInfo | None:
        """The record's stack, named; None when its symbols could not be looked up (the helper failed):
        no id is better than an id for frames that are wrong."""
        key = (rec.pid, start, (*rec.ips, rec.ret, *rec.scanned), rec.py)  # one native path, many Python ones
        hit = self._frames.get(key)
        if hit is None:
            named = self.frames(rec, start)
            if named is None:
                return None
            native, short = named
            native, cut = cut_at_unknown(native)
            merged = self._python(rec.pid, rec.tid, rec, native)
            # Python frames past the native ones: the native part ends at the interpreter by design, so
            # the stack is cut short only where the Python walk was (or the native walk hit its cap).
            cut = python_cut(rec) or len(rec.ips) >= STACK_DEPTH if merged != native else cut or short
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
        pyframe_cache.forget(pid)
        self._release(pid)
