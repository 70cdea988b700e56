"""Hangs, crashes and desyncs: failures that stop a job rather than slow it (``fleet.cluster.find_hangs``).

A straggler arrives late; these never arrive (a hang), leave (a crash) or arrive at a different collective
(a desync). The analysis is named SQL (``echo/queries/layers/60_failures.sql``, thresholds
``hang_min_ns`` and ``hang_steps`` of ``rk_params``); this module turns its rows into bounded answers with
one sentence each, for the MCP tool and for ``rankecho diagnose``, which prints them before the stragglers.

Usage::

    f = Failures(investigation)
    f.find_hangs("last 10m")["hangs"][0]["summary"]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.causes import CAUSE_TEXT
from rankecho.echo.mcp.diagnosis import DiagnosisError
from rankecho.echo.mcp.windows import iso

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

MAX_FAILURES = 50
"""Rows returned per kind (oldest first); the answer says when more exist."""


class Failures:
    """find_hangs over one :class:`Investigation` (its reader, windows, limits and clock)."""

    def __init__(self, inv: Investigation, clock_ns: Callable[[], int]) -> None:
        self._inv = inv
        self._clock_ns = clock_ns

    def find_hangs(
        self,
        window: str | None = None,
        cluster_id: str | None = None,
        min_open_s: float | None = None,
        job_id: str | None = None,
    ) -> dict[str, Any]:
        """Open hangs now, crashes and desyncs in the window; ``min_open_s`` overrides the hang threshold.
        Every job unless ``job_id`` names one: a stopped job matters whichever it is, so unlike
        find_stragglers there is no "most recent job" default; each row names its job."""
        if min_open_s is not None and not min_open_s >= 0:
            raise DiagnosisError(
                "min_open_s must be a number of seconds >= 0 (omit it for the job's own threshold)"
            )
        w = self._inv.window(window)
        bounds: dict[str, Any] = {
            "start_ns": w.start_ns, "end_ns": w.end_ns, "cluster_id": cluster_id, "job_id": job_id,
        }
        now_ns = self._clock_ns()
        min_open_ns = None if min_open_s is None else round(min_open_s * 1e9)
        hangs, hangs_cut = self._rows("find_open_hangs", now_ns=now_ns, min_open_ns=min_open_ns, **bounds)
        crashes, crashes_cut = self._rows("find_crashes", **bounds)
        desyncs, desyncs_cut = self._rows("find_desyncs", **bounds)
        answer = {
            "window": w.describe(),
            "job_id": job_id,
            "now": iso(now_ns),
            "hangs": [_hang(r) for r in hangs],
            "crashes": [_crash(r, crashes) for r in crashes],
            "desyncs": [_desync(r) for r in desyncs],
            "truncated": hangs_cut or crashes_cut or desyncs_cut,
        }
        answer["verdict"] = verdict(answer)
        return answer

    def _rows(self, name: str, **params: Any) -> tuple[list[dict[str, Any]], bool]:
        return self._inv.records(self._inv.run_named(name, max_rows=MAX_FAILURES, **params))


def verdict(answer: dict[str, Any]) -> str:
    """One line: the first failure of each kind, or that there is none."""
    parts = [
        f"{len(answer[kind])} {kind}" + (f" (first: {answer[kind][0]['summary']})" if answer[kind] else "")
        for kind in ("hangs", "crashes", "desyncs")
        if answer[kind]
    ]
    return "; ".join(parts) if parts else "no hang, crash or desync"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _hang(r: dict[str, Any]) -> dict[str, Any]:
    open_s = round(r["open_ns"] / 1e9, 1)
    summary = (
        f"{r['causal_chain_id']} ({r['op']}): {_ranks(r['entered'])} entered {open_s} s ago, "
        f"{_ranks(r['missing'])} never did"
    )
    if r["exited"]:
        summary += f" ({_ranks(r['exited'])} exited)"
    doing = [_doing(d) for d in r.get("doing") or []]
    if doing:
        summary += "; " + "; ".join(d["summary"] for d in doing)
    return {
        "cluster_id": r["cluster_id"],
        "job_id": r["job_id"],
        "causal_chain_id": r["causal_chain_id"],
        "comm_id": r["comm_id"],
        "seq": r["seq"],
        "op": r["op"],
        "since": iso(r["first_enter_ns"]),
        "since_ns": r["first_enter_ns"],
        "open_s": open_s,
        "entered": r["entered"],
        "missing": r["missing"],
        "exited": r["exited"],
        "unseen_ranks": r["unseen"],
        "threshold_s": round(r["threshold_ns"] / 1e9, 1),
        "step_ms": None if r["step_ns"] is None else round(r["step_ns"] / 1e6, 1),
        "doing": doing,
        "summary": summary,
    }


def _doing(d: dict[str, Any]) -> dict[str, Any]:
    """One missing rank's latest heartbeat: what it was stuck in when its agent last looked."""
    parts = [f"no collective for {d['quiet_s']:.1f} s"]
    recent = {k: v for k, v in (d["recent_by_class_s"] or {}).items() if v > 0}
    if d["recent_s"]:
        # The class that took most of the span; what no class took was on the CPU (host compute).
        recent["host_compute"] = max(d["recent_s"] - sum(recent.values()), 0.0)
        top = max(recent, key=lambda k: (recent[k], k))
        parts.append(f"{recent[top]:.1f} s of the last {d['recent_s']:.1f} s {CAUSE_TEXT[top]}")
    if d["off_cpu_s"] is not None:
        # Since this switch-out only: a rank waiting in a loop (poll with a timeout) wakes now and then.
        how = "asleep off the CPU" if d["sleeping"] else "waiting for a CPU"
        parts.append(f"{how} (for {d['off_cpu_s']:.1f} s)")
    else:
        parts.append("running on a CPU")
    if d["call"] is not None:
        parts.append(f"inside {d['call']}" + (f" for {d['call_s']:.1f} s" if d["call_s"] is not None else ""))
    if d["leading_frames"]:
        parts.append(f"in {d['leading_frames']}")
    return {
        "rank": d["rank"],
        "node_id": d["node_id"],
        "as_of": iso(d["at_ns"]),
        "quiet_s": round(d["quiet_s"], 1),
        "call": d["call"],
        "call_s": None if d["call_s"] is None else round(d["call_s"], 1),
        "off_cpu_s": None if d["off_cpu_s"] is None else round(d["off_cpu_s"], 1),
        "sleeping": d["sleeping"],
        "stack_id": d["stack_id"],
        "leading_frames": d["leading_frames"],
        "recent_s": None if d["recent_s"] is None else round(d["recent_s"], 1),
        "recent_by_class_s": {k: round(v, 2) for k, v in recent.items()},
        "summary": f"rank {d['rank']} ({d['node_id']}) " + ", ".join(parts),
    }


