"""Tracker, health, identity and clock logic on synthetic BPF records (no root, no kernel)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankecho.agent.clock import ClockConverter, measure_offset
from rankecho.agent.events import FN, CallRecord, ExitRecord, InitRecord, OffCpuRecord
from rankecho.agent.health import StepHealth, score
from rankecho.agent.identity import (
    EnvIdentity,
    ProcessInfo,
    env_identity,
    parse_environ,
    parse_stat_start,
    read_process,
    short_hash,
    split_child_id,
    unaligned_comm_id,
    unique_id_hash,
)
from rankecho.agent.tracker import LAUNCH_QUIET_NS, Tracker
from rankecho.shared import contract as c

MS = 1_000_000
UID = b"unique-id-of-the-world-comm".ljust(128, b"\0")
STREAM = 0x5000


class Rank:
    """One simulated rank process seen by its own node's tracker."""

    def __init__(
        self, rank: int, world: int, pid: int = 100, start: int = 7, env_rank: int | None = None,
        node: str = "node", boot_ns: int = 1_000_000_000_000, job_key: str = "m:1", start_ns: int = 0,
        **tracker_kwargs: Any,
    ) -> None:
        """``node`` names the tracker's node; ``boot_ns`` is that node's realtime at monotonic 0;
        ``start``/``start_ns``: the process's start in clock ticks and Unix ns (0: unknown)."""
        self.points: list[tuple[Any, Any]] = []
        self.pid = pid
        env = EnvIdentity(rank=env_rank, world_size=world if env_rank is not None else None, job_key=job_key)
        infos = {pid: ProcessInfo(pid, start, env, start_ns=start_ns)}
        clock = ClockConverter(realtime=lambda: boot_ns, monotonic=lambda: 0)
        self.t = Tracker(node, clock, infos.get, lambda k, p: self.points.append((k, p)), **tracker_kwargs)
        self.rank, self.world = rank, world

    def call(self, fn: FN, ts: int, ts2: int, a0: int = 0, a1: int = 0, a2: int = 0, a3: int = 0) -> None:
        self.t.handle(CallRecord(self.pid, self.pid, fn, ts, ts2, a0, a1, a2, a3, 0))

    def init(self, handle: int = 0xC0, ts: int = 1 * MS) -> None:
        rec = CallRecord(self.pid, self.pid, FN.COMM_INIT_RANK, ts, ts + MS,
                         0, self.world, self.rank, handle, 0)
        self.t.handle(InitRecord(rec, UID))

    def step(self, enter: int, sync_end: int, handle: int = 0xC0) -> None:
        self.call(FN.ALL_REDUCE, enter, enter + 10_000, a0=handle, a1=STREAM, a2=1024, a3=7)
        self.call(FN.STREAM_SYNC, enter + 20_000, sync_end, a1=STREAM)

    def metric(self, name: str) -> list[Any]:
        return [p for _, p in self.points if p.metric_name == name]


def test_same_chain_ids_on_every_rank_and_completion_at_the_sync() -> None:
    ranks = [Rank(r, 2) for r in range(2)]
    for r in ranks:
        r.init()
        for s in range(3):
            r.step(enter=(10 + 100 * s) * MS + r.rank * 5 * MS, sync_end=(60 + 100 * s) * MS)
    chains = [[p.attributes[c.CAUSAL_CHAIN_ID] for p in r.metric(c.M_COLLECTIVE)] for r in ranks]
    assert chains[0] == chains[1] and len(set(chains[0])) == 3
    comm_id = ranks[0].metric(c.M_COLLECTIVE)[0].attributes[c.COMM_ID]
    assert chains[0] == [c.causal_chain_id(comm_id, s) for s in range(3)]
    p = ranks[1].metric(c.M_COLLECTIVE)[0]
    assert p.attributes[c.COMPLETE_NS] - p.attributes[c.ENTER_NS] == 45 * MS
    assert p.value == pytest.approx(45.0)
    assert ranks[1].t.resources[(100, 7)][c.RANK] == 1 and ranks[1].t.resources[(100, 7)][c.NRANKS] == 2


