"""The container image, built for real from the Dockerfile and run: what a pod would start.

The image is built once per session with ``scripts/build-image.sh --debootstrap --chroot`` (the base
``debian:12-slim`` made with debootstrap from Debian's archive, so no container registry is needed; the
rootfs tarball is cached per day under build/image/ and podman's layer cache makes reruns take seconds)
and its commands run through ``scripts/build-image.sh run-chroot`` (``podman image mount`` + chroot with the
image's user and environment), because ``podman run`` cannot start containers on every host that runs
these tests. A first build takes about 2 min for debootstrap plus 1.5 min for the image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import rankecho
from rankecho.agent.check import ebpf_missing
from rankecho.launch.echo import EchoProcess

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "build-image.sh"
IMAGE = "localhost/rankecho:test"
TOKEN = "image-test-token"
BUILD_TIMEOUT_S = 900


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "building and chroot-running the image needs root"
    for tool in ("podman", "debootstrap", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup-host.sh installs it)"
    return None


pytestmark = [
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
    pytest.mark.slow,
    pytest.mark.timeout(BUILD_TIMEOUT_S + 120),
]


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """The image's tag, built once for the whole session; its mount is released at the end."""
    start = time.monotonic()
    done = subprocess.run([str(SCRIPT), "--debootstrap", "--chroot", "--tag", IMAGE], capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"image build failed:\n{done.stderr[-4000:]}"
    assert done.stdout.strip() == IMAGE
    print(f"image {IMAGE} built in {time.monotonic() - start:.0f} s")
    yield IMAGE
    # run-chroot mounted it once per command; --force drops every one of those mounts.
    subprocess.run(["podman", "image", "unmount", "--force", IMAGE], capture_output=True, timeout=60,
                   check=False)


def run_in(image: str, *command: str, options: tuple[str, ...] = (),
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``command`` run from the image (as its default user unless ``options`` says ``--user``)."""
    return subprocess.run([str(SCRIPT), "run-chroot", image, *options, "--", *command],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_the_image_runs_rankecho_and_holds_only_the_runtime_packages(image: str) -> None:
    done = run_in(image, "rankecho", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"rankecho {rankecho.__version__}"
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
             "('rankecho.stress.cli', 'rankecho.echo.serve', 'rankecho.agent.runner', 'rankecho.sim', "
             "'bcc', 'bench', 'tests', 'echo', 'stress')}))")
    done = run_in(image, "python3", "-c", probe)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "rankecho.stress.cli": True, "rankecho.echo.serve": True, "rankecho.agent.runner": True,
        "rankecho.sim": True, "bcc": True, "bench": False, "tests": False, "echo": False, "stress": False,
    }
    assert run_in(image, "id", "-u").stdout.strip() == "10001", "the image's default user is Echo's uid"
    assert run_in(image, "test", "!", "-e", "/src").returncode == 0, "the build stage's tree stays out"


class ImageEcho(EchoProcess):
    """``rankecho serve`` from the image, as its default user (uid 10001), the store on ``data``."""

    def __init__(self, image: str, data: Path) -> None:
        super().__init__(data / "echo.db", token=TOKEN, log=data.parent / "echo.log")
        self.image = image
        self.host_data = data

    def command(self) -> list[str]:
        serve = super().command()[3:]  # past "python -m rankecho"
        serve[serve.index(str(self.db))] = "/data/echo.db"
        return [str(SCRIPT), "run-chroot", self.image, "--volume", f"{self.host_data}:/data",
                "--env", "RANKECHO_TOKEN", "--", "rankecho", *serve]


def test_serve_from_the_image_gets_ready_as_uid_10001_and_exits_0_on_sigterm(image: str,
                                                                            tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 10001, 10001)  # what the chart's fsGroup does for the volume
    echo = ImageEcho(image, data).start()
    try:
        with urllib.request.urlopen(f"http://{echo.listening['otlp_http']}/readyz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        code = echo.stop(timeout_s=30)
    assert code == 0, echo.log.read_text()[-3000:]
    assert (data / "echo.db").stat().st_uid == 10001
    assert "stopped; every acknowledged event is committed" in echo.log.read_text()


def test_agent_check_from_the_image_runs_as_root_with_the_charts_host_mounts(image: str) -> None:
    binds = ("--user", "0", "--volume", "/lib/modules:/lib/modules", "--volume", "/usr/src:/usr/src")
    done = run_in(image, "rankecho", "agent", "check", options=binds)
    assert "Traceback" not in done.stderr, done.stderr
    assert "[ok  ] bcc: python bcc bindings importable" in done.stdout, done.stdout
    assert "[ok  ] privileges: euid 0" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    if ebpf_missing() is None:  # this host can run the agent, so the image must say so too
        assert (done.returncode, last) == (0, "ready"), done.stdout
    else:
        assert done.returncode == 1 and last.startswith("not ready"), done.stdout