def _crash(r: dict[str, Any], all_rows: list[dict[str, Any]]) -> dict[str, Any]:
    status = "unknown status (a signal?)" if r["status"] is None else f"status {r['status']}"
    others = [x for x in r["entered_by"] if x != r["rank"]]
    where = f" while {r['step_chain']} was open ({_ranks(others)} had entered)" if others else ""
    if r["first"]:
        job = (r["cluster_id"], r["job_id"])
        later = sum(1 for x in all_rows if (x["cluster_id"], x["job_id"]) == job and not x["first"])
        order = f"first to exit; {later} more after it" if later else "first to exit"
    else:
        order = "after the first"
    return {
        "cluster_id": r["cluster_id"],
        "job_id": r["job_id"],
        "node_id": r["node_id"],
        "rank": r["rank"],
        "pid": r["pid"],
        "at": iso(r["exit_ns"]),
        "timestamp_ns": r["exit_ns"],
        "status": r["status"],
        "first": r["first"],
        "causal_chain_id": r["step_chain"],
        "entered_by": others,
        "left_unfinished": r["left_unfinished"],
        "summary": f"rank {r['rank']} ({r['node_id']}) exited with {status}{where}: {order}",
    }


def _desync(r: dict[str, Any]) -> dict[str, Any]:
    odd = r["odd_calls"] or []
    first = odd[0] if odd else {}
    return {
        "cluster_id": r["cluster_id"],
        "job_id": r["job_id"],
        "causal_chain_id": r["causal_chain_id"],
        "comm_id": r["comm_id"],
        "seq": r["seq"],
        "at": iso(r["first_enter_ns"]),
        "ranks": r["ranks"],
        "usual": {"op": r["usual_op"], "bytes": r["usual_bytes"]},
        "first_rank": r["first_rank"],
        "odd_calls": odd,
        "summary": (
            f"{r['causal_chain_id']}: rank {r['first_rank']} issued {first.get('op')} of "
            f"{first.get('bytes')} bytes where {r['ranks'] - len(odd)} of {r['ranks']} ranks issued "
            f"{r['usual_op']} of {r['usual_bytes']} bytes"
        ),
    }
