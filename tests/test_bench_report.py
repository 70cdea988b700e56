"""``python -m bench --json/--markdown/--render``: every figure carries its date, load and command, and
docs/benchmarks.md's generated section is rewritten from it while the hand-written rest is kept."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import _report
from bench.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
DOC = {
    "provenance": {"date": "2026-12-03 14:00 UTC", "command": "python -m bench ingest --runs 2",
                   "commit": "abc1234", "cpus": 2, "machine": "Linux 6.1 x86_64", "python": "3.11.2",
                   "load_before": [2.31, 2.5, 2.0]},
    "benchmarks": {"ingest": {
        "started": "2026-12-03 14:00 UTC", "seconds": 61.2, "load_before": [2.31, 2.5, 2.0],
        "load_after": [3.02, 2.7, 2.1],
        "result": {"points_per_s_median": 148123.4, "lost": 0, "fanin_wall_s_median": 0.1612,
                   "exhausted": False, "ingest_runs": [{"points_per_s": 147900.0, "writer_busy": 0.92},
                                                       {"points_per_s": 149000.0, "writer_busy": None}],
                   "note": "a|b"},
    }},
}


def test_render_names_date_load_command_and_every_figure() -> None:
    text = _report.render(DOC)
    assert "2026-12-03 14:00 UTC" in text and "`abc1234`" in text
    assert "`python -m bench ingest --runs 2`" in text
    assert "load average 2.31, 2.5, 2 (1, 5, 15 min)" in text
    assert "#### bench.ingest: 2026-12-03 14:00 UTC, 61.2 s, load average 2.31 before, 3.02 after" in text
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.*) \|$", text, re.MULTILINE))
    assert rows == {
        "points_per_s_median": "148,123", "lost": "0", "fanin_wall_s_median": "0.1612", "exhausted": "false",
        "ingest_runs[].points_per_s": "147,900, 149,000", "ingest_runs[].writer_busy": "0.92, -",
        "note": "a\\|b",
    }


def test_update_keeps_the_hand_written_page_and_is_repeatable(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    shutil.copy(ROOT / "docs" / "benchmarks.md", page)
    before = page.read_text()
    head, tail = before.split(_report.BEGIN)[0], before.split(_report.END)[1]
    _report.update_markdown(page, _report.render(DOC))
    once = page.read_text()
    assert once.startswith(head) and once.endswith(tail) and "148,123" in once
    _report.update_markdown(page, _report.render(DOC))
    assert page.read_text() == once
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    with pytest.raises(ValueError, match="lacks the markers"):
        _report.update_markdown(bare, "x")


def test_render_option_rewrites_from_a_saved_run_without_running(tmp_path: Path) -> None:
    saved, page = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    saved.write_text(json.dumps(DOC))
    page.write_text(f"intro\n{_report.BEGIN}\nold\n{_report.END}\nrest\n")
    assert main(["--render", str(saved), "--markdown", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "old" not in text
    assert "bench.ingest" in text


def test_provenance_of_a_run_here() -> None:
    p = _report.provenance(["ingest", "--runs", "1"])
    assert p["command"] == "python -m bench ingest --runs 1" and p["cpus"] >= 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", p["date"]) and len(p["load_before"]) == 3
    assert re.fullmatch(r"[0-9a-f]{7,}(\+changes)?", p["commit"])
    entry = _report.timed(lambda: {"x": 1})
    assert entry["result"] == {"x": 1} and entry["seconds"] >= 0 and len(entry["load_after"]) == 3
