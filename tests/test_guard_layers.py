"""Each guard layer alone against the whole hostile corpus (issue 13): none relies on another.

- lexical only (:func:`rankecho.echo.guard.lexical.check_lexical`),
- parser/AST only (:func:`rankecho.echo.guard.parsed.check_parsed`, on the raw text, no lexical pass first),
- sealed read-only execution only (an analysis worker, :class:`echo.sandbox.Sandbox`, with a gate that
  lets everything through).

Every hostile query that writes, or reaches a file, the network or a setting (classified below by
rules independent of the guard's own code) is refused by each of the two checking layers on its own,
and neutralised by the execution layer on its own: the store is unchanged, no file appears, no file's
content comes back, the settings are unchanged. On hostile input a layer raises only its own documented
error type (Refused for the checks; QueryError and its kin for execution), never a stray ValueError.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from guard_corpus.corpus import build_store, fingerprint, load

from rankecho.echo.guard import Refused, project_policy
from rankecho.echo.guard.lexical import check_lexical
from rankecho.echo.guard.parsed import check_parsed
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.store.reader import QueryError, QueryTimeoutError

HOSTILE = load("hostile")

_LITERALS = re.compile(r"[eE]?'(?:[^']|'')*'?|\$(\w*)\$.*?\$\1\$|--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)
_NAMES = re.compile(
    r"\b(insert|update|delete|merge|upsert|drop|alter|create|truncate|attach|detach|copy|export|import"
    r"|install|load|checkpoint|force_checkpoint|vacuum|pragma\w*|call|set|reset|nextval|setval|write_log"
    r"|current_setting|getenv|getvariable|which_secret|duckdb_settings|read_\w+|\w+_scan|glob|sniff_\w+"
    r"|parquet_\w+|query|query_table|httpfs|json_execute_serialized_sql|show|describe|summarize)\b|://",
    re.IGNORECASE,
)
_FILE_SOURCE = re.compile(
    r"\b(from|join)\s*\(?\s*'|\bfrom\b[^()']*,\s*'|\"[^\"]*([/\\:~]|\.(csv|parquet|json|txt|db))[^\"]*\"",
    re.IGNORECASE,
)
# DuckDB drops these parts before anything runs (an unused named WINDOW; a table alias is only a name),
# so the parser layer sees nothing to refuse and there is nothing to refuse; proven by running them.
NEVER_EXECUTED = {
    "SELECT * FROM events WINDOW w AS (ORDER BY (SELECT 1 FROM read_text('/x')))",
    'SELECT "/etc/passwd".* FROM events AS "/etc/passwd"',
}


def dangerous(sql: str) -> bool:
    """Writes, files, network or settings, judged by spelling outside literals, or a literal or path-like
    quoted name where a table goes."""
    text = unicodedata.normalize("NFKC", sql)
    return bool(_NAMES.search(_LITERALS.sub(" ", text)) or _FILE_SOURCE.search(text))


DANGEROUS = [sql for sql in HOSTILE if dangerous(sql)]


def test_the_classification_covers_most_of_the_corpus() -> None:
    assert len(DANGEROUS) >= 150, len(DANGEROUS)


@pytest.mark.parametrize("sql", HOSTILE, ids=[f"hostile{i:03d}" for i in range(len(HOSTILE))])
def test_lexical_layer_alone(sql: str) -> None:
    try:
        check_lexical(sql)
    except Refused:
        return
    assert sql not in DANGEROUS, "the lexical layer let a write, file, network or settings access through"


@pytest.mark.parametrize("sql", HOSTILE, ids=[f"hostile{i:03d}" for i in range(len(HOSTILE))])
def test_parser_layer_alone(sql: str) -> None:
    try:
        check_parsed(sql, project_policy())
    except Refused:
        return
    assert sql not in DANGEROUS or sql in NEVER_EXECUTED, "the parser layer let a dangerous query through"


def test_parser_layer_raises_only_refused_on_statements_python_cannot_name() -> None:
    for sql in ("UPDATE EXTENSIONS", "UPDATE EXTENSIONS (httpfs)"):
        with pytest.raises(Refused, match="only SELECT statements are allowed"):
            check_parsed(sql, project_policy())


def test_what_the_parser_lets_through_is_never_executed_by_duckdb(tmp_path: Path) -> None:
    con = duckdb.connect(":memory:")  # external access on: a file read here would fail or return data
    con.execute("CREATE TABLE events AS SELECT 1 AS node_id")
    for sql in NEVER_EXECUTED:
        assert con.execute(sql).fetchall() == [(1,)]


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, Path]]:
    path = tmp_path_factory.mktemp("layers") / "echo.db"
    build_store(path).close()
    limits = SandboxLimits(memory_bytes=384 << 20, workers=1, margin_s=1.0)
    box = Sandbox(lambda: path, limits, timeout_s=2.0, check=lambda sql: sql)
    yield box, path
    box.close()


def test_sealed_execution_alone(sealed: tuple[Sandbox, Path], tmp_path: Path) -> None:
    box, path = sealed
    with duckdb.connect(str(path), read_only=True) as con:
        before = fingerprint(con)
    files_before = set(path.parent.iterdir()) | set(Path("/tmp").glob("leak*"))
    passwd = Path("/etc/passwd").read_text(encoding="utf-8", errors="replace").splitlines()[0]
    answered = 0
    for sql in HOSTILE:
        try:
            result = box.query(sql)
        except (QueryError, QueryTimeoutError):
            continue  # QueryResourceError is a QueryError
        answered += 1
        assert passwd not in repr(result.rows), f"file content came back for {sql!r}"
    settings = box.query(
        "SELECT current_setting('enable_external_access'), current_setting('lock_configuration')"
    )
    assert settings.rows == [(False, True)]
    with duckdb.connect(str(path), read_only=True) as con:
        assert fingerprint(con) == before
    assert set(path.parent.iterdir()) | set(Path("/tmp").glob("leak*")) == files_before
    assert answered < len(HOSTILE) // 2  # most are refused by DuckDB itself: sealed and read-only
