"""Stacks as a pprof profile (``profile.proto`` of github.com/google/pprof, gzipped), for ``rankecho stacks
--format pprof``.

The few messages the format needs (Profile, ValueType, Sample, Label, Location, Line, Function) are built
at import from a ``descriptor_pb2.FileDescriptorProto`` with the protobuf runtime rankecho already ships
(``google.protobuf``, for OTLP), and turned into classes by ``message_factory``: no generated module to
keep in step with a protoc version, no new dependency, and the field numbers below are the format's own
(profile.proto is stable: fields are only ever added). Fields left out (mappings, addresses, drop/keep
frames) are optional in the format. One sample per stack: its time in nanoseconds (sample type
``time/nanoseconds``), locations leaf first, a ``category`` label with the cause class it carried.

Usage::

    data = encode([Weighted(frames=["cudaMalloc", "allocate_cache"], ns=40_000_000, category="allocator")])
    Profile = profile_class(); p = Profile(); p.ParseFromString(gzip.decompress(data))
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "perftools.profiles"
_PY_FRAME = re.compile(r"^(?P<file>[^:]+):(?P<function>[^:]+):(?P<line>\d+)$")
"""A Python frame as the agents write it: ``<file basename>:<function>:<line>``."""

_F = descriptor_pb2.FieldDescriptorProto
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    # name: [(field, number, type, label, message type or '')]
    "ValueType": [
        ("type", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("unit", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "Label": [
        ("key", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("str", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("num", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("num_unit", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "Sample": [
        ("location_id", 1, _F.TYPE_UINT64, _F.LABEL_REPEATED, ""),
        ("value", 2, _F.TYPE_INT64, _F.LABEL_REPEATED, ""),
        ("label", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Label"),
    ],
    "Line": [
        ("function_id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
        ("line", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "Location": [
        ("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
        ("mapping_id", 2, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
        ("address", 3, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
        ("line", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Line"),
    ],
    "Function": [
        ("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
        ("name", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("system_name", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("filename", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("start_line", 5, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "Profile": [
        ("sample_type", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ValueType"),
        ("sample", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Sample"),
        ("location", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Location"),
        ("function", 5, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Function"),
        ("string_table", 6, _F.TYPE_STRING, _F.LABEL_REPEATED, ""),
        ("time_nanos", 9, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("duration_nanos", 10, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("period_type", 11, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "ValueType"),
        ("period", 12, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("default_sample_type", 14, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
}


@dataclass(frozen=True)
class Weighted:
    """One stack (frames innermost first) and the time it carried."""

    frames: Sequence[str]
    ns: int
    category: str | None = None


@cache
def _classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="rankecho_profile.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            f = message.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".{PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _MESSAGES
    }


def profile_class() -> Any:
    """The ``perftools.profiles.Profile`` message class (to decode what :func:`encode` wrote)."""
    return _classes()["Profile"]


def encode(stacks: Sequence[Weighted], time_nanos: int = 0, duration_nanos: int = 0) -> bytes:
    """The gzipped profile of ``stacks``: one sample each, value = its ns."""
    Profile = profile_class()
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    profile = Profile(time_nanos=time_nanos, duration_nanos=duration_nanos, period=1)
    profile.sample_type.add(type=s("time"), unit=s("nanoseconds"))
    profile.period_type.type, profile.period_type.unit = s("time"), s("nanoseconds")
    functions: dict[tuple[str, str], int] = {}  # (name, file): one function, a location per line in it
    locations: dict[str, int] = {}
    for stack in stacks:
        ids = []
        for frame in stack.frames:
            if frame not in locations:
                m = _PY_FRAME.match(frame)
                name, filename, line = (m["function"], m["file"], int(m["line"])) if m else (frame, "", 0)
                if (name, filename) not in functions:
                    functions[name, filename] = fid = len(functions) + 1
                    profile.function.add(id=fid, name=s(name), system_name=s(name), filename=s(filename))
                locations[frame] = lid = len(locations) + 1
                profile.location.add(id=lid).line.add(function_id=functions[name, filename], line=line)
            ids.append(locations[frame])
        sample = profile.sample.add(location_id=ids, value=[stack.ns])
        if stack.category:
            sample.label.add(key=s("category"), str=s(stack.category))
    profile.string_table.extend(strings)  # dict order = index order
    return gzip.compress(profile.SerializeToString())
