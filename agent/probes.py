"""The BPF side of the agent: program text, compile flags, and attaching probes to library files.

Shaped like bcc's tools: :func:`program_text` returns the C program (``rankecho agent --ebpf`` prints
it), :func:`cflags` turns settings into ``-D`` knobs, :func:`load` compiles, and :func:`attach_library`
puts uprobes on one library file (once per file: a probe on a path fires in every process that maps
that inode). Functions that begin with ``endbr64`` are probed four bytes in, which keeps the argument
registers and stack intact; :mod:`rankecho.agent.prologue` says which probed instructions the kernel must
single-step (~11-15 us per hit), and the agent warns once per library when there are any.

Usage::

    bpf = load(ProbeConfig())
    attached = attach_library(bpf, "/usr/lib/libnccl.so.2", "nccl")
"""

from __future__ import annotations

import ctypes
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankecho.agent import pyframes, traced
from rankecho.agent.prologue import STEP_COST, STEP_FIX, classify, read_code
from rankecho.agent.traced import TRACED

BPF_DIR = Path(__file__).parent / "bpf"
PROGRAM_FILE = BPF_DIR / "agent.bpf.c"
HEADER_FILE = BPF_DIR / "agent.h"

log = logging.getLogger("rankecho.agent")


@dataclass(frozen=True)
class Probe:
    """One traced function: entry probe ``enter_<symbol>``, optional return probe ``return_<symbol>``."""

    lib: str  # "nccl" or "cuda"
    symbol: str
    fn: int
    has_return: bool = True


PROBES: tuple[Probe, ...] = tuple(Probe(f.lib, f.symbol, f, f.handler != "count") for f in TRACED)
"""Generated from :mod:`rankecho.agent.traced`; ``count`` functions have only a hand-written entry probe."""


@dataclass(frozen=True)
class ProbeConfig:
    """Compile-time knobs of the BPF program."""

    offcpu_min_ns: int = 1_000_000
    max_threads: int = 8192
    ringbuf_pages: int = 256
    filter_pids: bool = False
    stacks: bool = True
    """Capture user stacks (agent/bpf/agent.bpf.c says where); off: no stack maps, no stack records."""
    stack_call_min_ns: int = 1_000_000
    """A CUDA call (malloc, free, memcpy, sync) at least this long ships the stack taken at its entry."""


GENERATED = {"/* @TRACED_ENUM@ */\n": traced.c_enum, "/* @TRACED_PROBES@ */\n": traced.c_probes,
             "/* @STACK_POLICY@ */\n": traced.c_stack_policy}


def program_text() -> str:
    """The C program with its header inlined and the parts generated from :mod:`rankecho.agent.traced` filled
    in, exactly as compiled (minus the ``-D`` knobs)."""
    text = PROGRAM_FILE.read_text().replace('#include "agent.h"\n', HEADER_FILE.read_text())
    text = text.replace('#include "pyframes.h"\n', pyframes.header_text())
    for marker, generate in GENERATED.items():
        if marker not in text:
            raise RuntimeError(f"{marker.strip()} is missing from {BPF_DIR}: restore it where the generated "
                               "part of the program belongs")
        text = text.replace(marker, generate())
    return text


def cflags(cfg: ProbeConfig) -> list[str]:
    flags = [
        f"-DOFFCPU_MIN_NS={int(cfg.offcpu_min_ns)}ULL",
        f"-DMAX_THREADS={int(cfg.max_threads)}",
        f"-DRINGBUF_PAGES={int(cfg.ringbuf_pages)}",
    ]
    if cfg.filter_pids:
        flags.append("-DFILTER_PIDS")
    if cfg.stacks:
        flags += ["-DSTACKS", f"-DSTACK_CALL_MIN_NS={int(cfg.stack_call_min_ns)}ULL"]
    return flags


def render(cfg: ProbeConfig) -> str:
    """What ``--ebpf`` prints: the knobs as a comment, then the program."""
    return f"// cflags: {' '.join(cflags(cfg))}\n{program_text()}"


def load(cfg: ProbeConfig) -> Any:
    """Compile the program, start its tracepoints and load the stack program the call probes jump to
    (~1.5 s, ~100 MB peak RSS while compiling)."""
    try:
        from bcc import BPF

        bpf = BPF(text=program_text(), cflags=cflags(cfg))
        if cfg.stacks:  # the one program the traced calls' probes jump to for their entry stack
            bpf["stack_progs"][ctypes.c_int(0)] = ctypes.c_int(bpf.load_func(b"call_stack", BPF.KPROBE).fd)
        return bpf
    except Exception as err:  # bcc raises bare Exceptions; name the fix instead
        raise RuntimeError(
            f"cannot compile or load the BPF program ({err}); `rankecho agent check` shows what is missing"
        ) from err


