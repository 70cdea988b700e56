"""The agent's own resource attributes, read once from its environment (Kubernetes downward API, OTel).

In Kubernetes the chart gives the agent ``K8S_NODE_NAME``, ``K8S_POD_NAME``, ``K8S_NAMESPACE_NAME``
and ``OTEL_RESOURCE_ATTRIBUTES`` (OTel's ``key=value,key=value``, values percent-encoded). Precedence,
lowest first: ``OTEL_RESOURCE_ATTRIBUTES``, then the ``K8S_*`` variables, then the agent's explicit
settings (cluster and node id, applied by :mod:`rankecho.agent.settings`).

Attributes that name the agent's *own* pod (:func:`pod_scoped`) describe only the agent's resource:
a traced process carries the pod of its own environment, never the agent's.

    attrs = from_env(os.environ)   # {"k8s.node.name": "gpu-7", "k8s.pod.name": "rankecho-agent-x2x", ...}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import unquote

from rankecho.shared import contract as c

OTEL_ENV = "OTEL_RESOURCE_ATTRIBUTES"
K8S_ENV = {
    c.NODE_NAME: "K8S_NODE_NAME",
    c.K8S_POD_NAME: "K8S_POD_NAME",
    c.K8S_NAMESPACE_NAME: "K8S_NAMESPACE_NAME",
}
POD_PREFIXES = ("k8s.pod.", "k8s.container.")

log = logging.getLogger("rankecho.agent")


def parse_otel(text: str) -> dict[str, str]:
    """Parse OTel's ``OTEL_RESOURCE_ATTRIBUTES``: comma-separated ``key=value``, blanks around each
    trimmed, key and value percent-decoded; a later duplicate key wins. Raises ValueError naming the
    first malformed pair (no ``=`` or an empty key)."""
    out: dict[str, str] = {}
    for pair in text.split(","):
        if not pair.strip():
            continue
        key, sep, value = pair.partition("=")
        key = unquote(key.strip())
        if not sep or not key:
            raise ValueError(
                f"{OTEL_ENV}: {pair.strip()!r} is not key=value; write key=value pairs separated by commas, "
                "percent-encoding ',', '=' and non-ASCII characters in values"
            )
        out[key] = unquote(value.strip())
    return out


def from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The agent's resource attributes from ``env``. A malformed ``OTEL_RESOURCE_ATTRIBUTES`` is
    discarded as a whole (as the OTel specification asks) with one warning naming the bad pair."""
    attrs: dict[str, str] = {}
    try:
        attrs.update(parse_otel(env.get(OTEL_ENV, "")))
    except ValueError as err:
        log.warning("ignoring %s: %s", OTEL_ENV, err)
    for key, var in K8S_ENV.items():
        if env.get(var, "").strip():
            attrs[key] = env[var].strip()
    return attrs


def pod_scoped(key: str) -> bool:
    """True for keys that describe one pod (its name, namespace, containers), not the node or job."""
    return key == c.K8S_NAMESPACE_NAME or key.startswith(POD_PREFIXES)


def split(attrs: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(attributes for every resource the agent sends, attributes for the agent's own resource only)."""
    own = {k: v for k, v in attrs.items() if pod_scoped(k)}
    return {k: v for k, v in attrs.items() if k not in own}, own
