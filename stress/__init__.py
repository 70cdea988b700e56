"""``rankecho stress``: concurrent OTLP producers with exactly planted stragglers and causal-chain markers.

The planting rule lives in :mod:`stress.planting`, encoding in :mod:`stress.encode`, the
retry decision in :mod:`shared.retry`, transports in :mod:`stress.senders`, the producer
loop in :mod:`stress.runner`. The tests, the demo and the benchmarks run it as a process through
:mod:`bench.launch`. See ``docs/stress.md``.
"""