@dataclass(frozen=True)
class Site:
    """Where one probe goes in one library file."""

    probe: Probe
    vaddr: int
    offset: int
    """File offset of the probed instruction (past a leading endbr64)."""
    skip: int
    """Prologue bytes stepped over: 4 past endbr64, else 0."""
    stepped: bool
    """The kernel single-steps the probed instruction on every hit (slow)."""
    first: str
    """The probed instruction, for messages."""


def symbol_offset(path: str, symbol: str) -> tuple[int, int] | None:
    """(file offset, virtual address) of ``symbol`` in ``path``, or None when it is not exported."""
    from bcc import BPF

    try:
        _, offset = BPF._check_path_symbol(path.encode(), symbol.encode(), None, -1)
    except Exception:
        return None
    matches = BPF.get_user_functions_and_addresses(path.encode(), f"^{symbol}$".encode())
    if not matches:
        return None
    return int(offset), int(matches[0][1])


def probe_sites(path: str, lib: str) -> list[Site]:
    """Every probe of ``lib`` ("nccl" or "cuda") that ``path`` exports, placed past a leading endbr64."""
    sites = []
    for probe in PROBES:
        if probe.lib != lib:
            continue
        where = symbol_offset(path, probe.symbol)
        if where is None:
            log.debug("%s does not export %s", path, probe.symbol)
            continue
        offset, vaddr = where
        p = classify(read_code(path, offset))
        sites.append(Site(probe, vaddr + p.skip, offset + p.skip, p.skip, p.stepped, p.first))
    return sites


def stepped_warning(path: str, sites: list[Site]) -> str | None:
    """One line naming the single-stepped probes of a library, their cost and the fix; None if none."""
    slow = [s for s in sites if s.stepped]
    if not slow:
        return None
    names = ", ".join(f"{s.probe.symbol} ({s.first})" for s in slow[:4]) + (", ..." if len(slow) > 4 else "")
    return (f"{len(slow)} of {len(sites)} probed functions in {path} start with an instruction the kernel "
            f"single-steps on every call ({names}): {STEP_COST}; {STEP_FIX}")


def attach_library(bpf: Any, path: str, lib: str) -> list[Site]:
    """Attach every probe of ``lib`` ("nccl" or "cuda") that ``path`` exports; raise if none did."""
    sites = probe_sites(path, lib)
    for site in sites:
        # A return probe is planted at entry too, so both move past endbr64 together.
        symbol = site.probe.symbol
        bpf.attach_uprobe(name=path, addr=site.vaddr, fn_name=f"enter_{symbol}")
        if site.probe.has_return:
            bpf.attach_uretprobe(name=path, addr=site.vaddr, fn_name=f"return_{symbol}")
    if not sites:
        raise RuntimeError(
            f"0 functions matched in {path}: it exports none of the {lib} functions rankecho traces; "
            f"pass the real library with --{lib}-lib"
        )
    return sites


def attach_sampler(bpf: Any, hz: int) -> None:
    """Start the on-CPU sampler: a cpu-clock perf event at ``hz`` on every CPU running ``on_cpu_sample``,
    which keeps only samples of target processes (the hardware cycles event is missing on VMs)."""
    from bcc import PerfSWConfig, PerfType

    if hz > 0:
        bpf.attach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK,
                              fn_name=b"on_cpu_sample", sample_freq=int(hz), pid=-1, cpu=-1)


def detach_all(bpf: Any, workers: int = 64) -> int:
    """Detach every uprobe from several threads at once; returns how many.

    Releasing a uprobe perf event waits for RCU grace periods in the kernel (~0.1 s each here) under
    a kernel-wide mutex, so one-by-one detaching (``BPF.cleanup``) takes ~5 s for one node's
    libraries. Closing concurrently lets part of those waits overlap (measured ~20% faster); the
    kernel serialises the rest. Exiting without detaching is no faster: the exiting process pays
    the same cost while closing its files. bcc's own bookkeeping is updated on this thread."""
    from bcc import lib

    items = list(bpf.uprobe_fds.items())

    def detach(item: tuple[bytes, int]) -> None:
        name, fd = item
        lib.bpf_close_perf_event_fd(fd)  # ctypes releases the GIL for the blocking close
        lib.bpf_detach_uprobe(name)  # removes a tracefs-created event (older kernels); else a no-op

    if items:
        with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="detach") as pool:
            list(pool.map(detach, items))
    for name, _ in items:
        bpf._del_uprobe_fd(name)
    return len(items)
