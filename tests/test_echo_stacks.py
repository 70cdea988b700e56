"""A 4-rank job whose rank 3 stalls in cudaMalloc (``allocate_cache``) every third step, as the agent's
points say it with call stacks (docs/contract.md): collectives with the pre-call breakdown and its stack
ids, raw intervals with their stacks, and each distinct stack shipped once per node as a
``rankecho.stack`` point. Sent to a real Echo over OTLP/gRPC by the stack tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from echo_helpers import TEST_TOKEN, grpc_export

from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request
from rankecho.shared.stacks import join_frames, stack_id

T0 = 1_790_000_000_000_000_000  # 2026-09-21: Echo refuses times ahead of its clock
STEP_NS = 100_000_000
STEPS = 30
WORLD = 4
LATE_RANK = 3
LATE_NS = 40_000_000
COMM = "w0rld"
JOB = "torchelastic:stacks"

ALLOC = ["cudaMalloc", "allocate_cache", "train.py:forward:88", "train.py:train_step:120", "train.py:main:200"]
FETCH = ["__clock_nanosleep", "fetch_batch", "train.py:train_step:110", "train.py:main:200"]
FORWARD = ["forward", "train.py:train_step:115", "train.py:main:200"]
ENTER = ["ncclAllReduce", "train.py:train_step:130", "train.py:main:200"]
NEVER_SHIPPED = ["mystery", "[unknown]"]
ALLOC_LEAD = "cudaMalloc <- allocate_cache <- train.py:forward:88 <- train.py:train_step:120"


def late(rank: int, seq: int) -> bool:
    return rank == LATE_RANK and seq % 3 == 1


def jitter(rank: int, seq: int) -> int:
    """A deterministic +-0.3 ms of arrival noise, so the job has a noise level to measure."""
    return ((rank * 7919 + seq * 104729) % 601 - 300) * 1000


def node_of(rank: int) -> str:
    return f"node-{rank // 2}"


def resource(rank: int) -> dict[str, Any]:
    return {c.CLUSTER_NAME: "c1", c.NODE_NAME: node_of(rank), c.RANK: rank, c.NRANKS: WORLD,
            c.PROCESS_PID: 1000 + rank, c.PROCESS_START_NS: 777, c.SERVICE_INSTANCE_ID: f"{node_of(rank)}/1",
            c.JOB_ID: JOB}  # fmt: skip


def stack_point(frames: list[str], at_ns: int, truncated: bool = False) -> Point:
    return Point(c.M_STACK, at_ns, len(frames), {c.STACK_ID: stack_id(frames), c.STACK_FRAMES: join_frames(frames),
                                                 c.STACK_TRUNCATED: truncated})  # fmt: skip


@dataclass
class Scenario:
    """The points per rank; ``late_stacks`` are node-1's allocator stack points, sent after the rest."""

    points: dict[int, list[Point]] = field(default_factory=dict)
    late_stacks: list[Point] = field(default_factory=list)

    def send(self, address: str) -> None:
        for rank, points in self.points.items():
            grpc_export(address, metrics_request(resource(rank), points), TEST_TOKEN)
        grpc_export(address, metrics_request(resource(LATE_RANK), self.late_stacks), TEST_TOKEN)


def enter_ns(rank: int, seq: int) -> int:
    return T0 + seq * STEP_NS + 50_000_000 + jitter(rank, seq) + (LATE_NS if late(rank, seq) else 0)


def complete_ns(seq: int) -> int:
    return max(enter_ns(r, seq) for r in range(WORLD)) + 5_000_000


def build() -> Scenario:
    s = Scenario()
    for rank in range(WORLD):
        tid = 2000 + rank
        pts: list[Point] = []
        # node-0's ranks ship the stacks they use; node-1's allocator stack comes last (late_stacks)
        shipped = [FETCH, FORWARD, ENTER] if rank in (0, 2) else []
        pts += [stack_point(f, T0 - 1000 + i) for i, f in enumerate(shipped)]
        for seq in range(STEPS):
            enter = enter_ns(rank, seq)
            prev = complete_ns(seq - 1) if seq else enter - 60_000_000
            window_ms = (enter - prev) / 1e6
            alloc_ms = LATE_NS / 1e6 if late(rank, seq) else 0.0
            attrs: dict[str, Any] = {
                c.OP: "ncclAllReduce", c.COMM_ID: COMM, c.SEQ: seq, c.SEQ_ALIGNED: True, c.COMM_RANK: rank,
                c.COMM_NRANKS: WORLD, c.BYTES: 1 << 20, c.ENTER_NS: enter, c.RETURN_NS: enter + 10_000,
                c.COMPLETE_NS: complete_ns(seq), c.CAUSAL_CHAIN_ID: f"{COMM}:{seq}", c.TID: tid,
                c.EVENT_ID: f"coll-{rank}-{seq}", c.PRE_WINDOW_MS: window_ms, c.PRE_PREFIX + "sleeping_ms": 5.0,
                c.PRE_PREFIX + "sleeping" + c.PRE_STACK_SUFFIX: stack_id(FETCH),
                c.PRE_ONCPU_STACK: stack_id(FORWARD), c.PRE_ONCPU_SAMPLES: 4,
                c.STACK_ID: stack_id(ENTER if rank else NEVER_SHIPPED),
            }  # fmt: skip
            if alloc_ms:
                attrs[c.PRE_PREFIX + "allocator_ms"] = alloc_ms
                attrs[c.PRE_PREFIX + "allocator" + c.PRE_STACK_SUFFIX] = stack_id(ALLOC)
                pts.append(Point(c.M_CUDA_MALLOC, enter - LATE_NS - 2_000_000, alloc_ms,
                                 {c.CUDA_CALL: "cudaMalloc", c.TID: tid, c.EVENT_ID: f"m-{rank}-{seq}",
                                  c.STACK_ID: stack_id(ALLOC)}))  # fmt: skip
            pts.append(Point(c.M_OFFCPU, enter - 30_000_000 - (LATE_NS if alloc_ms else 0), 5.0,
                             {c.OFFCPU_STATE: "sleeping", c.CALL_IN_FLIGHT: "", c.TID: tid,
                              c.EVENT_ID: f"o-{rank}-{seq}", c.STACK_ID: stack_id(FETCH)}))  # fmt: skip
            pts.append(Point(c.M_COLLECTIVE, enter, 5.0, attrs))
        s.points[rank] = pts
    s.late_stacks = [stack_point(ALLOC, T0 + STEPS * STEP_NS)]
    return s


def episodes() -> list[int]:
    return [seq for seq in range(STEPS) if late(LATE_RANK, seq)]
