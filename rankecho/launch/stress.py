"""Drive ``rankecho stress`` and ``rankecho query`` as real processes, the way an operator would:
the fan-in, burst and durability tests, the demo and the ingest benchmark share these helpers.

Usage::

    run = StressProcess(echo.otlp_grpc, token, "demo-cluster", "node-a100", producers=1, events=1000)
    result = run.start().finish()        # the JSON summary stress printed last
    rows = query_cli(db, "SELECT COUNT(*) FROM events")
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankecho.stress.planting import StressPlan


@dataclass
class StressProcess:
    """One ``rankecho stress`` invocation as a child process; ``finish()`` returns its JSON summary."""

    endpoint: str
    token: str | None
    cluster_id: str
    node_id: str
    producers: int = 1
    events: int = 250
    client: str = "raw"
    rate: float | None = None
    extra: tuple[str, ...] = ()
    stderr_path: Path | None = None
    insecure: bool = True
    """Plaintext gRPC; with False pass ``--ca-file`` in ``extra`` for a private CA."""
    proc: subprocess.Popen[str] | None = field(default=None, init=False)

    def plan(self) -> StressPlan:
        """The plan this invocation sends (timestamps aside, which stress takes from the clock)."""
        return StressPlan(self.cluster_id, self.node_id, self.producers, self.events)

    def argv(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "rankecho",
            "stress",
            "--endpoint",
            self.endpoint,
            "--cluster-id",
            self.cluster_id,
            "--node-id",
            self.node_id,
            "--producers",
            str(self.producers),
            "--events-per-producer",
            str(self.events),
            "--client",
            self.client,
        ]
        if self.insecure:
            args.append("--insecure")
        if self.rate:
            args += ["--rate", str(self.rate)]
        if self.token:
            args += ["--token", self.token]
        return args + list(self.extra)

    def start(self) -> StressProcess:
        err = self.stderr_path.open("a") if self.stderr_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.PIPE, stderr=err, text=True)
        if self.stderr_path:
            err.close()  # type: ignore[union-attr]
        return self

    def finish(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait for the process; its last stdout line must be the JSON summary."""
        assert self.proc is not None, "start() first"
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        lines = out.strip().splitlines()
        if not lines:
            raise RuntimeError(f"rankecho stress printed nothing (exit {self.proc.returncode})")
        summary: dict[str, Any] = json.loads(lines[-1])
        summary["exit_code"] = self.proc.returncode
        return summary

    def kill(self) -> None:
        """Stop a stress process still running (a failed test must not leave it retrying)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def query_cli(db: Path, sql: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Rows of one read-only statement, through ``rankecho query --json`` on a DB no Echo holds."""
    done = subprocess.run(
        [sys.executable, "-m", "rankecho", "query", "--db", str(db), "--json", sql],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rankecho query failed ({done.returncode}): {done.stderr.strip()}")
    return parse_query_json(done.stdout)


def parse_query_json(text: str) -> list[dict[str, Any]]:
    """``rankecho query --json`` output (``{"columns": [...], "rows": [[...]], ...}``) as row dicts."""
    doc = json.loads(text)
    return [dict(zip(doc["columns"], row, strict=True)) for row in doc["rows"]]
