"""``rankecho stress --shape agent``: a fleet's agents on the job's clock, without the fleet.

The points come from :mod:`rankecho.stress.shape` (the agent's own tracker and encoder); this module
decides *when* they go out and counts what Echo acknowledged. Every ``flush`` of job time (0.5 s, the
agent's flush interval) each node sends one request, as its agent would. By default the job keeps real
time: a window's requests go out once the wall clock has reached the window's end, and ``lag_s`` says how
long after that the last window was acknowledged (a store that keeps up stays near 0; one that does not
falls further behind with every window). ``--speed max`` does not wait: windows go out as fast as Echo
acknowledges them, with timestamps as if the steps took ``--step-ms`` (the job ends about now).

Sending is :func:`rankecho.stress.runner.deliver` through :class:`rankecho.stress.senders.RawSender` (the
agent's client, :class:`rankecho.shared.transport.MetricsClient`, gzip on as the agent has it), from a
sender thread per node (up to 128) fed by a bounded queue, so a slow Echo slows the generator instead of
piling requests up in memory. Usage::

    result = run_fleet(FleetConfig(shape, Target("127.0.0.1:4317", token="t"), steps=100))
    print(result.to_json())
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import IO

from rankecho.shared.retry import RetryPolicy
from rankecho.shared.transport import Target
from rankecho.stress.runner import deliver
from rankecho.stress.senders import RawSender
from rankecho.stress.shape import AgentShape, NodeModel, plant

MAX_SENDERS = 128
WINDOW_NS = 1_000_000_000
"""How often the agent reads the launch counters."""


@dataclass(frozen=True)
class FleetConfig:
    shape: AgentShape
    target: Target
    steps: int
    speed: str = "real"
    senders: int | None = None
    """Requests in flight at once; default one per node up to ``MAX_SENDERS`` (each agent sends its
    requests one after another, so a fleet of N nodes has up to N in flight)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    progress: IO[str] | None = None
    prebuild: bool = False
    """Encode every request before the clock starts (the benchmark's capacity probes)."""


@dataclass(frozen=True)
class FleetResult:
    """``acked`` points stored per Echo; ``lag_s`` how long after its window ended the last window was
    acknowledged (real time: how far the store fell behind the job), ``lag_max_s`` the worst window;
    ``gen_s`` the seconds spent making and encoding points (within ``elapsed_s`` unless prebuilt)."""

    shape: str
    speed: str
    ranks: int
    nodes: int
    steps: int
    step_ms: float
    sent: int
    acked: int
    failed: int
    rejected: int
    retries: int
    requests: int
    elapsed_s: float
    gen_s: float
    eps: float
    lag_s: float
    lag_max_s: float
    events_per_rank_step: float
    planted: list[int]
    planted_steps: dict[str, list[int]]

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass(frozen=True)
class _Request:
    body: bytes
    points: int
    due_ns: int
    """Wall-clock Unix ns at which the window it covers ended (real time) or was generated (max)."""


class _Senders:
    """Sender threads draining a bounded queue; counts and lag behind one lock."""

    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        n = cfg.senders or min(cfg.shape.nodes, MAX_SENDERS)
        self.queue: queue.Queue[_Request | None] = queue.Queue(maxsize=2 * n)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.acked = self.failed = self.rejected = self.retries = self.requests = 0
        self.last_due = 0
        self.lag_s = self.lag_max_s = 0.0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, name=f"fleet-sender-{i}", daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def _retrying(self, _outcome: object) -> None:
        with self.lock:
            self.retries += 1

    def _run(self) -> None:
        client = RawSender(self.cfg.target)
        try:
            while (req := self.queue.get()) is not None:
                out = deliver(client, req.body, self.cfg.retry, self.stop, self._retrying)
                lag = (time.time_ns() - req.due_ns) / 1e9
                with self.lock:
                    self.requests += 1
                    if not out.ok:
                        self.failed += req.points
                        if len(self.errors) < 10:
                            self.errors.append(f"{out.code}: {out.message}"[:200])
                        continue
                    self.acked += req.points - out.rejected
                    self.rejected += out.rejected
                    self.lag_max_s = max(self.lag_max_s, lag)
                    if req.due_ns >= self.last_due:
                        self.last_due, self.lag_s = req.due_ns, lag
        finally:
            client.close()

    def close(self) -> None:
        for _ in self.threads:
            self.queue.put(None)
        for t in self.threads:
            t.join()


def job_length_ns(shape: AgentShape, steps: int) -> int:
    return sum(shape.step_ns + shape.stall_ns(k) for k in range(steps))


@dataclass
class _Window:
    """One flush of every node: the job time its window ends at and each node's request."""

    end_ns: int
    requests: list[tuple[bytes, int]]
    steps_done: int


