"""How every ``rankecho`` parser reads and looks, defined once: defaults shown, examples kept as written,
deprecated flag spellings that still work but say what replaced them.

:class:`Parser` is the parser class of ``rankecho`` and, through ``add_subparsers``, of every subcommand
(argparse hands a parser's class down to its subparsers), so a package's ``register`` needs nothing to
get it. Usage::

    p = subparsers.add_parser("query", help="...", epilog=examples("rankecho query --db echo.db 'SELECT 1'"))
    p.add_argument("--endpoint", action=DeprecatedAlias, dest="mcp_url", replacement="--mcp-url")
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

EXAMPLES_HEADING = "examples:"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless the help already says it or there is none worth saying
    (None, False: argparse's own formatter prints ``(default: None)``); wraps descriptions but keeps an
    :func:`examples` epilog's lines as written, so the examples stay copy-pasteable."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(EXAMPLES_HEADING):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help is formatted by :class:`HelpFormatter` unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def examples(*commands: str) -> str:
    """An epilog listing example command lines (every subcommand's ``--help`` ends with some)."""
    return f"{EXAMPLES_HEADING}\n" + "\n".join(f"  {command}" for command in commands)


class DeprecatedAlias(argparse.Action):
    """An old flag spelling that keeps working: stores into the new flag's ``dest`` and prints one warning
    on stderr naming the flag to use instead (``replacement``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, replacement: str, **kwargs: Any) -> None:
        self.replacement = replacement
        kwargs.setdefault("help", f"deprecated alias of {replacement}")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(
            f"{parser.prog}: warning: {option_string} is deprecated and will be removed; "
            f"use {self.replacement}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)
