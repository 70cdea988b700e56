"""The pre-call window summarised at the source (agent/window.py): the agent's breakdown equals what
Echo computes from the same raw intervals, and raw intervals go out only as evidence."""

from __future__ import annotations

from typing import Any

from echo_helpers import TEST_TOKEN, grpc_export, row_dicts

from rankecho.agent.clock import ClockConverter
from rankecho.agent.events import FN, CallRecord, InitRecord, OffCpuRecord
from rankecho.agent.identity import EnvIdentity, ProcessInfo
from rankecho.agent.tracker import Tracker
from rankecho.agent.window import Interval, WindowKeeper, classify_offcpu
from rankecho.echo.app import Echo
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request

MS = 1_000_000
BOOT = 1_790_000_000_000_000_000  # the node's realtime at monotonic 0 (Echo refuses future times)
PID, MAIN, HELPER, OTHER = 300, 300, 305, 999
STREAM = 0x5000
UID = b"window-test-comm".ljust(128, b"\0")


class Rank:
    """One rank's main thread (and an NCCL helper thread) seen by its node's tracker."""

    def __init__(self, **tracker_kwargs: Any) -> None:
        self.points: list[Point] = []
        info = ProcessInfo(PID, 11, EnvIdentity(rank=1, world_size=2, job_key="m:1"))
        clock = ClockConverter(realtime=lambda: BOOT, monotonic=lambda: 0)
        self.t = Tracker("node-w", clock, {PID: info}.get, lambda k, p: self.points.append(p),
                         thread_group=lambda tid: PID if tid in (MAIN, HELPER) else OTHER, **tracker_kwargs)
        rec = CallRecord(PID, MAIN, FN.COMM_INIT_RANK, 1 * MS, 2 * MS, 0, 2, 1, 0xC0, 0)
        self.t.handle(InitRecord(rec, UID))

    def call(self, fn: FN, ts: int, ts2: int, a1: int = 0, a2: int = 0, a3: int = 0, tid: int = MAIN) -> None:
        self.t.handle(CallRecord(PID, tid, fn, ts, ts2, 0xC0, a1, a2, a3, 0))

    def offcpu(self, out: int, back: int, sleeping: bool = True, call: FN = FN.NONE, wake: int = 0,
               by: int = 0, tid: int = MAIN) -> None:  # fmt: skip
        self.t.handle(OffCpuRecord(PID, tid, out, back, wake, sleeping, call, by))

    def step(self, t0: int, stall_ms: int = 0) -> int:
        """One step from t0: compute with a few interruptions, two buckets, one sync; returns its end."""
        t = t0
        if stall_ms:
            self.call(FN.MALLOC, t, t + stall_ms * MS, a2=4096)
            self.offcpu(t + MS, t + (stall_ms - 1) * MS, call=FN.MALLOC)
            t += stall_ms * MS
        self.offcpu(t + 2 * MS, t + 4 * MS)                                   # asleep: data loader
        self.offcpu(t + 5 * MS, t + 6 * MS, sleeping=False, by=OTHER)         # preempted by another workload
        self.offcpu(t + 7 * MS, t + 9 * MS, sleeping=False, by=HELPER)        # by the job's own thread
        self.offcpu(t + 10 * MS, t + 14 * MS, wake=t + 12 * MS, by=OTHER)     # asleep, then in the run queue
        self.call(FN.MEMCPY, t + 15 * MS, t + 17 * MS, a2=64, a3=1)
        self.call(FN.ALL_REDUCE, t + 20 * MS, t + 20 * MS + 10_000, a1=STREAM, a2=1024, a3=7)
        self.call(FN.ALL_REDUCE, t + 21 * MS, t + 21 * MS + 10_000, a1=STREAM, a2=1024, a3=7)
        self.call(FN.STREAM_SYNC, t + 22 * MS, t + 60 * MS, a1=STREAM)
        self.offcpu(t + 23 * MS, t + 59 * MS, call=FN.STREAM_SYNC, wake=t + 57 * MS, by=OTHER)
        self.offcpu(t + 30 * MS, t + 80 * MS, tid=HELPER)                    # NCCL's helper thread idles
        return t + 60 * MS

    def metric(self, name: str) -> list[Point]:
        return [p for p in self.points if p.metric_name == name]


