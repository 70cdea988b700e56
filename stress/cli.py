"""``rankecho stress``: argument parsing only; the work happens in :mod:`rankecho.stress.runner`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from rankecho import exitcodes
from rankecho.helpfmt import examples
from rankecho.shared.clientflags import (
    TOKEN_ENV,
    TokenFileError,
    add_tls_options,
    add_token_options,
    plaintext_warning,
    read_token,
    tls_wanted,
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "stress",
        help="push synthetic health events with planted stragglers and causal-chain markers into Echo",
        description=(
            "P concurrent producers send E events each over OTLP/gRPC. Producer p reports as node "
            "<node-id>-<p> (or <node-id> when P is 1). Stream index i (0-based over all producers, "
            "producer p owning the block p*E..p*E+E-1) is a causal-chain marker when i % chain-every == 0 "
            "and a straggler (health < 0.4) when i > 0 and i % straggler-every == 0. "
            "The last stdout line is JSON: sent, acked, failed, elapsed_s, eps. Plaintext gRPC unless "
            "--tls or --ca-file asks for TLS (like the agent)."
        ),
        epilog=examples(
            "RANKECHO_TOKEN=$(cat token) rankecho stress --endpoint 127.0.0.1:4317 --cluster-id c1 "
            "--node-id node-a --producers 4 --insecure",
            "rankecho stress --endpoint echo:4317 --ca-file ca.pem --token-file token --cluster-id c1 "
            "--node-id node-a --rate 5000 --duration 60",
        ),
    )
    p.add_argument("--endpoint", required=True, metavar="HOST:PORT", help="Echo's OTLP/gRPC HOST:PORT")
    add_token_options(p, token_flag=True)
    p.add_argument("--cluster-id", required=True, help="the cluster every event reports")
    p.add_argument("--node-id", required=True, help="the node name (suffixed -<p> with several producers)")
    p.add_argument("--producers", type=int, default=1, help="concurrent producers, one connection each")
    p.add_argument("--events-per-producer", type=int, default=250, help="events each producer sends")
    p.add_argument(
        "--rate", type=float, help="events per second over all producers (default: as fast as acked)"
    )
    p.add_argument("--chain-every", type=int, default=25, help="every Nth event is a causal-chain marker")
    p.add_argument("--straggler-every", type=int, default=100, help="every Nth event is a straggler")
    p.add_argument(
        "--client",
        choices=("sdk", "raw"),
        default="raw",
        help="raw: prebuilt protobuf on a grpc channel; sdk: OpenTelemetry OTLPMetricExporter",
    )
    p.add_argument(
        "--batch", type=int, default=2000, help="events per Export RPC (capped so --rate stays smooth)"
    )
    add_tls_options(p)
    p.add_argument(
        "--run-id",
        default="r0",
        help="part of every event id: the same run id and --start-ns resend the same events (stored once)",
    )
    p.add_argument("--start-ns", type=int, help="timestamp of each producer's first event (default: now)")
    p.add_argument(
        "--retry-deadline",
        type=float,
        default=60.0,
        help="seconds one batch may keep failing before it counts as failed",
    )
    p.add_argument("--duration", type=float, help="stop starting new batches after this many seconds")
    p.add_argument("--ack-log", help="append one JSON line per acknowledged batch to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    fleet = p.add_argument_group("--shape agent: a job's node agents (docs/stress.md)")
    fleet.add_argument("--shape", choices=("health", "agent"), default="health",
                       help="health: the planted health stream above; agent: what node agents send for a job")
    fleet.add_argument("--ranks", type=int, default=64, help="ranks in the job")
    fleet.add_argument("--ranks-per-node", type=int, default=8, help="ranks per node (one agent each)")
    fleet.add_argument("--step-ms", type=float, default=1000.0, help="training step length")
    fleet.add_argument("--stragglers", type=int, default=2, help="ranks planted late (cudaMalloc stalls)")
    fleet.add_argument("--speed", choices=("real", "max"), default="real",
                       help="real: the job's clock, reports lag_s; max: as fast as Echo acknowledges")
    fleet.add_argument("--prebuild", action="store_true", help="encode everything before the clock starts")
    fleet.add_argument("--gpus", action="store_true", help="ranks have GPUs: 6 NVML gauges per rank per s")
    p.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rankecho.shared.retry import RetryPolicy
    from rankecho.stress.planting import StressPlan
    from rankecho.stress.runner import StressConfig, run
    from rankecho.stress.senders import Target

    try:
        token = read_token(args.token_file, os.environ, token=args.token)
    except TokenFileError as err:
        print(f"rankecho stress: {err}", file=sys.stderr)
        return exitcodes.USAGE
    tls = tls_wanted(args)
    if args.shape == "agent":
        from rankecho.stress.fleet import handle

        warning = plaintext_warning("rankecho stress", args.endpoint, tls, args.insecure)
        if warning:
            print(warning, file=sys.stderr)
        return handle(args, token, tls)
    step_ns = int(1e9 * args.producers / args.rate) if args.rate else 1_000_000
    try:
        plan = StressPlan(
            cluster_id=args.cluster_id,
            node_id=args.node_id,
            producers=args.producers,
            events_per_producer=args.events_per_producer,
            chain_every=args.chain_every,
            straggler_every=args.straggler_every,
            run_id=args.run_id,
            start_ns=args.start_ns if args.start_ns is not None else time.time_ns(),
            step_ns=max(1, step_ns),
        )
    except ValueError as err:
        print(f"rankecho stress: {err}", file=sys.stderr)
        return exitcodes.USAGE
    cfg = StressConfig(
        plan=plan,
        target=Target(args.endpoint, token, not tls, args.ca_file, args.cert_file, args.key_file),
        client=args.client,
        batch=args.batch,
        rate=args.rate,
        retry=RetryPolicy(deadline_s=args.retry_deadline),
        ack_log=Path(args.ack_log) if args.ack_log else None,
        progress=None if args.quiet else sys.stderr,
        duration_s=args.duration,
    )
    warning = plaintext_warning("rankecho stress", args.endpoint, tls, args.insecure)
    if warning:
        print(warning, file=sys.stderr)
    if token is None and not args.quiet:
        print(
            f"rankecho stress: no token (${TOKEN_ENV} or --token-file); Echo will refuse unless it runs "
            "with --insecure-no-auth",
            file=sys.stderr,
        )
    result = run(cfg)
    print(result.to_json(), flush=True)
    return exitcodes.OK if result.failed == 0 and result.rejected == 0 else exitcodes.FAILED
