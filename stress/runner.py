"""Run a stress plan: P producer threads, each sending its block of the stream in batches, resending
every unacknowledged batch until Echo acknowledges it or the retry policy gives up.

A batch counts as acknowledged only when Echo answered its Export RPC with OK, which Echo does after
the batch's rows are committed. ``--ack-log`` appends one JSON line per acknowledged batch
(``{"node", "first", "count", "rejected"}``, stream indices) so a test can check that every acknowledged event
survived a crash.

Usage::

    result = run(StressConfig(plan, Target("127.0.0.1:4317", token="t")))
    print(result.to_json())
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from rankecho.shared.retry import RetryPolicy, retry_delay
from rankecho.stress import encode
from rankecho.stress.planting import StressEvent, StressPlan
from rankecho.stress.senders import Outcome, Sender, Target, make_sender

SEND_TIMEOUT_S = 10.0
PREBUILD_LIMIT = 2_000_000
"""Most events the raw client encodes before sending (~80 bytes each in memory)."""


@dataclass(frozen=True)
class StressConfig:
    plan: StressPlan
    target: Target
    client: str = "raw"
    batch: int = 2000
    rate: float | None = None
    """Events per second over all producers; None sends as fast as Echo acknowledges."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    ack_log: Path | None = None
    progress: IO[str] | None = None
    """Where progress lines go (stderr in the CLI); None is silent."""
    duration_s: float | None = None
    """Stop starting new batches after this long (the benchmark's time-bounded runs)."""


@dataclass(frozen=True)
class StressResult:
    """What happened: ``sent`` events offered, ``acked`` stored per Echo, ``failed`` given up,
    ``rejected`` refused for good by Echo (partial success), ``retries`` resends."""

    sent: int
    acked: int
    failed: int
    rejected: int
    retries: int
    elapsed_s: float
    eps: float
    producers: int
    client: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)


class _Tally:
    """Counters shared by the producer threads, plus the ack log, behind one lock."""

    def __init__(self, ack_log: IO[str] | None) -> None:
        self.lock = threading.Lock()
        self.sent = self.acked = self.failed = self.rejected = self.retries = 0
        self.errors: list[str] = []
        self.last_retry = ""
        self._ack_log = ack_log

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def retrying(self, outcome: Outcome) -> None:
        with self.lock:
            self.retries += 1
            code = outcome.code.name if outcome.code else "transient"
            self.last_retry = f"{code}: {outcome.message}"[:200]

    def acknowledged(self, node: str, first: int, count: int, rejected: int) -> None:
        with self.lock:
            self.acked += count - rejected
            self.rejected += rejected
            if self._ack_log is not None:
                self._ack_log.write(
                    json.dumps({"node": node, "first": first, "count": count, "rejected": rejected}) + "\n"
                )
                self._ack_log.flush()

    def error(self, message: str) -> None:
        with self.lock:
            if len(self.errors) < 20:
                self.errors.append(message)


@dataclass(frozen=True)
class Batch:
    """One Export RPC's worth of a producer's block: stream indices ``first .. first+count-1``, with
    the request prebuilt (raw client) or None (encoded when sent)."""

    producer: int
    first: int
    count: int
    payload: object | None = None

    def events(self, plan: StressPlan) -> list[StressEvent]:
        return [plan.event(i) for i in range(self.first, self.first + self.count)]


def batch_size(cfg: StressConfig) -> int:
    """``cfg.batch``, capped under ``--rate`` so each producer sends >= ~10 batches/s (smooth pacing)."""
    size = max(1, cfg.batch)
    if cfg.rate:
        size = max(1, min(size, int(cfg.rate / cfg.plan.producers / 10)))
    return size


def producer_batches(plan: StressPlan, producer: int, size: int, prebuild: bool) -> list[Batch]:
    """One producer's batches in send order, with raw requests encoded when ``prebuild``."""
    block = plan.producer_range(producer)
    firsts = range(block.start, block.stop, size)
    batches = [Batch(producer, first, min(size, block.stop - first)) for first in firsts]
    if not prebuild:
        return batches
    return [
        Batch(producer, b.first, b.count, encode.raw_request(plan, producer, b.events(plan))) for b in batches
    ]


def prepare(
    cfg: StressConfig, workers: int = 1, prebuild_limit: int | None = PREBUILD_LIMIT
) -> list[list[Batch]]:
    """Every producer's batches. Raw requests are encoded here, before any clock starts (up to
    ``prebuild_limit`` events in all; beyond it each batch is encoded just before it is sent), and may
    be reused by several runs (each into a fresh store). ``workers`` > 1 encodes in forked processes."""
    prebuild = cfg.client == "raw" and (prebuild_limit is None or cfg.plan.total <= prebuild_limit)
    args = [(cfg.plan, p, batch_size(cfg), prebuild) for p in range(cfg.plan.producers)]
    if workers <= 1 or not prebuild:
        return [producer_batches(*a) for a in args]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(producer_batches, *zip(*args, strict=True)))


