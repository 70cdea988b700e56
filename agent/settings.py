"""The agent's configuration, resolved once from flags and environment into a frozen object."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from rankecho.agent import resource
from rankecho.agent.probes import ProbeConfig
from rankecho.shared import contract as c
from rankecho.shared.clientflags import read_token

DEFAULT_SPOOL_ROOT = "/var/lib/rankecho/spool"
LOOPBACK_HOSTS = ("127.", "localhost", "[::1]", "::1")


@dataclass(frozen=True)
class Settings:
    endpoint: str
    cluster_id: str
    node_id: str
    token: str = ""
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    nccl_libs: tuple[str, ...] = ()
    cuda_libs: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()
    clock_offset_ns: int = 0
    clock_drift_ppm: float = 0.0
    clock_epoch_ns: int = 0
    clock_step_file: str | None = None
    """TESTING ONLY, with clock_offset_ns: the simulator's drifting, stepped node clock (agent/clock.py)."""
    ready_file: str | None = None
    spool_dir: str = ""
    spool_adopt: bool = True
    """Replay what earlier runs left in ``spool_dir``: only when the user named it (``--spool-dir``);
    the default spool is this run's alone, so one job's backlog never lands in another's Echo."""
    spool_max_bytes: int = 256 << 20
    scan_interval_s: float = 2.0
    flush_interval_s: float = 0.5
    window_s: float = 1.0
    offcpu_min_ns: int = 1_000_000
    raw_interval_ns: int = 10_000_000
    """Raw intervals (syncs, copies, allocations, off-CPU) go out only as evidence: at least this long and
    far above the thread's usual, or inside an unusually long pre-call window; 0 sends all of them.
    Every collective carries its window's breakdown either way (agent/window.py)."""
    health_every: int = 10
    """Send every Nth step's health score (and any that moved by 0.2)."""
    gpu_interval_s: float = 10.0
    """Seconds between GPU gauge points (NVML is still read every window: a throttled GPU's health)."""
    proc_root: str = "/proc"
    shutdown_deadline_s: float = 10.0
    """At shutdown, how long the exporter keeps retrying Echo before leaving the rest in the spool."""
    stacks: bool = True
    """Capture user stacks (collective entry, long CUDA calls, long off-CPU intervals); ``--no-stacks``."""
    sample_hz: int = 49
    """On-CPU sampler rate per CPU for target threads (``rankecho.pre.oncpu_stack``); 0 = off."""
    heartbeat_s: float = 5.0
    """Every this many seconds, what each rank quiet that long is doing now (``rankecho.rank.state``,
    agent/heartbeat.py); 0 = off."""
    resource: tuple[tuple[str, str], ...] = ()
    """The agent's own resource attributes (environment merged, cluster and node id included)."""

    @property
    def probe_config(self) -> ProbeConfig:
        # A CUDA call ships its entry stack from the off-CPU threshold up: each class then has stacks for
        # the same intervals, whether the time went in a call or off the CPU.
        return ProbeConfig(offcpu_min_ns=self.offcpu_min_ns, filter_pids=bool(self.pids), stacks=self.stacks,
                           stack_call_min_ns=self.offcpu_min_ns)


def _token(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return read_token(args.token_file, env) or ""


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Resolve flags + environment into Settings: RANKECHO_TOKEN, RANKECHO_CLUSTER_ID, RANKECHO_SPOOL_ROOT,
    and the identity of :mod:`rankecho.agent.resource`. Node id: --node-id, else K8S_NODE_NAME, NODE_NAME,
    ``k8s.node.name`` in OTEL_RESOURCE_ATTRIBUTES, the host name. Cluster id: --cluster-id, else
    RANKECHO_CLUSTER_ID, ``k8s.cluster.name`` in OTEL_RESOURCE_ATTRIBUTES, ``default``."""
    env = os.environ if env is None else env
    attrs = resource.from_env(env)
    node = (args.node_id or env.get("K8S_NODE_NAME", "").strip() or env.get("NODE_NAME")
            or attrs.get(c.NODE_NAME) or socket.gethostname())
    cluster = args.cluster_id or env.get("RANKECHO_CLUSTER_ID") or attrs.get(c.CLUSTER_NAME) or "default"
    attrs.update({c.CLUSTER_NAME: cluster, c.NODE_NAME: node})
    endpoint = args.endpoint
    tls = bool(args.tls or args.ca_file or endpoint.startswith("https://")) and not args.insecure
    spool = args.spool_dir or os.path.join(
        env.get("RANKECHO_SPOOL_ROOT", DEFAULT_SPOOL_ROOT), f"{cluster}-{node}".replace("/", "_")
    )
    return Settings(
        endpoint=endpoint,
        cluster_id=cluster,
        node_id=node,
        resource=tuple(sorted(attrs.items())),
        token=_token(args, env),
        tls=tls,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
        nccl_libs=tuple(args.nccl_lib or ()),
        cuda_libs=tuple(args.cuda_lib or ()),
        pids=tuple(args.pid or ()),
        clock_offset_ns=args.clock_offset_ns,
        clock_drift_ppm=args.clock_drift_ppm,
        clock_epoch_ns=args.clock_epoch_ns,
        clock_step_file=args.clock_step_file,
        ready_file=args.ready_file,
        spool_dir=spool,
        spool_adopt=args.spool_dir is not None,
        spool_max_bytes=int(args.spool_max_mb * (1 << 20)),
        scan_interval_s=args.scan_interval,
        offcpu_min_ns=int(args.offcpu_min_ms * 1_000_000),
        raw_interval_ns=int(args.raw_interval_ms * 1_000_000),
        health_every=args.health_every,
        gpu_interval_s=args.gpu_interval,
        proc_root=args.proc_root,
        shutdown_deadline_s=args.shutdown_grace,
        stacks=not args.no_stacks,
        sample_hz=max(0, int(args.sample_hz)) if not args.no_stacks else 0,
        heartbeat_s=args.heartbeat_s,
    )


def plaintext_token_warning(s: Settings, insecure: bool) -> str | None:
    host = s.endpoint.split("://", 1)[-1]
    if s.token and not s.tls and not insecure and not host.startswith(LOOPBACK_HOSTS):
        return (f"sending the bearer token to {s.endpoint} without TLS; pass --ca-file (or --tls) to "
                "encrypt, or --insecure to accept plaintext")
    return None
