"""Which synthetic events a stress run produces: exact, deterministic, and countable in advance.

One invocation of ``rankecho stress`` is one *stream* of ``producers * events_per_producer`` events,
numbered ``0 .. total-1``. Producer ``p`` (node id ``<node>-<p>``, or ``<node>`` when there is one
producer) owns the contiguous block ``p*E .. (p+1)*E - 1``. With stream index ``i``:

- a **causal-chain marker** when ``i % chain_every == 0``; every marker has its own chain id,
  ``<cluster>/<node>/<run>:<i // chain_every>``, so markers are never merged;
- a **straggler** (health < 0.4) when ``i % straggler_every == 0 and i > 0``: the stream's first
  event opens the healthy baseline that a straggler is slow against, so it is never one;
- every other event is healthy (health in [0.55, 1.0)).

So 1,000 events give 40 chains and 9 stragglers, and the fan-in proof (two clusters, 4 producers x
250 events each, 8 producers in all) gives 2,000 events, 80 chains and 18 stragglers.

Usage::

    plan = StressPlan("demo-cluster", "node-a100", producers=1, events_per_producer=1000)
    assert plan.straggler_count() == 9 and plan.chain_count() == 40
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from rankecho.shared import contract

STRAGGLER_THRESHOLD = 0.4
"""Planted stragglers score below this, healthy events never do (queries use ``value_double < 0.40``)."""
_GOLDEN = 0.6180339887498949


class StressEvent(NamedTuple):
    """One planted event: everything a sender needs, nothing about transport (a tuple: the raw
    client builds millions of them)."""

    position: int
    """Position in the stream, 0-based."""
    producer: int
    node_id: str
    event_id: str
    timestamp_ns: int
    health: float
    chain_id: str | None
    straggler: bool


@dataclass(frozen=True)
class StressPlan:
    """The parameters that fully determine a stream (same plan -> same events, same ids)."""

    cluster_id: str
    node_id: str
    producers: int = 1
    events_per_producer: int = 250
    chain_every: int = 25
    straggler_every: int = 100
    run_id: str = "r0"
    """Part of every event id: rerunning a plan with the same run id resends the same events."""
    start_ns: int = 1_700_000_000_000_000_000
    step_ns: int = 1_000_000
    """Time between a producer's consecutive events."""

    def __post_init__(self) -> None:
        for name in ("producers", "events_per_producer", "chain_every", "straggler_every", "step_ns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.cluster_id or not self.node_id:
            raise ValueError("cluster_id and node_id must be non-empty")

    @property
    def _phase(self) -> float:
        """A per-stream offset so different nodes' health values differ (stable: crc32 of the names)."""
        return zlib.crc32(f"{self.cluster_id}/{self.node_id}".encode()) / 2**32

    @property
    def total(self) -> int:
        return self.producers * self.events_per_producer

    def producer_node(self, producer: int) -> str:
        """``<node>`` for a single producer, else ``<node>-<p>`` (p = 0 .. producers-1)."""
        return self.node_id if self.producers == 1 else f"{self.node_id}-{producer}"

    def node_ids(self) -> list[str]:
        return [self.producer_node(p) for p in range(self.producers)]

    def is_chain(self, index: int) -> bool:
        return index % self.chain_every == 0

    def is_straggler(self, index: int) -> bool:
        return index > 0 and index % self.straggler_every == 0

    def event(self, index: int) -> StressEvent:
        """The ``index``-th event of the stream (pure: no clock, no randomness)."""
        producer, local = divmod(index, self.events_per_producer)
        node = self.producer_node(producer)
        frac = (index * _GOLDEN + self._phase) % 1.0
        straggler = self.is_straggler(index)
        health = 0.10 + 0.25 * frac if straggler else 0.55 + 0.45 * frac
        chain = (
            contract.causal_chain_id(
                f"{self.cluster_id}/{self.node_id}/{self.run_id}", index // self.chain_every
            )
            if self.is_chain(index)
            else None
        )
        return StressEvent(
            position=index,
            producer=producer,
            node_id=node,
            event_id=f"{self.cluster_id}/{node}/{self.run_id}/{index}",
            timestamp_ns=self.start_ns + local * self.step_ns,
            health=health,
            chain_id=chain,
            straggler=straggler,
        )

    def producer_range(self, producer: int) -> range:
        start = producer * self.events_per_producer
        return range(start, start + self.events_per_producer)

    def chain_count(self) -> int:
        """Distinct causal_chain_id values the stream carries."""
        return sum(1 for i in range(self.total) if self.is_chain(i))

    def straggler_count(self) -> int:
        return sum(1 for i in range(self.total) if self.is_straggler(i))

    def stragglers_per_node(self) -> dict[str, int]:
        """Straggler rows each producer node must end up with (nodes without any are absent)."""
        counts = Counter(
            self.producer_node(i // self.events_per_producer)
            for i in range(self.total)
            if self.is_straggler(i)
        )
        return dict(counts)
