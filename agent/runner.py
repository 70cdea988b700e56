"""The agent's main loop: load BPF, attach, consume the ring buffer, batch, export, shut down cleanly.

``run(settings, stop)`` returns 0 after ``stop`` is set (SIGTERM in the CLI) once everything it saw has
been handed to Echo or to the spool. The loop wakes every 50 ms to drain the ring buffer (records are
written with BPF_RB_NO_WAKEUP, so nothing wakes us per event), flushes points at least every
``flush_interval_s``, reads kernel-launch counters once per ``window_s`` and re-scans /proc every
``scan_interval_s`` for new jobs and libraries loaded by dlopen.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Protocol

from rankecho.agent import check, discovery, probes, pyframe_cache, resource
from rankecho.agent.clock import ClockConverter, ClockStepFile
from rankecho.agent.events import ExitRecord, InitRecord, decode
from rankecho.agent.export import Delivery, Encoded, ExportConfig, Exporter, encode_batch
from rankecho.agent.gpu_watch import GpuWatch
from rankecho.agent.heartbeat import BpfThreads, Heartbeat
from rankecho.agent.identity import read_process, thread_group, thread_name
from rankecho.agent.journal import JOURNAL_NAME, CommJournal
from rankecho.agent.library_probes import LibraryProbes
from rankecho.agent.nvml import open_nvml
from rankecho.agent.settings import Settings
from rankecho.agent.spool import Spool
from rankecho.agent.stacks import StackKeeper
from rankecho.agent.symbols import SymbolClient
from rankecho.agent.tracker import ProcKey, Tracker
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue, Point

log = logging.getLogger("rankecho.agent")
POLL_S = 0.05
MAX_BATCH = 5000
CLOCK_RESAMPLE_S = 10.0
DROPS_EVERY_S = 10.0
SPOOL_EVERY_S = 2.0


class Stop(Protocol):
    """A stop request: :class:`agent.stopflag.StopFlag` in the CLI, a ``threading.Event`` in tests."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float) -> bool: ...


