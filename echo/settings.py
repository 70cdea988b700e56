"""Echo's configuration, resolved once from flags and environment into one frozen object.

Usage::

    settings = Settings(db_path=Path("echo.db"), token="s3cret")
    settings = settings_from_args(parsed_args, os.environ)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")
TOKEN_ENV = "RANKECHO_TOKEN"
MCP_TOKEN_ENV = "RANKECHO_MCP_TOKEN"
GPU_RATES_ENV = "RANKECHO_GPU_RATES"
DEFAULT_MEMORY_LIMIT = "4GB"
"""DuckDB's own default is 80% of the machine's RAM, far too much for a service sharing a node."""
DEFAULT_SPILL_LIMIT = "10GB"
"""Most disk a query may spill to (DuckDB's ``max_temp_directory_size``); DuckDB's own default is 90% of
the free disk, which a whole-store query of a big store fills (measured: bench/day.py at 100M events),
taking the space the store and its write-ahead log need with it."""
ECHO_OWN_MEMORY_BYTES = 512 * 2**20
"""What Echo's process holds outside DuckDB's buffer pool when ``--memory-limit`` sets its budget: Python,
gRPC and the MCP server (~250 MiB at start) plus tool results and what DuckDB allocates outside its own
accounting. Measured: RSS peaked 356-469 MiB above ``--duckdb-memory-limit 4GB`` at 10M and 100M
stored events (docs/benchmarks.md, issue 20's RSS curve)."""
ECHO_OWN_MEMORY_SHARE = 0.10
"""The share of ``--memory-limit`` kept back besides :data:`ECHO_OWN_MEMORY_BYTES`: the allocator's
fragmentation grows with the buffer pool it serves."""
QUERY_MEMORY_LIMIT = "2GB"
ANALYSIS_MEMORY_LIMIT = "1GB"
"""For the offline readers (``rankecho query``, ``rankecho mcp``), which run beside other work."""
MIN_MEMORY_BYTES = 64 * 1024 * 1024
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)", re.IGNORECASE)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
DEFAULT_ROLLUP_RETENTION = "90d"
"""Per-minute collective rollups outlive the raw rows by this much (``--rollup-retention``)."""
MIN_RETENTION_S = 60.0
"""A raw retention shorter than a minute would delete data the analysis is still reading."""
MIN_DB_BYTES = 64 * 1024 * 1024
"""``--max-db-size`` below this leaves no room for the indexes and one checkpoint of new rows."""
_UNITS = {
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class SettingsError(ValueError):
    """A configuration problem; the message names the fix."""


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[v6]:PORT``; port 0 picks a free port."""
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535:
            raise SettingsError(
                f"{text!r} is not HOST:PORT (for example 127.0.0.1:4317, or :0 for any free port)"
            )
        host = host.strip("[]") or "0.0.0.0"
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Settings:
    """Everything Echo needs; tests build it directly, the CLI via :func:`settings_from_args`."""

    db_path: Path
    token: str | None = None
    """Bearer token every OTLP request must carry; None only together with ``insecure_no_auth``."""
    insecure_no_auth: bool = False
    otlp_grpc: HostPort | None = HostPort("0.0.0.0", 4317)
    otlp_http: HostPort | None = HostPort("0.0.0.0", 4318)
    mcp_http: HostPort | None = HostPort("0.0.0.0", 8000)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest accepted request body, after decompression."""
    queue_rows: int = 500_000
    """Rows decoded but not yet committed; beyond this producers are told to retry later."""
    batch_rows: int = 50_000
    """The writer merges queued requests into one INSERT of about this many rows."""
    ack_timeout_s: float = 30.0
    """How long a receiver waits for the commit before telling the producer to retry."""
    max_future_skew_s: float = 86_400.0
    """Event timestamps further than this past Echo's clock are rejected."""
    max_attributes: int = 512
    """Attributes kept per event (resource + point); the rest are dropped and counted."""
    retry_after_s: float = 1.0
    grpc_workers: int = 32
    decode_threads: int = 2
    """Requests decoded at once. Decoding is Python holding the GIL, so more threads only queue for it
    and delay the writer, which needs the GIL between DuckDB calls (measured: 8 producers over gRPC,
    ~100k points/s with 2 against ~85k with no limit, on 2 cores)."""
    http_max_connections: int = 256
    """Open connections per HTTP listener; past it requests are answered 503 (clients retry)."""
    http_idle_timeout_s: int = 60
    checkpoint_every_s: float = 60.0
    """The writer folds the write-ahead log into the store file this often when idle, so a restart
    replays at most this long's worth of log (and never checkpoints without room on the volume)."""
    """Seconds an HTTP connection may sit idle (before a request, between requests, or mid-body)."""
    duckdb_memory_limit: str | None = None
    """DuckDB's ``memory_limit`` for the store instance (writer and readers together), e.g. ``4GB``; None:
    derived from ``memory_limit`` when that is set, else :data:`DEFAULT_MEMORY_LIMIT` (see
    :attr:`store_memory_limit`)."""
    memory_limit: str | None = None
    """Echo's own process budget (RSS), e.g. ``4GB`` (``--memory-limit``): DuckDB gets it less what Echo
    holds outside DuckDB (:func:`duckdb_share_bytes`). None: no budget, DuckDB gets
    ``duckdb_memory_limit``."""
    max_spill_size: str = DEFAULT_SPILL_LIMIT
    """DuckDB's ``max_temp_directory_size`` for the store instance: past it a query fails (out of
    memory) instead of filling the store's disk."""
    analysis_memory_limit: str = ANALYSIS_MEMORY_LIMIT
    """Most memory (RSS) one analysis worker may use for callers' SQL (``run_analysis``), e.g. ``1GB``;
    past it the worker is killed and the query refused. Echo's own process never holds that memory."""
    analysis_workers: int = 2
    """Callers' queries that run at once, each in its own worker process; more wait for a free one."""
    mcp_token: str | None = None
    """A separate bearer token for MCP over HTTP (AI agents), so they need not hold the producers'
    token; None: MCP takes ``token``. Set, it is required even with ``insecure_no_auth``."""
    gpu_rates: Path | None = None
    """GPU rates YAML for ``fleet.cluster.get_cost``; None: the bundled ``echo/mcp/gpu_rates.yaml``."""
    create_dirs: bool = False
    """Create a missing directory for ``db_path`` (``--create-dirs``); off, a missing one is refused, so a
    mistyped ``--db`` is an error instead of a new, empty store somewhere unexpected."""
    retention_s: float | None = None
    """Raw rows (``events``, ``collectives``, ``host_activity``) older than this many seconds before Echo's
    clock are deleted (``--retention``); None keeps everything."""
    max_db_bytes: int | None = None
    """Most bytes the store may use (``--max-db-size``): past it oldest raw rows go first; None: no limit."""
    rollup_retention_s: float = 90 * 86_400.0
    """Per-minute collective rollups older than this many seconds are deleted (``--rollup-retention``)."""
    retention_every_s: float = 60.0
    """A retention pass starts this long after the last one ended (when ``retention_on``)."""

    def __post_init__(self) -> None:
        if self.token is None and not self.insecure_no_auth:
            raise SettingsError(
                "no bearer token: set RANKECHO_TOKEN or pass --token-file FILE "
                "(or --insecure-no-auth to accept unauthenticated producers)"
            )
        if self.token is not None and not self.token.strip():
            raise SettingsError(
                "the bearer token is empty: put a non-empty token in RANKECHO_TOKEN or --token-file"
            )
        if self.mcp_token is not None and not self.mcp_token.strip():
            raise SettingsError(
                "the MCP token is empty: put a non-empty token in RANKECHO_MCP_TOKEN or --mcp-token-file"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SettingsError("TLS needs both --tls-cert and --tls-key")
        if self.max_message_bytes < 1024:
            raise SettingsError("--max-message-bytes must be at least 1024")
        if self.queue_rows < 1:
            raise SettingsError("--queue-rows must be at least 1")
        if self.decode_threads < 1 or self.http_max_connections < 1 or self.http_idle_timeout_s < 1:
            raise SettingsError("decode_threads, http_max_connections and http_idle_timeout_s must be >= 1")
        if self.duckdb_memory_limit is not None:
            memory_limit_bytes(self.duckdb_memory_limit, "--duckdb-memory-limit")
        if self.memory_limit is not None:
            self._check_budget(self.memory_limit, self.duckdb_memory_limit)
        memory_limit_bytes(self.analysis_memory_limit, "--analysis-memory-limit")
        memory_limit_bytes(self.max_spill_size, "--max-spill-size")
        if self.analysis_workers < 1:
            raise SettingsError("--analysis-workers must be at least 1")
        if self.retention_s is not None and self.retention_s < MIN_RETENTION_S:
            raise SettingsError(f"--retention must be at least {MIN_RETENTION_S:g}s (e.g. 7d, 12h, 30m)")
        if self.max_db_bytes is not None and self.max_db_bytes < MIN_DB_BYTES:
            raise SettingsError("--max-db-size must be at least 64MiB (e.g. 200GB, 500MB)")
        if self.rollup_retention_s < MIN_RETENTION_S:
            raise SettingsError(f"--rollup-retention must be at least {MIN_RETENTION_S:g}s, e.g. 90d")

    @staticmethod
    def _check_budget(budget: str, duckdb_limit: str | None) -> None:
        """``--memory-limit`` must leave DuckDB at least 64 MiB and an explicit ``--duckdb-memory-limit``
        must fit inside what the budget leaves DuckDB; the error names the value that fits."""
        share = duckdb_share_bytes(size_bytes(budget, "--memory-limit"))
        if share < MIN_MEMORY_BYTES:
            need = (MIN_MEMORY_BYTES + ECHO_OWN_MEMORY_BYTES) / (1 - ECHO_OWN_MEMORY_SHARE)
            raise SettingsError(
                f"--memory-limit {budget!r} leaves DuckDB less than 64MiB after Echo's own memory: "
                f"give at least {math.ceil(need / 2**20)}MiB"
            )
        if duckdb_limit is not None and memory_limit_bytes(duckdb_limit, "--duckdb-memory-limit") > share:
            raise SettingsError(
                f"--duckdb-memory-limit {duckdb_limit} does not fit in --memory-limit {budget} beside Echo's "
                f"own memory: drop it (DuckDB then gets {share // 2**20}MiB) or give at most that"
            )

    @property
    def store_memory_limit(self) -> str:
        """The ``memory_limit`` DuckDB's store instance gets: ``--duckdb-memory-limit`` when given, else
        the share of ``--memory-limit``, else :data:`DEFAULT_MEMORY_LIMIT`."""
        if self.duckdb_memory_limit is not None:
            return self.duckdb_memory_limit
        if self.memory_limit is not None:
            return f"{duckdb_share_bytes(size_bytes(self.memory_limit, '--memory-limit')) // 2**20}MiB"
        return DEFAULT_MEMORY_LIMIT

    @property
    def retention_on(self) -> bool:
        """Whether the writer runs retention passes at all (a raw age or a size cap is set)."""
        return self.retention_s is not None or self.max_db_bytes is not None

    @property
    def mcp_bearer(self) -> str | None:
        """The token MCP over HTTP requires: ``mcp_token`` when set, else the OTLP ``token``."""
        return self.mcp_token if self.mcp_token is not None else self.token

    def tls_files(self) -> tuple[str, str] | None:
        """(certificate chain path, private key path) for the HTTP listeners, or None without TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return str(self.tls_cert), str(self.tls_key)

    def tls_pair(self) -> tuple[bytes, bytes] | None:
        """(certificate chain, private key) PEM bytes, or None without TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return self.tls_cert.read_bytes(), self.tls_key.read_bytes()


def duckdb_share_bytes(budget_bytes: int) -> int:
    """What a process budget of ``budget_bytes`` leaves DuckDB's buffer pool (may be below 64 MiB)."""
    return int(budget_bytes * (1 - ECHO_OWN_MEMORY_SHARE)) - ECHO_OWN_MEMORY_BYTES


def memory_limit_bytes(text: str, flag: str) -> int:
    """Bytes in a DuckDB memory size such as ``4GB`` or ``512MiB``; :class:`SettingsError` names ``flag``
    when the text is not one or is below 64 MiB (too little for DuckDB to run a query)."""
    match = _MEMORY.fullmatch(text.strip())
    if match is None:
        raise SettingsError(
            f"{flag} {text!r} is not a memory size: use a number and a unit, e.g. 4GB or 512MiB"
        )
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < MIN_MEMORY_BYTES:
        raise SettingsError(f"{flag} {text!r} is too small for DuckDB: give at least 64MiB")
    return size


def duration_seconds(text: str, flag: str) -> float:
    """Seconds in a duration such as ``7d``, ``12h``, ``30m``, ``90s`` or ``2w``; :class:`SettingsError`
    names ``flag`` and the accepted form when the text is not one."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise SettingsError(
            f"{flag} {text!r} is not a duration: use a number and one of s, m, h, d, w, e.g. 7d, 12h or 30m"
        )
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def size_bytes(text: str, flag: str) -> int:
    """Bytes in a size such as ``200GB`` or ``500MiB`` (decimal and binary units, as for memory)."""
    match = _MEMORY.fullmatch(text.strip())
    if match is None:
        raise SettingsError(f"{flag} {text!r} is not a size: use a number and a unit, e.g. 200GB or 500MB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def read_token(
    token_file: str | None, env: Mapping[str, str], env_name: str = TOKEN_ENV, flag: str = "--token-file"
) -> str | None:
    """The token from ``token_file`` (given as ``flag``; stripped) if given, else from ``$env_name``."""
    if token_file:
        try:
            return Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SettingsError(f"cannot read {flag} {token_file}: {exc.strerror}") from exc
    return env.get(env_name) or None


def gpu_rates_path(flag: str | None, env: Mapping[str, str]) -> Path | None:
    """``--gpu-rates`` if given, else ``$RANKECHO_GPU_RATES``, else None (the bundled rates)."""
    chosen = flag or env.get(GPU_RATES_ENV)
    return Path(chosen) if chosen else None


def settings_from_args(args: Any, env: Mapping[str, str] = os.environ) -> Settings:
    """Build :class:`Settings` from the ``rankecho serve`` namespace (see ``echo/cli.py``)."""
    token = read_token(args.token_file, env)
    if token is not None and args.insecure_no_auth:
        raise SettingsError("both a token and --insecure-no-auth given: drop one of them")
    return Settings(
        db_path=Path(args.db),
        token=token,
        insecure_no_auth=args.insecure_no_auth,
        otlp_grpc=HostPort.parse(args.otlp_grpc),
        otlp_http=HostPort.parse(args.otlp_http),
        mcp_http=HostPort.parse(args.mcp_http) if args.mcp_http else None,
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        max_message_bytes=args.max_message_bytes,
        queue_rows=args.queue_rows,
        duckdb_memory_limit=args.duckdb_memory_limit,
        memory_limit=getattr(args, "memory_limit", None),
        max_spill_size=getattr(args, "max_spill_size", DEFAULT_SPILL_LIMIT),
        analysis_memory_limit=args.analysis_memory_limit,
        analysis_workers=args.analysis_workers,
        mcp_token=read_token(args.mcp_token_file, env, MCP_TOKEN_ENV, "--mcp-token-file"),
        gpu_rates=gpu_rates_path(args.gpu_rates, env),
        create_dirs=getattr(args, "create_dirs", False),
        retention_s=_optional(getattr(args, "retention", None), duration_seconds, "--retention"),
        max_db_bytes=_optional(getattr(args, "max_db_size", None), size_bytes, "--max-db-size"),
        rollup_retention_s=duration_seconds(
            getattr(args, "rollup_retention", None) or DEFAULT_ROLLUP_RETENTION, "--rollup-retention"
        ),
    )


def _optional(text: str | None, parse: Callable[[str, str], _T], flag: str) -> _T | None:
    """``parse(text, flag)``, or None when the flag was not given (or given as ``off``)."""
    if text is None or text.strip().lower() in ("", "off"):
        return None
    return parse(text, flag)
