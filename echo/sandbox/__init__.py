"""Callers' SQL (``fleet.cluster.run_analysis``, ``rankecho query``) runs here, in worker processes
with hard memory and time limits; see :mod:`rankecho.echo.sandbox.pool`."""

from rankecho.echo.sandbox.pool import Sandbox, SandboxLimits

__all__ = ["Sandbox", "SandboxLimits"]
