"""Guard-side size limits: refuse, before anything runs, constants that ask for huge lists or strings.

This is an extra layer in front of the analysis worker's hard memory cap (:mod:`rankecho.echo.sandbox`): a
query such as ``SELECT len(range(1000000000))`` or ``repeat('x', 1000000000)`` would only be stopped
there after allocating up to the cap; here it is refused at once with a message that says what to
change. Only sizes written as constants (or constant arithmetic) are decided here; sizes computed from
data are left to the worker's limits.

Usage::

    check_sizes("range", function_node)   # raises Refused when the constant arguments ask too much
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rankecho.echo.guard.refusal import Refused

MAX_RANGE_ROWS = 10_000_000
"""Most values range()/generate_series() may produce (as a table or a list)."""
MAX_REPEAT = 1_000_000
"""Largest count repeat()/lpad()/rpad()/list_resize() may ask for."""
_COUNT_ARGUMENT = {"repeat": 1, "lpad": 1, "rpad": 1, "list_resize": 1, "array_resize": 1}
_ARITHMETIC = {"+", "-", "*", "/", "//"}


def number(expr: Any) -> float | None:
    """The value of a constant numeric expression (literals, casts, + - * /), else None."""
    if not isinstance(expr, Mapping):
        return None
    cls = expr.get("class")
    if cls == "CONSTANT":
        literal = expr.get("literal")
        text = literal.get("text") if isinstance(literal, Mapping) else None
        try:
            return float(text) if isinstance(text, str) else None
        except ValueError:
            return None
    if cls == "CAST":
        return number(expr.get("child"))
    if cls == "FUNCTION" and expr.get("is_operator") and expr.get("function_name") in _ARITHMETIC:
        values = [number(a.get("expression")) if isinstance(a, Mapping) else None for a in _arguments(expr)]
        if any(v is None for v in values) or not values:
            return None
        return _apply(str(expr["function_name"]), [v for v in values if v is not None])
    return None


def _apply(op: str, values: list[float]) -> float | None:
    if len(values) == 1:
        return -values[0] if op == "-" else values[0]
    a, b = values[0], values[1]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b else None


def _arguments(function: Mapping[str, Any]) -> list[Any]:
    args = function.get("arguments")
    if isinstance(args, list):
        return args
    children = function.get("children")
    return [{"expression": c} for c in children] if isinstance(children, list) else []


def range_size(values: list[float | None]) -> float | None:
    """How many values range(...)/generate_series(...) with these numeric arguments yields."""
    if not values or any(v is None for v in values):
        return None
    nums = [v for v in values if v is not None]
    start, stop, step = (0.0, nums[0], 1.0) if len(nums) == 1 else (nums[0], nums[1], 1.0)
    if len(nums) >= 3:
        step = nums[2]
    if step == 0 or not all(math.isfinite(v) for v in (start, stop, step)):
        return math.inf
    return max(0.0, (stop - start) / step)


def check_sizes(name: str, function: Mapping[str, Any]) -> None:
    """Refuse ``name(...)`` when its constant arguments ask for more than the limits above."""
    lowered = name.lower()
    values = [number(a.get("expression")) if isinstance(a, Mapping) else None for a in _arguments(function)]
    if lowered in ("range", "generate_series"):
        size = range_size(values)
        if size is not None and size > MAX_RANGE_ROWS:
            raise Refused(
                f"{lowered}() would produce {_count(size)} values, more than {MAX_RANGE_ROWS:,}: use a "
                "smaller range, or read the rows you need from the tables instead"
            )
    index = _COUNT_ARGUMENT.get(lowered)
    if index is not None and index < len(values):
        count = values[index]
        if count is not None and not count <= MAX_REPEAT:
            raise Refused(
                f"{lowered}() asks for {_count(count)} repetitions, more than {MAX_REPEAT:,}: use a smaller "
                "count (results are capped at a few MB anyway)"
            )


def _count(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else "unboundedly many"
