-- The writer's retention statements (echo/store/retention.py), run on the writer thread inside its own
-- transactions: roll collectives up, then delete raw rows below a cutoff, oldest first, in chunks.
-- Each table is cut on its own time column: events_generic.timestamp_ns, collectives.enter_ns,
-- host_activity.start_ns (a typed-only event goes with its typed row; `events` is the view over them).

-- name: typed_oldest
-- The oldest time still stored below $cutoff_ns in the typed copies (NULL: nothing to delete there).
SELECT least((SELECT min(enter_ns) FROM collectives WHERE enter_ns < $cutoff_ns),
             (SELECT min(start_ns) FROM host_activity WHERE start_ns < $cutoff_ns)) AS oldest_ns;

-- name: typed_count
-- Rows of the typed copies below $cutoff_ns (a step sizes its chunk with it before deleting).
SELECT (SELECT count(*) FROM collectives WHERE enter_ns < $cutoff_ns)
       + (SELECT count(*) FROM host_activity WHERE start_ns < $cutoff_ns) AS n;

-- name: events_count
-- Rows of events_generic below $cutoff_ns.
SELECT count(*) AS n FROM events_generic WHERE timestamp_ns < $cutoff_ns;

-- name: events_oldest
-- The oldest generic event time still stored below $cutoff_ns (NULL: nothing to delete there).
SELECT min(timestamp_ns) AS oldest_ns FROM events_generic WHERE timestamp_ns < $cutoff_ns;

-- name: raw_range
-- The oldest and newest event times in `events` (both NULL when it is empty).
SELECT min(timestamp_ns) AS oldest_ns, max(timestamp_ns) AS newest_ns FROM events;

-- name: rollup_collectives
-- One partial-aggregate row per (cluster, node, rank, communicator, minute of enter_ns) over every raw
-- collective below $cutoff_ns; the same transaction then deletes them (delete_collectives).
INSERT INTO collective_rollup
SELECT cluster_id,
       node_id,
       rank,
       comm_id,
       (enter_ns // 60000000000) * 60000000000 AS minute_ns,
       count(*) AS calls,
       count(complete_ns) AS completed,
       sum(complete_ns - enter_ns) AS wait_sum_ns,
       max(complete_ns - enter_ns) AS wait_max_ns,
       sum(bytes) AS bytes_sum,
       min(enter_ns) AS first_enter_ns,
       max(enter_ns) AS last_enter_ns,
       min(seq) AS min_seq,
       max(seq) AS max_seq,
       $now_ns AS rolled_ns
FROM collectives
WHERE enter_ns < $cutoff_ns
GROUP BY cluster_id, node_id, rank, comm_id, minute_ns;

-- name: delete_collectives
DELETE FROM collectives WHERE enter_ns < $cutoff_ns;

-- name: delete_host_activity
DELETE FROM host_activity WHERE start_ns < $cutoff_ns;

-- name: delete_events
DELETE FROM events_generic WHERE timestamp_ns < $cutoff_ns;

-- name: delete_rollups
DELETE FROM collective_rollup WHERE minute_ns < $cutoff_ns;

-- name: delete_stacks
-- Stacks first seen below $cutoff_ns that no kept row cites (a stack is shipped once per node, then only
-- cited, so an old stack a new row still cites stays; a newer one not yet cited may be about to be). One
-- DISTINCT scan per citing column, each filtered to the few candidate ids.
DELETE FROM stacks
WHERE first_seen_ns < $cutoff_ns
  AND stack_id NOT IN (
      WITH candidates AS (SELECT stack_id FROM stacks WHERE first_seen_ns < $cutoff_ns)
      SELECT stack_id FROM collectives SEMI JOIN candidates USING (stack_id)
      UNION SELECT pre_allocator_stack FROM collectives WHERE pre_allocator_stack IN (FROM candidates)
      UNION SELECT pre_slow_gpu_stack FROM collectives WHERE pre_slow_gpu_stack IN (FROM candidates)
      UNION SELECT pre_memcpy_stack FROM collectives WHERE pre_memcpy_stack IN (FROM candidates)
      UNION SELECT pre_cpu_contention_stack FROM collectives WHERE pre_cpu_contention_stack IN (FROM candidates)
      UNION SELECT pre_sleeping_stack FROM collectives WHERE pre_sleeping_stack IN (FROM candidates)
      UNION SELECT pre_oncpu_stack FROM collectives WHERE pre_oncpu_stack IN (FROM candidates)
      UNION SELECT stack_id FROM host_activity SEMI JOIN candidates USING (stack_id)
  );

-- name: used_bytes
-- Bytes the store's blocks in use take (free blocks inside the file, reused by new rows, not counted).
SELECT used_blocks * block_size AS used_bytes, total_blocks * block_size AS file_bytes
FROM pragma_database_size()
WHERE database_name = current_database();

-- name: record_settings
UPDATE retention_state
SET retention_s = $retention_s, max_db_bytes = $max_db_bytes, rollup_retention_s = $rollup_retention_s
WHERE id = 1;

-- name: record_pass
UPDATE retention_state
SET raw_cutoff_ns = greatest(coalesce(raw_cutoff_ns, $raw_cutoff_ns), $raw_cutoff_ns),
    rollup_cutoff_ns = greatest(coalesce(rollup_cutoff_ns, $rollup_cutoff_ns), $rollup_cutoff_ns),
    last_run_ns = $now_ns,
    last_run_s = $seconds,
    last_rows_deleted = $rows_deleted,
    last_bytes_freed = $bytes_freed,
    used_bytes = $used_bytes,
    raw_rows_deleted = raw_rows_deleted + $rows_deleted,
    rollup_rows_deleted = rollup_rows_deleted + $rollup_rows_deleted
WHERE id = 1;
