"""``rankecho serve``: run :class:`rankecho.echo.app.Echo` until SIGTERM/SIGINT, then drain and exit.

Exit codes (``rankecho.exitcodes``): 0 clean stop, 1 start-up failed (the reason on stderr), 2 bad
configuration or a ``--db`` that cannot hold a store or a busy port (nothing was created), 3 store held
by another process.

Signals are handled from the first instant of this command: the handler is installed before the heavy
imports, and it only sets a flag (:mod:`rankecho.stopflag`, shared with the agent) that the main
thread polls. Found (issue 19): a SIGTERM right after "Echo ready" was lost now and then and Echo was
killed 20 s later. The old handler called ``threading.Event.set()``; the handler runs in the main
thread, which sat inside ``Event.wait()`` holding that Event's internal lock, so ``set()`` deadlocked.
A stop that arrives during start-up lets the start finish (or skips it), then drains as usual.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from rankecho import exitcodes, stopflag

if TYPE_CHECKING:
    from rankecho.echo.app import Service
    from rankecho.echo.settings import Settings

log = logging.getLogger("echo")
GIL_SWITCH_INTERVAL_S = 0.0005
POLL_S = 0.05
"""How often the main thread looks at the stop flag: the most a stop waits before the drain begins."""


def main(args: argparse.Namespace) -> int:
    stop = stopflag.install()  # before anything slow: a stop from here on is a clean one
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return _serve(args, stop)
    finally:
        stopflag.ignore_further()  # a repeated SIGTERM during interpreter exit must not turn 0 into -15


def _serve(args: argparse.Namespace, stop: stopflag.StopFlag) -> int:
    from rankecho.echo.app import Echo
    from rankecho.echo.settings import SettingsError, settings_from_args
    from rankecho.echo.store.location import StorePathError
    from rankecho.echo.store.lock import StoreLockedError
    from rankecho.echo.store.migrate import SchemaTooNewError

    try:
        settings = settings_from_args(args)
        services = _services(settings)
    except (SettingsError, ValueError) as exc:
        print(f"rankecho serve: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    if stop.is_set():
        log.info("stop requested before the store was opened: nothing to drain")
        return exitcodes.OK
    # Receiver threads hold the GIL while decoding; the writer needs it briefly between DuckDB calls
    # and would wait up to the 5 ms default for each. 0.5 ms measured ~10% more points/s.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    echo = Echo(settings, services=services)
    try:
        echo.start()
    except StoreLockedError as exc:
        print(f"rankecho serve: {exc}", file=sys.stderr)
        return exitcodes.STORE_HELD
    except (StorePathError, SchemaTooNewError, OSError) as exc:
        print(f"rankecho serve: cannot start: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except Exception as exc:  # a newcomer gets the reason; the traceback is logged at debug level
        log.debug("start-up failed", exc_info=True)
        print(f"rankecho serve: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exitcodes.FAILED
    if not stop.is_set():
        print(echo.listening_line(), flush=True)
        log.info("Echo ready: %s", echo.listening_line())
    while not stop.wait(POLL_S):
        pass
    log.info("stopping: draining the write queue")
    echo.stop()
    log.info("stopped; every acknowledged event is committed")
    return exitcodes.OK


def _services(settings: Settings) -> list[Service]:
    """Front ends beside the receivers: MCP over streamable HTTP unless ``--mcp-http`` is empty, and the
    diagnosis gauges at /metrics.

    GPU rates for ``fleet.cluster.get_cost`` come from ``--gpu-rates`` / ``$RANKECHO_GPU_RATES`` (a YAML
    file like ``echo/mcp/gpu_rates.yaml``), else the bundled file; a bad file stops startup with the reason.
    """
    from rankecho.echo.diagnosis_metrics import DiagnosisMetricsService
    from rankecho.echo.mcp.http import McpHttpService

    services: list[Service] = [DiagnosisMetricsService(settings.gpu_rates)]  # the diagnosis at /metrics
    if settings.mcp_http is not None:
        services.insert(0, McpHttpService(settings.mcp_http, settings.gpu_rates))
    return services
