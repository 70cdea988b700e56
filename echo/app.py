"""Echo in-process: lock the store, migrate, start the single writer and the OTLP listeners.

``rankecho serve`` wraps this; tests use it directly::

    with Echo(Settings(db_path=tmp / "echo.db", token="t", otlp_grpc=HostPort("127.0.0.1", 0),
                       otlp_http=HostPort("127.0.0.1", 0), mcp_http=None)) as echo:
        echo.grpc_address, echo.http_address      # "127.0.0.1:PORT"
        echo.reader.query("SELECT count(*) FROM events").rows     # project SQL, in this process
        echo.analysis.query("SELECT count(*) FROM events").rows   # callers' SQL, in a worker process

Other front ends (the MCP server) plug in as a :class:`Service` added before :meth:`Echo.start`; the
address a service returns is reported in the listening line under the service's name.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

import duckdb
import grpc

from rankecho.echo import ops
from rankecho.echo.guard.instance import seal
from rankecho.echo.ingest.asgi_server import AsgiServer, Limits, check_can_listen
from rankecho.echo.ingest.auth import TokenCheck
from rankecho.echo.ingest.grpc_server import start_grpc
from rankecho.echo.ingest.http_server import OpsRoute, start_http
from rankecho.echo.ingest.service import Ingest
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.settings import HostPort, Settings, memory_limit_bytes
from rankecho.echo.store.location import StorePathError, check_store_path
from rankecho.echo.store.lock import StoreLock, StoreLockedError, lock_path
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader
from rankecho.echo.store.retention import RetentionPolicy
from rankecho.echo.store.snapshot import Snapshots
from rankecho.echo.store.writer import Writer

log = logging.getLogger(__name__)
CHECKPOINT_THRESHOLD = "256MB"


class Service(Protocol):
    """A front end that runs alongside the receivers (e.g. MCP over HTTP)."""

    name: str

    def start(self, echo: Echo) -> str | None:
        """Start serving; return the bound ``host:port`` (or None when not listening)."""
        ...

    def stop(self) -> None: ...


def connect_address(host: str, port: int) -> str:
    """An address a local client can dial: wildcard hosts become loopback."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    return str(HostPort(host, port))


def open_store(
    db_path: Path, memory_limit: str | None = None, spill_limit: str | None = None
) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) and migrate the store; the caller must hold its :class:`StoreLock` and
    have checked the path (:func:`check_store_path`: its directory exists, it is no other kind of file)."""
    if db_path.exists() and db_path.stat().st_nlink > 1:
        log.warning("%s has %d hard links: DuckDB names its write-ahead log after the path opened, so "
                    "always start Echo with the same name", db_path, db_path.stat().st_nlink)  # fmt: skip
    try:
        con = duckdb.connect(str(db_path))
    except duckdb.IOException as exc:
        if "not a valid duckdb" in str(exc).lower():  # replaced between the check and the open
            raise StorePathError(f"{db_path} is not a DuckDB store: move it aside or change --db") from None
        if "lock" not in str(exc).lower():
            raise
        # Another process (not an Echo: those hold the StoreLock) has the file open read-write.
        raise StoreLockedError(db_path, None, f"DuckDB: {exc}") from None
    version = migrate(con)
    # Fewer automatic checkpoints inside the writer's COMMITs (~15% more rows/s at the default 16MB);
    # the writer checkpoints when idle instead (Settings.checkpoint_every_s), keeping the WAL replay short.
    con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    # close() must not checkpoint on its own: on a full disk that invalidates the database and grows
    # the file; Echo checkpoints explicitly, only when there is room (Writer.checkpoint).
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    seal(con, memory_limit, spill_limit)  # no files/URLs/extensions, settings locked, from here on
    log.info("store %s at schema v%d, memory_limit %s, max_temp_directory_size %s", db_path, version,
             duckdb_setting(con, "memory_limit"), duckdb_setting(con, "max_temp_directory_size"))
    return con


def duckdb_setting(con: duckdb.DuckDBPyConnection, name: str) -> str:
    """The instance's current value of a DuckDB setting, as DuckDB prints it (e.g. ``3.7 GiB``)."""
    row = con.cursor().execute("SELECT current_setting(?)", [name]).fetchone()
    return str(row[0]) if row else ""


