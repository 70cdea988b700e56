"""The per-node agent: eBPF probes on libnccl/libcudart/the scheduler, shipped as OTLP to Echo."""
