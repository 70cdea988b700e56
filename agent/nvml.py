"""GPU state through NVML (pynvml), where a driver is present; otherwise one log line and nothing.

Usage::

    gpus = open_nvml()                # None without NVML
    for s in gpus.sample(): ...       # one GpuSample per device
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rankecho.agent")

# Throttle reasons that mean the GPU is slowed by heat, power or hardware (not idle or app clocks).
SLOWDOWN_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, power brake


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    model: str
    utilization_pct: float
    memory_used_bytes: int
    sm_clock_mhz: int
    temperature_c: int
    power_w: float
    throttle_reasons: int

    @property
    def slowed(self) -> bool:
        return bool(self.throttle_reasons & SLOWDOWN_MASK)


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    def __init__(self, pynvml: Any) -> None:
        self._n = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.models = [_str(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
        self.uuids = [_str(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]

    def _one(self, fn: str, *args: Any, default: Any = 0) -> Any:
        try:
            return getattr(self._n, fn)(*args)
        except self._n.NVMLError:
            return default

    def sample(self) -> list[GpuSample]:
        n = self._n
        out = []
        for i, h in enumerate(self._handles):
            util = self._one("nvmlDeviceGetUtilizationRates", h, default=None)
            mem = self._one("nvmlDeviceGetMemoryInfo", h, default=None)
            out.append(GpuSample(
                index=i,
                uuid=self.uuids[i],
                model=self.models[i],
                utilization_pct=float(util.gpu) if util is not None else 0.0,
                memory_used_bytes=int(mem.used) if mem is not None else 0,
                sm_clock_mhz=int(self._one("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM)),
                temperature_c=int(self._one("nvmlDeviceGetTemperature", h, n.NVML_TEMPERATURE_GPU)),
                power_w=self._one("nvmlDeviceGetPowerUsage", h) / 1000.0,
                throttle_reasons=int(self._one("nvmlDeviceGetCurrentClocksThrottleReasons", h)),
            ))
        return out

    def close(self) -> None:
        with contextlib.suppress(self._n.NVMLError):
            self._n.nvmlShutdown()


def open_nvml() -> Nvml | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return Nvml(pynvml)
    except Exception as err:
        log.info("NVML not available (%s): no GPU state will be reported from this node", err)
        return None


def gpu_for(local_rank: int | None, visible_devices: str | None) -> int | None:
    """The NVML index of a rank's GPU: its local rank, through CUDA_VISIBLE_DEVICES when that lists
    plain indexes."""
    if local_rank is None:
        return None
    if visible_devices:
        items = [v.strip() for v in visible_devices.split(",") if v.strip()]
        if local_rank < len(items) and items[local_rank].isdigit():
            return int(items[local_rank])
    return local_rank
