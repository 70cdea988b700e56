"""Keys Echo itself writes into ``attrs_json`` (never sent by producers, so not part of shared.contract).

They describe how Echo stored an event: repairs it made, histogram summaries, span and log fields, and every
other OTLP field that has no column.
``docs/contract.md`` lists them (a test keeps the two in step).
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

# Every other field of the OTLP data model (docs/contract.md, "Every OTLP field", says where each goes).
RESOURCE_SCHEMA_URL: Final = "rankecho.resource.schema_url"
RESOURCE_DROPPED_ATTRIBUTES: Final = "rankecho.resource.dropped_attributes_count"
RESOURCE_ENTITY_REFS: Final = "rankecho.resource.entity_refs"
"""The resource's entity references: ``[{"type", "id_keys", "description_keys", "schema_url"}]``."""
SCOPE_NAME: Final = "otel.scope.name"
SCOPE_VERSION: Final = "otel.scope.version"
SCOPE_ATTRIBUTES: Final = "rankecho.scope.attributes"
SCOPE_DROPPED_ATTRIBUTES: Final = "rankecho.scope.dropped_attributes_count"
SCOPE_SCHEMA_URL: Final = "rankecho.scope.schema_url"
METRIC_UNIT: Final = "rankecho.metric.unit"
METRIC_DESCRIPTION: Final = "rankecho.metric.description"
METRIC_METADATA: Final = "rankecho.metric.metadata"
METRIC_TEMPORALITY: Final = "rankecho.metric.temporality"
"""``delta`` or ``cumulative`` (sum, histogram, exponential histogram)."""
METRIC_MONOTONIC: Final = "rankecho.metric.monotonic"
METRIC_START_NS: Final = "rankecho.metric.start_ns"
METRIC_FLAGS: Final = "rankecho.metric.flags"
METRIC_EXEMPLARS: Final = "rankecho.metric.exemplars"
HIST_ZERO_COUNT: Final = "rankecho.histogram.zero_count"
HIST_ZERO_THRESHOLD: Final = "rankecho.histogram.zero_threshold"
HIST_POSITIVE: Final = "rankecho.histogram.positive"
"""Exponential-histogram buckets above zero: ``{"offset": n, "bucket_counts": [...]}``."""
HIST_NEGATIVE: Final = "rankecho.histogram.negative"
SPAN_STATUS_MESSAGE: Final = "rankecho.span.status_message"
SPAN_TRACE_STATE: Final = "rankecho.span.trace_state"
SPAN_FLAGS: Final = "rankecho.span.flags"
SPAN_EVENTS: Final = "rankecho.span.events"
"""``[{"time_ns", "name", "attributes", "dropped_attributes_count"}]`` in the span's order."""
SPAN_LINKS: Final = "rankecho.span.links"
"""``[{"trace_id", "span_id", "trace_state", "flags", "attributes", "dropped_attributes_count"}]``."""
SPAN_DROPPED_ATTRIBUTES: Final = "rankecho.span.dropped_attributes_count"
SPAN_DROPPED_EVENTS: Final = "rankecho.span.dropped_events_count"
SPAN_DROPPED_LINKS: Final = "rankecho.span.dropped_links_count"
LOG_OBSERVED_NS: Final = "log.observed_time_ns"
LOG_FLAGS: Final = "log.flags"
LOG_DROPPED_ATTRIBUTES: Final = "log.dropped_attributes_count"

ECHO_KEYS: Final = frozenset(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))
"""Every key above: Echo's own, never counted against (or dropped by) the per-event attribute cap."""
