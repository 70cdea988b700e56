"""The analysis's tuning parameters (echo/queries/layers/00_params.sql): one table (name, value, why) that
every layer reads, no tuning number left inline in a layer, a changed parameter changes the answer, and
callers of run_analysis (the reader and the sandbox workers) can read the table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from analysis_helpers import late_steps, query

from rankecho.echo.guard import check_sql
from rankecho.echo.queries import LAYERS
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import ANALYSIS_PRELUDE
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

LAYER_DIR = Path(__file__).resolve().parent.parent / "echo" / "queries" / "layers"
PARAMS_FILE = "00_params.sql"
USE = re.compile(r"rk_param\('(\w+)'\)")
_COMMENTS = re.compile(r"--[^\n]*")
_STRINGS = re.compile(r"'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:e\d+)?)(?![\w.])", re.IGNORECASE)

STRUCTURAL = {"0", "1", "1e3", "1e6", "1e9", "1000000000"}
"""Numbers that are no tuning: zero and one, and unit conversions (ms, ns per ms, ns per s)."""
ALLOWED: dict[str, list[str]] = {
    # file: snippets (of a comment-free line) whose other numbers are structural, each with why
    "10_alignment.sql": [
        "round(v.rival_fit_ns / 1e6, 3), round(c.fit_ns / 1e6, 3),",  # rounding digits of a message
        "round(v.rival_offset_ns / 1e6, 1), round(c.offset_ns / 1e6, 1))",
    ],
    "20_arrivals.sql": [
        "GROUP BY ALL HAVING count(*) >= 2",  # a clock is compared between two nodes at least
        "(1.4826 * mad) ^ 2 / n",  # MAD to standard deviation (normal noise), squared: a median's variance
    ],
    "30_lateness.sql": [
        "WHERE n = comm_size AND n >= 2",  # lateness needs another rank to be late against
        "1.4826 * mad(s.host_late_ns - t.typical_ns) AS noise_sigma_ns",  # MAD to standard deviation
    ],
    "50_stragglers.sql": [
        "'late_by_ms': round(s.late_by_ns / 1e6, 3)",  # rounding digits
        "quantile_cont(s.late_by_ns, 0.95) / 1e6 AS p95_late_ms",  # the p95 the column is named for
    ],
    "65_links.sql": [
        "'late_by_ms': round(e.extra_ns / 1e6, 3)",  # rounding digits
        "quantile_cont(e.extra_ns, 0.95) / 1e6 AS p95_late_ms",  # the p95 the column is named for
        "count(*) FILTER (WHERE share >= 0.999 * top) OVER w AS at_top",  # equal to the top, as floats
        "AND r.share >= 0.999 * r.top",
        "FROM r GROUP BY ALL HAVING count(DISTINCT node_id) = 2",  # a node pair: a link's two ends
        "rank IS NULL AND node_id IS NOT NULL AND named_nodes = 2 AS two_named,",
    ],
    "70_stacks.sql": [
        "coalesce(to_t, CAST(9e18 AS BIGINT)) AS hi",  # an open end: after any timestamp
    ],
    "75_rank_states.sql": [  # positions in the list of attributes read
        "TRY_CAST(a[2] AS BIGINT) AS call_since_ns",
        "TRY_CAST(a[3] AS BIGINT) AS offcpu_since_ns, TRY_CAST(a[4] AS BOOLEAN) AS sleeping",
        "a[5] AS stack_id",
        "TRY_CAST(a[6] AS DOUBLE) / 1e3 AS recent_s",
        "coalesce(TRY_CAST(a[7] AS DOUBLE), 0) / 1e3",
        "coalesce(TRY_CAST(a[8] AS DOUBLE), 0) / 1e3",
        "coalesce(TRY_CAST(a[9] AS DOUBLE), 0) / 1e3",
        "coalesce(TRY_CAST(a[10] AS DOUBLE), 0) / 1e3",
        "coalesce(TRY_CAST(a[11] AS DOUBLE), 0) / 1e3",
    ],
}


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(":memory:") as connection:
        migrate(connection)
        yield connection


def params(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[float, str]]:
    return {r["name"]: (r["value"], r["why"]) for r in query(con, "SELECT * FROM rk_params()")}


def test_every_parameter_has_a_why_and_every_one_is_used(con: duckdb.DuckDBPyConnection) -> None:
    table = params(con)
    assert len(table) >= 40 and all(why.strip() for _, why in table.values())
    assert table["noise_sigmas"][0] == 6 and table["min_threshold_step_share"][0] == pytest.approx(0.1)
    used = {
        name
        for path in LAYER_DIR.glob("*.sql")
        if path.name != PARAMS_FILE
        for name in USE.findall(_COMMENTS.sub("", path.read_text(encoding="utf-8")))
    }
    assert used - table.keys() == set(), "a layer reads a parameter the table lacks"
    assert table.keys() - used == set(), "a parameter no layer reads"


def test_no_layer_keeps_an_inline_tuning_number() -> None:
    found = []
    for path in sorted(LAYER_DIR.glob("*.sql")):
        if path.name == PARAMS_FILE:
            continue
        allowed = ALLOWED.get(path.name, [])
        for number, line in inline_numbers(path.read_text(encoding="utf-8")):
            if number not in STRUCTURAL and not any(snippet in line for snippet in allowed):
                found.append(f"{path.name}: {number} in {line.strip()}")
    assert found == [], "tuning numbers belong in rk_params (00_params.sql):\n" + "\n".join(found)


def inline_numbers(text: str) -> Iterator[tuple[str, str]]:
    """(number, the line it is on) for every numeric literal outside comments and strings."""
    for line in _COMMENTS.sub("", text).splitlines():
        for match in _NUMBER.finditer(_STRINGS.sub("''", line)):
            yield match.group(1), line


def test_the_lint_sees_a_new_inline_number() -> None:
    assert [n for n, _ in inline_numbers("WHERE x >= 0.7 * y -- 12 in a comment\n AND z = '3'")] == ["0.7"]


def test_the_docs_list_the_table_as_it_is(con: duckdb.DuckDBPyConnection) -> None:
    """docs/analysis.md#parameters shows every parameter with its value."""
    text = (LAYER_DIR.parent.parent.parent / "docs" / "analysis.md").read_text(encoding="utf-8")
    documented = {m.group(1): float(m.group(2).replace(",", ""))
                  for m in re.finditer(r"^\| `(\w+)` \| ([\d.,e+-]+) \| ", text, re.MULTILINE)}  # fmt: skip
    assert documented == {name: pytest.approx(value) for name, (value, _) in params(con).items()}


