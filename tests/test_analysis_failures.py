"""Hangs, crashes and desyncs (echo/queries/layers/60_failures.sql, fleet.cluster.find_hangs) on agent
events written as the agent sends them and staged by Echo's own staging, in a real DuckDB store."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from rankecho.echo.diagnosis_metrics import failure_samples
from rankecho.echo.mcp.diagnosis import DiagnosisError
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader
from rankecho.echo.store.staging import store_events
from rankecho.shared import contract as c

T0 = 1_800_000_000_000_000_000
STEP_NS = 100_000_000
WORLD = 4
COMM = "w0rld"


EVENT_IDS = itertools.count()
"""Event ids unique across the Job objects of a test (a later look at a store adds a second Job)."""


class Job:
    """A 4-rank job's events: collectives step by step, exits; written to the store by ``write``."""

    def __init__(self, job_id: str | None = None, comm: str = COMM) -> None:
        self.job_id, self.comm = job_id, comm
        """Sent as rankecho.job.id when given (else none, as older agents); each job its own communicator."""
        self.events: list[dict[str, Any]] = []
        self.written = 0
        """Events already in the store: a second write (a later look at the same job) adds only the rest."""

    def collective(
        self, rank: int, seq: int, done: bool = True, nbytes: int = 1024, op: str = "ncclAllReduce",
        late_ns: int = 0,
    ) -> None:
        enter = T0 + seq * STEP_NS + late_ns
        attrs: dict[str, Any] = {c.COMM_ID: self.comm, c.SEQ: seq, c.SEQ_ALIGNED: True, c.OP: op,
                                 c.BYTES: nbytes, c.COMM_RANK: rank, c.COMM_NRANKS: WORLD, c.ENTER_NS: enter,
                                 c.RETURN_NS: enter + 10_000, c.PROCESS_PID: 100 + rank}  # fmt: skip
        if done:
            attrs[c.COMPLETE_NS] = T0 + seq * STEP_NS + 5_000_000
        self._add(rank, c.M_COLLECTIVE, enter, attrs, f"{self.comm}:{seq}", value_double=5.0)

    def steps(self, n: int, ranks: range = range(WORLD)) -> None:
        for seq in range(n):
            for rank in ranks:
                self.collective(rank, seq)

    def exit(self, rank: int, at_seq: float, status: int | None) -> None:
        attrs: dict[str, Any] = {c.PROCESS_PID: 100 + rank}
        if status is not None:
            attrs[c.EXIT_STATUS] = status
        at = T0 + round(at_seq * STEP_NS)
        self._add(rank, c.M_PROCESS_EXIT, at, attrs, f"{self.comm}:{int(at_seq)}",
                  value_int=-1 if status is None else status)  # fmt: skip

    def _add(self, rank: int, metric: str, ts: int, attrs: dict[str, Any], chain: str, **value: Any) -> None:
        attrs[c.CAUSAL_CHAIN_ID] = chain
        if self.job_id is not None:
            attrs[c.JOB_ID] = self.job_id
        self.events.append({"event_id": f"e{next(EVENT_IDS)}", "timestamp_ns": ts, "received_ns": ts,
                            "signal": "metric", "cluster_id": "c1", "node_id": f"n{rank // 2}",
                            "metric_name": metric, "rank": rank, "nranks": WORLD,
                            "value_double": value.get("value_double"), "value_int": value.get("value_int"),
                            "causal_chain_id": chain, "attrs_json": json.dumps(attrs)})  # fmt: skip

    def state(self, rank: int, at_ns: int, quiet_s: float, **attrs: Any) -> None:
        """A heartbeat (rankecho.rank.state) of ``rank``: what it is doing at ``at_ns``."""
        self._add(rank, c.M_RANK_STATE, at_ns, dict(attrs), f"{self.comm}:x", value_double=quiet_s)

    def stack(self, stack_id: str, frames: list[str]) -> None:
        self._add(0, c.M_STACK, T0, {c.STACK_ID: stack_id, c.STACK_FRAMES: "\n".join(frames),
                                     c.STACK_TRUNCATED: False}, "", value_int=len(frames))  # fmt: skip

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        new = self.events[self.written:]
        if not new:
            return
        self.written = len(self.events)
        con.execute("CREATE TEMP TABLE src AS SELECT * FROM events LIMIT 0")
        cols = list(new[0])
        con.executemany(f"INSERT INTO src ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [[e[k] for k in cols] for e in new])  # fmt: skip
        store_events(con, "src")
        con.execute("DROP TABLE src")


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(":memory:") as connection:
        migrate(connection)
        yield connection


def find(con: duckdb.DuckDBPyConnection, job: Job, now_ns: int, **kw: Any) -> dict[str, Any]:
    job.write(con)
    return Investigation(Reader(con), load_rates(), clock_ns=lambda: now_ns).failures.find_hangs(**kw)


def test_healthy_job_that_ends_normally_names_nothing(con: duckdb.DuckDBPyConnection) -> None:
    job = Job()
    job.steps(20)
    for rank in range(WORLD):
        job.exit(rank, 20.5, 0)
    answer = find(con, job, T0 + 3600 * 10**9)
    assert (answer["hangs"], answer["crashes"], answer["desyncs"]) == ([], [], [])
    assert answer["verdict"] == "no hang, crash or desync"


def test_hang_named_once_older_than_the_threshold_with_who_entered_and_who_did_not(
    con: duckdb.DuckDBPyConnection,
) -> None:
    job = Job()
    job.steps(20)
    for rank in (0, 1, 3):  # rank 2 never reaches seq 20; the others wait, and no sync completes it
        job.collective(rank, 20, done=False)
    opened = T0 + 20 * STEP_NS
    assert find(con, job, opened + 19 * 10**9)["hangs"] == []  # 20 s minimum (steps are 0.1 s)
    answer = find(con, Job(), opened + 21 * 10**9)
    [hang] = answer["hangs"]
    assert (hang["causal_chain_id"], hang["entered"], hang["missing"], hang["exited"]) == (
        f"{COMM}:20", [0, 1, 3], [2], []
    )
    assert hang["threshold_s"] == 20.0 and hang["step_ms"] == 100.0 and hang["open_s"] == 21.0
    assert "rank 2 never did" in hang["summary"] and answer["verdict"].startswith("1 hangs")
    assert answer["crashes"] == [] and answer["desyncs"] == []
    shorter = Investigation(Reader(con), load_rates(), clock_ns=lambda: opened + 5 * 10**9).failures
    assert [h["missing"] for h in shorter.find_hangs(min_open_s=4)["hangs"]] == [[2]]
    with pytest.raises(DiagnosisError):
        shorter.find_hangs(min_open_s=-1)


def test_crash_names_the_first_rank_to_exit_and_its_status(con: duckdb.DuckDBPyConnection) -> None:
    job = Job()
    job.steps(10)
    job.exit(2, 10.2, 7)  # rank 2 dies before seq 10; the others enter it and abort (status 70)
    for rank in (0, 1, 3):
        job.collective(rank, 10, done=False)
        job.exit(rank, 10.3, 70)
    answer = find(con, job, T0 + 3600 * 10**9)
    first = answer["crashes"][0]
    assert (first["rank"], first["status"], first["first"]) == (2, 7, True)
    assert first["causal_chain_id"] == f"{COMM}:10" and first["entered_by"] == [0, 1, 3]
    later = answer["crashes"][1:]
    assert [x["rank"] for x in later] == [0, 1, 3] and not any(x["first"] for x in later)
    assert answer["hangs"] == []  # the missing rank exited: a crash, not a hang


def test_a_killed_rank_with_unknown_status_is_a_crash_only_if_the_job_went_on(
    con: duckdb.DuckDBPyConnection,
) -> None:
    job = Job()
    job.steps(10)
    job.exit(1, 10.1, None)  # killed: no status; nobody entered seq 10, its next
    assert find(con, job, T0 + 3600 * 10**9)["crashes"] == []
    later = Job()
    later.collective(0, 10, done=False)  # ... but now rank 0 entered the instance rank 1 never reached
    crashes = find(con, later, T0 + 3600 * 10**9)["crashes"]
    assert [(x["rank"], x["status"], x["first"]) for x in crashes] == [(1, None, True)]


def test_desync_names_the_odd_rank_and_hides_the_aborts_it_caused(con: duckdb.DuckDBPyConnection) -> None:
    job = Job()
    job.steps(5)
    for rank in range(WORLD):
        job.collective(rank, 5, done=False, nbytes=2048 if rank == 3 else 1024, late_ns=rank * 1000)
        job.exit(rank, 5.2, 70)
    answer = find(con, job, T0 + 3600 * 10**9)
    [desync] = answer["desyncs"]
    assert (desync["first_rank"], desync["ranks"]) == (3, 4)
    assert desync["usual"] == {"op": "ncclAllReduce", "bytes": 1024}
    assert [(x["rank"], x["bytes"]) for x in desync["odd_calls"]] == [(3, 2048)]
    assert answer["crashes"] == [] and answer["hangs"] == []
    op_job = Job()  # a different op at the same seq is a desync too
    op_job.collective(0, 9, op="ncclAllGather")
    for rank in (1, 2, 3):
        op_job.collective(rank, 9)
    assert [d["first_rank"] for d in find(con, op_job, T0)["desyncs"]] == [3, 0]


def test_diagnose_prints_the_failures_first(tmp_path: Path) -> None:
    db = tmp_path / "echo.db"
    with duckdb.connect(str(db)) as store:
        migrate(store)
        job = Job()
        job.steps(10)
        job.exit(2, 10.2, 7)
        for rank in (0, 1, 3):
            job.collective(rank, 10, done=False)
        job.write(store)
    run = [sys.executable, "-m", "rankecho", "diagnose", "--db", str(db)]
    text = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert text.startswith("FAILURES: ") and "crash: rank 2 (n1) exited with status 7" in text, text
    data = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True).stdout)
    assert [x["rank"] for x in data["failures"]["crashes"] if x["first"]] == [2]
    assert "stragglers" in data


