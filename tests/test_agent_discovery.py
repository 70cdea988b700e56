"""Discovery against a /proc fixture tree, readiness checks, NVML sampling, and the BPF program text."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_agent_helpers import sim_built

from rankecho.agent import check, discovery, probes, prologue
from rankecho.agent.events import FN, HEADER, INIT_SIZE, KIND, decode
from rankecho.agent.nvml import Nvml, gpu_for

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


def failed_checks(stdout: str) -> list[str]:
    """Names of the required checks a check run printed as failed, in order."""
    return re.findall(r"^\[FAIL\] ([^:]+):", stdout, re.MULTILINE)


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankecho", "agent", "check", *args], capture_output=True,
                          text=True, cwd=ROOT)


def test_check_command_prints_every_check_and_exits_by_the_required_ones() -> None:
    out = run_check()
    for name in ("privileges", "BTF", "tracefs", "bcc", "kernel headers", "processes", "probe cost", "NVML"):
        assert f"] {name}:" in out.stdout
    # The exit code and the verdict follow from the [FAIL] lines alone (warnings never fail the check).
    failed = failed_checks(out.stdout)
    verdict = out.stdout.rstrip().splitlines()[-1]
    assert (out.returncode, verdict) == ((1, f"not ready: {', '.join(failed)}") if failed else (0, "ready"))


def test_check_command_exits_1_naming_a_missing_library() -> None:
    out = run_check("--nccl-lib", "/nonexistent/libnccl.so.2")
    failed = failed_checks(out.stdout)
    assert out.returncode == 1 and "libraries" in failed
    assert out.stdout.rstrip().splitlines()[-1] == f"not ready: {', '.join(failed)}"


def test_check_main_exits_by_the_required_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # An empty fixture host: no tracefs and no kernel headers (required), no BTF (only a warning).
    code = check.main(proc_root=str(tmp_path), sys_root=str(tmp_path), modules_root=str(tmp_path))
    out = capsys.readouterr().out
    failed = failed_checks(out)
    assert {"tracefs", "kernel headers"} <= set(failed) and "BTF" not in failed and "[warn] BTF:" in out
    assert code == 1 and out.rstrip().splitlines()[-1] == f"not ready: {', '.join(failed)}"


def test_library_problem_accepts_only_elf_libraries_defining_the_traced_functions(tmp_path: Path) -> None:
    sim = sim_built() / "build"
    assert discovery.library_problem(str(sim / "libnccl.so.2"), "nccl") is None
    assert discovery.library_problem(str(sim / "libcudart.so.12"), "cuda") is None
    wrong_kind = discovery.library_problem(str(sim / "libnccl.so.2"), "cuda")
    assert wrong_kind is not None and "exports none of the 8 cuda functions rankecho traces" in wrong_kind
    named_right = tmp_path / "libcudart.so.12"  # the right name is not enough
    named_right.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for path in ("/etc/passwd", str(named_right)):
        problem = discovery.library_problem(path, "cuda")
        assert problem == (
            f"--cuda-lib {path} is not an ELF file; pass the libcudart.so.12 your job loads (see "
            "/proc/PID/maps of a rank), or drop --cuda-lib to trace every one the agent finds"
        )
    truncated = tmp_path / "libnccl.so.2"
    truncated.write_bytes((sim / "libnccl.so.2").read_bytes()[:200])
    assert "damaged ELF file" in str(discovery.library_problem(str(truncated), "nccl"))
    executable = discovery.library_problem(sys.executable, "nccl")  # an ELF file, not a shared library
    assert executable is not None and "--nccl-lib" in executable and "libnccl.so" in executable
    assert "cannot read it" in str(discovery.library_problem(str(tmp_path), "nccl"))


def test_check_refuses_a_file_that_is_not_the_library() -> None:
    out = run_check("--cuda-lib", "/etc/passwd", "--nccl-lib", str(sim_built() / "build" / "libcudart.so.12"))
    assert out.returncode == 1 and "libraries" in failed_checks(out.stdout)
    assert "--cuda-lib /etc/passwd is not an ELF file" in out.stdout
    assert "exports none of the" in out.stdout and "nccl functions rankecho traces" in out.stdout


AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
needs_root_and_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to run as nobody"
)


@needs_root_and_setpriv
def test_check_as_a_non_root_user_blames_permissions_not_mounting() -> None:
    out = subprocess.run([*AS_NOBODY, sys.executable, "-m", "rankecho", "agent", "check"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert out.returncode == 1 and {"privileges", "tracefs"} <= set(failed_checks(out.stdout))
    assert "run as root" in out.stdout and "(permissions, not mounting)" in out.stdout
    assert "mount -t tracefs" not in out.stdout


@needs_root_and_setpriv
def test_a_non_root_agent_exits_2_with_one_line_before_compiling(tmp_path: Path) -> None:
    out = subprocess.run(
        [*AS_NOBODY, sys.executable, "-m", "rankecho", "agent", "--endpoint", "127.0.0.1:9",
         "--spool-dir", str(tmp_path / "spool")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert "needs root" in line and "CAP_BPF" in line and "`rankecho agent check`" in line
    assert "error:" not in line and "clang" not in line.lower()


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
    header = probes.program_text()
    c_fns = {m[0]: int(m[1]) for m in re.findall(r"FN_(\w+) = (\d+)", header)}
    assert c_fns == {f.name: f.value for f in FN}
    c_kinds = {m[0]: int(m[1]) for m in re.findall(r"KIND_(\w+) = (\d+)", header)}
    assert c_kinds == {k.name: k.value for k in KIND}
    assert HEADER.size == 72 and INIT_SIZE == 200
    raw = HEADER.pack(1, 2, 3, 4, 5, 6, 7, 8, KIND.CALL, FN.ALL_REDUCE, 0xFFFFFFFF, 99)
    rec = decode(raw)
    assert rec.fn == FN.ALL_REDUCE and rec.rc == -1 and rec.launches == 99  # type: ignore[union-attr]


def test_prologue_classification_past_endbr64(tmp_path: Path) -> None:
    endbr, sub, push = prologue.ENDBR64, b"\x48\x83\xec\x28", b"\x55\x48\x89\xe5"
    lib = tmp_path / "f"
    lib.write_bytes(endbr + sub + push)
    assert prologue.read_code(str(lib), 4, 4) == sub
    # sub $0x28,%rsp is single-stepped, and moving past it would misplace the stack: probed in place.
    assert prologue.classify(endbr + sub) == prologue.Prologue(4, True, "sub $0x28,%rsp")
    assert prologue.classify(sub) == prologue.Prologue(0, True, "sub $0x28,%rsp")
    assert prologue.classify(b"\x48\x81\xec\x00\x01\x00\x00") == prologue.Prologue(0, True, "sub $0x100,%rsp")
    assert prologue.classify(endbr + push) == prologue.Prologue(4, False, "push %rbp")
    assert prologue.classify(b"\x41\x54\x55") == prologue.Prologue(0, False, "push %r12")
    emulated = [b"\xe9\x00\x00\x00\x00", b"\xeb\x02", b"\x74\x05", b"\x0f\x84\x00\x00\x00\x00", b"\x90"]
    stepped = [b"\x48\x85\xff\x74\x0b", b"\x48\x89\xf8", b"\xc3", endbr + endbr, b""]
    assert [prologue.classify(c).stepped for c in emulated] == [False] * len(emulated)
    assert [prologue.classify(c).stepped for c in stepped] == [True] * len(stepped)
    names = [prologue.classify(c).first for c in (b"\x48\x85\xff", b"\x4d\x85\xc0", b"\x48\x89\xf8", b"\xc3")]
    assert names == ["test %rdi,%rdi", "test %r8,%r8", "mov %rdi,%rax", "bytes c3"]


requires_bcc = pytest.mark.skipif(not check.check_bcc().ok, reason=check.check_bcc().fix)


@requires_bcc
def test_probe_sites_name_single_stepped_prologues_in_real_libraries(tmp_path: Path) -> None:
    sim = sim_built()
    nofp = tmp_path / "sim"  # the same sources built without frame pointers
    shutil.copytree(sim, nofp, ignore=shutil.ignore_patterns("build*", "__pycache__", "scenarios"))
    subprocess.run(["make", "-s", "-C", str(nofp), "FRAME_POINTERS=", "build/libcudart.so.12"], check=True)
    hot = ("cudaLaunchKernel", "cudaStreamSynchronize")
    for build, skip in (("build", 0), ("build-endbr", 4)):
        sites = {s.probe.symbol: s for s in probes.probe_sites(str(sim / build / "libcudart.so.12"), "cuda")}
        assert len(sites) == 8
        for name in hot:
            assert (sites[name].skip, sites[name].stepped, sites[name].first) == (skip, False, "push %rbp")
        assert probes.stepped_warning("x", [sites[n] for n in hot]) is None
    lib = str(nofp / "build" / "libcudart.so.12")
    slow = probes.probe_sites(lib, "cuda")
    by_name = {s.probe.symbol: s for s in slow}
    for name in hot:
        assert by_name[name].stepped and by_name[name].first.startswith("sub $"), by_name[name]
    n = sum(s.stepped for s in slow)
    warning = probes.stepped_warning(lib, slow)
    assert warning is not None and f"{n} of 8 probed functions in {lib}" in warning
    assert "cudaStreamSynchronize (sub $" in warning and "-fno-omit-frame-pointer" in warning
    chk = check.check_prologues(cuda=(lib,))
    assert not chk.ok and not chk.required
    assert chk.detail.startswith(f"{n} of 8 probe sites in 1 library are single-stepped")
    assert "libcudart.so.12:cudaStreamSynchronize" in chk.detail and "push %rbp" in chk.fix


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
