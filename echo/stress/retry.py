"""Whether and when to resend a batch Echo did not acknowledge: a pure decision, unit-testable.

Retryable gRPC codes follow the OpenTelemetry exporter's list (UNAVAILABLE covers "Echo is down or
restarting"). RESOURCE_EXHAUSTED is retried only when the server sends a ``RetryInfo`` ("Echo's
queue is full, retry in N s"), as the OTLP spec says: without one it means the message can never
fit. Backoff is exponential with +-20% jitter, capped at ``max_backoff_s``; a server ``RetryInfo``
delay replaces the computed one. A batch is given up once the next wait would pass its deadline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

RETRYABLE = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


@dataclass(frozen=True)
class RetryPolicy:
    base_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    deadline_s: float = 60.0
    """How long one batch may keep failing before it counts as failed."""


def retry_delay(
    policy: RetryPolicy,
    code: grpc.StatusCode | None,
    attempt: int,
    elapsed_s: float,
    server_delay_s: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds to wait before resending, or None to give up.

    ``attempt`` counts failures so far (1 after the first), ``elapsed_s`` is time since the batch's
    first send. ``code`` None means a failure whose status is unknown (treated as retryable).
    """
    if code is not None and code not in RETRYABLE:
        return None
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and server_delay_s is None:
        return None  # OTLP: retryable only when the server says when (a too-large message never fits)
    if server_delay_s is not None and server_delay_s >= 0:
        delay = server_delay_s
    else:
        jitter = (rng or random).uniform(0.8, 1.2)
        delay = min(policy.max_backoff_s, policy.base_backoff_s * 2 ** (attempt - 1)) * jitter
    if elapsed_s + delay > policy.deadline_s:
        return None
    return delay