@dataclass
class _Running:
    con: duckdb.DuckDBPyConnection
    writer: Writer
    grpc_server: grpc.Server | None = None
    http_server: AsgiServer | None = None
    started_services: list[Service] = field(default_factory=list)
    snapshots: Snapshots | None = None
    analysis: Sandbox | None = None


class Echo:
    def __init__(self, settings: Settings, services: list[Service] | None = None) -> None:
        self.settings = settings
        self.services: list[Service] = list(services or [])
        self.stats = ops.Stats()
        self.grpc_address: str | None = None
        self.http_address: str | None = None
        self.service_addresses: dict[str, str | None] = {}
        self.metric_sources: list[Callable[[], str]] = []
        """More Prometheus text appended at /metrics by services (e.g. the diagnosis gauges)."""
        self._lock = StoreLock(settings.db_path)
        self._run: _Running | None = None
        self._stopping = threading.Event()
        self.reader: Reader
        """Project SQL (the tools' named queries) on the store's own instance."""
        self.analysis: Sandbox
        """Callers' SQL (``run_analysis``): worker processes reading a snapshot, see :mod:`echo.sandbox`."""

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Echo:
        """Check the store path and the ports, then lock, open, migrate and listen. A failure (a port
        taken after the check, a store that cannot be opened) leaves nothing behind: every file this start
        created is removed again, so a refused start can simply be retried with a corrected command line."""
        s = self.settings
        check_store_path(s.db_path, s.create_dirs)
        self._check_listeners()
        real = self._lock.real_path
        # A store this start creates goes again with its new log; an existing store's log is never touched.
        created = [real, real.with_name(real.name + ".wal")] if not real.exists() else []
        ours = [p for p in (*created, lock_path(real)) if not p.exists()]
        self._lock.acquire()
        try:
            con = open_store(self._lock.real_path, s.store_memory_limit, s.max_spill_size)
            self._lock.cover()  # a store created just now: lock its inode too (hard links)
            writer = Writer(con.cursor(), self.stats, s.queue_rows, s.batch_rows, s.retry_after_s,
                            self._lock.real_path, s.checkpoint_every_s)  # fmt: skip
            retention = writer.use_retention(RetentionPolicy.from_settings(s))  # passes only with a limit
            self.metric_sources.append(retention.metrics)
            writer.checkpoint()  # a WAL replayed at this start is not replayed again at the next
            self.stats.queue_rows = lambda: writer.queued_rows
            self._run = run = _Running(con, writer)
            self.reader = Reader(con)
            run.snapshots = Snapshots(self._lock.real_path, writer.hold)
            limits = SandboxLimits(memory_limit_bytes(s.analysis_memory_limit, ""), s.analysis_workers)
            run.analysis = self.analysis = Sandbox(run.snapshots.current, limits)
            writer.start()
            self._start_listeners(run)
        except BaseException:
            self.stop()
            for path in ours:  # created by this start: a refused start leaves no store, log or lock
                path.unlink(missing_ok=True)
            raise
        return self

    def _check_listeners(self) -> None:
        """Every fixed port Echo will listen on is free (OSError naming the port and its flag if not)."""
        s = self.settings
        mcp = s.mcp_http if any(service.name == "mcp_http" for service in self.services) else None
        wanted = (("OTLP/gRPC", s.otlp_grpc, "--otlp-grpc"), ("OTLP/HTTP", s.otlp_http, "--otlp-http"),
                  ("MCP/HTTP", mcp, "--mcp-http"))  # fmt: skip
        for name, where, flag in wanted:
            if where is not None and where.port != 0:
                check_can_listen(where, name, flag)

    def _start_listeners(self, run: _Running) -> None:
        s = self.settings
        ingest = Ingest(s, run.writer, self.stats)
        auth = TokenCheck(s.token)
        if not auth.enabled:
            log.warning(
                "AUTHENTICATION IS OFF (--insecure-no-auth): anyone who can reach Echo can write to it"
            )
        if s.tls_files() is None:  # the same default as every rankecho client: plaintext, said loudly
            log.warning("PLAINTEXT: tokens and data cross the network unencrypted; serve TLS with --tls-cert "
                        "and --tls-key (clients then pass --tls or --ca-file)")  # fmt: skip
        if s.otlp_grpc is not None:
            run.grpc_server, port = start_grpc(ingest, auth, s.otlp_grpc, s.tls_pair(), s.grpc_workers)
            self.grpc_address = connect_address(s.otlp_grpc.host, port)
        if s.otlp_http is not None:
            limits = Limits(s.http_max_connections, s.http_idle_timeout_s)
            ops = self._ops_routes()
            run.http_server, port = start_http(ingest, auth, s.otlp_http, ops, s.tls_files(), limits)
            self.http_address = connect_address(s.otlp_http.host, port)
        for service in self.services:
            self.service_addresses[service.name] = service.start(self)
            run.started_services.append(service)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop listening, commit everything queued, checkpoint, close, release the lock. Idempotent."""
        self._stopping.set()
        run, self._run = self._run, None
        if run is not None:
            for service in reversed(run.started_services):
                service.stop()
            if run.grpc_server is not None:
                run.grpc_server.stop(grace_s).wait()
            if run.http_server is not None:
                run.http_server.stop()  # in-flight requests finish: the writer still commits
            if run.analysis is not None:
                run.analysis.close()
            run.writer.stop()
            if run.snapshots is not None:
                run.snapshots.remove_all()
            try:
                if run.writer.condition.reason is None and run.writer.failed is None:
                    run.writer.checkpoint()  # skipped without room: the WAL replays at the next start
                else:
                    log.warning("no checkpoint at shutdown: %s", run.writer.condition.describe())
            finally:
                run.con.close()
        self._lock.release()

    def __enter__(self) -> Echo:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- state -----------------------------------------------------------------------------------
    @property
    def writer(self) -> Writer:
        """The running writer (e.g. ``with echo.writer.hold():`` to pause commits)."""
        if self._run is None:
            raise RuntimeError("Echo is not running: call start() first")
        return self._run.writer

    def duckdb_setting(self, name: str) -> str:
        """A setting of the store's DuckDB instance, read on the owner's (unguarded) connection."""
        if self._run is None:
            raise RuntimeError("Echo is not running: call start() first")
        return duckdb_setting(self._run.con, name)

    @property
    def ready(self) -> bool:
        return self._run is not None and self._run.writer.healthy and not self._stopping.is_set()

    def listening(self) -> dict[str, object]:
        """The one JSON object ``rankecho serve`` prints when every listener is up."""
        return {
            "listening": {
                "otlp_grpc": self.grpc_address,
                "otlp_http": self.http_address,
                "mcp_http": self.service_addresses.get("mcp_http"),
            },
            "db": str(self.settings.db_path),
        }

    def listening_line(self) -> str:
        return json.dumps(self.listening(), separators=(", ", ": "))

    def _ops_routes(self) -> dict[str, OpsRoute]:
        def healthz() -> tuple[int, str, bytes]:
            return 200, "text/plain", b"ok\n"

        def readyz() -> tuple[int, str, bytes]:
            if self.ready:
                return 200, "text/plain", b"ready\n"
            run = self._run
            if run is not None and run.writer.failed is not None:
                why = f"the store failed ({run.writer.failed}): restart Echo"
            elif run is not None and run.writer.condition.reason is not None:
                why = run.writer.condition.describe()
            else:
                why = "starting or draining"
            return 503, "text/plain", f"not ready: {why}\n".encode()

        def metrics() -> tuple[int, str, bytes]:
            text = ops.render(self.stats.snapshot()) + "".join(source() for source in self.metric_sources)
            return 200, "text/plain; version=0.0.4", text.encode()

        return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}
