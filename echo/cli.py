"""Subcommands of `rankecho` implemented by the `echo` package.

Import-light on purpose: handlers import their modules only when they run. To add a subcommand, add
one ``add_*`` call to :func:`register`.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankecho.echo.mcp import cli as mcp_cli
from rankecho.echo.settings import (
    ANALYSIS_MEMORY_LIMIT,
    DEFAULT_MEMORY_LIMIT,
    DEFAULT_ROLLUP_RETENTION,
    DEFAULT_SPILL_LIMIT,
    ECHO_OWN_MEMORY_BYTES,
    ECHO_OWN_MEMORY_SHARE,
    QUERY_MEMORY_LIMIT,
)
from rankecho.helpfmt import DeprecatedAlias, examples
from rankecho.shared.clientflags import MCP_TOKEN_ENV, TOKEN_ENV

MCP_URL_HELP = "a running Echo's MCP URL, e.g. http://echo:8000/mcp"
MCP_TOKEN_HELP = f"MCP bearer token for --mcp-url (default: ${MCP_TOKEN_ENV}, else ${TOKEN_ENV})"


def _serve(args: argparse.Namespace) -> int:
    from rankecho.echo.serve import main

    return main(args)


def _query(args: argparse.Namespace) -> int:
    from rankecho.echo.query_cmd import main

    return main(args)


def _diagnose(args: argparse.Namespace) -> int:
    from rankecho.echo.diagnose_cmd import main

    return main(args)


def _jobs(args: argparse.Namespace) -> int:
    from rankecho.echo.jobs_cmd import main

    return main(args)


def _explain(args: argparse.Namespace) -> int:
    from rankecho.echo.explain_cmd import main

    return main(args)


def _stacks(args: argparse.Namespace) -> int:
    from rankecho.echo.stacks_cmd import main

    return main(args)


def add_source(p: argparse.ArgumentParser, db_help: str) -> Any:
    """``--db FILE`` or ``--mcp-url URL`` (one of them), the MCP token file, and the limits of both;
    returns the group, for a deprecated spelling of one of them."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", metavar="FILE", help=db_help)
    source.add_argument("--mcp-url", metavar="URL", help=MCP_URL_HELP)
    p.add_argument("--token-file", metavar="FILE", help=MCP_TOKEN_HELP)
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="stop after S seconds")
    p.add_argument(
        "--memory-limit",
        default=QUERY_MEMORY_LIMIT,
        metavar="SIZE",
        help="most memory the query may use (with --db; a running Echo uses its own limits)",
    )
    return source


def add_serve(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run Echo: OTLP receivers into one DuckDB store",
        description="Run Echo. Prints one JSON line with the bound addresses when every listener is up; "
        "logs go to stderr. SIGTERM drains the queue and commits before exit. Plaintext unless --tls-cert "
        "and --tls-key are given.",
        epilog=examples(
            "RANKECHO_TOKEN=$(cat token) rankecho serve --db /var/lib/rankecho/echo.db",
            "rankecho serve --db echo.db --token-file token --tls-cert cert.pem --tls-key key.pem",
            "rankecho serve --db /tmp/try.db --insecure-no-auth --otlp-grpc 127.0.0.1:0",
            "rankecho serve --db /var/lib/rankecho/echo.db --retention 7d --max-db-size 200GB",
        ),
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
        "--memory-limit",
        metavar="SIZE",
        help="Echo's own memory budget (RSS, e.g. 4GB; the pod's limit less the analysis workers'): DuckDB "
        f"gets it less {ECHO_OWN_MEMORY_BYTES // 2**20}MiB and {round(ECHO_OWN_MEMORY_SHARE * 100)}%% for "
        "Echo's own memory (default: no budget, DuckDB gets --duckdb-memory-limit)",
    )
    p.add_argument(
        "--duckdb-memory-limit",
        metavar="SIZE",
        help="DuckDB memory limit for the store, writer and queries together (e.g. 4GB, 512MiB; "
        f"default: {DEFAULT_MEMORY_LIMIT}, or the share of --memory-limit; DuckDB's own default would be "
        "80%% of RAM). Echo's RSS runs up to ~0.5 GB above it: to bound the process, use --memory-limit",
    )
    p.add_argument(
        "--max-spill-size",
        default=DEFAULT_SPILL_LIMIT,
        metavar="SIZE",
        help="most disk a query may spill to beside --db (e.g. 10GB, 500MB; default: "
        f"{DEFAULT_SPILL_LIMIT}): past it the query fails instead of filling the store's disk; DuckDB's own "
        "default would be 90%% of the free disk",
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
        help="run_analysis queries that run at once, each in its own worker process",
    )
    p.add_argument(
        "--retention",
        metavar="DURATION",
        help="delete raw rows older than this (e.g. 7d, 12h, 30m; default: off, keep everything); "
        "collectives are rolled up per minute first",
    )
    p.add_argument(
        "--max-db-size",
        metavar="SIZE",
        help="most bytes the store's data may use (e.g. 200GB, 500MB; default: off): past it the oldest raw "
        "rows are deleted first; the file itself settles at up to about twice this (docs/echo.md, Retention)",
    )
    p.add_argument(
        "--rollup-retention",
        default=DEFAULT_ROLLUP_RETENTION,
        metavar="DURATION",
        help=f"keep the per-minute collective rollups this long (default {DEFAULT_ROLLUP_RETENTION})",
    )
    p.set_defaults(handler=_serve)