class Agent:
    def __init__(self, s: Settings) -> None:
        self.s = s
        self.clock = ClockConverter(extra_offset_ns=s.clock_offset_ns, drift_ppm=s.clock_drift_ppm,
                                    drift_epoch_ns=s.clock_epoch_ns)  # fmt: skip
        self.clock_step = ClockStepFile(s.clock_step_file) if s.clock_step_file else None  # testing only
        self.spool = Spool(s.spool_dir, s.spool_max_bytes, adopt=s.spool_adopt)
        self.exporter = Exporter(
            ExportConfig(s.endpoint, s.token, s.tls, s.ca_file, s.cert_file, s.key_file), self.spool
        )
        self.gpus = GpuWatch(open_nvml(), s.gpu_interval_s)
        self.symbols: SymbolClient | None = SymbolClient() if s.stacks else None
        stacks = StackKeeper(self.symbols.resolve, self.symbols.forget) if self.symbols is not None else None
        self.tracker = Tracker(
            s.node_id,
            self.clock,
            read_proc=lambda pid: read_process(s.proc_root, pid),
            sink=self._sink,
            thread_name=lambda pid, tid: thread_name(s.proc_root, pid, tid),
            thread_group=lambda tid: thread_group(s.proc_root, tid),
            throttled=self.gpus.throttled,
            gpu_resource=self.gpus.resource,
            journal=CommJournal(Path(s.spool_dir) / JOURNAL_NAME,
                                alive=lambda pid: os.path.exists(f"{s.proc_root}/{pid}")),
            raw_interval_ns=s.raw_interval_ns,
            health_every=s.health_every,
            stacks=stacks,
        )
        # The environment's attributes go on every resource, except those naming the agent's own pod:
        # they go only on the agent's own points (a traced process carries its own pod, if any).
        shared, own = resource.split(dict(s.resource))
        self.own: dict[str, AttrValue] = dict(own)
        self.base: dict[str, AttrValue] = {
            **shared,
            c.SERVICE_NAME: "rankecho-agent",
            c.SERVICE_INSTANCE_ID: f"{s.node_id}/{os.getpid()}/{time.time_ns()}",
            c.CLUSTER_NAME: s.cluster_id,
            c.NODE_NAME: s.node_id,
            c.HOST_NAME: socket.gethostname(),
        }
        self.points: list[tuple[ProcKey | None, Point]] = []
        self.libs = LibraryProbes(s.proc_root, s.pids)
        self.bpf: Any = None
        self.heartbeat: Heartbeat | None = None
        self.decode_errors = 0
        self._py_checked: set[int] = set()
        """Processes already looked at for CPython (dropped at their exit; bounded: starts over past
        65,536, a second look is harmless)."""
        self._reported_drops = (0, 0)
        self._spool_reported = False
        self._resources: dict[ProcKey, dict[str, AttrValue]] = {}
        """The resource of every process with points waiting for the next flush."""

    # --- points ---------------------------------------------------------------------------------
    def _sink(self, key: ProcKey | None, point: Point) -> None:
        self.points.append((key, point))
        resource = self.tracker.resources.get(key) if key is not None else None
        if key is not None and resource is not None:
            # Taken now: a process that exits has its resource retired by the tracker's sweep, which
            # can run before the next flush; its last points must still say which rank they are.
            self._resources[key] = resource

    def flush(self) -> None:
        if not self.points:
            return
        items, self.points = self.points, []
        resources: dict[Any, dict[str, AttrValue]] = {**self._resources, None: self.own}
        self._resources = {}
        for i in range(0, len(items), MAX_BATCH):
            batch: Encoded = encode_batch(resources, items[i : i + MAX_BATCH], self.base)
            self.exporter.submit(batch)

    # --- BPF ------------------------------------------------------------------------------------
    def start(self) -> None:
        s = self.s
        self.bpf = probes.load(s.probe_config)
        self.bpf["events"].open_ring_buffer(self._on_record)
        for kind, paths in (("nccl", s.nccl_libs), ("cuda", s.cuda_libs)):
            self.libs.attach_given(self.bpf, kind, paths)
        for pid in s.pids:
            self.bpf["targets"][ct.c_uint32(pid)] = ct.c_uint8(1)
        if s.stacks and s.sample_hz > 0:
            probes.attach_sampler(self.bpf, s.sample_hz)
        if s.heartbeat_s > 0:
            threads = BpfThreads(self.bpf, s.stacks)
            self.heartbeat = Heartbeat(self.tracker, threads, round(s.heartbeat_s * 1e9))
        if self.symbols is not None:
            self.symbols.start()
        self.rescan()
        release_compiler_memory(self.bpf)
        if s.ready_file:
            tmp = f"{s.ready_file}.tmp"
            with open(tmp, "w") as f:
                f.write(f"{os.getpid()}\n")
            os.replace(tmp, s.ready_file)

    def rescan(self) -> None:
        """Attach to what the processes map now, and trace those that map an attached library."""
        for pid in self.libs.scan(self.bpf):
            info = read_process(self.s.proc_root, pid)
            if info is not None and pid not in self.tracker.procs:
                self.tracker.track(info)
                self.bpf["targets"][ct.c_uint32(pid)] = ct.c_uint8(1)

    def _python_target(self, pid: int) -> None:
        """Give BPF a CPython process's interpreter layout the first time one of its records arrives, so
        its later stacks carry Python frames (agent/pyframe_cache.py; other processes cost one set lookup)."""
        if len(self._py_checked) >= 65_536:
            self._py_checked.clear()
        self._py_checked.add(pid)
        proc = pyframe_cache.DECODER.register(pid) if self.s.stacks else None
        if proc is not None and self.bpf is not None:
            self.bpf["py_targets"][ct.c_uint32(pid)] = proc.target()
            log.info("pid %d runs CPython %d.%d: its stacks carry Python frames", pid, *proc.version)

    def _on_record(self, ctx: Any, data: Any, size: int) -> int:
        try:
            record = decode(ct.string_at(data, size))
            pid = record.call.pid if isinstance(record, InitRecord) else record.pid
            if isinstance(record, ExitRecord):
                self._py_checked.discard(pid)  # a later process may reuse the pid
            elif pid not in self._py_checked:
                self._python_target(pid)
            self.tracker.handle(record)
        except Exception as err:  # one bad record must not stop the agent
            self.decode_errors += 1
            if self.decode_errors <= 5:
                log.warning("skipped a record: %s", err)
        return 0

    def read_windows(self, final: bool = False) -> None:
        """Launch counters -> points (the ones no collective carried; all at the ``final`` read); forget
        BPF state of processes that exited."""
        table = self.bpf["launches"]
        counts = {int(k.value): (int(v.pid), int(v.n)) for k, v in table.items()}
        self.tracker.launch_counts(counts, self.clock.now_mono(), final=final)
        gone = set(self.tracker.sweep(self.clock.now_mono()))
        if gone:
            for tid, (pid, _) in counts.items():
                if pid in gone:
                    table.pop(ct.c_uint32(tid), None)

    def report_drops(self, force: bool = False) -> None:
        ring = sum(int(v) for v in self.bpf["drops"][ct.c_int(0)]) if self.bpf is not None else 0
        spool = self.spool.dropped_points
        if (ring, spool) == self._reported_drops and not force:
            return
        self._reported_drops = (ring, spool)
        now = time.time_ns()
        for source, n in (("ringbuf", ring), ("spool", spool)):
            attrs: dict[str, AttrValue] = {c.DROP_SOURCE: source}
            self.points.append((None, Point(c.M_AGENT_DROPS, now, n, attrs)))

    def report_spool(self) -> None:
        """The spool's backlog (points, age of the oldest), while it holds any and once more when it
        has emptied, so ``fleet.cluster.summary`` can show which nodes' data is still on its way."""
        waiting = self.spool.points
        if not (waiting or self._spool_reported):
            return
        self._spool_reported = waiting > 0
        now = time.time_ns()
        self.points.append((None, Point(c.M_AGENT_SPOOL_POINTS, now, waiting, {})))
        self.points.append((None, Point(c.M_AGENT_SPOOL_AGE, now, round(self.spool.oldest_age_s(), 3), {})))

    # --- loop -----------------------------------------------------------------------------------
    def loop(self, stop: Stop) -> None:
        s = self.s
        now = time.monotonic()
        due = {"flush": now + s.flush_interval_s, "window": now + s.window_s, "scan": now + s.scan_interval_s,
               "clock": now + CLOCK_RESAMPLE_S, "drops": now + DROPS_EVERY_S, "spool": now + SPOOL_EVERY_S,
               "beat": now + s.heartbeat_s}
        while not stop.is_set():
            self.bpf.ring_buffer_consume()
            now = time.monotonic()
            if now >= due["window"]:
                due["window"] = now + s.window_s
                self.read_windows()
                self.gpus.sample(self.tracker.procs.values(), self._sink)
            if now >= due["flush"] or len(self.points) >= MAX_BATCH:
                due["flush"] = now + s.flush_interval_s
                self.flush()
            if now >= due["scan"]:
                due["scan"] = now + s.scan_interval_s
                self.rescan()
            if now >= due["clock"]:
                due["clock"] = now + CLOCK_RESAMPLE_S
                self.clock.resample()
            if now >= due["drops"]:
                due["drops"] = now + DROPS_EVERY_S
                self.report_drops()
            if now >= due["spool"]:
                due["spool"] = now + SPOOL_EVERY_S
                self.report_spool()
            if self.heartbeat is not None and now >= due["beat"]:
                due["beat"] = now + s.heartbeat_s
                self.heartbeat.beat(self.clock.now_mono())
            if self.clock_step is not None:
                self.clock_step.poll(self.clock)
            stop.wait(POLL_S)

    def shutdown(self) -> Delivery:
        """Drain the ring buffer, send everything pending, leave the rest in the spool; log (last) and
        return what became of this run's points."""
        if self.bpf is not None:
            self.bpf.ring_buffer_consume()
            self.read_windows(final=True)
            self.report_drops(force=True)
        self.tracker.close()
        self.flush()
        self.exporter.close(self.s.shutdown_deadline_s)
        delivery = Delivery(self.exporter.sent_points, self.exporter.rejected_points,
                            self.exporter.rejected_why, self.spool.dropped_points, self.spool.points,
                            str(self.spool.dir), str(self.spool.root))
        self.spool.close()
        self.gpus.close()
        if self.symbols is not None:
            self.symbols.close()
        if self.bpf is not None:
            t0 = time.monotonic()
            n = probes.detach_all(self.bpf)
            self.bpf.cleanup()
            log.info("detached %d uprobes in %.1f s", n, time.monotonic() - t0)
        for line in delivery.problems(self.s.endpoint, self.s.shutdown_deadline_s):
            log.error("%s", line)
        log.info("%s", delivery.summary())
        return delivery

    def abandon(self) -> None:
        """Start-up failed: release what was taken without sending anything (a misconfigured agent
        must not put a phantom cluster in Echo); the spool keeps whatever it adopted."""
        self.exporter.close(0)
        self.spool.close()
        self.gpus.close()
        if self.symbols is not None:
            self.symbols.close()
        if self.bpf is not None:
            probes.detach_all(self.bpf)
            self.bpf.cleanup()


