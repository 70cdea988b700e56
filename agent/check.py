"""``rankecho agent check``: can this node run the agent? Each check says what to do when it fails.

Paths are injectable (``sys_root``, ``proc_root``, ``modules_root``) so the checks run against fixtures.
Required checks decide the exit code; ``warn`` checks (processes found, NVML) only inform. The agent runs
:func:`require_privileges` before compiling its BPF program.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
from dataclasses import dataclass

from rankecho.agent import discovery
from rankecho.exitcodes import USAGE

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.required else "warn")
        text = f"[{mark}] {self.name}: {self.detail}"
        return text if self.ok or not self.fix else f"{text}\n       fix: {self.fix}"


def effective_caps(proc_root: str = "/proc") -> int:
    try:
        with open(os.path.join(proc_root, "self", "status")) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def check_privileges(proc_root: str = "/proc") -> Check:
    caps = effective_caps(proc_root)
    has = lambda bit: bool(caps >> bit & 1)  # noqa: E731
    ok = os.geteuid() == 0 or has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON))
    return Check("privileges", ok, f"euid {os.geteuid()}, CapEff {caps:#x}",
                 "run as root, or grant CAP_BPF + CAP_PERFMON (+ CAP_SYS_PTRACE to read other "
                 "processes' /proc) to the agent")


def check_btf(sys_root: str = "/sys") -> Check:
    path = os.path.join(sys_root, "kernel", "btf", "vmlinux")
    return Check("BTF", os.path.exists(path), path,
                 "use a kernel built with CONFIG_DEBUG_INFO_BTF=y", required=False)


def check_tracefs(sys_root: str = "/sys") -> Check:
    """tracefs mounted and readable: without permission to look, a mounted tracefs looks absent, so a
    non-root agent was told to mount it; the two causes have different fixes."""
    tracing = os.path.join(sys_root, "kernel", "tracing")
    path = os.path.join(tracing, "events", "sched", "sched_switch")
    try:
        os.stat(path)
        denied = not os.access(path, os.R_OK | os.X_OK)
    except PermissionError:
        denied = True
    except OSError:
        try:
            os.listdir(tracing)
            denied = False
        except PermissionError:
            denied = True
        except OSError:
            denied = False
        if not denied:
            return Check("tracefs", False, f"{path} not found (tracefs not mounted)",
                         f"mount -t tracefs nodev {tracing}")
    if denied:
        return Check("tracefs", False, f"{tracing} is not readable by euid {os.geteuid()} (permissions, "
                     "not mounting)", f"run the agent as root (tracefs is root-only by default), or make it "
                     f"readable: mount -o remount,mode=755 {tracing}")
    return Check("tracefs", True, path)


def check_bcc() -> Check:
    found = importlib.util.find_spec("bcc") is not None
    return Check("bcc", found, "python bcc bindings " + ("importable" if found else "missing"),
                 "apt-get install python3-bpfcc, then scripts/link-bcc.sh .venv (make install does both)")


def check_headers(modules_root: str = "/lib/modules", release: str | None = None) -> Check:
    release = release or os.uname().release
    base = os.path.join(modules_root, release)
    missing = [d for d in ("build", "source") if not os.path.exists(os.path.join(base, d))]
    detail = f"{base}/build and /source" + (f" (missing: {', '.join(missing)})" if missing else "")
    return Check("kernel headers", not missing, detail,
                 "install linux-headers for this kernel and link build/ and source/ under "
                 f"{base} (scripts/setup-host.sh does it)")


def check_targets(proc_root: str = "/proc", nccl: tuple[str, ...] = (), cuda: tuple[str, ...] = ()) -> Check:
    missing = [p for p in (*nccl, *cuda) if not os.path.exists(p)]
    if missing:
        return Check("libraries", False, f"not found: {', '.join(missing)}",
                     "fix the --nccl-lib/--cuda-lib path")
    wrong = [why for kind, paths in (("nccl", nccl), ("cuda", cuda)) for p in paths
             if (why := discovery.library_problem(p, kind))]
    if wrong:
        return Check("libraries", False, "; ".join(wrong), "fix the --nccl-lib/--cuda-lib path")
    libs, procs = discovery.scan(proc_root)
    kinds = sorted({lib.kind for lib in libs.values()})
    detail = f"{len(procs)} processes map {len(libs)} NCCL/CUDA runtime files ({', '.join(kinds) or 'none'})"
    return Check("processes", bool(procs) or bool(nccl or cuda), detail,
                 "start the training job (the agent also picks up jobs started later), or pass "
                 "--nccl-lib/--cuda-lib", required=False)


def check_prologues(proc_root: str = "/proc", nccl: tuple[str, ...] = (),
                    cuda: tuple[str, ...] = ()) -> Check:
    """How many probe sites in the libraries found would be single-stepped (slow) on every call."""
    name = "probe cost"
    if importlib.util.find_spec("bcc") is None:
        return Check(name, False, "not checked (needs the bcc bindings to read symbols)", required=False)
    from rankecho.agent.probes import probe_sites
    from rankecho.agent.prologue import STEP_COST, STEP_FIX

    files = [(p, "nccl") for p in nccl] + [(p, "cuda") for p in cuda]
    if not files:
        libs, _ = discovery.scan(proc_root)
        files = [(lib.path, lib.kind) for lib in libs.values()]
    total, slow = 0, []
    for path, kind in files:
        if not os.path.exists(path):
            continue
        sites = probe_sites(path, kind)
        total += len(sites)
        slow += [f"{os.path.basename(path)}:{s.probe.symbol}" for s in sites if s.stepped]
    plural = "library" if len(files) == 1 else "libraries"
    detail = f"{len(slow)} of {total} probe sites in {len(files)} {plural} are single-stepped"
    if slow:
        detail += f" ({STEP_COST}): {', '.join(slow[:6])}{', ...' if len(slow) > 6 else ''}"
    return Check(name, not slow, detail, STEP_FIX, required=False)


def traced_binaries(proc_root: str = "/proc", nccl: tuple[str, ...] = (), cuda: tuple[str, ...] = ()
                    ) -> list[str]:  # fmt: skip
    """The NCCL/CUDA runtime files given or found, and the executables of the processes that map them."""
    files = [*nccl, *cuda]
    libs, procs = discovery.scan(proc_root)
    if not files:
        files = [lib.path for lib in libs.values()]
    for pid in sorted(procs):
        try:
            files.append(os.path.realpath(os.path.join(proc_root, str(pid), "exe")))
        except OSError:
            continue
    return list(dict.fromkeys(f for f in files if os.path.isfile(f)))


def check_frame_pointers(proc_root: str = "/proc", nccl: tuple[str, ...] = (),
                         cuda: tuple[str, ...] = ()) -> Check:  # fmt: skip
    """Which traced binaries lack frame pointers (their stacks stop there, marked truncated)."""
    from rankecho.agent.framepointers import FIX, push_rbp_share

    name = "frame pointers"
    files = traced_binaries(proc_root, nccl, cuda)
    if not files:
        return Check(name, True, "no traced binary found to check", required=False)
    without = []
    for path in files:
        try:
            share = push_rbp_share(path)
        except (OSError, ValueError, struct.error):
            continue
        if share.has_frame_pointers is False:
            without.append(f"{path} ({share.share:.0%} of {share.functions} functions begin with push %rbp)")
    detail = f"{len(files) - len(without)} of {len(files)} traced binaries keep frame pointers"
    if without:
        detail += f"; without: {'; '.join(without[:4])}{'; ...' if len(without) > 4 else ''}"
    return Check(name, not without, detail, f"call stacks stop at such a binary (reported truncated): {FIX}",
                 required=False)


def check_nvml() -> Check:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return Check("NVML", True, f"{count} GPUs", required=False)
    except Exception as err:
        return Check("NVML", False, f"unavailable ({err})",
                     "install the NVIDIA driver (libnvidia-ml.so.1); without it no GPU state is sent",
                     required=False)


def run_checks(nccl: tuple[str, ...] = (), cuda: tuple[str, ...] = (), proc_root: str = "/proc",
               sys_root: str = "/sys", modules_root: str = "/lib/modules") -> list[Check]:
    return [
        check_privileges(proc_root),
        check_btf(sys_root),
        check_tracefs(sys_root),
        check_bcc(),
        check_headers(modules_root),
        check_targets(proc_root, nccl, cuda),
        check_prologues(proc_root, nccl, cuda),
        check_frame_pointers(proc_root, nccl, cuda),
        check_nvml(),
    ]


def ebpf_missing() -> str | None:
    """Why this machine cannot load the agent's BPF program (the first failing required check, with its
    fix), or None. The one prerequisite test of the eBPF tests, the agent benchmark and the demo."""
    for chk in (check_privileges(), check_bcc(), check_headers(), check_tracefs()):
        if not chk.ok:
            return f"{chk.name}: {chk.detail}; fix: {chk.fix}"
    return None


def preflight(proc_root: str = "/proc", sys_root: str = "/sys") -> str | None:
    """Why this process may not load the agent's BPF program (rights, not software), or None. Run
    before compiling: a non-root start then says so in one line instead of ~100 lines of clang errors."""
    failed = [chk for chk in (check_privileges(proc_root), check_tracefs(sys_root)) if not chk.ok]
    if not failed:
        return None
    return ("needs root (or CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN, and a "
            "readable tracefs) to load its eBPF probes: "
            + "; ".join(f"{chk.name}: {chk.detail}" for chk in failed)
            + ". Run it as root (sudo rankecho agent ...; in Kubernetes a privileged container), and run "
            "`rankecho agent check` to see every prerequisite.")


def require_privileges() -> None:
    """Exit 2 with the :func:`preflight` message when this process may not load the BPF program."""
    problem = preflight()
    if problem:
        print(f"rankecho agent: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE)


def main(nccl: tuple[str, ...] = (), cuda: tuple[str, ...] = (), proc_root: str = "/proc",
         sys_root: str = "/sys", modules_root: str = "/lib/modules") -> int:
    """Print every check and the verdict; exit code 1 when a required check failed, else 0."""
    checks = run_checks(nccl, cuda, proc_root, sys_root, modules_root)
    for chk in checks:
        print(chk.line())
    failed = [chk.name for chk in checks if chk.required and not chk.ok]
    print("ready" if not failed else f"not ready: {', '.join(failed)}")
    return 0 if not failed else 1