def deliver(
    sender: Sender,
    payload: object,
    policy: RetryPolicy,
    stop: threading.Event,
    on_retry: Callable[[Outcome], None],
) -> Outcome:
    """Send until acknowledged, or until ``retry_delay`` gives up or ``stop`` is set."""
    started = time.monotonic()
    attempt = 0
    while True:
        outcome = sender.send(payload, SEND_TIMEOUT_S)
        if outcome.ok:
            return outcome
        attempt += 1
        delay = retry_delay(policy, outcome.code, attempt, time.monotonic() - started, outcome.server_delay_s)
        if delay is None or stop.is_set():
            return outcome
        on_retry(outcome)
        if stop.wait(delay):
            return outcome


@dataclass
class _Run:
    """State the producer threads share for one run."""

    cfg: StressConfig
    tally: _Tally
    start: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    """Set on Ctrl-C: abandon retries and unsent batches."""
    t0: float = 0.0

    def expired(self) -> bool:
        return self.cfg.duration_s is not None and time.monotonic() - self.t0 >= self.cfg.duration_s

    def produce(self, producer: int, batches: Sequence[Batch], sender: Sender) -> None:
        cfg, tally = self.cfg, self.tally
        per_producer_rate = cfg.rate / cfg.plan.producers if cfg.rate else None
        node = cfg.plan.producer_node(producer)
        self.start.wait()
        sent_here = 0
        for batch in batches:
            if self.stop.is_set() or self.expired():
                break
            if per_producer_rate:
                due = self.t0 + sent_here / per_producer_rate
                if (wait := due - time.monotonic()) > 0 and self.stop.wait(wait):
                    break
            payload = batch.payload
            if payload is None:
                payload = sender.encode(cfg.plan, producer, batch.events(cfg.plan))
            tally.add(sent=batch.count)
            sent_here += batch.count
            outcome = deliver(sender, payload, cfg.retry, self.stop, tally.retrying)
            if outcome.ok:
                tally.acknowledged(node, batch.first, batch.count, outcome.rejected)
                if outcome.rejected:
                    tally.error(f"{node}: Echo rejected {outcome.rejected} points: {outcome.message}")
            else:
                tally.add(failed=batch.count)
                code = outcome.code.name if outcome.code else "unknown"
                tally.error(f"{node}: batch at {batch.first} failed ({code}): {outcome.message}")

    def report_progress(self, done: threading.Event) -> None:
        out = self.cfg.progress
        while out is not None and not done.wait(1.0):
            elapsed = time.monotonic() - self.t0
            with self.tally.lock:
                acked, failed, retries = self.tally.acked, self.tally.failed, self.tally.retries
                last = f" (last: {self.tally.last_retry})" if retries else ""
            print(
                f"stress: {acked}/{self.cfg.plan.total} acked, {failed} failed, {retries} retries{last}, "
                f"{acked / max(elapsed, 1e-9):,.0f} eps",
                file=out,
                flush=True,
            )


def run(cfg: StressConfig, work: list[list[Batch]] | None = None) -> StressResult:
    """Send the plan (or ``work`` from :func:`prepare`) and return the tally. The clock starts after
    encoding, when every producer thread is ready."""
    work = prepare(cfg) if work is None else work
    senders = [make_sender(cfg.client, cfg.target) for _ in range(cfg.plan.producers)]
    ack_file = cfg.ack_log.open("a") if cfg.ack_log else None
    state, done = _Run(cfg, _Tally(ack_file)), threading.Event()
    threads = [
        threading.Thread(
            target=state.produce, args=(p, work[p], senders[p]), name=f"producer-{p}", daemon=True
        )
        for p in range(cfg.plan.producers)
    ]
    for t in threads:
        t.start()
    reporter = threading.Thread(target=state.report_progress, args=(done,), daemon=True)
    state.t0 = time.monotonic()
    state.start.set()
    reporter.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        state.stop.set()
        for t in threads:
            t.join()
    elapsed = time.monotonic() - state.t0
    done.set()
    for sender in senders:
        sender.close()
    if ack_file:
        ack_file.close()
    tally = state.tally
    if cfg.progress is not None:
        for message in tally.errors:
            print(f"stress: {message}", file=cfg.progress)
    return StressResult(
        sent=tally.sent,
        acked=tally.acked,
        failed=tally.failed,
        rejected=tally.rejected,
        retries=tally.retries,
        elapsed_s=round(elapsed, 3),
        eps=round(tally.acked / elapsed, 1) if elapsed > 0 else 0.0,
        producers=cfg.plan.producers,
        client=cfg.client,
    )
