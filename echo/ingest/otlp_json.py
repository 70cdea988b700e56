"""OTLP/JSON bodies -> protobuf messages.

OTLP/JSON differs from protobuf's canonical JSON mapping in one way that matters: trace and span ids
are hex strings, not base64. :func:`parse_json` rewrites them before ``json_format`` parses the rest
(camelCase or snake_case field names, enum names or numbers, int64 as strings; unknown fields are
ignored as the OTLP spec requires).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


class JsonBodyError(ValueError):
    pass


def _fix_ids(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    value = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                except ValueError:
                    raise JsonBodyError(
                        f"{key} {value!r} is not hex: OTLP/JSON sends ids as hex strings"
                    ) from None
            else:
                value = _fix_ids(value)
            out[key] = value
        return out
    if isinstance(node, list):
        return [_fix_ids(v) for v in node]
    return node


def parse_json(body: bytes, message: Message) -> Message:
    """Fill ``message`` from an OTLP/JSON body; raises :class:`JsonBodyError` saying what is wrong."""
    try:
        document = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise JsonBodyError(f"body is not valid UTF-8 (byte {exc.start}): send UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise JsonBodyError(f"body is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise JsonBodyError("JSON nested too deeply: flatten the attribute values") from None
    if not isinstance(document, dict):
        raise JsonBodyError('body must be a JSON object such as {"resourceMetrics": [...]}')
    try:
        json_format.ParseDict(_fix_ids(document), message, ignore_unknown_fields=True)
    except (json_format.ParseError, binascii.Error, RecursionError) as exc:
        raise JsonBodyError(f"not an OTLP/JSON {message.DESCRIPTOR.name}: {exc}") from None
    return message


def to_json(message: Message) -> bytes:
    return json_format.MessageToJson(message, indent=None).encode("utf-8")