def test_sync_on_another_stream_does_not_complete_and_step_ids_follow_completion() -> None:
    r = Rank(0, 1)
    r.init()
    r.call(FN.ALL_REDUCE, 10 * MS, 11 * MS, a0=0xC0, a1=STREAM)
    r.call(FN.STREAM_SYNC, 12 * MS, 13 * MS, a1=0x9999)  # other stream: not the collective's
    assert not r.metric(c.M_COLLECTIVE)
    first_sync = r.metric(c.M_CUDA_SYNC)[0]
    r.call(FN.DEVICE_SYNC, 14 * MS, 20 * MS)
    [coll] = r.metric(c.M_COLLECTIVE)
    assert coll.attributes[c.COMPLETE_NS] == r.t.clock.to_unix(20 * MS)
    # Events before completion belong to step 0, events after it to step 1.
    comm = coll.attributes[c.COMM_ID]
    assert first_sync.attributes[c.CAUSAL_CHAIN_ID] == c.causal_chain_id(comm, 0)
    r.call(FN.MALLOC, 21 * MS, 22 * MS, a2=4096)
    [malloc] = r.metric(c.M_CUDA_MALLOC)
    assert malloc.attributes[c.CAUSAL_CHAIN_ID] == c.causal_chain_id(comm, 1)
    assert malloc.attributes[c.BYTES] == 4096


def test_split_children_and_p2p_match_across_ranks() -> None:
    ranks = [Rank(r, 2) for r in range(2)]
    for r in ranks:
        r.init()
        child = 0xD0 + r.rank
        split = CallRecord(r.pid, r.pid, FN.COMM_SPLIT, 2 * MS, 3 * MS, 0xC0, 1, r.rank, child, 0)
        r.t.handle(InitRecord(split, b"\0" * 128))
        r.call(FN.ALL_REDUCE, 5 * MS, 6 * MS, a0=child, a1=STREAM)
        peer = 1 - r.rank
        fn = FN.SEND if r.rank == 0 else FN.RECV
        r.call(fn, 7 * MS, 8 * MS, a0=0xC0, a1=STREAM, a2=16, a3=7 | (peer << 16))
        r.call(FN.STREAM_SYNC, 9 * MS, 10 * MS, a1=STREAM)
    inits = [[p.attributes[c.COMM_ID] for p in r.metric(c.M_COMM_INIT)] for r in ranks]
    assert inits[0] == inits[1] and len(set(inits[0])) == 2
    assert ranks[0].metric(c.M_COMM_INIT)[1].attributes[c.PARENT_COMM_ID] == inits[0][0]
    chains = [sorted(p.attributes[c.CAUSAL_CHAIN_ID] for p in r.metric(c.M_COLLECTIVE)) for r in ranks]
    assert chains[0] == chains[1]
    assert any(".0>1:0" in ch for ch in chains[0])


def test_comm_seen_before_its_init_is_unaligned_with_rank_from_environment() -> None:
    r = Rank(3, 8, env_rank=3)
    r.step(10 * MS, 20 * MS, handle=0xEE)
    [coll] = r.metric(c.M_COLLECTIVE)
    assert coll.attributes[c.SEQ_ALIGNED] is False and coll.attributes[c.SEQ] == 0
    assert r.t.resources[(100, 7)][c.RANK] == 3 and r.t.resources[(100, 7)][c.NRANKS] == 8
    other = Rank(5, 8, env_rank=5)  # another rank of the same job agrees on the guessed comm id
    other.step(10 * MS, 20 * MS, handle=0x77)
    assert other.metric(c.M_COLLECTIVE)[0].attributes[c.COMM_ID] == coll.attributes[c.COMM_ID]


def test_exit_flushes_pending_and_a_reused_pid_is_a_new_process() -> None:
    r = Rank(0, 1)
    r.init()
    r.call(FN.ALL_REDUCE, 10 * MS, 11 * MS, a0=0xC0, a1=STREAM)
    r.t.handle(ExitRecord(r.pid, 12 * MS))
    [coll] = r.metric(c.M_COLLECTIVE)
    assert c.COMPLETE_NS not in coll.attributes  # no sync ever waited for it
    # A record of the dead process that arrives after its exit (a thread switching in to die) stays
    # with it: no new, identity-less process appears under the same key.
    r.t.handle(OffCpuRecord(r.pid, r.pid + 1, 11 * MS, 13 * MS, 0, False, FN.NONE))
    assert r.t.resources[(r.pid, 7)][c.RANK] == 0 and r.pid not in r.t.procs
    assert r.t.sweep(13 * MS) == [r.pid]
    r.t.track(ProcessInfo(r.pid, 99, EnvIdentity(rank=4, world_size=8)))
    r.call(FN.MALLOC, 20 * MS, 21 * MS)
    keys = [k for k, p in r.points if p.metric_name == c.M_CUDA_MALLOC]
    assert keys == [(r.pid, 99)]


