"""OTLP/gRPC export to Echo: a queue and a spool on top of rankecho's one OTLP client.

The channel, token, TLS, gzip and one Export attempt are :mod:`shared.transport`'s; whether and when to
resend is :mod:`rankecho.shared.retry`'s (the OTLP spec's retryable codes, Echo's RetryInfo delay honoured,
jittered backoff; UNAUTHENTICATED and the other final codes are logged with their fix and the batch is
dropped, never retried). What is left here: a batch that cannot be sent yet goes to the spool instead of
blocking the agent, and is replayed byte-identical once Echo answers (so Echo's dedup by event id holds).
Requests are encoded by :mod:`shared.wire` (the bytes :func:`shared.otlp.metrics_request` would give,
built directly); the wire format, headers and compression are the ones ``OTLPMetricExporter`` uses.

Usage::

    exporter = Exporter(ExportConfig(endpoint="echo:4317", token="t"), Spool(path))
    exporter.start()
    exporter.submit(encode_batch({None: node_resource}, [(None, point)]))
    exporter.close(deadline_s=5)
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from rankecho.agent.spool import Spool
from rankecho.shared.otlp import AttrValue, Point
from rankecho.shared.retry import FIXES, NEVER_GIVE_UP, RETRYABLE, RetryPolicy, retry_delay
from rankecho.shared.retry import retryable as _retryable
from rankecho.shared.transport import MetricsClient, Target
from rankecho.shared.wire import encode_request

__all__ = [
    "FIXES", "LOSS_MARK", "RETRYABLE", "Delivery", "Encoded", "ExportConfig", "Exporter", "backoff_s",
    "encode_batch", "retryable",
]

log = logging.getLogger("rankecho.agent")

ADOPT_EVERY_S = 2.0
"""How often the spools of ended agent runs are taken over for replay."""

Key = Any  # a process key, or None for node-level points


@dataclass(frozen=True)
class Encoded:
    data: bytes
    points: int


def encode_batch(resources: Mapping[Key, Mapping[str, AttrValue]], items: Iterable[tuple[Key, Point]],
                 base: Mapping[str, AttrValue]) -> Encoded:
    """One request holding one ResourceMetrics per process; ``base`` attributes go on every resource."""
    grouped: dict[Key, list[Point]] = defaultdict(list)
    for key, point in items:
        grouped[key].append(point)
    groups = [({**base, **resources.get(key, {})}, points) for key, points in grouped.items()]
    return Encoded(encode_request(groups), sum(len(p) for p in grouped.values()))


@dataclass(frozen=True)
class ExportConfig:
    endpoint: str
    token: str = ""
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    timeout_s: float = 5.0
    backoff_base_s: float = 0.1
    backoff_max_s: float = 1.0
    """The exporter's own retry backoff (jittered): at most this long between tries, so the spool
    starts draining within about a second of Echo's return."""
    queue_max: int = 64
    """Batches held in memory; beyond it batches go straight to the spool."""


    def target(self) -> Target:
        return Target(self.endpoint, self.token or None, not self.tls, self.ca_file, self.cert_file,
                      self.key_file, gzip=True)

    def policy(self) -> RetryPolicy:
        """The spool keeps what cannot be sent yet, so a retryable failure is never given up."""
        return RetryPolicy(self.backoff_base_s, self.backoff_max_s, NEVER_GIVE_UP)


LOSS_MARK = "data lost: "
"""How each line about lost or undelivered points starts (launchers pick them out of the agent's log)."""


@dataclass(frozen=True)
class Delivery:
    """What became of an agent run's points, counted by the exporter and the spool: the agent's final
    summary line and its exit status (non-zero when anything was lost or is still waiting)."""

    sent: int
    rejected: int
    """Refused for good by Echo (a wrong token, a bad request): never retried, lost."""
    rejected_why: str
    dropped: int
    """Evicted from a full spool (``--spool-max-mb``): lost."""
    unsent: int
    """Still in the spool at exit: not lost yet, but not in Echo either."""
    spool_dir: str
    adopting_dir: str
    """The directory to name with ``--spool-dir`` so a later agent sends what waits in ``spool_dir``."""

    @property
    def complete(self) -> bool:
        return not (self.rejected or self.dropped or self.unsent)

    def summary(self) -> str:
        return (f"delivery summary: {self.sent} points acknowledged by Echo, {self.rejected} rejected for "
                f"good, {self.dropped} dropped from a full spool, {self.unsent} left unsent")

    def problems(self, endpoint: str, grace_s: float) -> list[str]:
        """One line per kind of loss, each naming the cause and the fix, each starting with
        :data:`LOSS_MARK`."""
        out = []
        if self.rejected:
            out.append(f"{LOSS_MARK}Echo rejected {self.rejected} points for good ({self.rejected_why})")
        if self.dropped:
            out.append(f"{LOSS_MARK}{self.dropped} points dropped from the full spool {self.spool_dir}; "
                       "raise --spool-max-mb or bring Echo back sooner")
        if self.unsent:
            out.append(f"{LOSS_MARK}{self.unsent} points not delivered: Echo at {endpoint} did not "
                       f"acknowledge them within --shutdown-grace {grace_s:g} s; they wait in "
                       f"{self.spool_dir}: once Echo is reachable, start an agent with --spool-dir "
                       f"{self.adopting_dir} to send them (or raise --shutdown-grace)")
        return out