def test_the_agents_breakdown_equals_what_echo_computes_from_the_same_raw_intervals(
    echo_inproc: Echo,
) -> None:
    rank = Rank(raw_interval_ns=0)  # every raw interval goes out too, so Echo can compute its own
    t = 100 * MS
    for n in range(4):
        t = rank.step(t, stall_ms=40 if n == 2 else 0) + 5 * MS
    rank.t.close()
    resource = {c.CLUSTER_NAME: "cw", c.NODE_NAME: "node-w", **rank.t.resources[(PID, 11)]}
    grpc_export(echo_inproc.grpc_address, metrics_request(resource, rank.points), TEST_TOKEN)
    got = row_dicts(echo_inproc, """
        WITH c AS (SELECT *, enter_ns - pre_window_ns AS w_start FROM collectives)
        SELECT c.seq, c.pre_window_ns AS window_ns, c.pre_presync_ns AS presync_ns,
               {'allocator': c.pre_allocator_ns, 'slow_gpu': c.pre_slow_gpu_ns, 'memcpy': c.pre_memcpy_ns,
                'cpu_contention': c.pre_cpu_contention_ns, 'sleeping': c.pre_sleeping_ns} AS agent,
               (SELECT {'allocator': coalesce(sum(ns) FILTER (WHERE category = 'allocator'), 0),
                        'slow_gpu': coalesce(sum(ns) FILTER (WHERE category = 'slow_gpu'), 0),
                        'memcpy': coalesce(sum(ns) FILTER (WHERE category = 'memcpy'), 0),
                        'cpu_contention': coalesce(sum(ns) FILTER (WHERE category = 'cpu_contention'), 0),
                        'sleeping': coalesce(sum(ns) FILTER (WHERE category = 'sleeping'), 0)}
                FROM (SELECT category, least(h.end_ns, c.enter_ns) - greatest(h.start_ns, c.w_start) AS ns
                      FROM host_activity h
                      WHERE h.thread_key = c.thread_key AND h.end_ns > c.w_start
                        AND h.start_ns < c.enter_ns)) AS echo,
               (SELECT coalesce(sum((least(h.end_ns, c.enter_ns) - greatest(h.start_ns, c.w_start))
                                    * CASE WHEN h.kind = 'sync' THEN 1 ELSE -1 END), 0)
                FROM host_activity h
                WHERE h.thread_key = c.thread_key AND h.end_ns > c.w_start
                  AND h.start_ns < c.enter_ns
                  AND (h.kind = 'sync' OR (h.kind = 'runq' AND h.cuda_call = 'cudaStreamSynchronize')))
                   AS echo_presync
        FROM c ORDER BY c.seq""")  # fmt: skip
    assert [r["seq"] for r in got] == list(range(8))
    for r in got:
        assert r["agent"] == r["echo"], r
        if r["presync_ns"] is not None:
            assert r["presync_ns"] == r["echo_presync"], r
    # The step's first bucket is explained from the previous step's completion: the GPU rule's window.
    firsts = [r for r in got if r["seq"] % 2 == 0 and r["seq"] > 0]
    assert all(r["presync_ns"] is not None for r in firsts)
    assert [r["presync_ns"] is None for r in got if r["seq"] % 2 == 1] == [True] * 4
    stalled = got[4]  # step 2's first bucket: the 40 ms cudaMalloc
    assert stalled["agent"]["allocator"] == 40 * MS
    assert got[2]["agent"] == {"allocator": 0, "slow_gpu": 0, "memcpy": 2 * MS, "cpu_contention": 3 * MS,
                               "sleeping": 4 * MS}  # fmt: skip


def test_raw_intervals_go_out_only_as_evidence() -> None:
    rank = Rank(raw_interval_ns=10 * MS, health_every=1000)
    t = 100 * MS
    for n in range(30):
        t = rank.step(t, stall_ms=290 if n == 25 else 0) + 5 * MS
    rank.t.close()
    collectives = rank.metric(c.M_COLLECTIVE)
    assert len(collectives) == 60 and all(c.PRE_WINDOW_MS in p.attributes for p in collectives)
    # Nothing of the helper thread (it never calls a collective), no short interval, no usual sync.
    offcpu = rank.metric(c.M_OFFCPU)
    assert all(p.attributes[c.TID] == MAIN for p in offcpu)
    syncs = rank.metric(c.M_CUDA_SYNC)
    assert len(syncs) <= 8  # before the thread has a usual length (c.f. MIN_HISTORY): each one counts
    # The stall: its allocation, and every interval of its unusually long window, go out.
    (malloc,) = rank.metric(c.M_CUDA_MALLOC)
    assert malloc.value == 290.0
    stall_start = malloc.timestamp_ns
    window_end = collectives[50].attributes[c.ENTER_NS]
    in_window = [p for p in rank.points if p.metric_name in (c.M_OFFCPU, c.M_CUDA_MEMCPY)
                 and stall_start <= p.timestamp_ns < window_end]  # fmt: skip
    assert len(in_window) == 6  # the sleep inside the malloc, 4 off-CPU intervals, the copy
    assert collectives[50].attributes[f"{c.PRE_PREFIX}allocator_ms"] == 290.0
    # At most one per rank-step besides the collectives: the evidence is the exception.
    others = [p for p in rank.points if p.metric_name not in (c.M_COLLECTIVE, c.M_COMM_INIT)]
    assert len(others) < 30, sorted({p.metric_name for p in others})


