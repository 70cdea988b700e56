"""Make values from the wire safe to hand to a model: bounded, printable, JSON-shaped.

Anything a producer sent (node names, metric names, attribute keys and values) may be hostile: it is
cut to a length bound, and control, format (bidi overrides, zero-width) and surrogate characters are
dropped. ``attrs_json`` is parsed only when small, and nesting past a depth bound is replaced by a
marker, so a huge or deeply nested blob cannot stall or crash a tool. :func:`cap_rows` enforces the
result's byte budget.

Usage::

    clean_text("node\\u202e-a")        # 'node-a'
    json_safe(row_value)               # str/int/float/bool/None/list/dict only
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import unicodedata
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

MAX_TEXT = 1024
"""Longest string from the wire returned to a caller; longer ones end in '…'."""
MAX_ATTRS_CHARS = 16_384
"""attrs_json longer than this is not parsed; a clipped string and ``attrs_truncated`` come back."""
MAX_DEPTH = 6
"""Nesting deeper than this in any value is replaced by the string '<nested too deep>'."""
MAX_ITEMS = 200
"""Items kept per list or object; the rest are dropped (with a '…' key or item)."""
_DROP = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def clean_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` without control/format/bidi/surrogate characters (tab and newline become spaces)."""
    if len(text) > limit * 4:
        text = text[: limit * 4]
    out = "".join(
        " " if ch in "\t\n\r" else ch
        for ch in text
        if ch in "\t\n\r" or unicodedata.category(ch) not in _DROP
    )
    return out if len(out) <= limit else out[: limit - 1] + "…"


def json_safe(value: Any, depth: int = 0) -> Any:
    """A JSON-serialisable copy of a DuckDB value with every string cleaned and nesting bounded."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return clean_text(value)
    if depth >= MAX_DEPTH:
        return "<nested too deep>"
    if isinstance(value, Mapping):
        items = list(value.items())
        out = {clean_text(str(k), 128): json_safe(v, depth + 1) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["…"] = f"{len(items) - MAX_ITEMS} more"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        seq = list(value)
        kept = [json_safe(v, depth + 1) for v in seq[:MAX_ITEMS]]
        return kept + ([f"… {len(seq) - MAX_ITEMS} more"] if len(seq) > MAX_ITEMS else [])
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return {"base64": base64.b64encode(raw[:MAX_TEXT]).decode(), "bytes": len(raw)}
    return clean_text(str(value))


def parse_attrs(text: str | None) -> tuple[dict[str, Any] | None, bool]:
    """(attributes, truncated): parsed and cleaned when small and well-formed, else a clipped string."""
    if text is None:
        return None, False
    if len(text) > MAX_ATTRS_CHARS:
        return {"_raw": clean_text(text, 512)}, True
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return {"_raw": clean_text(text, 512)}, True
    if not isinstance(parsed, dict):
        return {"_raw": clean_text(text, 512)}, True
    return json_safe(parsed), False


def cap_rows(rows: Iterable[dict[str, Any]], max_bytes: int) -> tuple[list[dict[str, Any]], bool]:
    """Keep rows while their JSON encoding fits in ``max_bytes``; True when some were dropped."""
    kept: list[dict[str, Any]] = []
    size = 0
    for row in rows:
        size += len(json.dumps(row, ensure_ascii=False, default=str).encode()) + 1
        if size > max_bytes:
            return kept, True
        kept.append(row)
    return kept, False