def backoff_s(attempt: int, base: float, cap: float, rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff with +-20% jitter: base * 2**attempt, capped (what :func:`shared.retry.
    retry_delay` waits after ``attempt + 1`` failures when the server names no delay)."""
    return min(cap, base * (2 ** min(attempt, 30))) * (0.8 + 0.4 * rand())


def retryable(code: grpc.StatusCode | None, server_delay_s: float | None = None) -> bool:
    """True when the same request may succeed later (:func:`rankecho.shared.retry.retryable`)."""
    return _retryable(code, server_delay_s)


class Exporter:
    """Owns the channel; :meth:`run` is the sending thread, :meth:`submit` never blocks."""

    def __init__(self, cfg: ExportConfig, spool: Spool, now: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.spool = spool
        self._now = now
        self._queue: queue.Queue[Encoded] = queue.Queue(maxsize=cfg.queue_max)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._attempt = 0
        self._next_try = 0.0
        self.sent_points = 0
        self.rejected_points = 0
        self.rejected_why = ""
        """The first final rejection's code and fix (or Echo's message), for the exit summary."""
        self._policy = cfg.policy()
        self._client = MetricsClient(cfg.target())

    def submit(self, batch: Encoded) -> None:
        if batch.points == 0:
            return
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.spool.put(batch.data, batch.points)

    def _send(self, data: bytes, points: int, timeout_s: float | None = None) -> bool:
        """One Export call. True = acknowledged (or finally rejected: logged, never retried).

        ``wait_for_ready``: while Echo is away the call waits (up to the timeout) for the channel to
        reconnect instead of failing at once, so it goes out the moment the connection is back rather
        than after the exporter's own backoff on top of gRPC's."""
        timeout = self.cfg.timeout_s if timeout_s is None else max(0.05, timeout_s)
        out = self._client.export(data, timeout, wait_for_ready=True)
        if not out.ok:
            delay = retry_delay(self._policy, out.code, self._attempt + 1, 0.0, out.server_delay_s)
            if delay is None:
                self.rejected_points += points
                fix = FIXES.get(out.code) if out.code is not None else None
                name = out.code.name if out.code is not None else "no status"
                self.rejected_why = self.rejected_why or f"{name}: {fix or out.message}"
                log.error("Echo rejected %d points for good (%s: %s)%s; they are not retried", points,
                          out.code, out.message, f": {fix}" if fix else "")
                return True
            self._fail(out.code, delay)
            return False
        if out.rejected:
            self.rejected_points += out.rejected
            self.rejected_why = self.rejected_why or f"partial success: {out.message}"
            log.warning("Echo rejected %d of %d points: %s", out.rejected, points, out.message)
        if self._attempt:
            log.info("Echo reachable again at %s", self.cfg.endpoint)
        self._attempt = 0
        self._next_try = 0.0
        self.sent_points += points - out.rejected
        return True

    def _fail(self, code: grpc.StatusCode | None, delay: float) -> None:
        """Back off ``delay`` s (Echo's RetryInfo, else the policy's jittered backoff)."""
        if self._attempt == 0:
            log.warning("cannot reach Echo at %s (%s); spooling to %s and retrying",
                        self.cfg.endpoint, code, self.spool.dir)
        self._attempt += 1
        self._next_try = self._now() + delay

    def _deliver(self, batch: Encoded) -> None:
        if self._now() < self._next_try or not self._send(batch.data, batch.points):
            self.spool.put(batch.data, batch.points)

    def _replay_one(self, timeout_s: float | None = None) -> bool:
        """Send the oldest spooled request when not backing off; True when one was delivered."""
        item = self.spool.oldest()
        if item is None or self._now() < self._next_try:
            return False
        if self._send(item.read(), item.points, timeout_s):
            self.spool.remove(item)
            return True
        return False

    def run(self) -> None:
        next_adopt = self._now() + ADOPT_EVERY_S
        while not self._stop.is_set():
            if self._now() >= next_adopt:
                next_adopt = self._now() + ADOPT_EVERY_S
                self.spool.adopt_orphans()
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                batch = None
            if batch is not None:
                self._deliver(batch)
            while self._queue.empty() and not self._stop.is_set() and self._replay_one():
                pass

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="rankecho-export", daemon=True)
        self._thread.start()

    def close(self, deadline_s: float = 5.0, sleep: Callable[[float], None] = time.sleep) -> None:
        """Stop the sending thread, then keep delivering what is queued and spooled until it is all
        sent or ``deadline_s`` passed, retrying with the usual (short) backoff; whatever is left stays
        in the spool (unsent: the agent exits 1; a later agent naming it with --spool-dir sends it).
        (Found: one attempt on a channel still backing off left 31k points behind at the end of a job.)"""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        end = self._now() + deadline_s
        self._next_try = 0.0  # a fresh attempt at shutdown, whatever the backoff said
        while True:
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                break
            self.spool.put(batch.data, batch.points)  # in order, behind what waits already
        while len(self.spool) and self._now() < end:
            if not self._replay_one(min(self.cfg.timeout_s, end - self._now())):
                sleep(max(0.0, min(self._next_try, end) - self._now()) or 0.01)
        self._client.close()
