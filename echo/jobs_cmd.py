"""``rankecho jobs``: the jobs Echo holds, for a person in a terminal (or ``--json`` for scripts).

A cluster runs many jobs, each with ranks 0..N-1; this lists them (``fleet.cluster.jobs``) so that one
can be diagnosed with ``rankecho diagnose --job-id``. Same sources and exit codes as ``rankecho
diagnose`` (:mod:`rankecho.echo.ask`): ``--db FILE`` or ``--mcp-url URL``.

Usage::

    rankecho jobs --db echo.db --window "last 1h"
    rankecho jobs --mcp-url http://echo:8000/mcp --json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rankecho import exitcodes
from rankecho.echo.ask import answer

TOOL = "fleet.cluster.jobs"
COLUMNS = ("cluster_id", "job_id", "ranks", "nodes", "first", "last", "steps", "stragglers")


def render_jobs(result: dict[str, Any]) -> str:
    """The jobs as an aligned table, newest first; an empty job id shows as '(none)'."""
    from rankecho.echo.report import text_table

    rows = [{c: (", ".join(row[c]) if c == "nodes" else row[c]) for c in COLUMNS} for row in result["jobs"]]
    for row in rows:
        row["job_id"] = row["job_id"] or "(none: older agents)"
    more = " (truncated: narrow --window)" if result["truncated"] else ""
    return f"{result['count']} job{'s' if result['count'] != 1 else ''}{more}\n" + text_table(rows)


def main(args: argparse.Namespace) -> int:
    arguments = {"window": args.window, "cluster_id": args.cluster_id}
    result = answer(args, "jobs", TOOL, arguments, lambda inv: inv.jobs.list(**arguments))
    if isinstance(result, int):
        return result
    print(json.dumps(result, indent=1) if args.json else render_jobs(result))
    return exitcodes.OK
