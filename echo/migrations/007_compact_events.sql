-- Schema v7: each event stored once (echo/store/typed_events.py, docs/contract.md "How events are stored").
-- A node agent's collective or raw interval lives only in its typed table when the typed row rebuilds it
-- exactly; every other event (other agent points, foreign OTLP, an agent event the typed columns cannot
-- reproduce) lives in events_generic, the seed's row shape. `events` becomes a view over both (created
-- by the migration code after this file: it is generated from the typed field lists).
-- events_generic has no key: the writer skips a resent event by looking its id up among the rows stored
-- in the request's time range (an index over every event id would grow with the store, in memory).
CREATE TABLE events_generic (
    event_id        VARCHAR NOT NULL,  -- producer's rankecho.event_id, else a content hash
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
-- The attributes a typed row does not hold in columns (its process's resource, its thread, a
-- collective's datatype, count and stream, ...), one row per distinct JSON object, cited by attrs_id.
CREATE TABLE attr_sets (
    attrs_id    INTEGER PRIMARY KEY,   -- dense, small: typed rows cite it with a few bits
    attrs_hash  UBIGINT NOT NULL,      -- hash(attrs_json), to find a set without comparing text
    attrs_json  VARCHAR NOT NULL
);
ALTER TABLE collectives ADD COLUMN received_ns BIGINT;
ALTER TABLE collectives ADD COLUMN attrs_id INTEGER;
ALTER TABLE collectives ADD COLUMN in_generic BOOLEAN DEFAULT true;  -- the event's row is in events_generic
ALTER TABLE host_activity ADD COLUMN nranks INTEGER;
ALTER TABLE host_activity ADD COLUMN received_ns BIGINT;
ALTER TABLE host_activity ADD COLUMN value_double DOUBLE;  -- ms the interval lasted, as sent
ALTER TABLE host_activity ADD COLUMN runq_ms DOUBLE;       -- rankecho.sched.runq_ms, as sent
ALTER TABLE host_activity ADD COLUMN bytes BIGINT;         -- rankecho.bytes of a malloc or memcpy
ALTER TABLE host_activity ADD COLUMN attrs_id INTEGER;
ALTER TABLE host_activity ADD COLUMN in_generic BOOLEAN DEFAULT true;
