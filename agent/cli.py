"""Subcommands of `rankecho` implemented by the `agent` package: ``agent`` and ``agent check``.

Import-light: the BPF, gRPC and NVML modules load inside the handlers.
"""

from __future__ import annotations

import argparse
from typing import Any


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", default="127.0.0.1:4317", help="Echo's OTLP/gRPC address HOST:PORT")
    p.add_argument("--cluster-id", default=None, help="cluster name (default: $RANKECHO_CLUSTER_ID, else "
                   "k8s.cluster.name in $OTEL_RESOURCE_ATTRIBUTES, else 'default')")
    p.add_argument("--node-id", default=None, help="node name (default: $K8S_NODE_NAME, $NODE_NAME, "
                   "k8s.node.name in $OTEL_RESOURCE_ATTRIBUTES, else the host name)")
    p.add_argument("--token-file", default=None, help="file holding Echo's bearer token "
                   "(default: $RANKECHO_TOKEN)")
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC even with a token")
    p.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    p.add_argument("--ca-file", default=None, help="CA bundle for Echo's certificate (implies TLS)")
    p.add_argument("--cert-file", default=None, help="client certificate for mutual TLS")
    p.add_argument("--key-file", default=None, help="client key for mutual TLS")
    p.add_argument("--nccl-lib", action="append", metavar="PATH", help="trace this libnccl file "
                   "(repeatable; default: every libnccl.so* mapped by a process)")
    p.add_argument("--cuda-lib", action="append", metavar="PATH", help="trace this libcudart file "
                   "(repeatable; default: every libcudart.so* mapped by a process)")
    p.add_argument("--pid", action="append", type=int, help="trace only these processes (repeatable)")
    p.add_argument("--spool-dir", default=None, help="where batches wait while Echo is unreachable "
                   "(default: this run's own directory under /var/lib/rankecho/spool/CLUSTER-NODE, not "
                   "replayed by later runs; name a directory to have a restarted agent send what its "
                   "predecessors left there)")
    p.add_argument("--spool-max-mb", type=float, default=256.0, help="spool size bound (oldest dropped)")
    p.add_argument("--scan-interval", type=float, default=2.0, help="seconds between /proc re-scans")
    p.add_argument("--shutdown-grace", type=float, default=10.0, help="seconds the agent keeps sending "
                   "its spool after SIGTERM before leaving the rest for its next start (keep the pod's "
                   "terminationGracePeriodSeconds above it)")
    p.add_argument("--offcpu-min-ms", type=float, default=1.0, help="shortest off-CPU interval reported")
    p.add_argument("--clock-offset-ns", type=int, default=0,
                   help="TESTING ONLY: add this to every timestamp, to simulate a skewed node clock")
    p.add_argument("--ready-file", default=None, help="created once probes are attached")
    p.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)


def _run(args: argparse.Namespace) -> int:
    import logging
    import sys

    from rankecho import exitcodes
    from rankecho.agent import discovery, probes, settings, stopflag

    stop = stopflag.install()  # already done by rankecho.cli.main; again for callers that skip it

    if args.ebpf:
        cfg = probes.ProbeConfig(offcpu_min_ns=int(args.offcpu_min_ms * 1e6), filter_pids=bool(args.pid))
        print(probes.render(cfg))
        return 0
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s rankecho-agent %(levelname)s %(message)s")
    log = logging.getLogger("rankecho.agent")
    s = settings.from_args(args)
    warning = settings.plaintext_token_warning(s, args.insecure)
    if warning:
        log.warning(warning)
    from rankecho.agent.runner import run

    try:
        return run(s, stop)
    except discovery.LibraryError as err:
        log.error("%s", err)
        return exitcodes.USAGE
    except (FileNotFoundError, RuntimeError, PermissionError) as err:
        log.error("%s", err)
        return 1
    finally:
        stopflag.ignore_further()


def _check(args: argparse.Namespace) -> int:
    from rankecho.agent import check

    return check.main(tuple(args.nccl_lib or ()), tuple(args.cuda_lib or ()))


def register(subparsers: Any) -> None:
    """Add ``rankecho agent`` (run the node agent) and ``rankecho agent check`` (readiness)."""
    p = subparsers.add_parser("agent", help="run the per-node eBPF agent (root)",
                              description="Trace NCCL, CUDA runtime and scheduler events of every "
                              "training process on this node and send them to Echo over OTLP/gRPC.")
    _add_run_options(p)
    p.set_defaults(handler=_run)
    sub = p.add_subparsers(dest="agent_command", metavar="{check}")
    chk = sub.add_parser("check", help="check this node can run the agent; prints the fix for each gap")
    chk.add_argument("--nccl-lib", action="append", metavar="PATH")
    chk.add_argument("--cuda-lib", action="append", metavar="PATH")
    chk.set_defaults(handler=_check)
