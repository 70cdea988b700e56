"""The fastmcp server: eleven read-only ``fleet.cluster.*`` tools and the ``rankecho://schema`` resource.

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

from rankecho.echo.guard.refusal import safe_message
from rankecho.echo.mcp.diagnosis import DiagnosisError
from rankecho.echo.mcp.schema import schema_document
from rankecho.echo.mcp.stacks import MAX_STACKS, STACKS_LIMIT, StacksError
from rankecho.echo.mcp.timeline import MAX_SLICES, TimelineError
from rankecho.echo.mcp.tools import MAX_LIMIT, Investigation, InvestigationError

INSTRUCTIONS = (
    "rankecho Echo holds every node's GPU/NCCL/scheduler events of a training cluster. To find the rank "
    "that stalls a job: call fleet.cluster.find_stragglers (which rank or node held the others back, by "
    "how much, how often, why, at what cost), then fleet.cluster.explain_straggler on one of its late "
    "episodes for the timeline before that call. fleet.cluster.summary says what is stored (clusters, "
    "nodes, clock offsets, which agents attached mid-run); fleet.cluster.event_history reads raw events; "
    "fleet.cluster.run_analysis runs your own SQL (read rankecho://schema first); fleet.cluster.get_cost "
    "prices GPU time and stalls. A cluster runs many jobs, each with ranks 0..N-1: the analysing tools "
    "take job_id (default: the window's most recent job, named in the answer's job_id); "
    "fleet.cluster.jobs lists the jobs. fleet.cluster.stacks gives one rank's call stacks (folded), and "
    "explain_straggler its late call's stacks against its peers'. All tools are read-only; results are "
    "bounded and say when they were truncated."
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
JobId = Annotated[
    str | None,
    Field(
        description="The job to analyse, as fleet.cluster.jobs lists it (the agent's rankecho.job.id; '' = "
        "points without one, from older agents). Omit for the window's most recent job (named in the "
        "answer's job_id)."
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
    except (InvestigationError, DiagnosisError, TimelineError, StacksError) as exc:
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
    def summary(window: Window = None, job_id: JobId = None) -> dict[str, Any]:
        """Overview of what Echo holds: clusters, nodes (with their ranks, event counts, last event and
        staleness in seconds: `stale_s` against Echo's clock, `behind_newest_s` against the newest event
        of any node, so a node that stopped reporting stands out), ranks (events, last event,
        `behind_newest_s`, most lagging first: a rank stuck in a collective stops reporting), `retention`
        (the raw range still stored, `raw_from_ns`..`raw_to_ns`, and the per-minute collective rollups
        kept longer in table collective_rollup, `rollup_from_ns`..`rollup_to_ns`; the limits `retention_s`,
        `max_db_bytes`, null when off), metrics
        with counts, the time range, and `spools`: nodes whose agent still holds points in its disk spool
        (`spooled_points`, `oldest_age_s`), i.e. data not yet in Echo. `no_data` says where data is when
        the window holds none. The clock and alignment sections are one job's (`job_id`). Call this
        first."""
        return _answer(lambda: inv.summary(window, job_id))

    @mcp.tool(name="fleet.cluster.find_stragglers", annotations=READ_ONLY)
    def find_stragglers(
        window: Window = None,
        cluster_id: str | None = None,
        min_late_ms: Annotated[
            float | None,
            Field(
                ge=0,
                description="Report only lateness of at least this many ms (on top of the job's own "
                "noise threshold, which always applies). Omit to use the noise threshold alone.",
            ),
        ] = None,
        job_id: JobId = None,
        links: Annotated[
            bool,
            Field(description="Also look for slow links: steps where every rank was on time but the transfer "
                  "itself took longer than usual (a congested NIC, a degraded link). A second pass over the "
                  "window: ask for it when no straggler explains slow steps."),
        ] = False,
    ) -> dict[str, Any]:
        """Which rank (or whole node) held the other ranks back in the window, by how much, how often, why,
        and what it cost. Ranks are compared on the same collective instance after correcting each node's
        clock from the data, so clock skew does not matter; an agent that attached mid-run is realigned.
        Per straggler (most imposed wait first): node_id, rank (or kind 'node' with its ranks), side
        ('host': it called late; 'gpu': its GPU got there late), every late episode (step, causal_chain_id,
        timestamp_ns on the corrected clock, late_by_ms), share of steps, late_ms median/p95/max, period in
        steps with a confidence (1 = every step), cause class (allocator, slow_gpu, memcpy, cpu_contention,
        sleeping, host_compute) with the rank's pre-call time per class against its peers' and, when agents
        sent call stacks, the stack that carried it (cause.leading_frames, callee first), imposed_gpu_s
        (GPU-seconds the others waited) and its cost, what_if (mean step time had it been on time) and
        next_step (what to do about the cause). Per cluster: the noise level and threshold measured; a
        healthy job says 'no straggler'. Late episodes too few or small to be told from noise are listed
        apart under isolated_late_episodes. With links=true, slow links come in the same list, after the
        ranks and nodes: kind 'link' (every rank on time, the transfer slow), node_id the node the data
        singles out (null: not localised), peer_node_id the other node when it singles out a node pair (the
        link between node_id and it; else null), rank the rank whose own link send/recv pairs single out
        (else null), late_ms the extra transfer per slow step, and link
        (inter_node, communicators, transfer_ms against typical_transfer_ms). When the window holds no agent
        data, no_data says for which clusters and times there is (an empty answer is then not a healthy
        job)."""
        return _answer(lambda: inv.diagnosis.find_stragglers(window, cluster_id, min_late_ms, job_id=job_id,
                                                             links=links))

    @mcp.tool(name="fleet.cluster.find_hangs", annotations=READ_ONLY)
    def find_hangs(
        window: Window = None,
        cluster_id: str | None = None,
        min_open_s: Annotated[
            float | None,
            Field(
                ge=0,
                description="Call an open collective a hang after this many seconds. Omit for the job's own "
                "threshold: max(20 s, 8 typical steps).",
            ),
        ] = None,
        job_id: Annotated[
            str | None,
            Field(description="Only this job (fleet.cluster.jobs lists them). Omit for every job: each row "
                  "names its job_id."),
        ] = None,
    ) -> dict[str, Any]:
        """Failures that stop a job rather than slow it, first of each kind first. hangs: collective instances
        some ranks entered and none completed, open longer than the threshold now, with who entered
        (entered), who never did and is still alive (missing: the hung ranks), who exited, since when and
        open_s, and doing: what each missing rank was doing at its agent's latest heartbeat (quiet_s,
        off_cpu_s and sleeping, the traced call it is inside, leading_frames of its stack). crashes: rank
        processes that exited while the job still needed them (non-zero exit status,
        or an instance left open), with the exit status when the process called exit (null: a signal),
        the instance it was to enter next and who had entered it; first = the earliest exit, the crash
        (later ones are usually peers aborting). desyncs: instances whose ranks issued different collectives
        (op or byte count) at the same sequence number, the usual call, the odd ranks' calls and
        first_rank. verdict sums it up ('no hang, crash or desync' on a healthy job)."""
        return _answer(lambda: inv.failures.find_hangs(window, cluster_id, min_open_s, job_id))

    @mcp.tool(name="fleet.cluster.explain_straggler", annotations=READ_ONLY)
    def explain_straggler(
        node_id: str,
        rank: int,
        causal_chain_id: Annotated[
            str | None, Field(description="The late collective, as find_stragglers lists it.")
        ] = None,
        timestamp_ns: Annotated[
            int | None, Field(description="Or the time of the late call (ns; find_stragglers' timestamp_ns).")
        ] = None,
        before_ms: Annotated[float, Field(gt=0, le=60000, description="How far back to look (ms).")] = 500.0,
        cluster_id: str | None = None,
        job_id: Annotated[str | None, Field(description="The job (default: the job of that call).")] = None,
    ) -> dict[str, Any]:
        """What one rank's calling thread did in the before_ms before it entered one collective: its timeline
        (each CUDA call and off-CPU interval, ms relative to the call), the time per cause class against the
        median of its on-time peers over the same span, the excess, the dominant cause, and every rank's
        lateness at that collective, and `stacks`: the call stacks the rank ran in its window against its
        peers' in theirs (distinctive: what it ran that they did not, with leading_frames; rank_top: its own
        top stacks). Give causal_chain_id or timestamp_ns from find_stragglers."""
        return _answer(
            lambda: inv.explainer.explain_straggler(node_id, rank, causal_chain_id, timestamp_ns, before_ms,
                                                    cluster_id, job_id)
        )  # fmt: skip

    @mcp.tool(name="fleet.cluster.timeline", annotations=READ_ONLY)
    def timeline(
        window: Window = None,
        cluster_id: str | None = None,
        node_id: Annotated[str | None, Field(description="Only this node's lanes (default: all).")] = None,
        rank: Annotated[int | None, Field(description="Only this rank's lane (default: all).")] = None,
        timestamp_ns: Annotated[
            int | None,
            Field(description="Centre on this time (ns, corrected clock, e.g. an episode's timestamp_ns from "
                  "find_stragglers). Default: the latest late episode of the top straggler."),
        ] = None,
        before_ms: Annotated[float, Field(gt=0, le=60000, description="Pre-call window drawn (ms).")] = 500.0,
        max_slices: Annotated[int, Field(ge=1, le=MAX_SLICES)] = 2000,
        heatmap: Annotated[bool, Field(description="Also the ranks x steps lateness heat map.")] = False,
        job_id: JobId = None,
    ) -> dict[str, Any]:
        """The cross-rank timeline around a late episode, as the report draws it: a few steps, one lane per
        (node, rank), slices on the corrected clock (start_ns, end_ns): 'collective' (enter -> completion,
        causal_chain_id, late flag, late_ms), 'wait' (an on-time rank waiting for the late one),
        'prewindow' (the late rank's before_ms before its call), and its host activity ('sync', 'malloc',
        'free', 'memcpy', 'offcpu' with state sleeping/preempted). `focus` says what it is centred on and
        why. With heatmap: ranks x steps lateness (ms) of the window's latest steps. Bounded; `truncated`
        says when slices were cut."""

        def answer() -> dict[str, Any]:
            view = inv.timeline.around(window, cluster_id, node_id, rank, timestamp_ns, before_ms, max_slices,
                                       job_id)  # fmt: skip
            if heatmap:
                view["heatmap"] = inv.timeline.heatmap(window, view["focus"].get("cluster_id"),
                                                       job_id=view.get("job_id"))["cells"]  # fmt: skip
            return view

        return _answer(answer)

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
    def get_cost(
        window: Window = None, cluster_id: str | None = None, job_id: JobId = None
    ) -> dict[str, Any]:
        """GPU-hours observed per (cluster, node, GPU model) in the window and their cost: each rank is one
        GPU, observed from its first to its last event; the rate per GPU-hour comes from the rates file by
        the rankecho.gpu.model attribute (default rate when unknown). Also the cost of the stalls: per
        straggler (as find_stragglers names them), the GPU-seconds the other ranks spent waiting for it
        times the rate, and that cost projected per day. Returns rows, stalls, totals and currency;
        `no_data` says where data is when the window holds no GPU's events. One job's (`job_id`)."""
        return _answer(lambda: inv.get_cost(window, cluster_id, job_id))

    @mcp.tool(name="fleet.cluster.jobs", annotations=READ_ONLY)
    def jobs(window: Window = None, cluster_id: str | None = None) -> dict[str, Any]:
        """The jobs in the window, newest first: one row per (cluster, job_id) with its ranks, world_size,
        nodes, first and last collective call (first/last, node clocks), calls, steps and a one-line
        straggler verdict (`stragglers`, for the newest 20). A cluster runs many jobs, one after another
        and at once, each with ranks 0..N-1: pass a row's job_id to find_stragglers, explain_straggler,
        timeline, summary or get_cost to analyse that job. job_id '' holds points without a job id (older
        agents)."""
        return _answer(lambda: inv.jobs.list(window, cluster_id))

    @mcp.tool(name="fleet.cluster.stacks", annotations=READ_ONLY)
    def stacks(
        node_id: Annotated[str | None, Field(description="The rank's node (default: any node).")],
        rank: int,
        window: Window = None,
        causal_chain_id: Annotated[
            str | None,
            Field(description="Instead of the window: the rank's pre-call window before this collective "
                  "(find_stragglers' episodes list them; needs node_id)."),
        ] = None,
        cluster_id: str | None = None,
        job_id: JobId = None,
        limit: Annotated[int, Field(ge=1, le=STACKS_LIMIT, description="Most stacks.")] = MAX_STACKS,
    ) -> dict[str, Any]:
        """One rank's call stacks over the window (node clock), weighted by the time each carried: per
        stack its frames innermost (callee) first (a Python frame is file:function:line), leading_frames
        ('cudaMalloc <- allocate_cache <- train.py:forward:88'), ms, the cause class it carried
        (allocator, slow_gpu, memcpy, cpu_contention, sleeping; host_compute = the on-CPU sampler's
        stack) and ms per class, truncated (the walk stopped early: outer frames missing), and its folded
        line (root first, ';'-joined, weight in microseconds last: flamegraph.pl / speedscope input);
        `folded` lists them all. Most time first; bounded (frames per stack, stacks), `truncated` says when
        stacks were cut. A stack cited before its frames reached Echo has frames null."""
        return _answer(
            lambda: inv.stacks.rank(node_id, rank, window, cluster_id, job_id, causal_chain_id, limit)
        )

    @mcp.resource(
        "rankecho://schema",
        name="schema",
        description="Tables, columns (type, meaning, unit), metric names and example SQL for run_analysis.",
        mime_type="application/json",
    )
    def schema() -> dict[str, Any]:
        return _answer(lambda: schema_document(inv.reader))

    return mcp
