"""How the tracker derives comm ids and causal chain ids in the less common shapes (synthetic records).

Each value is checked against the derivation itself (``split_child_id``, ``unaligned_comm_id``, the
pair sequence of point-to-point calls), not only for agreement between ranks: two ranks that agree on a
wrong id still join the wrong collectives. Found by mutation testing (docs/testing.md).
"""

from __future__ import annotations

from typing import Any

from test_agent_tracker import MS, STREAM, UID, Rank

from rankecho.agent.events import FN, CallRecord, InitRecord
from rankecho.agent.identity import short_hash, split_child_id, unaligned_comm_id, unique_id_hash
from rankecho.shared import contract as c

NOCOLOR = 0xFFFFFFFF  # NCCL_SPLIT_NOCOLOR (-1) as the uint32 the probe reads


def split(r: Rank, parent: int, color: int, child: int, ts: int, rc: int = 0) -> None:
    rec = CallRecord(r.pid, r.pid, FN.COMM_SPLIT, ts, ts + MS, parent, color, r.rank, child, rc)
    r.t.handle(InitRecord(rec, b"\0" * 128))


def inits(r: Rank) -> list[dict[str, Any]]:
    return [p.attributes for p in r.metric(c.M_COMM_INIT)]


def test_split_children_follow_ordinal_and_color() -> None:
    ranks = [Rank(k, 4, pid=100 + k, node=f"node-{k // 2}") for k in range(4)]
    for r in ranks:
        r.init()
        split(r, 0xC0, r.rank % 2, 0xD0, 2 * MS)  # first split: by parity
        split(r, 0xC0, NOCOLOR, 0xBAD, 3 * MS)  # second: no part in it (whatever the handle slot held)
        split(r, 0xC0, 0, 0xE0, 4 * MS)  # third: everyone, color 0
        split(r, 0xC0, 1, 0xF0, 5 * MS, rc=3)  # a failed split registers nothing
        r.call(FN.ALL_REDUCE, 10 * MS, 11 * MS, a0=0xD0, a1=STREAM)
        r.call(FN.ALL_REDUCE, 12 * MS, 13 * MS, a0=0xE0, a1=STREAM)
        r.call(FN.ALL_REDUCE, 14 * MS, 15 * MS, a0=0xF0, a1=STREAM)
        r.call(FN.STREAM_SYNC, 16 * MS, 17 * MS, a1=STREAM)
    world = inits(ranks[0])[0][c.COMM_ID]
    assert world == unique_id_hash(UID)
    for r in ranks:
        a = inits(r)[:3]  # (the failed split is reported too, but not registered)
        assert {k for k, p in r.points if p.metric_name == c.M_COMM_INIT} == {(r.pid, 7)}
        assert [(p.value, p.attributes[c.TID]) for p in r.metric(c.M_COMM_INIT)] == [(1.0, r.pid)] * 4
        assert [x[c.COMM_ID] for x in a] == [world, split_child_id(world, 0, r.rank % 2),
                                            split_child_id(world, 2, 0)]
        assert [x[c.CAUSAL_CHAIN_ID] for x in a] == [c.causal_chain_id(x[c.COMM_ID], 0) for x in a]
        assert all(x[c.PARENT_COMM_ID] == world for x in a[1:]) and c.PARENT_COMM_ID not in a[0]
        r.call(FN.ALL_REDUCE, 20 * MS, 21 * MS, a0=0xBAD, a1=STREAM)
        r.call(FN.STREAM_SYNC, 22 * MS, 23 * MS, a1=STREAM)
        *colls, on_failed, on_nocolor = [p.attributes for p in r.metric(c.M_COLLECTIVE)]
        assert on_nocolor[c.SEQ_ALIGNED] is False
        assert [x[c.COMM_ID] for x in colls] == [x[c.COMM_ID] for x in a[1:]]
        assert all(x[c.SEQ_ALIGNED] is True and x[c.SEQ] == 0 for x in colls)
        assert on_failed[c.SEQ_ALIGNED] is False  # the failed split's handle stayed unknown


