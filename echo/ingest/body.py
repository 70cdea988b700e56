"""Request bodies of OTLP/HTTP: read with a size cap, then inflated with the same cap (gzip bombs).

``--max-message-bytes`` bounds a body twice: as sent (a declared Content-Length over it is refused before
a byte is read, a chunked body as soon as it passes it) and once inflated (the gzip stream is inflated at
most one byte past the limit, so a small body that would inflate to gigabytes costs only the limit).

Usage::

    raw = await read_capped(request.stream(), limit, idle_timeout_s)
    body = inflate(raw, request.headers.get("content-encoding"), limit)
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import anyio

IDENTITY = "identity"
GZIP = "gzip"


class BodyError(Exception):
    """The body cannot be used; ``reason`` is the counter label, the message names the fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def too_large(size: int | str, limit: int) -> BodyError:
    return BodyError(
        "too_large",
        f"request of {size} bytes exceeds Echo's limit of {limit} bytes: send smaller batches "
        "(or raise --max-message-bytes)",
    )


async def read_capped(chunks: AsyncIterator[bytes], limit: int, idle_timeout_s: float) -> bytes:
    """The whole body (chunked or with a Content-Length); :class:`BodyError` once it passes ``limit``
    bytes, or when the client sends nothing for ``idle_timeout_s`` in the middle of it."""
    parts: list[bytes] = []
    size = 0
    iterator = chunks.__aiter__()
    while True:
        try:
            with anyio.fail_after(idle_timeout_s):
                chunk = await iterator.__anext__()
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise BodyError(
                "timeout", f"no body bytes for {idle_timeout_s:g} s: send the whole request without pausing"
            ) from None
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}", limit)
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def inflate(body: bytes, encoding: str | None, limit: int) -> bytes:
    """``body`` decoded per its Content-Encoding (``gzip`` or none), at most ``limit`` bytes of it."""
    encoding = (encoding or IDENTITY).strip().lower()
    if encoding == IDENTITY:
        return body
    if encoding != GZIP:
        raise BodyError("malformed", f"Content-Encoding {encoding!r} is not supported: use gzip or none")
    out: list[bytes] = []
    size = 0
    rest = body
    while rest:  # a gzip body may hold several members, one after the other
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            piece = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            raise BodyError("malformed", f"body is not valid gzip ({exc})") from None
        size += len(piece)
        if size > limit or inflater.unconsumed_tail:
            raise too_large(f"more than {limit} once inflated (gzip)", limit)
        if not inflater.eof:
            raise BodyError("malformed", "body is not valid gzip (the stream is cut short): send all of it")
        out.append(piece)
        rest = inflater.unused_data
    return b"".join(out)
