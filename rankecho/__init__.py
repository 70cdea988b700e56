"""rankecho: find the GPU rank that stalls a distributed job when every host looks healthy."""

__version__ = "0.1.0"
