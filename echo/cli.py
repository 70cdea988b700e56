"""Subcommands of `rankecho` implemented by the `echo` package.

Import-light on purpose: handlers import their modules only when they run. To add a subcommand, add
one ``add_*`` call to :func:`register`.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankecho.echo.mcp import cli as mcp_cli
from rankecho.echo.settings import ANALYSIS_MEMORY_LIMIT, DEFAULT_MEMORY_LIMIT, QUERY_MEMORY_LIMIT


def _serve(args: argparse.Namespace) -> int:
    from rankecho.echo.serve import main

    return main(args)


def _query(args: argparse.Namespace) -> int:
    from rankecho.echo.query_cmd import main

    return main(args)


def _diagnose(args: argparse.Namespace) -> int:
    from rankecho.echo.diagnose_cmd import main

    return main(args)


def add_serve(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run Echo: OTLP receivers into one DuckDB store",
        description="Run Echo. Prints one JSON line with the bound addresses when every listener is up; "
        "logs go to stderr. SIGTERM drains the queue and commits before exit.",
    )
    p.add_argument("--db", required=True, help="DuckDB store file (created if missing)")
    p.add_argument("--create-dirs", action="store_true", help="create --db's directory if it is missing")
    p.add_argument(
        "--otlp-grpc",
        default="0.0.0.0:4317",
        metavar="HOST:PORT",
        help="OTLP/gRPC listener (port 0: any free port)",
    )
    p.add_argument(
        "--otlp-http",
        default="0.0.0.0:4318",
        metavar="HOST:PORT",
        help="OTLP/HTTP + /healthz /readyz /metrics",
    )
    p.add_argument(
        "--mcp-http", default="0.0.0.0:8000", metavar="HOST:PORT", help="MCP streamable-HTTP listener"
    )
    p.add_argument(
        "--token-file", metavar="FILE", help="file holding the bearer token (else env RANKECHO_TOKEN)"
    )
    p.add_argument(
        "--mcp-token-file",
        metavar="FILE",
        help="file holding a separate bearer token for MCP over HTTP (else env RANKECHO_MCP_TOKEN; "
        "default: the OTLP token)",
    )
    p.add_argument(
        "--insecure-no-auth", action="store_true", help="accept producers without a token (logged loudly)"
    )
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain for both OTLP listeners")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key for --tls-cert")
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=16 * 1024 * 1024,
        metavar="N",
        help="largest request body accepted",
    )
    p.add_argument(
        "--queue-rows",
        type=int,
        default=500_000,
        metavar="N",
        help="decoded rows waiting for the writer before producers are told to retry",
    )
    p.add_argument(
        "--gpu-rates",
        metavar="FILE",
        help="GPU rates YAML for fleet.cluster.get_cost (else env RANKECHO_GPU_RATES; default: the bundled "
        "echo/mcp/gpu_rates.yaml)",
    )
    p.add_argument(
        "--duckdb-memory-limit",
        default=DEFAULT_MEMORY_LIMIT,
        metavar="SIZE",
        help="DuckDB memory limit for the store, writer and queries together (e.g. 4GB, 512MiB; "
        f"default {DEFAULT_MEMORY_LIMIT}; DuckDB's own default would be 80%% of RAM)",
    )
    p.add_argument(
        "--analysis-memory-limit",
        default=ANALYSIS_MEMORY_LIMIT,
        metavar="SIZE",
        help="most memory one run_analysis worker process may use; past it the query is stopped "
        f"(default {ANALYSIS_MEMORY_LIMIT})",
    )
    p.add_argument(
        "--analysis-workers",
        type=int,
        default=2,
        metavar="N",
        help="run_analysis queries that run at once, each in its own worker process (default 2)",
    )
    p.set_defaults(handler=_serve)


def add_query(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "query",
        help="run one read-only SQL statement on a store no Echo holds",
        description="Run one read-only SQL statement on a DuckDB store file that no running Echo holds.",
    )
    p.add_argument("--db", required=True, help="DuckDB store file")
    p.add_argument("--json", action="store_true", help="print {columns, rows, truncated} as JSON")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="stop the query after S seconds")
    p.add_argument("--max-rows", type=int, default=10_000, metavar="N", help="print at most N rows")
    p.add_argument(
        "--memory-limit",
        default=QUERY_MEMORY_LIMIT,
        metavar="SIZE",
        help=f"most memory the query's worker process may use (default {QUERY_MEMORY_LIMIT})",
    )
    p.add_argument("sql", help="one SELECT statement")
    p.set_defaults(handler=_query)


def add_diagnose(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="name the rank (or node) that held the others back: how late, how often, why, what it cost",
        description="The straggler diagnosis (fleet.cluster.find_stragglers) for a terminal: one paragraph "
        "per straggler, then a table; --json for scripts. From a store file no Echo holds (--db) or from a "
        "running Echo over MCP (--endpoint).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", metavar="FILE", help="a store file no Echo holds (opened read-only)")
    source.add_argument(
        "--endpoint", metavar="URL", help="a running Echo's MCP URL, e.g. http://echo:8000/mcp"
    )
    p.add_argument("--window", help="'last 10m', 'START/END' (ISO-8601) or '14:30-14:35' (default: all data)")
    p.add_argument("--cluster-id", help="only this cluster")
    p.add_argument(
        "--min-late-ms",
        type=float,
        metavar="MS",
        help="report only lateness of at least MS (default: the noise)",
    )
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="MCP bearer token for --endpoint (else $RANKECHO_MCP_TOKEN, $RANKECHO_TOKEN)",
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="stop after S seconds (default 60)"
    )
    p.add_argument(
        "--memory-limit",
        default=QUERY_MEMORY_LIMIT,
        metavar="SIZE",
        help=f"with --db (default {QUERY_MEMORY_LIMIT})",
    )
    p.set_defaults(handler=_diagnose)


def register(subparsers: Any) -> None:
    """Add this package's subcommands to the `rankecho` parser."""
    add_serve(subparsers)
    add_query(subparsers)
    add_diagnose(subparsers)
    mcp_cli.register(subparsers)