def add_query(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "query",
        help="run one guarded read-only SQL statement on a store file or through a running Echo",
        description="Run one read-only SQL statement (the guard of fleet.cluster.run_analysis) on a DuckDB "
        "store file that no running Echo holds (--db), or through a running Echo's run_analysis MCP tool "
        "(--mcp-url; at most 10,000 rows).",
        epilog=examples(
            "rankecho query --db echo.db 'SELECT node_id, count(*) FROM events GROUP BY node_id'",
            "rankecho query --mcp-url http://127.0.0.1:8000/mcp --token-file token --json "
            "'SELECT count(*) FROM events'",
        ),
    )
    add_source(p, "DuckDB store file no Echo holds")
    p.add_argument("--json", action="store_true", help="print {columns, rows, truncated} as JSON")
    p.add_argument("--max-rows", type=int, default=10_000, metavar="N", help="print at most N rows")
    p.add_argument("sql", help="one SELECT statement")
    p.set_defaults(handler=_query)


def add_diagnose(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="name the rank (or node) that held the others back: how late, how often, why, what it cost",
        description="The straggler diagnosis (fleet.cluster.find_stragglers) for a terminal: one paragraph "
        "per straggler, then a table; --json for scripts. From a store file no Echo holds (--db) or from a "
        "running Echo over MCP (--mcp-url). Then rankecho explain shows one late call.",
        epilog=examples(
            "rankecho diagnose --db echo.db --window 'last 10m'",
            "RANKECHO_TOKEN=$(cat token) rankecho diagnose --mcp-url http://echo:8000/mcp --cluster-id j42",
            "rankecho diagnose --db echo.db --json | jq '.stragglers[0]'",
        ),
    )
    source = add_source(p, "a store file no Echo holds (opened read-only)")
    source.add_argument(
        "--endpoint", action=DeprecatedAlias, replacement="--mcp-url", dest="mcp_url", metavar="URL"
    )
    p.add_argument("--window", help="'last 10m', 'START/END' (ISO-8601) or '14:30-14:35' (default: all data)")
    p.add_argument("--cluster-id", help="only this cluster")
    p.add_argument(
        "--min-late-ms",
        type=float,
        metavar="MS",
        help="report only lateness of at least MS (default: the noise)",
    )
    p.add_argument("--job-id", help="this job (rankecho jobs lists them; default: the window's most recent)")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.set_defaults(handler=_diagnose)


