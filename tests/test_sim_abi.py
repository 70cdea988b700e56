"""The simulated libcudart/libnccl export the real names, versions and ABI, and behave like a GPU.

Calls go through ctypes, which follows the x86-64 calling convention on its own (dim3 in
registers, the 128-byte ncclUniqueId on the stack), so a wrong signature shows up as a wrong
result here.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankecho.sim.abi import Dim3, UniqueId
from rankecho.sim.launcher import SIM_ROOT, build_libs

BUILD = SIM_ROOT / "build"
CUDA_NAMES = [
    "cudaSetDevice",
    "cudaGetDeviceCount",
    "cudaStreamCreate",
    "cudaLaunchKernel",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventRecord",
    "cudaEventSynchronize",
    "cudaMalloc",
    "cudaFree",
    "cudaMemcpy",
    "cudaMemcpyAsync",
]
NCCL_NAMES = [
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitAll",
    "ncclCommSplit",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommUserRank",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclReduce",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
]


@pytest.fixture(scope="module")
def libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    build_libs()
    cudart = ctypes.CDLL(str(BUILD / "libcudart.so.12"))
    nccl = ctypes.CDLL(str(BUILD / "libnccl.so.2"))
    cudart.cudaLaunchKernel.argtypes = [
        ctypes.c_void_p,
        Dim3,
        Dim3,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
    ]
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    # ncclSend(buff, count, datatype, peer, comm, stream); ncclAllReduce has a receive buffer first
    # and the reduction op where ncclSend has the peer
    nccl.ncclSend.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                              ctypes.c_void_p]  # fmt: skip
    nccl.ncclRecv.argtypes = nccl.ncclSend.argtypes
    nccl.ncclAllReduce.argtypes = [ctypes.c_void_p, *nccl.ncclSend.argtypes]
    return cudart, nccl


def dyn_syms(path: Path) -> str:
    return subprocess.run(
        ["readelf", "-W", "--dyn-syms", str(path)], capture_output=True, text=True, check=True
    ).stdout


def soname(path: Path) -> str:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return next(line.split("[")[1].rstrip("]") for line in out.splitlines() if "SONAME" in line)


def test_real_names_versions_and_sonames(libs: object) -> None:
    for build in ("build", "build-endbr"):
        cudart, nccl = SIM_ROOT / build / "libcudart.so.12", SIM_ROOT / build / "libnccl.so.2"
        assert soname(cudart) == "libcudart.so.12"
        assert soname(nccl) == "libnccl.so.2"
        cuda_syms, nccl_syms = dyn_syms(cudart), dyn_syms(nccl)
        for name in CUDA_NAMES:
            assert f" {name}@@libcudart.so.12" in cuda_syms, name
        for name in NCCL_NAMES:
            assert f" {name}\n" in nccl_syms, name  # unversioned, as libnccl exports them
        assert (SIM_ROOT / build / "libcudart.so").resolve() == cudart.resolve()
        assert (SIM_ROOT / build / "libnccl.so").resolve() == nccl.resolve()


# Called on every step: built with frame pointers, they begin with `push %rbp`, which the kernel's
# uprobe code emulates (other first instructions are single-stepped at ~11 us per probe hit).
HOT = ["ncclAllReduce", "ncclReduceScatter", "ncclCommInitRank", "ncclGroupStart", "ncclGroupEnd",
       "cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync", "cudaEventRecord"]


@pytest.mark.parametrize(("build", "endbr"), [("build", False), ("build-endbr", True)])
def test_prologues_with_and_without_endbr64_and_frame_pointers(libs: object, build: str, endbr: bool) -> None:
    code = (
        "import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); "
        "print(' '.join(ctypes.string_at(ctypes.cast(getattr(l, n), ctypes.c_void_p).value, 5).hex() "
        "for n in sys.argv[2:]))"
    )
    for lib, names in (
        ("libnccl.so.2", NCCL_NAMES),
        ("libcudart.so.12", CUDA_NAMES),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, str(SIM_ROOT / build / lib), *names],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        starts = dict(zip(names, out, strict=True))
        assert [h.startswith("f30f1efa") for h in starts.values()] == [endbr] * len(names)
        body = {n: h[8:] if endbr else h for n, h in starts.items()}
        hot = {n: body[n][:2] for n in names if n in HOT}
        assert len(hot) == (5 if lib == "libnccl.so.2" else 4)
        assert hot == dict.fromkeys(hot, "55"), hot  # push %rbp


def test_kernels_are_async_and_sync_blocks_until_the_gpu_is_done(
    libs: tuple[ctypes.CDLL, ctypes.CDLL],
) -> None:
    cudart, _ = libs
    stream = ctypes.c_void_p()
    assert cudart.cudaStreamCreate(ctypes.byref(stream)) == 0
    kernel = ctypes.cast(cudart.cudaFree, ctypes.c_void_p)  # any host address names a kernel
    t0 = time.monotonic()
    for _ in range(3):  # 3 x 15,000 blocks x 1 us/block = 45 ms of GPU time
        assert cudart.cudaLaunchKernel(kernel, Dim3(15000, 1, 1), Dim3(256, 1, 1), None, 0, stream) == 0
    launched = time.monotonic() - t0
    assert cudart.cudaStreamSynchronize(stream) == 0
    synced = time.monotonic() - t0
    assert launched < 0.01
    assert 0.044 <= synced < 0.2
    t1 = time.monotonic()
    assert cudart.cudaStreamSynchronize(stream) == 0  # nothing pending: returns at once
    assert time.monotonic() - t1 < 0.01


def test_events_time_the_gpu_work_between_them(libs: tuple[ctypes.CDLL, ctypes.CDLL]) -> None:
    cudart, _ = libs
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    assert cudart.cudaEventCreate(ctypes.byref(start)) == 0
    assert cudart.cudaEventCreate(ctypes.byref(end)) == 0
    kernel = ctypes.cast(cudart.cudaFree, ctypes.c_void_p)
    assert cudart.cudaEventRecord(start, None) == 0
    assert cudart.cudaLaunchKernel(kernel, Dim3(100, 100, 2), Dim3(1, 1, 1), None, 0, None) == 0  # 20 ms
    assert cudart.cudaEventRecord(end, None) == 0
    assert cudart.cudaEventSynchronize(end) == 0
    ms = ctypes.c_float()
    assert cudart.cudaEventElapsedTime(ctypes.byref(ms), start, end) == 0
    assert 19.9 <= ms.value <= 21.0


def test_malloc_hands_out_device_addresses_and_rejects_bad_frees(
    libs: tuple[ctypes.CDLL, ctypes.CDLL],
) -> None:
    cudart, _ = libs
    cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    cudart.cudaFree.argtypes = [ctypes.c_void_p]
    a, b = ctypes.c_void_p(), ctypes.c_void_p()
    t0 = time.monotonic()
    assert cudart.cudaMalloc(ctypes.byref(a), 200 << 20) == 0  # 200 MiB at 10 GB/s: ~21 ms mapping
    assert time.monotonic() - t0 >= 0.02
    assert cudart.cudaMalloc(ctypes.byref(b), 1) == 0
    assert a.value and b.value and a.value != b.value
    assert cudart.cudaFree(a) == 0
    assert cudart.cudaFree(a) == 1  # double free: cudaErrorInvalidValue
    assert cudart.cudaFree(ctypes.c_void_p(0x1234)) == 1
    assert cudart.cudaGetLastError() == 1 and cudart.cudaGetLastError() == 0
    assert cudart.cudaMalloc(None, 16) == 1
    assert cudart.cudaFree(b) == 0


def test_unique_id_by_value_and_rank_in_the_third_register(libs: tuple[ctypes.CDLL, ctypes.CDLL]) -> None:
    cudart, nccl = libs
    uid = UniqueId()
    assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    assert bytes(uid.internal)[:8] == b"RKSIMID1"
    comm = ctypes.c_void_p()
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 1) == 4  # rank 1 of 1: ncclInvalidArgument
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    rank, count = ctypes.c_int(-1), ctypes.c_int(-1)
    assert nccl.ncclCommUserRank(comm, ctypes.byref(rank)) == 0 and rank.value == 0
    assert nccl.ncclCommCount(comm, ctypes.byref(count)) == 0 and count.value == 1
    # A grouped send/recv to itself completes (no deadlock), a bad datatype is rejected.
    assert nccl.ncclGroupStart() == 0
    assert nccl.ncclSend(None, 1024, 7, 0, comm, None) == 0
    assert nccl.ncclRecv(None, 1024, 7, 0, comm, None) == 0
    assert nccl.ncclGroupEnd() == 0
    assert nccl.ncclAllReduce(None, None, 1024, 99, 0, comm, None) == 4
    t0 = time.monotonic()
    assert nccl.ncclAllReduce(None, None, 1 << 28, 7, 0, comm, None) == 0  # 1 GiB: no transfer with 1 rank
    assert cudart.cudaStreamSynchronize(None) == 0
    assert time.monotonic() - t0 < 0.5
    assert nccl.ncclCommDestroy(comm) == 0
    assert nccl.ncclCommDestroy(None) == 4


def test_init_all_builds_one_communicator_per_device(libs: tuple[ctypes.CDLL, ctypes.CDLL]) -> None:
    cudart, nccl = libs
    comms = (ctypes.c_void_p * 3)()
    assert nccl.ncclCommInitAll(comms, 3, None) == 0
    streams = [ctypes.c_void_p() for _ in range(3)]
    for i, s in enumerate(streams):
        rank, dev = ctypes.c_int(), ctypes.c_int()
        assert nccl.ncclCommUserRank(ctypes.c_void_p(comms[i]), ctypes.byref(rank)) == 0 and rank.value == i
        assert nccl.ncclCommCuDevice(ctypes.c_void_p(comms[i]), ctypes.byref(dev)) == 0 and dev.value == i
        assert cudart.cudaStreamCreate(ctypes.byref(s)) == 0
    assert nccl.ncclGroupStart() == 0
    for i, s in enumerate(streams):  # one thread drives all three ranks, one stream each
        assert nccl.ncclAllReduce(None, None, 1 << 20, 7, 0, ctypes.c_void_p(comms[i]), s) == 0
    assert nccl.ncclGroupEnd() == 0
    for s in streams:
        assert cudart.cudaStreamSynchronize(s) == 0
    assert nccl.ncclCommAbort(ctypes.c_void_p(comms[2])) == 0
    for i in range(2):
        assert nccl.ncclCommDestroy(ctypes.c_void_p(comms[i])) == 0
