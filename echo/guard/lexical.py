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

from rankecho.echo.guard.refusal import Refused

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
        (
            "functions that change state (sequences, logs, checkpoints) are not allowed",
            r"\b(nextval|setval|write_log|force_checkpoint|checkpoint|truncate_duckdb_logs)\s*\(",
        ),
    )
)

# Keywords refused outside string literals and comments where a statement can begin: at the start,
# after ';', '(' or ')' (``WITH x AS (DELETE ...)``, ``WITH x AS (...) DELETE ...``). Elsewhere they
# are names (``AS load``, ``sum(x) AS copy``) and the parser layer decides.
_KEYWORDS = re.compile(
    r"(?:^|[;()])\s*(insert|update|delete|merge|upsert|drop|alter|create|truncate|attach|detach|copy|export"
    r"|import|install|load|force|call|checkpoint|pragma|vacuum|grant|revoke|comment)\b",
    re.IGNORECASE,
)
# Statements refused when they open the text (these words are harmless inside a SELECT).
_LEADING = re.compile(
    r"^\W*(set|reset|use|begin|start|commit|rollback|abort|end|prepare|execute|deallocate|describe|show"
    r"|summarize|explain|analyze)\b",
    re.IGNORECASE,
)
# Catalog listings that also work as a subquery (``FROM (SHOW TABLES)``, ``(DESCRIBE events)``).
_NESTED_LISTING = re.compile(r"\(\s*(show|describe|summarize)\b", re.IGNORECASE)
# Tokens for finding a string literal used as a FROM item (``FROM 'x.csv'``, ``FROM t, '/etc/passwd'``,
# ``JOIN ('a.csv')``), which DuckDB would read as a file; the FROM inside ``extract(epoch FROM '...')``
# or ``trim(... FROM '...')`` is an argument separator, not a clause.
TOKEN = re.compile(r"'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?|--[^\n]*|/\*.*?(?:\*/|$)|\w+|\S", re.DOTALL)
_CLAUSES = frozenset(
    {"select", "where", "group", "having", "order", "qualify", "window", "limit", "offset", "on", "using",
     "union", "except", "intersect", "values", "pivot", "unpivot", "returning", "by"}
)
_SUBQUERY = frozenset({"select", "with", "values"})
"""Words that, right after ``(``, start a subquery (FROM-first ``(FROM t)`` is handled beside them)."""
# A quoted name that looks like a path, URL or data file (a replacement scan would read it); dotted
# names such as "rankecho.health.score" (pivoted metric columns) are fine.
_PATHLIKE_IDENT = re.compile(
    r'"(?:[^"]*[/:\\~][^"]*|[^"]*\.(?:csv|tsv|txt|json|jsonl|ndjson|parquet|gz|zst|zstd|bz2|lz4|db|duckdb'
    r'|sqlite|sqlite3|arrow|ipc|feather|xlsx|xls|avro|orc|xml|log|tbl|dat|wal))"',
    re.IGNORECASE,
)
_QUOTED_IDENT = re.compile(r'"(?:[^"]|"")*"?')
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


def _quoted_source(text: str) -> bool:
    """True when a string literal stands where DuckDB expects a table (a FROM or JOIN item).

    A word before ``(`` opens a call, where FROM only separates arguments (``trim(x FROM y)``), unless
    the parenthesis starts a subquery: ``AND (SELECT ...)``, ``EXISTS (FROM ...)``, ``ARRAY(WITH ...)``
    (only ``trim`` takes FROM as its first argument).
    """
    clause: list[str | None] = [None]  # the clause at each parenthesis depth; "call" inside f(...)
    prev = before = ""
    for match in TOKEN.finditer(text):
        token = match.group(0)
        low = token.lower()
        if token.startswith(("--", "/*")):
            continue
        subquery = low in _SUBQUERY or (low == "from" and before != "trim")
        if clause[-1] == "call" and prev == "(" and subquery:
            clause[-1] = None  # a subquery, not arguments
        if token == "(":
            if clause[-1] == "from" and prev.lower() in ("from", "join", ",", "lateral"):
                clause.append("from")
            elif prev[:1].isalnum() or prev[:1] == "_" or prev[:1] == '"':
                clause.append("call" if prev.lower() not in _CLAUSES else None)
            else:
                clause.append(None)
        elif token == ")":
            if len(clause) > 1:
                clause.pop()
        elif clause[-1] != "call" and low in ("from", "join") and prev.lower() != "distinct":
            clause[-1] = "from"  # (not the FROM of IS [NOT] DISTINCT FROM)
        elif clause[-1] != "call" and low in _CLAUSES:
            clause[-1] = low
        elif token.startswith("'") and clause[-1] == "from":
            return True
        prev, before = token, prev.lower()
    return False


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
        leading = _LEADING.search(code) or _NESTED_LISTING.search(code)
        if leading:
            raise Refused(f"'{leading.group(1).upper()}' statements are not allowed")
        if _quoted_source(form):
            raise Refused("a quoted string cannot be a FROM source (that would read a file)")
        if any(not ch.isascii() for ch in _QUOTED_IDENT.sub(" ", code)):
            raise Refused(
                "names outside quotes must be plain ASCII (a look-alike letter can hide a function): "
                'double-quote names such as "métrique"'
            )
        if _PATHLIKE_IDENT.search(code):
            raise Refused("quoted names that look like paths or URLs are not allowed")
    return text.strip().removesuffix(";").rstrip()
