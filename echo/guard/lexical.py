"""Lexical pre-check on DuckDB's own tokens: refuse, by spelling, anything that names a file, URL,
catalog or write.

This layer is deliberately blunt and runs before DuckDB's parser sees the text. It refuses over-long
text first (every later step is linear in the length), normalises the query with NFKC (so full-width
or ligature look-alikes collapse to ASCII), refuses invisible and control characters outright, then
splits the text with DuckDB's own tokenizer (:func:`duckdb.tokenize`, :mod:`echo.guard.tokens`), so
it sees the same literals, quoted names and comments the parser will. String literals and comments
are data: never searched for keywords, schemes or function names (``LIKE 'https://%'`` is fine; a
string handed to ``query()`` is refused because ``query`` is). Quoted names are names: refused only
when they look like a path or URL, or stand where a table goes without being a plain name. Statement
keywords count only where a statement can begin, so ``AS load`` and ``(SELECT ...) load`` are
aliases, not LOAD statements.

Usage::

    check_lexical("SELECT count(*) FROM events")          # returns the normalised text
    check_lexical("SELECT * FROM read_csv('/etc/passwd')")  # raises Refused
"""

from __future__ import annotations

import re
import unicodedata

from rankecho.echo.guard.refusal import Refused
from rankecho.echo.guard.tokens import Token, tokens

MAX_QUERY_CHARS = 20_000

