"""``rankecho diagnose``: the straggler diagnosis for a person in a terminal (or ``--json`` for scripts).

Two sources, one answer: ``--db FILE`` opens a store no Echo holds (read-only and sealed, like
``rankecho query``) and runs the diagnosis in this process; ``--mcp-url URL`` asks a running Echo over
MCP (``fleet.cluster.find_stragglers``), with the MCP bearer token from ``--token-file``,
``$RANKECHO_MCP_TOKEN`` or ``$RANKECHO_TOKEN``. Exit codes: 0 answered (stragglers or not), 1 the
question could not be answered (bad window, unreachable Echo, refused token, no agent data in the
window: the message says for which clusters and times there is), 3 the store is held by a running Echo
(ask it with --mcp-url; ``--endpoint`` is its deprecated alias). With ``--json``, no agent data also
prints ``{"error": ..., "exit_code": 1}``. Both sources go through :mod:`rankecho.echo.ask`, like
``rankecho explain``. Hangs, crashes and desyncs (``fleet.cluster.find_hangs``) come first when there are
any (under ``failures`` with ``--json``): a job that stopped matters before one that is slow.

Usage::

    rankecho diagnose --db echo.db --window "last 10m"
    rankecho diagnose --mcp-url http://echo:8000/mcp --json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rankecho.echo.ask import ANSWER_ERRORS, answer, ask

TOOL = "fleet.cluster.find_stragglers"
FAILURES_TOOL = "fleet.cluster.find_hangs"


def main(args: argparse.Namespace) -> int:
    from rankecho.echo.report import no_data_exit, render_stragglers

    arguments = {"window": args.window, "cluster_id": args.cluster_id, "min_late_ms": args.min_late_ms,
                 "job_id": getattr(args, "job_id", None), "links": True}  # the overview: slow links too
    result = answer(args, "diagnose", TOOL, arguments, lambda inv: inv.diagnosis.find_stragglers(**arguments))
    if isinstance(result, int):
        return result
    if (code := no_data_exit("diagnose", result, args.json)) is not None:
        return code
    failures = _failures(args)
    if args.json:
        print(json.dumps({**result, "failures": failures} if failures else result, indent=1))
    else:
        print((render_failures(failures) + "\n" if failures else "") + render_stragglers(result))
    return 0


def _failures(args: argparse.Namespace) -> dict[str, Any] | None:
    """find_hangs' answer when it names anything; None when it names nothing or cannot be asked (an older
    Echo without the tool: the straggler answer still stands, with a note on stderr)."""
    arguments = {"window": args.window, "cluster_id": args.cluster_id}
    if getattr(args, "job_id", None):  # else every job: a hang in any of them comes first
        arguments["job_id"] = args.job_id
    try:
        found = ask(
            args, "diagnose", FAILURES_TOOL, arguments, lambda inv: inv.failures.find_hangs(**arguments)
        )
    except ANSWER_ERRORS as exc:
        print(f"rankecho diagnose: no hang/crash/desync check ({exc})", file=sys.stderr)
        return None
    return found if any(found.get(k) for k in ("hangs", "crashes", "desyncs")) else None


def render_failures(found: dict[str, Any]) -> str:
    """The failures for a terminal: the verdict, then one line per hang, crash and desync."""
    lines = [f"FAILURES: {found['verdict']}"]
    for kind in ("hangs", "crashes", "desyncs"):
        lines += [f"  {kind[:-1] if kind != 'crashes' else 'crash'}: {x['summary']}" for x in found[kind]]
    return "\n".join(lines) + "\n"
