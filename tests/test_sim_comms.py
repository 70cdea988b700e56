"""Cross-process NCCL semantics of the simulated libnccl, driven through ctypes in real processes.

Each rank is a Python process that loads the libraries, receives rank 0's unique id through a
file (standing in for torch's store) and times its calls from outside the libraries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankecho.sim.launcher import SIM_ROOT, build_libs

WORKER = r"""
import ctypes, json, os, sys, time
from pathlib import Path
from rankecho.sim.abi import UniqueId
C = ctypes
build, plan, xdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
cudart = C.CDLL(build + "/libcudart.so.12")
nccl = C.CDLL(build + "/libnccl.so.2")
P = C.c_void_p
nccl.ncclCommInitRank.argtypes = [C.POINTER(P), C.c_int, UniqueId, C.c_int]
nccl.ncclAllReduce.argtypes = [P, P, C.c_size_t, C.c_int, C.c_int, P, P]
nccl.ncclSend.argtypes = [P, C.c_size_t, C.c_int, C.c_int, P, P]
nccl.ncclRecv.argtypes = nccl.ncclSend.argtypes
nccl.ncclCommSplit.argtypes = [P, C.c_int, C.c_int, C.POINTER(P), P]
uid = UniqueId()
if rank == 0:
    assert nccl.ncclGetUniqueId(C.byref(uid)) == 0
    (xdir / "id.tmp").write_bytes(bytes(uid))
    os.rename(xdir / "id.tmp", xdir / "id")
else:
    while not (xdir / "id").exists():
        time.sleep(0.01)
    uid = UniqueId.from_buffer_copy((xdir / "id").read_bytes())
comm = P()
assert nccl.ncclCommInitRank(C.byref(comm), world, uid, rank) == 0
def ms(t0):
    return (time.monotonic() - t0) * 1000
def allreduce(c, count, delay=0.0):
    time.sleep(delay)
    t0 = time.monotonic()
    assert nccl.ncclAllReduce(None, None, count, 7, 0, c, None) == 0
    call = ms(t0)
    assert cudart.cudaStreamSynchronize(None) == 0
    return call, ms(t0)
def info(c):
    r, n = C.c_int(), C.c_int()
    nccl.ncclCommUserRank(c, C.byref(r)); nccl.ncclCommCount(c, C.byref(n))
    return [r.value, n.value, C.c_uint64.from_address(c.value + 8).value]
out = {"world": info(comm)}
if plan == "split":
    sub = P()
    color = rank % 2 if rank < 4 else -1
    assert nccl.ncclCommSplit(comm, color, -rank, C.byref(sub), None) == 0
    out["sub"] = info(sub) if sub.value else None
    if sub.value:
        out["call_ms"], out["done_ms"] = allreduce(sub, 1024, 0.3 if rank == 2 else 0.0)
        ev = [P(), P()]
        for i, e in enumerate(ev):
            cudart.cudaEventCreate(C.byref(e))
        t0 = time.monotonic()
        for i, e in enumerate(ev):  # second op is 100x bigger; each completes after the one before
            assert nccl.ncclAllReduce(None, None, 1 << (20 + 7 * i), 7, 0, sub, None) == 0
            cudart.cudaEventRecord(e, None)
        cudart.cudaEventSynchronize(ev[1])
        f = C.c_float()
        cudart.cudaEventElapsedTime(C.byref(f), ev[0], ev[1])
        out["second_after_first_ms"] = f.value
        assert nccl.ncclCommDestroy(sub) == 0
    out["world_after_split"] = allreduce(comm, 1024)
elif plan == "p2p":
    peer = 1 - rank
    time.sleep(0.2 if rank == 1 else 0.0)
    t0 = time.monotonic()
    nccl.ncclGroupStart()
    assert nccl.ncclSend(None, 1 << 20, 7, peer, comm, None) == 0
    assert nccl.ncclRecv(None, 1 << 20, 7, peer, comm, None) == 0
    nccl.ncclGroupEnd()
    out["call_ms"] = ms(t0)
    cudart.cudaStreamSynchronize(None)
    out["done_ms"] = ms(t0)
elif plan == "sizes":
    nccl.ncclBroadcast.argtypes = [P, P, C.c_size_t, C.c_int, C.c_int, P, P]
    nccl.ncclReduce.argtypes = [P, P, C.c_size_t, C.c_int, C.c_int, C.c_int, P, P]
    nccl.ncclAllGather.argtypes = [P, P, C.c_size_t, C.c_int, P, P]
    nccl.ncclReduceScatter.argtypes = [P, P, C.c_size_t, C.c_int, C.c_int, P, P]
    calls = {
        "allreduce": lambda n: nccl.ncclAllReduce(None, None, n, 7, 0, comm, None),
        "broadcast": lambda n: nccl.ncclBroadcast(None, None, n, 7, 0, comm, None),
        "reduce": lambda n: nccl.ncclReduce(None, None, n, 7, 0, 1, comm, None),
        "allgather": lambda n: nccl.ncclAllGather(None, None, n, 7, comm, None),
        "reducescatter": lambda n: nccl.ncclReduceScatter(None, None, n, 7, 0, comm, None),
    }
    for name, call in calls.items():
        for count in (1 << 10, 1 << 30):  # 4 KiB and 4 GiB of float32
            t0 = time.monotonic()
            assert call(count) == 0
            cudart.cudaStreamSynchronize(None)
            out[f"{name}:{count}"] = ms(t0)
