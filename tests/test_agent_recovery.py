"""The agent's exporter against a real Echo that goes away and comes back (same port, same store).

Found (issue 9): with gRPC's default reconnect backoff (1 s growing to 120 s) the first send after a
30 s outage came 9-15 s after Echo was back, and at shutdown one attempt on a channel still backing off
left 31k points in the spool "for the next run". Here: the first send within ~1 s of Echo's return, the
spool drained while running, and a shutdown that keeps retrying through its grace period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rankecho.agent.export import Encoded, ExportConfig, Exporter, encode_batch
from rankecho.agent.spool import Spool
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point
from rankecho.sim.launcher import free_port
from tests.echo_helpers import TEST_TOKEN, RestartableEcho

OUTAGE_S = 8.0
"""Long enough for gRPC's default backoff to reach ~4 s between attempts."""


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[RestartableEcho]:
    e = RestartableEcho(tmp_path / "echo.db")
    yield e
    e.down()


def batch(start: int, n: int = 10) -> Encoded:
    now = time.time_ns()
    points = [(None, Point(c.M_HEALTH, now + i, 0.9, {c.EVENT_ID: f"e{start + i}"})) for i in range(n)]
    return encode_batch({None: {c.NODE_NAME: "n0", c.CLUSTER_NAME: "c"}}, points, {})


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str = "") -> float:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.01)
    return time.monotonic()


def test_first_send_within_a_second_of_echos_return_and_the_spool_drains(
    echo: RestartableEcho, tmp_path: Path
) -> None:
    echo.up()
    spool = Spool(tmp_path / "spool")
    exporter = Exporter(ExportConfig(echo.address, TEST_TOKEN, timeout_s=2.0), spool)
    exporter.start()
    try:
        exporter.submit(batch(0))
        wait_for(lambda: exporter.sent_points == 10, 10, "the first batch")
        echo.down()
        sent, end = 10, time.monotonic() + OUTAGE_S
        while time.monotonic() < end:  # the job keeps producing during the outage
            exporter.submit(batch(sent))
            sent += 10
            time.sleep(0.2)
        assert spool.points > 0 and exporter.sent_points == 10, (spool.points, exporter.sent_points)
        back = echo.up()
        first = wait_for(lambda: exporter.sent_points > 10, 10, "a send after Echo's return")
        drained = wait_for(lambda: exporter.sent_points == sent and len(spool) == 0, 20, "the spool to drain")
        print(
            f"first send {first - back:.2f} s after Echo's return, spool drained after {drained - back:.2f} s"
        )
        # ~0.2-0.4 s measured; 2 s leaves room for a loaded machine (gRPC's defaults gave 9-15 s)
        assert first - back < 2.0, f"first send {first - back:.2f} s after Echo was back"
        assert echo.stored() == sent
    finally:
        exporter.close(1)
        spool.close()


