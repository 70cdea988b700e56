"""Echo: the cluster-wide OTLP store in DuckDB and the MCP investigation surface."""