def test_a_rank_exit_is_a_point_with_its_status_when_known() -> None:
    r = Rank(2, 4)
    r.init()
    r.step(10 * MS, 20 * MS)
    r.t.handle(ExitRecord(r.pid, 30 * MS, 7))
    [exit_point] = r.metric(c.M_PROCESS_EXIT)
    assert exit_point.value == 7 and exit_point.attributes[c.EXIT_STATUS] == 7
    # It names the step the rank never entered: the instance after its last collective.
    [coll] = r.metric(c.M_COLLECTIVE)
    assert exit_point.attributes[c.CAUSAL_CHAIN_ID] == c.causal_chain_id(coll.attributes[c.COMM_ID], 1)
    killed = Rank(1, 4, pid=200)
    killed.init()
    killed.t.handle(ExitRecord(killed.pid, 30 * MS))  # a signal: no exit_group, status unknown
    [point] = killed.metric(c.M_PROCESS_EXIT)
    assert point.value == -1 and c.EXIT_STATUS not in point.attributes
    helper = Rank(0, 1, pid=300)  # a process that never used a communicator is not a rank's exit
    helper.call(FN.MALLOC, 1 * MS, 2 * MS)
    helper.t.handle(ExitRecord(helper.pid, 3 * MS, 0))
    assert helper.metric(c.M_PROCESS_EXIT) == []


def test_offcpu_and_launch_windows() -> None:
    r = Rank(0, 1)
    r.init()
    r.t.handle(OffCpuRecord(r.pid, r.pid + 1, 10 * MS, 14 * MS, 13 * MS, True, FN.STREAM_SYNC))
    [off] = r.metric(c.M_OFFCPU)
    assert off.value == pytest.approx(4.0) and off.attributes[c.OFFCPU_STATE] == "sleeping"
    assert off.attributes[c.CALL_IN_FLIGHT] == "cudaStreamSynchronize"
    assert off.attributes[c.RUNQ_MS] == pytest.approx(1.0) and off.attributes[c.TID] == r.pid + 1
    r.t.launch_counts({r.pid: (r.pid, 50)}, 100 * MS)  # a new thread: its quiet time starts
    r.t.launch_counts({r.pid: (r.pid, 80)}, 200 * MS)  # within LAUNCH_QUIET_NS: waits for a collective
    r.t.launch_counts({r.pid: (r.pid, 90)}, 100 * MS + LAUNCH_QUIET_NS)  # quiet since: a point
    r.t.launch_counts({r.pid: (r.pid, 90)}, 300 * MS + 2 * LAUNCH_QUIET_NS)  # nothing new: no point
    launches = r.metric(c.M_KERNEL_LAUNCHES)
    assert [p.value for p in launches] == [90]
    assert launches[0].attributes[c.WINDOW_NS] == LAUNCH_QUIET_NS


