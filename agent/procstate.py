"""Per-process state the tracker keeps: communicators, collectives awaiting a sync, step progress."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankecho.agent.events import CallRecord
from rankecho.agent.health import StepHealth
from rankecho.agent.identity import ProcessInfo
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue

ProcKey = tuple[int, int]


@dataclass
class Comm:
    """One communicator as seen by one rank."""

    comm_id: str
    rank: int | None
    nranks: int | None
    aligned: bool
    parent_id: str | None = None
    seq: int = 0
    splits: int = 0
    p2p: dict[tuple[int, int], int] = field(default_factory=dict)
    id_restored: bool = False
    """Created before this agent attached, but its id, rank and size came from the journal of an earlier
    agent run (:mod:`rankecho.agent.journal`): the id is exact, only ``seq`` counts from the attach."""
    chain_comm: str | None = None
    """The id chain ids are built from when it is not ``comm_id`` (a restored comm: see tracker)."""
    last_return_ns: int | None = None
    """When this rank's latest call on the communicator returned (monotonic ns): a pre-call window's start."""
    last_complete_ns: int | None = None
    """When a sync completed this rank's latest call on it (None while none has)."""

    @property
    def chain_base(self) -> str:
        return self.chain_comm or self.comm_id


@dataclass
class Pending:
    """A collective that returned but whose work no sync has waited for yet."""

    rec: CallRecord
    chain: str
    attrs: dict[str, AttrValue]
    primary: bool
    comm: Comm | None = None


@dataclass
class Proc:
    info: ProcessInfo
    comms: dict[int, Comm] = field(default_factory=dict)
    primary: Comm | None = None
    unknown_comms: int = 0
    rank: int | None = None
    nranks: int | None = None
    pending: list[Pending] = field(default_factory=list)
    step_seq: int = 0
    """Sequence number (on the primary comm) of the step in progress: last completed + 1."""
    last_completion_ns: int | None = None
    preempted_ns: int = 0
    health: StepHealth = field(default_factory=StepHealth)
    health_steps: int = 0
    health_sent: float | None = None
    """The last health score sent (scores go out every Nth step, or when they move)."""
    group_depth: dict[int, int] = field(default_factory=dict)
    launches: dict[int, tuple[int, int]] = field(default_factory=dict)
    """tid -> (cumulative count, monotonic ns) at the last window."""
    threads: dict[int, str] = field(default_factory=dict)
    resource_stale: bool = True
    caller_tid: int = 0
    """The thread that entered its latest collective (the one a hang leaves stuck): the heartbeat's."""
    last_enter_ns: int | None = None
    """When it entered its latest collective (monotonic ns): how long the rank has been quiet."""

    @property
    def key(self) -> ProcKey:
        return self.info.key

    def step_chain(self) -> str | None:
        if self.primary is None:
            return None
        return c.causal_chain_id(self.primary.chain_base, self.step_seq)
