-- Layer 7b: what each rank was doing at its latest heartbeat (rankecho.rank.state, agent --heartbeat-s).
-- An agent sends a rank's state only while the rank has entered no collective for a heartbeat, so this
-- is what a hung rank is stuck in while the job waits for it: the traced call in flight, the off-CPU
-- interval in progress (asleep, or preempted and waiting for a CPU), the stack it switched out with, and
-- where its last heartbeat went by cause class (recent_s long; the rest of it on the CPU: host compute).
-- Times are node clocks; durations are as of the report (at_ns), which is at most a heartbeat old.

-- name: rk_rank_states
-- The latest state per (cluster_id, job_id, rank) reported in the window, with its stack's frames and
-- leading frames (NULL when the stack is not stored or there is none).
CREATE OR REPLACE TEMP MACRO rk_rank_states(start_ns, end_ns, cluster, job := NULL) AS TABLE
WITH s AS (
    SELECT cluster_id, coalesce(json_extract_string(attrs_json, '$."rankecho.job.id"'), '') AS job_id, node_id,
           rank, timestamp_ns AS at_ns, value_double AS quiet_s,
           json_extract_string(attrs_json, ['$."rankecho.state.call"', '$."rankecho.state.call_since_ns"',
               '$."rankecho.state.offcpu_since_ns"', '$."rankecho.state.sleeping"', '$."rankecho.stack.id"',
               '$."rankecho.pre.window_ms"', '$."rankecho.pre.allocator_ms"', '$."rankecho.pre.slow_gpu_ms"',
               '$."rankecho.pre.memcpy_ms"', '$."rankecho.pre.cpu_contention_ms"', '$."rankecho.pre.sleeping_ms"'
           ]) AS a
    FROM events_generic  -- rank states are generic events (not typed)
    WHERE metric_name = 'rankecho.rank.state' AND rank IS NOT NULL
      AND (start_ns IS NULL OR timestamp_ns >= start_ns) AND (end_ns IS NULL OR timestamp_ns < end_ns)
      AND (cluster IS NULL OR cluster_id = cluster)
),
latest AS (
    SELECT DISTINCT ON (cluster_id, job_id, rank) *
    FROM s WHERE job IS NULL OR job_id = job
    ORDER BY cluster_id, job_id, rank, at_ns DESC
),
typed AS (
    SELECT cluster_id, job_id, node_id, rank, at_ns, quiet_s, a[1] AS call, TRY_CAST(a[2] AS BIGINT) AS call_since_ns,
           TRY_CAST(a[3] AS BIGINT) AS offcpu_since_ns, TRY_CAST(a[4] AS BOOLEAN) AS sleeping, a[5] AS stack_id,
           TRY_CAST(a[6] AS DOUBLE) / 1e3 AS recent_s,
           {'allocator': coalesce(TRY_CAST(a[7] AS DOUBLE), 0) / 1e3,
            'slow_gpu': coalesce(TRY_CAST(a[8] AS DOUBLE), 0) / 1e3,
            'memcpy': coalesce(TRY_CAST(a[9] AS DOUBLE), 0) / 1e3,
            'cpu_contention': coalesce(TRY_CAST(a[10] AS DOUBLE), 0) / 1e3,
            'sleeping': coalesce(TRY_CAST(a[11] AS DOUBLE), 0) / 1e3} AS recent_by_class_s
    FROM latest
)
SELECT t.*, (t.at_ns - t.call_since_ns) / 1e9 AS call_s, (t.at_ns - t.offcpu_since_ns) / 1e9 AS off_cpu_s,
       st.frames, rk_lead_frames(st.frames, rk_param('stack_lead_frames')) AS leading_frames
FROM typed t
LEFT JOIN stacks st ON st.stack_id = t.stack_id;
