"""Tools that start rankecho as real processes, the way an operator would: ``rankecho serve``
(:mod:`rankecho.launch.echo`) and ``rankecho stress`` / ``rankecho query`` (:mod:`rankecho.launch.stress`).

Used by ``rankecho demo``, the tests and the benchmarks, so it ships with the package (the demo must run
from an installed wheel); not part of the server. Simulated clusters and their agents are started by
:mod:`rankecho.sim.launcher`.
"""
