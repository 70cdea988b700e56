"""Which job a traced process belongs to, from what its launcher already put in its environment.

Every job on a cluster has ranks 0..N-1, so rank alone cannot tell two jobs apart; the agent stamps
``rankecho.job.id`` (and ``rankecho.job.source``, the rule that gave it) on every point of a process.
Rules, first match wins (docs/contract.md, "Job identity"):

1. ``explicit``: ``RANKECHO_JOB_ID`` (an operator's override).
2. ``torchelastic``: ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; torchrun's default ``none`` is
   no id and is skipped).
3. ``slurm``: ``SLURM_JOB_ID``, prefixed by ``SLURM_CLUSTER_NAME`` when set (job ids are per cluster).
4. ``k8s``: a Kubernetes owner named by the environment: ``JOBSET_NAME``/``JOBSET_UID``,
   ``PYTORCHJOB_NAME``/``PYTORCHJOB_UID``, ``K8S_JOB_NAME``/``K8S_JOB_UID`` (downward-API variables
   from the owner's labels), or ``k8s.job.name``/``k8s.job.uid`` in the process's
   ``OTEL_RESOURCE_ATTRIBUTES``; the uid tells apart two runs of a job with one name.
5. ``rendezvous``: ``MASTER_ADDR:MASTER_PORT`` plus the start time of the job's first rank this agent
   saw: ports are reused job after job, the start time is not. A *generation* of a rendezvous takes in
   processes while one of its processes lives and none has exited before they started; any other
   process begins a new job (the next job on the same ranks and port starts after the last one's exit).
6. ``local`` (the fallback): no launcher variable at all; the node and world size play the rendezvous's
   part, with the same generations. Such an id only groups one node's processes.

Rules 5 and 6 are per agent: two nodes of a job launched without a run, scheduler or owner id get one id
each (their first ranks start at different instants). Give such jobs ``RANKECHO_JOB_ID`` or a run id.

    ids = JobIds(node_id="gpu-7")
    job = ids.job_of(info)      # JobId(id="torchelastic:run-42", source="torchelastic")
    ids.exited(key, now_ns)     # when the process is gone (closes its rendezvous generation)
    ids.forget(key)             # when nothing of it is sent any more
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from rankecho.agent.resource import parse_otel

EXPLICIT_VAR = "RANKECHO_JOB_ID"
TORCHELASTIC_VAR = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_NO_ID = "none"
"""What torchrun sets when no ``--rdzv-id`` was given: the same on every job, so no identity."""
K8S_OWNERS: tuple[tuple[str, str, str], ...] = (
    ("JobSet", "JOBSET_NAME", "JOBSET_UID"),
    ("PyTorchJob", "PYTORCHJOB_NAME", "PYTORCHJOB_UID"),
    ("Job", "K8S_JOB_NAME", "K8S_JOB_UID"),
)
OTEL_JOB_NAME = "k8s.job.name"
OTEL_JOB_UID = "k8s.job.uid"
NAMESPACE_VARS = ("K8S_NAMESPACE_NAME", "K8S_NAMESPACE", "POD_NAMESPACE")

EXPLICIT, TORCHELASTIC, SLURM, K8S, RENDEZVOUS, LOCAL = (
    "explicit", "torchelastic", "slurm", "k8s", "rendezvous", "local")
GENERATION_SOURCES = (RENDEZVOUS, LOCAL)
"""Sources whose id still needs the start time of the generation's first rank."""


@dataclass(frozen=True)
class JobEnv:
    """What the environment alone says: a full id, or (rendezvous, local) the key a start time completes."""

    key: str = "world=?"
    source: str = LOCAL


@dataclass(frozen=True)
class JobId:
    id: str
    source: str


def _get(env: Mapping[str, str], var: str) -> str:
    return env.get(var, "").strip()


