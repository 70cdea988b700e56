"""``rankecho stress``: concurrent OTLP producers with exactly planted stragglers and causal-chain markers.

The planting rule lives in :mod:`rankecho.stress.planting`, encoding in :mod:`rankecho.stress.encode`, the
retry decision in :mod:`rankecho.shared.retry`, transports in :mod:`rankecho.stress.senders`, the producer
loop in :mod:`rankecho.stress.runner`. The tests, the demo and the benchmarks run it as a process through
:mod:`rankecho.launch`. See ``docs/stress.md``.
"""
