"""Echo's resident memory while it serves a store: the RSS half of ``python -m bench day`` (not a benchmark
of its own; bench/day.py builds the stores and calls :func:`rss_of_store`).

A real ``rankecho serve`` opens the store, once per arm of :data:`ARMS` (the limit given to DuckDB alone,
and the same size given as Echo's whole budget with ``--memory-limit``); the tools an agent starts an
investigation with are called over MCP/HTTP (find_stragglers over all data and over the last 5 minutes,
explain_straggler of the top straggler's latest episode, summary, get_cost), then a 64-rank job sends
10 s of points, while a thread samples VmRSS of Echo and its children from ``/proc`` every 0.2 s.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb

from bench.fleet import TOKEN, generate
from rankecho.launch.echo import EchoProcess

MEMORY_LIMIT = "4GB"
MEMORY_LIMIT_BYTES = 4 * 1000**3
"""DuckDB's GB is 10^9 bytes (3,815 MiB)."""
ARMS = ("--duckdb-memory-limit", "--memory-limit")
"""The flag that carries :data:`MEMORY_LIMIT`, per arm: DuckDB's buffer pool only (RSS runs ~0.5 GB over
it), or Echo's process budget (DuckDB gets the budget less Echo's own share)."""
SPILL_CAP = "4GB"
"""Most the in-process find_stragglers may spill to disk."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS of ``pid`` plus its children's, VmHWM of ``pid``) in KiB; (0, 0) once it is gone."""
    def field(p: int, name: str) -> int:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(name + ":"):
                    return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        kids = []
    return field(pid, "VmRSS") + sum(field(c, "VmRSS") for c in kids), field(pid, "VmHWM")


class Sampler(threading.Thread):
    """Echo's RSS every ``every_s`` until stopped: the peak and the series."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak_kib, self.samples = pid, every_s, 0, 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.every_s):
            rss, _ = rss_kib(self.pid)
            self.peak_kib, self.samples = max(self.peak_kib, rss), self.samples + 1


def mcp_calls(address: str, timeout_s: float) -> dict[str, Any]:
    """The investigation an agent starts with, over MCP/HTTP: tool -> (ms, ok)."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        client = create_mcp_http_client({"Authorization": f"Bearer {TOKEN}"}, httpx2.Timeout(timeout_s))
        async with client, streamable_http_client(f"http://{address}/mcp", http_client=client) as (r, w), \
                ClientSession(r, w) as session:  # fmt: skip
            await session.initialize()

            async def call(name: str, args: dict[str, Any], key: str = "") -> dict[str, Any] | None:
                t0 = time.perf_counter()
                res = await session.call_tool(f"fleet.cluster.{name}", args)
                ms = round((time.perf_counter() - t0) * 1000)
                text = "" if not res.is_error else " ".join(getattr(c, "text", "") for c in res.content)
                out[key or name] = {"ms": ms, "ok": not res.is_error, "error": text[:300] or None}
                log(f"    {key or name}: {ms:,} ms{f' (error: {text[:200]})' if text else ''}")
                return None if res.is_error else res.structured_content

            found = await call("find_stragglers", {}) or {}
            last5 = await call("find_stragglers", {"window": "last 5m"}, "find_stragglers_last_5m") or {}
            top = (found.get("stragglers") or last5.get("stragglers") or [None])[0]
            if top and top.get("episodes"):
                ep = top["episodes"][-1]
                await call("explain_straggler", {"node_id": top["node_id"], "rank": top["rank"],
                                                 "causal_chain_id": ep.get("causal_chain_id")})  # fmt: skip
            out["named"] = [s.get("rank") for s in (found or last5).get("stragglers", [])]
            await call("summary", {})
            await call("get_cost", {})
        return out

    return asyncio.run(go())


def untimed_find_stragglers(db: Path, timeout_s: float) -> dict[str, Any]:
    """find_stragglers in this process with a long query timeout (Echo's tools stop at 10 s): how long the
    answer takes on this store, and whom it names. Opened as Echo opens it (memory limit, sealed)."""
    from rankecho.echo.guard.instance import seal
    from rankecho.echo.mcp.rates import load_rates
    from rankecho.echo.mcp.tools import Investigation, Limits
    from rankecho.echo.store.reader import Reader

    with duckdb.connect(str(db), read_only=True) as con:
        # Echo's store instance sets no spill cap (DuckDB's default: 90% of the free disk); at 100M events
        # this call, unbounded by Echo's 10 s, spilled until the disk was full. Capped here.
        con.execute(f"SET max_temp_directory_size = '{SPILL_CAP}'")
        seal(con, MEMORY_LIMIT)
        inv = Investigation(Reader(con, timeout_s=timeout_s), load_rates(), Limits(timeout_s=timeout_s))
        t0 = time.perf_counter()
        try:
            found = inv.diagnosis.find_stragglers()
        except Exception as exc:  # e.g. out of memory under the 4GB limit: that is the answer
            ms = round((time.perf_counter() - t0) * 1000)
            log(f"    find_stragglers in-process failed after {ms:,} ms: {str(exc)[:200]}")
            return {"ms": ms, "error": str(exc)[:300]}
        ms = round((time.perf_counter() - t0) * 1000)
    named = [s.get("rank") for s in found.get("stragglers", [])]
    log(f"    find_stragglers in-process, {timeout_s:g} s timeout: {ms:,} ms, named ranks {named}")
    return {"ms": ms, "named": named}


def rss_of_store(db: Path, tmp: Path, timeout_s: float, flag: str = ARMS[0]) -> dict[str, Any]:
    """Echo serving ``db`` with ``flag MEMORY_LIMIT``: RSS after start, peak while the tools run and
    points arrive, and after."""
    extra = (flag, MEMORY_LIMIT)
    with EchoProcess(db, TOKEN, extra_args=extra, log=tmp / f"{db.stem}.echo.log") as echo:
        assert echo.proc is not None
        pid = echo.proc.pid
        start_kib = rss_kib(pid)[0]
        sampler = Sampler(pid)
        sampler.start()
        tools = mcp_calls(str(echo.listening["mcp_http"]), timeout_s)
        tools_kib, sampler.peak_kib = sampler.peak_kib, 0
        ingest = generate(echo, 64, 1000.0, 10, "max", tmp / "rss.stress.log", stragglers=0)
        time.sleep(5)  # idle: what stays resident
        after_kib, hwm_kib = rss_kib(pid)
        sampler.halt.set()
        sampler.join()
    mib = 1024
    peak = max(tools_kib, sampler.peak_kib, hwm_kib)
    return {"flag": flag, "rss_start_mib": start_kib // mib, "rss_peak_mib": peak // mib,
            "rss_after_mib": after_kib // mib,
            "rss_peak_tools_mib": tools_kib // mib, "rss_peak_ingest_mib": sampler.peak_kib // mib,
            "vmhwm_mib": hwm_kib // mib, "limit_mib": MEMORY_LIMIT_BYTES // 2**20,
            "under_limit": peak * 1024 < MEMORY_LIMIT_BYTES, "samples": sampler.samples, "tools": tools,
            "ingested": ingest["acked"], "ingest_failed": ingest["failed"]}  # fmt: skip
