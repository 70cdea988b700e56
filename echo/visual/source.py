"""Where the report and the trace get their JSON: a store file opened here, or a running Echo over MCP.

Both give the same dicts (find_stragglers' answer, the timeline, the heat map): over MCP they are the
tools' answers, from a file they are the same core methods run in this process on a sealed, read-only
connection (like ``rankecho query`` and ``rankecho diagnose``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation


class SourceError(RuntimeError):
    """The data could not be obtained; the message says why and what to do."""


@dataclass(frozen=True)
class Picture:
    """Everything a report or a trace draws."""

    found: dict[str, Any]
    """find_stragglers' answer for the window."""
    view: dict[str, Any]
    """The timeline around the focused episode (:meth:`Timeline.around`)."""
    cells: list[dict[str, Any]]
    """The lateness heat map's cells."""


@contextmanager
def store_investigation(db: Path, timeout_s: float, memory_limit: str) -> Iterator[Investigation]:
    """The tools' core over a store file no Echo holds (sealed, read-only)."""
    import duckdb

    from rankecho.echo.guard.instance import open_sealed
    from rankecho.echo.mcp.rates import load_rates
    from rankecho.echo.mcp.tools import Investigation, Limits
    from rankecho.echo.store.reader import Reader

    try:
        con = open_sealed(db, memory_limit)
    except (FileNotFoundError, duckdb.Error) as exc:
        raise SourceError(f"cannot open {db}: {exc}") from None
    try:
        yield Investigation(Reader(con, timeout_s=timeout_s), load_rates(), Limits(timeout_s=timeout_s))
    finally:
        con.close()


def picture_from_store(db: Path, window: str | None, cluster_id: str | None, timeout_s: float,
                       memory_limit: str, **around: Any) -> Picture:  # fmt: skip
    from rankecho.echo.mcp.diagnosis import DiagnosisError
    from rankecho.echo.mcp.timeline import TimelineError
    from rankecho.echo.mcp.tools import InvestigationError

    with store_investigation(db, timeout_s, memory_limit) as inv:
        try:
            progress("finding stragglers")
            found = inv.diagnosis.find_stragglers(window, cluster_id)
            progress("reading the timeline around the focused episode")
            view = inv.timeline.around(window, cluster_id, **around)
            progress("reading the lateness heat map")
            cells = inv.timeline.heatmap(window, view["focus"].get("cluster_id"))["cells"]
        except (InvestigationError, DiagnosisError, TimelineError) as exc:
            raise SourceError(str(exc)) from None
    return Picture(found, view, cells)


def picture_from_mcp(url: str, token: str | None, window: str | None, cluster_id: str | None,
                     timeout_s: float, **around: Any) -> Picture:  # fmt: skip
    base = {k: v for k, v in {"window": window, "cluster_id": cluster_id}.items() if v is not None}
    progress("asking Echo for the stragglers")
    found = call_tool(url, token, "fleet.cluster.find_stragglers", base, timeout_s)
    progress("asking Echo for the timeline and the heat map")
    extra = {k: v for k, v in around.items() if v is not None}
    view = call_tool(url, token, "fleet.cluster.timeline", {**base, **extra, "heatmap": True}, timeout_s)
    return Picture(found, view, view.pop("heatmap", []))


def call_tool(url: str, token: str | None, tool: str, arguments: dict[str, Any],
              timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """One MCP tool call over streamable HTTP; its structured answer."""
    from fastmcp import Client
    from fastmcp.exceptions import ToolError

    async def call() -> dict[str, Any]:
        async with Client(url, auth=token, timeout=timeout_s) as client:
            result = await client.call_tool(tool, arguments)
            return dict(result.structured_content or {})

    try:
        return asyncio.run(call())
    except ToolError as exc:
        raise SourceError(str(exc)) from None
    except Exception as exc:  # the MCP client hides HTTP failures behind its own errors
        raise SourceError(
            f"cannot ask {url} ({exc.__class__.__name__}: {exc}): is Echo running with --mcp-http there, and "
            "is the token right (--token-file, RANKECHO_MCP_TOKEN or RANKECHO_TOKEN)?"
        ) from None


def progress(what: str) -> None:
    """One line on stderr per stage, so a report on a large store shows it is working."""
    print(f"rankecho: {what} ...", file=sys.stderr, flush=True)
