"""``rankecho diagnose``: the straggler diagnosis for a person in a terminal (or ``--json`` for scripts).

Two sources, one answer: ``--db FILE`` opens a store no Echo holds (read-only and sealed, like
``rankecho query``) and runs the diagnosis in this process; ``--mcp-url URL`` asks a running Echo over
MCP (``fleet.cluster.find_stragglers``), with the MCP bearer token from ``--token-file``,
``$RANKECHO_MCP_TOKEN`` or ``$RANKECHO_TOKEN``. Exit codes: 0 answered (stragglers or not), 1 the
question could not be answered (bad window, unreachable Echo, refused token, no agent data in the
window: the message says for which clusters and times there is), 3 the store is held by a running Echo
(ask it with --mcp-url; ``--endpoint`` is its deprecated alias). With ``--json``, no agent data also
prints ``{"error": ..., "exit_code": 1}``. Both sources go through :mod:`rankecho.echo.ask`, like
``rankecho explain``.

Usage::

    rankecho diagnose --db echo.db --window "last 10m"
    rankecho diagnose --mcp-url http://echo:8000/mcp --json
"""

from __future__ import annotations

import argparse
import json

from rankecho.echo.ask import answer

TOOL = "fleet.cluster.find_stragglers"


def main(args: argparse.Namespace) -> int:
    from rankecho.echo.report import no_data_exit, render_stragglers

    arguments = {"window": args.window, "cluster_id": args.cluster_id, "min_late_ms": args.min_late_ms}
    result = answer(args, "diagnose", TOOL, arguments, lambda inv: inv.diagnosis.find_stragglers(**arguments))
    if isinstance(result, int):
        return result
    if (code := no_data_exit("diagnose", result, args.json)) is not None:
        return code
    print(json.dumps(result, indent=1) if args.json else render_stragglers(result))
    return 0
