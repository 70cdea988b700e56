"""A restarted agent names the communicators its predecessor saw created (agent/journal.py).

Found (issue 9): after a kill -9 and restart mid-run the agent guessed a different communicator id for
every communicator it had not seen created, so its ranks' collectives stopped joining the others'
(416 of ~2,500 instances complete). With the journal the id, the rank in the communicator and its size
are the ones from before; only the sequence counts from the attach (``seq_aligned=false``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankecho.agent.clock import ClockConverter
from rankecho.agent.events import FN, CallRecord, InitRecord
from rankecho.agent.identity import EnvIdentity, ProcessInfo
from rankecho.agent.journal import CommJournal
from rankecho.agent.tracker import Tracker
from rankecho.shared import contract as c

MS = 1_000_000
UID = b"unique-id-of-the-world-comm".ljust(128, b"\0")
STREAM, WORLD, CHILD = 0xC0, 0xD0, 0xE0
PID, START = 100, 7


class AgentRun:
    """One agent run tracing rank ``rank`` of a 4-rank job (process PID, started at START)."""

    def __init__(self, journal: Path, rank: int, alive: bool = True, env_rank: int | None = None) -> None:
        self.points: list[Any] = []
        env = EnvIdentity(rank=env_rank, world_size=4 if env_rank is not None else None, job_key="m:1")
        infos = {PID: ProcessInfo(PID, START, env)}
        clock = ClockConverter(realtime=lambda: 1_000_000_000_000, monotonic=lambda: 0)
        self.journal = CommJournal(journal, alive=lambda pid: alive and pid == PID)
        self.t = Tracker("node", clock, infos.get, lambda k, p: self.points.append(p), journal=self.journal)
        self.rank = rank

    def call(self, fn: FN, ts: int, ts2: int, a0: int = 0, a1: int = 0, a2: int = 0, a3: int = 0) -> None:
        self.t.handle(CallRecord(PID, PID, fn, ts, ts2, a0, a1, a2, a3, 0))

    def create(self) -> None:
        init = CallRecord(PID, PID, FN.COMM_INIT_RANK, MS, 2 * MS, 0, 4, self.rank, WORLD, 0)
        self.t.handle(InitRecord(init, UID))
        split = CallRecord(
            PID, PID, FN.COMM_SPLIT, 3 * MS, 4 * MS, WORLD, self.rank % 2, self.rank // 2, CHILD, 0
        )
        self.t.handle(InitRecord(split, b"\0" * 128))

    def step(self, at_ms: int, handle: int) -> None:
        self.call(FN.ALL_REDUCE, at_ms * MS, at_ms * MS + 10_000, a0=handle, a1=STREAM, a2=1024, a3=7)
        self.call(FN.STREAM_SYNC, at_ms * MS + 20_000, (at_ms + 5) * MS, a1=STREAM)

    def collectives(self) -> list[dict[str, Any]]:
        return [dict(p.attributes) for p in self.points if p.metric_name == c.M_COLLECTIVE]


def test_a_restarted_agent_keeps_communicator_ids_ranks_and_sizes(tmp_path: Path) -> None:
    journal = tmp_path / "comms.jsonl"
    before = AgentRun(journal, rank=3)
    before.create()
    for s in range(3):
        before.step(10 + 10 * s, WORLD)
        before.step(15 + 10 * s, CHILD)
    old = {a[c.COMM_ID]: a for a in before.collectives()}  # kill -9 here: nothing more from this run
    after = AgentRun(journal, rank=3)  # no RANK in the environment: the rank must come from the journal
    after.step(200, WORLD)
    after.step(205, CHILD)
    world, child = after.collectives()
    assert world[c.COMM_ID] in old and child[c.COMM_ID] in old and world[c.COMM_ID] != child[c.COMM_ID]
    assert world[c.SEQ_ALIGNED] is False and child[c.SEQ_ALIGNED] is False
    # seq counts from the attach, so chain ids stay apart from the exact ones: no false raw joins
    assert not world[c.CAUSAL_CHAIN_ID].startswith(world[c.COMM_ID])
    assert old[child[c.COMM_ID]][c.SEQ_ALIGNED] is True
    assert after.t.resources[(PID, START)][c.RANK] == 3
    # a communicator split after the restart gets the id every other rank computes
    split = CallRecord(PID, PID, FN.COMM_SPLIT, 300 * MS, 301 * MS, WORLD, 0, 0, 0xF0, 0)
    after.t.handle(InitRecord(split, b"\0" * 128))
    fresh = AgentRun(tmp_path / "other.jsonl", rank=3)
    fresh.create()
    fresh.t.handle(InitRecord(split, b"\0" * 128))
    inits = [
        [p.attributes[c.COMM_ID] for p in r.points if p.metric_name == c.M_COMM_INIT] for r in (after, fresh)
    ]
    assert inits[0][-1] == inits[1][-1]


def test_without_the_journal_entry_the_id_is_a_guess_and_exited_processes_are_dropped(tmp_path: Path) -> None:
    journal = tmp_path / "comms.jsonl"
    before = AgentRun(journal, rank=1)
    before.create()
    before.step(10, WORLD)
    known = before.collectives()[0][c.COMM_ID]
    gone = AgentRun(journal, rank=1, alive=False, env_rank=1)  # the process exited meanwhile
    assert journal.read_text() == ""  # compacted away
    gone.step(50, WORLD)
    assert gone.collectives()[0][c.COMM_ID] != known


def test_a_line_cut_by_a_kill_is_skipped(tmp_path: Path) -> None:
    journal = tmp_path / "comms.jsonl"
    before = AgentRun(journal, rank=2)
    before.create()
    with journal.open("a") as f:
        f.write('{"pid": 100, "started": 7, "han')
    after = AgentRun(journal, rank=2)
    assert after.journal.lookup((PID, START), WORLD) is not None


def test_a_restored_communicator_keeps_all_the_journal_knew_through_another_restart(tmp_path: Path) -> None:
    """What the journal restores (rank, size, parent, that the id is exact) is used and written back: a
    point sent before the first collective does not leave the process's resource without its rank, a
    split of a restored communicator counts as seen created, and a later restart still finds the parent."""
    journal = tmp_path / "comms.jsonl"
    before = AgentRun(journal, rank=3)
    before.create()
    before.step(10, WORLD)
    before.step(15, CHILD)
    old = {a[c.COMM_ID]: a for a in before.collectives()}
    known_child = before.journal.lookup((PID, START), CHILD)
    assert known_child is not None and known_child.parent_id is not None
    after = AgentRun(journal, rank=3)
    after.call(FN.STREAM_SYNC, 100 * MS, 180 * MS, a1=STREAM)  # a long sync: sent before any collective
    assert c.RANK not in after.t.resources[(PID, START)]  # nothing says the rank yet
    after.step(200, WORLD)
    after.step(205, CHILD)
    for point in after.collectives():
        for key in (c.COMM_RANK, c.COMM_NRANKS):
            assert point.get(key) == old[point[c.COMM_ID]].get(key)
    assert after.collectives()[0][c.COMM_NRANKS] == 4
    resource = after.t.resources[(PID, START)]
    assert (resource[c.RANK], resource[c.NRANKS]) == (3, 4)
    grandchild = CallRecord(PID, PID, FN.COMM_SPLIT, 300 * MS, 301 * MS, CHILD, 0, 0, 0xF0, 0)
    after.t.handle(InitRecord(grandchild, b"\0" * 128))
    after.step(310, 0xF0)
    assert after.collectives()[-1][c.SEQ_ALIGNED] is True  # its parent's id is exact: counted from 0
    again = AgentRun(journal, rank=3)
    child = again.journal.lookup((PID, START), CHILD)
    assert child is not None and (child.parent_id, child.splits) == (known_child.parent_id, 1)
    assert again.journal.lookup((PID, START), 0xF0) is not None
