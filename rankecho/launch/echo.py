"""Start and stop a real ``rankecho serve`` subprocess: used by the stress tests, the demo and the
ingest benchmark, which all need Echo as a separate process (kill -9 included).

Usage::

    with EchoProcess(db=tmp / "echo.db", token="secret") as echo:
        print(echo.otlp_grpc)            # "127.0.0.1:PORT"
    # stopped with SIGTERM (drains and commits); echo.kill() is kill -9
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

READY_TIMEOUT_S = 30.0


class EchoStartError(RuntimeError):
    """Echo exited or stayed silent instead of printing its listening line."""


class EchoProcess:
    """One ``rankecho serve`` child. ``start()`` waits for the ready JSON line; ``grpc_port`` pins the
    port (a restart on the same port lets producers reconnect to the same address)."""

    def __init__(
        self,
        db: Path,
        token: str | None,
        grpc_port: int = 0,
        log: Path | None = None,
        extra_args: tuple[str, ...] = (),
        source: Path | None = None,
    ) -> None:
        self.db = Path(db)
        self.source = source
        """Another checkout of rankecho to run instead of the installed one (benchmarks compare two
        revisions side by side): the child runs in its root (``python -m`` puts the working directory
        first on ``sys.path``, before ``PYTHONPATH``), which also goes first on ``PYTHONPATH``."""
        self.token = token
        self.grpc_port = grpc_port
        self.log = log or self.db.with_suffix(".echo.log")
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.listening: dict[str, str | None] = {}

    @property
    def otlp_grpc(self) -> str:
        address = self.listening.get("otlp_grpc")
        if not address:
            raise EchoStartError("Echo is not running: call start() first")
        return address

    def command(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "rankecho",
            "serve",
            "--db",
            str(self.db if self.source is None else self.db.absolute()),  # the child runs in source
            "--otlp-grpc",
            f"127.0.0.1:{self.grpc_port}",
            "--otlp-http",
            "127.0.0.1:0",
            "--mcp-http",
            "127.0.0.1:0",
        ]
        if self.token is None:
            args.append("--insecure-no-auth")
        return args + list(self.extra_args)

    def start(self) -> EchoProcess:
        env = dict(os.environ)
        env.pop("RANKECHO_TOKEN", None)
        if self.token is not None:
            env["RANKECHO_TOKEN"] = self.token
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.source.resolve()), env.get("PYTHONPATH", "")])
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=log, env=env, cwd=self.source
        )
        log.close()
        line = self._ready_line()
        ready = json.loads(line)
        self.listening = ready["listening"]
        self.grpc_port = int(self.otlp_grpc.rsplit(":", 1)[1])
        return self

    def _ready_line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + READY_TIMEOUT_S
        buf = b""
        while time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                buf += chunk
                if b"\n" in buf:
                    return buf.split(b"\n", 1)[0].decode()
                if not chunk:
                    break
            if self.proc.poll() is not None and not buf:
                break
        self.kill()
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        raise EchoStartError(f"Echo did not print its listening line; log {self.log}:\n{tail}")

    def kill(self) -> None:
        """kill -9: no drain, no commit of queued rows (acknowledged rows are already committed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (Echo drains its queue and commits), then kill -9 if it outstays ``timeout_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> EchoProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
