"""docs/contract.md cannot drift from the wire-name modules or from the ``events`` migrations.

Every wire-name constant (``shared/contract.py``, and ``echo/ingest/keys.py`` for the keys Echo adds)
must have a row naming it and its exact wire key (and no row may name a
constant that is gone), the attribute -> column precedence must match ``COLUMN_SOURCES`` and
``PROMOTED_COPIES`` in order, and the ``events`` columns and types must match the migrations.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from rankecho.shared import contract

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "contract.md"
MIGRATIONS = ROOT / "echo" / "migrations"
WHERE = {"resource", "point", "resource or point", "metric", "Echo"}


def _sections() -> dict[str, str]:
    """Heading text (after '## ') -> the markdown below it."""
    parts = re.split(r"^## (.+)$", DOC.read_text(), flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _rows(markdown: str) -> list[list[str]]:
    """Cells of every table body row (header and separator rows left out)."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| :]+\|", line.strip()):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [r for r in rows if r[0].startswith("`")]


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


WIRE_MODULES = ("rankecho.shared.contract", "rankecho.echo.ingest.keys")


def wire_constants() -> dict[str, str]:
    """Constant name -> wire name, over every module that defines wire names."""
    found: dict[str, str] = {}
    for module in map(importlib.import_module, WIRE_MODULES):
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str):
                assert found.get(name, value) == value, f"{name} means two wire names"
                found[name] = value
    return found


def constant_rows() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for row in _rows(DOC.read_text()):
        if len(row) == 4 and re.fullmatch(r"`[A-Z][A-Z0-9_]*`", row[0]):
            name = row[0].strip("`")
            assert name not in found, f"{name} has two rows in docs/contract.md"
            found[name] = row
    return found


def test_every_wire_name_has_a_row_with_its_exact_key() -> None:
    rows = constant_rows()
    wire = wire_constants()
    missing = [f"| `{k}` | `{v}` | <where> | <meaning> |" for k, v in wire.items() if k not in rows]
    assert not missing, "add these rows to docs/contract.md:\n" + "\n".join(missing)
    wrong = [f"{k}: docs say {rows[k][1]}, code says `{v}`"
             for k, v in wire_constants().items() if rows[k][1] != f"`{v}`"]
    assert not wrong, "\n".join(wrong)


def test_no_row_names_a_constant_that_is_gone() -> None:
    stale = sorted(set(constant_rows()) - set(wire_constants()))
    assert not stale, f"remove or rename these rows in docs/contract.md: {stale}"


def test_every_row_says_where_and_what() -> None:
    for name, (_, _, where, meaning) in constant_rows().items():
        assert where in WHERE, f"{name}: 'where' must be one of {sorted(WHERE)}, not {where!r}"
        assert len(meaning) > 10, f"{name}: say what it means and its unit"


def test_column_precedence_matches_column_sources() -> None:
    section = _sections()["Attribute -> column mapping"]
    rows = {_code(r[0])[0]: _code(r[1]) for r in _rows(section)}
    expected = {col: list(keys) for col, keys in contract.COLUMN_SOURCES.items()}
    expected |= {col: [key] for col, key in contract.PROMOTED_COPIES.items()}
    assert rows == expected


def _events_columns() -> list[tuple[str, str]]:
    """(name, type) of ``events`` after applying every migration in order."""
    columns: dict[str, str] = {}
    column = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s+([A-Za-z]+(?:\([^)]*\))?(?:\[\])?)", re.I)
    for path in sorted(MIGRATIONS.glob("*.sql")):
        sql = re.sub(r"--[^\n]*", "", path.read_text())
        create = re.search(r"CREATE TABLE (?:IF NOT EXISTS )?events\s*\((.*?)\);", sql, re.S | re.I)
        if create:
            for line in create.group(1).splitlines():
                match = column.match(line)
                if match and match.group(1).upper() not in {"PRIMARY", "UNIQUE", "CHECK", "FOREIGN"}:
                    columns[match.group(1)] = match.group(2).upper()
        add = r"ALTER TABLE events ADD COLUMN (?:IF NOT EXISTS )?(\w+)\s+([A-Za-z]+(?:\([^)]*\))?)"
        for name, kind in re.findall(add, sql, re.I):
            columns[name] = kind.upper()
        for name in re.findall(r"ALTER TABLE events DROP COLUMN (?:IF EXISTS )?(\w+)", sql, re.I):
            columns.pop(name, None)
    return list(columns.items())


def test_events_columns_match_the_migrations() -> None:
    section = _sections()["The `events` table"]
    documented = [(_code(r[0])[0], _code(r[1])[0]) for r in _rows(section)]
    actual = _events_columns()
    assert len(actual) >= 13, "could not read the events table from echo/migrations"
    assert documented == actual, "update the events table in docs/contract.md"
