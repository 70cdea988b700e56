"""Time windows as a model writes them, resolved to ``[start_ns, end_ns)`` in Unix nanoseconds.

Accepted forms (UTC throughout):

- ``None`` / ``""`` / ``"all"``: everything stored;
- ``"last 5m"``: the span ending at the newest stored event (units s, m, h, d; ``"last 90s"``);
- ``"2026-12-02T14:30:00Z/2026-12-02T14:35:00Z"``: ISO-8601 start/end (no offset means UTC);
- ``"14:30-14:35"`` or ``"14:30:00-14:35:30"``: a time range on the UTC day of the newest event.

Anchoring at the newest event (not the wall clock) makes an offline store answer like a live one.

Usage::

    window = parse_window("last 5m", Anchor(latest_ns=..., latest_day_ns=...))
    window.start_ns, window.end_ns
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

NS_PER_S = 1_000_000_000
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
_LAST = re.compile(r"^last\s+(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)$", re.IGNORECASE)
_CLOCK = r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?"
_CLOCK_RANGE = re.compile(rf"^{_CLOCK}\s*-\s*{_CLOCK}$")

ACCEPTED_FORMS = (
    "accepted window forms: omit it (all data); 'last 5m' (s, m, h or d, ending at the newest event); "
    "'2026-12-02T14:30:00Z/2026-12-02T14:35:00Z' (ISO-8601 start/end, UTC unless an offset is given); "
    "'14:30-14:35' (UTC, on the day of the newest event)"
)


class WindowError(ValueError):
    """The window text matches none of the accepted forms; the message lists them."""


@dataclass(frozen=True)
class Anchor:
    """What relative windows are resolved against: the newest event and the start of its UTC day."""

    latest_ns: int | None
    latest_day_ns: int | None


@dataclass(frozen=True)
class Window:
    """``[start_ns, end_ns)``; None on a side means unbounded there."""

    start_ns: int | None
    end_ns: int | None

    def describe(self) -> dict[str, str | None]:
        return {"start": iso(self.start_ns), "end": iso(self.end_ns)}


def iso(ns: int | None) -> str | None:
    """``ns`` as ISO-8601 UTC with microseconds, or None."""
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / NS_PER_S, UTC).isoformat().replace("+00:00", "Z")


def parse_window(text: str | None, anchor: Anchor) -> Window:
    """Resolve ``text`` against ``anchor``; raise :class:`WindowError` listing the accepted forms."""
    if text is None or not text.strip() or text.strip().lower() == "all":
        return Window(None, None)
    cleaned = text.strip()
    if len(cleaned) > 80:
        raise WindowError(f"the window is too long to be a time window; {ACCEPTED_FORMS}")
    if m := _LAST.match(cleaned):
        if anchor.latest_ns is None:
            return Window(None, None)
        span = int(float(m.group(1)) * _UNITS[m.group(2).lower()] * NS_PER_S)
        return Window(anchor.latest_ns - span, anchor.latest_ns + 1)
    if m := _CLOCK_RANGE.match(cleaned):
        return _clock_range(m.groups(), anchor)
    if "/" in cleaned:
        start, _, end = cleaned.partition("/")
        window = Window(_iso_ns(start), _iso_ns(end))
        if window.start_ns is not None and window.end_ns is not None and window.end_ns <= window.start_ns:
            raise WindowError(f"the window ends before it starts; {ACCEPTED_FORMS}")
        return window
    raise WindowError(f"cannot read window {_shown(cleaned)}; {ACCEPTED_FORMS}")


def _clock_range(parts: tuple[str | None, ...], anchor: Anchor) -> Window:
    h1, m1, s1, h2, m2, s2 = (int(p) if p else 0 for p in parts)
    start_s, end_s = h1 * 3600 + m1 * 60 + s1, h2 * 3600 + m2 * 60 + s2
    if end_s <= start_s:
        raise WindowError(f"the clock range ends before it starts (no wrap past midnight); {ACCEPTED_FORMS}")
    if anchor.latest_day_ns is None:
        return Window(None, None)
    return Window(anchor.latest_day_ns + start_s * NS_PER_S, anchor.latest_day_ns + end_s * NS_PER_S)


def _iso_ns(text: str) -> int:
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise WindowError(f"{_shown(text.strip())} is not an ISO-8601 time; {ACCEPTED_FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * NS_PER_S + delta.microseconds * 1000


def _shown(text: str) -> str:
    return repr("".join(ch for ch in text[:40] if ch.isprintable()))
