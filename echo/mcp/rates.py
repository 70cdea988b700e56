"""GPU hourly rates for cost estimates, from a documented YAML file (bundled default: gpu_rates.yaml).

Usage::

    rates = load_rates()                       # or load_rates(Path("my_rates.yaml"))
    rates.rate_for("NVIDIA H100 80GB HBM3")    # -> (3.0, "H100")
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

BUNDLED_RATES = Path(__file__).resolve().parent / "gpu_rates.yaml"


class RatesError(ValueError):
    """The rates file is missing or malformed; the message names the file and the expected shape."""


@dataclass(frozen=True)
class Rates:
    currency: str
    default_per_gpu_hour: float
    per_gpu_hour: dict[str, float]
    source: str

    def rate_for(self, gpu_model: str | None) -> tuple[float, str | None]:
        """(rate, matched key): the key whose words all occur in ``gpu_model``, most words winning
        ("A100 80GB" matches "NVIDIA A100-SXM4-80GB"; "A10" does not match an A100); else the default."""
        if gpu_model:
            words = set(_words(gpu_model))
            hits = [key for key in self.per_gpu_hour if set(_words(key)) <= words and _words(key)]
            if hits:
                key = max(hits, key=lambda k: (len(_words(k)), len(k)))
                return self.per_gpu_hour[key], key
        return self.default_per_gpu_hour, None


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def load_rates(path: Path | None = None) -> Rates:
    """Read and validate a rates file; raise :class:`RatesError` saying what to fix."""
    path = path or BUNDLED_RATES
    shape = "expected keys currency, default_per_gpu_hour (number), per_gpu_hour (model: number)"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RatesError(f"cannot read GPU rates file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RatesError(f"GPU rates file {path} is not valid YAML ({exc}); {shape}") from None
    if not isinstance(data, dict) or not isinstance(data.get("per_gpu_hour"), dict):
        raise RatesError(f"GPU rates file {path}: {shape}")
    try:
        table = {str(k): float(v) for k, v in data["per_gpu_hour"].items()}
        default = float(data["default_per_gpu_hour"])
    except (KeyError, TypeError, ValueError):
        raise RatesError(f"GPU rates file {path}: {shape}") from None
    if default < 0 or any(v < 0 for v in table.values()):
        raise RatesError(f"GPU rates file {path}: rates must not be negative")
    return Rates(str(data.get("currency", "USD")), default, table, path.name)
