"""Subcommands of `rankecho` implemented by the `agent` package: ``agent`` and ``agent check``.

Import-light: the BPF, gRPC and NVML modules load inside the handlers.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankecho.agent.settings import Settings
from rankecho.helpfmt import examples
from rankecho.shared.clientflags import add_tls_options, add_token_options


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", default="127.0.0.1:4317", metavar="HOST:PORT",
                   help="Echo's OTLP/gRPC address HOST:PORT")
    p.add_argument("--cluster-id", default=None, help="cluster name (default: $RANKECHO_CLUSTER_ID, else "
                   "k8s.cluster.name in $OTEL_RESOURCE_ATTRIBUTES, else 'default')")
    p.add_argument("--node-id", default=None, help="node name (default: $K8S_NODE_NAME, $NODE_NAME, "
                   "k8s.node.name in $OTEL_RESOURCE_ATTRIBUTES, else the host name)")
    add_token_options(p)
    add_tls_options(p)
    p.add_argument("--nccl-lib", action="append", metavar="PATH", help="trace this libnccl file "
                   "(repeatable; default: every libnccl.so* mapped by a process)")
    p.add_argument("--cuda-lib", action="append", metavar="PATH", help="trace this libcudart file "
                   "(repeatable; default: every libcudart.so* mapped by a process)")
    p.add_argument("--pid", action="append", type=int, help="trace only these processes (repeatable)")
    p.add_argument("--spool-dir", default=None, help="where batches wait while Echo is unreachable "
                   "(default: this run's own directory under /var/lib/rankecho/spool/CLUSTER-NODE, not "
                   "replayed by later runs; name a directory to have a restarted agent send what its "
                   "predecessors left there)")
    p.add_argument("--spool-max-mb", type=float, default=256.0, help="spool bound, MiB (oldest dropped)")
    p.add_argument("--scan-interval", type=float, default=2.0, help="seconds between /proc re-scans")
    p.add_argument("--shutdown-grace", type=float, default=10.0, help="seconds the agent keeps sending "
                   "its spool after SIGTERM before leaving the rest for its next start (keep the pod's "
                   "terminationGracePeriodSeconds above it)")
    p.add_argument("--offcpu-min-ms", type=float, default=1.0, help="shortest off-CPU interval reported")
    p.add_argument("--raw-interval-ms", type=float, default=Settings.raw_interval_ns / 1e6, metavar="MS",
                   help="send a raw interval (sync, copy, allocation, off-CPU) only when it is at least MS "
                   "and far above its thread's usual, or inside an unusually long pre-call window; every "
                   "collective carries its window's breakdown anyway (0: send every interval)")
    p.add_argument("--health-every", type=_positive_int, default=Settings.health_every, metavar="N",
                   help="send every Nth step's health score, and any that moved by 0.2")
    p.add_argument("--gpu-interval", type=float, default=Settings.gpu_interval_s, metavar="S",
                   help="seconds between GPU gauge points (NVML is read every second either way)")
    p.add_argument("--no-stacks", action="store_true", help="capture no call stacks (on by default: at "
                   "collective entry, long CUDA calls and long off-CPU intervals)")
    p.add_argument("--sample-hz", type=int, default=Settings.sample_hz, metavar="HZ",
                   help="on-CPU stack samples per second of each traced thread's CPU (0 = off)")
    p.add_argument("--heartbeat-s", type=_non_negative, default=Settings.heartbeat_s, metavar="S",
                   help="every S seconds, send what each rank that entered no collective for S seconds is "
                   "doing now (call in flight, off-CPU state, stack), so a hang is explained live (0: off)")
    p.add_argument("--clock-offset-ns", type=int, default=0,
                   help="TESTING ONLY: add this to every timestamp, to simulate a skewed node clock")
    p.add_argument("--clock-drift-ppm", type=float, default=0.0,
                   help="TESTING ONLY: and let that skew grow by this many ns per ms since --clock-epoch-ns")
    p.add_argument("--clock-epoch-ns", type=int, default=0, help="TESTING ONLY: Unix ns where drift is 0")
    p.add_argument("--clock-step-file", default=None,
                   help="TESTING ONLY: once this file appears (a step in ms), step the clock by it")
    p.add_argument("--ready-file", default=None, help="created once probes are attached")
    p.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)


def _run(args: argparse.Namespace) -> int:
    import logging
    import sys

    from rankecho import exitcodes, stopflag
    from rankecho.agent import discovery, probes, settings

    stop = stopflag.install()  # already done by rankecho.cli.main; again for callers that skip it

    if args.ebpf:
        cfg = probes.ProbeConfig(offcpu_min_ns=int(args.offcpu_min_ms * 1e6), filter_pids=bool(args.pid))
        print(probes.render(cfg))
        return 0
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s rankecho-agent %(levelname)s %(message)s")
    log = logging.getLogger("rankecho.agent")
    try:
        s = settings.from_args(args)
    except ValueError as err:  # e.g. an unreadable --token-file: bad input, named with the fix
        log.error("%s", err)
        stopflag.ignore_further()
        return exitcodes.USAGE
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
    p = subparsers.add_parser(
        "agent", help="run the per-node eBPF agent (root)",
        description="Trace NCCL, CUDA runtime and scheduler events of every training process on this node "
        "and send them to Echo over OTLP/gRPC (plaintext unless --tls or --ca-file; needs root). Run "
        "'rankecho agent check' first on a new node.",
        epilog=examples(
            "sudo RANKECHO_TOKEN=$(cat token) rankecho agent --endpoint echo:4317 --cluster-id job-42",
            "sudo rankecho agent --endpoint echo:4317 --ca-file ca.pem --token-file /etc/rankecho/token",
            "sudo rankecho agent check",
        ),
    )  # fmt: skip
    _add_run_options(p)
    p.set_defaults(handler=_run)
    sub = p.add_subparsers(dest="agent_command", metavar="{check}")
    chk = sub.add_parser(
        "check", help="check this node can run the agent; prints the fix for each gap",
        description="Check, without attaching anything, that this node can run the agent: privileges "
        "(root, or CAP_BPF + CAP_PERFMON), BTF, tracefs, the bcc bindings, kernel headers, the NCCL and CUDA "
        "runtime libraries to trace (those running processes map, or the files given) and their probe "
        "cost, NVML. Prints one line per check, with the fix for each gap, then 'ready' or 'not ready'; "
        "exits 0 when every required check passes, 1 otherwise.",
        epilog=examples("sudo rankecho agent check",
                        "sudo rankecho agent check --nccl-lib /opt/nccl/lib/libnccl.so.2"),
    )  # fmt: skip
    chk.add_argument("--nccl-lib", action="append", metavar="PATH",
                     help="check this libnccl file (repeatable; default: those running processes map)")
    chk.add_argument("--cuda-lib", action="append", metavar="PATH",
                     help="check this libcudart file (repeatable; default: those running processes map)")
    chk.set_defaults(handler=_check)


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds, 0 or more (e.g. 5; 0 = off)")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of steps, at least 1 (e.g. 10)")
    return value
