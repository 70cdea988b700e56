"""Jobs: which job a tool analyses, and the list of jobs a window holds (``fleet.cluster.jobs``).

A cluster runs many jobs, one after another and at once, each with ranks 0..N-1; the agent stamps
``rankecho.job.id`` on every point (agent/jobid.py) and the analysis keeps one job apart from another
(the ``job`` parameter of the layers). A tool given no ``job_id`` analyses the window's most recent job
(the one whose collective call is the newest) and names it in its answer. Points without a job id
(older agents, seed-style producers) form one job, ``""``: data with no job id at all is analysed
exactly as before jobs existed.

Usage::

    jobs = Jobs(inv)
    job = jobs.resolve(inv.window("last 10m"), None, None)   # "torchelastic:run-42", or None: no data
    jobs.list("last 1h")["jobs"][0]["stragglers"]            # "1 straggler: rank 5 on node-b"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.windows import Window, iso

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

MAX_JOBS = 200
"""Jobs listed per call (newest first); ``truncated`` says when there were more."""
MAX_ANALYSED = 20
"""Jobs whose steps and stragglers are analysed per call (the newest); the rest are listed only."""
UNKNOWN = "unknown job: points without rankecho.job.id (an older agent or another producer)"


class Jobs:
    """Job resolution and listing over one :class:`Investigation`."""

    def __init__(self, inv: Investigation) -> None:
        self._inv = inv

    def resolve(self, w: Window, job_id: str | None, cluster_id: str | None) -> str | None:
        """``job_id`` as given; else the window's most recent job; None when it holds no collective."""
        if job_id is not None:
            return job_id
        rows = self._inv.run_named("latest_job", start_ns=w.start_ns, end_ns=w.end_ns,
                                   cluster_id=cluster_id).rows  # fmt: skip
        return str(rows[0][0]) if rows else None

    def at_call(self, node_id: str, rank: int, at_ns: int | None, chain: str | None) -> str | None:
        """The job of ``(node_id, rank)``'s call with causal_chain_id ``chain``, else the one nearest
        ``at_ns``; None when there is no such call."""
        rows = self._inv.run_named("job_at_call", node_id=node_id, rank=rank, at_ns=at_ns, chain=chain).rows
        return str(rows[0][0]) if rows else None

    def list(self, window: str | None = None, cluster_id: str | None = None) -> dict[str, Any]:
        """One row per job in the window, newest first: ranks, nodes, first and last call, steps and a
        one-line straggler verdict (for the newest :data:`MAX_ANALYSED`)."""
        w = self._inv.window(window)
        result = self._inv.run_named("jobs_in_window", max_rows=MAX_JOBS, start_ns=w.start_ns,
                                     end_ns=w.end_ns, cluster_id=cluster_id)  # fmt: skip
        rows, cut = self._inv.records(result)
        for n, row in enumerate(rows):
            row["first"], row["last"] = iso(row["first_ns"]), iso(row["last_ns"])
            if row["job_id"] == "":
                row["note"] = UNKNOWN
            row["steps"], row["stragglers"] = None, "not analysed (list a narrower window or pass job_id)"
            if n < MAX_ANALYSED:
                found = self._inv.diagnosis.find_stragglers(window, row["cluster_id"], max_episodes=1,
                                                            job_id=row["job_id"], stacks=False)  # fmt: skip
                cluster = found["clusters"][0] if found["clusters"] else None
                row["steps"] = cluster["steps"] if cluster else 0
                row["stragglers"] = cluster["verdict"] if cluster else "no complete collective instance"
        return {"window": w.describe(), "jobs": rows, "count": len(rows), "truncated": cut}
