"""``rankecho diagnose``: the straggler diagnosis for a person in a terminal (or ``--json`` for scripts).

Two sources, one answer: ``--db FILE`` opens a store no Echo holds (read-only and sealed, like
``rankecho query``) and runs the diagnosis in this process; ``--endpoint URL`` asks a running Echo over
MCP (``fleet.cluster.find_stragglers``), with the MCP bearer token from ``--token-file``,
``$RANKECHO_MCP_TOKEN`` or ``$RANKECHO_TOKEN``. Exit codes: 0 answered (stragglers or not), 1 the
question could not be answered (bad window, unreachable Echo, refused token, no agent data in the
window: the message says for which clusters and times there is), 3 the store is held by a running Echo
(ask it with --endpoint). With ``--json``, no agent data also prints ``{"error": ..., "exit_code": 1}``.

Usage::

    rankecho diagnose --db echo.db --window "last 10m"
    rankecho diagnose --endpoint http://echo:8000/mcp --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

TOOL = "fleet.cluster.find_stragglers"


class DiagnoseError(RuntimeError):
    """The diagnosis could not be obtained; the message says why and what to do."""


def from_store(db: Path, window: str | None, cluster_id: str | None, min_late_ms: float | None,
               timeout_s: float, memory_limit: str) -> dict[str, Any]:  # fmt: skip
    """Run the diagnosis on a store file in this process."""
    import duckdb

    from rankecho.echo.guard.instance import open_sealed
    from rankecho.echo.mcp.diagnosis import DiagnosisError
    from rankecho.echo.mcp.rates import load_rates
    from rankecho.echo.mcp.tools import Investigation, InvestigationError, Limits
    from rankecho.echo.store.reader import Reader

    try:
        con = open_sealed(db, memory_limit)
    except (FileNotFoundError, duckdb.Error) as exc:
        raise DiagnoseError(f"cannot open {db}: {exc}") from None
    try:
        inv = Investigation(Reader(con, timeout_s=timeout_s), load_rates(), Limits(timeout_s=timeout_s))
        return inv.diagnosis.find_stragglers(window, cluster_id, min_late_ms)
    except (InvestigationError, DiagnosisError) as exc:
        raise DiagnoseError(str(exc)) from None
    finally:
        con.close()


def from_endpoint(url: str, token: str | None, window: str | None, cluster_id: str | None,
                  min_late_ms: float | None, timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """Ask a running Echo over MCP (streamable HTTP)."""
    from fastmcp import Client
    from fastmcp.exceptions import ToolError

    arguments: dict[str, Any] = {"window": window, "cluster_id": cluster_id, "min_late_ms": min_late_ms}

    async def call() -> dict[str, Any]:
        async with Client(url, auth=token, timeout=timeout_s) as client:
            result = await client.call_tool(TOOL, {k: v for k, v in arguments.items() if v is not None})
            return dict(result.structured_content or {})

    try:
        return asyncio.run(call())
    except ToolError as exc:
        raise DiagnoseError(str(exc)) from None
    except Exception as exc:  # the MCP client hides HTTP failures: ask the endpoint plainly what is wrong
        raise DiagnoseError(
            f"cannot ask {url}: {_why(url, token) or f'{exc.__class__.__name__}: {exc}'}"
        ) from None


def _why(url: str, token: str | None) -> str | None:
    """What a plain HTTP request to the MCP endpoint says (refused token, nothing listening), or None."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        status = httpx.post(url, headers=headers, json={}, timeout=5).status_code
    except httpx.HTTPError as exc:
        return f"nothing answers there ({exc.__class__.__name__}): is Echo running with --mcp-http there?"
    if status == 401:
        return (
            "Echo refused the bearer token: pass Echo's MCP token with --token-file or RANKECHO_MCP_TOKEN "
            "(else RANKECHO_TOKEN)"
        )
    if status == 404:
        return "no MCP endpoint at this path: Echo serves it at http://HOST:PORT/mcp"
    return None


def read_token(path: str | None) -> str | None:
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return os.environ.get("RANKECHO_MCP_TOKEN") or os.environ.get("RANKECHO_TOKEN")


def main(args: argparse.Namespace) -> int:
    from rankecho.echo.report import no_data_exit, render_stragglers
    from rankecho.echo.store.lock import is_locked, read_holder

    try:
        if args.db:
            db = Path(args.db)
            if is_locked(db):
                holder = read_holder(db)
                print(f"rankecho diagnose: {db} is held by a running Echo (pid {holder}); ask it with "
                      "--endpoint http://HOST:8000/mcp", file=sys.stderr)  # fmt: skip
                return 3
            result = from_store(
                db, args.window, args.cluster_id, args.min_late_ms, args.timeout, args.memory_limit
            )
        else:
            token = read_token(args.token_file)
            result = from_endpoint(
                args.endpoint, token, args.window, args.cluster_id, args.min_late_ms, args.timeout
            )
    except (DiagnoseError, OSError) as exc:
        print(f"rankecho diagnose: {exc}", file=sys.stderr)
        return 1
    if (code := no_data_exit("diagnose", result, args.json)) is not None:
        return code
    print(json.dumps(result, indent=1) if args.json else render_stragglers(result))
    return 0
