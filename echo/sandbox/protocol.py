"""Frames between Echo and its analysis worker: a 4-byte length, then a pickle of plain values.

The parent reads the length first and refuses a frame larger than it asked for (the worker cuts rows at
the byte cap, so an oversized frame means something is wrong and the worker is killed), and unpickles
with an allowlist of classes: the values DuckDB returns (numbers, strings, bytes, dates and times,
decimals, UUIDs, lists, dicts), nothing that could run code.

Usage::

    write_frame(stream, {"sql": "SELECT 1"}); message = read_frame(stream, limit=1 << 20)
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct("!I")
_ALLOWED = {
    ("datetime", "datetime"),
    ("datetime", "date"),
    ("datetime", "time"),
    ("datetime", "timedelta"),
    ("datetime", "timezone"),
    ("decimal", "Decimal"),
    ("uuid", "UUID"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "bytearray"),
    ("builtins", "complex"),
    ("collections", "OrderedDict"),
    ("zoneinfo", "ZoneInfo"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
}


class FrameError(RuntimeError):
    """The other side sent something that is not a well-formed frame within the size asked for."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise FrameError(f"unexpected value type {module}.{name} from the analysis worker")
        return super().find_class(module, name)


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def write_frame(stream: BinaryIO, message: Any) -> None:
    stream.write(encode(message))
    stream.flush()


def decode(body: bytes) -> Any:
    try:
        return _Unpickler(io.BytesIO(body)).load()
    except FrameError:
        raise
    except Exception as exc:  # a truncated or corrupt frame
        raise FrameError(f"unreadable frame from the analysis worker ({type(exc).__name__})") from None


def read_frame(stream: BinaryIO, limit: int) -> Any:
    """One message from a blocking stream (the worker's side); EOFError when the stream ended."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("the stream ended")
    (size,) = HEADER.unpack(header)
    if size > limit:
        raise FrameError(f"frame of {size} bytes is over the {limit}-byte limit")
    body = stream.read(size)
    if len(body) < size:
        raise EOFError("the stream ended inside a frame")
    return decode(body)
