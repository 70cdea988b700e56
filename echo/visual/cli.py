"""``rankecho report`` and ``rankecho export-trace``: the diagnosis as pictures.

Import-light: argparse only here; drawing libraries load in the handlers. Sources and failures are those
of ``rankecho diagnose`` (:mod:`rankecho.echo.ask`): ``--db`` or ``--mcp-url``, exit 3 when a running
Echo holds the store, 1 with the fix for anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rankecho import exitcodes
from rankecho.helpfmt import DeprecatedAlias, examples


def _source_flags(p: argparse.ArgumentParser) -> None:
    from rankecho.echo.cli import add_source

    source = add_source(p, "a store file no Echo holds (opened read-only)")
    source.add_argument("--endpoint", metavar="URL", action=DeprecatedAlias, dest="mcp_url",
                        replacement="--mcp-url")
    p.add_argument("--window", help="e.g. 'last 10m' (default: all stored data)")
    p.add_argument("--cluster-id", help="the cluster to draw (default: the top straggler's)")
    p.add_argument("--node-id", help="only this node's lanes (default: all)")
    p.add_argument("--rank", type=int, help="only this rank's lane (default: all)")
    p.add_argument("--at", type=int, metavar="NS", dest="timestamp_ns",
                   help="centre on this time (ns, corrected clock; default: the latest late episode)")
    p.add_argument("--before-ms", type=float, default=500.0, help="pre-call window drawn (ms)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="a self-contained HTML report with the timeline and heat map (plus PNGs and a trace)",
        description="Write the diagnosis as a self-contained HTML report that works offline (the timeline of "
        "a few steps around the latest late episode, the lateness heat map, imposed wait and cost), the two "
        "charts as PNGs and the Perfetto trace of the timeline. Prints the report's path.",
        epilog=examples(
            "rankecho report --db echo.db --out report/",
            'rankecho report --mcp-url http://echo:8000/mcp --window "last 30m"',
        ),
    )
    _source_flags(p)
    p.add_argument("--out", default="rankecho-report", metavar="DIR", help="directory written (created)")
    p.set_defaults(handler=_report)
    t = subparsers.add_parser(
        "export-trace",
        help="the cross-rank timeline as Chrome/Perfetto trace JSON",
        description="Write the timeline around a late episode as trace-event JSON: a process per node, a "
        "thread per rank and track, clock-corrected times, causal_chain_id in each slice's args. Open it in "
        "ui.perfetto.dev or chrome://tracing.",
        epilog=examples(
            "rankecho export-trace --db echo.db --out trace.json",
            'rankecho export-trace --mcp-url http://echo:8000/mcp --window "last 10m" --out -',
        ),
    )
    _source_flags(t)
    t.add_argument("--out", default="trace.json", metavar="FILE", help="file written ('-': stdout)")
    t.set_defaults(handler=_export_trace)


def _picture(args: argparse.Namespace, command: str) -> Any:
    from rankecho.echo.ask import StoreHeldError, held_message, mcp_token
    from rankecho.echo.store.lock import is_locked, read_holder
    from rankecho.echo.visual.source import picture_from_mcp, picture_from_store

    around = {"node_id": args.node_id, "rank": args.rank, "timestamp_ns": args.timestamp_ns,
              "before_ms": args.before_ms}  # fmt: skip
    if args.mcp_url:
        token = mcp_token(args.token_file)
        return picture_from_mcp(args.mcp_url, token, args.window, args.cluster_id, args.timeout, **around)
    db = Path(args.db)
    if is_locked(db):
        raise StoreHeldError(held_message(command, db, read_holder(db)))
    return picture_from_store(db, args.window, args.cluster_id, args.timeout, args.memory_limit, **around)


def _run(args: argparse.Namespace, command: str, write: Any) -> int:
    from rankecho.echo.ask import ANSWER_ERRORS, failed

    try:
        return int(write(_picture(args, command)))
    except ANSWER_ERRORS as exc:
        return failed(command, exc)


def _report(args: argparse.Namespace) -> int:
    def write(picture: Any) -> int:
        from rankecho.echo.visual.bundle import write_report

        print(write_report(picture, Path(args.out)))
        return exitcodes.OK

    return _run(args, "report", write)


def _export_trace(args: argparse.Namespace) -> int:
    def write(picture: Any) -> int:
        from rankecho.echo.visual.trace import to_trace

        text = json.dumps(to_trace(picture.view))
        if args.out == "-":
            sys.stdout.write(text + "\n")
        else:
            Path(args.out).write_text(text, encoding="utf-8")
            print(args.out)
        return exitcodes.OK

    return _run(args, "export-trace", write)
