"""``rankecho stress``: concurrent OTLP producers with exactly planted stragglers and causal-chain markers.

The planting rule lives in :mod:`echo.stress.planting`, encoding in :mod:`echo.stress.encode`, the
retry decision in :mod:`shared.retry`, transports in :mod:`echo.stress.senders`, the producer
loop in :mod:`echo.stress.runner`. The tests, the demo and the benchmarks run it as a process through
:mod:`bench.launch`. See ``docs/stress.md``.
"""
