"""``agent check``'s frame-pointer heuristic on real binaries built here with and without them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rankecho.agent.check import check_frame_pointers
from rankecho.agent.framepointers import push_rbp_share

SOURCE = "\n".join(
    f"extern int sink(int);\nint f{i}(int x) {{ int y = sink(x + {i}); return sink(y * {i + 2}) + y; }}"
    for i in range(24)
)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    tmp = tmp_path_factory.mktemp("fp")
    (tmp / "lib.c").write_text(SOURCE + "\nint sink(int x) { return x ^ 5; }\n")
    out = {}
    for name, flags in (("fp", ["-fno-omit-frame-pointer"]), ("nofp", ["-fomit-frame-pointer"]),
                        ("fp-cet", ["-fno-omit-frame-pointer", "-fcf-protection=full"])):
        out[name] = tmp / f"lib{name}.so"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *flags, "-o", str(out[name]), str(tmp / "lib.c")],
                       check=True)
    return out


def test_the_share_of_push_rbp_entries_tells_the_builds_apart(builds: dict[str, Path]) -> None:
    assert push_rbp_share(str(builds["fp"])).has_frame_pointers is True
    assert push_rbp_share(str(builds["fp-cet"])).has_frame_pointers is True  # endbr64; push %rbp
    without = push_rbp_share(str(builds["nofp"]))
    assert without.functions >= 24 and without.has_frame_pointers is False


def test_agent_check_names_the_binary_without_frame_pointers_and_the_fix(builds: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()  # no processes: only the files given are checked
    chk = check_frame_pointers(str(tmp_path / "proc"), cuda=(str(builds["nofp"]), str(builds["fp"])))
    assert not chk.ok and not chk.required
    assert str(builds["nofp"]) in chk.detail and str(builds["fp"]) not in chk.detail.split("without:")[1]
    assert "-fno-omit-frame-pointer" in chk.fix and "-X perf" in chk.fix
    good = check_frame_pointers(str(tmp_path / "proc"), cuda=(str(builds["fp"]),))
    assert good.ok
