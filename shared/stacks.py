"""A call stack's identity: one content hash, computed the same way by the agent, Echo and the tests.

Stack-map ids from the kernel are hash-bucket indexes that a later stack can reuse, so they never leave
the node; what travels is this hash over the symbolised frames (``rankecho.stack.id``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

FRAME_SEP = "\n"
"""Between the frames of ``rankecho.stack.frames`` (no function or file name contains one)."""


def stack_id(frames: Sequence[str]) -> str:
    """16 hex digits naming ``frames`` (innermost first); equal frames give equal ids everywhere."""
    return hashlib.blake2b(FRAME_SEP.join(frames).encode(), digest_size=8).hexdigest()


def join_frames(frames: Sequence[str]) -> str:
    """The ``rankecho.stack.frames`` value of ``frames`` (innermost first)."""
    return FRAME_SEP.join(frames)


def split_frames(value: str) -> list[str]:
    """The frames of a ``rankecho.stack.frames`` value, innermost first."""
    return value.split(FRAME_SEP) if value else []