def test_two_jobs_on_one_cluster_keep_their_failures_apart(con: duckdb.DuckDBPyConnection) -> None:
    """Both jobs have ranks 0..3 on the same nodes. Job b's rank 2 crashing must neither hide job a's hung
    rank 2 (as 'exited') nor be counted with it; job_id narrows the answer to one job."""
    a, b = Job("a", comm="commA"), Job("b", comm="commB")
    for job in (a, b):
        job.steps(20)
        for rank in (0, 1, 3):
            job.collective(rank, 20, done=False)
    b.exit(2, 20.2, 1)  # b's rank 2 crashed before seq 20; a's rank 2 is alive and never came
    a.exit(1, 20.3, 1)  # after b's crash, but the first exit of job a
    a.write(con)
    now = T0 + 20 * STEP_NS + 31 * 10**9
    answer = find(con, b, now)
    assert [(h["job_id"], h["missing"], h["exited"]) for h in answer["hangs"]] == [("a", [2], [])]
    crashes = [(x["job_id"], x["rank"], x["status"], x["first"]) for x in answer["crashes"]]
    assert crashes == [("b", 2, 1, True), ("a", 1, 1, True)]
    inv = Investigation(Reader(con), load_rates(), clock_ns=lambda: now).failures
    only_a, only_b = inv.find_hangs(job_id="a"), inv.find_hangs(job_id="b")
    assert (len(only_a["hangs"]), [x["rank"] for x in only_a["crashes"]], only_a["job_id"]) == (1, [1], "a")
    assert (only_b["hangs"], [x["rank"] for x in only_b["crashes"]]) == ([], [2])
    assert inv.find_hangs(job_id="nope")["verdict"] == "no hang, crash or desync"


