"""``rankecho report`` / ``export-trace`` / ``fleet.cluster.timeline``: the pictures show the analysis' rows.

Stores are synthetic jobs with a known truth (rank 5 on node-h100 calls 290 ms late every 14 steps, the
seed's story; and a healthy job). The report is opened in a real headless Chromium (Debian's package,
installed by scripts/setup-host.sh): no console errors, the late rank's lane and its red late collective
drawn, a screenshot written; the healthy job's report highlights nothing. The trace is checked against
the trace-event format and its slices against the view's rows.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fastmcp import Client

from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.server import build_server
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.queries import QUERIES
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader
from rankecho.echo.visual.trace import LATE_COLOR, to_trace
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

NODES = (SynNode("node-a100", 4), SynNode("node-h100", 4, offset_ms=40))
SEED = SyntheticJob(nodes=NODES, steps=100, faults=(SynFault(rank=5, ms=290, every=14, start_step=7),))
HEALTHY = SyntheticJob(nodes=NODES, steps=60)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LATE_FILL = "rgb(214, 39, 40)"  # LATE_COLOR as the browser writes it
assert LATE_COLOR == "#d62728"


def make_store(path: Path, job: SyntheticJob) -> Path:
    with duckdb.connect(str(path)) as con:
        migrate(con)
        write_job(con, job)
        con.execute("CHECKPOINT")
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("report")
    return {"seed": make_store(base / "seed.db", SEED), "healthy": make_store(base / "healthy.db", HEALTHY)}


@pytest.fixture(scope="module")
def reports(stores: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``rankecho report`` run once per store, as a user runs it."""
    out = {}
    for name, db in stores.items():
        target = tmp_path_factory.mktemp(f"out-{name}")
        command = [sys.executable, "-m", "rankecho", "report", "--db", str(db), "--out", str(target)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(target / "report.html")
        assert "finding stragglers" in done.stderr  # progress is shown
        out[name] = target
    return out


@pytest.fixture
def inv(stores: dict[str, Path]) -> Iterator[Investigation]:
    with duckdb.connect(str(stores["seed"]), read_only=True) as con:
        yield Investigation(Reader(con), load_rates())


def test_report_writes_a_self_contained_page_pngs_and_a_trace(reports: dict[str, Path]) -> None:
    for out in reports.values():
        page = (out / "report.html").read_text()
        assert external_references(page) == []  # nothing fetched: works offline
        assert "Plotly" in page  # the charting library is inlined
        for png in ("timeline.png", "heatmap.png"):
            assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert json.loads((out / "trace.json").read_text())["traceEvents"]
    seed = (reports["seed"] / "report.html").read_text()
    assert "rank 5 on node-h100" in seed and "every 14 steps" in seed
    assert "No straggler in this window." in (reports["healthy"] / "report.html").read_text()


def external_references(page: str) -> list[str]:
    """Every script, stylesheet, image or frame the page would load from elsewhere."""

    class Refs(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.found: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            for name, value in attrs:
                if name in ("src", "href") and tag in ("script", "link", "img", "iframe") and value:
                    self.found.append(f"{tag} {value}")

    parser = Refs()
    parser.feed(page)
    return parser.found


def browse(page: Path, shot: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and every console message, from headless Chromium."""
    common = [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
              "--enable-logging=stderr", "--v=0", "--window-size=1400,2200"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120,
                   check=True)
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    return dom.stdout, console


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (scripts/setup-host.sh installs it)")
def test_the_report_renders_in_a_real_browser(reports: dict[str, Path], tmp_path: Path) -> None:
    dom, console = browse(reports["seed"] / "report.html", tmp_path / "seed.png")
    assert console == []
    assert dom.count('class="main-svg"') >= 2  # both charts drawn by the inlined plotly
    assert 'data-unformatted="node-h100 / rank 5"' in dom  # the straggler's lane label
    assert LATE_FILL in dom  # its late collective, drawn red
    assert (tmp_path / "seed.png").stat().st_size > 10_000
    dom, console = browse(reports["healthy"] / "report.html", tmp_path / "healthy.png")
    assert console == []
    assert 'class="main-svg"' in dom and LATE_FILL not in dom  # nothing highlighted
    assert (tmp_path / "healthy.png").stat().st_size > 10_000


def test_a_broken_page_is_caught_by_the_browser_check(tmp_path: Path) -> None:
    """The console check above can fail: a script error on a page is seen."""
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH")
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    _, console = browse(page, tmp_path / "bad.png")
    assert any("undefinedFunction" in line for line in console)


def validate_trace(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace-event format's rules for what we emit; returns the complete events."""
    events = trace["traceEvents"]
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= e.keys()
        assert e["ph"] in ("X", "M")
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and e["dur"] >= 0 and "cat" in e
    complete = [e for e in events if e["ph"] == "X"]
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in complete:
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for thread, slices in by_thread.items():
        assert thread in named
        assert [s["ts"] for s in slices] == sorted(s["ts"] for s in slices)  # monotonic per thread
        stack: list[float] = []
        for s in slices:  # complete events on one thread nest: begin/end match
            while stack and stack[-1] <= s["ts"]:
                stack.pop()
            assert not stack or s["ts"] + s["dur"] <= stack[-1] + 1e-6, (thread, s)
            stack.append(s["ts"] + s["dur"])
    return complete


def slice_key(s: dict[str, Any]) -> tuple[Any, ...]:
    return (s["node_id"], s["rank"], s["kind"], s["start_ns"], s["end_ns"], s.get("causal_chain_id"))


def test_the_trace_is_valid_and_its_slices_are_the_views_rows(inv: Investigation) -> None:
    view = inv.timeline.around()
    assert view["focus"]["straggler"]["rank"] == 5 and view["focus"]["step"] in SEED.late_steps(5)
    complete = validate_trace(to_trace(view))
    assert Counter(slice_key(e["args"]) for e in complete) == Counter(map(slice_key, view["slices"]))
    q = QUERIES["timeline_slices"]
    span = {"from_ns": view["range"]["from_ns"], "to_ns": view["range"]["to_ns"]}
    params = q.bind(start_ns=None, end_ns=None, cluster_id="synthetic", node_id=None, rank=None,
                    before_ms=500.0, max_rows=10_000, **span)
    rows = inv.reader.query(q.sql, params, max_rows=10_000)
    named = [dict(zip(rows.columns, r, strict=True)) for r in rows.rows]
    assert Counter(map(slice_key, named)) == Counter(map(slice_key, view["slices"]))
    kinds = Counter(s["kind"] for s in view["slices"])
    assert kinds["prewindow"] == 1 and kinds["wait"] >= 7 and kinds["malloc"] >= 1
    late = [s for s in view["slices"] if s["kind"] == "collective" and s["late"]]
    assert late and {(s["node_id"], s["rank"]) for s in late} == {("node-h100", 5)}
    assert all(280 <= s["late_ms"] <= 300 for s in late)


def test_the_heat_map_shows_the_period(inv: Investigation) -> None:
    cells = inv.timeline.heatmap()["cells"]
    late = sorted({c["step"] for c in cells if c["late"]})
    assert late == SEED.late_steps(5)
    assert {(c["node_id"], c["rank"]) for c in cells if c["late"]} == {("node-h100", 5)}
    assert len(cells) == SEED.world * SEED.steps


def test_mcp_timeline_tool_returns_the_same_slices(inv: Investigation) -> None:
    async def go() -> dict[str, Any]:
        async with Client(build_server(inv)) as client:
            result = await client.call_tool("fleet.cluster.timeline", {"heatmap": True, "rank": 5})
            assert result.structured_content is not None
            return result.structured_content

    answer = asyncio.run(go())
    direct = inv.timeline.around(rank=5)
    assert Counter(map(slice_key, answer["slices"])) == Counter(map(slice_key, direct["slices"]))
    assert {s["rank"] for s in answer["slices"]} == {5}
    assert sorted({c["step"] for c in answer["heatmap"] if c["late"]}) == SEED.late_steps(5)


def test_export_trace_to_stdout_and_a_held_store(stores: dict[str, Path]) -> None:
    done = subprocess.run([sys.executable, "-m", "rankecho", "export-trace", "--db", str(stores["seed"]),
                           "--out", "-"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    validate_trace(json.loads(done.stdout))
    command = [sys.executable, "-m", "rankecho", "export-trace", "--db", "/nonexistent/x.db"]
    missing = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "cannot open" in missing.stderr and "Traceback" not in missing.stderr