def test_a_preempted_interval_says_whether_a_traced_process_took_the_cpu() -> None:
    points: list[Any] = []
    env = EnvIdentity(rank=0, world_size=2, job_key="m:1")
    infos = {pid: ProcessInfo(pid, 7, env) for pid in (100, 200, 300)}
    groups = {100: 100, 201: 200, 999: 999}  # tid -> tgid: 201 is a thread of traced 200, 999 untraced
    clock = ClockConverter(realtime=lambda: 1_000_000_000_000, monotonic=lambda: 0)
    t = Tracker("node", clock, infos.get, lambda k, p: points.append(p), thread_group=groups.get)
    # 200 is a traced rank (it uses a communicator); 300 is traced but never made one (a helper process)
    t.handle(CallRecord(200, 200, FN.ALL_REDUCE, 1 * MS, 2 * MS, 0xC0, STREAM, 8, 7, 0))
    t.handle(CallRecord(300, 300, FN.STREAM_SYNC, 1 * MS, 2 * MS, 0, 0, 0, 0, 0))
    groups[301] = 300
    for by in (201, 301, 999, 4242, 0):
        t.handle(OffCpuRecord(100, 100, 10 * MS, 12 * MS, 0, False, FN.NONE, by))
    t.handle(OffCpuRecord(100, 100, 20 * MS, 22 * MS, 21 * MS, True, FN.NONE, 0))
    t.handle(OffCpuRecord(100, 100, 30 * MS, 33 * MS, 31 * MS, True, FN.NONE, 999))  # woken, behind 999
    offs = [p.attributes for p in points if p.metric_name == c.M_OFFCPU]
    assert [o.get(c.PREEMPTED_BY) for o in offs] == ["job", "other", "other", "other", None, None, "other"]
    assert [o[c.OFFCPU_STATE] for o in offs] == ["preempted"] * 5 + ["sleeping"] * 2
    assert offs[-1][c.RUNQ_MS] == pytest.approx(2.0)


def test_event_ids_are_stable_and_distinct() -> None:
    a, b = Rank(0, 1), Rank(0, 1)
    for r in (a, b):
        r.init()
        r.step(10 * MS, 20 * MS)
        r.step(30 * MS, 40 * MS)
    ids_a = [p.attributes[c.EVENT_ID] for _, p in a.points]
    assert ids_a == [p.attributes[c.EVENT_ID] for _, p in b.points]
    assert len(set(ids_a)) == len(ids_a)


class Node:
    """One node's agent: one tracker (its own node name and clock) over several rank processes.

    Local rank ``i`` runs as pid ``100 + i`` with start ticks 7 on *every* node, as containers do, so
    nothing but the node name tells two nodes' processes apart."""

    def __init__(self, name: str, ranks: list[int], world: int, boot_ns: int, mono_ns: int) -> None:
        self.points: list[tuple[Any, Any]] = []
        self.pids = {rank: 100 + i for i, rank in enumerate(ranks)}
        self.world, self.mono = world, mono_ns
        infos = {pid: ProcessInfo(pid, 7, EnvIdentity(job_key="m:1")) for pid in self.pids.values()}
        clock = ClockConverter(realtime=lambda: boot_ns, monotonic=lambda: 0)
        self.t = Tracker(name, clock, infos.get, lambda k, p: self.points.append((k, p)))

    def call(self, rank: int, fn: FN, ts: int, a0: int = 0, a1: int = 0, a2: int = 0, a3: int = 0) -> None:
        pid = self.pids[rank]
        self.t.handle(CallRecord(pid, pid, fn, self.mono + ts, self.mono + ts + 10_000, a0, a1, a2, a3, 0))

    def run(self, rank: int) -> None:
        """World init, a split by parity, 3 steps of an all-reduce, one child all-reduce, one send or
        receive between ranks 1 and 2; handles are this process's own pointers (they differ per rank)."""
        pid, world_h, child_h = self.pids[rank], 0xC000 + rank, 0xD000 + rank
        init = CallRecord(pid, pid, FN.COMM_INIT_RANK, self.mono + MS, self.mono + 2 * MS, 0, self.world,
                          rank, world_h, 0)
        self.t.handle(InitRecord(init, UID))
        split = CallRecord(pid, pid, FN.COMM_SPLIT, self.mono + 3 * MS, self.mono + 4 * MS, world_h,
                           rank % 2, rank, child_h, 0)
        self.t.handle(InitRecord(split, b"\0" * 128))
        for s in range(3):
            self.call(rank, FN.ALL_REDUCE, (10 + 100 * s + rank) * MS, a0=world_h, a1=STREAM, a2=1024, a3=7)
            self.call(rank, FN.STREAM_SYNC, (20 + 100 * s) * MS, a1=STREAM)
        self.call(rank, FN.ALL_REDUCE, 400 * MS, a0=child_h, a1=STREAM, a2=64, a3=7)
        if rank in (1, 2):
            peer = 3 - rank
            self.call(rank, FN.SEND if rank == 1 else FN.RECV, 410 * MS, a0=world_h, a1=STREAM, a2=16,
                      a3=7 | (peer << 16))
        self.call(rank, FN.STREAM_SYNC, 420 * MS, a1=STREAM)

    def by_rank(self, metric: str) -> dict[int, list[Any]]:
        ranks = {pid: rank for rank, pid in self.pids.items()}
        out: dict[int, list[Any]] = {rank: [] for rank in self.pids}
        for key, p in self.points:
            if p.metric_name == metric:
                out[ranks[key[0]]].append(p)
        return out


