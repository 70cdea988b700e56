"""One question to Echo's investigation tools from a terminal command, from either source: a store file
no Echo holds (opened read-only and sealed, answered in this process) or a running Echo over MCP
(streamable HTTP, bearer token from ``--token-file``, ``$RANKECHO_MCP_TOKEN`` or ``$RANKECHO_TOKEN``).

``rankecho diagnose``, ``rankecho explain`` and ``rankecho query --mcp-url`` ask through here, so the two
sources give the same answer and fail with the same messages. Usage::

    answer = ask(args, "diagnose", "fleet.cluster.summary", {}, lambda inv: inv.summary(None))
    answer = ask_store(Path("echo.db"), lambda inv: inv.summary(None), timeout_s=60, memory_limit="2GB")
    answer = ask_endpoint(url, mcp_token(None), "fleet.cluster.summary", {}, timeout_s=60)
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankecho.shared.clientflags import MCP_TOKEN_ENV, TOKEN_ENV, read_token

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

MCP_URL_EXAMPLE = "http://HOST:8000/mcp"


class AskError(RuntimeError):
    """The answer could not be obtained; the message says why and what to do."""


class StoreHeldError(AskError):
    """The store file is held by a running Echo: ask that Echo (exit code 3)."""


def mcp_token(token_file: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The MCP bearer token: ``--token-file``, else ``$RANKECHO_MCP_TOKEN``, else ``$RANKECHO_TOKEN``."""
    return read_token(token_file, env, (MCP_TOKEN_ENV, TOKEN_ENV))


def held_message(command: str, db: Path, holder: int | None) -> str:
    """What to say when a running Echo holds ``db``: ask that Echo instead."""
    return (
        f"rankecho {command}: {db} is held by a running Echo (pid {holder}); ask it with "
        f"--mcp-url {MCP_URL_EXAMPLE}, or stop it first"
    )


def ask(
    args: Any, command: str, tool: str, arguments: dict[str, Any], question: Callable[[Investigation], Any]
) -> dict[str, Any]:
    """The answer from the source ``args`` names: ``args.db`` (``question`` asked in this process; a store
    a running Echo holds raises :class:`StoreHeldError`) or ``args.mcp_url`` (``tool`` with
    ``arguments``, token from ``args.token_file`` or the environment)."""
    from rankecho.echo.store.lock import is_locked, read_holder

    if args.db:
        db = Path(args.db)
        if is_locked(db):
            raise StoreHeldError(held_message(command, db, read_holder(db)))
        return ask_store(db, question, args.timeout, args.memory_limit)
    return ask_endpoint(args.mcp_url, mcp_token(args.token_file), tool, arguments, args.timeout)


def answer(
    args: Any, command: str, tool: str, arguments: dict[str, Any], question: Callable[[Investigation], Any]
) -> dict[str, Any] | int:
    """:func:`ask`, for a command's ``main``: the answer, or the exit code after printing why there is none
    (3: the store is held by a running Echo; 1: anything else, with the fix)."""
    try:
        return ask(args, command, tool, arguments, question)
    except ANSWER_ERRORS as exc:
        return failed(command, exc)


ANSWER_ERRORS = (AskError, OSError, ValueError)
"""What asking can fail with, each told to the user by :func:`failed`."""


def failed(command: str, exc: BaseException) -> int:
    """Say why ``rankecho command`` got no answer; its exit code (3: held store, else 1)."""
    from rankecho import exitcodes

    if isinstance(exc, StoreHeldError):
        print(exc, file=sys.stderr)
        return exitcodes.STORE_HELD
    print(f"rankecho {command}: {exc}", file=sys.stderr)
    return exitcodes.FAILED


def ask_store(
    db: Path, question: Callable[[Investigation], Any], timeout_s: float, memory_limit: str
) -> dict[str, Any]:
    """Answer ``question`` on a store file in this process (sealed, read-only)."""
    import duckdb

    from rankecho.echo.guard.instance import open_sealed
    from rankecho.echo.mcp.diagnosis import DiagnosisError
    from rankecho.echo.mcp.rates import load_rates
    from rankecho.echo.mcp.tools import Investigation, InvestigationError, Limits
    from rankecho.echo.store.reader import Reader

    try:
        con = open_sealed(db, memory_limit)
    except (FileNotFoundError, duckdb.Error) as exc:
        raise AskError(f"cannot open {db}: {exc}") from None
    try:
        inv = Investigation(Reader(con, timeout_s=timeout_s), load_rates(), Limits(timeout_s=timeout_s))
        return dict(question(inv))
    except (InvestigationError, DiagnosisError) as exc:
        raise AskError(str(exc)) from None
    finally:
        con.close()


def ask_endpoint(
    url: str, token: str | None, tool: str, arguments: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """Call one MCP ``tool`` of a running Echo; arguments that are None are left out."""
    from fastmcp import Client
    from fastmcp.exceptions import ToolError

    given = {k: v for k, v in arguments.items() if v is not None}

    async def call() -> dict[str, Any]:
        async with Client(url, auth=token, timeout=timeout_s) as client:
            result = await client.call_tool(tool, given)
            return dict(result.structured_content or {})

    try:
        return asyncio.run(call())
    except ToolError as exc:
        raise AskError(str(exc)) from None
    except Exception as exc:  # the MCP client hides HTTP failures: ask the endpoint plainly what is wrong
        raise AskError(
            f"cannot ask {url}: {_why(url, token) or f'{exc.__class__.__name__}: {exc}'}"
        ) from None


def _why(url: str, token: str | None) -> str | None:
    """What a plain HTTP request to the MCP endpoint says (refused token, nothing listening), or None."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        status = httpx.post(url, headers=headers, json={}, timeout=5).status_code
    except httpx.HTTPError as exc:
        return f"nothing answers there ({exc.__class__.__name__}): is Echo running with --mcp-http there?"
    if status == 401:
        return (
            f"Echo refused the bearer token: pass Echo's MCP token with --token-file or {MCP_TOKEN_ENV} "
            f"(else {TOKEN_ENV})"
        )
    if status == 404:
        return f"no MCP endpoint at this path: Echo serves it at {MCP_URL_EXAMPLE}"
    return None
