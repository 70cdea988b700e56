"""The heartbeat: what each quiet rank is doing now, so a hang can be explained while it lasts.

A rank that stops reaching collectives sends nothing else: its call in flight has not returned, and its
off-CPU interval is recorded only when it ends. So every ``--heartbeat-s`` the agent reads, for each rank
that has entered no collective for that long, what BPF holds right now for the thread that calls its
collectives: the traced call in flight and since when (``in_flight``, ``calls``), the off-CPU interval in
progress and whether it blocked or was preempted (``offstart``), and the stack it switched out with
(``off_stacks``), and where its last heartbeat went by cause class (the pre-call breakdown's
``rankecho.pre.*``, from the intervals the agent keeps for it). One ``rankecho.rank.state`` point per quiet
rank says it: Echo's
``fleet.cluster.find_hangs`` reads "rank 3: asleep off the CPU for 41 s in ppoll <- hang_rank <- run_step"
from it. A rank that enters a collective every step sends none: the cost is paid only while a rank is
quiet (a few points per heartbeat, never per step).

Usage::

    beat = Heartbeat(tracker, BpfThreads(bpf, stacks=True), quiet_ns=5_000_000_000)
    beat.beat(clock.now_mono())   # every --heartbeat-s
"""

from __future__ import annotations

import ctypes as ct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rankecho.agent.events import FN, STACK_SOURCE, SYMBOLS, StackRecord, decode
from rankecho.agent.procstate import Proc
from rankecho.agent.window import Interval, classify_offcpu
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue


@dataclass(frozen=True, slots=True)
class ThreadNow:
    """What one thread is doing at the moment BPF's maps were read (monotonic ns)."""

    call: FN | None = None
    call_since_ns: int | None = None
    offcpu_since_ns: int | None = None
    sleeping: bool = False
    stack: StackRecord | None = None
    """The stack it switched out with (only while off the CPU, only threads that call collectives)."""


class BpfThreads:
    """Reads a thread's current state from the agent's BPF maps (agent/bpf/agent.bpf.c)."""

    def __init__(self, bpf: Any, stacks: bool) -> None:
        self._bpf = bpf
        self._stacks = stacks

    @staticmethod
    def _get(table: Any, key: Any) -> Any:
        try:
            return table[key]
        except KeyError:
            return None

    def __call__(self, tid: int) -> ThreadNow:
        in_flight = self._get(self._bpf["in_flight"], ct.c_uint32(tid))
        call = since = None
        if in_flight is not None:
            calls = self._bpf["calls"]
            key = calls.Key()
            key.tid, key.fn = tid, int(in_flight.value)
            entry = self._get(calls, key)
            call = FN(int(in_flight.value)) if int(in_flight.value) in set(FN) else None
            since = int(entry.ts) if entry is not None else None
        off = self._get(self._bpf["offstart"], ct.c_uint32(tid))
        if off is None:
            return ThreadNow(call, since)
        stack = None
        if self._stacks:
            raw = self._get(self._bpf["off_stacks"], ct.c_uint32(tid))
            if raw is not None and int(raw.h.ts) == int(off.ts):  # the switch-out this interval began with
                rec = decode(ct.string_at(ct.addressof(raw), ct.sizeof(raw)))
                stack = rec if isinstance(rec, StackRecord) and rec.source == STACK_SOURCE.OFFCPU else None
        return ThreadNow(call, since, int(off.ts), bool(off.sleeping), stack)


class Heartbeat:
    """Sends one ``rankecho.rank.state`` point per rank quiet for at least ``quiet_ns``."""

    def __init__(self, tracker: Any, read: Callable[[int], ThreadNow], quiet_ns: int) -> None:
        self._tracker = tracker
        self._read = read
        self._quiet_ns = quiet_ns

    def beat(self, now_ns: int) -> int:
        """Read and send the state of every quiet rank; returns how many points went out."""
        sent = 0
        for proc in list(self._tracker.procs.values()):
            if proc.rank is None or not proc.caller_tid or proc.last_enter_ns is None:
                continue  # not a rank yet (no collective seen): nothing to be quiet about
            quiet = now_ns - proc.last_enter_ns
            if quiet < self._quiet_ns:
                continue
            self._send(proc, now_ns, quiet, self._read(proc.caller_tid))
            sent += 1
        return sent

    def _send(self, proc: Proc, now_ns: int, quiet_ns: int, now: ThreadNow) -> None:
        to_unix = self._tracker.clock.to_unix
        attrs: dict[str, AttrValue] = {}
        stack = self._tracker.ship_stack(proc, now.stack) if now.stack is not None else None
        # Where the last heartbeat went, by cause class (rankecho.pre.*): a rank waiting in a loop (poll
        # with a timeout) is off the CPU most of the time though its current interval is short.
        call = SYMBOLS[now.call] if now.call is not None else ""
        still_off = None
        if now.offcpu_since_ns is not None:
            category = classify_offcpu(now.sleeping, None if now.sleeping else "other", call)
            still_off = Interval(now.offcpu_since_ns, now_ns, category, 0, None, stack)
        window = self._tracker.windows.thread(proc.info.pid, proc.caller_tid)
        start = now_ns - min(quiet_ns, self._quiet_ns)
        attrs.update(window.peek(start, now_ns, still_off).attributes())
        if now.call is not None:
            attrs[c.STATE_CALL] = SYMBOLS[now.call]
            if now.call_since_ns is not None:
                attrs[c.STATE_CALL_SINCE_NS] = to_unix(now.call_since_ns)
        if now.offcpu_since_ns is not None:
            attrs[c.STATE_OFFCPU_SINCE_NS] = to_unix(now.offcpu_since_ns)
            attrs[c.STATE_SLEEPING] = now.sleeping
        if stack is not None:
            attrs[c.STACK_ID] = stack
        self._tracker.emit(proc, c.M_RANK_STATE, now_ns, round(quiet_ns / 1e9, 3), attrs, proc.caller_tid)
