-- Schema v6: `events` without its per-row string key and its two secondary indexes.
-- The primary key on event_id kept an ART index of ~49 bytes per row resident in memory, growing with
-- the store, never evicted and counted against memory_limit (../shared notes: 466 MiB at 10M rows);
-- the (cluster_id, timestamp_ns) and (node_id, timestamp_ns) indexes cost about as much again on disk
-- while every query range-scans by time, which the row groups' zone maps already prune. Resends are
-- now found by an anti-join on the batch's own time span (echo/store/writer.py). The table is rebuilt:
-- DuckDB cannot drop a primary key in place.
CREATE TABLE events_unkeyed (
    event_id        VARCHAR NOT NULL,  -- producer's rankecho.event_id, else a content hash (unique per time)
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
INSERT INTO events_unkeyed SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_unkeyed RENAME TO events;
