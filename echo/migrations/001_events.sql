-- Schema v1: one row per OTLP data point, span or log record.
-- The seed's columns (timestamp_ns, cluster_id, node_id, metric_name, rank, nranks, value_double,
-- value_int, attrs_json) keep their names so the seed's four queries run verbatim.
CREATE TABLE events (
    event_id        VARCHAR PRIMARY KEY, -- producer's rankecho.event_id, else a content hash
    timestamp_ns    BIGINT  NOT NULL,  -- event time, Unix epoch nanoseconds
    received_ns     BIGINT  NOT NULL,  -- when Echo decoded it, Unix epoch nanoseconds
    signal          VARCHAR NOT NULL,  -- 'metric' | 'span' | 'log'
    cluster_id      VARCHAR,
    node_id         VARCHAR,
    metric_name     VARCHAR NOT NULL,  -- metric name, span name, or log event name / body
    rank            INTEGER,
    nranks          INTEGER,
    value_double    DOUBLE,
    value_int       BIGINT,
    causal_chain_id VARCHAR,           -- copy of attrs_json.causal_chain_id, for cross-rank joins
    attrs_json      VARCHAR            -- every other resource and point attribute, as a JSON object
);
CREATE INDEX events_cluster_time ON events (cluster_id, timestamp_ns);
CREATE INDEX events_node_time ON events (node_id, timestamp_ns);
