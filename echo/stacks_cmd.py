"""``rankecho stacks``: one rank's call stacks exported for flame-graph tools (``fleet.cluster.stacks``).

Over a window (``--start``/``--end``, or ``--window``) or one late episode's pre-call window
(``--causal-chain-id``, as ``rankecho diagnose --json`` lists them), each stack weighted by the time it
carried. ``--format folded``: one line per stack, frames root first joined by ``;``, then a space and the
weight in microseconds (flamegraph.pl, speedscope, inferno). ``--format pprof``: a gzipped
``profile.proto`` (``go tool pprof``, speedscope, Pyroscope), one sample per stack valued in nanoseconds
(:mod:`rankecho.echo.pprof`). Same two sources as ``diagnose`` (:mod:`rankecho.echo.ask`). Exit codes: 0
written, 1 nothing to write or could not be asked, 2 bad usage, 3 the store is held by a running Echo.

Usage::

    rankecho stacks --db echo.db --node-id node-1 --rank 3 --causal-chain-id 'w0rld:28' -o late.folded
    rankecho stacks --db echo.db --rank 3 --start 2026-12-02T14:30:00Z --end 2026-12-02T14:35:00Z \
        --format pprof -o rank3.pb.gz
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rankecho import exitcodes
from rankecho.echo.ask import answer
from rankecho.echo.pprof import Weighted, encode

TOOL = "fleet.cluster.stacks"
OPEN_START = "1970-01-01T00:00:00Z"
OPEN_END = "2200-01-01T00:00:00Z"


def time_arg(text: str | None, default: str) -> str:
    """An ISO-8601 time as given, or integer Unix ns as ISO with microseconds; ``default`` when absent."""
    if text is None:
        return default
    if text.strip().lstrip("-").isdigit():
        ns = int(text)
        return datetime.fromtimestamp(ns // 1000 / 1e6, UTC).isoformat().replace("+00:00", "Z")
    return text.strip()


def window_of(args: argparse.Namespace) -> str | None:
    """The window text the tool takes: ``--window``, else ``--start/--end`` (either may be left open)."""
    if args.start is None and args.end is None:
        return args.window
    return f"{time_arg(args.start, OPEN_START)}/{time_arg(args.end, OPEN_END)}"


def folded_text(result: dict[str, Any]) -> str:
    """The answer's folded lines (root first, ';'-joined, weight in microseconds last), one per stack."""
    return "".join(f"{line}\n" for line in result["folded"])


def pprof_bytes(result: dict[str, Any]) -> bytes:
    """The answer as a gzipped pprof profile: one sample per stack, its time in ns."""
    stacks = []
    for s in result["stacks"]:
        frames = s["frames"] if s["frames"] is not None else [f"[stack {s['stack_id']}]"]
        if s.get("frames_cut"):
            frames = [*frames, "[...]"]
        stacks.append(Weighted(frames, round(s["ms"] * 1e6), s["category"]))
    return encode(stacks)


def main(args: argparse.Namespace) -> int:
    if args.causal_chain_id is not None and (args.start or args.end or args.window):
        print(
            "rankecho stacks: give --causal-chain-id or a window (--start/--end, --window), not both",
            file=sys.stderr,
        )
        return exitcodes.USAGE
    if args.causal_chain_id is not None and args.node_id is None:
        print("rankecho stacks: --causal-chain-id needs --node-id (the call is one node's)", file=sys.stderr)
        return exitcodes.USAGE
    arguments = {
        "node_id": args.node_id,
        "rank": args.rank,
        "window": window_of(args),
        "causal_chain_id": args.causal_chain_id,
        "cluster_id": args.cluster_id,
        "job_id": args.job_id,
        "limit": args.limit,
    }
    result = answer(args, "stacks", TOOL, arguments, lambda inv: inv.stacks.rank(**arguments))
    if isinstance(result, int):
        return result
    if not result["stacks"]:
        print(f"rankecho stacks: {result['note']}", file=sys.stderr)
        return exitcodes.FAILED
    data = folded_text(result).encode() if args.format == "folded" else pprof_bytes(result)
    if args.output == "-":
        sys.stdout.buffer.write(data)
    else:
        Path(args.output).write_bytes(data)
    cut = " (cut to --limit: the stacks with the most time)" if result["truncated"] else ""
    print(
        f"rankecho stacks: {len(result['stacks'])} stacks, {result['total_ms']:.1f} ms, {args.format} -> "
        f"{args.output}{cut}",
        file=sys.stderr,
    )
    return exitcodes.OK
