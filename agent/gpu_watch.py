"""The node's GPUs as the agent uses them: which GPU a rank runs on, whether it is slowed, and the GPU gauge
points.

NVML (agent/nvml.py) only reads devices; the agent also has to remember the latest reading (the health
score's throttle flag asks for it on every collective), name each rank's GPU on its resource, and send
the gauges less often than it reads them. That state is here, so the main loop (agent/runner.py) only
says when.

Usage::

    gpus = GpuWatch(open_nvml(), interval_s=10.0)   # NVML None: no GPU attributes, never throttled
    gpus.resource(info); gpus.throttled(info)       # for the tracker
    gpus.sample(tracker.procs.values(), sink)       # every window: read NVML, gauges when due
    gpus.close()
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rankecho.agent.identity import ProcessInfo
from rankecho.agent.nvml import Nvml, gpu_for
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue, Point

if TYPE_CHECKING:
    from rankecho.agent.procstate import Proc
    from rankecho.agent.tracker import Sink


class GpuWatch:
    """The latest NVML reading per GPU and when the next gauge points go out."""

    def __init__(self, nvml: Nvml | None, interval_s: float) -> None:
        self.nvml = nvml
        self.interval_s = interval_s
        self.slowed: dict[int, bool] = {}
        """Per GPU index, whether its latest reading says it is slowed (heat, power, hardware)."""
        self._points_due = 0.0
        """When the next GPU gauge points go out (monotonic s); NVML is read every window regardless."""

    def _index(self, info: ProcessInfo) -> int | None:
        return gpu_for(info.env.local_rank, info.env.visible_devices)

    def throttled(self, info: ProcessInfo) -> bool:
        idx = self._index(info)
        return idx is not None and self.slowed.get(idx, False)

    def resource(self, info: ProcessInfo) -> dict[str, AttrValue]:
        idx = self._index(info)
        if self.nvml is None or idx is None or idx >= len(self.nvml.models):
            return {}
        return {c.GPU_MODEL: self.nvml.models[idx], c.GPU_UUID: self.nvml.uuids[idx], c.GPU_INDEX: idx}

    def sample(self, procs: Iterable[Proc], sink: Sink) -> None:
        """Read every GPU; when the interval has passed, give ``sink`` each GPU's gauges, keyed by the
        process that runs on it (None: no traced process does)."""
        if self.nvml is None:
            return
        owners = {self._index(p.info): p.key for p in procs}
        now = time.time_ns()
        send = time.monotonic() >= self._points_due
        if send:
            self._points_due = time.monotonic() + self.interval_s
        for g in self.nvml.sample():
            self.slowed[g.index] = g.slowed
            if not send:
                continue
            key = owners.get(g.index)
            attrs: dict[str, AttrValue] = {c.GPU_INDEX: g.index, c.GPU_UUID: g.uuid, c.GPU_MODEL: g.model}
            for metric, value in (
                (c.M_GPU_UTIL, g.utilization_pct), (c.M_GPU_MEM_USED, g.memory_used_bytes),
                (c.M_GPU_SM_CLOCK, g.sm_clock_mhz), (c.M_GPU_TEMP, g.temperature_c),
                (c.M_GPU_POWER, g.power_w), (c.M_GPU_THROTTLE, g.throttle_reasons),
            ):
                sink(key, Point(metric, now, value, dict(attrs)))

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
