"""``rankecho explain``: what one late rank did just before one collective, for a person in a terminal
(``fleet.cluster.explain_straggler``; ``--json`` for scripts).

The step after ``rankecho diagnose``: it names a straggler and its late episodes (node, rank,
causal_chain_id, timestamp_ns); this shows one of them: the rank's time per cause in the ``--before-ms``
before the call against its on-time peers' median, the excess, the dominant cause, the last intervals of
its timeline and every rank's lateness at that collective. Same two sources as ``diagnose``, through
:mod:`rankecho.echo.ask`: ``--db FILE`` (a store no Echo holds) or ``--mcp-url URL`` (a running Echo).
Exit codes (:mod:`rankecho.exitcodes`): 0 explained, 1 could not be (no such call, unreachable Echo,
refused token), 3 the store is held by a running Echo.

Usage::

    rankecho explain --db echo.db --node-id node-b --rank 5 --causal-chain-id 'c0:137'
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rankecho import exitcodes
from rankecho.echo.ask import answer

TOOL = "fleet.cluster.explain_straggler"
TIMELINE_SHOWN = 15
"""Timeline intervals printed (the last ones before the call); ``--json`` has them all."""


def render_explanation(result: dict[str, Any]) -> str:
    """One explain_straggler answer as text: the verdict, time per cause against the peers, the end of
    the timeline, every rank's lateness."""
    from rankecho.echo.report import text_table

    out = [
        f"rank {result['rank']} on {result['node_id']}, step {result['step']}, collective "
        f"{result['causal_chain_id']} at {result['time']}: late by {result['late_by_ms']:.1f} ms "
        f"(threshold {result['threshold_ms']} ms)",
        f"  {result['explanation']}",
        f"\ntime per cause in the {result['before_ms']:g} ms before the call, against the median of "
        f"{result['peers_compared']} on-time peers (ms):",
    ]
    causes = [
        {"cause": c, "this rank": ms, "peers (median)": result["peers_median_ms"].get(c),
         "excess": result["excess_ms"].get(c)}
        for c, ms in result["breakdown_ms"].items()
    ]  # fmt: skip
    out.append(text_table(causes))
    timeline = result["timeline"][-TIMELINE_SHOWN:]
    more = len(result["timeline"]) - len(timeline)
    out.append(f"\nlast {len(timeline)} intervals before the call (ms, 0 = the call)"
               + (f"; {more} earlier ones in --json" if more else "") + ":")  # fmt: skip
    out.append(text_table(timeline))
    distinct = (result.get("stacks") or {}).get("distinctive") or []
    if distinct:
        peers = result["stacks"]["peers_compared"]
        out.append(f"\nstacks it ran that its {peers} peers did not (ms, callee first):")
        out.append(text_table([
            {"ms": d["rank_ms"], "peers (mean)": d["peers_mean_ms"], "cause": d["category"],
             "stack": d["leading_frames"] or f"[stack {d['stack_id']}]"}
            for d in distinct
        ]))  # fmt: skip
    out.append("\nevery rank at that collective:")
    out.append(text_table(result["arrivals"]))
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    if args.causal_chain_id is None and args.timestamp_ns is None:
        print("rankecho explain: give --causal-chain-id or --timestamp-ns of the late call "
              "(rankecho diagnose --json lists both per episode)", file=sys.stderr)  # fmt: skip
        return exitcodes.USAGE
    arguments = {
        "node_id": args.node_id,
        "rank": args.rank,
        "causal_chain_id": args.causal_chain_id,
        "timestamp_ns": args.timestamp_ns,
        "before_ms": args.before_ms,
        "cluster_id": args.cluster_id,
        "job_id": getattr(args, "job_id", None),
    }
    question = lambda inv: inv.explainer.explain_straggler(**arguments)  # noqa: E731
    result = answer(args, "explain", TOOL, arguments, question)
    if isinstance(result, int):
        return result
    print(json.dumps(result, indent=1) if args.json else render_explanation(result))
    return exitcodes.OK