def three_nodes() -> list[Node]:
    """Six ranks on three nodes: a and b share a monotonic clock reading, c booted 5 h later; every
    node's realtime differs."""
    layout = {"node-a": [0, 1], "node-b": [2, 3], "node-c": [4, 5]}
    nodes = [Node(name, ranks, 6, boot_ns=1_700_000_000 * 10**9 + i * 37 * MS,
                  mono_ns=0 if name != "node-c" else 5 * 3600 * 10**9)
             for i, (name, ranks) in enumerate(layout.items())]
    for node in nodes:
        for rank in node.pids:
            node.run(rank)
    return nodes


def test_chain_ids_agree_across_nodes_without_root() -> None:
    nodes = three_nodes()
    colls = {r: ps for n in nodes for r, ps in n.by_rank(c.M_COLLECTIVE).items()}
    chains = {r: [p.attributes[c.CAUSAL_CHAIN_ID] for p in ps] for r, ps in colls.items()}
    world = {colls[r][0].attributes[c.COMM_ID] for r in range(6)}
    assert len(world) == 1, "ranks on different nodes disagree on the world communicator's id"
    (comm,) = world
    # The three world all-reduces: one id per instance, equal on all six ranks of the three nodes.
    for s in range(3):
        assert {chains[r][s] for r in range(6)} == {c.causal_chain_id(comm, s)}
    # The child all-reduce: one id per color (even ranks, odd ranks), each spanning nodes.
    child = {r: chains[r][3] for r in range(6)}
    assert child[0] == child[2] == child[4] != child[1] == child[3] == child[5]
    assert child[0].endswith(":0") and not child[0].startswith(comm)
    # Send on node-a, receive on node-b: one chain for the pair's first message.
    assert chains[1][4] == chains[2][4] == c.causal_chain_id(f"{comm}.1>2", 0)
    # Host events carry the step they happened in: the first step's syncs join on every node.
    syncs = {r: ps[0] for n in nodes for r, ps in n.by_rank(c.M_CUDA_SYNC).items()}
    assert {p.attributes[c.CAUSAL_CHAIN_ID] for p in syncs.values()} == {c.causal_chain_id(comm, 0)}


def test_event_ids_differ_across_nodes_whose_processes_look_alike() -> None:
    nodes = three_nodes()
    ids = [p.attributes[c.EVENT_ID] for n in nodes for _, p in n.points]
    assert len(ids) == len(set(ids)), "two events share an id: Echo would keep only one of them"
    # node-a and node-b saw byte-identical records from their local rank 0 (pid 100, same clock
    # reading): only the node name separates their ids.
    a, b = nodes[0].by_rank(c.M_CUDA_SYNC)[0], nodes[1].by_rank(c.M_CUDA_SYNC)[2]
    assert [p.timestamp_ns - nodes[0].t.clock.to_unix(0) for p in a] == [
        p.timestamp_ns - nodes[1].t.clock.to_unix(0) for p in b]
    assert not {p.attributes[c.EVENT_ID] for p in a} & {p.attributes[c.EVENT_ID] for p in b}


def test_event_id_follows_each_part_of_the_event() -> None:
    def malloc_ids(start_ticks: int = 7, tid: int = 100, ts: int = 50 * MS, steps: int = 0) -> list[str]:
        r = Rank(0, 1, start=start_ticks)
        r.init()
        for s in range(steps):
            r.step((10 + 10 * s) * MS, (15 + 10 * s) * MS)
        r.t.handle(CallRecord(r.pid, tid, FN.MALLOC, ts, ts + MS, 0, 0, 64, 0, 0))
        r.t.handle(CallRecord(r.pid, tid, FN.FREE, ts, ts + MS, 0, 0, 0, 0, 0))
        return [p.attributes[c.EVENT_ID] for p in r.metric(c.M_CUDA_MALLOC) + r.metric(c.M_CUDA_FREE)]

    base = malloc_ids()
    assert base == malloc_ids(), "the same event must get the same id (a resend is stored once)"
    assert base[0] != base[1]  # metric: a malloc and a free at the same instant on the same thread
    variants = {
        "process start (a reused pid)": malloc_ids(start_ticks=8),
        "thread": malloc_ids(tid=101),
        "timestamp": malloc_ids(ts=50 * MS + 1),
        "step (causal chain)": malloc_ids(steps=1),
    }
    for part, other in variants.items():
        assert not set(other) & set(base), f"the event id ignores the {part}"