def windows(shape: AgentShape, steps: int, clock: list[int]) -> Iterator[_Window]:
    """Every window of the job, generated lazily; ``clock[0]`` accumulates the ns spent generating."""
    nodes = [NodeModel(shape, n) for n in range(shape.nodes)]
    t = shape.start_ns
    flush_due, window_due = t + shape.flush_ns, t + WINDOW_NS
    for k in range(steps):
        g0 = time.perf_counter_ns()
        for node in nodes:
            node.step(k, t)
        t += shape.step_ns + shape.stall_ns(k)
        if t >= window_due:
            window_due += WINDOW_NS
            for node in nodes:
                node.window(t)
        last = k == steps - 1
        if t >= flush_due or last:
            while flush_due <= t:
                flush_due += shape.flush_ns
            if last:
                for node in nodes:
                    node.finish(t)
            requests = [node.flush() for node in nodes]
            clock[0] += time.perf_counter_ns() - g0
            yield _Window(t, requests, k + 1)
        else:
            clock[0] += time.perf_counter_ns() - g0


def run_fleet(cfg: FleetConfig) -> FleetResult:
    """Generate ``cfg.steps`` steps of every rank and send them, window by window (with ``prebuild``
    all windows are generated before the clock starts, so the generator's CPU is out of the measured
    run; the timestamps then lie that long in the past)."""
    shape = cfg.shape
    gen = [0]
    source: Iterable[_Window] = windows(shape, cfg.steps, gen)
    if cfg.prebuild:
        source = list(source)
    senders = _Senders(cfg)
    real = cfg.speed == "real"
    offset = time.time_ns() - shape.start_ns  # job ns -> wall ns (0 when the job starts now)
    t0 = time.monotonic()
    sent = 0
    try:
        for w in source:
            if real and (wait := (w.end_ns + offset - time.time_ns()) / 1e9) > 0:
                time.sleep(wait)
            due = w.end_ns + offset if real else time.time_ns()
            for body, points in w.requests:
                sent += points
                senders.queue.put(_Request(body, points, due))
            if cfg.progress is not None:
                print(f"stress: step {w.steps_done}/{cfg.steps}, {senders.acked:,} acked, "
                      f"lag {senders.lag_s:.2f} s", file=cfg.progress, flush=True)
    except KeyboardInterrupt:
        senders.stop.set()
    finally:
        senders.close()
    elapsed = time.monotonic() - t0
    if cfg.progress is not None:
        for message in senders.errors:
            print(f"stress: {message}", file=cfg.progress)
    return FleetResult(
        shape="agent", speed=cfg.speed, ranks=shape.ranks, nodes=shape.nodes, steps=cfg.steps,
        step_ms=shape.step_ns / 1e6, sent=sent, acked=senders.acked, failed=senders.failed,
        rejected=senders.rejected, retries=senders.retries, requests=senders.requests,
        elapsed_s=round(elapsed, 3), gen_s=round(gen[0] / 1e9, 3),
        eps=round(senders.acked / elapsed, 1) if elapsed > 0 else 0.0,
        lag_s=round(senders.lag_s, 3), lag_max_s=round(senders.lag_max_s, 3),
        events_per_rank_step=round(sent / (shape.ranks * cfg.steps), 2),
        planted=shape.planted_ranks(),
        planted_steps={str(p.rank): [k for k in range(cfg.steps) if p.late(k)] for p in shape.planted},
    )


def handle(args: argparse.Namespace, token: str | None, tls: bool) -> int:
    """``rankecho stress --shape agent ...``: validate, run, print the result as the last line."""
    step_ns = int(args.step_ms * 1e6)
    duration = args.duration if args.duration is not None else 60.0
    steps = int(duration * 1e9 // max(1, step_ns))
    if args.ranks < 1 or steps < 1:
        print(f"rankecho stress: --shape agent needs --ranks >= 1 and --duration >= --step-ms "
              f"(got --ranks {args.ranks}, --duration {duration:g} s, --step-ms {args.step_ms:g})",
              file=sys.stderr)
        return 2
    try:
        shape = AgentShape(args.cluster_id, args.node_id, args.ranks, step_ns, start_ns=0,
                           ranks_per_node=args.ranks_per_node, run_id=args.run_id,
                           planted=plant(args.ranks, args.stragglers, step_ns), gpus=args.gpus)
    except ValueError as err:
        print(f"rankecho stress: {err}", file=sys.stderr)
        return 2
    now = time.time_ns()
    start = now if args.speed == "real" else now - job_length_ns(shape, steps)
    shape = dataclasses.replace(shape, start_ns=args.start_ns if args.start_ns is not None else start)
    target = Target(args.endpoint, token, not tls, args.ca_file, args.cert_file, args.key_file, gzip=True)
    cfg = FleetConfig(shape, target, steps, args.speed, retry=RetryPolicy(deadline_s=args.retry_deadline),
                      progress=None if args.quiet else sys.stderr, prebuild=args.prebuild)
    result = run_fleet(cfg)
    print(result.to_json(), flush=True)
    return 0 if result.failed == 0 and result.rejected == 0 else 1
