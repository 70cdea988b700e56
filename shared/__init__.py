"""The wire contract between rankecho's node agent and Echo: names, mappings and OTLP helpers.

Both services import this package; neither defines an attribute key or metric name of its own.
"""
