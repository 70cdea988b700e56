"""Whether and when to resend a request Echo did not acknowledge: the one retry policy of rankecho's OTLP
producers (the agent's exporter and ``rankecho stress``), a pure decision, unit-testable.

It follows the OTLP spec: only the retryable gRPC codes are retried (UNAVAILABLE covers "Echo is down or
restarting"); RESOURCE_EXHAUSTED only when the server sends a ``RetryInfo`` ("Echo's queue is full, retry
in N s"), since without one it means the message can never fit; a server's ``RetryInfo`` delay replaces
the computed one. Everything else is final: UNAUTHENTICATED and PERMISSION_DENIED above all, which no
resend can fix, and which :data:`FIXES` turns into a message naming the fix. Backoff is exponential with
+-20% jitter, capped at ``max_backoff_s``; a request is given up once the next wait would pass its
deadline (the agent's deadline is infinite: its spool keeps what cannot be sent yet).
"""

from __future__ import annotations

import math
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

FIXES = {
    grpc.StatusCode.UNAUTHENTICATED: "Echo rejected the token: give the producer Echo's token "
    "(RANKECHO_TOKEN or --token-file)",
    grpc.StatusCode.PERMISSION_DENIED: "Echo refused this producer: check the token's permissions",
    grpc.StatusCode.UNIMPLEMENTED: "the endpoint is not an OTLP metrics receiver: check the endpoint",
}
"""Final codes a person has to fix, with what to do: say them loudly, never retry them."""


@dataclass(frozen=True)
class RetryPolicy:
    base_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    deadline_s: float = 60.0
    """How long one request may keep failing before it counts as failed (``math.inf``: never)."""


NEVER_GIVE_UP = math.inf


def retryable(code: grpc.StatusCode | None, server_delay_s: float | None = None) -> bool:
    """Whether the same request may succeed later. ``code`` None: a failure whose status is unknown
    (no answer at all), treated as retryable."""
    if code is None:
        return True
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return server_delay_s is not None
    return code in RETRYABLE


def retry_delay(
    policy: RetryPolicy,
    code: grpc.StatusCode | None,
    attempt: int,
    elapsed_s: float,
    server_delay_s: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds to wait before resending, or None to give up.

    ``attempt`` counts failures so far (1 after the first), ``elapsed_s`` is time since the request's
    first send. ``code`` None means a failure whose status is unknown (treated as retryable).
    """
    if not retryable(code, server_delay_s):
        return None
    if server_delay_s is not None and server_delay_s >= 0:
        delay = server_delay_s
    else:
        jitter = (rng or random).uniform(0.8, 1.2)
        delay = min(policy.max_backoff_s, policy.base_backoff_s * 2 ** min(attempt - 1, 60)) * jitter
    if elapsed_s + delay > policy.deadline_s:
        return None
    return delay
