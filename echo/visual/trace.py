"""A timeline as Chrome/Perfetto trace-event JSON: a process per node, a thread per rank and track.

Opens in the Perfetto UI (ui.perfetto.dev, offline too) and chrome://tracing. Times are the analysis'
clock-corrected ones (the reference node's clock), in microseconds from the start of the range; each
slice's ``args`` carry its absolute times (ns), causal_chain_id, step and lateness.

Each rank has four tracks, because its slices of different kinds overlap without nesting: a collective
and the sync that waits for it, an off-CPU interval inside a CUDA call, the pre-call windows of
consecutive late steps. Complete ("X") events on one thread must nest, so a slice that would overlap
another without nesting goes to the track's next row (a thread of its own), as Perfetto packs async
slices: every slice keeps its true times.

Usage::

    json.dump(to_trace(Timeline(inv).around(window="last 10m")), open("trace.json", "w"))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    """How one kind of slice is drawn, in the trace, the HTML report and the PNGs alike."""

    track: int
    """The rank's track (see TRACK_NAMES)."""
    color: str
    label: str
    """Legend text."""
    bottom: float
    """Where the bar starts inside a lane of height 1, from the lane's bottom (HTML, PNG)."""
    height: float
    """Bar thickness in that lane."""


KINDS = {  # a lane: collectives on top, CUDA calls in the middle, off-CPU at the bottom
    "prewindow": Kind(3, "#f2c14e", "late rank's pre-call window", 0.02, 0.96),
    "collective": Kind(0, "#4c72b0", "collective (red: the late rank's)", 0.52, 0.42),
    "wait": Kind(0, "#c7d3e8", "waiting in it for the late rank", 0.52, 0.42),
    "sync": Kind(1, "#55a868", "CUDA sync", 0.26, 0.22),
    "malloc": Kind(1, "#c44e52", "cudaMalloc", 0.26, 0.22),
    "free": Kind(1, "#dd8452", "cudaFree", 0.26, 0.22),
    "memcpy": Kind(1, "#8172b3", "blocking copy", 0.26, 0.22),
    "offcpu": Kind(2, "#937860", "off the CPU", 0.04, 0.18),
    "runq": Kind(2, "#e377c2", "runnable, waiting for a CPU", 0.04, 0.18),
}
"""Every slice kind the timeline query returns, in drawing order (the pre-call band behind)."""
OTHER = Kind(1, "#7f7f7f", "other", 0.26, 0.22)
"""A kind this version does not know yet: drawn, never dropped."""
LATE_COLOR = "#d62728"
"""The late rank's collective."""


def kind_of(name: str) -> Kind:
    return KINDS.get(name, OTHER)


def drawing_order(slices: list[dict[str, Any]]) -> list[str]:
    """The kinds present, known ones in KINDS' order, then any unknown ones."""
    present = {s["kind"] for s in slices}
    return [k for k in KINDS if k in present] + sorted(present - KINDS.keys())


TRACK_NAMES = ("collectives", "CUDA calls", "off-CPU", "pre-call window (late)")
ROWS = 100
"""Rows a track may spread over (thread id: rank * 1000 + track * ROWS + row)."""


def slice_name(s: dict[str, Any]) -> str:
    """What a slice is called on screen (shared with the HTML and PNG legends)."""
    kind = s["kind"]
    if kind == "collective":
        return f"{'LATE ' if s.get('late') else ''}collective {s.get('causal_chain_id') or ''}".strip()
    if kind == "wait":
        return "waiting for the late rank"
    if kind == "prewindow":
        return "before the late call"
    if kind == "offcpu":
        return f"off-CPU ({s.get('state') or '?'})"
    if kind == "runq":
        return "runnable, waiting for a CPU"
    return str(s.get("cuda_call") or kind)


def to_trace(view: dict[str, Any]) -> dict[str, Any]:
    """The trace-event JSON object of one timeline (see :meth:`Timeline.around`)."""
    origin = view.get("range", {}).get("from_ns", 0)
    nodes = sorted({lane["node_id"] for lane in view["lanes"]})
    pid_of = {node: i + 1 for i, node in enumerate(nodes)}
    events: list[dict[str, Any]] = []
    for node, pid in pid_of.items():
        events.append(_meta("process_name", pid, 0, {"name": node}))
        events.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
    tracks: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for s in view["slices"]:
        tracks.setdefault((s["node_id"], s["rank"], kind_of(s["kind"]).track), []).append(s)
    for (node, rank, track), slices in sorted(tracks.items()):
        pid = pid_of[node]
        for row, packed in enumerate(_rows(slices)):
            tid = rank * 1000 + track * ROWS + row
            name = f"rank {rank}: {TRACK_NAMES[track]}" + (f" ({row + 1})" if row else "")
            events.append(_meta("thread_name", pid, tid, {"name": name}))
            events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
            events.extend(_complete(pid, tid, s, origin) for s in packed)
    other = {"source": "rankecho", "clock": "reference node", "focus": view.get("focus")}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _rows(slices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The slices of one track spread over rows in each of which they nest (outer first at equal
    starts); a slice goes to the first row whose open slices it nests in or follows."""
    rows: list[list[dict[str, Any]]] = []
    open_ends: list[list[int]] = []  # per row, the ends of the slices still open (innermost last)
    for s in sorted(slices, key=lambda s: (s["start_ns"], -s["end_ns"])):
        row = _first_fit(open_ends, s["start_ns"], s["end_ns"])
        if row == len(rows):
            if row == ROWS:
                row = ROWS - 1  # more overlap than rows: the last row takes it (drawn, not nested)
            else:
                rows.append([])
                open_ends.append([])
        rows[row].append(s)
        open_ends[row].append(s["end_ns"])
    return rows


def _first_fit(open_ends: list[list[int]], start: int, end: int) -> int:
    """The first row in which [start, end) nests or follows (len(open_ends): none does)."""
    for row, ends in enumerate(open_ends):
        while ends and ends[-1] <= start:
            ends.pop()
        if not ends or end <= ends[-1]:
            return row
    return len(open_ends)


def _complete(pid: int, tid: int, s: dict[str, Any], origin: int) -> dict[str, Any]:
    args = {k: v for k, v in s.items() if v is not None and k not in ("pid", "tid")}
    return {"name": slice_name(s), "cat": s["kind"], "ph": "X", "pid": pid, "tid": tid,
            "ts": (s["start_ns"] - origin) / 1e3, "dur": (s["end_ns"] - s["start_ns"]) / 1e3, "args": args}
