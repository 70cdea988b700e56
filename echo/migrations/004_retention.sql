-- Schema v4: what retention keeps after raw rows are deleted (echo/store/retention.py, --retention).
-- collective_rollup holds per-(cluster, node, rank, communicator, minute) statistics of collective calls,
-- written in the same transaction that deletes the raw collectives they summarise, so every collective
-- is counted exactly once: in `collectives` or in the rollup. A late collective older than the cutoff is
-- rolled up by the next pass into a second row for the same minute: rows are partial aggregates, and a
-- reader merges them (sum the counts and sums, max of maxima, min/max of first/last). No key, so no index
-- grows with the months of rollups kept.
CREATE TABLE collective_rollup (
    cluster_id     VARCHAR,
    node_id        VARCHAR,
    rank           INTEGER,
    comm_id        VARCHAR,
    minute_ns      BIGINT NOT NULL,  -- start of the UTC minute of enter_ns, Unix ns
    calls          BIGINT NOT NULL,  -- collective calls entered in that minute
    completed      BIGINT NOT NULL,  -- of which a sync saw complete (complete_ns not NULL)
    wait_sum_ns    BIGINT,           -- sum over completed calls of complete_ns - enter_ns (host wait)
    wait_max_ns    BIGINT,           -- the longest such wait
    bytes_sum      BIGINT,           -- payload bytes of the calls
    first_enter_ns BIGINT NOT NULL,
    last_enter_ns  BIGINT NOT NULL,
    min_seq        BIGINT,
    max_seq        BIGINT,
    rolled_ns      BIGINT NOT NULL   -- when the pass that wrote this row ran (Echo's clock)
);
-- One row: which raw and rolled-up ranges retention left, the limits in force, what the last pass did.
CREATE TABLE retention_state (
    id                  INTEGER PRIMARY KEY CHECK (id = 1),
    retention_s         DOUBLE,          -- --retention of the Echo that last opened the store; NULL: off
    max_db_bytes        BIGINT,          -- --max-db-size; NULL: off
    rollup_retention_s  DOUBLE,          -- --rollup-retention
    raw_cutoff_ns       BIGINT,          -- raw rows older than this were deleted (NULL: none ever)
    rollup_cutoff_ns    BIGINT,          -- rollup minutes older than this were deleted (NULL: none ever)
    last_run_ns         BIGINT,          -- when the last pass finished
    last_run_s          DOUBLE,          -- how long it took, its chunks and checkpoint included
    last_rows_deleted   BIGINT,          -- raw rows the last pass deleted (all three tables)
    last_bytes_freed    BIGINT,          -- used bytes before the last pass minus after its checkpoint
    used_bytes          BIGINT,          -- used blocks x block size + write-ahead log, after the last pass
    raw_rows_deleted    BIGINT NOT NULL DEFAULT 0,  -- since the store was created
    rollup_rows_deleted BIGINT NOT NULL DEFAULT 0
);
INSERT INTO retention_state (id) VALUES (1);
