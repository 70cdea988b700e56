"""Keys Echo itself writes into ``attrs_json`` (never sent by producers, so not part of shared.contract).

They describe how Echo stored an event: repairs it made, histogram summaries, span and log fields.
``docs/echo.md`` lists them.
"""

from __future__ import annotations

from typing import Final

DROPPED_ATTRIBUTES: Final = "rankecho.dropped_attributes_count"
"""Attributes Echo dropped from this event because it carried more than Echo keeps per event."""
NONFINITE_VALUE: Final = "rankecho.nonfinite_value"
"""``NaN``, ``Infinity`` or ``-Infinity``: the sent value, stored as NULL in ``value_double``."""
HIST_MIN: Final = "rankecho.histogram.min"
HIST_MAX: Final = "rankecho.histogram.max"
HIST_BOUNDS: Final = "rankecho.histogram.explicit_bounds"
HIST_BUCKET_COUNTS: Final = "rankecho.histogram.bucket_counts"
HIST_SCALE: Final = "rankecho.histogram.scale"
SUMMARY_QUANTILES: Final = "rankecho.summary.quantiles"
"""``{"0.5": v, "0.99": v}`` for OTLP summary points (value_double = sum, value_int = count)."""
METRIC_KIND: Final = "rankecho.metric.kind"
"""Set for non-gauge metrics: ``sum``, ``histogram``, ``exponential_histogram`` or ``summary``."""
TRACE_ID: Final = "trace_id"
SPAN_ID: Final = "span_id"
PARENT_SPAN_ID: Final = "parent_span_id"
SPAN_KIND: Final = "rankecho.span.kind"
SPAN_STATUS: Final = "rankecho.span.status"
SPAN_END_NS: Final = "rankecho.span.end_ns"
SEVERITY_TEXT: Final = "log.severity_text"
SEVERITY_NUMBER: Final = "log.severity_number"
LOG_BODY: Final = "log.body"
