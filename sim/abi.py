"""ctypes views of the by-value structs in the simulated libraries' headers (sim/include/), for Python
code that calls libnccl/libcudart directly (the ABI and cross-process tests): written once here."""

from __future__ import annotations

import ctypes

NCCL_UNIQUE_ID_BYTES = 128
"""sim/include/nccl.h; the agent copies the same 128 bytes off the stack (RK_PAYLOAD)."""


class UniqueId(ctypes.Structure):
    """``ncclUniqueId``: passed by value, so it travels on the stack above the return address."""

    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


class Dim3(ctypes.Structure):
    """CUDA's ``dim3`` (cudaLaunchKernel's grid and block sizes, passed by value in registers)."""

    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
