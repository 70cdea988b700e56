"""Tools that start rankecho as real processes, the way an operator would: ``rankecho serve``
(:mod:`bench.launch.echo`) and ``rankecho stress`` / ``rankecho query`` (:mod:`bench.launch.stress`).

Used by the tests, the demo and the benchmarks; not part of the server. (Simulated clusters and their
agents are started by :mod:`sim`.) ``python -m bench`` runs modules, not packages, so this is no benchmark.
"""
