"""Who a traced process is: rank and world size from its environment, start time, communicator ids.

Everything reads through a ``proc_root`` so tests can point it at a fixture tree. Usage::

    info = read_process("/proc", 4242)        # None if the process is gone
    comm_id = unique_id_hash(payload_bytes)   # equal on every rank of the communicator
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from rankecho.agent.jobid import JobEnv
from rankecho.agent.jobid import from_env as job_from_env

# (rank, world size, local rank) variables, most specific launcher first.
RANK_VARS: tuple[tuple[str, str, str], ...] = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)
POD_VARS = ("K8S_POD_NAME", "POD_NAME")
NAMESPACE_VARS = ("K8S_NAMESPACE_NAME", "K8S_NAMESPACE", "POD_NAMESPACE")


@dataclass(frozen=True)
class EnvIdentity:
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    pod: str | None = None
    namespace: str | None = None
    visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES, to map the local rank to an NVML device index."""
    job_key: str = ""
    """MASTER_ADDR:MASTER_PORT (or another launcher's rendezvous); equal on every rank of one job."""
    job: JobEnv = field(default_factory=JobEnv)
    """The job rule the environment matches (:mod:`rankecho.agent.jobid`)."""


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    start_ticks: int
    """Field 22 of /proc/PID/stat: with the pid, a key that survives pid reuse."""
    env: EnvIdentity = field(default_factory=EnvIdentity)
    comm: str = ""
    start_ns: int = 0
    """Unix ns of the process start, at clock-tick resolution (0 when unknown)."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_ticks)


def parse_environ(raw: bytes) -> dict[str, str]:
    """Split /proc/PID/environ (NUL-separated ``K=V``) into a dict; undecodable bytes are replaced."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def env_identity(env: Mapping[str, str]) -> EnvIdentity:
    """Rank, world size and local rank from the first launcher convention present in ``env``."""
    rank = world = local = None
    for rank_var, world_var, local_var in RANK_VARS:
        if rank_var in env:
            rank, world, local = _int(env.get(rank_var)), _int(env.get(world_var)), _int(env.get(local_var))
            break
    pod = next((env[v] for v in POD_VARS if v in env), None)
    namespace = next((env[v] for v in NAMESPACE_VARS if v in env), None)
    job_key = ""
    if "MASTER_ADDR" in env:
        job_key = f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '')}"
    elif "SLURM_JOB_ID" in env:
        job_key = f"slurm:{env['SLURM_JOB_ID']}"
    return EnvIdentity(rank, world, local, pod, namespace, env.get("CUDA_VISIBLE_DEVICES"), job_key,
                       job_from_env(env, world))


def parse_stat_start(stat: str) -> int:
    """Start time (clock ticks since boot) from a /proc/PID/stat line; the comm may contain ')'."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[19])  # field 22 overall; fields after the comm start at field 3


def read_process(proc_root: str, pid: int) -> ProcessInfo | None:
    """Identity of a live process, or None when it is gone (or was never visible)."""
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "stat")) as f:
            start = parse_stat_start(f.read())
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(os.path.join(base, "environ"), "rb") as f:
            env = parse_environ(f.read())
    except OSError:
        env = {}
    try:
        with open(os.path.join(base, "comm")) as f:
            comm = f.read().strip()
    except OSError:
        comm = ""
    return ProcessInfo(pid, start, env_identity(env), comm, ticks_to_unix_ns(start))


def ticks_to_unix_ns(ticks: int) -> int:
    """Start ticks (since boot) -> Unix ns, rounded to the tick so repeated calls agree."""
    hz = os.sysconf("SC_CLK_TCK")
    tick_ns = 1_000_000_000 // hz
    boot_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return round((boot_ns + ticks * tick_ns) / tick_ns) * tick_ns


def thread_name(proc_root: str, pid: int, tid: int) -> str:
    try:
        with open(os.path.join(proc_root, str(pid), "task", str(tid), "comm")) as f:
            return f.read().strip()
    except OSError:
        return ""


def thread_group(proc_root: str, tid: int) -> int | None:
    """The process (tgid) thread ``tid`` belongs to, or None when it is gone (or is not visible)."""
    try:
        with open(os.path.join(proc_root, str(tid), "status")) as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def short_hash(*parts: object) -> str:
    """16 hex chars of BLAKE2b over the parts; stable across processes, hosts and runs."""
    data = b"\x1f".join([p if isinstance(p, bytes) else str(p).encode() for p in parts])
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def unique_id_hash(unique_id: bytes) -> str:
    """Communicator id from the ncclUniqueId bytes every rank passed to ncclCommInitRank*."""
    return short_hash(b"nccl-unique-id", unique_id)


def split_child_id(parent_id: str, split_ordinal: int, color: int) -> str:
    """Child of ncclCommSplit: the n-th split of a parent with one color is the same comm on every rank."""
    return short_hash("split", parent_id, split_ordinal, color)


def unaligned_comm_id(job_key: str, world_size: int | None, ordinal: int) -> str:
    """A communicator first seen after its creation (agent attached mid-run): the best cross-rank
    guess is the job's rendezvous address plus the order in which this process used its comms."""
    return short_hash("attached-mid-run", job_key, world_size, ordinal)
