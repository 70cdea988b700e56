"""Discovery against a /proc fixture tree, readiness checks, NVML sampling, and the BPF program text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent import check, discovery, probes
from agent.events import FN, HEADER, INIT_SIZE, KIND, decode
from agent.nvml import Nvml, gpu_for

ROOT = Path(__file__).resolve().parent.parent


def fake_proc(tmp: Path, pid: int, maps: list[str], root: Path | None = None) -> None:
    d = tmp / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "maps").write_text("".join(f"7f00-7f10 r-xp 00000000 08:01 1 {m}\n" for m in maps))
    os.symlink(root or "/", d / "root")


def test_scan_finds_libraries_once_per_file_and_through_container_roots(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "lib").mkdir(parents=True)
    nccl = host / "lib" / "libnccl.so.2"
    nccl.write_bytes(b"x")
    container = tmp_path / "ctr"
    (container / "usr" / "lib").mkdir(parents=True)
    (container / "usr" / "lib" / "libcudart.so.12").write_bytes(b"y")
    fake_proc(tmp_path, 10, [str(nccl), str(nccl), "/usr/lib/libc.so.6"])
    fake_proc(tmp_path, 11, [str(nccl)])
    fake_proc(tmp_path, 12, ["/usr/lib/libcudart.so.12", "/usr/lib/libnccl.so.2 (deleted)"], root=container)
    fake_proc(tmp_path, 13, ["/usr/lib/libc.so.6"])
    libs, procs = discovery.scan(str(tmp_path / "proc"))
    assert set(procs) == {10, 11, 12}
    assert procs[10] == procs[11] and len(libs) == 2
    kinds = {lib.kind: lib for lib in libs.values()}
    assert kinds["nccl"].path == str(nccl)
    assert kinds["cuda"].path == str(tmp_path / "proc" / "12" / "root") + "/usr/lib/libcudart.so.12"
    only, _ = discovery.scan(str(tmp_path / "proc"), pids=[12])
    assert [lib.kind for lib in only.values()] == ["cuda"]


def test_checks_name_the_fix(tmp_path: Path) -> None:
    headers = check.check_headers(str(tmp_path), release="9.9")
    assert not headers.ok and "setup-host.sh" in headers.fix and "build, source" in headers.detail
    (tmp_path / "9.9" / "build").mkdir(parents=True)
    (tmp_path / "9.9" / "source").mkdir()
    assert check.check_headers(str(tmp_path), release="9.9").ok
    tracefs = check.check_tracefs(str(tmp_path))
    assert not tracefs.ok and "mount -t tracefs" in tracefs.line()
    libs = check.check_targets(str(tmp_path), nccl=("/nonexistent/libnccl.so.2",))
    assert not libs.ok and "--nccl-lib" in libs.fix
    assert not check.check_nvml().required


def test_check_command_prints_every_check() -> None:
    out = subprocess.run([sys.executable, "-m", "rankecho", "agent", "check"], capture_output=True, text=True,
                         cwd=ROOT)
    for name in ("privileges", "BTF", "tracefs", "bcc", "kernel headers", "processes", "NVML"):
        assert f"] {name}:" in out.stdout
    assert out.returncode == (0 if out.stdout.rstrip().endswith("ready") else 1)


def test_ebpf_flag_prints_the_program_with_its_knobs() -> None:
    cmd = [sys.executable, "-m", "rankecho", "agent", "--ebpf", "--offcpu-min-ms", "2", "--pid", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.startswith("// cflags: -DOFFCPU_MIN_NS=2000000ULL")
    assert "-DFILTER_PIDS" in out and "BPF_RB_NO_WAKEUP" in out and "struct rk_event" in out
    assert '#include "agent.h"' not in out  # the header is inlined
    for probe in probes.PROBES:
        # CALL()/INIT() define enter_<symbol> and return_<symbol>; entry-only probes are written out.
        paired = re.search(rf"^(CALL|INIT)\({probe.symbol},", out, flags=re.M) is not None
        assert paired == probe.has_return, probe.symbol
        assert paired or f"int enter_{probe.symbol}(struct pt_regs *ctx)" in out


def test_header_and_decoder_agree() -> None:
    header = (probes.BPF_DIR / "agent.h").read_text()
    c_fns = {m[0]: int(m[1]) for m in re.findall(r"FN_(\w+) = (\d+)", header)}
    assert c_fns == {f.name: f.value for f in FN}
    c_kinds = {m[0]: int(m[1]) for m in re.findall(r"KIND_(\w+) = (\d+)", header)}
    assert c_kinds == {k.name: k.value for k in KIND}
    assert HEADER.size == 72 and INIT_SIZE == 200
    raw = HEADER.pack(1, 2, 3, 4, 5, 6, 7, 8, KIND.CALL, FN.ALL_REDUCE, 0xFFFFFFFF, 99)
    rec = decode(raw)
    assert rec.fn == FN.ALL_REDUCE and rec.rc == -1 and rec.launches == 99  # type: ignore[union-attr]


def test_prologue_skip(tmp_path: Path) -> None:
    lib = tmp_path / "f"
    lib.write_bytes(probes.ENDBR64 + b"\x48\x83\xec\x28" + b"\x55\x48\x89\xe5")
    assert probes.prologue_skip(str(lib), 0) == 4
    assert probes.prologue_skip(str(lib), 4) == 0  # sub $0x28,%rsp: moving past it misplaces the stack
    assert probes.prologue_skip(str(lib), 8) == 0


class FakeNvml(SimpleNamespace):
    """The pynvml surface the sampler uses, for machines without a GPU driver."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=97)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=1 << 30)

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 71

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        raise self.NVMLError("not supported")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x20 if h == 1 else 0


def test_nvml_sampling_and_gpu_mapping() -> None:
    nv = Nvml(FakeNvml())
    samples = nv.sample()
    assert [s.model for s in samples] == ["NVIDIA H100 80GB HBM3"] * 2
    assert samples[0].utilization_pct == 97 and samples[0].power_w == 0.0  # unsupported -> 0
    assert [s.slowed for s in samples] == [False, True]
    assert gpu_for(1, None) == 1 and gpu_for(1, "3,5") == 5 and gpu_for(1, "GPU-a,GPU-b") == 1
    assert gpu_for(None, "0") is None
