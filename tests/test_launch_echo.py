"""The one Echo launcher (``rankecho.launch.echo.EchoProcess``) run from another checkout: benchmarks
compare two revisions side by side (``python -m bench ingest --against DIR``), so the child must import
that checkout's ``rankecho``, not the installed one."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rankecho.launch.echo import EchoProcess

FAKE_MAIN = textwrap.dedent('''
    import json, signal, sys, time
    import rankecho
    print(json.dumps({"listening": {"otlp_grpc": "127.0.0.1:4317", "package": rankecho.__file__,
                                    "argv": sys.argv[1:]}}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.1)
''')


def test_source_runs_that_checkouts_rankecho(tmp_path: Path) -> None:
    other = tmp_path / "other-checkout"
    (other / "rankecho").mkdir(parents=True)
    (other / "rankecho" / "__init__.py").write_text("")
    (other / "rankecho" / "__main__.py").write_text(FAKE_MAIN)
    with EchoProcess(tmp_path / "e.db", token="t", source=other) as echo:
        assert echo.listening["package"] == str(other / "rankecho" / "__init__.py")
        assert echo.listening["argv"][:3] == ["serve", "--db", str(tmp_path / "e.db")]
    assert echo.proc is not None and echo.proc.returncode == 0  # stopped by SIGTERM, cleanly
    with EchoProcess(tmp_path / "f.db", token="t", source=None) as installed:  # the real one, as before
        assert installed.otlp_grpc.startswith("127.0.0.1:")
