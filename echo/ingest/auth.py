"""Bearer-token check shared by every OTLP listener, in constant time.

Usage::

    check = TokenCheck("s3cret")
    check.allows("Bearer s3cret")   # True
    TokenCheck(None).allows(None)   # True: only with --insecure-no-auth
"""

from __future__ import annotations

import hmac

SCHEME = "bearer "


class TokenCheck:
    """``token=None`` means authentication is off (``--insecure-no-auth``)."""

    def __init__(self, token: str | None) -> None:
        self._expected = None if token is None else token.encode("utf-8")

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, header: str | bytes | None) -> bool:
        """True when ``header`` is ``Bearer <token>`` (scheme case-insensitive, compare constant-time)."""
        if self._expected is None:
            return True
        if header is None:
            return False
        raw = header.encode("utf-8", "replace") if isinstance(header, str) else header
        if raw[: len(SCHEME)].lower() != SCHEME.encode():
            return False
        return hmac.compare_digest(raw[len(SCHEME) :].strip(), self._expected)


UNAUTHENTICATED_MESSAGE = (
    "missing or wrong bearer token: send the header 'authorization: Bearer <token>' with Echo's token"
)