def test_a_changed_noise_threshold_changes_the_answer(con: duckdb.DuckDBPyConnection) -> None:
    """A rank 30 ms late every 7 steps is named; with noise_sigmas raised on one connection (the parameter
    table is per connection, as the macros are) the threshold follows the noise term (median + k sigma),
    the rank is no longer late there, and every other connection keeps the table as written."""
    job = SyntheticJob(nodes=(SynNode("a", 4), SynNode("b", 4, 20.0)), steps=60, step_jitter_ms=4.0,
                       faults=(SynFault(rank=5, ms=30, every=7, start_step=3),))  # fmt: skip
    write_job(con, job)
    named = {("rank", "b", 5): job.late_steps(5)}
    assert late_steps(con) == named
    [before] = query(con, "SELECT * FROM rk_noise(NULL, NULL, NULL)")
    assert before["noise_sigma_ns"] > 0
    sigmas = 1 + (60e6 - before["noise_median_ns"]) / before["noise_sigma_ns"]  # a threshold past 60 ms
    cur = con.cursor()
    for statement in ANALYSIS_PRELUDE:
        cur.execute(statement)
    cur.execute(
        "SET VARIABLE rk_params = struct_update(getvariable('rk_params'), "
        f"noise_sigmas := {{'value': {sigmas}, 'why': 'test'}})"
    )
    [(threshold_ns,)] = cur.execute("SELECT threshold_ns FROM rk_noise(NULL, NULL, NULL)").fetchall()
    assert threshold_ns == round(before["noise_median_ns"] + sigmas * before["noise_sigma_ns"])
    assert threshold_ns > 60e6 > before["threshold_ns"]
    significant = "SELECT count(*) FROM rk_stragglers(NULL, NULL, NULL) WHERE significant"
    assert cur.execute(significant).fetchall() == [(0,)]
    assert cur.execute("SELECT value FROM rk_params() WHERE name = 'noise_sigmas'").fetchall() == [(sigmas,)]
    assert late_steps(con) == named and params(con)["noise_sigmas"][0] == 6


def test_run_analysis_callers_can_read_the_table(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    with duckdb.connect(str(store)) as con:
        migrate(con)
    sql = "SELECT value FROM rk_params() WHERE name = 'noise_sigmas'"
    assert check_sql(sql) == sql
    assert check_sql("SELECT rk_param('noise_sigmas') AS k")
    box = Sandbox(lambda: store, SandboxLimits(memory_bytes=1 << 30, workers=1, margin_s=1.0), 10)
    try:
        assert box.query(sql).rows == [(6.0,)]
        assert box.query("SELECT rk_param('min_threshold_step_share') * 10 AS x").rows[0][0] == 1
    finally:
        box.close()


def test_the_table_is_one_statement_the_layers_define() -> None:
    settings = [name for name, layer in LAYERS.items() if not layer.is_macro]
    assert settings == ["rk_param_table"]
    assert LAYERS["rk_param_table"].sql.startswith("SET VARIABLE rk_params =")