def test_health_goes_out_every_nth_step_and_when_it_moves() -> None:
    rank = Rank(health_every=5)
    t = 100 * MS
    for n in range(21):
        t = rank.step(t, stall_ms=200 if n == 13 else 0) + 5 * MS
    health = [round(p.value, 2) for p in rank.metric(c.M_HEALTH)]  # 20 steps scored (from the second)
    usual = health[0]
    # the first score, every fifth step's, the stall's (it moved: out at once) and the recovery's
    assert health == [usual, usual, usual, health[3], usual, usual, usual] and health[3] < usual - 0.5


def test_off_cpu_classes_follow_echos_staging_rules() -> None:
    assert classify_offcpu(True, None, "") == "sleeping"
    assert classify_offcpu(False, "other", "") == "cpu_contention"
    assert classify_offcpu(False, None, "") == "cpu_contention"
    assert classify_offcpu(False, "job", "") is None
    assert classify_offcpu(True, "other", "cudaStreamSynchronize") is None
    assert classify_offcpu(True, None, "cudaMemcpyAsync") == "sleeping"  # not a blocking call
    keeper = WindowKeeper(raw_threshold_ns=0)
    shipped: list[int] = []
    keeper.offcpu(1, 1, 0, 10 * MS, True, "other", "", 4 * MS, lambda: shipped.append(1))
    b = keeper.close(1, 1, 0, 20 * MS, from_completion=True)
    assert shipped == [1]
    assert b.spent_ns["sleeping"] == 6 * MS and b.spent_ns["cpu_contention"] == 4 * MS
    assert b.attributes() == {c.PRE_WINDOW_MS: 20.0, f"{c.PRE_PREFIX}sleeping_ms": 6.0,
                              f"{c.PRE_PREFIX}cpu_contention_ms": 4.0, c.PRE_PRESYNC_MS: 0.0}  # fmt: skip


def test_peek_sums_a_span_with_the_interval_in_progress_and_changes_nothing() -> None:
    """The heartbeat's view of a quiet rank: closed intervals in the span plus the off-CPU one still in
    progress, clipped to the span; no window length is remembered and nothing ships."""
    shipped: list[str] = []
    keeper = WindowKeeper(raw_threshold_ns=1)
    ms = 1_000_000
    for i in range(4):  # a loop of 1 s sleeps, 10 ms awake between them
        start = i * 1010 * ms
        keeper.offcpu(1, 1, start, start + 1000 * ms, True, None, "", 0, lambda: shipped.append("x"))
    window = keeper.thread(1, 1)
    before = (dict(window.windows), {k: list(v) for k, v in window.lengths.items()})
    still = Interval(4040 * ms, 5000 * ms, "sleeping", 0, None)
    seen = window.peek(500 * ms, 5000 * ms, still)
    assert seen.spent_ns["sleeping"] == (500 + 3 * 1000 + 960) * ms
    assert seen.end_ns - seen.start_ns == 4500 * ms and seen.presync_ns is None
    assert window.peek(500 * ms, 5000 * ms).spent_ns["sleeping"] == (500 + 3 * 1000) * ms
    assert (dict(window.windows), {k: list(v) for k, v in window.lengths.items()}) == before
    assert not window.calls_collectives and shipped == []


def test_a_window_sums_what_a_scan_of_the_whole_ring_would_even_with_intervals_out_of_order() -> None:
    """_sum walks back only over the ring's tail that can reach the window; intervals that ended out of
    order (a long one added before shorter ones inside it, touching ends, an interval at the ring's
    start reaching past later ones) must count exactly as a scan of every interval counts them."""
    import random

    from rankecho.agent.window import ThreadWindow

    def full_scan(ring: list[Interval], start: int, end: int) -> tuple[dict[str, int], int, list[int]]:
        spent = dict.fromkeys(c.PRE_CLASSES, 0)
        presync, inside = 0, []
        for iv in ring:
            overlap = min(iv.end_ns, end) - max(iv.start_ns, start)
            if overlap > 0:
                inside.append(id(iv))
                presync += iv.presync_sign * overlap
                if iv.category is not None:
                    spent[iv.category] += overlap
        return spent, presync, inside

    rng = random.Random(7)
    classes = [None, *c.PRE_CLASSES]
    for _ in range(200):
        window, ring, t = ThreadWindow(), [], 0
        for _ in range(rng.randint(0, 60)):
            t += rng.randint(-40, 40)  # starts and ends go back as well as forward
            iv = Interval(t, t + rng.choice([0, 1, 5, 30, 300]), rng.choice(classes), rng.choice([-1, 0, 1]),
                          None, rng.choice([None, "s1", "s2"]))  # fmt: skip
            window.add(iv)
            ring.append(iv)
        start = rng.randint(-50, max(t, 0) + 50)
        end = start + rng.choice([0, 1, 10, 100, 1000])
        spent, presync, inside, _ = window._sum(start, end)
        assert (spent, presync, [id(iv) for iv in inside]) == full_scan(ring, start, end)
    long_first = ThreadWindow()
    for iv in (Interval(0, 100, "sleeping", 0, None), Interval(10, 20, "memcpy", 0, None)):
        long_first.add(iv)
    assert long_first._sum(50, 60)[0]["sleeping"] == 10  # the long one still counts behind a short one
