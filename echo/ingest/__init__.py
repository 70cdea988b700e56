"""OTLP receivers: decode requests into rows and hand them to the store's single writer."""
