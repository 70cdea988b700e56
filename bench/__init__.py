"""Benchmarks: `make bench` runs every module here and prints medians and side-by-side ratios."""