def release_compiler_memory(bpf: Any) -> None:
    """Give back what compiling the program left on the heap (~25 MiB of ~135 MiB RSS)."""
    bpf.free_bcc_memory()
    with contextlib.suppress(OSError, AttributeError):
        ct.CDLL("libc.so.6").malloc_trim(0)


def run(s: Settings, stop: Stop) -> int:
    """Start, trace until ``stop`` is set, shut down; a stop that came during start-up skips the rest.

    Returns 0 when every point was acknowledged by Echo, 1 when any was rejected for good, dropped from
    a full spool or is left unsent in it (the log's last lines say which, and the fix). A
    ``--nccl-lib``/``--cuda-lib`` that is not a traceable library raises
    :class:`discovery.LibraryError` (exit 2) before anything is exported."""
    check.require_privileges()  # exit 2 naming root and `agent check`, before any spool or BPF compile
    for kind, paths in (("nccl", s.nccl_libs), ("cuda", s.cuda_libs)):
        for path in paths:
            discovery.check_library(path, kind)
    agent = Agent(s)
    try:
        if not stop.is_set():
            agent.start()
    except Exception as err:
        if not stop.is_set():
            agent.abandon()
            raise
        # The stop came during start-up: the kernel's verifier gives up on a pending signal (EAGAIN), so a
        # program load under way fails with it. That is the stop, not a fault: drain and exit as on a stop.
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        log.info("stopped during start-up (%s)", first)
    except BaseException:
        agent.abandon()
        raise
    agent.exporter.start()
    try:
        agent.loop(stop)
    finally:
        delivery = agent.shutdown()
    return 0 if delivery.complete else 1
