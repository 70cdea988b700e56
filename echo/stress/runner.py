"""Run a stress plan: P producer threads, each sending its block of the stream in batches, resending
every unacknowledged batch until Echo acknowledges it or the retry policy gives up.

A batch counts as acknowledged only when Echo answered its Export RPC with OK, which Echo does after
the batch's rows are committed. ``--ack-log`` appends one JSON line per acknowledged batch
(``{"node", "first", "count"}``, stream indices) so a test can check that every acknowledged event
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

from echo.stress.planting import StressEvent, StressPlan
from echo.stress.retry import RetryPolicy, retry_delay
from echo.stress.senders import Outcome, Sender, Target, make_sender

SEND_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StressConfig:
    plan: StressPlan
    target: Target
    client: str = "raw"
    batch: int = 500
    rate: float | None = None
    """Events per second over all producers; None sends as fast as Echo acknowledges."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    ack_log: Path | None = None
    progress: IO[str] | None = None
    """Where progress lines go (stderr in the CLI); None is silent."""


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
        self._ack_log = ack_log

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def acknowledged(self, node: str, first: int, count: int, rejected: int) -> None:
        with self.lock:
            self.acked += count - rejected
            self.rejected += rejected
            if self._ack_log is not None:
                self._ack_log.write(json.dumps({"node": node, "first": first, "count": count}) + "\n")
                self._ack_log.flush()

    def error(self, message: str) -> None:
        with self.lock:
            if len(self.errors) < 20:
                self.errors.append(message)


def batches(plan: StressPlan, producer: int, size: int) -> list[list[StressEvent]]:
    """The producer's events in send order, ``size`` per batch (the last one may be shorter)."""
    indices = plan.producer_range(producer)
    return [[plan.event(i) for i in indices[k : k + size]] for k in range(0, len(indices), size)]


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


def _producer(
    cfg: StressConfig,
    producer: int,
    work: Sequence[tuple[list[StressEvent], object | None]],
    sender: Sender,
    tally: _Tally,
    start: threading.Event,
    stop: threading.Event,
    t0: list[float],
) -> None:
    per_producer_rate = cfg.rate / cfg.plan.producers if cfg.rate else None
    node = cfg.plan.producer_node(producer)
    start.wait()
    sent_here = 0
    for events, prebuilt in work:
        if stop.is_set():
            break
        if per_producer_rate:
            due = t0[0] + sent_here / per_producer_rate
            if (wait := due - time.monotonic()) > 0 and stop.wait(wait):
                break
        payload = prebuilt if prebuilt is not None else sender.encode(cfg.plan, producer, events)
        tally.add(sent=len(events))
        sent_here += len(events)
        outcome = deliver(sender, payload, cfg.retry, stop, lambda o: tally.add(retries=1))
        if outcome.ok:
            tally.acknowledged(node, events[0].position, len(events), outcome.rejected)
            if outcome.rejected:
                tally.error(f"{node}: Echo rejected {outcome.rejected} points: {outcome.message}")
        else:
            tally.add(failed=len(events))
            code = outcome.code.name if outcome.code else "unknown"
            tally.error(f"{node}: batch at {events[0].position} failed ({code}): {outcome.message}")


def _progress(cfg: StressConfig, tally: _Tally, done: threading.Event, t0: list[float]) -> None:
    out = cfg.progress
    while out is not None and not done.wait(1.0):
        elapsed = time.monotonic() - t0[0]
        with tally.lock:
            acked, failed, retries = tally.acked, tally.failed, tally.retries
        print(
            f"stress: {acked}/{cfg.plan.total} acked, {failed} failed, {retries} retries, "
            f"{acked / max(elapsed, 1e-9):,.0f} eps",
            file=out,
            flush=True,
        )


def run(cfg: StressConfig) -> StressResult:
    """Send the whole plan and return the tally. Raw payloads are encoded before the clock starts."""
    size = max(1, cfg.batch)
    if cfg.rate:  # keep each producer to >= ~10 sends per second so pacing stays smooth
        size = max(1, min(size, int(cfg.rate / cfg.plan.producers / 10)))
    senders = [make_sender(cfg.client, cfg.target) for _ in range(cfg.plan.producers)]
    work = []
    for p, sender in enumerate(senders):
        chunks = batches(cfg.plan, p, size)
        prebuild = cfg.client == "raw"
        work.append([(c, sender.encode(cfg.plan, p, c) if prebuild else None) for c in chunks])
    ack_file = cfg.ack_log.open("a") if cfg.ack_log else None
    tally, start, stop, done, t0 = (
        _Tally(ack_file),
        threading.Event(),
        threading.Event(),
        threading.Event(),
        [0.0],
    )
    threads = [
        threading.Thread(
            target=_producer,
            args=(cfg, p, work[p], senders[p], tally, start, stop, t0),
            name=f"producer-{p}",
            daemon=True,
        )
        for p in range(cfg.plan.producers)
    ]
    for t in threads:
        t.start()
    reporter = threading.Thread(target=_progress, args=(cfg, tally, done, t0), daemon=True)
    t0[0] = time.monotonic()
    start.set()
    reporter.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join()
    elapsed = time.monotonic() - t0[0]
    done.set()
    for sender in senders:
        sender.close()
    if ack_file:
        ack_file.close()
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