def rank_2_hangs_at_step_20() -> Job:
    """20 steps, then ranks 0, 1 and 3 enter seq 20 and rank 2 never does."""
    job = Job()
    job.steps(20)
    for rank in (0, 1, 3):
        job.collective(rank, 20, done=False)
    return job


def test_a_hang_says_what_the_missing_rank_is_stuck_in_from_its_latest_heartbeat(
    con: duckdb.DuckDBPyConnection,
) -> None:
    job = rank_2_hangs_at_step_20()
    opened = T0 + 20 * STEP_NS
    s = 10**9
    job.stack("5a5a5a5a5a5a5a5a", ["[unknown]", "ppoll", "hang_rank", "run_step", "main"])
    # Before the instance opened (a stale state of an earlier quiet spell), then two heartbeats while stuck:
    # the latest one is named. Rank 0 waiting in its sync is not a missing rank: not listed.
    job.state(2, opened - 20 * s, 5.0, **{c.STATE_CALL: "cudaMalloc", c.STATE_CALL_SINCE_NS: opened - 25 * s})
    job.state(2, opened + 25 * s, 25.0, **{c.STATE_OFFCPU_SINCE_NS: opened - 1 * s, c.STATE_SLEEPING: False})
    job.state(2, opened + 30 * s, 30.0, **{c.STATE_OFFCPU_SINCE_NS: opened - 1 * s, c.STATE_SLEEPING: True,
                                           c.STACK_ID: "5a5a5a5a5a5a5a5a", c.PRE_WINDOW_MS: 5000.0,
                                           f"{c.PRE_PREFIX}sleeping_ms": 4800.0})  # fmt: skip
    job.state(0, opened + 30 * s, 30.0, **{c.STATE_CALL: "cudaStreamSynchronize",
                                           c.STATE_CALL_SINCE_NS: opened})  # fmt: skip
    [hang] = find(con, job, opened + 31 * s)["hangs"]
    [doing] = hang["doing"]
    assert (doing["rank"], doing["node_id"], doing["sleeping"], doing["off_cpu_s"], doing["call"]) == (
        2, "n1", True, 31.0, None
    )
    assert doing["leading_frames"] == "ppoll <- hang_rank <- run_step <- main"
    assert doing["quiet_s"] == 30.0 and doing["recent_s"] == 5.0
    assert doing["recent_by_class_s"] == {"sleeping": 4.8, "host_compute": 0.2}
    assert doing["summary"] == (
        "rank 2 (n1) no collective for 30.0 s, 4.8 s of the last 5.0 s sleeping off the CPU outside CUDA "
        "calls (data loader, I/O or a lock), asleep off the CPU (for 31.0 s), in ppoll <- hang_rank <- "
        "run_step <- main"
    )
    assert doing["summary"] in hang["summary"]


