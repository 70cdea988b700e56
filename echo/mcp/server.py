"""The fastmcp server: five read-only ``fleet.cluster.*`` tools and the ``rankecho://schema`` resource.

Each tool parses its arguments, calls one :class:`echo.mcp.tools.Investigation` method and returns its
dict; errors a caller can fix become ``ToolError`` with the fix, anything else is masked (no traces or
paths reach the caller).

Usage::

    server = build_server(Investigation(reader, load_rates()), token="s3cret")   # token: HTTP only
    async with fastmcp.Client(server) as client:
        await client.call_tool("fleet.cluster.summary", {})
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.auth import AccessToken, TokenVerifier
from mcp.types import ToolAnnotations
from pydantic import Field

from echo.guard.refusal import safe_message
from echo.mcp.schema import schema_document
from echo.mcp.tools import MAX_LIMIT, Investigation, InvestigationError

INSTRUCTIONS = (
    "rankecho Echo holds every node's GPU/NCCL/scheduler events of a training cluster in one table, "
    "`events`. To find the rank that stalls a job: call fleet.cluster.summary first (what clusters, "
    "nodes, metrics and time range exist, which node went quiet), then fleet.cluster.find_outlier_nodes "
    "on rankecho.health.score, then fleet.cluster.event_history for the outlier node, and "
    "fleet.cluster.run_analysis for cross-rank SQL (read rankecho://schema first). All tools are "
    "read-only; results are bounded and say when they were truncated."
)
READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)

Window = Annotated[
    str | None,
    Field(
        description="Time window (UTC). Omit for all data; 'last 5m' (s/m/h/d, ending at the newest event); "
        "'2026-12-02T14:30:00Z/2026-12-02T14:35:00Z'; or '14:30-14:35' on the day of the newest event."
    ),
]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Most rows to return (1..{MAX_LIMIT}).")]
T = TypeVar("T")


class BearerToken(TokenVerifier):
    """Accepts exactly one static bearer token (constant-time compare)."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if token and hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token=token, client_id="rankecho", scopes=[], expires_at=None)
        return None


def _answer(call: Callable[[], T]) -> T:
    try:
        return call()
    except InvestigationError as exc:
        raise ToolError(str(exc)) from None
    except Exception as exc:  # a tool answers with a safe message, never a trace
        raise ToolError(f"internal error: {safe_message(exc, 200)}") from None


def build_server(inv: Investigation, token: str | None = None) -> FastMCP:
    """The MCP server over ``inv``. With ``token``, HTTP callers must send ``Authorization: Bearer``."""
    mcp = FastMCP(
        "rankecho-echo",
        instructions=INSTRUCTIONS,
        auth=BearerToken(token) if token else None,
        mask_error_details=True,
    )

    @mcp.tool(name="fleet.cluster.summary", annotations=READ_ONLY)
    def summary(window: Window = None) -> dict[str, Any]:
        """Overview of what Echo holds: clusters, nodes (with their ranks, event counts, last event and
        staleness in seconds: `stale_s` against Echo's clock, `behind_newest_s` against the newest event
        of any node, so a node that stopped reporting stands out), ranks (events, last event,
        `behind_newest_s`, most lagging first: a rank stuck in a collective stops reporting), metrics
        with counts, and the time range. Call this first."""
        return _answer(lambda: inv.summary(window))

    @mcp.tool(name="fleet.cluster.event_history", annotations=READ_ONLY)
    def event_history(
        cluster_id: str | None = None,
        node_id: str | None = None,
        rank: int | None = None,
        metric_name: str | None = None,
        window: Window = None,
        limit: Limit = 1000,
    ) -> dict[str, Any]:
        """Raw events, oldest first, matching every filter given (omit a filter to match any). Each event
        has time (ISO-8601 UTC) and timestamp_ns, node_id, rank, metric_name, value, causal_chain_id and
        its attributes. Use it to read what one node or rank did around an incident; for counts or
        comparisons across ranks use run_analysis instead. `truncated` is true when more rows matched."""
        return _answer(lambda: inv.event_history(cluster_id, node_id, rank, metric_name, window, limit))

    @mcp.tool(name="fleet.cluster.find_outlier_nodes", annotations=READ_ONLY)
    def find_outlier_nodes(
        metric: Annotated[str, Field(description="Metric name, e.g. 'rankecho.health.score'.")],
        window: Window = None,
        threshold: Annotated[
            float | None,
            Field(
                description="method='threshold': the value cutoff (e.g. 0.4 for health). method='mad': k "
                "(default 3). Omit with method='threshold' to compare against peers (MAD, k=3)."
            ),
        ] = None,
        method: Literal["threshold", "mad"] = "threshold",
        cluster_id: str | None = None,
    ) -> dict[str, Any]:
        """Nodes ranked by how far below their peers they are on one metric (lower = worse, as for health
        scores). 'threshold' counts each node's events under the cutoff; 'mad' sets the cutoff at the peers'
        median - k * MAD * 1.4826 (peers = every other node) and flags a node whose median is under it.
        Per node: events, min/median/p95, peer median and MAD, cutoff, `below` (events under the cutoff),
        robust_z, and the lowest events under the cutoff (time, rank, value, causal_chain_id) as evidence."""
        return _answer(lambda: inv.find_outlier_nodes(metric, window, threshold, method, cluster_id))

    @mcp.tool(name="fleet.cluster.run_analysis", annotations=READ_ONLY)
    def run_analysis(
        sql: Annotated[str, Field(description="Exactly one read-only SELECT over the `events` table.")],
        limit: Limit = 1000,
    ) -> dict[str, Any]:
        """Run one read-only SQL SELECT (DuckDB dialect) over the `events` table and return columns, rows
        as objects, row_count, truncated and elapsed_ms. Read rankecho://schema for columns, units and
        examples. Allowed: CTEs, joins, subqueries, LATERAL, set operations, window functions, aggregates
        (quantile_cont, median, arg_max), JSON functions (json_extract_string), range/unnest. Refused:
        files, URLs, other databases, DuckDB catalog/settings, and anything that writes; a refusal says
        why. Queries are stopped after a few seconds: filter on timestamp_ns and aggregate."""
        return _answer(lambda: inv.run_analysis(sql, limit))

    @mcp.tool(name="fleet.cluster.get_cost", annotations=READ_ONLY)
    def get_cost(window: Window = None, cluster_id: str | None = None) -> dict[str, Any]:
        """GPU-hours observed per (cluster, node, GPU model) in the window and their cost: each rank is one
        GPU, observed from its first to its last event; the rate per GPU-hour comes from the rates file by
        the rankecho.gpu.model attribute (default rate when unknown). Returns rows, totals and currency."""
        return _answer(lambda: inv.get_cost(window, cluster_id))

    @mcp.resource(
        "rankecho://schema",
        name="schema",
        description="Tables, columns (type, meaning, unit), metric names and example SQL for run_analysis.",
        mime_type="application/json",
    )
    def schema() -> dict[str, Any]:
        return _answer(lambda: schema_document(inv.reader))

    return mcp
