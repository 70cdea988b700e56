"""Configuration edges of the MCP surface: the GPU rates file, window parsing, and the CLI's refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from echo_helpers import TEST_TOKEN

from rankecho.echo.mcp.rates import BUNDLED_RATES, RatesError, load_rates
from rankecho.echo.mcp.windows import Anchor, Window, WindowError, parse_window

DAY_NS = 1_796_169_600_000_000_000  # 2026-12-02T00:00:00Z
LATEST_NS = DAY_NS + 52_200 * 10**9  # newest event at 14:30:00
ANCHOR = Anchor(latest_ns=LATEST_NS, latest_day_ns=DAY_NS)


@pytest.mark.parametrize(
    ("model", "rate", "key"),
    [
        ("NVIDIA H100 80GB HBM3", 3.00, "H100"),
        ("NVIDIA A100-SXM4-80GB", 1.80, "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", 1.30, "A100"),
        ("NVIDIA A10", 0.75, "A10"),
        ("NVIDIA L40S", 1.10, "L40S"),
        ("Tesla T4", 0.35, "T4"),
        ("Some Future GPU", 2.00, None),
        (None, 2.00, None),
    ],
)
def test_bundled_rates_match_by_words(model: str | None, rate: float, key: str | None) -> None:
    assert load_rates().rate_for(model) == (rate, key)


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("currency: USD\nper_gpu_hour: {H100: 3}\n", "default_per_gpu_hour"),
        ("default_per_gpu_hour: 1\nper_gpu_hour: [1, 2]\n", "per_gpu_hour"),
        ("default_per_gpu_hour: 1\nper_gpu_hour: {H100: cheap}\n", "per_gpu_hour"),
        ("default_per_gpu_hour: -1\nper_gpu_hour: {H100: 3}\n", "negative"),
        ("{{{", "YAML"),
    ],
)
def test_bad_rates_file_names_the_fix(tmp_path: Path, text: str, fix: str) -> None:
    path = tmp_path / "rates.yaml"
    path.write_text(text)
    with pytest.raises(RatesError, match=fix) as err:
        load_rates(path)
    assert str(path) in str(err.value)
    with pytest.raises(RatesError, match="cannot read"):
        load_rates(tmp_path / "missing.yaml")


def test_bundled_rates_file_documents_itself() -> None:
    text = BUNDLED_RATES.read_text()
    assert "rankecho.gpu.model" in text and "--gpu-rates" in text and "RANKECHO_GPU_RATES" in text


@pytest.mark.parametrize(
    ("text", "window"),
    [
        (None, Window(None, None)),
        ("  ", Window(None, None)),
        ("all", Window(None, None)),
        ("last 5m", Window(LATEST_NS - 300 * 10**9, LATEST_NS + 1)),
        ("LAST 90 s", Window(LATEST_NS - 90 * 10**9, LATEST_NS + 1)),
        ("last 1.5h", Window(LATEST_NS - 5400 * 10**9, LATEST_NS + 1)),
        ("14:30-14:35", Window(DAY_NS + 52_200 * 10**9, DAY_NS + 52_500 * 10**9)),
        ("9:05-9:06", Window(DAY_NS + 32_700 * 10**9, DAY_NS + 32_760 * 10**9)),
        (
            "2026-12-02T14:30:00+02:00/2026-12-02T12:35:00Z",
            Window(DAY_NS + 45_000 * 10**9, DAY_NS + 45_300 * 10**9),
        ),
    ],
)
def test_window_forms(text: str | None, window: Window) -> None:
    assert parse_window(text, ANCHOR) == window


@pytest.mark.parametrize(
    "text", ["yesterday", "last week", "25:00-26:00", "14:35-14:30", "a/b", "2026-12-02/2026-12-01"]
)
def test_bad_windows_list_the_accepted_forms(text: str) -> None:
    with pytest.raises(WindowError, match="accepted window forms"):
        parse_window(text, ANCHOR)


def test_relative_windows_on_an_empty_store_mean_everything() -> None:
    empty = Anchor(None, None)
    assert parse_window("last 5m", empty) == Window(None, None) == parse_window("14:30-14:35", empty)


def _rankecho(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankecho", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_mcp_cli_refuses_a_missing_store_and_a_bad_rates_file(tmp_path: Path) -> None:
    missing = _rankecho("mcp", "--db", str(tmp_path / "nope.db"))
    assert (
        missing.returncode == 1 and "no database file" in missing.stderr and "Traceback" not in missing.stderr
    )
    bad = tmp_path / "rates.yaml"
    bad.write_text("nonsense: true\n")
    rates = _rankecho("mcp", "--db", str(tmp_path / "nope.db"), "--gpu-rates", str(bad))
    assert rates.returncode == 1 and "per_gpu_hour" in rates.stderr
    env = {**os.environ, "RANKECHO_GPU_RATES": str(bad)}  # the fallback when --gpu-rates is not given
    from_env = _rankecho("mcp", "--db", str(tmp_path / "nope.db"), env=env)
    assert from_env.returncode == 1 and "per_gpu_hour" in from_env.stderr


def test_serve_stops_on_a_bad_rates_file(tmp_path: Path) -> None:
    env = {**os.environ, "RANKECHO_TOKEN": TEST_TOKEN, "RANKECHO_GPU_RATES": str(tmp_path / "missing.yaml")}
    done = _rankecho(
        "serve",
        "--db",
        str(tmp_path / "echo.db"),
        "--otlp-grpc",
        "127.0.0.1:0",
        "--otlp-http",
        "127.0.0.1:0",
        "--mcp-http",
        "127.0.0.1:0",
        env=env,
    )
    assert done.returncode == 2 and "cannot read GPU rates file" in done.stderr