def test_a_failed_init_registers_no_communicator() -> None:
    r = Rank(0, 2, env_rank=0)
    rec = CallRecord(r.pid, r.pid, FN.COMM_INIT_RANK, MS, 2 * MS, 0, 2, 0, 0xC0, 5)
    r.t.handle(InitRecord(rec, UID))
    r.step(10 * MS, 20 * MS)
    [coll] = r.metric(c.M_COLLECTIVE)
    assert coll.attributes[c.SEQ_ALIGNED] is False  # the handle stayed unknown


def test_comm_init_all_is_one_communicator_per_process() -> None:
    def run(pid: int, handles: list[int], ndev: int | None = None) -> Rank:
        r = Rank(0, 1, pid=pid, node="node-x")
        r.call(FN.MALLOC, MS // 2, MS // 2 + 10, a2=64)  # a point before the init: no rank known yet
        payload = b"".join(h.to_bytes(8, "little") for h in handles)[:128].ljust(128, b"\0")
        rec = CallRecord(pid, pid, FN.COMM_INIT_ALL, MS, 2 * MS, 0, ndev or len(handles), 0, 0, 0)
        r.t.handle(InitRecord(rec, payload))
        for k, h in enumerate(handles[:16]):
            r.call(FN.ALL_REDUCE, (10 + k) * MS, (10 + k) * MS + 1000, a0=h, a1=STREAM)
        r.call(FN.STREAM_SYNC, 30 * MS, 31 * MS, a1=STREAM)
        return r

    r = run(100, [0xA0, 0, 0xB0])  # the second device's handle is NULL: it has no communicator
    group = short_hash("init-all", "node-x", (100, 7))
    assert [(x[c.COMM_ID], x[c.COMM_RANK], x[c.COMM_NRANKS]) for x in inits(r)] == [
        (group, k, 3) for k in range(3)]
    colls = [p.attributes for p in r.metric(c.M_COLLECTIVE)]
    assert [(x[c.COMM_ID], x.get(c.COMM_RANK), x[c.SEQ_ALIGNED]) for x in colls] == [
        (group, 0, True), (unaligned_comm_id("m:1", None, 0), None, False), (group, 2, True)]
    assert r.t.resources[(100, 7)][c.RANK] == 0 and r.t.resources[(100, 7)][c.NRANKS] == 3
    assert inits(run(101, [0xA0]))[0][c.COMM_ID] != group  # another process: another communicator
    many = run(102, [0x1000 + 8 * k for k in range(20)], ndev=20)  # the record carries 16 handles
    assert len(inits(many)) == 16 and {x[c.COMM_NRANKS] for x in inits(many)} == {16}
    # Each 8-byte handle is read whole, and only it.
    colls = [p.attributes for p in many.metric(c.M_COLLECTIVE)]
    assert [(x[c.COMM_RANK], x[c.SEQ_ALIGNED]) for x in colls] == [(k, True) for k in range(16)]


def test_comms_seen_before_init_are_guessed_the_same_way_on_every_rank() -> None:
    def run(rank: int, job: str = "m:1") -> Rank:
        r = Rank(rank, 8, pid=100 + rank, env_rank=rank, job_key=job)
        for s in range(2):  # the same unknown handle twice, then a second unknown handle
            r.call(FN.ALL_REDUCE, (10 + 20 * s) * MS, (11 + 20 * s) * MS, a0=0xEE, a1=STREAM)
            r.call(FN.STREAM_SYNC, (12 + 20 * s) * MS, (13 + 20 * s) * MS, a1=STREAM)
        r.call(FN.ALL_REDUCE, 50 * MS, 51 * MS, a0=0x77, a1=STREAM)
        r.call(FN.ALL_REDUCE, 52 * MS, 53 * MS, a0=0x78, a1=STREAM)
        r.call(FN.STREAM_SYNC, 54 * MS, 55 * MS, a1=STREAM)
        r.call(FN.MALLOC, 56 * MS, 57 * MS, a2=64)
        return r

    first, second, third = (unaligned_comm_id("m:1", 8, n) for n in range(3))
    for rank in (3, 5):
        r = run(rank)
        colls = [p.attributes for p in r.metric(c.M_COLLECTIVE)]
        assert [(x[c.COMM_ID], x[c.SEQ], x[c.COMM_RANK], x[c.COMM_NRANKS]) for x in colls] == [
            (first, 0, rank, 8), (first, 1, rank, 8), (second, 0, rank, 8), (third, 0, rank, 8)]
        # The first comm seen is the primary: it counts the steps the host events belong to.
        [malloc] = r.metric(c.M_CUDA_MALLOC)
        assert malloc.attributes[c.CAUSAL_CHAIN_ID] == c.causal_chain_id(first, 2)
        assert [p.attributes[c.CAUSAL_CHAIN_ID] for p in r.metric(c.M_HEALTH)] == [
            c.causal_chain_id(first, 1)]
    other = run(3, job="n:2")
    assert other.metric(c.M_COLLECTIVE)[0].attributes[c.COMM_ID] == unaligned_comm_id("n:2", 8, 0) != first


def test_point_to_point_pairs_count_their_own_sequences() -> None:
    ranks = [Rank(k, 2, pid=100 + k, node=f"node-{k}") for k in range(2)]
    for r in ranks:
        r.init()
        peer = 1 - r.rank
        for ts, sender in ((10, 0), (20, 0), (30, 1)):
            fn = FN.SEND if r.rank == sender else FN.RECV
            r.call(fn, ts * MS, ts * MS + 1000, a0=0xC0, a1=STREAM, a2=16, a3=7 | (peer << 16))
        r.call(FN.STREAM_SYNC, 40 * MS, 41 * MS, a1=STREAM)
        r.call(FN.MALLOC, 42 * MS, 43 * MS, a2=64)
    comm = inits(ranks[0])[0][c.COMM_ID]
    expected = [c.causal_chain_id(f"{comm}.0>1", 0), c.causal_chain_id(f"{comm}.0>1", 1),
                c.causal_chain_id(f"{comm}.1>0", 0)]
    for r in ranks:
        colls = [p.attributes for p in r.metric(c.M_COLLECTIVE)]
        assert [x[c.CAUSAL_CHAIN_ID] for x in colls] == expected
        assert [(x[c.SEQ], x[c.PEER]) for x in colls] == [(0, 1 - r.rank), (1, 1 - r.rank), (0, 1 - r.rank)]
        # Point-to-point calls do not end a step: host events stay in the world comm's step 0.
        assert r.metric(c.M_CUDA_MALLOC)[0].attributes[c.CAUSAL_CHAIN_ID] == c.causal_chain_id(comm, 0)
        assert not r.metric(c.M_HEALTH)


def test_which_syncs_complete_a_collective() -> None:
    r = Rank(0, 1)
    r.init()
    r.call(FN.ALL_REDUCE, 10 * MS, 11 * MS, a0=0xC0, a1=STREAM)
    r.t.handle(CallRecord(r.pid, r.pid, FN.STREAM_SYNC, 11 * MS - 500, 11 * MS - 100, 0, STREAM, 0, 0, 0))
    assert not r.metric(c.M_COLLECTIVE)  # the sync returned before the collective did
    r.t.handle(CallRecord(r.pid, r.pid, FN.STREAM_SYNC, 11 * MS, 11 * MS + 1000, 0, 0, 0, 0, 0))
    [coll] = r.metric(c.M_COLLECTIVE)  # stream 0, the legacy default stream, waits for every stream
    assert coll.attributes[c.COMPLETE_NS] == r.t.clock.to_unix(11 * MS + 1000)
    r.call(FN.ALL_REDUCE, 20 * MS, 21 * MS, a0=0xC0, a1=STREAM)
    r.t.handle(CallRecord(r.pid, 4242, FN.DEVICE_SYNC, 21 * MS, 21 * MS, 0, 0, 0, 0, 0))
    second = r.metric(c.M_COLLECTIVE)[1]  # a device sync returning the instant the call did completes it
    assert second.attributes[c.COMPLETE_NS] == r.t.clock.to_unix(21 * MS)
    syncs = r.metric(c.M_CUDA_SYNC)
    assert [s.attributes.get(c.STREAM) for s in syncs] == [STREAM, 0, None]
    assert [s.attributes[c.TID] for s in syncs] == [r.pid, r.pid, 4242]
    assert [s.value for s in syncs] == [400 / 1e6, 1000 / 1e6, 0.0]


def test_collective_attributes() -> None:
    r = Rank(0, 2)
    r.init()
    r.call(FN.ALL_REDUCE, 10 * MS, 11 * MS, a0=0xC0, a1=STREAM, a2=1024, a3=7 | 4 << 8)  # float32, avg
    r.call(FN.GROUP_START, 12 * MS, 12 * MS)
    r.call(FN.BROADCAST, 13 * MS, 14 * MS, a0=0xC0, a1=STREAM, a2=10, a3=99 | 1 << 16)  # bad dtype, root 1
    r.call(FN.GROUP_END, 15 * MS, 15 * MS)
    r.call(FN.ALL_GATHER, 16 * MS, 17 * MS, a0=0xC0, a1=STREAM, a2=8, a3=12 | 9 << 8)  # past the tables
    r.call(FN.ALL_REDUCE, 18 * MS, 19 * MS, a0=0xC0, a1=STREAM, a2=8, a3=7 | 5 << 8)  # a PreMulSum op
    r.call(FN.STREAM_SYNC, 20 * MS, 21 * MS, a1=STREAM)
    ar, bc, ag, custom = (p.attributes for p in r.metric(c.M_COLLECTIVE))
    assert c.REDUCE_OP not in custom  # ops past the five built-ins are created at run time: no name
    assert (ar[c.DATATYPE], ar[c.BYTES], ar[c.REDUCE_OP], ar[c.COMM_RANK], ar[c.COMM_NRANKS]) == (
        "float32", 4096, "avg", 0, 2)
    assert c.PEER not in ar and c.IN_GROUP not in ar and c.IN_GROUP not in ag
    assert (bc[c.DATATYPE], bc[c.PEER], bc[c.IN_GROUP]) == ("99", 1, True) and c.BYTES not in bc
    assert c.REDUCE_OP not in bc and c.REDUCE_OP not in ag and c.PEER not in ag
    assert (ag[c.DATATYPE], c.BYTES in ag) == ("12", False)


def test_launch_windows_close_only_at_the_primary_comms_step() -> None:
    r = Rank(0, 2)
    r.init()
    split(r, 0xC0, 0, 0xD0, 2 * MS)
    child = CallRecord(r.pid, r.pid, FN.ALL_REDUCE, 10 * MS, 11 * MS, 0xD0, STREAM, 8, 7, 0, launches=30)
    r.t.handle(child)  # the child's first collective (seq 0, like the step's) does not end the window
    world = CallRecord(r.pid, r.pid, FN.ALL_REDUCE, 12 * MS, 13 * MS, 0xC0, STREAM, 8, 7, 0, launches=42)
    r.t.handle(world)
    assert r.metric(c.M_KERNEL_LAUNCHES) == []  # the step's window rides on its first collective
    r.t.close()
    by_comm = {p.attributes[c.COMM_ID]: p.attributes for p in r.metric(c.M_COLLECTIVE)}
    world_comm = inits(r)[0][c.COMM_ID]
    assert by_comm[world_comm][c.LAUNCHES] == 42
    assert by_comm[world_comm][c.CAUSAL_CHAIN_ID] == c.causal_chain_id(world_comm, 0)
    assert [a for comm, a in by_comm.items() if comm != world_comm and c.LAUNCHES in a] == []
