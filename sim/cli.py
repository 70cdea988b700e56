"""Subcommands of `rankecho` implemented by the `sim` package."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    """Add this package's subcommands to the `rankecho` parser."""
    del subparsers
