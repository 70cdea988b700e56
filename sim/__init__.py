"""A GPU cluster on a machine without GPUs: fake libnccl/libcudart and a multi-rank launcher."""