def test_event_id_is_the_hash_of_its_documented_parts() -> None:
    looked_up: list[int] = []
    r = Rank(0, 1, thread_name=lambda pid, tid: looked_up.append(tid) or f"worker-{pid}.{tid}")
    r.call(FN.MALLOC, 5 * MS, 6 * MS, a2=64)  # before any communicator: no chain
    r.init()
    r.step(10 * MS, 20 * MS)
    r.step(30 * MS, 40 * MS)
    [malloc] = r.metric(c.M_CUDA_MALLOC)
    assert malloc.attributes[c.EVENT_ID] == short_hash("node", (100, 7), c.M_CUDA_MALLOC, 100, 5 * MS, "")
    assert malloc.attributes[c.THREAD_NAME] == "worker-100.100" and looked_up == [100]  # read once per thread
    [health] = r.metric(c.M_HEALTH)  # a per-process point: no thread, thread 0 in the id
    assert c.TID not in health.attributes and c.THREAD_NAME not in health.attributes
    chain = health.attributes[c.CAUSAL_CHAIN_ID]
    assert health.attributes[c.EVENT_ID] == short_hash("node", (100, 7), c.M_HEALTH, 0, 40 * MS, chain)


def test_a_process_with_a_known_start_gets_the_id_echo_recomputes() -> None:
    """contract.event_id over what the point carries (Echo rebuilds it from the typed row and stores no
    id); a reused pid (another start) and every other part change it."""

    def ids(start_ns: int = 1_700_000_000 * 10**9, tid: int = 100, ts: int = 50 * MS) -> list[str]:
        r = Rank(0, 1, start_ns=start_ns)
        r.init()
        r.t.handle(CallRecord(r.pid, tid, FN.MALLOC, ts, ts + MS, 0, 0, 64, 0, 0))
        r.step(ts + 2 * MS, ts + 3 * MS)
        points = r.metric(c.M_CUDA_MALLOC) + r.metric(c.M_COLLECTIVE)
        for p in points:
            attrs = p.attributes
            assert attrs[c.EVENT_ID] == c.event_id("node", r.pid, start_ns, p.metric_name, attrs.get(c.TID),
                                                   p.timestamp_ns, attrs.get(c.CAUSAL_CHAIN_ID))  # fmt: skip
        return [p.attributes[c.EVENT_ID] for p in points]

    base = ids()
    assert len(base) == len(set(base)) == 2 and base == ids()
    for other in (ids(start_ns=1_700_000_001 * 10**9), ids(ts=50 * MS + 1)):  # both points moved
        assert not set(other) & set(base)
    assert ids(tid=101)[0] != base[0]  # the malloc's thread (the collective's stays)


def test_short_hash_is_pinned_and_unambiguous() -> None:
    # Spooled batches replay after an agent upgrade, and during a rolling upgrade two nodes run different
    # agent versions that must still agree on comm ids: the derivations must not drift between versions.
    assert short_hash("node-a", (100, 7), c.M_CUDA_MALLOC, 100, 5, "") == "ddea9d0840ec3a58"
    assert unique_id_hash(UID) == "3de787eeed5d7ad9"
    assert split_child_id("p", 0, 1) == "6e0025218a100632"
    assert unaligned_comm_id("m:1", 8, 0) == "820cef9ea640131f"
    assert len(short_hash("x")) == 16 and short_hash(b"x") == short_hash("x")
    assert short_hash("ab", "c") != short_hash("a", "bc") != short_hash("abc")
    assert unique_id_hash(UID) != unique_id_hash(UID[:-1] + b"\1")
    assert split_child_id("p", 0, 1) not in {split_child_id("p", 1, 1), split_child_id("p", 0, 0),
                                             split_child_id("q", 0, 1)}
    assert unaligned_comm_id("m:1", 8, 0) not in {unaligned_comm_id("m:2", 8, 0),
                                                  unaligned_comm_id("m:1", 4, 0),
                                                  unaligned_comm_id("m:1", 8, 1)}


