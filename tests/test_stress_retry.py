"""Retry decisions (pure) and the stress client's resend loop against an in-process gRPC collector
that answers from a script: RESOURCE_EXHAUSTED with RetryInfo, UNAUTHENTICATED, then OK."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator

import grpc
import pytest
from echo_helpers import ScriptedCollector, scripted_collector

from rankecho.shared.retry import RetryPolicy, retry_delay
from rankecho.shared.retryinfo import RETRY_INFO_KEY, STATUS_DETAILS_KEY, retry_delay_from, retry_trailers
from rankecho.stress.planting import StressPlan
from rankecho.stress.runner import StressConfig, run
from rankecho.stress.senders import Target


def test_non_retryable_codes_give_up_at_once() -> None:
    policy = RetryPolicy()
    assert retry_delay(policy, grpc.StatusCode.UNAUTHENTICATED, 1, 0.0) is None
    assert retry_delay(policy, grpc.StatusCode.INVALID_ARGUMENT, 1, 0.0) is None


def test_backoff_grows_is_capped_and_respects_the_deadline() -> None:
    policy = RetryPolicy(base_backoff_s=0.1, max_backoff_s=0.5, deadline_s=10.0)
    rng = random.Random(1)
    delays = [retry_delay(policy, grpc.StatusCode.UNAVAILABLE, n, 0.0, rng=rng) for n in range(1, 8)]
    assert all(d is not None for d in delays)
    assert 0.08 <= delays[0] <= 0.12 and 0.16 <= delays[1] <= 0.24  # type: ignore[operator]
    assert max(delays) <= 0.5 * 1.2  # type: ignore[type-var, operator]
    assert retry_delay(policy, grpc.StatusCode.UNAVAILABLE, 3, 9.9, rng=rng) is None


def test_server_delay_replaces_the_computed_backoff() -> None:
    policy = RetryPolicy(deadline_s=5.0)
    assert retry_delay(policy, grpc.StatusCode.RESOURCE_EXHAUSTED, 1, 0.0, server_delay_s=1.25) == 1.25
    assert retry_delay(policy, grpc.StatusCode.RESOURCE_EXHAUSTED, 1, 4.0, server_delay_s=1.25) is None


def test_resource_exhausted_without_retry_info_is_final() -> None:
    assert retry_delay(RetryPolicy(), grpc.StatusCode.RESOURCE_EXHAUSTED, 1, 0.0) is None


def test_retry_info_is_read_from_either_trailer() -> None:
    trailers = dict(retry_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", 2.5))
    assert set(trailers) == {RETRY_INFO_KEY, STATUS_DETAILS_KEY}  # what Echo sends: both
    assert retry_delay_from(trailers.items()) == 2.5
    for key in (RETRY_INFO_KEY, STATUS_DETAILS_KEY):
        assert retry_delay_from([(key, trailers[key])]) == 2.5
    assert retry_delay_from(retry_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", 0.001)) == 0.001
    assert retry_delay_from([(RETRY_INFO_KEY, b"\xff\xff")]) is None
    assert retry_delay_from([("other", b"x"), (RETRY_INFO_KEY, "not bytes")]) is None
    assert retry_delay_from(None) is None


@pytest.fixture
def collector(request: pytest.FixtureRequest) -> Iterator[tuple[ScriptedCollector, str]]:
    with scripted_collector(getattr(request, "param", [])) as served:
        yield served


EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("collector", [[EXHAUSTED, EXHAUSTED]], indirect=True)
def test_raw_client_resends_after_resource_exhausted_honouring_retry_info(
    collector: tuple[ScriptedCollector, str],
) -> None:
    c, endpoint = collector
    plan = StressPlan("c", "n", producers=1, events_per_producer=30)
    started = time.monotonic()
    result = run(StressConfig(plan, Target(endpoint, token="t0k"), client="raw", batch=10))
    assert (result.sent, result.acked, result.failed, result.retries) == (30, 30, 0, 2)
    assert time.monotonic() - started >= 0.1  # two server-requested 50 ms waits
    assert sorted(c.accepted) == sorted(plan.event(i).event_id for i in range(30))
    assert set(c.auth) == {"Bearer t0k"}


@pytest.mark.parametrize("collector", [[EXHAUSTED]], indirect=True)
def test_sdk_client_delivers_through_the_exporter_despite_backpressure(
    collector: tuple[ScriptedCollector, str],
) -> None:
    c, endpoint = collector
    plan = StressPlan("c", "n", producers=2, events_per_producer=20)
    result = run(StressConfig(plan, Target(endpoint, token="t0k"), client="sdk", batch=10))
    assert (result.sent, result.acked, result.failed) == (40, 40, 0)
    assert sorted(c.accepted) == sorted(plan.event(i).event_id for i in range(40))
    assert c.calls == 5 and set(c.auth) == {"Bearer t0k"}


@pytest.fixture
def exporter_filter_first() -> Iterator[None]:
    """The OTel exporter's own DuplicateFilter in front of every other filter on its logger, as when the
    exporter module was imported before the stress senders (the order a full test run produced)."""
    from opentelemetry.exporter.otlp.proto.grpc import exporter
    from opentelemetry.sdk._shared_internal import DuplicateFilter

    logger = logging.getLogger(exporter.__name__)
    before = list(logger.filters)
    logger.filters.sort(key=lambda f: not isinstance(f, DuplicateFilter))
    assert isinstance(logger.filters[0], DuplicateFilter)
    yield
    logger.filters[:] = before


@pytest.mark.parametrize("client", ["raw", "sdk"])
@pytest.mark.parametrize("collector", [[grpc.StatusCode.UNAUTHENTICATED] * 4], indirect=True)
def test_unauthenticated_fails_without_retrying(
    collector: tuple[ScriptedCollector, str], client: str, exporter_filter_first: None
) -> None:
    """Two batches refused alike: the second refusal must be seen as final too (not resent)."""
    c, endpoint = collector
    plan = StressPlan("c", "n", producers=1, events_per_producer=4)
    result = run(StressConfig(plan, Target(endpoint, token="bad"), client=client, batch=2))
    assert (result.acked, result.failed, result.retries) == (0, 4, 0)
    assert c.calls == 2 and c.accepted == []