def add_explain(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "explain",
        help="show what one late rank did just before one collective, against its peers",
        description="One late call explained (fleet.cluster.explain_straggler): the rank's time per cause "
        "in the --before-ms before it entered the collective against its on-time peers' median, the "
        "excess, the dominant cause, its timeline and every rank's lateness. Take --node-id, --rank and "
        "--causal-chain-id (or --timestamp-ns) from rankecho diagnose --json. From a store file no Echo "
        "holds (--db) or a running Echo over MCP (--mcp-url).",
        epilog=examples(
            "rankecho explain --db echo.db --node-id node-b --rank 5 --causal-chain-id 'c0:137'",
            "rankecho explain --mcp-url http://echo:8000/mcp --token-file token --node-id node-b --rank 5 "
            "--timestamp-ns 1733300000123456789 --json",
        ),
    )
    add_source(p, "a store file no Echo holds (opened read-only)")
    p.add_argument("--node-id", required=True, help="the late rank's node")
    p.add_argument("--rank", type=int, required=True, help="the late rank")
    p.add_argument("--causal-chain-id", metavar="ID", help="the late collective, as diagnose lists it")
    p.add_argument("--timestamp-ns", type=int, metavar="NS", help="or the time of the late call")
    p.add_argument("--before-ms", type=float, default=500.0, metavar="MS", help="how far back to look")
    p.add_argument("--cluster-id", help="only this cluster")
    p.add_argument("--job-id", help="the job (default: the job of that call)")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.set_defaults(handler=_explain)


def add_jobs(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "jobs",
        help="list the jobs in a window: ranks, nodes, first and last seen, steps, stragglers",
        description="The jobs Echo holds (fleet.cluster.jobs), newest first: one row per (cluster, job) with "
        "its ranks, nodes, first and last collective call, steps and a one-line straggler verdict. Pass a "
        "job id to rankecho diagnose --job-id. From a store file no Echo holds (--db) or a running Echo "
        "over MCP (--mcp-url).",
        epilog=examples(
            "rankecho jobs --db echo.db --window 'last 1h'",
            "rankecho jobs --mcp-url http://echo:8000/mcp --token-file token --json",
        ),
    )
    add_source(p, "a store file no Echo holds (opened read-only)")
    p.add_argument("--window", help="'last 10m', 'START/END' (ISO-8601) or '14:30-14:35' (default: all data)")
    p.add_argument("--cluster-id", help="only this cluster")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.set_defaults(handler=_jobs)


def add_stacks(subparsers: Any) -> None:
    from rankecho.echo.mcp.stacks import STACKS_LIMIT

    p = subparsers.add_parser(
        "stacks",
        help="export one rank's call stacks (folded for flame graphs, or pprof)",
        description="One rank's call stacks weighted by the time they carried (fleet.cluster.stacks), over "
        "a window or one late call's pre-call window, written as folded stacks (flamegraph.pl, speedscope) "
        "or a gzipped pprof profile (docs/stacks.md). From a store file no Echo holds (--db) or a running "
        "Echo over MCP (--mcp-url).",
        epilog=examples(
            "rankecho stacks --db echo.db --node-id node-1 --rank 3 --causal-chain-id 'w0rld:28' "
            "-o late.folded",
            "rankecho stacks --db echo.db --rank 3 --start 2026-12-02T14:30:00Z --end 2026-12-02T14:35:00Z "
            "--format pprof -o rank3.pb.gz",
        ),
    )
    add_source(p, "a store file no Echo holds (opened read-only)")
    p.add_argument("--rank", type=int, required=True, help="the rank")
    p.add_argument("--node-id", help="its node (default: any node)")
    p.add_argument("--start", metavar="T", help="window start: ISO-8601 or Unix ns (node clock)")
    p.add_argument("--end", metavar="T", help="window end: ISO-8601 or Unix ns")
    p.add_argument("--window", help="or 'last 10m', 'START/END', '14:30-14:35' (default: all data)")
    p.add_argument("--causal-chain-id", metavar="ID", help="or the pre-call window before this collective")
    p.add_argument("--cluster-id", help="only this cluster")
    p.add_argument("--job-id", help="the job (default: the window's most recent)")
    p.add_argument("--limit", type=int, default=STACKS_LIMIT, metavar="N",
                   help="most stacks (most time first)")  # fmt: skip
    p.add_argument("--format", choices=("folded", "pprof"), default="folded", help="output format")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write ('-': stdout)")
    p.set_defaults(handler=_stacks)


def register(subparsers: Any) -> None:
    """Add this package's subcommands to the `rankecho` parser."""
    add_serve(subparsers)
    add_query(subparsers)
    add_diagnose(subparsers)
    add_explain(subparsers)
    add_jobs(subparsers)
    add_stacks(subparsers)
    mcp_cli.register(subparsers)