def test_health_drops_for_a_slow_step_only() -> None:
    h = StepHealth()
    scores = [h.step(90 * MS).score for _ in range(5)]
    assert scores == [1.0] * 5
    slow = h.step(380 * MS)
    assert slow.score == pytest.approx(90 / 380, abs=1e-3) and slow.baseline_ns == 90 * MS
    assert h.step(90 * MS).score == 1.0
    assert score(100, 100, 50, False) == 0.5
    assert score(100, 100, 0, True) == 0.7
    assert 0.0 <= score(10, 1000, 10**9, True) <= 1.0


def test_environment_and_stat_parsing(tmp_path: Path) -> None:
    raw = b"RANK=5\0WORLD_SIZE=8\0LOCAL_RANK=1\0MASTER_ADDR=10.0.0.1\0MASTER_PORT=29500\0junk\0"
    env = parse_environ(raw)
    ident = env_identity(env)
    assert (ident.rank, ident.world_size, ident.local_rank, ident.job_key) == (5, 8, 1, "10.0.0.1:29500")
    slurm = env_identity({"SLURM_PROCID": "3", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3"})
    assert (slurm.rank, slurm.world_size) == (3, 16)
    assert env_identity({"RANK": "x"}).rank is None
    stat = "42 (python (x) y) S " + " ".join(str(i) for i in range(4, 60))
    assert parse_stat_start(stat) == 22
    proc = tmp_path / "42"
    proc.mkdir()
    (proc / "stat").write_text(stat)
    (proc / "environ").write_bytes(b"OMPI_COMM_WORLD_RANK=2\0OMPI_COMM_WORLD_SIZE=4\0")
    info = read_process(str(tmp_path), 42)
    assert info is not None and info.key == (42, 22) and info.env.rank == 2
    assert read_process(str(tmp_path), 43) is None


def test_clock_offset_takes_the_narrowest_bracket_and_the_test_knob() -> None:
    reads = iter([100, 10, 140, 200, 20, 202])  # widths 40 and 2: the second bracket wins
    sample = measure_offset(2, realtime=lambda: next(reads), monotonic=lambda: next(reads))
    assert sample.offset_ns == 201 - 20 and sample.uncertainty_ns == 1
    real = ClockConverter()
    skewed = ClockConverter(extra_offset_ns=250 * MS)
    assert abs(skewed.to_unix(0) - real.to_unix(0) - 250 * MS) < MS


def test_launches_ride_on_each_steps_first_collective_and_none_is_lost() -> None:
    r = Rank(0, 1)
    r.init()
    r.t.handle(CallRecord(r.pid, r.pid, FN.ALL_REDUCE, 10 * MS, 11 * MS, 0xC0, STREAM, 1, 7, 0, launches=30))
    r.call(FN.STREAM_SYNC, 11 * MS, 12 * MS)  # the step ends
    r.t.launch_counts({r.pid: (r.pid, 30)}, 12 * MS)  # no launch since the collective: no point
    r.t.launch_counts({r.pid: (r.pid, 42)}, 13 * MS)  # the next step's collective carries these
    assert r.metric(c.M_KERNEL_LAUNCHES) == []
    r.t.handle(CallRecord(r.pid, r.pid, FN.ALL_REDUCE, 20 * MS, 21 * MS, 0xC0, STREAM, 1, 7, 0, launches=60))
    r.t.launch_counts({r.pid: (r.pid, 5)}, 22 * MS)  # the map entry was recycled: counting restarts
    r.t.launch_counts({r.pid: (r.pid, 9)}, 23 * MS, final=True)  # the agent stops: the rest goes out
    launches = r.metric(c.M_KERNEL_LAUNCHES)
    assert [p.value for p in launches] == [5, 4]
    assert launches[1].attributes[c.WINDOW_NS] == 1 * MS
    r.t.close()
    assert [p.attributes.get(c.LAUNCHES) for p in r.metric(c.M_COLLECTIVE)] == [30, 30]