# Spellings refused in names (bare or quoted), keywords and operators; never in literals or comments.
# Each pattern is a plain alternation (no nested quantifiers): linear in the text it searches.
_NAMES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (why, re.compile(pattern, re.IGNORECASE))
    for why, pattern in (
        (
            "file readers (read_* / sniff_* / parquet_* / glob) are not allowed",
            r"\b(read|sniff|parquet)_\w*|\bglob \(|\w_scan\b",
        ),
        (
            "DuckDB catalog and settings introspection is not allowed",
            r"\bduckdb_\w+|\bpragma_\w+|\binformation_schema\b|\bpg_\w+|\bsqlite_\w+"
            r"|\bcurrent_setting\b|\bgetenv\b|\bgetvariable\b|\bwhich_secret\b|\bsettings \(",
        ),
        (
            "URLs and remote file systems are not allowed",
            r"\b(https?|s3[an]?|gcs|gs|azure|az|abfss?|r2|hf|ftp|file|httpfs)://|\bhttpfs\b",
        ),
        (
            "SQL executed from a string (query / query_table / json_execute_serialized_sql) is not allowed",
            r"\bquery(_table)? \(|\bjson_(execute|serialize|deserialize)_\w+",
        ),
        (
            "functions that change state (sequences, logs, checkpoints, the random seed) are not allowed",
            r"\b(nextval|setval|setseed|write_log|force_checkpoint|checkpoint|truncate_duckdb_logs) \(",
        ),
    )
)
# Keywords refused where a statement can begin (see :func:`_statement_starts`).
_STATEMENT_KEYWORDS = frozenset(
    {"insert", "update", "delete", "merge", "upsert", "drop", "alter", "create", "truncate", "attach",
     "detach", "copy", "export", "import", "install", "load", "force", "call", "checkpoint", "pragma",
     "vacuum", "grant", "revoke", "comment"}
)
# Statements refused when they open the text (these words are harmless inside a SELECT).
_LEADING = frozenset(
    {"set", "reset", "use", "begin", "start", "commit", "rollback", "abort", "end", "prepare", "execute",
     "deallocate", "describe", "show", "summarize", "explain", "analyze"}
)
# Catalog listings that also work as a subquery (``FROM (SHOW TABLES)``, ``(DESCRIBE events)``).
_LISTINGS = frozenset({"show", "describe", "summarize"})
_CTE_OPENERS = frozenset({"as", "materialized"})
"""Words before the ``(`` of a WITH entry's body: after its ``)`` another statement may follow."""
_CLAUSES = frozenset(
    {"select", "where", "group", "having", "order", "qualify", "window", "limit", "offset", "on", "using",
     "union", "except", "intersect", "values", "pivot", "unpivot", "returning", "by"}
)
_SUBQUERY = frozenset({"select", "with", "values"})
"""Words that, right after ``(``, start a subquery (FROM-first ``(FROM t)`` is handled beside them)."""
_DATA_FILE = re.compile(
    r"\.(csv|tsv|txt|json|jsonl|ndjson|parquet|gz|zst|zstd|bz2|lz4|db|duckdb|sqlite|sqlite3|arrow|ipc"
    r"|feather|xlsx|xls|avro|orc|xml|log|tbl|dat|wal)$",
    re.IGNORECASE,
)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _invisible(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def path_like(name: str) -> bool:
    """A quoted name a replacement scan could read as a file or URL: an absolute, home or relative path
    (``/x``, ``~/x``, ``./x``, ``C:x``, ``\\x``), a URL, or a data file's name (``a.parquet``).
    ``"events/s"`` or ``"rankecho.health.score"`` are names, not paths."""
    return (
        name.startswith(("/", "~", "\\", "./", "../"))
        or (len(name) > 1 and name[1] == ":" and name[0].isalpha())
        or "://" in name
        or _DATA_FILE.search(name) is not None
    )


def _statement_starts(toks: list[Token]) -> list[int]:
    """Indexes of the tokens where a statement can begin: the first, the one after ``;`` or ``(``, and
    the one after the ``)`` that closes a WITH entry's body (``WITH x AS (...) DELETE ...``)."""
    starts, opened_by = [0], []  # opened_by: was each open '(' a WITH body?
    for i, tok in enumerate(toks):
        if tok.text == "(":
            opened_by.append(i > 0 and toks[i - 1].lower in _CTE_OPENERS)
            starts.append(i + 1)
        elif tok.text == ")":
            if opened_by and opened_by.pop():
                starts.append(i + 1)
        elif tok.text == ";":
            starts.append(i + 1)
    return [i for i in starts if i < len(toks)]


def _quoted_source(toks: list[Token]) -> str | None:
    """Why a string literal or a quoted non-name stands where DuckDB expects a table (a FROM or JOIN
    item), which a replacement scan would read as a file; None when nothing does.

    A word before ``(`` opens a call, where FROM only separates arguments (``trim(x FROM y)``), unless
    the parenthesis starts a subquery: ``AND (SELECT ...)``, ``EXISTS (FROM ...)``, ``ARRAY(WITH ...)``
    (only ``trim`` takes FROM as its first argument).
    """
    clause: list[str | None] = [None]  # the clause at each parenthesis depth; "call" inside f(...)
    prev = before = ""
    for tok in toks:
        token, low = tok.text, tok.lower
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
        elif tok.kind == "string" and clause[-1] == "from":
            return "a quoted string cannot be a FROM source (that would read a file)"
        elif (
            tok.quoted
            and clause[-1] == "from"
            and prev.lower() in ("from", "join", ",", "(", "lateral")
            and not _PLAIN_NAME.fullmatch(tok.name)
        ):
            return "a quoted table name must be a plain name (a replacement scan would read it as a file)"
        prev, before = token, prev.lower()
    return None


def _check_tokens(toks: list[Token]) -> None:
    """Every rule of this layer over one token list; raises :class:`Refused` at the first that fires."""
    code = " ".join("''" if tok.kind == "string" else tok.text for tok in toks)
    for why, pattern in _NAMES:
        if pattern.search(code):
            raise Refused(why)
    for i, tok in enumerate(toks):
        if tok.kind == "string" and tok.text[:1] in "eE":
            raise Refused("escape-string literals (E'...') are not allowed; use plain '...' strings")
        if tok.kind == "string" and tok.text[:1] == "$":
            raise Refused("dollar-quoted literals ($$...$$) are not allowed; use plain '...' strings")
        following = toks[i + 1] if i + 1 < len(toks) else None
        if tok.lower == "u" and following and following.text == "&" and following.start == tok.end:
            raise Refused("unicode-escape literals and names (U&'...') are not allowed")
        if tok.quoted:
            if path_like(tok.name):
                raise Refused("quoted names that look like paths or URLs are not allowed")
        elif tok.kind != "string" and not tok.text.isascii():
            raise Refused(
                "names outside quotes must be plain ASCII (a look-alike letter can hide a function): "
                'double-quote names such as "métrique"'
            )
        if tok.text == "(" and i + 1 < len(toks) and toks[i + 1].lower in _LISTINGS:
            raise Refused(f"'{toks[i + 1].text.upper()}' statements are not allowed")
    if toks and toks[0].lower in _LEADING:
        raise Refused(f"'{toks[0].text.upper()}' statements are not allowed")
    for i in _statement_starts(toks):
        if toks[i].lower in _STATEMENT_KEYWORDS and not toks[i].quoted:
            raise Refused(f"'{toks[i].text.upper()}' statements and clauses are not allowed")
    source = _quoted_source(toks)
    if source:
        raise Refused(source)


def check_lexical(sql: str) -> str:
    """Return ``sql`` NFKC-normalised and stripped of one trailing ';', or raise :class:`Refused`."""
    if not isinstance(sql, str) or not sql.strip():
        raise Refused("the query is empty")
    if len(sql) > MAX_QUERY_CHARS:
        raise Refused(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if any(_invisible(ch) for ch in sql):
        raise Refused("the query contains control, invisible or bidirectional characters")
    text = unicodedata.normalize("NFKC", sql)
    for form in dict.fromkeys((text, sql)):  # both spellings, the normalised one first
        _check_tokens(tokens(form))
    return text.strip().removesuffix(";").rstrip()