def test_a_hang_without_heartbeats_has_nothing_to_say_about_the_missing_rank(
    con: duckdb.DuckDBPyConnection,
) -> None:
    job = rank_2_hangs_at_step_20()
    job.state(2, T0 + 20 * STEP_NS - 10**9, 5.0, **{c.STATE_CALL: "cudaMalloc"})  # before it opened: stale
    [hang] = find(con, job, T0 + 20 * STEP_NS + 31 * 10**9)["hangs"]
    assert hang["doing"] == [] and hang["summary"].endswith("rank 2 never did")


def test_the_metrics_page_counts_open_hangs_and_first_crashes_per_cluster(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """/metrics' failure gauges (echo/diagnosis_metrics.py) from find_hangs on the same store: the open
    hang and how long it has waited; a crash counted once (its peers' later aborts are not more)."""
    job = rank_2_hangs_at_step_20()
    job.write(con)
    now = T0 + 20 * STEP_NS + 25 * 10**9
    inv = Investigation(Reader(con), load_rates(), clock_ns=lambda: now)
    samples = failure_samples(inv, "last 15m", {"c1", "idle"})
    got = {(s.name, s.labels["cluster_id"]): s.value for s in samples}
    assert got == {("rankecho_hangs", "c1"): 1, ("rankecho_crashes", "c1"): 0, ("rankecho_desyncs", "c1"): 0,
                   ("rankecho_hang_open_seconds", "c1"): 25.0, ("rankecho_hangs", "idle"): 0,
                   ("rankecho_crashes", "idle"): 0, ("rankecho_desyncs", "idle"): 0}  # fmt: skip
    crashed = Job("b", comm="b0")
    crashed.steps(5)
    crashed.exit(1, 5.5, 3)
    crashed.exit(0, 5.6, 70)  # its peer aborting
    crashed.write(con)
    got = {(s.name, s.labels["cluster_id"]): s.value for s in failure_samples(inv, "last 15m", set())}
    assert got[("rankecho_crashes", "c1")] == 1