def _k8s(env: Mapping[str, str]) -> str:
    namespace = next((_get(env, v) for v in NAMESPACE_VARS if _get(env, v)), "")
    owners = [(kind, _get(env, name), _get(env, uid)) for kind, name, uid in K8S_OWNERS]
    try:
        otel = parse_otel(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    except ValueError:
        otel = {}
    owners.append(("Job", otel.get(OTEL_JOB_NAME, "").strip(), otel.get(OTEL_JOB_UID, "").strip()))
    for kind, name, uid in owners:
        if name:
            return "k8s:" + "/".join(p for p in (namespace, kind, name, uid) if p)
    return ""


def from_env(env: Mapping[str, str], world_size: int | None = None) -> JobEnv:
    """The job rule that matches ``env`` (a process's /proc/PID/environ), first match wins."""
    if _get(env, EXPLICIT_VAR):
        return JobEnv(_get(env, EXPLICIT_VAR), EXPLICIT)
    run_id = _get(env, TORCHELASTIC_VAR)
    if run_id and run_id != TORCHELASTIC_NO_ID:
        return JobEnv(f"torchelastic:{run_id}", TORCHELASTIC)
    if _get(env, "SLURM_JOB_ID"):
        cluster = _get(env, "SLURM_CLUSTER_NAME")
        return JobEnv(f"slurm:{cluster + '/' if cluster else ''}{_get(env, 'SLURM_JOB_ID')}", SLURM)
    owner = _k8s(env)
    if owner:
        return JobEnv(owner, K8S)
    if _get(env, "MASTER_ADDR"):
        return JobEnv(f"{_get(env, 'MASTER_ADDR')}:{_get(env, 'MASTER_PORT')}", RENDEZVOUS)
    return JobEnv(f"world={world_size if world_size is not None else '?'}", LOCAL)


def stamp(start_ns: int) -> str:
    """A start time as the id's suffix: UTC to the millisecond, readable and sortable."""
    if start_ns <= 0:
        return "?"
    secs, ns = divmod(start_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ns // 1_000_000:03d}Z"


@dataclass
class _Generation:
    id: str
    live: set[tuple[int, int]] = field(default_factory=set)
    first_exit_ns: int | None = None
    """Unix ns of the first exit of a member: a process started later belongs to another job."""

    def admits(self, start_ns: int) -> bool:
        return bool(self.live) and (self.first_exit_ns is None or 0 < start_ns <= self.first_exit_ns)


class JobIds:
    """Resolves processes to job ids; remembers rendezvous generations (one per agent)."""

    def __init__(self, node_id: str = "") -> None:
        self.node_id = node_id
        self._generations: dict[str, _Generation] = {}
        self._of: dict[tuple[int, int], JobId] = {}

    def job_of(self, key: tuple[int, int], job: JobEnv, start_ns: int) -> JobId:
        """The job id of process ``key`` (pid, start ticks), stable for the life of the process."""
        known = self._of.get(key)
        if known is not None:
            return known
        if job.source not in GENERATION_SOURCES:
            out = JobId(job.key, job.source)
        else:
            gkey = job.key if job.source == RENDEZVOUS else f"{self.node_id}/{job.key}"
            gen = self._generations.get(gkey)
            if gen is None or not gen.admits(start_ns):
                prefix = job.key if job.source == RENDEZVOUS else f"local:{gkey}"
                gen = self._generations[gkey] = _Generation(f"{prefix}@{stamp(start_ns)}")
            gen.live.add(key)
            out = JobId(gen.id, job.source)
        self._of[key] = out
        return out

    def exited(self, key: tuple[int, int], now_ns: int) -> None:
        """Process ``key`` exited at ``now_ns`` (Unix ns); its id stays until :meth:`forget`."""
        for gen in self._generations.values():
            if key in gen.live:
                gen.live.discard(key)
                if gen.first_exit_ns is None:
                    gen.first_exit_ns = now_ns

    def forget(self, key: tuple[int, int]) -> None:
        """Nothing of process ``key`` is sent any more: drop its id (bounded memory)."""
        self._of.pop(key, None)
        self._generations = {k: g for k, g in self._generations.items() if g.live}
