"""Synthetic agent events for a training job whose truth is known exactly, written straight into a store.

The process simulator (``rankecho sim``) is the realistic test: real processes, real probes, real
scheduling noise. This is its complement for what needs exact answers or sheer volume: unit tests of
clock calibration and sequence realignment (offsets and shifts known to the nanosecond) and the
analysis benchmark's 10M-event stores. The events have the agent's attribute layout (see
``sim/synthetic.sql``) and are staged into the analysis tables with the writer's own statements.

Usage::

    job = SyntheticJob(nodes=(SynNode("a", 4), SynNode("b", 4, offset_ms=40)), steps=200,
                       faults=(SynFault(rank=5, ms=60, every=14, start_step=7),))
    write_job(con, job)          # con: a migrated store (events, collectives, host_activity)
    job.late_steps(5)            # [7, 21, ...]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from rankecho.echo.queries import parse_named
from rankecho.echo.store.staging import store_events

STATEMENTS = parse_named((Path(__file__).resolve().parent / "synthetic.sql").read_text(encoding="utf-8"))
EVENTS_PER_RANK_STEP = 16
"""With two buckets: 3 collectives, 2 syncs, a copy, 8 off-CPU intervals, a launch count, a health score."""


@dataclass(frozen=True)
class SynNode:
    node_id: str
    ranks: int
    offset_ms: float = 0.0
    """Added to every timestamp this node's agent reports (its clock is this far ahead)."""
    attach_step: int = 0
    """The node's agent sees the job from this step on."""
    unaligned: bool = False
    """The agent attached after the communicators were made: its ids and sequences are its own."""
    restart_step: int | None = None
    """The node's agent is restarted at this step: from then on its ids and sequences are its own."""

    @property
    def unaligned_from(self) -> int | None:
        return self.attach_step if self.unaligned else self.restart_step


@dataclass(frozen=True)
class SynFault:
    rank: int
    ms: float
    every: int = 1
    start_step: int = 0
    kind: str = "host"
    """'host': the rank calls ``ms`` late (in cudaMalloc); 'gpu': its GPU runs ``ms`` long, its host on time
    but for the longer sync before the call (a third of ``ms``); 'link': the step's collectives transfer
    ``ms`` longer for every rank, all of them on time (a slow link)."""

    def fires_at(self, step: int) -> bool:
        return step >= self.start_step and (step - self.start_step) % self.every == 0


@dataclass(frozen=True)
class SyntheticJob:
    nodes: tuple[SynNode, ...]
    steps: int = 100
    step_ms: float = 45.0
    buckets: int = 2
    tp_size: int = 4
    faults: tuple[SynFault, ...] = ()
    cluster_id: str = "synthetic"
    seed: int = 1
    t0_ns: int = 1_790_000_000_000_000_000
    step_jitter_ms: float = 2.0
    """Each step lasts up to this much longer than step_ms (uniform), the same on every rank."""
    job_id: str | None = None
    """Stamped as rankecho.job.id (and into the event ids) when set; None: no job id, as older agents."""

    @property
    def world(self) -> int:
        return sum(n.ranks for n in self.nodes)

    def rank_nodes(self) -> list[tuple[int, SynNode]]:
        out, rank = [], 0
        for node in self.nodes:
            for _ in range(node.ranks):
                out.append((rank, node))
                rank += 1
        return out

    def late_steps(self, rank: int) -> list[int]:
        """Steps at which ``rank`` stalls (before the first all-reduce)."""
        return [s for s in range(self.steps) if any(f.rank == rank and f.fires_at(s) for f in self.faults)]


def write_job(con: duckdb.DuckDBPyConnection, job: SyntheticJob) -> int:
    """Insert the job's events into ``events`` and stage them into the analysis tables; returns the
    number of events written. ``con`` must be a writable, migrated store."""
    if bad := [f.kind for f in job.faults if f.kind not in ("host", "gpu", "link")]:
        raise ValueError(f"fault kind {bad[0]!r}: use 'host' or 'gpu', or 'link' for a slow transfer")
    if job.world % job.tp_size:
        raise ValueError(f"tp_size {job.tp_size} does not divide the world size {job.world}")
    ranks = pa.table(
        {
            "rank": [r for r, _ in job.rank_nodes()],
            "node_id": [n.node_id for _, n in job.rank_nodes()],
            "offset_ns": [round(n.offset_ms * 1e6) for _, n in job.rank_nodes()],
            "pid": [10_000 + r for r, _ in job.rank_nodes()],
            "attach_step": [n.attach_step for _, n in job.rank_nodes()],
            "unaligned_from": pa.array([n.unaligned_from for _, n in job.rank_nodes()], pa.int64()),
        }
    )
    faults = pa.table(
        {
            "rank": pa.array([f.rank for f in job.faults], pa.int64()),
            "ms": pa.array([f.ms for f in job.faults], pa.float64()),
            "every": pa.array([f.every for f in job.faults], pa.int64()),
            "start_step": pa.array([f.start_step for f in job.faults], pa.int64()),
            "kind": pa.array([f.kind for f in job.faults], pa.string()),
        }
    )
    generate = STATEMENTS["synthetic_events"]
    con.register("syn_ranks", ranks)
    con.register("syn_faults", faults)
    try:
        con.execute(
            generate.sql,
            generate.bind(
                steps=job.steps,
                step_ns=round(job.step_ms * 1e6),
                t0=job.t0_ns,
                buckets=job.buckets,
                tp_size=job.tp_size,
                seed=job.seed,
                cluster=job.cluster_id,
                jitter_ns=max(1, round(job.step_jitter_ms * 1e6)),
            ),
        ).fetchall()
    finally:
        con.unregister("syn_ranks")
        con.unregister("syn_faults")
    if job.job_id is not None:
        stamp = STATEMENTS["stamp_synthetic_job"]
        con.execute(stamp.sql, stamp.bind(job=job.job_id)).fetchall()
    store_events(con, "syn_events")
    written = con.execute("SELECT count(*) FROM syn_events").fetchall()[0][0]
    con.execute("DROP TABLE syn_events")
    return int(written)
