"""A stand-in for ``helm template`` for the chart in ``helm/rankecho``, used by the chart's tests.

Go templates cannot be rendered faithfully here, so ``flatten`` does the least that lets YAML parse:
lines holding only template actions are dropped, ``{{ .Values.a.b }}`` (optionally ``| quote``, or inside
``printf "..." .Values.x | quote``) becomes its value from values.yaml, and any other action becomes
``TEMPLATED``. What survives is the chart's fixed structure, which is what the tests pin.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "rankecho"
TEMPLATES = CHART / "templates"
PLACEHOLDER = "TEMPLATED"

_COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.S)
_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
VALUES_REF = re.compile(r"\$?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
_PLAIN_REF = re.compile(r"^\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\s*\|\s*quote)?$")
_INCLUDE_LINE = re.compile(r'\{\{-?\s*include\s+"([^"]+)"\s+.*\|\s*nindent\s+(\d+)\s*-?\}\}')
_PRINTF_REF = re.compile(r'^printf\s+"([^"]*)"\s+\.Values((?:\.[A-Za-z_]\w*)+)\s*\|\s*quote$')


def values() -> dict[str, Any]:
    data = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(data, dict)
    return data


def lookup(tree: dict[str, Any], dotted: str) -> Any:
    """The value at ``a.b.c``; KeyError names the first missing segment."""
    node: Any = tree
    for part in dotted.strip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"{dotted}: no key {part!r}")
        node = node[part]
    return node


def _inline(expr: str, vals: dict[str, Any], helpers: dict[str, str]) -> str:
    plain = _PLAIN_REF.match(expr)
    if plain:
        value = lookup(vals, plain.group(1))
        return json.dumps(str(value)) if plain.group(2) else str(value)
    printf = _PRINTF_REF.match(expr)
    if printf:
        text = re.sub(r"%[vsd]", str(lookup(vals, printf.group(2))), printf.group(1), count=1)
        return json.dumps(text)
    include = re.fullmatch(r'include\s+"([^"]+)"\s+\.', expr)
    if include and "{{" not in helpers.get(include.group(1), "{{"):
        return helpers[include.group(1)]
    return PLACEHOLDER


def helper_bodies() -> dict[str, str]:
    """``define`` name -> body, from templates/_helpers.tpl."""
    text = _COMMENT.sub("", (TEMPLATES / "_helpers.tpl").read_text())
    bodies = {}
    for chunk in re.split(r"\{\{-?\s*define\s+", text)[1:]:
        head = re.match(r'"([^"]+)"\s*-?\}\}(.*)', chunk, re.S)
        assert head, f"unreadable define in _helpers.tpl: {chunk[:60]!r}"
        bodies[head.group(1)] = head.group(2)[: head.group(2).rindex("{{")]
    return bodies


def _condition(expr: str, vals: dict[str, Any]) -> bool | None:
    """Truth of ``[not] .Values.a.b`` as Go templates judge it (missing is false); None otherwise."""
    match = re.fullmatch(r"(not\s+)?\$?\.Values((?:\.\w+)+)", expr.strip())
    if not match:
        return None
    try:
        value = lookup(vals, match.group(2))
    except KeyError:
        value = None
    return bool(value) != bool(match.group(1))


def flatten(text: str, vals: dict[str, Any], helpers: dict[str, str] | None = None) -> str:
    """The template with actions removed or replaced, as described in the module docstring.

    ``if``/``else``/``with`` on a plain ``[not] .Values.x`` keep only the branch the values select
    (other conditions keep every branch); a line that is only ``include "name" ... | nindent N``
    becomes the flattened helper body indented N.
    """
    out: list[str] = []
    blocks: list[list[bool | None]] = []  # per open block: [condition, branch already taken]
    for line in _COMMENT.sub("", text).splitlines():
        if line.strip() and not _ACTION.sub("", line).strip():
            for action in _ACTION.findall(line):
                word, _, rest = action.partition(" ")
                if word in {"if", "with"}:
                    blocks.append([_condition(rest, vals), None])
                elif word in {"range", "define"}:
                    blocks.append([None, None])
                elif word == "else" and blocks:
                    cond, _ = top = blocks[-1]
                    taken = cond is True or top[1] is True
                    new = _condition(rest[3:], vals) if rest.startswith("if ") else True
                    top[:] = [False if taken else (None if cond is None else new), taken]
                elif word == "end" and blocks:
                    blocks.pop()
            if any(cond is False for cond, _ in blocks):
                continue
            inc = _INCLUDE_LINE.fullmatch(line.strip())
            if inc and helpers and inc.group(1) in helpers:
                body = flatten(helpers[inc.group(1)], vals, helpers)
                out.extend(" " * int(inc.group(2)) + b for b in body.splitlines() if b.strip())
            continue
        if any(cond is False for cond, _ in blocks):
            continue
        out.append(_ACTION.sub(lambda m: _inline(m.group(1), vals, helpers or {}), line))
    return "\n".join(out) + "\n"


def manifests(vals: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every object the chart defines, flattened and parsed, keyed by kind (plus name suffix if repeated)."""
    vals, helpers = vals or values(), helper_bodies()
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(TEMPLATES.glob("*.yaml")):
        for doc in yaml.safe_load_all(flatten(path.read_text(), vals, helpers)):
            if doc is None:
                continue
            key = doc["kind"]
            if key in found:
                key = f"{key}/{doc['metadata']['name']}"
            found[key] = doc
    return found


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    (only,) = manifest["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def leaf_paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every value in ``tree`` that is not itself a mapping (lists count as leaves)."""
    paths = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths.extend(leaf_paths(value, path + "."))
        else:
            paths.append(path)
    return paths


def env_of(ctr: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's env entries by name."""
    return {e["name"]: e for e in ctr["env"]}


def with_tls() -> dict[str, Any]:
    """values.yaml with ``tls.secretName`` set."""
    vals = values()
    vals["tls"]["secretName"] = "echo-tls"
    return vals


def flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in a container's args, or None."""
    return args[args.index(name) + 1] if name in args else None


# --- With a helm binary --------------------------------------------------------------------------
needs_helm = pytest.mark.skipif(shutil.which("helm") is None, reason="no helm binary on PATH")


def helm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["helm", *argv], capture_output=True, text=True, timeout=60, check=False)


def helm_template(*sets: str) -> dict[str, dict[str, Any]]:
    """``helm template`` of the chart with ``--set`` for each of ``sets``, keyed like ``manifests``."""
    argv = ["template", "t", str(CHART)]
    for item in sets:
        argv += ["--set", item]
    done = helm(*argv)
    assert done.returncode == 0, done.stderr
    found: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(done.stdout):
        if doc:
            key = doc["kind"] if doc["kind"] not in found else f"{doc['kind']}/{doc['metadata']['name']}"
            found[key] = doc
    return found