elif plan == "mismatch":
    allreduce(comm, 1024 * (rank + 1))
    out["unreachable"] = True
out["id_addr"] = list(bytes(uid)[8:12])
print(json.dumps(out), flush=True)
assert nccl.ncclCommDestroy(comm) == 0
"""


def run_ranks(
    tmp_path: Path, world: int, plan: str, **extra_env: str
) -> list[subprocess.CompletedProcess[str]]:
    build_libs()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), **extra_env)
        argv = [sys.executable, "-c", WORKER, str(SIM_ROOT / "build"), plan, str(tmp_path)]
        procs.append(
            subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"ranks of plan {plan} hung")
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def results(procs: list[subprocess.CompletedProcess[str]]) -> list[dict]:
    for p in procs:
        assert p.returncode == 0, p.stderr
    return [json.loads(p.stdout) for p in procs]


def test_split_membership_ordering_and_independent_progress(tmp_path: Path) -> None:
    r = results(run_ranks(tmp_path, 5, "split"))
    world_hash = r[0]["world"][2]
    assert [x["world"] for x in r] == [[i, 5, world_hash] for i in range(5)]
    # color = rank % 2, key = -rank: higher world rank gets the lower sub rank; rank 4 opted out.
    assert r[4]["sub"] is None
    assert [x["sub"][:2] for x in r[:4]] == [[1, 2], [1, 2], [0, 2], [0, 2]]
    assert r[0]["sub"][2] == r[2]["sub"][2] != r[1]["sub"][2] == r[3]["sub"][2]
    assert world_hash not in (r[0]["sub"][2], r[1]["sub"][2])
    for x in r[:4]:
        assert x["call_ms"] < 20  # enqueue only: the host never waits inside ncclAllReduce
    # World rank 2 came 300 ms late to its group's all-reduce: only its group partner waited.
    assert r[0]["done_ms"] >= 250
    assert r[2]["done_ms"] < 150
    assert r[1]["done_ms"] < 150 and r[3]["done_ms"] < 150
    # In-order completion on a communicator: the 128 MiB op finishes ~after the 1 MiB one plus its transfer.
    for x in r[:4]:
        assert 1.2 <= x["second_after_first_ms"] < 100
    assert all(x["world_after_split"][0] < 20 for x in r)


def test_grouped_send_recv_pairs_wait_for_the_late_peer(tmp_path: Path) -> None:
    r = results(run_ranks(tmp_path, 2, "p2p"))
    assert r[0]["call_ms"] < 20 and r[1]["call_ms"] < 20
    assert r[0]["done_ms"] >= 180  # rank 0 waited in its sync for rank 1, 200 ms late
    assert r[1]["done_ms"] < 100


def test_every_collective_completes_with_a_transfer_time_that_grows_with_bytes(tmp_path: Path) -> None:
    r = results(run_ranks(tmp_path, 2, "sizes"))
    # 4 GiB at 80 GB/s: all-reduce moves 2(n-1)/n = 1x, all-gather/reduce-scatter take the per-rank
    # count, so n x 4 GiB total and (n-1)/n of it, broadcast/reduce 1x: about 54 ms each with 2 ranks.
    # The transfer time is a floor (the op cannot complete sooner); the ceilings only catch runaway
    # delays, generous because the machine running the tests may be busy.
    for x in r:
        for name in ("allreduce", "broadcast", "reduce", "allgather", "reducescatter"):
            assert x[f"{name}:1024"] < 40, (name, x)
            assert 53 <= x[f"{name}:1073741824"] < 300, (name, x)


def test_mismatched_collectives_abort_every_rank_with_a_clear_message(tmp_path: Path) -> None:
    procs = run_ranks(tmp_path, 2, "mismatch")
    assert all(p.returncode != 0 for p in procs)
    assert all("unreachable" not in p.stdout for p in procs)
    assert any("same collectives in the same order" in p.stderr for p in procs)


def test_the_hub_listens_where_it_is_told_and_rejects_a_bad_address(tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir()
    r = results(run_ranks(tmp_path / "ok", 2, "p2p", RANKECHO_SIM_BIND_ADDR="127.0.0.2"))
    assert r[0]["id_addr"] == r[1]["id_addr"] == [127, 0, 0, 2]  # carried to every rank in the id
    (tmp_path / "bad").mkdir()
    procs = run_ranks(tmp_path / "bad", 1, "p2p", RANKECHO_SIM_BIND_ADDR="node-a")
    assert procs[0].returncode != 0
    assert "RANKECHO_SIM_BIND_ADDR=node-a is not an IPv4 address" in procs[0].stderr
