"""``rankecho mcp --db PATH``: the same MCP tools over stdio, on a store file that no Echo holds.

For desktop MCP clients and offline investigations of a copied store. The file is opened read-only
and sealed (no files, URLs or extensions; settings locked), so the tools can read nothing else.

Exit codes: 0 clean end of input, 1 bad file or settings, 3 store held by a running Echo.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rankecho import exitcodes
from rankecho.echo.settings import QUERY_MEMORY_LIMIT
from rankecho.helpfmt import examples

DEFAULT_TIMEOUT_S = 10.0


def register(subparsers: Any) -> None:
    """Add ``rankecho mcp`` to the ``rankecho`` parser."""
    p = subparsers.add_parser(
        "mcp",
        help="serve Echo's MCP tools over stdio on a store file (offline)",
        description="Serve the fleet.cluster.* MCP tools over stdio on a DuckDB store that no Echo holds "
        "(for desktop MCP clients and offline investigations of a copied store). A running Echo serves "
        "the same tools over HTTP at /mcp instead.",
        epilog=examples(
            "rankecho mcp --db /tmp/echo-copy.db",
            "npx @modelcontextprotocol/inspector rankecho mcp --db /tmp/echo-copy.db",
        ),
    )
    p.add_argument("--db", required=True, metavar="PATH", help="the store file (Echo's --db)")
    p.add_argument(
        "--gpu-rates",
        metavar="FILE",
        help="GPU rates YAML (else env RANKECHO_GPU_RATES; default: the bundled gpu_rates.yaml)",
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help="seconds per query")
    p.add_argument("--memory-limit", default=QUERY_MEMORY_LIMIT, metavar="SIZE", help="DuckDB memory limit")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    import duckdb

    from rankecho.echo.guard.instance import open_sealed
    from rankecho.echo.mcp.rates import RatesError, load_rates
    from rankecho.echo.mcp.server import build_server
    from rankecho.echo.mcp.tools import Investigation, Limits
    from rankecho.echo.sandbox import Sandbox, SandboxLimits
    from rankecho.echo.settings import SettingsError, gpu_rates_path, memory_limit_bytes
    from rankecho.echo.store.lock import is_locked, read_holder
    from rankecho.echo.store.reader import Reader

    db = Path(args.db)
    if is_locked(db):
        print(
            f"rankecho mcp: {db} is held by a running Echo (pid {read_holder(db)}); use that Echo's MCP "
            "HTTP endpoint (/mcp), or stop it first",
            file=sys.stderr,
        )
        return exitcodes.STORE_HELD
    try:
        memory_limit_bytes(args.memory_limit, "--memory-limit")
        rates = load_rates(gpu_rates_path(args.gpu_rates, os.environ))
        con = open_sealed(db, args.memory_limit)
    except (RatesError, FileNotFoundError, SettingsError) as exc:
        print(f"rankecho mcp: {exc}", file=sys.stderr)
        return exitcodes.FAILED
    except duckdb.Error as exc:
        print(f"rankecho mcp: cannot open {db}: {exc}", file=sys.stderr)
        return exitcodes.FAILED
    limits = SandboxLimits(memory_limit_bytes(args.memory_limit, "--memory-limit"))
    analysis = Sandbox(lambda: db, limits, timeout_s=args.timeout)
    try:
        inv = Investigation(
            Reader(con, timeout_s=args.timeout), rates, Limits(timeout_s=args.timeout), analysis=analysis
        )
        build_server(inv).run(transport="stdio", show_banner=False)
    finally:
        con.close()
        analysis.close()
    return exitcodes.OK
