"""What a frame-pointer stack walk sees in the simulated rank, measured with bcc itself (no rankecho agent):
a uprobe on a fake library function takes the rank's user stack (``get_stackid(BPF_F_USER_STACK)``), bcc
names the frames. The C rank's step phases and fault injectors show by name with every caller kept
(``cudaMalloc <- allocate_cache <- run_step <- main``; cudaFree used to lose ``run_step`` to GCC's
shrink-wrapping), and the no-frame-pointer build cannot give that chain back (what the agent must then
call truncated)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from test_agent_helpers import requires_ebpf, sim_built

pytestmark = [requires_ebpf, pytest.mark.ebpf]

PROGRAM = r"""
#include <uapi/linux/ptrace.h>
BPF_STACK_TRACE(stacks, 1024);
BPF_HASH(counts, int, u64, 1024);
int on_entry(struct pt_regs *ctx) {
    int id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
    u64 zero = 0, *n = counts.lookup_or_try_init(&id, &zero);
    if (n) (*n)++;
    return 0;
}
"""
MAIN = ("main", "__libc_start_call_main")


def user_stacks(tmp: Path, binary: str, lib: str, symbol: str, faults: list[str]) -> Counter[tuple[str, ...]]:
    """Every distinct user stack (innermost first, bcc's names) at entries of ``symbol`` in a one-rank run
    of ``binary`` with ``faults``; the rank hangs for good at step 6 (maps stay readable), then is killed."""
    from bcc import BPF

    sim = sim_built()
    for name in ("libcudart.so.12", "libnccl.so.2"):  # a private copy: only this rank hits the probe
        shutil.copy2(sim / "build" / name, tmp / name)
    bpf = BPF(text=PROGRAM.encode())
    bpf.attach_uprobe(name=str(tmp / lib).encode(), sym=symbol.encode(), fn_name=b"on_entry")
    log = tmp / "rank.log"
    argv = [str(sim / "build" / binary), "--steps", "8", "--compute-us", "3000", "--kernels", "3",
            "--log", str(log)]  # fmt: skip
    for fault in [*faults, "hang:0:1:6:0"]:
        argv += ["--fault", fault]
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp), RANK="0", WORLD_SIZE="1", MASTER_PORT="0")
    proc = subprocess.Popen(argv, env=env)
    try:
        deadline = time.monotonic() + 60
        while "fault hang" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "the rank never reached its hang"
            time.sleep(0.05)
        out: Counter[tuple[str, ...]] = Counter()
        for key, count in bpf[b"counts"].items():
            if key.value >= 0:
                walk = bpf[b"stacks"].walk(key.value)
                frames = tuple(bpf.sym(a, proc.pid, show_module=False).decode() for a in walk)
                out[frames] += count.value
        return out
    finally:
        proc.kill()
        proc.wait()
        bpf.cleanup()


@pytest.mark.parametrize("symbol", ["cudaMalloc", "cudaFree"])
def test_the_allocator_stall_walks_through_allocate_cache_to_main(tmp_path: Path, symbol: str) -> None:
    stacks = user_stacks(tmp_path, "simrank", "libcudart.so.12", symbol, ["alloc_stall:10:1:2:0"])
    chain = (symbol, "allocate_cache", "run_step", *MAIN)
    assert stacks[chain] == 8 * 5, stacks  # 8 cache blocks at steps 2..6 (6 allocates, then hangs)
    assert stacks[(symbol, "run_step", *MAIN)] == 1, stacks  # step 0's occasional free/malloc
    assert all(s[-2:] == MAIN for s in stacks), stacks  # every walk reaches main: no caller lost


def test_a_desync_issues_its_collective_from_desync_rank(tmp_path: Path) -> None:
    stacks = user_stacks(tmp_path, "simrank", "libnccl.so.2", "ncclAllReduce", ["desync:0:1:3:0"])
    assert stacks[("ncclAllReduce", "desync_rank", "backward", "run_step", *MAIN)] == 1, stacks
    assert stacks[("ncclAllReduce", "backward", "run_step", *MAIN)] == 5, stacks  # steps 0-2, 4, 5


def test_without_frame_pointers_the_chain_is_not_recovered(tmp_path: Path) -> None:
    stacks = user_stacks(tmp_path, "simrank-nofp", "libcudart.so.12", "cudaMalloc", ["alloc_stall:10:1:2:0"])
    stalled = [s for s in stacks if s[:2] == ("cudaMalloc", "allocate_cache")]
    # The kernel still adds the probed entry's return address (cudaMalloc begins with push %rbp), so
    # the immediate caller is right; past it %rbp is no frame pointer, and the walk stops or strays.
    assert sum(stacks[s] for s in stalled) == 8 * 5, stacks
    assert not any(s[2:4] == ("run_step", "main") for s in stalled), stacks
