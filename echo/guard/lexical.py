"""Lexical pre-check: refuse, by spelling alone, anything that names a file, URL, catalog or write.

This layer is deliberately blunt and runs before DuckDB's parser sees the text. It normalises the
query with NFKC (so full-width or ligature look-alikes collapse to ASCII), refuses invisible and
control characters outright, and then searches for the forbidden spellings. Function and scheme
names are searched everywhere, string literals included (a table function hidden inside a string
handed to ``query()`` is still a table function); statement keywords are searched with literals and
comments blanked out, so ``WHERE metric_name = 'update'`` is not a write.

Usage::

    check_lexical("SELECT count(*) FROM events")          # returns the normalised text
    check_lexical("SELECT * FROM read_csv('/etc/passwd')")  # raises Refused
"""

from __future__ import annotations

import re
import unicodedata

from echo.guard.refusal import Refused

MAX_QUERY_CHARS = 20_000

# Spellings refused anywhere in the text (string literals included).
_ANYWHERE: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (why, re.compile(pattern, re.IGNORECASE))
    for why, pattern in (
        (
            "file readers (read_* / sniff_* / parquet_* / glob) are not allowed",
            r"\b(read|sniff|parquet)_\w*|\bglob\s*\(|\w_scan\b",
        ),
        (
            "DuckDB catalog and settings introspection is not allowed",
            r"\bduckdb_\w+|\bpragma_\w+|\binformation_schema\b|\bpg_\w+|\bsqlite_\w+"
            r"|\bcurrent_setting\b|\bgetenv\b|\bgetvariable\b|\bwhich_secret\b|\bsettings\s*\(",
        ),
        (
            "URLs and remote file systems are not allowed",
            r"\b(https?|s3[an]?|gcs|gs|azure|az|abfss?|r2|hf|ftp|file|httpfs)://|\bhttpfs\b",
        ),
        (
            "SQL executed from a string (query / query_table / json_execute_serialized_sql) is not allowed",
            r"\bquery(_table)?\s*\(|\bjson_(execute|serialize|deserialize)_\w+",
        ),
        ("dollar-quoted and unicode-escape literals are not allowed", r"\$[A-Za-z_]*\$|\b[uU]&['\"]"),
    )
)

# Keywords refused outside string literals and comments.
_KEYWORDS = re.compile(
    r"\b(insert|update|delete|merge|upsert|drop|alter|create|truncate|attach|detach|copy|export|import"
    r"|install|load|call|checkpoint|pragma|vacuum|grant|revoke|comment)\b",
    re.IGNORECASE,
)
# Statements refused when they open the text (these words are harmless inside a SELECT).
_LEADING = re.compile(
    r"^\W*(set|reset|use|begin|start|commit|rollback|abort|end|prepare|execute|deallocate|describe|show"
    r"|summarize|explain|analyze|pivot|unpivot)\b",
    re.IGNORECASE,
)
# A quoted source after FROM / JOIN, e.g. FROM 'x.csv' or JOIN "/etc/passwd".
_QUOTED_SOURCE = re.compile(r"\b(from|join)\s*\(?\s*'", re.IGNORECASE)
_PATHLIKE_IDENT = re.compile(r'"[^"]*[./:\\~][^"]*"')
_LITERAL_OR_COMMENT = re.compile(r"'(?:[^']|'')*'?|--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)


def _invisible(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def blank_literals(text: str) -> str:
    """Replace string literals and comments by spaces, keeping every other character in place.

    Refuses escape strings (``E'...'``): their backslash escapes would let a literal end somewhere
    else than this scanner thinks, so keywords could hide from the check.
    """
    for m in _LITERAL_OR_COMMENT.finditer(text):
        start = m.start()
        if (
            m.group(0).startswith("'")
            and start > 0
            and text[start - 1] in "eE"
            and (start == 1 or not (text[start - 2].isalnum() or text[start - 2] == "_"))
        ):
            raise Refused("escape-string literals (E'...') are not allowed; use plain '...' strings")
    return _LITERAL_OR_COMMENT.sub(lambda m: " " * len(m.group(0)), text)


def check_lexical(sql: str) -> str:
    """Return ``sql`` NFKC-normalised and stripped of one trailing ';', or raise :class:`Refused`."""
    if not isinstance(sql, str) or not sql.strip():
        raise Refused("the query is empty")
    if len(sql) > MAX_QUERY_CHARS:
        raise Refused(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if any(_invisible(ch) for ch in sql):
        raise Refused("the query contains control, invisible or bidirectional characters")
    text = unicodedata.normalize("NFKC", sql)
    for form in {sql, text}:
        for why, pattern in _ANYWHERE:
            if pattern.search(form):
                raise Refused(why)
        code = blank_literals(form)
        keyword = _KEYWORDS.search(code)
        if keyword:
            raise Refused(f"'{keyword.group(1).upper()}' statements and clauses are not allowed")
        leading = _LEADING.search(code)
        if leading:
            raise Refused(f"'{leading.group(1).upper()}' statements are not allowed")
        if _QUOTED_SOURCE.search(form):
            raise Refused("a quoted string cannot be a FROM source (that would read a file)")
        if _PATHLIKE_IDENT.search(code):
            raise Refused("quoted names that look like paths or URLs are not allowed")
    return text.strip().removesuffix(";").rstrip()