def test_shutdown_keeps_retrying_through_its_grace_period(echo: RestartableEcho, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    exporter = Exporter(ExportConfig(echo.address, TEST_TOKEN, timeout_s=1.0), spool)
    exporter.start()
    for i in range(20):  # Echo is not there: everything goes to the spool
        exporter.submit(batch(i * 10))
    wait_for(lambda: spool.points == 200, 10)
    threading.Timer(2.0, echo.up).start()  # Echo comes back 2 s into the agent's shutdown
    started = time.monotonic()
    exporter.close(8.0)
    took = time.monotonic() - started
    wait_for(lambda: echo.echo is not None, 5)
    print(f"shutdown sent the spool in {took:.2f} s; {spool.points} points stranded")
    assert spool.points == 0 and len(spool) == 0, "points left for the next run"
    assert exporter.sent_points == 200 and echo.stored() == 200
    assert took < 5.0
    spool.close()


def test_shutdown_leaves_the_rest_after_the_grace_period(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    exporter = Exporter(ExportConfig(f"127.0.0.1:{free_port()}", TEST_TOKEN, timeout_s=0.5), spool)
    exporter.start()
    exporter.submit(batch(0))
    started = time.monotonic()
    exporter.close(1.5)
    assert 1.4 < time.monotonic() - started < 3.0
    assert spool.points == 10
    spool.close()


def test_spool_age_counts_from_the_oldest_request_even_after_adoption(tmp_path: Path) -> None:
    first = Spool(tmp_path / "spool")
    assert first.oldest_age_s() == 0.0
    first.put(b"x" * 10, 3)
    time.sleep(0.3)
    first.put(b"y" * 10, 4)
    assert 0.3 <= first.oldest_age_s() < 5
    first.close()  # a killed agent's spool, taken over by the next run
    second = Spool(tmp_path / "spool")
    assert second.points == 7 and second.oldest_age_s() >= 0.3
    second.close()


def test_summary_lists_nodes_whose_spool_still_holds_points(tmp_path: Path) -> None:
    """The agents' spool reports reach fleet.cluster.summary: only nodes whose latest report is not empty."""
    from rankecho.echo.mcp.rates import load_rates
    from rankecho.echo.mcp.tools import Investigation
    from rankecho.shared.otlp import metrics_request
    from tests.echo_helpers import grpc_export

    t0 = time.time_ns()

    def report(node: str, points: list[tuple[int, float]]) -> None:
        pts = []
        for i, (n, age) in enumerate(points):
            pts += [Point(c.M_AGENT_SPOOL_POINTS, t0 + i, n), Point(c.M_AGENT_SPOOL_AGE, t0 + i, age)]
        grpc_export(echo.address, metrics_request({c.CLUSTER_NAME: "c", c.NODE_NAME: node}, pts), TEST_TOKEN)

    echo = RestartableEcho(tmp_path / "echo.db")
    echo.up()
    try:
        report("drained", [(500, 12.0), (0, 0.0)])
        report("behind", [(100, 3.0), (31_000, 42.5)])
        assert echo.echo is not None
        summary = Investigation(echo.echo.reader, load_rates()).summary()
        assert [(s["node_id"], s["spooled_points"], s["oldest_age_s"]) for s in summary["spools"]] == [
            ("behind", 31_000, 42.5)
        ]
    finally:
        echo.down()


def test_a_default_spool_does_not_replay_an_earlier_runs_backlog(tmp_path: Path) -> None:
    """An agent without --spool-dir (adopt=False) sends only its own requests: an earlier run's backlog
    would land in this run's Echo (issue 19). Naming the directory (adopt=True) replays it."""
    first = Spool(tmp_path / "spool")
    first.put(b"x" * 10, 3)
    first.close()
    own = Spool(tmp_path / "spool", adopt=False)
    assert own.points == 0 and own.adopt_orphans() == 0
    own.close()
    named = Spool(tmp_path / "spool")
    assert named.points == 3
    named.close()


def test_a_wrong_token_is_counted_as_lost_with_its_fix(tmp_path: Path) -> None:
    import grpc

    from rankecho.agent.export import Delivery
    from tests.echo_helpers import scripted_collector

    spool = Spool(tmp_path / "spool")
    with scripted_collector([grpc.StatusCode.UNAUTHENTICATED]) as (_, address):
        exporter = Exporter(ExportConfig(address, "WRONG", timeout_s=2.0), spool)
        exporter.start()
        exporter.submit(batch(0))
        exporter.submit(batch(10))
        exporter.close(5)
    delivery = Delivery(exporter.sent_points, exporter.rejected_points, exporter.rejected_why,
                        spool.dropped_points, spool.points, str(spool.dir), str(spool.root))  # fmt: skip
    spool.close()
    assert (delivery.sent, delivery.rejected, delivery.unsent) == (10, 10, 0)
    assert not delivery.complete
    [line] = delivery.problems(address, 5)
    assert line.startswith("data lost: Echo rejected 10 points for good (UNAUTHENTICATED: ")
    assert "token" in line
