"""Echo's DuckDB store: the file lock, schema migrations, the single writer and the read API."""
