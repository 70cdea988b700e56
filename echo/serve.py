"""``rankecho serve``: run :class:`echo.app.Echo` until SIGTERM/SIGINT, then drain and exit.

Exit codes: 0 clean stop, 2 bad configuration, 3 store held by another Echo.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from echo.app import Echo
from echo.settings import SettingsError, settings_from_args
from echo.store.lock import StoreLockedError

log = logging.getLogger("echo")


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"rankecho serve: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    echo = Echo(settings)
    try:
        echo.start()
    except StoreLockedError as exc:
        print(f"rankecho serve: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"rankecho serve: cannot start: {exc}", file=sys.stderr)
        return 2
    print(echo.listening_line(), flush=True)
    log.info("Echo ready: %s", echo.listening_line())
    stop.wait()
    log.info("stopping: draining the write queue")
    echo.stop()
    log.info("stopped; every acknowledged event is committed")
    return 0
